"""The MTP sidecar as an artifact (issue #41, item 2): ``ggufmtp sidecar`` splits a full model into an
MTP-only GGUF and a trunk, each with a receipt binding it to the other and to the source; audit
passes on both and on the pair, refuses a sidecar given another model's trunk; verify serves the
pair (``-m TRUNK --spec-draft-model SIDECAR --spec-type draft-mtp``) with a real llama-server.

The model is the synthesized one whose head drafts a wrong successor after a designed fifth of the
tokens (``tiny-qwen35moe-f20``): its acceptance is what the design makes it, the same for the full
model and for its trunk + sidecar at temperature 0 on any machine (the same weights run the same
graphs), so the test compares drafted and accepted counts exactly."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from ggufmtp.cli import main
from ggufmtp.errors import VerifyError
from ggufmtp.gguf.model import GGUFModel, MTPStatus, check_mtp, tensor_array
from ggufmtp.measure.core.options import VerifyOptions
from ggufmtp.measure.verify.run import verify
from ggufmtp.provenance.audit import audit
from ggufmtp.provenance.receipt import default_receipt_path, read_receipt, set_verification
from ggufmtp.synth.builtin import BUILTIN_MODELS
from ggufmtp.synth.spec import SynthSpec

CHEAP = VerifyOptions(seeds=(42,), limit=4, max_tokens=48, draft_n_max=3)


@pytest.fixture(scope="module")
def pair(synth_model, tmp_path_factory, llama_runtime):
    """``ggufmtp sidecar MODEL -r Q8_0 --trunk-only`` on the f20 model, and the full Q8_0 variant
    (``ggufmtp quantize``) it must agree with."""
    model = synth_model("tiny-qwen35moe-f20")
    d = tmp_path_factory.mktemp("sidecar")
    side, trunk, full = d / "mtp-tiny-Q8_0.gguf", d / "tiny-Q8_0.gguf", d / "full" / "tiny-Q8_0.gguf"
    full.parent.mkdir()
    r = CliRunner().invoke(main, ["sidecar", str(model), "-r", "Q8_0", "-o", str(side), "--trunk-only", str(trunk)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["quantize", str(model), "-r", "Q8_0", "-o", str(full)])
    assert r.exit_code == 0, r.output
    return side, trunk, full


def test_sidecar_is_the_full_variants_head_and_the_trunk_its_body(pair):
    side, trunk, full = pair
    s, t, f = GGUFModel(side), GGUFModel(trunk), GGUFModel(full)
    assert check_mtp(s).status == MTPStatus.SIDECAR and check_mtp(t).status == MTPStatus.ABSENT
    # the converter's layouts: the head with token_embd/output_norm/output; the trunk without blk.4
    assert sorted(s.tensors) == sorted(n for n in f.tensors if n.startswith("blk.4.") or not n.startswith("blk."))
    assert sorted(t.tensors) == sorted(n for n in f.tensors if not n.startswith("blk.4."))
    assert (s.block_count, s.nextn_predict_layers) == (5, 1)
    assert (t.block_count, t.nextn_predict_layers) == (4, 0)
    assert "qwen35moe.nextn_predict_layers" not in t.metadata
    # byte for byte the full variant's tensors (quantized by the same libllama path, copied as they are)
    for part in (s, t):
        for name, info in part.tensors.items():
            assert info.type == f.tensors[name].type, name
            assert np.array_equal(tensor_array(part, name), tensor_array(f, name)), name


def test_sidecar_and_trunk_receipts_audit_and_bind_the_pair(pair):
    side, trunk, full = pair
    for p in (side, trunk):
        report = audit(p)
        assert report.ok, [c.to_dict() for c in report.failures]
    sp = read_receipt(default_receipt_path(side)).predicate["pair"]
    tp = read_receipt(default_receipt_path(trunk)).predicate["pair"]
    assert sp["role"] == "sidecar" and tp["role"] == "trunk"
    assert sp["trunk"]["sha256"] == read_receipt(default_receipt_path(trunk)).artifact.sha256
    assert tp["sidecar"]["sha256"] == read_receipt(default_receipt_path(side)).artifact.sha256
    assert sp["source_sha256"] == tp["source_sha256"]
    # the trunk written with it, and another variant of the same source (its receipt names it), pair
    for t in (trunk, full):
        report = audit(t, sidecar=side)
        assert report.ok, [c.to_dict() for c in report.failures]


def test_pair_verifies_like_the_full_model(pair, tmp_path, synth_model):
    side, trunk, full = pair
    whole = verify(full, CHEAP, progress=False)
    split = verify(trunk, dataclasses.replace(CHEAP, sidecar=side), progress=False)
    assert whole.ok and split.ok, (whole.reasons, split.reasons)
    w, s = whole.to_dict(), split.to_dict()
    assert s["mtp"]["draft_n"] > 0
    assert (s["mtp"]["draft_n"], s["mtp"]["draft_n_accepted"]) == (w["mtp"]["draft_n"], w["mtp"]["draft_n_accepted"])
    assert 0.5 < s["mtp"]["acceptance"] < 0.95  # the designed head, not a trivial 100 %
    assert s["identical_output_fraction"] == 1.0
    mtp_args = s["mtp"]["server_args"]
    assert ["--spec-type", "draft-mtp"] == mtp_args[mtp_args.index("--spec-type"):][:2]
    assert mtp_args[mtp_args.index("--spec-draft-model") + 1].endswith(side.name)
    assert "--spec-draft-model" not in (s["vanilla"].get("server_args") or [])
    assert s["model"]["sidecar"]["name"] == side.name
    # the verification goes into the trunk's receipt, which still audits, with the pair
    receipt = tmp_path / "trunk.receipt.json"
    receipt.write_text(default_receipt_path(trunk).read_text())
    set_verification(receipt, split.to_receipt())
    report = audit(trunk, receipt, sidecar=side)
    assert report.ok, [c.to_dict() for c in report.failures]
    assert json.loads(receipt.read_text())["predicate"]["verification"]["model"]["sidecar"]["name"] == side.name
    alone = audit(trunk, receipt)
    assert alone.ok and any(c.name == "verified with a sidecar" and side.name in c.detail for c in alone.checks)
    # another sidecar of the same source pairs with the trunk, but the verification is not of it
    bf16 = tmp_path / "mtp-tiny-BF16.gguf"
    r = CliRunner().invoke(main, ["sidecar", str(synth_model("tiny-qwen35moe-f20")), "-o", str(bf16)])
    assert r.exit_code == 0, r.output
    report = audit(trunk, receipt, sidecar=bf16)
    assert [c.name for c in report.failures] == ["verification of this pair"], report.failures


def test_wrong_trunk_is_refused_with_one_error(pair, synth_model):
    side, _, _ = pair
    other = synth_model(dataclasses.replace(BUILTIN_MODELS["tiny-qwen35moe-f20"], seed=1))
    report = audit(other, sidecar=side)
    assert [c.name for c in report.failures] == [f"pairs with {side.name}"]
    assert "belongs to another model" in report.failures[0].detail and other.name in report.failures[0].detail
    with pytest.raises(VerifyError, match="belongs to another model"):
        verify(other, dataclasses.replace(CHEAP, sidecar=side), progress=False)
    r = CliRunner().invoke(main, ["verify", str(other), "--sidecar", str(side)])
    assert r.exit_code == 1 and r.output.count("error: --sidecar:") == 1 and "Traceback" not in r.output
    # a sidecar of another architecture's shape does not fit at all
    dense = synth_model(SynthSpec(arch="qwen35"))
    report = audit(dense, sidecar=side)
    assert [c.name for c in report.failures] == [f"pairs with {side.name}"]
    assert "does not fit" in report.failures[0].detail


@pytest.mark.parametrize(("model", "args", "message"), [
    ("tiny-qwen35moe-mtp-only", [], "already an MTP-only sidecar"),
    ("tiny-qwen35moe-nomtp", [], "MTP block is absent"),
    ("tiny-qwen35moe", ["--trunk-only", "mtp-trunk.gguf"], "name the trunk as a variant"),
])
def test_bad_input_is_one_error_and_writes_nothing(synth_model, tmp_path, model, args, message):
    out = tmp_path / "mtp-x-BF16.gguf"
    r = CliRunner().invoke(main, ["sidecar", str(synth_model(model)), "-o", str(out),
                                  *[str(tmp_path / a) if a.endswith(".gguf") else a for a in args]])
    assert r.exit_code == 1, r.output
    assert message in r.output and "Traceback" not in r.output
    assert list(tmp_path.iterdir()) == []


def test_default_name_is_the_sidecar_name(synth_model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["sidecar", "builtin:tiny-qwen35moe", "--json"])
    assert r.exit_code == 0, r.output
    assert Path(json.loads(r.output)["sidecar"]).name == "mtp-tiny-qwen35moe-BF16.gguf"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mtp-tiny-qwen35moe-BF16.gguf",
                                                          "mtp-tiny-qwen35moe-BF16.gguf.receipt.json"]


def test_sidecar_of_a_quantized_variant_carries_its_receipt(pair, tmp_path):
    """Cut from the full Q8_0 variant as it is (no -r): the same head bytes as the -r sidecar, the
    variant's recipe and source in its receipt, and it pairs with the -r trunk (same source)."""
    side, trunk, full = pair
    out = tmp_path / "mtp-cut-Q8_0.gguf"
    r = CliRunner().invoke(main, ["sidecar", str(full), "-o", str(out)])
    assert r.exit_code == 0, r.output
    a, b = GGUFModel(out), GGUFModel(side)
    assert a.type_table() == b.type_table()
    assert all(np.array_equal(tensor_array(a, n), tensor_array(b, n)) for n in a.tensors)
    got, variant = read_receipt(default_receipt_path(out)), read_receipt(default_receipt_path(full))
    assert got.predicate["recipe"] == variant.predicate["recipe"]
    assert got.predicate["pair"]["made_from"] == {"name": full.name, "sha256": variant.artifact.sha256}
    assert audit(out).ok
    report = audit(trunk, sidecar=out)
    assert report.ok, [c.to_dict() for c in report.failures]


