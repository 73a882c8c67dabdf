"""ggufmtp run end to end, resume after a failure, input-keyed stage cache, the Python API."""

from __future__ import annotations

import json
import sys

import pytest
from click.testing import CliRunner

import ggufmtp
from ggufmtp.provenance.audit import audit
from ggufmtp.cli import main
from ggufmtp.provenance.receipt import load_receipt, schema_errors

VERIFY = {"seeds": (42,), "limit": 4, "max_tokens": 32}


def stages(res):
    return {s.stage: ("cached" if s.cached else "ran") for s in res.stages}


def test_run_end_to_end_then_fully_cached(tmp_path):
    out = tmp_path / "out"
    res = ggufmtp.run("hifi-q4_k_m-mtp", "builtin:tiny-qwen35moe", out_dir=out, verify_options=VERIFY, progress=False)
    assert set(stages(res).values()) == {"ran"}
    s = res.summary()
    assert s["mtp_status"] == "complete" and s["verdict"] == "pass"
    assert s["acceptance"] == pytest.approx(1.0) and len(s["acceptance_ci95"]) == 2
    st = load_receipt(res.receipt)
    assert schema_errors(st) == [] and st["predicate"]["verification"]["mtp"]["draft_n"] > 0
    assert st["predicate"]["base_model"]["source"]["type"] == "builtin"
    assert audit(res.artifact, res.receipt).ok
    card = res.card.read_text()
    assert "speculative-decoding" in card and "--spec-type draft-mtp" in card and st["subject"][0]["digest"]["sha256"] in card
    again = ggufmtp.run("hifi-q4_k_m-mtp", "builtin:tiny-qwen35moe", out_dir=out, verify_options=VERIFY, progress=False)
    assert set(stages(again).values()) == {"cached"}


def test_resume_after_failure_in_verify(tmp_path, monkeypatch):
    verify_mod = sys.modules["ggufmtp.measure.verify"]
    real = verify_mod.verify
    calls = []

    def broken(*a, **k):
        calls.append(1)
        raise ggufmtp.GgufmtpError("injected failure in verify")

    monkeypatch.setattr(verify_mod, "verify", broken)
    with pytest.raises(ggufmtp.GgufmtpError, match="injected"):
        ggufmtp.run("q8_0-mtp", "builtin:tiny-qwen35moe", out_dir=tmp_path, verify_options=VERIFY, progress=False)
    assert calls and not (tmp_path / ".ggufmtp" / "stages" / "verify.json").exists()
    monkeypatch.setattr(verify_mod, "verify", real)
    res = ggufmtp.run("q8_0-mtp", "builtin:tiny-qwen35moe", out_dir=tmp_path, verify_options=VERIFY, progress=False)
    s = stages(res)
    assert [s[k] for k in ("pull", "inspect", "plan", "quantize", "audit")] == ["cached"] * 5
    assert s["verify"] == "ran" and s["receipt"] == "ran" and s["card"] == "ran"


def test_changed_recipe_reruns_quantize_not_pull(tmp_path):
    ggufmtp.run("q8_0-mtp", "builtin:tiny-qwen35moe", out_dir=tmp_path, verify=False, progress=False)
    res = ggufmtp.run("hifi-q4_k_m-mtp", "builtin:tiny-qwen35moe", out_dir=tmp_path, verify=False, progress=False)
    s = stages(res)
    assert s["pull"] == "cached" and s["inspect"] == "cached"
    assert s["plan"] == "ran" and s["quantize"] == "ran"
    assert "verify" not in s


def test_deleted_artifact_is_rebuilt(tmp_path):
    res = ggufmtp.run("q8_0-mtp", "builtin:tiny-qwen35moe", out_dir=tmp_path, verify=False, progress=False)
    res.artifact.unlink()
    again = ggufmtp.run("q8_0-mtp", "builtin:tiny-qwen35moe", out_dir=tmp_path, verify=False, progress=False)
    assert stages(again)["quantize"] == "ran" and again.artifact.exists()


def test_run_cli_json(tmp_path):
    r = CliRunner().invoke(main, ["run", "--recipe", "q8_0-mtp", "--model", "builtin:tiny-qwen35moe", "-o",
                                  str(tmp_path), "--seeds", "42", "--limit", "3", "--max-tokens", "24", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output[r.output.index("{"):])
    for key in ("artifact", "receipt", "mtp_status", "acceptance", "acceptance_ci95", "speedup"):
        assert key in d
    assert d["mtp_status"] == "complete" and d["acceptance"] > 0.9


def test_run_refuses_model_without_mtp(tmp_path):
    r = CliRunner().invoke(main, ["run", "--recipe", "hifi-q4_k_m-mtp", "--model", "builtin:tiny-qwen35moe-nomtp",
                                  "-o", str(tmp_path), "--no-verify"])
    assert r.exit_code == 1 and "has none" in r.output


def test_bad_model_argument(tmp_path):
    r = CliRunner().invoke(main, ["run", "--recipe", "q8_0-mtp", "--model", "not-a-repo", "-o", str(tmp_path)])
    assert r.exit_code == 1 and "not a file" in r.output
