"""One Python API that is the CLI (#51 item 3): ``ggufmtp.quantize`` writes what ``ggufmtp quantize``
writes (the command calls it), a keyword is named as the command's option, and every options object
refuses a value its flag would refuse, with a typed error naming the field."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import ggufmtp
from ggufmtp.cli import main
from ggufmtp.errors import GgufmtpError, QuantizeError, VerifyError
from ggufmtp.provenance.receipt import integrity_digest, load_receipt

MODEL = "builtin:tiny-qwen35moe"


def _cli_params(command: str) -> set[str]:
    cmd = main.commands[command]
    assert isinstance(cmd, click.Command)
    return {p.name for p in cmd.params if p.name}


def _same_receipt_but_time(a: dict, b: dict) -> None:
    """Two receipts of the same bytes made the same way: equal but for when they were made. The
    integrity digest seals those times too (whole seconds: two runs straddling a second differ), so
    each is checked against its own receipt, then set aside with them."""
    for st in (a, b):
        assert st["predicate"]["integrity"]["sha256"] == integrity_digest(st)
        for k in ("started_at", "finished_at", "integrity"):
            st["predicate"].pop(k)
    assert a == b


@pytest.mark.runtime
def test_the_api_s_quantize_writes_the_receipt_the_command_writes(tmp_path):
    """The issue's case: ``ggufmtp.quantize`` wrote no receipt, the command did. Now the file the
    function publishes has its receipt beside it, the same receipt the command writes for the same
    input (a builtin name recorded as such, not as a local file), and ``ggufmtp audit`` passes on it
    exactly as on the command's."""
    (tmp_path / "cli").mkdir()
    (tmp_path / "api").mkdir()
    cli_out, api_out = tmp_path / "cli" / "tiny.gguf", tmp_path / "api" / "tiny.gguf"
    r = CliRunner().invoke(main, ["quantize", MODEL, "-r", "q8_0-mtp", "-o", str(cli_out), "--no-progress"])
    assert r.exit_code == 0, r.output
    res = ggufmtp.quantize(MODEL, "q8_0-mtp", api_out, progress=False)
    receipt = tmp_path / "api" / "tiny.gguf.receipt.json"
    assert receipt.is_file(), "ggufmtp.quantize published its artifact without a receipt"
    assert res.receipt == receipt and res.output == api_out and res.signature is None
    _same_receipt_but_time(load_receipt(receipt), load_receipt(tmp_path / "cli" / "tiny.gguf.receipt.json"))
    audits = []
    for out in (cli_out, api_out):
        a = CliRunner().invoke(main, ["audit", str(out), "--json"])  # the receipt found beside the artifact
        assert a.exit_code == 0, a.output
        audits.append(json.loads(a.stdout))
    assert [(c["name"], c["ok"]) for c in audits[0]["checks"]] == [(c["name"], c["ok"]) for c in audits[1]["checks"]]
    assert audits[1]["ok"] and not audits[1]["partial"]
    # no_receipt is the command's --no-receipt: nothing beside the artifact
    bare = ggufmtp.quantize(MODEL, "q8_0-mtp", tmp_path / "bare.gguf", no_receipt=True, progress=False)
    assert bare.receipt is None and not (tmp_path / "bare.gguf.receipt.json").exists()


@pytest.mark.runtime
def test_signed_through_the_api_as_through_the_commands(tmp_path):
    """``signing_key`` is the commands' ``--signing-key``: quantize signs the receipt and the
    artifact, and verify re-signs the receipt it writes into (without the key the API's verify
    refused a signed receipt, after the run). The public key checks both, as ``audit`` does."""
    from fakehub import write_keypair

    from ggufmtp.provenance.receipt import read_receipt

    priv, pub = write_keypair(tmp_path, "signer")
    made = ggufmtp.quantize(MODEL, "q8_0-mtp", tmp_path / "q.gguf", signing_key=priv, progress=False)
    assert made.receipt is not None and made.signature == tmp_path / "q.gguf.sig" and made.signature.is_file()
    options = ggufmtp.VerifyOptions(draft_n_max=2, seeds=(42,), limit=1, max_tokens=8)
    check = ggufmtp.verify(made.output, options, receipt=made.receipt, signing_key=priv, progress=False)
    rf = read_receipt(made.receipt)
    assert rf.signed and rf.predicate["verification"]["verdict"] == check.verdict
    assert ggufmtp.audit(made.output, made.receipt, public_key=pub, progress=False).ok


