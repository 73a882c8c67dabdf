"""#50 item 5, "Upload what is there": a ladder's results, failing ones too, are reused by a rerun
with ``--upload`` (nothing measured again: no llama-server, no quantization, receipts untouched), the
console names each variant's reason before the publish gate, and ``ggufmtp upload LADDER_DIR REPO``
publishes a finished ladder: all or nothing by default, ``--passing-only`` for the variants that pass.

The ladder is designed to hold one passing and one failing variant on any machine: the tiny model's
head drafts half of its tokens wrong (``tiny-qwen35moe-f50``: acceptance about 23 % at 4 drafted
tokens, (0.5 + 0.25 + 0.125 + 0.0625) / 4), judged by each recipe's own minimum (``--no-reference``):
q8_0-mtp asks for 60 % (a fail), the other recipe for 5 % (a pass, with the 8 prompts of 64 tokens
a published verdict needs)."""

from __future__ import annotations

import json
import subprocess

import pytest
from click.testing import CliRunner
from fakehub import FakeHub, isolate_hf_client

from ggufmtp.cli import main

MODEL = "builtin:tiny-qwen35moe-f50"
TOKEN = "hf_reuseTOKEN"
LENIENT = """name = "lenient-q4_0"
description = "Q4_0 with a minimum acceptance of 5 %, far below the head's (a designed passing verdict)"
ftype = "Q4_0"
tag = "Q4_0"
imatrix = "none"

[mtp]
required = true

[verify]
min_acceptance = 0.05
draft_n_max = 4
"""
VERIFY_ARGS = ["--seeds", "42", "--limit", "8", "--max-tokens", "64", "-t", "1", "--quantize-threads", "1",
               "--no-reference"]


@pytest.fixture(scope="module")
def made(llama_server_bin, tmp_path_factory):
    """The ladder, made once: Q8_0 fails, Q4_0 passes."""
    tmp = tmp_path_factory.mktemp("reuse")
    recipe = tmp / "lenient.toml"
    recipe.write_text(LENIENT)
    out = tmp / "ladder"
    argv = ["ladder", "-m", MODEL, "-r", "q8_0-mtp", "-r", str(recipe), "-o", str(out), *VERIFY_ARGS]
    r = CliRunner().invoke(main, [*argv, "--json"])
    assert r.exit_code == 1, r.output  # a failing verdict
    d = json.loads(r.stdout)
    verdicts = {v["variant"]: v["summary"].get("verdict") or v["error"] for v in d["variants"]}
    assert verdicts == {"Q8_0": "fail", "Q4_0": "pass"}, verdicts
    return out, argv


def _spy_on_processes(monkeypatch) -> list[str]:
    """Every process started (llama-server, llama-perplexity, ...: all through subprocess.Popen) and
    every quantization (libllama's, in a child of its own), recorded; each still runs as it would."""
    started: list[str] = []
    real_popen = subprocess.Popen

    class Recording(real_popen):  # type: ignore[misc, valid-type]
        def __init__(self, args, *a, **kw):
            started.append(str(args if isinstance(args, str) else args[0]))
            super().__init__(args, *a, **kw)

    monkeypatch.setattr(subprocess, "Popen", Recording)
    from ggufmtp.quant import quantize as quantize_mod

    real_quantize = quantize_mod.run_quantize_interruptible

    def recording_quantize(*a, **kw):
        started.append("quantize")
        return real_quantize(*a, **kw)

    monkeypatch.setattr(quantize_mod, "run_quantize_interruptible", recording_quantize)
    return started


def test_a_rerun_with_upload_measures_nothing_again_and_names_each_variant_s_reason(made, tmp_path, monkeypatch):
    """The report: adding ``--upload`` re-cut, re-verified and re-evaluated every variant, because a
    failing verdict was not reused. Now the rerun starts no process and no quantization, leaves every
    receipt as it was, says ``reused`` per variant, and the gate's refusal names the failing variant
    (all or nothing: nothing is sent)."""
    out, argv = made
    receipts = sorted(out.glob("*/*.receipt.json"))
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in receipts}
    assert len(receipts) == 2
    isolate_hf_client(tmp_path / "hf_home", monkeypatch)
    monkeypatch.delenv("GGUFMTP_PUBLIC_KEY", raising=False)
    started = _spy_on_processes(monkeypatch)
    with FakeHub(tokens=(TOKEN,)) as fake:
        r = CliRunner().invoke(main, [*argv, "--upload", "me/rel"], env={"HF_ENDPOINT": fake.url, "HF_TOKEN": TOKEN})
        assert fake.requests_to("POST", r"^/api/repos/create$") == [] and fake.repos == {}
    assert started == [], started  # nothing measured or cut again
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in receipts} == before
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert "Q4_0: reused — pass" in r.stderr and "Q8_0: reused — fail — acceptance" in r.stderr, r.stderr
    assert "Q4_0: ok" in r.stdout and "Q8_0: refused — refusing to publish" in r.stderr
    assert "its verification failed (verdict fail" in r.stderr
    assert "error: not uploaded to me/rel: the publish gate refuses 1 of the ladder's 2 variants" in r.stderr


