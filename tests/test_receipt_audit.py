"""Receipts validate against the shipped schema; audit catches every tamper case with the right message."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggufmtp.cli import main
from ggufmtp.gguf.model import GGUFModel
from ggufmtp.imatrix import check as imc
from ggufmtp.imatrix import format as imx
from ggufmtp.provenance.audit import audit
from ggufmtp.provenance.receipt import (
    PREDICATE_TYPE,
    STATEMENT_TYPE,
    load_receipt,
    receipt_for_quantize,
    schema_errors,
    seal,
    set_verification,
)
from ggufmtp.provenance.verdict import Thresholds
from ggufmtp.quant.quantize import quantize
from ggufmtp.synth.spec import SynthSpec
from ggufmtp.synth.writer import synthesize


@pytest.fixture(scope="module")
def artifact(llama_runtime, tmp_path_factory):
    d = tmp_path_factory.mktemp("rcpt")
    src = synthesize(d / "base.gguf", SynthSpec(), progress=False).path
    im = d / "imatrix.gguf"
    imx.write_imatrix(imc.synthetic_imatrix(imc.read_model_tensors(src), seed=3), im)
    out = d / "art.gguf"
    res = quantize(src, "hifi-q4_k_m-mtp", out, imatrix=im, progress=False)
    rcpt = receipt_for_quantize(res, imatrix=im)
    return {"dir": d, "src": src, "out": out, "receipt": rcpt, "imatrix": im}


@pytest.fixture
def copy(artifact, tmp_path):
    out = tmp_path / artifact["out"].name
    shutil.copy(artifact["out"], out)
    rc = tmp_path / artifact["receipt"].name
    shutil.copy(artifact["receipt"], rc)
    return out, rc


def failed(report):
    return {c.name: c.detail for c in report.checks if not c.ok}


def test_receipt_is_a_valid_in_toto_statement(artifact):
    st = load_receipt(artifact["receipt"])
    assert st["_type"] == STATEMENT_TYPE and st["predicateType"] == PREDICATE_TYPE
    assert schema_errors(st) == []
    subj = st["subject"][0]
    assert subj["name"] == "art.gguf" and len(subj["digest"]["sha256"]) == 64
    assert subj["annotations"]["size"] == artifact["out"].stat().st_size
    p = st["predicate"]
    assert p["base_model"]["files"][0]["name"] == "base.gguf"
    assert p["imatrix"]["format"] == "gguf" and p["imatrix"]["entries"] > 0
    assert p["imatrix"]["missing"] == [] or all(n.startswith("blk.4.") for n in p["imatrix"]["missing"])
    assert p["recipe"]["name"] == "hifi-q4_k_m-mtp" and len(p["recipe"]["sha256"]) == 64
    assert p["result"]["tensor_types"]["blk.4.nextn.eh_proj.weight"] == "Q8_0"
    assert p["result"]["mtp_status"] == "complete" and p["result"]["mtp_block"] == 4
    assert p["toolchain"]["quantizer"]["llama_cpp_commit"] == "0c1e570"
    assert p["verification"] is None


def test_clean_audit_passes(copy):
    out, rc = copy
    r = audit(out, rc)
    assert r.ok and not r.partial and r.unchecked == [], failed(r)
    res = CliRunner().invoke(main, ["audit", str(out), "--receipt", str(rc), "--json"])
    d = json.loads(res.output)
    assert res.exit_code == 0 and d["ok"] is True and all(c["ok"] for c in d["checks"])


def test_flipped_byte_in_tensor_data(copy):
    out, rc = copy
    gm = GGUFModel(out)
    off = gm.tensor_data_offsets["blk.4.nextn.eh_proj.weight"] + 100
    data = bytearray(out.read_bytes())
    data[off] ^= 0x01
    out.write_bytes(bytes(data))
    f = failed(audit(out, rc))
    assert list(f) == ["sha256 art.gguf"] and "receipt" in f["sha256 art.gguf"]


def test_changed_tensor_type(copy, artifact):
    out, rc = copy
    quantize(artifact["src"], "q4_k_m-mtp-q8", out, progress=False)  # same name, another policy
    f = failed(audit(out, rc))
    assert "tensor types" in f
    assert "blk.4.attn_q.weight: receipt Q4_K, file Q8_0" in f["tensor types"]
    res = CliRunner().invoke(main, ["audit", str(out), "--receipt", str(rc)])
    assert res.exit_code == 1 and "✗ tensor types" in res.output


def test_edited_receipt_field(copy):
    out, rc = copy
    st = json.loads(rc.read_text())
    st["predicate"]["recipe"]["name"] = "q8_0-mtp"
    rc.write_text(json.dumps(st))
    f = failed(audit(out, rc))
    assert list(f) == ["receipt integrity"] and "edited" in f["receipt integrity"]


def test_edited_tensor_table_resealed_still_caught(copy):
    out, rc = copy
    st = json.loads(rc.read_text())
    st["predicate"]["result"]["tensor_types"]["blk.4.nextn.eh_proj.weight"] = "Q4_K"
    rc.write_text(json.dumps(seal(st)))
    f = failed(audit(out, rc))
    assert "blk.4.nextn.eh_proj.weight: receipt Q4_K, file Q8_0" in f["tensor types"]
    assert "tensor table digest" in f


def test_receipt_of_another_file(copy, artifact, tmp_path):
    out, rc = copy
    other = tmp_path / "other.gguf"
    shutil.copy(artifact["src"], other)
    f = failed(audit(other, rc))
    assert "receipt names this artifact" in f and "not other.gguf" in f["receipt names this artifact"]


def test_missing_shard(artifact, tmp_path):
    from gguf_copy import copy_gguf

    shards = copy_gguf(artifact["out"], tmp_path / "sh.gguf", split_max_tensors=50)
    assert len(shards) == 2
    from ggufmtp.provenance.receipt import build_statement

    st = json.loads(artifact["receipt"].read_text())
    st = build_statement(shards, st["predicate"])
    from ggufmtp.gguf.model import GGUFModel as M
    st["predicate"]["result"]["size_bytes"] = M(shards[0]).size_bytes
    rc = tmp_path / "sh.receipt.json"
    rc.write_text(json.dumps(seal(st)))
    assert audit(shards[0], rc).ok, failed(audit(shards[0], rc))
    shards[1].unlink()
    f = failed(audit(shards[0], rc))
    assert "all shards present" in f and shards[1].name in f["all shards present"]


def test_audit_without_receipt(copy):
    out, rc = copy
    rc.unlink()
    r = audit(out)
    assert r.ok and r.receipt is None and r.partial
    names = [c.name for c in r.checks]
    assert "MTP block" in names and "quantize.imatrix metadata" in names
    assert "entries_count" in next(c.detail for c in r.checks if c.name == "quantize.imatrix metadata")


def test_verification_slot_validates(copy):
    out, rc = copy
    v = {"verdict": "pass", "mtp": {"acceptance": 0.9, "acceptance_ci95": [0.85, 0.95], "draft_n": 10,
                                    "draft_n_accepted": 9, "tokens_per_second": 100.0},
         "vanilla": {"tokens_per_second": 80.0}, "speedup": 1.25, "speedup_ci95": [1.2, 1.3],
         "identical_output_fraction": 1.0, "suite": {"name": "chat-v1", "sha256": "0" * 64},
         "server": {"build_info": "b1-0c1e570"}, "hardware": {"cpu": "x"}, "settings": {"draft_n_max": 4},
         "thresholds": Thresholds().to_dict()}
    with pytest.raises(Exception, match="model.sha256"):
        set_verification(rc, v)  # a hand-written verification that names no served bytes is refused
    v["model"] = {"path": str(out), "size_bytes": out.stat().st_size,
                  "sha256": load_receipt(rc)["subject"][0]["digest"]["sha256"]}
    with pytest.raises(Exception, match="'path' was unexpected"):
        set_verification(rc, v)  # a receipt names files, never paths (#28)
    v["model"] = {**v["model"], "name": out.name}
    del v["model"]["path"]
    set_verification(rc, v)
    assert audit(out, rc).ok
    bad = dict(v, verdict="maybe")
    with pytest.raises(Exception, match="not a valid receipt: predicate/verification/verdict"):
        set_verification(rc, bad)
    with pytest.raises(Exception, match="not a valid receipt"):
        set_verification(rc, dict(v, speedup=float("nan")))  # NaN is not JSON: strict readers refuse it


def test_receipt_show(artifact):
    res = CliRunner().invoke(main, ["receipt", "show", str(artifact["receipt"])])
    assert res.exit_code == 0 and "hifi-q4_k_m-mtp" in res.output and "0c1e570" in res.output


def test_set_verification_keeps_what_tune_curve_and_profiles_added(tmp_path):
    from ggufmtp.provenance.receipt import load_receipt, schema_errors, set_verification

    ref = Path(__file__).resolve().parent.parent / "receipts" / "tiny-qwen35moe-0fef400b9589-hifi-q4_k_m-mtp.gguf.receipt.json"
    r = tmp_path / "r.json"
    shutil.copy(ref, r)
    v = load_receipt(r)["predicate"]["verification"]
    v["model"]["sha256"] = load_receipt(r)["subject"][0]["digest"]["sha256"]  # bound to the artifact's bytes
    old = {**v, "profiles": {"kind": "ggufmtp profiles"}, "tuned": {"kind": "ggufmtp tune", "best": "k=3"}}
    set_verification(r, old)
    set_verification(r, {**v, "tuned": None}, keep_added=True)
    got = load_receipt(r)["predicate"]["verification"]
    assert got["profiles"] == {"kind": "ggufmtp profiles"} and got["tuned"]["best"] == "k=3"
    set_verification(r, {**v, "tuned": {"recommended_k": 2}})  # a verify --sweep's own recommendation
    set_verification(r, {**v, "tuned": None}, keep_added=True)
    assert load_receipt(r)["predicate"]["verification"]["tuned"] is None  # a stale sweep is not carried
    set_verification(r, {**v, "tuned": None})
    assert "profiles" not in load_receipt(r)["predicate"]["verification"]
    assert schema_errors(load_receipt(r)) == []


def test_audit_without_a_receipt_says_what_it_did_not_check(tmp_path):
    """#42: with no receipt, three file checks pass, and the report (its JSON, the command's text)
    says every receipt-bound check was not run: ``partial``, ``unchecked``; with one, none is left out."""
    from ggufmtp.provenance.audit import RECEIPT_CHECKS

    model = synthesize(tmp_path / "m.gguf", SynthSpec(), progress=False).path
    r = audit(model)
    assert r.ok and r.partial and r.unchecked == list(RECEIPT_CHECKS) and r.receipt is None
    assert r.to_dict()["partial"] is True and r.to_dict()["unchecked"] == list(RECEIPT_CHECKS)
    res = CliRunner().invoke(main, ["audit", str(model)])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert all(f"NOT checked: {u}" in res.output for u in RECEIPT_CHECKS)
    assert lines[-1].startswith("PASS (partial: ") and "give --receipt" in lines[-1]
    as_json = json.loads(CliRunner().invoke(main, ["audit", str(model), "--json"]).output)
    assert as_json["ok"] and as_json["partial"] and len(as_json["unchecked"]) == len(RECEIPT_CHECKS)