def test_a_bad_signing_key_is_refused_before_any_work(tmp_path):
    missing = tmp_path / "no-such-key.pem"
    with pytest.raises(GgufmtpError, match="no-such-key.pem"):
        ggufmtp.quantize(MODEL, "q8_0-mtp", tmp_path / "q.gguf", signing_key=missing, progress=False)
    with pytest.raises(GgufmtpError, match="no-such-key.pem"):
        ggufmtp.verify(tmp_path / "q.gguf", receipt=tmp_path / "q.gguf.receipt.json", signing_key=missing)
    assert not any(tmp_path.iterdir())


def test_a_receipt_over_the_artifact_is_refused_before_any_work(tmp_path):
    out = tmp_path / "q.gguf"
    with pytest.raises(QuantizeError, match="the receipt path is the output path"):
        ggufmtp.quantize(MODEL, "q8_0-mtp", out, receipt=out, progress=False)
    assert not any(tmp_path.iterdir())


def test_the_api_s_keywords_are_the_commands_option_names():
    """``threads=`` meant ``--quantize-threads`` in the API and ``-t`` (llama.cpp's threads) on the
    command line, ``split=`` was ``--split-max-size``: every keyword of ``quantize`` and ``plan`` is
    now an option of the command of that name (or ``progress``, ``mtp_optional``: no flag), and
    RunOptions' quantization threads are ``quantize_threads``, as ``ggufmtp run``'s flag."""
    no_flag = {"progress", "mtp_optional"}
    for name in ("quantize", "plan"):
        sig = inspect.signature(getattr(ggufmtp, name))
        keywords = {p.name for p in sig.parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY}
        assert keywords - no_flag <= _cli_params("quantize"), name  # plan's threads are quantize --dry-run's
    assert {"quantize_threads", "split_max_size", "receipt", "no_receipt", "signing_key"} <= set(
        inspect.signature(ggufmtp.quantize).parameters)
    run_fields = {f.name for f in dataclasses.fields(ggufmtp.RunOptions)}
    assert "quantize_threads" in run_fields and "threads" not in run_fields
    assert {"quantize_threads", "threads"} <= _cli_params("run")  # the command has both: they differ
    measure_fields = {f.name for f in dataclasses.fields(ggufmtp.MeasureOptions)}
    assert "quantize_threads" in measure_fields and "threads" not in measure_fields


BAD_VERIFY_OPTIONS = [
    # (keywords, the field the error names)
    ({"seeds": 42}, "seeds"), ({"seeds": ("a",)}, "seeds"), ({"seeds": (1.5,)}, "seeds"), ({"limit": 0}, "limit"),
    ({"sweep": 5}, "sweep"), ({"sweep": ("a",)}, "sweep"), ({"max_tokens": "x"}, "max_tokens"),
    ({"draft_n_max": "4"}, "draft_n_max"), ({"draft_n_min": -1}, "draft_n_min"), ({"ctx_size": 0}, "ctx_size"),
    ({"parallel": 0}, "parallel"), ({"context_fill": -1}, "context_fill"), ({"raw": "yes"}, "raw"),
    ({"suite": 5}, "suite"), ({"server": {"threads": 2}}, "server"), ({"judge": 5}, "judge"),
    ({"server": ggufmtp.ServerOptions}, "server"),
]


