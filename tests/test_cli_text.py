"""A CLI that reads well (#31): commands grouped by purpose with whole summaries, no Python reprs in
any output people read, and `recipe show` prints the thresholds the verdict depends on."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from ggufmtp.cli import main
from ggufmtp.cli.app import SECTIONS

REPR = re.compile(r"\{'|\['|\bNone\b|\bTrue\b|\bFalse\b|<[a-z_.]+ object at 0x")


def _invoke(*args) -> str:
    r = CliRunner().invoke(main, [str(a) for a in args])
    assert r.exit_code == 0, r.output
    return r.output


def test_help_groups_every_command_with_its_whole_summary():
    text = _invoke("--help")
    ctx = click.Context(main)
    listed = [n for names in SECTIONS.values() for n in names]
    assert sorted(listed) == sorted(main.list_commands(ctx)), "a command is in no section, or in two"
    assert "Other:" not in text and "..." not in text.split("\nBuild:\n", 1)[1]  # no summary cut short
    for title in SECTIONS:
        assert f"\n{title}:\n" in text
    for name in listed:  # the summary is a whole sentence: it ends with its full stop
        assert main.get_command(ctx, name).get_short_help_str(100).endswith(".")


def test_recipe_show_prints_the_verify_thresholds():
    text = _invoke("recipe", "show", "hifi-q4_k_m-mtp")
    assert "verify: acceptance >= 60.0 %, speedup >= 1.200× (judged with GPU offload)" in text
    assert "draft window k=4" in text and not REPR.search(text), text


@pytest.mark.runtime
def test_no_python_reprs_in_what_people_read(tiny_mtp_model, tmp_path):
    q = tmp_path / "q.gguf"
    outputs = {
        "inspect": _invoke("inspect", tiny_mtp_model),
        "plan": _invoke("plan", tiny_mtp_model, "-r", "hifi-q4_k_m-mtp"),
        "quantize": _invoke("quantize", tiny_mtp_model, "-r", "q8_0-mtp", "-o", q),
        "receipt show": _invoke("receipt", "show", Path(str(q) + ".receipt.json")),
        "audit": _invoke("audit", q),
        "recipe list": _invoke("recipe", "list"),
    }
    for name, text in outputs.items():
        m = REPR.search(text)
        assert m is None, f"{name}: a Python repr ({m.group(0)!r}) in:\n{text[max(0, m.start() - 200):m.end() + 200]}"
