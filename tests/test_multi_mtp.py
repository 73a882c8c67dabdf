"""Several MTP blocks (``nextn_predict_layers`` > 1, issue #21): ``inspect`` reports each block,
``{mtp}`` and the ``[mtp]`` roles cover every block (``{mtp0}``, ``{mtp1}`` one of them), the real
llama-quantize makes what the plan says, and receipts and audits list every block -- a resealed
receipt that drops one is caught. Single-block models keep every key and line they had.

The chain model is a synthetic qwen35moe with ``mtp_layers=2`` (blocks 4 and 5): llama.cpp
0c1e570's quantizer takes it (its MTP draft graph for qwen35moe asserts one block, so it is a
GGUF-level model, not one llama-server drafts with).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from click.testing import CliRunner
from gguf_copy import copy_gguf

from ggufmtp.cli import main
from ggufmtp.constants import MTP_ARCHITECTURES
from ggufmtp.errors import RecipeError
from ggufmtp.gguf.model import GGUFModel, MTPStatus, check_mtp, format_report, inspect_model
from ggufmtp.measure.core.records import ModelInfo
from ggufmtp.pipeline import RunResult, StageRecord, format_summary
from ggufmtp.provenance.audit import audit
from ggufmtp.provenance.card import card_text
from ggufmtp.provenance.receipt import load_receipt, receipt_for_quantize, schema_errors, seal
from ggufmtp.provenance.show import format_receipt
from ggufmtp.quant.flags import recipe_from_flags
from ggufmtp.quant.plan import make_plan
from ggufmtp.quant.quantize import audit_against_plan, quantize
from ggufmtp.quant.recipe import Recipe, Rule
from ggufmtp.runtime.build import find_binary
from ggufmtp.synth.spec import SynthSpec

CHAIN = SynthSpec(arch="qwen35moe", mtp_layers=2)


def recipe(rules: list[tuple[str, str]], **mtp: Any) -> Recipe:
    """A Q4_K_M recipe with these ``[mtp]`` roles and ``[[rules]]`` (MTP optional unless ``required``)."""
    return Recipe.from_dict({"name": "t", "ftype": "Q4_K_M", "imatrix": "none",
                             "mtp": {"required": False, **mtp},
                             "rules": [{"pattern": p, "type": t} for p, t in rules]})




def write_llama(path: Path, n_embd: int = 256, n_vocab: int = 512) -> Path:
    """A one-block F16 ``llama`` model (no tokenizer: the quantizer reads hyperparameters only)."""
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_context_length(256)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_embd)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    rng = np.random.default_rng(0)

    def tensor(name: str, *shape: int) -> None:  # numpy order: the reverse of GGUF's ne
        dtype = np.float16 if len(shape) > 1 else np.float32
        w.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(dtype))

    tensor("token_embd.weight", n_vocab, n_embd)
    tensor("output_norm.weight", n_embd)
    tensor("output.weight", n_vocab, n_embd)
    for n in ("attn_norm", "ffn_norm"):
        tensor(f"blk.0.{n}.weight", n_embd)
    for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
        tensor(f"blk.0.{n}.weight", n_embd, n_embd)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def chain(synth_model) -> Path:
    return synth_model(CHAIN)


@pytest.fixture(scope="module")
def made(chain, tmp_path_factory) -> dict[str, Any]:
    """The chain quantized with the shipped hifi recipe, with its receipt."""
    d = tmp_path_factory.mktemp("chain")
    res = quantize(chain, "hifi-q4_k_m-mtp", d / "art.gguf", progress=False)
    return {"res": res, "out": res.output, "receipt": receipt_for_quantize(res)}


def failed(report) -> dict[str, str]:
    return {c.name: c.detail for c in report.checks if not c.ok}


# ----------------------------------------------------------------------------- recipes (no model)


def test_mtp_placeholder_is_every_block_and_mtpN_one():
    r = Rule(r"blk\.{mtp}\.nextn\.eh_proj\.weight", "Q8_0")
    assert r.resolve(4).pattern == r"blk\.4\.nextn\.eh_proj\.weight"  # one block: as before
    assert r.resolve([4]).pattern == r.resolve(4).pattern
    chain = r.resolve([40, 41]).pattern
    assert chain == r"blk\.(40|41)\.nextn\.eh_proj\.weight"
    matches = [n for n in ("blk.40.nextn.eh_proj.weight", "blk.41.nextn.eh_proj.weight", "blk.4.nextn.eh_proj.weight",
                           "blk.401.nextn.eh_proj.weight") if re.search(chain, n)]
    assert matches == ["blk.40.nextn.eh_proj.weight", "blk.41.nextn.eh_proj.weight"]
    one = Rule(r"blk\.{mtp1}\.attn_", "Q6_K")
    assert one.resolve([40, 41]).pattern == r"blk\.41\.attn_"
    assert one.resolve([40]) is None and one.resolve(None) is None and r.resolve([]) is None
    assert Rule("ffn_down", "Q5_K").resolve(None).pattern == "ffn_down"


def test_rules_keep_their_order_and_count_on_a_chain():
    rec = recipe([(r"blk\.{mtp1}\.attn_", "Q6_K"), (r"blk\.{mtp3}\.", "Q8_0"), ("ffn_down_exps", "Q5_K")],
                 eh_proj="Q8_0", rest="Q6_K")
    got = [(r.source, r.pattern) for r in rec.resolved_rules([4, 5])]
    assert got == [("mtp.eh_proj", r"blk\.(4|5)\.nextn\.eh_proj\.weight"), ("mtp.rest", r"blk\.(4|5)\."),
                   ("rules", r"blk\.5\.attn_"), ("rules", "ffn_down_exps")]  # {mtp3}: dropped, rest in order
    assert [r.pattern for r in rec.rules_beyond([4, 5])] == [r"blk\.{mtp3}\."]
    assert rec.rules_beyond(None) == []  # no MTP at all: dropped like {mtp}, no warning
    assert [r.pattern for r in rec.resolved_rules(4)] == [r"blk\.4\.nextn\.eh_proj\.weight", r"blk\.4\.",
                                                          "ffn_down_exps"]


@pytest.mark.parametrize("bad", [r"blk\.{mtpx}\.", r"blk\.{mtp-1}\.", r"blk\.{mtp\."])
def test_a_malformed_placeholder_is_refused(bad):
    with pytest.raises(RecipeError, match=r"placeholders are \{mtp\}"):
        recipe([(bad, "Q8_0")])


def test_from_flags_turns_a_chain_back_into_placeholders():
    flags = ["--tensor-type", r"blk\.(4|5)\.nextn\.eh_proj\.weight=q8_0", "--tensor-type", r"blk\.5\.attn_=q6_k",
             "in.gguf", "out.gguf", "Q4_K_M"]
    rec = recipe_from_flags(flags, mtp_block=[4, 5])
    assert [r.pattern for r in rec.rules] == [r"blk\.{mtp}\.nextn\.eh_proj\.weight", r"blk\.{mtp1}\.attn_"]
    assert rec.mtp_required
    assert [r.pattern for r in rec.resolved_rules([4, 5])] == [r"blk\.(4|5)\.nextn\.eh_proj\.weight", r"blk\.5\.attn_"]
    single = recipe_from_flags(["--tensor-type", r"blk\.4\.attn_=q6_k", "Q4_K_M"], mtp_block=4)
    assert [r.pattern for r in single.rules] == [r"blk\.{mtp}\.attn_"]


def test_summaries_name_every_block_and_keep_single_block_lines():
    base = {"artifact": "a.gguf", "receipt": "a.receipt.json", "card": None, "size_bytes": 10, "bpw": 4.5,
            "mtp_status": "complete", "mtp_block": 40, "acceptance": None, "acceptance_ci95": None,
            "speedup": None, "speedup_ci95": None, "verdict": None, "stages": {}}
    assert "MTP         blk.40 complete" in format_summary(base)  # a summary from before chains
    assert "MTP         blk.40, blk.41 complete" in format_summary({**base, "mtp_blocks": [40, 41]})
    quantized = {"size_bytes": 10, "bpw": 4.5, "mtp": {"status": "complete", "block": 40, "blocks": [40, 41]}}
    run = RunResult(Path("o"), Path("a.gguf"), Path("a.receipt.json"), None, [StageRecord("quantize", "k", False, quantized)])
    assert run.summary()["mtp_block"] == 40 and run.summary()["mtp_blocks"] == [40, 41]
    del quantized["mtp"]["blocks"]  # a quantize stage cached before chains were reported
    assert run.summary()["mtp_blocks"] == [40]
    info = ModelInfo("m.gguf", 1, "step35", 40, "Q4_K", "0" * 64)
    assert "mtp_blocks" not in info.to_dict() and info.mtp_where == "blk.40"
    chained = ModelInfo("m.gguf", 1, "step35", 40, "Q4_K", "0" * 64, [40, 41])
    assert chained.to_dict()["mtp_blocks"] == [40, 41] and chained.mtp_where == "blk.40, blk.41"


# ----------------------------------------------------------------------------- the chain model


def test_inspect_reports_every_block(chain):
    r = inspect_model(chain)
    assert (r.block_count, r.trunk_layers, r.nextn_predict_layers) == (6, 4, 2)
    assert r.mtp_block == 4 and r.mtp_blocks == [4, 5] and r.mtp_status == MTPStatus.COMPLETE
    for b in (4, 5):
        assert r.mtp_tensors[f"blk.{b}.nextn.eh_proj.weight"] == "BF16"
        assert r.mtp_fallbacks[f"blk.{b}.nextn.shared_head_head.weight"] == "output.weight"
    assert list(r.mtp_tensors) == sorted(r.mtp_tensors, key=lambda n: (int(n.split(".")[1]), n))
    text = format_report(r)
    assert "MTP status    COMPLETE  (2 blocks: blk.4, blk.5)" in text
    assert "  blk.4 (MTP block 1 of 2)" in text and "  blk.5 (MTP block 2 of 2)" in text
    res = CliRunner().invoke(main, ["inspect", str(chain), "--json"])
    d = json.loads(res.output)
    assert res.exit_code == 0 and d["mtp_block"] == 4 and d["mtp_blocks"] == [4, 5]


def test_a_single_block_model_reads_as_before(synth_model):
    r = inspect_model(synth_model("tiny-qwen35moe"))
    assert r.mtp_block == 4 and r.mtp_blocks == [4]
    text = format_report(r)
    assert "MTP status    COMPLETE  (block blk.4)" in text and "MTP block 1 of" not in text


def test_every_block_is_checked_for_completeness(chain, tmp_path):
    broken = copy_gguf(chain, tmp_path / "broken.gguf", drop={"blk.5.nextn.hnorm.weight", "blk.5.attn_output.weight"})[0]
    mtp = check_mtp(GGUFModel(broken))
    assert mtp.status == MTPStatus.INCOMPLETE and mtp.blocks == [4, 5]
    assert mtp.missing == ["blk.5.nextn.hnorm.weight", "blk.5.attn_output.weight"]
    assert "blk.4.nextn.hnorm.weight" in mtp.tensors and "blk.5.nextn.eh_proj.weight" in mtp.tensors
    p = make_plan(broken, "hifi-q4_k_m-mtp")
    assert p.errors == [f"{broken}: MTP blocks blk.4, blk.5 are incomplete "
                        f"(missing blk.5.nextn.hnorm.weight, blk.5.attn_output.weight)"]


def test_plan_applies_mtp_roles_to_every_block(chain):
    p = make_plan(chain, "hifi-q4_k_m-mtp")
    assert p.ok and p.mtp_block == 4 and p.mtp_blocks == [4, 5]
    types = p.type_table()
    assert types["blk.4.nextn.eh_proj.weight"] == types["blk.5.nextn.eh_proj.weight"] == "Q8_0"
    flagged = {t.name for t in p.tensors if t.mtp}
    assert flagged == {n for n in GGUFModel(chain).tensors if n.startswith(("blk.4.", "blk.5."))}
    d = p.to_dict()
    assert d["mtp_block"] == 4 and d["mtp_blocks"] == [4, 5]
    assert d["mtp"]["block"] == 4 and d["mtp"]["blocks"] == [4, 5] and d["mtp"]["tensors"] == len(flagged)
    assert [r["pattern"] for r in d["rules"]] == [r"blk\.(4|5)\.nextn\.eh_proj\.weight"]
    assert r"--tensor-type 'blk\.(4|5)\.nextn\.eh_proj\.weight=q8_0'" in p.llama_quantize_command()
    res = CliRunner().invoke(main, ["plan", str(chain), "-r", "hifi-q4_k_m-mtp"])
    assert res.exit_code == 0 and "MTP    blk.4, blk.5 (complete): 40 tensors" in res.output


def test_indexed_placeholders_pick_one_block_and_warn_past_the_chain(chain, synth_model):
    rec = recipe([(r"blk\.{mtp1}\.attn_(q|k|v|output)\.weight", "Q8_0"), (r"blk\.{mtp2}\.", "Q2_K")])
    p = make_plan(chain, rec)
    types = p.type_table()
    assert types["blk.5.attn_q.weight"] == "Q8_0" and types["blk.4.attn_q.weight"] == "Q4_K"
    assert [r.pattern for r in p.rules] == [r"blk\.5\.attn_(q|k|v|output)\.weight"]
    assert p.ok and [w for w in p.warnings if "{mtp2}" in w] == [
        r"rule rules 'blk\.{mtp2}\.' -> Q2_K needs 3 MTP blocks ({mtp2}); the model has 2 (blk.4, blk.5): left out"]
    single = make_plan(synth_model("tiny-qwen35moe"), rec)
    assert single.rules == [] and sum("MTP blocks ({mtp" in w for w in single.warnings) == 2


def test_the_emitted_llama_quantize_command_makes_the_planned_file(chain, tmp_path, llama_runtime):
    """``plan --emit llama-quantize`` on a chain: the real binary, run with that exact command,
    gives every tensor the planned type."""
    rec = recipe([(r"blk\.{mtp1}\.ffn_down_exps\.weight", "Q8_0")], eh_proj="Q8_0", attention="Q6_K")
    p = make_plan(chain, rec)
    out = tmp_path / "cli.gguf"
    argv = p.llama_quantize_argv(str(out), binary=str(find_binary("llama-quantize")), threads=2)
    run = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert GGUFModel(out).type_table() == p.type_table()
    assert p.type_table()["blk.5.ffn_down_exps.weight"] == "Q8_0" != p.type_table()["blk.4.ffn_down_exps.weight"]
    assert p.type_table()["blk.4.attn_q.weight"] == p.type_table()["blk.5.attn_q.weight"] == "Q6_K"


def test_quantize_receipt_audit_and_card_list_every_block(made):
    res, out = made["res"], made["out"]
    assert all(c.ok for c in res.checks) and "MTP blk.4, blk.5 complete, eh_proj Q8_0" in res.summary()
    assert res.to_dict()["mtp"]["blocks"] == [4, 5]
    st = load_receipt(made["receipt"])
    result = st["predicate"]["result"]
    assert result["mtp_block"] == 4 and result["mtp_blocks"] == [4, 5] and result["nextn_predict_layers"] == 2
    assert schema_errors(st) == []
    assert "MTP       blk.4, blk.5 complete, nextn_predict_layers 2" in format_receipt(st)
    assert "heads `blk.4`, `blk.5` are kept" in card_text(st)[1]
    r = audit(out, made["receipt"])
    assert r.ok, failed(r)
    assert next(c for c in r.checks if c.name == "MTP block").detail == \
        "file blk.4, blk.5 complete; receipt blk.4, blk.5 complete"


def test_a_resealed_receipt_that_drops_a_block_is_caught(made, tmp_path):
    out = tmp_path / made["out"].name
    shutil.copy(made["out"], out)
    st = load_receipt(made["receipt"])
    st["predicate"]["result"]["mtp_blocks"] = [4]
    forged = tmp_path / "forged.receipt.json"
    forged.write_text(json.dumps(seal(st)))
    f = failed(audit(out, forged))
    assert list(f) == ["MTP block"] and f["MTP block"] == "file blk.4, blk.5 complete; receipt blk.4 complete"


def test_an_older_receipt_without_the_list_is_checked_on_its_first_block(made, tmp_path):
    out = tmp_path / made["out"].name
    shutil.copy(made["out"], out)
    st = load_receipt(made["receipt"])
    del st["predicate"]["result"]["mtp_blocks"]
    older = tmp_path / "older.receipt.json"
    older.write_text(json.dumps(seal(st)))
    assert schema_errors(st) == []
    r = audit(out, older)
    assert r.ok, failed(r)
    assert "MTP       blk.4 complete" in format_receipt(st) and "head `blk.4` is kept" in card_text(st)[1]
    st["predicate"]["result"]["mtp_block"] = 5
    older.write_text(json.dumps(seal(st)))
    assert failed(audit(out, older))["MTP block"] == "file blk.4 complete; receipt blk.5 complete"


def test_the_post_quantize_audit_catches_a_lost_block(made, synth_model, tmp_path):
    """An output with one block where the source had two fails the MTP and nextn checks."""
    one = quantize(synth_model("tiny-qwen35moe"), "hifi-q4_k_m-mtp", tmp_path / "one.gguf", progress=False).output
    checks = {c.name: c for c in audit_against_plan(one, made["res"].plan, GGUFModel(made["res"].plan.model))}
    assert not checks["MTP block present and complete"].ok
    assert "blocks: source blk.4, blk.5, output blk.4" in checks["MTP block present and complete"].detail
    assert not checks["nextn_predict_layers unchanged"].ok


def test_a_single_block_receipt_keeps_its_keys_and_gains_the_list(synth_model, tmp_path):
    res = quantize(synth_model("tiny-qwen35moe"), "hifi-q4_k_m-mtp", tmp_path / "one.gguf", progress=False)
    st = load_receipt(receipt_for_quantize(res))
    assert st["predicate"]["result"]["mtp_block"] == 4 and st["predicate"]["result"]["mtp_blocks"] == [4]
    assert "MTP       blk.4 complete" in format_receipt(st) and "head `blk.4` is kept" in card_text(st)[1]
    assert "MTP blk.4 complete" in res.summary()
    d = res.plan.to_dict()
    assert d["mtp_block"] == 4 and d["mtp"]["block"] == 4 and d["rules"][0]["pattern"] == r"blk\.4\.nextn\.eh_proj\.weight"
    r = audit(res.output)
    assert r.ok and next(c for c in r.checks if c.name == "MTP block").detail == \
        "file blk.4 complete; receipt blk.4 complete"


def test_llama_server_drafts_with_one_qwen35moe_block_only(chain, llama_server_bin):
    """Upstream at 0c1e570, pinned: the qwen35moe MTP draft graph asserts ``n_layer_nextn == 1``
    (src/models/qwen35moe.cpp), so a qwen35moe chain is quantized and audited but not drafted with."""
    run = subprocess.run([str(llama_server_bin), "-m", str(chain), "--spec-type", "draft-mtp", "-c", "256",
                          "--port", "0"], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "QWEN35MOE MTP currently only supports a single MTP block" in run.stdout + run.stderr


# ----------------------------------------------------------------------------- no MTP graph


def test_an_architecture_without_an_mtp_graph_is_one_clear_error(tmp_path, llama_runtime):
    model = write_llama(tmp_path / "llama.gguf")
    p = make_plan(model, "hifi-q4_k_m-mtp")
    assert len(p.errors) == 1
    err = p.errors[0]
    assert "architecture llama has no MTP draft graph in llama.cpp 0c1e570" in err
    assert f"(MTP architectures: {', '.join(sorted(MTP_ARCHITECTURES))})" in err and "required = false" in err
    res = CliRunner().invoke(main, ["quantize", str(model), "-r", "hifi-q4_k_m-mtp", "-o", str(tmp_path / "o.gguf")])
    assert res.exit_code != 0 and "architecture llama has no MTP draft graph" in res.output
    assert not (tmp_path / "o.gguf").exists()
    optional = make_plan(model, recipe([(r"blk\.{mtp}\.", "Q8_0")], eh_proj="Q8_0"))
    assert optional.ok and optional.rules == [] and optional.mtp_blocks == []


# ----------------------------------------------------------------------------- step35's chain


def test_a_step35_chain_is_planned_quantized_and_audited_block_by_block(synth_model, tmp_path):
    model = synth_model(SynthSpec(arch="step35", layers=4, mtp_layers=3))
    assert inspect_model(model).mtp_blocks == [4, 5, 6]
    res = quantize(model, "hifi-q4_k_m-mtp", tmp_path / "s35.gguf", progress=False)
    assert [res.plan.type_table()[f"blk.{b}.nextn.eh_proj.weight"] for b in (4, 5, 6)] == ["Q8_0"] * 3
    rc = receipt_for_quantize(res)
    assert load_receipt(rc)["predicate"]["result"]["mtp_blocks"] == [4, 5, 6]
    r = audit(res.output, rc)
    assert r.ok, failed(r)
