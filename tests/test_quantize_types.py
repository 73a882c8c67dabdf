"""Any llama-quantize type is a recipe, and llama-quantize's command lines work with ``ggufmtp quantize``.

A line run through ``ggufmtp quantize`` gives the pinned llama-quantize binary's bytes on the same
input (plus the audit and receipt); ``-r TYPE`` is that type with ggufmtp's head defaults; the
flags are recipe overrides, so the plan's emitted llama-quantize line stays byte-equivalent.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

import ggufmtp
from ggufmtp.cli import main
from ggufmtp.errors import PlanError, RecipeError
from ggufmtp.gguf.model import GGUFModel, check_mtp
from ggufmtp.imatrix import check as imc
from ggufmtp.imatrix import format as imx
from ggufmtp.quant.flags import LlamaQuantizeLine, Positional, recipe_from_flags
from ggufmtp.quant.plan import make_plan
from ggufmtp.quant.qtypes import QUANT_OPTIONS, bits_per_weight, valid_quant_types
from ggufmtp.quant.quantize import quantize
from ggufmtp.quant.recipe import Recipe
from ggufmtp.runtime import build as runtime


@pytest.fixture(scope="module")
def model(synth_model) -> Path:
    return synth_model("tiny-qwen35moe")


def _llama_quantize(argv: list[str], cwd: Path) -> None:
    proc = subprocess.run([str(runtime.find_binary("llama-quantize")), *argv], capture_output=True, text=True,
                          cwd=cwd)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def _ggufmtp(argv: list[str]) -> dict:
    res = CliRunner().invoke(main, ["quantize", "--no-progress", "--json", *argv])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def _fails(argv: list[str]) -> str:
    res = CliRunner().invoke(main, argv)
    assert res.exit_code == 1, res.output
    assert res.output.startswith("error: ") and "Traceback" not in res.output, res.output
    return res.output


def _mtp_types(path: Path) -> dict[str, str]:
    gm = GGUFModel(path)
    prefix = tuple(f"blk.{b}." for b in check_mtp(gm).blocks)
    return {n: t for n, t in gm.type_table().items() if n.startswith(prefix)}


# ----------------------------------------------------------------------------- the type table


@pytest.mark.usefixtures("llama_runtime")
def test_quant_options_are_the_pinned_llama_quantize_table():
    src = (runtime.source_tree() / "tools" / "quantize" / "quantize.cpp").read_text()
    table = src[src.index("QUANT_OPTIONS = {"):]
    table = table[:table.index("};")]
    pinned = {m[0]: m[1].removeprefix("MOSTLY_").removeprefix("ALL_")
              for m in re.findall(r'\{\s*"(\w+)",\s*LLAMA_FTYPE_(\w+)', table)}
    ours = {name: ("F32" if name == "COPY" else ftype) for name, ftype in QUANT_OPTIONS.items()}
    assert ours == pinned and list(ours) == list(pinned)


def test_every_type_is_a_recipe_case_insensitive():
    for name in valid_quant_types():
        r = Recipe.load(name.lower())
        assert r.ftype == QUANT_OPTIONS[name] and r.mtp_required
    assert Recipe.load("q4_k").ftype == "Q4_K_M" and Recipe.load("15").ftype == "Q4_K_M"  # alias, number
    head = Recipe.load("Q4_K_M")
    assert head.name == "Q4_K_M" and dict(head.mtp_roles) == {"eh_proj": "Q8_0"} and head.mtp_floor == "Q4_K"
    assert head.verify == Recipe.for_type("Q8_0").verify  # the [verify] defaults
    assert Recipe.load("IQ2_XXS").imatrix == "required" and Recipe.load("Q8_0").imatrix == "none"
    plain = Recipe.load("q4_k_m-plain")
    assert plain.name == "Q4_K_M-plain" and not plain.mtp_required and not plain.all_rules() and not plain.mtp_floor
    assert Recipe.load("BF16").all_rules() == []  # an unquantized ftype ignores every override
    assert Recipe.from_dict({"name": "x", "ftype": "q5_k"}).ftype == "Q5_K_M"


def test_bad_type_names_are_one_clear_error_listing_the_valid_ones(model, tmp_path):
    out = _fails(["quantize", str(model), "-r", "Q4_K_X", "-o", str(tmp_path / "o.gguf")])
    assert "Q4_K_X" in out and "Q4_K_M, Q5_K" in out and "IQ2_XXS" in out and "hifi-q4_k_m-mtp" in out
    out = _fails(["quantize", str(model), str(tmp_path / "o.gguf"), "Q9_Z"])
    assert "'Q9_Z': not a llama-quantize type" in out and "Q4_K_M" in out
    assert "COPY only copies" in _fails(["quantize", str(model), str(tmp_path / "o.gguf"), "copy"])
    assert "type is given twice" in _fails(["quantize", str(model), str(tmp_path / "o.gguf"), "Q8_0", "-r", "Q8_0"])
    assert "malformed" in _fails(["quantize", str(model), str(tmp_path / "o.gguf"), "Q8_0", "--tensor-type", "x"])
    assert list(tmp_path.iterdir()) == []


def test_positional_arguments_as_llama_quantize_reads_them():
    assert Positional.parse(["in.gguf", "out.gguf", "q4_k_m", "8"]) == Positional("in.gguf", "out.gguf", "Q4_K_M", 8)
    assert Positional.parse(["in.gguf", "Q8_0"]) == Positional("in.gguf", None, "Q8_0", None)
    assert Positional.parse(["in.gguf", "out.gguf"]) == Positional("in.gguf", "out.gguf", None, None)
    with pytest.raises(RecipeError, match="not a thread count"):
        Positional.parse(["in.gguf", "out.gguf", "Q8_0", "many"])
    line = LlamaQuantizeLine.parse("llama-quantize --pure --imatrix i.dat --tensor-type A=q8_0 in out Q4_K 2")
    assert line.flags.pure and line.imatrix == "i.dat" and line.positional == ("in", "out", "Q4_K", "2")
    assert [(r.pattern, r.type, r.source) for r in line.flags.tensor_types] == [("a", "Q8_0", "flags")]


def test_new_recipe_keys_round_trip_through_toml(tmp_path):
    r = recipe_from_flags("--pure --leave-output-tensor --allow-requantize --tensor-type x=q6_k in out Q4_K_M")
    r = r.with_flags(LlamaQuantizeLine.parse("--tensor-type y=q8_0").flags)
    p = tmp_path / "r.toml"
    p.write_text(r.to_toml())
    back = Recipe.load(p)
    assert (back.pure, back.leave_output_tensor, back.allow_requantize) == (True, True, True)
    assert [(x.pattern, x.source) for x in back.all_rules()] == [("y", "flags"), ("x", "rules")]
    head = tmp_path / "h.toml"
    head.write_text(Recipe.for_type("IQ3_M").to_toml())
    assert Recipe.load(head).mtp_floor == "Q4_K" and Recipe.load(head).all_rules() == Recipe.load("IQ3_M").all_rules()


# ----------------------------------------------------------------------------- llama-quantize's bytes

LINES = [
    "IN OUT Q4_K_M",
    r"--tensor-type attn_v=q6_k --tensor-type blk\.4\.=q8_0 --output-tensor-type q5_k --token-embedding-type q4_k "
    "IN OUT q4_k 2",
    "--pure --leave-output-tensor IN OUT Q5_K_S",
    "IN OUT MXFP4_MOE",
]


@pytest.mark.parametrize("line", LINES)
def test_a_llama_quantize_line_gives_llama_quantize_bytes(line, model, tmp_path):
    def argv(out: str) -> list[str]:
        return [{"IN": str(model), "OUT": out}.get(a, a) for a in shlex.split(line)]

    ours = _ggufmtp(argv(str(tmp_path / "ours.gguf")))
    _llama_quantize(argv(str(tmp_path / "theirs.gguf")), tmp_path)
    assert (tmp_path / "ours.gguf").read_bytes() == (tmp_path / "theirs.gguf").read_bytes(), line
    assert all(c["ok"] for c in ours["checks"]) and ggufmtp.audit(tmp_path / "ours.gguf", ours["receipt"]).ok
    receipt = json.loads(Path(ours["receipt"]).read_text())
    recorded = shlex.split(receipt["predicate"]["recipe"]["llama_quantize_command"])
    assert sorted(a for a in shlex.split(line) if a.startswith("--")) == sorted(a for a in recorded if a.startswith("--"))


def test_a_line_with_an_imatrix_gives_llama_quantize_bytes(model, tmp_path, monkeypatch):
    """An IQ type with ``--imatrix`` (named from its folder, as a receipt names it): the same bytes,
    ``quantize.imatrix.*`` metadata included."""
    imx.write_imatrix(imc.synthetic_imatrix(imc.read_model_tensors(model), seed=3, mtp_blocks=[]), tmp_path / "im.gguf")
    monkeypatch.chdir(tmp_path)
    _ggufmtp(["--imatrix", "im.gguf", str(model), "ours.gguf", "IQ2_XXS"])
    _llama_quantize(["--imatrix", "im.gguf", str(model), "theirs.gguf", "IQ2_XXS"], tmp_path)
    assert (tmp_path / "ours.gguf").read_bytes() == (tmp_path / "theirs.gguf").read_bytes()
    assert GGUFModel(tmp_path / "ours.gguf").type_table()["blk.4.nextn.eh_proj.weight"] == "IQ2_XXS"  # no head defaults


def test_a_recipe_with_flags_and_its_emitted_line_give_the_same_bytes(model, tmp_path):
    """-r TYPE (head defaults, floor rules included) composed with flags; the plan's emitted
    llama-quantize line, run by the binary, makes the very same file."""
    extra = ["--tensor-type", "ffn_down_shexp=q5_k", "--output-tensor-type", "q6_k"]
    res = CliRunner().invoke(main, ["plan", str(model), "-r", "MXFP4_MOE", *extra, "--emit", "llama-quantize",
                                    "--out", str(tmp_path / "theirs.gguf")])
    assert res.exit_code == 0, res.output
    emitted = shlex.split(res.output)
    assert any(a.startswith("^blk") for a in emitted)  # the floor's exact-name rules
    _ggufmtp([str(model), "-r", "MXFP4_MOE", *extra, "-o", str(tmp_path / "ours.gguf")])
    _llama_quantize(emitted[1:], tmp_path)
    assert (tmp_path / "ours.gguf").read_bytes() == (tmp_path / "theirs.gguf").read_bytes()
    types = GGUFModel(tmp_path / "ours.gguf").type_table()
    assert types["blk.4.ffn_down_shexp.weight"] == "Q5_K" and types["output.weight"] == "Q6_K"  # the flags won


# ----------------------------------------------------------------------------- ggufmtp's head defaults


def test_r_type_keeps_the_mtp_block_at_the_head_defaults(model, tmp_path):
    _ggufmtp([str(model), "-r", "Q4_K_M", "-o", str(tmp_path / "q4.gguf")])
    head = _mtp_types(tmp_path / "q4.gguf")
    assert head["blk.4.nextn.eh_proj.weight"] == "Q8_0"
    assert all(bits_per_weight(t) >= bits_per_weight("Q4_K") for t in head.values())
    # MXFP4_MOE: routed experts MXFP4 (4.25 bpw) in the trunk, raised to Q4_K in the head; the mix's
    # Q8_0 attention in the head is above the floor and stays
    plan = make_plan(model, "MXFP4_MOE")
    types = plan.type_table()
    assert types["blk.0.ffn_up_exps.weight"] == "MXFP4" and types["blk.4.ffn_up_exps.weight"] == "Q4_K"
    assert types["blk.4.attn_q.weight"] == "Q8_0" and types["blk.4.nextn.eh_proj.weight"] == "Q8_0"
    assert {r.source for r in plan.rules} == {"mtp.eh_proj", "mtp.floor"}


def test_flags_override_the_recipe_rules(model):
    rec = Recipe.load("hifi-q4_k_m-mtp").with_flags(LlamaQuantizeLine.parse(r"--tensor-type nextn\.eh_proj=q6_k").flags)
    assert make_plan(model, rec).type_table()["blk.4.nextn.eh_proj.weight"] == "Q6_K"
    assert make_plan(model, "hifi-q4_k_m-mtp").type_table()["blk.4.nextn.eh_proj.weight"] == "Q8_0"


def test_imatrix_type_without_imatrix_is_the_recipe_error(model, tmp_path):
    errors = {recipe: [m.replace(recipe, "R") for m in make_plan(model, recipe).errors]
              for recipe in ("IQ2_XXS", "iq2_xxs-mtp")}
    assert errors["IQ2_XXS"] == errors["iq2_xxs-mtp"] and errors["IQ2_XXS"][0] == "recipe R requires an imatrix (--imatrix FILE)"
    with pytest.raises(PlanError, match="requires an imatrix"):
        quantize(model, "IQ2_XXS", tmp_path / "o.gguf", progress=False)
    # with llama-imatrix's kind of imatrix (no statistics for the MTP block), the head defaults make it work
    im = tmp_path / "trunk.gguf"
    imx.write_imatrix(imc.synthetic_imatrix(imc.read_model_tensors(model), seed=1), im)
    plan = make_plan(model, "IQ2_XXS", im)
    assert plan.ok, plan.errors
    assert plan.type_table()["blk.0.ffn_up_exps.weight"] == "IQ2_XXS"
    assert all(bits_per_weight(t.to_type) >= bits_per_weight("Q4_K") for t in plan.tensors if t.mtp)


def test_requantizing_needs_allow_requantize(model, tmp_path):
    q8 = tmp_path / "q8.gguf"
    _ggufmtp([str(model), str(q8), "Q8_0", "--no-receipt"])
    out = _fails(["quantize", str(q8), str(tmp_path / "o.gguf"), "Q4_K_M"])
    assert "--allow-requantize" in out and not (tmp_path / "o.gguf").exists()
    _ggufmtp(["--allow-requantize", str(q8), str(tmp_path / "ours.gguf"), "Q4_K_M", "--no-receipt"])
    _llama_quantize(["--allow-requantize", str(q8), str(tmp_path / "theirs.gguf"), "Q4_K_M"], tmp_path)
    assert (tmp_path / "ours.gguf").read_bytes() == (tmp_path / "theirs.gguf").read_bytes()


# ----------------------------------------------------------------------------- recipe from-flags


def test_from_flags_finds_the_mtp_block_in_the_lines_model(model, tmp_path):
    line = ["--tensor-type", r"blk\.4\.nextn\.eh_proj=q8_0", str(model), "out.gguf", "Q4_K_M"]
    res = CliRunner().invoke(main, ["recipe", "from-flags", "--", *line])
    assert res.exit_code == 0, res.output
    assert r"pattern = 'blk\.{mtp}\.nextn\.eh_proj'" in res.output and "required = true" in res.output
    res = CliRunner().invoke(main, ["recipe", "from-flags", "--", *line[:2], str(tmp_path / "absent.gguf"), "o", "Q8_0"])
    assert res.exit_code == 0 and "required = false" in res.output and r"blk\.4\." in res.output


@pytest.mark.parametrize("name", ["token_embd", "output"])
def test_token_embd_or_output_at_iq2_without_statistics_is_refused_as_llama_cpp_aborts_on_it(model, tmp_path, name):
    """llama-quant's name exemption (``tensor_requires_imatrix``) spares token_embd and output its
    "Missing importance matrix" error, but ``ggml_quantize_chunk`` asserts statistics for IQ2_XXS,
    IQ2_XS and IQ1_S whatever the tensor: the pinned llama-quantize aborts (found on the gpu-small
    search, 2026-11-29, where token_embd at IQ2_XXS killed every Dask worker). The plan refuses it
    first, naming the tensor; IQ3_XXS, which llama.cpp quantizes without statistics there, stays allowed."""
    im = tmp_path / "im.gguf"  # llama-imatrix's kind: no token_embd, no output (no --process-output)
    imx.write_imatrix(imc.synthetic_imatrix(imc.read_model_tensors(model), seed=1, mtp_blocks=[]), im)
    line = ["--imatrix", str(im), "--tensor-type", f"^{name}\\.weight$=iq2_xxs", str(model), str(tmp_path / "t.gguf"), "Q8_0"]
    proc = subprocess.run([str(runtime.find_binary("llama-quantize")), *line], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode != 0 and "GGML_ASSERT(imatrix != NULL)" in proc.stdout + proc.stderr, proc.returncode
    assert not imc.needs_imatrix("IQ3_XXS", "Q8_0", f"{name}.weight")
    assert imc.needs_imatrix("IQ2_XXS", "Q8_0", f"{name}.weight")
    rec = Recipe.load("Q8_0").with_flags(LlamaQuantizeLine.parse(f"--tensor-type ^{name}\\.weight$=iq2_xxs").flags)
    plan = make_plan(model, rec, im)
    assert not plan.ok and f"{name}.weight" in plan.errors[0] and "has no statistics" in plan.errors[0], plan.errors
    out = _fails(["quantize", *line[:4], str(model), "-o", str(tmp_path / "o.gguf"), "-r", "Q8_0"])
    assert f"{name}.weight" in out and not (tmp_path / "o.gguf").exists()


def test_a_q8_0_ftype_whose_rules_go_lower_warns_without_its_recommended_imatrix(model):
    """A searched recipe is a Q8_0 ftype with lower rules; "recommended" is judged by the planned
    types, not the ftype (before, a Q8_0 ftype never warned)."""
    rec = dataclasses.replace(Recipe.load("Q8_0"), imatrix="recommended")
    assert not any("recommends an imatrix" in w for w in make_plan(model, rec).warnings)
    lower = rec.with_flags(LlamaQuantizeLine.parse(r"--tensor-type ffn_up_exps=iq4_xs").flags)
    assert any("recommends an imatrix" in w for w in make_plan(model, lower).warnings)
