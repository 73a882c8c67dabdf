"""An mkdocs hook for the docs build: the CLI reference (mkdocs-click, table style) shows what
``--help`` shows.

mkdocs-click 0.9 prints ``option.default`` as the default: click 8.3+ gives an option without a
default the marker ``Sentinel.UNSET`` there, and the table printed it (121 times). Here the default
column is click's own (``Option.get_help_extra``, what ``--help`` prints in ``[default: ...]``):
empty for an option without a default or that does not show it, "required" for a required one.
It also wrote help text into the Markdown as is, so ``DIR/<recipe>/`` was taken for an HTML tag and
vanished, and a ``|`` split the table row; help text is escaped here (code spans kept as they are).
"""

from __future__ import annotations

import html
import inspect
import re
from collections.abc import Iterator
from typing import Any

import click
from mkdocs_click import _docs

CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]#])")


def md_text(text: str) -> str:
    """``text`` (a line of help for a terminal) as Markdown that renders as that text; code spans
    stay code spans."""
    out, pos = [], 0
    for m in CODE_SPAN.finditer(text):
        out.append(_escape(text[pos:m.start()]))
        out.append(m.group(0))
        pos = m.end()
    out.append(_escape(text[pos:]))
    return "".join(out)


def _escape(plain: str) -> str:
    return MARKDOWN_SPECIAL.sub(r"\\\1", html.escape(plain, quote=False)).replace("|", "&#124;")


def _default_cell(option: click.Option, ctx: click.Context) -> str:
    extra = option.get_help_extra(ctx)
    if "default" in extra:
        return f"`{extra['default']}`"
    return "_required_" if extra.get("required") or option.required else ""


def _option_row(option: click.Option, ctx: click.Context) -> str:
    shown = getattr(option, "shown_opts", option.opts)  # an old spelling kept as a hidden alias is not listed
    names = ", ".join(f"`{opt}`" for opt in shown)
    if option.secondary_opts:
        names += " / " + ", ".join(f"`{opt}`" for opt in option.secondary_opts)
    description = md_text(" ".join((option.help or "").split()))
    return f"| {names} | {_docs._format_table_option_type(option)} | {description} | {_default_cell(option, ctx)} |"


def _make_table_options(ctx: click.Context, show_hidden: bool = False) -> Iterator[str]:
    options = [p for p in ctx.command.get_params(ctx) if isinstance(p, click.Option) and (show_hidden or not p.hidden)]
    if not options:
        return
    yield "**Options:**"
    yield ""
    yield "| Name | Type | Description | Default |"
    yield "| ---- | ---- | ----------- | ------- |"
    yield from (_option_row(option, ctx) for option in options)
    yield ""


def _make_description(ctx: click.Context, remove_ascii_art: bool = False) -> Iterator[str]:
    help_string = ctx.command.help or ctx.command.short_help
    if not help_string:
        return
    for line in inspect.cleandoc(help_string.split("\f", 1)[0]).splitlines():  # click cuts at \f too
        yield md_text(line.replace("\b", ""))
    yield ""


def on_config(config: Any, **kwargs: Any) -> Any:
    """Replace mkdocs-click's option table and description writers before any page renders."""
    _docs._make_table_options = _make_table_options
    _docs._make_description = _make_description
    return config
