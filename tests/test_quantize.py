"""Recipes, plan pre-flight, in-process quantize, and byte parity with the llama-quantize binary."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggufmtp.cli import main
from ggufmtp.errors import PlanError, QuantizeError, RecipeError
from ggufmtp.gguf.model import GGUFModel, inspect_model
from ggufmtp.imatrix import check as imc
from ggufmtp.imatrix import format as imx
from ggufmtp.quant.plan import make_plan
from ggufmtp.quant.quantize import quantize
from ggufmtp.quant.recipe import Recipe, shipped_recipes
from ggufmtp.runtime import build as runtime
from ggufmtp.synth.spec import SynthSpec
from ggufmtp.synth.writer import synthesize


@pytest.fixture(scope="module")
def tiny(llama_runtime, tmp_path_factory):
    d = tmp_path_factory.mktemp("q")
    return {
        "moe": synthesize(d / "moe.gguf", SynthSpec(), progress=False).path,
        "dense": synthesize(d / "dense.gguf", SynthSpec(arch="qwen35"), progress=False).path,
        "nomtp": synthesize(d / "nomtp.gguf", SynthSpec(mtp=False), progress=False).path,
        "incomplete": synthesize(d / "inc.gguf", SynthSpec(omit_tensors=("nextn.hnorm",)), progress=False).path,
    }


@pytest.fixture(scope="module")
def imatrices(tiny, tmp_path_factory):
    """A llama-imatrix-like file (no MTP statistics) and one that covers the MTP block too."""
    d = tmp_path_factory.mktemp("imx")
    shapes = imc.read_model_tensors(tiny["moe"])
    partial = imc.synthetic_imatrix(shapes, seed=1)
    full = imc.synthetic_imatrix(shapes, seed=1, mtp_blocks=[])
    p1, p2 = d / "partial.gguf", d / "full.gguf"
    imx.write_imatrix(partial, p1)
    imx.write_imatrix(full, p2)
    return {"partial": p1, "full": p2}


def test_shipped_recipes_load_and_include_required():
    names = shipped_recipes()
    for required in ("hifi-q4_k_m-mtp", "q8_0-mtp", "q4_k_m-mtp-q8", "iq4_xs-mtp", "iq2_xxs-mtp"):
        assert required in names
    hifi = Recipe.load("hifi-q4_k_m-mtp")
    assert hifi.ftype == "Q4_K_M" and dict(hifi.mtp_roles) == {"eh_proj": "Q8_0"}
    assert Recipe.load("iq2_xxs-mtp").imatrix == "required"


@pytest.mark.parametrize("block", [4, 40, 64, 92])
def test_mtp_placeholder_serves_any_layer_count(block):
    rules = Recipe.load("q4_k_m-mtp-q8").resolved_rules(block)
    assert rules[0].pattern == rf"blk\.{block}\.nextn\.eh_proj\.weight"
    assert all(f"blk\\.{block}\\." in r.pattern for r in rules)


@pytest.mark.parametrize("doc,msg", [
    ({"name": "x", "ftype": "Q4_K_M", "rules": [{"pattern": "blk\\.(", "type": "Q8_0"}]}, "invalid regex"),
    ({"name": "x", "ftype": "Q4_K_M", "rules": [{"pattern": "a", "type": "Q9_9"}]}, "unknown tensor type"),
    ({"name": "x", "ftype": "Q4_K_Z"}, "unknown ftype"),
    ({"name": "x", "ftype": "Q4_K_M", "mtp": {"ehproj": "Q8_0"}}, "unknown role"),
    ({"ftype": "Q4_K_M"}, "missing required key 'name'"),
])
def test_bad_recipes_rejected(doc, msg):
    with pytest.raises(RecipeError, match=msg):
        Recipe.from_dict(doc)


def test_plan_json_reasons_and_mtp_summary(tiny):
    res = CliRunner().invoke(main, ["plan", str(tiny["moe"]), "--recipe", "hifi-q4_k_m-mtp", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    for key in ("tensors", "size_bytes", "bpw", "mtp_block", "errors", "warnings"):
        assert key in d
    t = {x["name"]: x for x in d["tensors"]}
    eh = t["blk.4.nextn.eh_proj.weight"]
    assert eh["to_type"] == "Q8_0" and eh["from_type"] == "BF16" and "mtp.eh_proj" in eh["reason"]
    assert t["blk.4.nextn.enorm.weight"]["to_type"] == "F32"
    assert t["blk.0.attn_norm.weight"]["reason"].startswith("not quantized")
    assert any(x["reason"] == "Q4_K_M default" for x in d["tensors"])
    assert d["mtp_block"] == 4 and d["mtp"]["eh_proj"] == "Q8_0"
    assert d["size_bytes"] == sum(x["bytes"] for x in d["tensors"])


def test_plan_errors_before_work(tiny, imatrices):
    p = make_plan(tiny["moe"], "iq2_xxs-mtp")
    assert any("requires an imatrix" in e for e in p.errors)
    assert any("needs an imatrix" in e for e in p.errors)
    # llama-imatrix never covers the MTP block: a recipe putting it on IQ2 must be refused up front
    bad = Recipe.from_dict({"name": "mtp-iq2", "ftype": "IQ2_XXS", "imatrix": "required"})
    p = make_plan(tiny["moe"], bad, imatrices["partial"])
    assert p.errors and "MTP block" in p.errors[-1] and "blk.4." in p.errors[-1]
    assert all(n.startswith("blk.4.") for n in p.imatrix_missing)
    # the shipped low-bit recipe keeps the MTP block off IQ types, so the partial imatrix suffices
    assert make_plan(tiny["moe"], "iq2_xxs-mtp", imatrices["partial"]).errors == []


def test_plan_refuses_overrides_with_unquantized_base(tiny):
    r = Recipe.from_dict({"name": "bf16", "ftype": "BF16", "mtp": {"eh_proj": "Q8_0"}})
    p = make_plan(tiny["moe"], r)
    assert any("ignores every override" in e for e in p.errors)


def test_plan_refuses_missing_or_incomplete_mtp(tiny):
    assert any("has none" in e for e in make_plan(tiny["nomtp"], "hifi-q4_k_m-mtp").errors)
    assert any("incomplete" in e for e in make_plan(tiny["incomplete"], "hifi-q4_k_m-mtp").errors)


def test_rule_matching_nothing_warns(tiny):
    r = Recipe.from_dict({"name": "w", "ftype": "Q4_K_M", "rules": [{"pattern": "no_such_tensor", "type": "Q8_0"}]})
    assert any("matches no tensor" in w for w in make_plan(tiny["moe"], r).warnings)


def test_plan_exit_code_on_errors(tiny):
    res = CliRunner().invoke(main, ["plan", str(tiny["nomtp"]), "--recipe", "hifi-q4_k_m-mtp"])
    assert res.exit_code == 1 and "error:" in res.output


def test_quantize_refuses_before_writing(tiny, tmp_path):
    out = tmp_path / "x.gguf"
    with pytest.raises(PlanError):
        quantize(tiny["moe"], "iq2_xxs-mtp", out, progress=False)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_quantize_failure_leaves_nothing(tiny, tmp_path, monkeypatch):
    import sys

    qmod = sys.modules["ggufmtp.quant.quantize"]

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(qmod, "audit_against_plan", boom)
    out = tmp_path / "y.gguf"
    with pytest.raises(KeyboardInterrupt):
        quantize(tiny["moe"], "q8_0-mtp", out, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_quantize_audit_mismatch_is_an_error(tiny, tmp_path):
    p = make_plan(tiny["moe"], "hifi-q4_k_m-mtp")
    p.tensors[0].to_type = "Q8_0" if p.tensors[0].to_type != "Q8_0" else "Q4_K"
    with pytest.raises(QuantizeError, match="audit after quantization failed"):
        quantize(tiny["moe"], "hifi-q4_k_m-mtp", tmp_path / "z.gguf", plan=p, progress=False)
    assert list(tmp_path.iterdir()) == []


def _cli_equivalent(plan, out, cwd):
    """llama-quantize with the emitted flags; the imatrix given by its name from its folder, as
    ggufmtp writes ``quantize.imatrix.file`` (a file name: no local path in a published GGUF)."""
    argv = plan.llama_quantize_argv(str(out), binary=str(runtime.find_binary("llama-quantize")))
    if plan.imatrix:
        argv[argv.index(str(plan.imatrix))] = Path(plan.imatrix).name
        cwd = Path(plan.imatrix).parent
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=cwd)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


@pytest.mark.parametrize("recipe", shipped_recipes())
@pytest.mark.parametrize("arch", ["moe", "dense"])
def test_parity_with_llama_quantize(recipe, arch, tiny, imatrices, tmp_path):
    """ggufmtp quantize == llama-quantize with the emitted flags, byte for byte (data, types, metadata)."""
    model = tiny[arch]
    im = None
    if Recipe.load(recipe).imatrix != "none":
        if arch == "moe":
            im = imatrices["full"]
        else:
            shapes = imc.read_model_tensors(model)
            im = tmp_path / "dense-imatrix.gguf"
            imx.write_imatrix(imc.synthetic_imatrix(shapes, seed=2, mtp_blocks=[]), im)
    ours = tmp_path / "ours.gguf"
    res = quantize(model, recipe, ours, imatrix=im, progress=False)
    assert all(c.ok for c in res.checks)
    theirs = tmp_path / "theirs.gguf"
    _cli_equivalent(res.plan, theirs, tmp_path)
    a, b = ours.read_bytes(), theirs.read_bytes()
    assert len(a) == len(b) and a == b, f"{recipe}: ggufmtp output differs from llama-quantize's"
    md = GGUFModel(ours).metadata
    if im is not None:
        assert md["quantize.imatrix.file"] == im.name  # the name only, never a local path
        assert md["quantize.imatrix.entries_count"] == len(imx.read_imatrix(im).entries)
    assert inspect_model(ours).mtp_status == "complete"


def test_hifi_keeps_eh_proj_at_q8(tiny, tmp_path):
    res = quantize(tiny["moe"], "hifi-q4_k_m-mtp", tmp_path / "h.gguf", progress=False)
    types = GGUFModel(res.output).type_table()
    assert types["blk.4.nextn.eh_proj.weight"] == "Q8_0"
    assert types["blk.0.ffn_gate_exps.weight"] == "Q4_K"


def test_emit_and_from_flags_round_trip(tiny, tmp_path):
    res = CliRunner().invoke(main, ["plan", str(tiny["moe"]), "--recipe", "q4_k_m-mtp-q8", "--emit", "llama-quantize"])
    assert res.exit_code == 0
    argv = shlex.split(res.output)
    assert argv[0] == "llama-quantize" and argv[-1] == "Q4_K_M"
    assert "--tensor-type" in argv
    res2 = CliRunner().invoke(main, ["recipe", "from-flags", "--mtp-block", "4", "--", *argv[1:]])
    assert res2.exit_code == 0, res2.output
    rt = tmp_path / "rt.toml"
    rt.write_text(res2.output)
    r = Recipe.load(rt)
    orig = Recipe.load("q4_k_m-mtp-q8")
    assert [(x.pattern, x.type) for x in r.resolved_rules(4)] == \
           [(x.llama_pattern, x.type) for x in orig.resolved_rules(4)]
    assert make_plan(tiny["moe"], r).type_table() == make_plan(tiny["moe"], orig).type_table()


def test_quantize_cli_json_and_receipt(tiny, tmp_path):
    out = tmp_path / "c.gguf"
    res = CliRunner().invoke(main, ["quantize", str(tiny["moe"]), "--recipe", "q8_0-mtp", "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["output"] == str(out) and d["mtp"]["status"] == "complete"
    assert all(c["ok"] for c in d["checks"])
    assert (tmp_path / "c.gguf.receipt.json").exists()