@pytest.mark.parametrize(("kw", "field"), BAD_VERIFY_OPTIONS, ids=[str(kw) for kw, _ in BAD_VERIFY_OPTIONS])
def test_verify_options_refuse_what_the_flags_refuse_naming_the_field(kw, field):
    """Each value ``verify``'s flag would refuse is a VerifyError that starts with the field's name
    (was: a bare TypeError/ValueError from deep inside, or accepted)."""
    with pytest.raises(VerifyError) as ei:
        ggufmtp.VerifyOptions(**kw)
    assert str(ei.value).startswith(f"{field} "), ei.value


@pytest.mark.parametrize(("cls", "kw", "field"), [
    ("ServerOptions", {"threads": 0}, "threads"), ("ServerOptions", {"threads": "2"}, "threads"),
    ("ServerOptions", {"gpu_layers": "most"}, "gpu_layers"), ("ServerOptions", {"extra_args": "-b 256"}, "extra_args"),
    ("JudgeOptions", {"bootstrap_resamples": 0}, "bootstrap_resamples"), ("JudgeOptions", {"thresholds": 5}, "thresholds"),
    ("RunOptions", {"quantize_threads": -1}, "quantize_threads"),
])
def test_the_other_options_objects_name_the_field_too(cls, kw, field):
    with pytest.raises(GgufmtpError) as ei:
        getattr(ggufmtp, cls)(**kw)
    assert str(ei.value).startswith(f"{field} "), ei.value


def test_the_functions_check_quantize_threads_before_any_work(tmp_path):
    for call in (lambda: ggufmtp.plan(MODEL, "q8_0-mtp", quantize_threads=-2),
                 lambda: ggufmtp.quantize(MODEL, "q8_0-mtp", tmp_path / "q.gguf", quantize_threads=True)):
        with pytest.raises(QuantizeError, match="^quantize_threads "):
            call()
    assert not any(tmp_path.iterdir())


def test_the_good_values_still_build():
    o = ggufmtp.VerifyOptions(seeds=[7], limit=1, sweep=[2, 3], draft_n_min=0, ctx_size=None, parallel=None,
                              server=ggufmtp.ServerOptions(threads=2, gpu_layers="all", extra_args=["-b", "256"]))
    assert o.seeds == (7,) and o.sweep == (2, 3) and o.server.extra_args == ("-b", "256")


EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "quantize_verify_audit_card.py"


def test_the_example_script_is_at_most_15_lines_of_public_api():
    """#51's Done-when: a user's 15-line script (quantize, verify against the source, audit, card)
    with builtin names; it imports ggufmtp alone (tests/test_wheel.py checks it under mypy --strict)."""
    tree = ast.parse(EXAMPLE.read_text())
    body = tree.body[1:] if ast.get_docstring(tree) else tree.body
    lines = {n for stmt in body for n in range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1)}
    assert len(lines) <= 15, len(lines)
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert [a.name for n in imports for a in n.names] == ["ggufmtp"] and all(isinstance(n, ast.Import) for n in imports)
    called = {n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
              and isinstance(n.func.value, ast.Name) and n.func.value.id == "ggufmtp"}
    assert {"quantize", "verify", "audit", "make_card", "VerifyOptions"} <= called


@pytest.mark.runtime
def test_the_example_script_runs_as_written(tmp_path):
    """The script, run as a user runs it, in an empty folder: the artifact, its receipt holding the
    verification, whose head was judged against the source (``reference=``) and kept, and the card."""
    env = {**os.environ, "PYTHONPATH": str(EXAMPLE.parents[2])}
    p = subprocess.run([sys.executable, str(EXAMPLE)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert "verdict " in p.stdout and "card: README.md" in p.stdout
    assert {f.name for f in tmp_path.iterdir()} >= {"tiny-mtp.gguf", "tiny-mtp.gguf.receipt.json", "README.md"}
    v = load_receipt(tmp_path / "tiny-mtp.gguf.receipt.json")["predicate"]["verification"]
    assert v["head"]["decision"] == "preserved" and v["head"]["reference"]["bound"]["by"] == "source"
