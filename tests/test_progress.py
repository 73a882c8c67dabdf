"""The one progress policy (issue #32): every bar comes from ggufmtp.progress.bar, one switch
(``ggufmtp --no-progress``, ``$GGUFMTP_NO_PROGRESS``) turns them all off, and no other module
constructs a tqdm bar."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggufmtp import progress
from ggufmtp.cli import main

PKG = Path(__file__).resolve().parent.parent / "ggufmtp"


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.delenv(progress.ENV, raising=False)
    progress.enable()
    yield
    progress.enable()


def test_a_bar_is_drawn_only_when_asked_and_not_switched_off(monkeypatch):
    seen: list[dict] = []
    monkeypatch.setattr(progress, "tqdm", lambda **kw: seen.append(kw) or kw)
    progress.bar(10, "x", enabled=False)
    progress.bar(10, "x", "B", unit_scale=True)
    progress.disable()
    progress.bar(10, "x")
    progress.enable()
    # asked for: tqdm decides by the terminal (None); not asked for, or switched off: never drawn
    assert [kw["disable"] for kw in seen] == [True, None, True]
    assert all(kw["file"] is sys.stderr and kw["leave"] is False for kw in seen) and seen[1]["unit_scale"]
    for value, off in (("1", True), ("yes", True), ("0", False), ("false", False), ("", False)):
        monkeypatch.setenv(progress.ENV, value)
        assert progress.is_disabled() is off, value


def test_the_cli_switch_turns_every_bar_off(tmp_path):
    r = CliRunner().invoke(main, ["--no-progress", "doctor", "--json"])
    assert r.exit_code in (0, 1) and progress.is_disabled()
    assert "--no-progress" in CliRunner().invoke(main, ["--help"]).output


def test_no_module_but_progress_builds_a_tqdm_bar():
    built = [f"{p.relative_to(PKG)}:{i}" for p in PKG.rglob("*.py") if p.name != "progress.py"
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(r"\btqdm(\.auto)?\(|\btqdm\.tqdm\(", line) and not line.lstrip().startswith("#")]
    assert not built, built