def test_upload_ladder_dir_all_or_nothing_then_the_passing_ones(made, tmp_path, monkeypatch):
    """``ggufmtp upload LADDER_DIR REPO``: each variant's line; the default sends nothing while one is
    refused (exit 1); ``--passing-only`` commits the passing variant, its receipt and a card of it
    alone, and the JSON names that commit. Nothing is measured."""
    out, _ = made
    isolate_hf_client(tmp_path / "hf_home", monkeypatch)
    monkeypatch.delenv("GGUFMTP_PUBLIC_KEY", raising=False)
    started = _spy_on_processes(monkeypatch)
    with FakeHub(tokens=(TOKEN,)) as fake:
        env = {"HF_ENDPOINT": fake.url, "HF_TOKEN": TOKEN}
        r = CliRunner().invoke(main, ["upload", str(out), "me/rel"], env=env)
        assert r.exit_code == 1 and "Traceback" not in r.output, r.output
        assert "  Q4_0: ok" in r.stdout and "  Q8_0: refused — refusing to publish" in r.stderr, r.output
        assert "error: nothing uploaded: the publish gate refuses 1 of the ladder's 2 variants" in r.stderr
        assert fake.requests_to("POST", r"^/api/repos/create$") == [] and fake.repos == {}

        r = CliRunner().invoke(main, ["upload", str(out), "me/rel", "--passing-only", "--json"], env=env)
        assert r.exit_code == 0, r.output
        d = json.loads(r.stdout)
        assert [(v["variant"], v["ok"]) for v in d["variants"]] == [("Q8_0", False), ("Q4_0", True)]
        commit = fake.history("me/rel")[0]
        assert d["commit_sha"] == commit.oid and len(fake.requests_to("POST", r"/commit/main$")) == 1
        q4, q8 = "tiny-qwen35moe-f50-Q4_0.gguf", "tiny-qwen35moe-f50-Q8_0.gguf"
        assert set(commit.files) == {q4, q4 + ".receipt.json", "README.md", ".gitattributes"}
        card = fake.file("me/rel", "README.md").decode()
        assert q4 in card and q8 not in card and "me/rel" in card
    assert started == []
    assert q8 in (out / "README.md").read_text()  # the ladder's own card is left whole


def test_a_folder_that_is_not_a_ladder_s_is_one_clear_error(tmp_path):
    """A folder without the ladder's record, and a record cut short: one error naming it, nothing sent."""
    (tmp_path / "d" / ".ggufmtp").mkdir(parents=True)
    r = CliRunner().invoke(main, ["upload", str(tmp_path / "d"), "me/rel", "--dry-run"])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert f"{tmp_path / 'd'} is not a ladder's folder: it has no .ggufmtp/ladder.json" in r.stderr, r.output
    (tmp_path / "d" / ".ggufmtp" / "ladder.json").write_text('{"out_dir": "x", "mod')
    r = CliRunner().invoke(main, ["upload", str(tmp_path / "d"), "me/rel", "--dry-run"])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert f"{tmp_path / 'd' / '.ggufmtp' / 'ladder.json'}: not a ladder record ggufmtp can read" in r.stderr


def test_a_stage_that_runs_again_names_the_input_that_changed(tmp_path):
    """What the per-variant line is made of: a stage's record keeps each named input's digest, so a
    rerun says which one changed; a failing verdict is measured again unless reuse_failed (a ladder)."""
    from ggufmtp.stage_cache import StageCache, named_key

    def verify(limit: int, cache: StageCache, verdict: str = "fail") -> str | None:
        key = named_key(stage="verify", artifact="a" * 64, verify_settings={"limit": limit})
        cache.run("verify", key, lambda: {"verdict": verdict}, ok=lambda r: r["verdict"] == "pass")
        return cache.records[-1].why

    assert verify(8, StageCache(tmp_path, lambda m: None, force=False)) == "no record"
    assert verify(8, StageCache(tmp_path, lambda m: None, force=False)) == "its last verdict failed (measured again)"
    assert verify(8, StageCache(tmp_path, lambda m: None, force=False, reuse_failed=True)) is None  # reused: not run
    assert verify(16, StageCache(tmp_path, lambda m: None, force=False, reuse_failed=True)) == "verify settings changed"


def test_the_sidecar_layout_reuses_a_failing_pair_verdict_too(llama_server_bin, tmp_path, monkeypatch):
    """The sidecar layout keeps its trunks' measurements in their receipts (ladder/pairs.py): a trunk
    whose pair verdict failed was cut and verified again on every rerun; now the rerun reuses it,
    says why nothing ran, and starts nothing."""
    from ggufmtp.ladder.run import run_ladder
    from ggufmtp.ladder.spec import LadderSpec, Layout
    from ggufmtp.measure.core.options import VerifyOptions

    (tmp_path / "lenient.toml").write_text(LENIENT)
    spec = LadderSpec(model=MODEL, recipes=("q8_0-mtp", str(tmp_path / "lenient.toml")), out_dir=tmp_path / "ladder",
                      threads=1, reference_base=False, layout=Layout.SIDECAR,
                      verify_options=VerifyOptions.from_dict({"seeds": (42,), "limit": 3, "max_tokens": 24,
                                                              "threads": 1}))
    first = run_ladder(spec, progress=False)
    assert [o.summary.get("verdict") or o.error for o in first.outcomes] == ["fail", "pass"]
    started = _spy_on_processes(monkeypatch)
    lines: list[str] = []
    again = run_ladder(spec, progress=False, log=lines.append)
    assert started == [], started
    assert [o.summary["verdict"] for o in again.outcomes] == ["fail", "pass"]
    assert all(set(o.summary["stages"].values()) == {"cached"} for o in again.outcomes)
    assert "Q8_0: reused — fail — acceptance" in "\n".join(lines) and "Q4_0: reused — pass" in lines, lines
