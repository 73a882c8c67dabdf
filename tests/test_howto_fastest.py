"""The how-to "The fastest verified configuration" (docs/how-to/fastest-configuration.md, issue #52)
stays true: its tiny-model walkthrough runs as written, command by command, in an empty folder; the
output it quotes from ``--dry-run`` is what the command prints; its Python example runs; and a
reader finds it (and every how-to page) in the site's navigation and on the home page, and finds
the joint search's Python function on the API page beside tune's.

On main ba092bc the page did not exist, the home page listed four of the eight how-to pages, and
docs/reference/api.md named ``tune``'s function but not the joint search's."""

from __future__ import annotations

import importlib
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ggufmtp.cli.app import SECTIONS

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "how-to" / "fastest-configuration.md"
HOWTO = ROOT / "docs" / "how-to"


def _nav_pages(node: object) -> list[str]:
    """Every page path in mkdocs.yml's nav, at any depth."""
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [p for item in node for p in _nav_pages(item)]
    if isinstance(node, dict):
        return [p for v in node.values() for p in _nav_pages(v)]
    return []


def test_every_how_to_page_is_in_the_nav_and_on_the_home_page():
    """A how-to page a reader cannot reach is not documentation: each is in the site's navigation and
    linked from docs/index.md's how-to line (main listed 4 of 8 there)."""
    cfg = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)  # no mkdocs tags to resolve
    nav = set(_nav_pages(cfg["nav"]))
    index = (ROOT / "docs" / "index.md").read_text()
    pages = sorted(p.relative_to(ROOT / "docs").as_posix() for p in HOWTO.glob("*.md"))
    assert "how-to/fastest-configuration.md" in pages
    assert [p for p in pages if p not in nav] == []
    assert [p for p in pages if f"]({p})" not in index] == []


# each Measure command -> the library function it runs (the function a Python user calls instead)
MEASURE_FUNCTIONS = {
    "verify": "ggufmtp.verify",
    "tune": "ggufmtp.measure.tune.run.tune",
    "tune-joint": "ggufmtp.search.joint.joint_search",
    "curve": "ggufmtp.measure.profiles.curve.acceptance_curve",
    "profiles": "ggufmtp.measure.profiles.run.run_profiles",
    "eval": "ggufmtp.evaluate",
    "head-sweep": "ggufmtp.quality.head_sweep.head_sweep",
}


def _resolve(dotted: str) -> object:
    module, _, attr = dotted.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def test_the_api_page_names_the_function_of_every_measuring_command():
    """tune's function was on the API page, the joint search's was not (nor head-sweep's): every
    command of ``ggufmtp --help``'s Measure section now has its function named there (or the
    ``ggufmtp.NAME`` shorthand for a top-level one), and every such dotted name on the page imports."""
    assert set(MEASURE_FUNCTIONS) == set(SECTIONS["Measure"])
    api = (ROOT / "docs" / "reference" / "api.md").read_text()
    for command, dotted in MEASURE_FUNCTIONS.items():
        assert callable(_resolve(dotted)), dotted
        short = dotted.removeprefix("ggufmtp.")
        assert f"`{dotted}`" in api or ("." not in short and f"`{short}`" in api), f"{command}: {dotted}"
    for dotted in set(re.findall(r"`(ggufmtp(?:\.[a-z_]+)+\.[A-Za-z_]+)`", api)):
        _resolve(dotted)  # ImportError/AttributeError: the page names something that is not there


def _section(text: str, heading: str) -> str:
    return text.split(heading, 1)[1]


