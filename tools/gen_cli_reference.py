#!/usr/bin/env python3
"""Print (or, with --write, update in README.md) the CLI reference generated from click.

The README holds the output between `<!-- cli-reference:start -->` and `<!-- cli-reference:end -->`;
tests/test_docs.py fails when they drift apart. Regenerate with:
    .venv/bin/python tools/gen_cli_reference.py --write
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parent.parent
START, END = "<!-- cli-reference:start -->", "<!-- cli-reference:end -->"


def _walk(cmd: click.Command, path: list[str]):
    yield path, cmd
    if isinstance(cmd, click.Group):
        for name in sorted(cmd.commands):
            yield from _walk(cmd.commands[name], path + [name])


def reference() -> str:
    from ggufmtp.cli import main

    parts = []
    for path, cmd in _walk(main, ["ggufmtp"]):
        ctx = click.Context(cmd, info_name=" ".join(path), terminal_width=100, max_content_width=100,
                            help_option_names=["-h", "--help"])
        parts.append(f"#### `{' '.join(path)}`\n\n```text\n{cmd.get_help(ctx).rstrip()}\n```\n")
    return "\n".join(parts)


def readme_block(text: str) -> str:
    return text.split(START, 1)[1].split(END, 1)[0].strip("\n")


def main() -> int:
    ref = reference()
    if "--write" in sys.argv:
        readme = ROOT / "README.md"
        text = readme.read_text()
        head, rest = text.split(START, 1)
        tail = rest.split(END, 1)[1]
        readme.write_text(f"{head}{START}\n{ref}\n{END}{tail}")
    else:
        print(ref)
    return 0


if __name__ == "__main__":
    sys.exit(main())
