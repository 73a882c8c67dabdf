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


@pytest.mark.runtime
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


@pytest.mark.runtime
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


@pytest.mark.runtime
def test_changed_recipe_reruns_quantize_not_pull(tmp_path):
    ggufmtp.run("q8_0-mtp", "builtin:tiny-qwen35moe", out_dir=tmp_path, verify=False, progress=False)
    res = ggufmtp.run("hifi-q4_k_m-mtp", "builtin:tiny-qwen35moe", out_dir=tmp_path, verify=False, progress=False)
    s = stages(res)
    assert s["pull"] == "cached" and s["inspect"] == "cached"
    assert s["plan"] == "ran" and s["quantize"] == "ran"
    assert "verify" not in s


@pytest.mark.runtime
def test_deleted_artifact_is_rebuilt(tmp_path):
    res = ggufmtp.run("q8_0-mtp", "builtin:tiny-qwen35moe", out_dir=tmp_path, verify=False, progress=False)
    res.artifact.unlink()
    again = ggufmtp.run("q8_0-mtp", "builtin:tiny-qwen35moe", out_dir=tmp_path, verify=False, progress=False)
    assert stages(again)["quantize"] == "ran" and again.artifact.exists()


@pytest.mark.runtime
def test_run_cli_json(tmp_path):
    r = CliRunner().invoke(main, ["run", "--recipe", "q8_0-mtp", "--model", "builtin:tiny-qwen35moe", "-o",
                                  str(tmp_path), "--seeds", "42", "--limit", "3", "--max-tokens", "24", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output[r.output.index("{"):])
    for key in ("artifact", "receipt", "mtp_status", "acceptance", "acceptance_ci95", "speedup"):
        assert key in d
    assert d["mtp_status"] == "complete" and d["acceptance"] > 0.9


@pytest.mark.runtime
def test_run_refuses_model_without_mtp(tmp_path):
    r = CliRunner().invoke(main, ["run", "--recipe", "hifi-q4_k_m-mtp", "--model", "builtin:tiny-qwen35moe-nomtp",
                                  "-o", str(tmp_path), "--no-verify"])
    assert r.exit_code == 1 and "has none" in r.output


def test_bad_model_argument(tmp_path):
    r = CliRunner().invoke(main, ["run", "--recipe", "q8_0-mtp", "--model", "not-a-repo", "-o", str(tmp_path)])
    assert r.exit_code == 1 and "not a file" in r.output


def test_summary_json_and_text_from_stage_records(tmp_path):
    from ggufmtp.pipeline import RunResult, StageRecord, StageStatus

    verification = {"mtp": {"acceptance": 0.875, "acceptance_ci95": [0.8, 0.9]}, "speedup": 1.5,
                    "speedup_ci95": [1.25, 1.75], "verdict": "pass"}
    records = [StageRecord("pull", "k0", True, {}),
               StageRecord("quantize", "k1", False, {"size_bytes": 1234, "bpw": 4.5,
                                                     "mtp": {"status": "complete", "block": 4}}),
               StageRecord("verify", "k2", False, {"verification": verification})]
    res = RunResult(tmp_path, tmp_path / "a.gguf", tmp_path / "a.gguf.receipt.json", None, records)
    s = res.summary()
    assert list(s) == ["artifact", "receipt", "card", "size_bytes", "bpw", "mtp_status", "mtp_block", "acceptance",
                       "acceptance_ci95", "speedup", "speedup_ci95", "verdict", "uploaded", "stages"]
    assert s["stages"] == {"pull": "cached", "quantize": "ran", "verify": "ran"}
    assert json.loads(json.dumps(s)) == s and records[0].status is StageStatus.CACHED
    text = res.summary_record().format().splitlines()
    assert text[1] == "size        1,234 bytes, 4.500 bpw" and text[2] == "MTP         blk.4 complete"
    assert text[3] == "acceptance  87.5% (95% CI 80.0-90.0%)" and text[4] == "speedup     1.50x (95% CI 1.25-1.75x)"
    assert text[-1] == "stages      pull cached, quantize ran, verify ran"


def test_model_references(tmp_path):
    from ggufmtp.refs import ModelRef, RefKind, local_model_arg, parse_model_ref

    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    assert parse_model_ref("builtin:tiny-qwen35moe") == ModelRef(RefKind.BUILTIN, "builtin:tiny-qwen35moe")
    assert parse_model_ref(str(f)) == ModelRef(RefKind.LOCAL, str(f.resolve()))
    assert parse_model_ref("owner/name@v1") == ModelRef(RefKind.HUB, "owner/name", "v1")
    assert parse_model_ref("owner/name") == ModelRef(RefKind.HUB, "owner/name", None)
    for bad in ("not-a-repo", "a/b/c", "./x/y"):
        with pytest.raises(ggufmtp.GgufmtpError, match="not a file"):
            parse_model_ref(bad)
    assert local_model_arg("some/path.gguf") == "some/path.gguf"  # passed on; the command checks it