def _walkthrough() -> list[list[str]]:
    """The page's tiny-model commands, continuation lines joined, as argument lists after ``ggufmtp``."""
    block = re.search(r"```sh\n(.*?)```", _section(PAGE.read_text(), "## On the tiny model"), re.S).group(1)
    lines = [ln.strip() for ln in block.replace("\\\n", " ").splitlines() if ln.strip()]
    assert all(ln.startswith("ggufmtp ") for ln in lines), lines
    return [shlex.split(ln)[1:] for ln in lines]


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GGUFMTP_NO_PROGRESS": "1"}
    return subprocess.run([sys.executable, "-m", "ggufmtp", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.runtime
def test_the_walkthrough_runs_as_written_and_the_dry_run_prints_what_the_page_quotes(tmp_path):
    """Each command exits 0 in an empty folder, in order; the dry run's quoted lines are its output's
    (the plan is fixed on a CPU: no GPU dimension, a seeded order); the joint recipe types every MTP
    role as the head the search chose, the joint artifact's card runs it with the window verified,
    the card after ``tune --receipt`` has the Recommended server settings section, and so has the
    joint artifact's after ``verify --tuned-from`` (on main ec4d486 it had none)."""
    dry = None
    for args in _walkthrough():
        p = _run(args, tmp_path)
        assert p.returncode == 0, (args, p.stdout[-2000:], p.stderr[-2000:])
        if args[0] == "tune-joint" and "--dry-run" in args:
            dry = p.stdout
    quoted = re.search(r"```text\n(.*?)```", _section(PAGE.read_text(), "### 1. See the plan first"), re.S).group(1)
    shown = [ln for ln in quoted.splitlines() if ln.strip() != "..."]
    assert dry is not None and dry.splitlines()[:len(shown)] == shown
    joint = json.loads((tmp_path / "joint.json").read_text())
    head, k = joint["joint"]["head"], joint["best_config"]["draft_n_max"]
    assert head in ("Q8_0", "Q4_K")  # --no-own-head: a re-typed head always wins the walkthrough
    assert f'rest = "{head}"' in (tmp_path / "joint.toml").read_text()
    assert f"--spec-draft-n-max {k}" in (tmp_path / "card-joint.md").read_text()
    assert "## Recommended server settings" in (tmp_path / "card-tune.md").read_text()
    v = json.loads((tmp_path / "tiny-joint.gguf.receipt.json").read_text())["predicate"]["verification"]
    assert v["settings"]["mtp_config"]["head"] == head and v["head"]["decision"] == "preserved"
    # the page's step 5: verify --tuned-from puts the profile, as this file is served, on the card
    assert v["tuned"]["kind"] == "ggufmtp tune-joint" and v["tuned"]["profile"]["name"] == "joint.json"
    assert v["tuned"]["mtp_command"].startswith("llama-server --model tiny-joint.gguf ")
    assert "--spec-draft-model" not in v["tuned"]["mtp_command"]
    joint_card = (tmp_path / "card-joint.md").read_text()
    assert "## Recommended server settings\n\nThe profile `joint.json` (ggufmtp tune-joint" in joint_card
    assert f"```sh\n{v['tuned']['command']}\n```" in joint_card

    code = re.search(r"```python\n(.*?)```", _section(PAGE.read_text(), "## From Python"), re.S).group(1)
    (tmp_path / "example.py").write_text(code)
    p = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.startswith("heads stage: 2 heads (Q8_0, Q4_K)")
    assert json.loads((tmp_path / "joint.json").read_text())["joint"]["head"] in ("Q8_0", "Q4_K")


@pytest.mark.runtime
def test_the_dry_run_lists_what_its_help_says(tmp_path):
    """``--help`` said the dry run lists "the candidates"; its text lists those the budget reaches
    (32 of 154 at the defaults), the JSON every one. The help now says so, and each form is checked."""
    from click.testing import CliRunner

    from ggufmtp.cli import main

    for args in _walkthrough()[:1]:  # the artifact, as the page makes it
        assert _run(args, tmp_path).returncode == 0
    dry = ["tune-joint", "tiny.gguf", "--source", "builtin:tiny-qwen35moe", "-r", "hifi-q4_k_m-mtp", "--dry-run"]
    plan = json.loads(_run([*dry, "--json"], tmp_path).stdout)
    listed = [ln.strip() for ln in _run(dry, tmp_path).stdout.splitlines() if ln.startswith("  ")]
    assert plan["searched"] < plan["n_candidates"] == len(plan["candidates"])
    assert listed == plan["candidates"][:plan["searched"]]
    help_text = " ".join(CliRunner().invoke(main, ["tune-joint", "--help"]).output.split())
    assert "as far as the budget reaches (every one with --json)" in help_text
