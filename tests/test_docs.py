"""The README and the docs site stay true: the README fits on a few screens and starts with the
two commands, every ggufmtp command and option in them exists, the site builds with warnings as
errors (its CLI reference is generated from the commands when it builds), and the Python API
example runs exactly as written. The README's quickstart is run, line by line, by
tests/test_wheel.py from the installed wheel."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest

from ggufmtp.cli import main

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DOCS = sorted((ROOT / "docs").rglob("*.md"))
MAX_README_LINES = 250


def test_readme_is_short_and_starts_with_the_two_commands():
    assert len(README.splitlines()) <= MAX_README_LINES
    block = re.search(r"```sh\n(.*?)```", README, re.S).group(1)
    assert [line.split("#")[0].strip() for line in block.strip().splitlines()] == ["make demo", "make test"]
    for link in re.findall(r"\]\((docs/[^)#]+)", README):
        assert (ROOT / link).is_file(), f"README links to {link}, which does not exist"


def _command_lines():
    for text in [README, *(p.read_text() for p in DOCS)]:
        for block in re.findall(r"```sh\n(.*?)```", text, re.S):
            joined = block.replace("\\\n", " ")
            for line in joined.splitlines():
                line = line.split(" #", 1)[0].strip()
                m = re.match(r"^(?:\S*/)?(?:[A-Z_]+=\S+ )*(?:\.venv/bin/)?ggufmtp (.*)$", line)
                if m:
                    yield line, m.group(1)


def test_documented_commands_and_options_exist():
    checked = 0
    for line, rest in _command_lines():
        words = shlex.split(rest.replace("[", " ").replace("]", " ").replace("|", " "))
        cmd: click.Command = main
        while isinstance(cmd, click.Group) and words and words[0] in cmd.commands:
            cmd = cmd.commands[words.pop(0)]
        assert cmd is not main, line
        names = {o for p in cmd.params for o in getattr(p, "opts", []) + getattr(p, "secondary_opts", [])}
        for w in words:
            if w.startswith("-") and w not in ("--",):
                assert w.split("=")[0] in names | {"-h", "--help"}, f"{line}: unknown option {w}"
        checked += 1
    assert checked >= 20


def test_the_docs_site_builds_with_warnings_as_errors(tmp_path):
    p = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                        "-d", str(tmp_path / "site")], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    ctx = click.Context(main)
    assert all(f"ggufmtp {name}" in cli for name in main.list_commands(ctx)), "a command is missing from the CLI page"
    assert "Publish artifact(s)" in (tmp_path / "site" / "reference" / "api" / "index.html").read_text()


@pytest.mark.runtime
def test_python_api_example_runs_as_written(tmp_path):
    code = re.search(r"# Python API.*?```python\n(.*?)```", (ROOT / "docs" / "reference" / "api.md").read_text(),
                     re.S).group(1)
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "acceptance 100.0%" in proc.stdout and (tmp_path / "README-tiny.md").exists()
    assert (tmp_path / "tiny-hifi-mtp.gguf.receipt.json").exists()


@pytest.mark.runtime
def test_reference_receipts_describe_what_make_demo_builds(tmp_path):
    """Synthesis and quantization are deterministic: rebuilding the demo artifact reproduces the
    committed receipt's sha256 and tensor table."""
    import ggufmtp
    from ggufmtp.provenance.audit import audit
    from ggufmtp.synth.builtin import builtin_path

    receipts = sorted((ROOT / "receipts").glob("*.receipt.json"))
    assert receipts
    for rc in receipts:
        name = rc.name.removesuffix(".receipt.json")
        recipe = re.search(r"-(hifi-q4_k_m-mtp|q8_0-mtp|q4_k_m-mtp-q8|iq4_xs-mtp)\.gguf$", name).group(1)
        ggufmtp.quantize(builtin_path("builtin:tiny-qwen35moe"), recipe, tmp_path / name, progress=False)
        report = audit(tmp_path / name, rc)
        assert report.ok, [c for c in report.checks if not c.ok]


# Where the example is if it ever hangs: it timed out twice in clean-clone runs on a loaded 2-core
# machine (passing in ~9 s alone, and in ~37 s beside five busy loops), cause not reproduced.
HANG_DUMP_S, HANG_KILL_S = 480, 600
RUN_WITH_A_HANG_DUMP = ("import faulthandler, sys; faulthandler.dump_traceback_later({s}, exit=False); "
                        "exec(compile(sys.argv[1], '<README>', 'exec'))")


@pytest.mark.runtime
def test_the_readme_python_example_runs_as_written(tmp_path):
    code = re.search(r"## Python API.*?```python\n(.*?)```", README, re.S).group(1)
    argv = [sys.executable, "-c", RUN_WITH_A_HANG_DUMP.format(s=HANG_DUMP_S), code]
    try:
        proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=HANG_KILL_S)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr or ""
        ps = subprocess.run(["ps", "-eo", "pid,ppid,etime,time,args"], capture_output=True, text=True).stdout
        pytest.fail(f"the example ran over {HANG_KILL_S} s; its threads at {HANG_DUMP_S} s:\n{err[-6000:]}\n{ps[-4000:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "pass acceptance 100.0%"
