"""The ``ggufmtp`` click group, shared options and parsers; commands live in the sibling modules.

The command line is a thin click layer over the Python API. Every command prints for people by
default and JSON with ``--json``; a ``GgufmtpError`` becomes one ``error: ...`` line on stderr and
exit status 1. A usage error (an unknown or missing option or argument, a bad value, options that
conflict: click's ``UsageError``) is one ``error: ...`` line too, then where to find help, and exit
status 2, as click and argparse do: :class:`SectionedGroup` shows every one of them so
(:class:`_CommandLineError`), whichever command raised it.
"""

from __future__ import annotations

import functools
import json
import math
import signal
import sys
from collections.abc import Callable
from typing import Any

import click

from .._version import __version__
from ..errors import GgufmtpError, Terminated
from ..refs import local_model_arg
from .options import LlamaGroup, refuse_empty_model


def emit_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, default=str))


def os_error_text(e: OSError) -> str:
    """``FILE: reason`` for an OSError (both files of a rename), e.g. ``out/x.md: Permission denied``."""
    reason = e.strerror or str(e)
    files = [str(f) for f in (e.filename, e.filename2) if f is not None]
    return f"{' -> '.join(files)}: {reason}" if files else reason


def handle_errors(fn: Callable) -> Callable:
    """Turn GgufmtpError, OSError (and Ctrl-C) into one clear line and a non-zero exit, no traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except GgufmtpError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(1)
        except OSError as e:  # an unwritable output, a full disk: the file and the reason, no traceback
            click.echo(f"error: {os_error_text(e)}", err=True)
            sys.exit(1)
        except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (``errors.Terminated``): cleanup has run
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not turn 130 into click's 1
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            terminated = isinstance(e, Terminated)
            click.echo("terminated" if terminated else "interrupted", err=True)
            sys.exit(143 if terminated else 130)

    return wrapper


json_option = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
bin_option = click.option(
    "--llama-cpp-bin", type=click.Path(), default=None,
    help="Directory (or file) of the llama.cpp binaries; overrides $GGUFMTP_LLAMA_CPP_BIN and the cache.",
)


# ``ggufmtp --help`` lists the commands by what they are for, in the order of the pipeline.
SECTIONS: dict[str, tuple[str, ...]] = {
    "Build": ("pull", "convert", "synth", "train", "imatrix", "recipe", "search", "plan", "quantize", "sidecar", "run",
              "ladder"),
    "Check": ("inspect", "audit", "receipt"),
    "Measure": ("verify", "tune", "tune-joint", "curve", "profiles", "eval", "head-sweep"),
    "Publish": ("card", "upload"),
    "Setup": ("runtime", "doctor"),
}
SUMMARY_WIDTH = 100  # a summary is the docstring's first sentence (or short_help), whole, never cut


USAGE_ERROR_STATUS = 2


class _CommandLineError(click.UsageError):
    """A usage error as every ggufmtp command shows it: ``error: MESSAGE`` on stderr, then the
    line that says where the command's help is; exit status :data:`USAGE_ERROR_STATUS`."""

    exit_code = USAGE_ERROR_STATUS

    def __init__(self, cause: click.UsageError) -> None:
        super().__init__(cause.format_message(), cause.ctx)

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)
        if self.ctx is not None:
            click.echo(f"Try '{self.ctx.command_path} --help' for help.", err=True)


class SectionedGroup(LlamaGroup):
    """A group whose help lists its commands under :data:`SECTIONS` (a command in none of them
    under "Other"), each with its whole one-line summary, and whose usage errors, its own and its
    commands', are :class:`_CommandLineError`. Its commands read llama.cpp's spellings
    (:class:`~ggufmtp.cli.options.LlamaCommand`), and so do its sub-groups' (:class:`LlamaGroup`)."""

    group_class = LlamaGroup

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as e:
            raise _CommandLineError(e) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except _CommandLineError:
            raise
        except click.UsageError as e:
            raise _CommandLineError(e) from None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = self.list_commands(ctx)
        placed = {n for group in SECTIONS.values() for n in group}
        sections = [*SECTIONS.items(), ("Other", tuple(n for n in names if n not in placed))]
        for title, members in sections:
            rows = [(n, self.get_command(ctx, n).get_short_help_str(SUMMARY_WIDTH)) for n in members if n in names]
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


@click.group(cls=SectionedGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ggufmtp")
@click.option("--no-progress", is_flag=True,
              help="No progress bars, for every command ($GGUFMTP_NO_PROGRESS=1 does the same).")
def main(no_progress: bool) -> None:
    """Produce, audit and verify MTP (NextN) GGUF models for llama.cpp."""
    if no_progress:
        from ..progress import disable

        disable()


def resolve_model_arg(model: str, what: str = "MODEL") -> str:
    """A command's MODEL argument: ``builtin:NAME`` -> the synthesized model's path (made once,
    cached); anything else unchanged (an empty one: a usage error). The resolving is :mod:`ggufmtp.refs`'s."""
    return local_model_arg(refuse_empty_model(model, what))


recipe_option = click.option("--recipe", "-r", "recipe_name", required=True,
                             help="Shipped recipe name (see `ggufmtp recipe list`), a .toml file, or a "
                                  "llama-quantize type (Q4_K_M: with ggufmtp's head defaults; Q4_K_M-plain: without).")
imatrix_option = click.option("--imatrix", type=click.Path(dir_okay=False), default=None,
                              help="Importance matrix (.dat or GGUF imatrix).")


def _number_list(value: str | None, what: str, cast: Callable[[str], Any], kind: str,
                 low: float | None = None) -> list | None:
    """The one reading of a comma-separated list of numbers (``--seeds 42,1337``): a click usage
    error naming the flag for a value that is not a ``kind``, not finite (``nan``, ``inf``,
    ``1e999``), below ``low``, given twice (a list names each setting once), or for no value."""
    if value is None:
        return None
    try:
        out = [cast(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected comma-separated {kind}", param_hint=what) from None
    if not out:
        raise click.BadParameter(f"{value!r}: no values", param_hint=what)
    for x in out:
        if isinstance(x, float) and not math.isfinite(x):
            raise click.BadParameter(f"{value!r}: {x} is not a finite number", param_hint=what)
        if low is not None and x < low:
            raise click.BadParameter(f"{value!r}: {x} is below {low:g}", param_hint=what)
    _refuse_twice(value, out, what)
    return out


def _refuse_twice(value: str, items: list, what: str) -> None:
    seen: set = set()
    for x in items:
        key = x.casefold() if isinstance(x, str) else x
        if key in seen:
            raise click.BadParameter(f"{value!r}: {x} given twice", param_hint=what)
        seen.add(key)


def _int_list(value: str | None, what: str, low: int | None = None) -> list[int] | None:
    return _number_list(value, what, int, "integers", low)


def _float_list(value: str | None, what: str, low: float | None = None) -> list[float] | None:
    return _number_list(value, what, float, "numbers", low)


def _word_list(value: str, what: str, *, empty_ok: bool = False) -> list[str]:
    """A comma-separated list of names (``--types Q8_0,Q6_K``, ``--workloads A,B``), stripped: a
    usage error naming the flag for a name given twice (in any case), or for no name unless ``empty_ok``."""
    out = [w.strip() for w in value.split(",") if w.strip()]
    if not out and not empty_ok:
        raise click.BadParameter(f"{value!r}: no values", param_hint=what)
    _refuse_twice(value, out, what)
    return out