def test_signed_pair_verifies_with_the_public_key(synth_model, tmp_path):
    from fakehub import write_keypair

    priv, pub = write_keypair(tmp_path, "signer")
    side, trunk = tmp_path / "mtp-t-BF16.gguf", tmp_path / "t-BF16.gguf"
    r = CliRunner().invoke(main, ["sidecar", str(synth_model("tiny-qwen35moe")), "-o", str(side),
                                  "--trunk-only", str(trunk), "--signing-key", str(priv)])
    assert r.exit_code == 0, r.output
    for p in (side, trunk):
        report = audit(p, public_key=pub)
        assert report.ok and report.trust is not None and report.trust.value == "verified", report.failures


def test_trunk_keeps_arrays_that_are_not_per_layer(synth_model, tmp_path):
    """3 trunk layers + the MTP block: block_count 4, as long as M-RoPE's dimension_sections, which
    is not per layer and stays whole; the pair serves and drafts."""
    model = synth_model(SynthSpec(layers=3))
    side, trunk = tmp_path / "mtp-three-BF16.gguf", tmp_path / "three-BF16.gguf"
    r = CliRunner().invoke(main, ["sidecar", str(model), "-o", str(side), "--trunk-only", str(trunk)])
    assert r.exit_code == 0, r.output
    full, t = GGUFModel(model), GGUFModel(trunk)
    key = "qwen35moe.rope.dimension_sections"
    assert full.block_count == len(full.metadata[key]) == 4
    assert t.metadata[key] == full.metadata[key] and t.block_count == 3
    res = verify(trunk, dataclasses.replace(CHEAP, sidecar=side, limit=1, max_tokens=16), progress=False)
    assert res.to_dict()["mtp"]["draft_n"] > 0


@pytest.mark.parametrize("arch", ["step35", "deepseek2", "qwen3next"])
def test_other_architectures_split_and_serve_as_a_pair(synth_model, tmp_path, arch):
    """A chain of three heads (step35: every MTP block goes into the sidecar), MLA (deepseek2) and
    Qwen3-Next: the pair serves and drafts with the head's designed acceptance (100 %). (Every
    architecture that drafts at the pinned commit was checked this way by hand: all 14 pair.)"""
    model = synth_model(f"tiny-{arch}")
    side, trunk = tmp_path / f"mtp-{arch}-BF16.gguf", tmp_path / f"{arch}-BF16.gguf"
    r = CliRunner().invoke(main, ["sidecar", str(model), "-o", str(side), "--trunk-only", str(trunk)])
    assert r.exit_code == 0, r.output
    assert check_mtp(GGUFModel(side)).blocks == check_mtp(GGUFModel(model)).blocks
    res = verify(trunk, dataclasses.replace(CHEAP, sidecar=side, limit=1, max_tokens=16), progress=False)
    assert res.to_dict()["mtp"]["acceptance"] == 1.0
