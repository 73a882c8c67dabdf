"""No input reachable from the CLI makes ggufmtp abort (#51): every ggml type through every type flag
gets a clear refusal or the pinned llama-quantize's bytes; patterns and TOML files that would hang or
overflow the stack are refused.

The models: the tiny qwen35moe (rows of 256 and 512 values, its experts 3-D) and the same file with
every row of 256 or more cut to half (:func:`gguf_copy.halve_rows`: 128-wide rows, where the 256-value
blocks of the k-quants and most IQ types do not fit). No builtin model has 128-wide token_embd or
output rows (``tiny-glm5-next``'s only 128-wide tensors are its ``ssm_*_b``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import gguf
import pytest
from click.testing import CliRunner
from gguf_copy import halve_rows

from ggufmtp.cli import main
from ggufmtp.errors import LadderError, RecipeError
from ggufmtp.imatrix import check as imc
from ggufmtp.imatrix import format as imx
from ggufmtp.ladder.spec import load_ladder_file
from ggufmtp.quant.ggml_types import ggml_types
from ggufmtp.quant.recipe import Recipe
from ggufmtp.runtime import build as runtime

TYPES = [t.name for t in gguf.GGMLQuantizationType]  # every type name gguf-py knows
TENSOR_TYPE_PATTERN = r"attn_gate|nextn\.eh_proj"  # 2-D rows of n_embd and of 2 * n_embd
RECIPE_PATTERN = r"ffn_down_exps|nextn\.eh_proj"  # the 3-D experts (n_ff wide) and 2 * n_embd
FLAGS = ("--tensor-type", "--output-tensor-type", "--token-embedding-type", "recipe")


@dataclasses.dataclass(frozen=True)
class Case:
    """One type through one flag: ggufmtp's command line and llama-quantize's with the same options."""

    id: str
    ours: list[str]
    theirs: list[str]
    out: str


def _case(flag: str, qtype: str, model: Path, imatrix: str | None, folder: Path) -> Case:
    cid = f"{flag.strip('-')}={qtype}"
    im = ["--imatrix", imatrix] if imatrix else []
    out = f"{cid}.gguf"
    if flag == "recipe":
        recipe = folder / f"{cid}.toml"
        recipe.write_text(f'name = "sweep"\nftype = "Q8_0"\n[mtp]\nrequired = false\n\n'
                          f"[[rules]]\npattern = '{RECIPE_PATTERN}'\ntype = \"{qtype}\"\n")
        opts = ["--tensor-type", f"{RECIPE_PATTERN}={qtype.lower()}"]
        ours = ["quantize", "--no-progress", "--no-receipt", *im, str(model), "-r", recipe.name, "-o", out]
    else:
        opts = [flag, f"{TENSOR_TYPE_PATTERN}={qtype.lower()}" if flag == "--tensor-type" else qtype.lower()]
        ours = ["quantize", "--no-progress", "--no-receipt", *im, *opts, str(model), out, "Q8_0", "2"]
    return Case(cid, ours, [*im, *opts, str(model), "theirs.gguf", "Q8_0", "2"], out)


def _run_ours(cases: list[Case], folder: Path) -> dict[str, dict]:
    """Every case through ggufmtp's CLI in one child process (tests/cli_batch.py); an abort there
    fails the sweep naming the case it died in."""
    (folder / "cases.json").write_text(json.dumps([{"id": c.id, "argv": c.ours, "out": c.out} for c in cases]))
    env = {**os.environ, "GGML_NO_BACKTRACE": "1"}  # an abort ends at once (no gdb attaching to print a backtrace)
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("cli_batch.py")), "cases.json", "results.jsonl"],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=900)
    lines = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
    started = [r["id"] for r in lines if r.get("started")]
    assert proc.returncode == 0, (f"ggufmtp died (exit {proc.returncode}) in case {started[-1] if started else None}: "
                                  f"{(proc.stdout + proc.stderr)[-3000:]}")
    return {r["id"]: r for r in lines if not r.get("started")}


def _run_theirs(case: Case, folder: Path) -> tuple[int, str, str | None]:
    """llama-quantize run directly: exit status, its output's tail, the sha256 of what it wrote."""
    env = {**os.environ, "GGML_NO_BACKTRACE": "1"}
    proc = subprocess.run([str(runtime.find_binary("llama-quantize")), *case.theirs], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=300)
    made = folder / "theirs.gguf"
    digest = hashlib.sha256(made.read_bytes()).hexdigest() if made.exists() else None
    made.unlink(missing_ok=True)
    return proc.returncode, (proc.stdout + proc.stderr)[-400:], digest


def _verdict(case: Case, ours: dict, theirs: tuple[int, str, str | None]) -> str | None:
    """None when ggufmtp refused clearly where llama-quantize fails, or made its very bytes."""
    rc, tail, digest = theirs
    if ours["exception"] or "Traceback" in ours["output"] or "GGML_ASSERT" in ours["output"]:
        return f"{case.id}: not a clear error: {ours['exception'] or ours['output'][-600:]}"
    if ours["left"]:
        return f"{case.id}: left {ours['left']}"
    if ours["exit"] != 0:
        if ours["sha256"] is not None or not ours["output"].startswith("error: "):
            return f"{case.id}: refused without one clear error (or wrote its output): {ours['output'][-600:]}"
        if rc == 0:
            return f"{case.id}: refused, but llama-quantize makes it: {ours['output'][-600:]}"
        return None
    if rc != 0:
        return f"{case.id}: made a file where llama-quantize fails (exit {rc}): {tail}"
    if ours["sha256"] != digest:
        return f"{case.id}: ggufmtp's bytes differ from llama-quantize's"
    return None


@pytest.fixture(scope="module")
def sweep_models(synth_model, tmp_path_factory) -> dict[str, Path]:
    tiny = synth_model("tiny-qwen35moe")
    return {"tiny": tiny, "rows128": halve_rows(tiny, tmp_path_factory.mktemp("rows128") / "rows128.gguf")}


@pytest.mark.parametrize("model_key,with_imatrix", [("tiny", False), ("rows128", False), ("tiny", True),
                                                    ("rows128", True)])
def test_every_ggml_type_through_every_type_flag_is_refused_clearly_or_gives_llama_quantize_bytes(
        sweep_models, model_key, with_imatrix, tmp_path):
    """The 34 type names x 4 flags on one model; with an imatrix (llama-imatrix's kind: no token_embd,
    output or MTP block) again for the types whose fate it decides (those that need statistics). Before
    #51, Q6_K as --token-embedding-type on 128-wide rows, and I8 ... F64, Q8_1, Q8_K through any flag,
    killed the process (GGML_ASSERT, exit 134) or failed after writing part of it; each refusal must
    also be one llama-quantize does not get through (nothing is refused that llama.cpp would make).
    About 300 quantizations of a 13 MB model in all: under two minutes of CPU."""
    model = sweep_models[model_key]
    imatrix, types = None, TYPES
    if with_imatrix:
        imx.write_imatrix(imc.synthetic_imatrix(imc.read_model_tensors(model), seed=1, mtp_blocks=[]), tmp_path / "im.gguf")
        imatrix, types = "im.gguf", [t for t in TYPES if t in imc.IMATRIX_REQUIRED_TYPES]
    cases = [_case(flag, t, model, imatrix, tmp_path) for flag in FLAGS for t in types]
    t0 = time.monotonic()
    ours = _run_ours(cases, tmp_path)
    problems = [p for c in cases if (p := _verdict(c, ours[c.id], _run_theirs(c, tmp_path)))]
    refused = sum(ours[c.id]["exit"] != 0 for c in cases)
    assert not problems, "\n".join(problems)
    assert 0 < refused < len(cases), (refused, time.monotonic() - t0)  # both outcomes exercised


def test_the_traits_are_ggmls_and_the_refusals_follow_them(sweep_models):
    """The pre-flight's traits are read from the loaded libggml: the types it cannot write are the
    matmul helpers and the integer/F64 types, and IQ1_S, IQ2_XS, IQ2_XXS are the ones ggml asserts
    statistics for (the set ``imatrix.check.needs_imatrix`` holds for token_embd and output)."""
    types = ggml_types()
    assert set(types) == set(TYPES)
    assert sorted(t.name for t in types.values() if not t.writable) == sorted(
        ["Q8_1", "Q8_K", "I8", "I16", "I32", "I64", "F64"])
    assert {t.name for t in types.values() if t.requires_imatrix} == imc.ASSERTED_IMATRIX_TYPES
    assert all(types[n].block_size == gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[n]][0] for n in types)
    res = CliRunner().invoke(main, ["plan", str(sweep_models["rows128"]), "-r", "Q8_0", "--token-embedding-type", "q6_k"])
    assert res.exit_code == 1 and "token_embd.weight: rows of 128 values are not whole Q6_K blocks of 256" in res.output
    # where llama.cpp falls back (--tensor-type, the mix), the plan shows the type it will really write
    res = CliRunner().invoke(main, ["plan", str(sweep_models["rows128"]), "-r", "Q8_0-plain", "--tensor-type",
                                    "attn_gate=q6_k", "--json"])
    assert res.exit_code == 0, res.output
    gate = next(t for t in json.loads(res.output)["tensors"] if t["name"] == "blk.0.attn_gate.weight")
    assert gate["to_type"] == "Q8_0" and "shape fallback to Q8_0" in gate["reason"]


@pytest.mark.parametrize("command", ["search", "head-sweep"])
def test_search_and_head_sweep_refuse_a_type_llama_cpp_cannot_write_before_any_work(sweep_models, tmp_path, command):
    """Before #51 ``search --types Q8_0,I8`` started measuring (llama-perplexity runs) and would
    have aborted at the I8 candidate; head-sweep would have quantized its BF16 and Q8_0 heads first."""
    where = {"search": "search --types", "head-sweep": "head-sweep --types"}[command]
    extra = ["--budget", "12MB", "-o", str(tmp_path / "found.toml")] if command == "search" else ["-r", "Q8_0", "-o", str(tmp_path / "hs")]
    res = CliRunner().invoke(main, [command, str(sweep_models["tiny"]), "--types", "Q8_0,I8", *extra])
    assert res.exit_code == 1 and res.output.startswith(f"error: {where}: I8 is not a type llama.cpp can "
                                                        "quantize to"), res.output
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- patterns and TOML


@pytest.mark.parametrize("pattern", [r"(\w+)+x", r"(.*)*x", r"(gate|ga)*x", r"()*x", ".*.*.*.*x"])
def test_a_pattern_that_could_backtrack_without_end_is_refused_at_once(pattern, tmp_path):
    """``(.*)*x`` never finishes in the pinned llama-quantize (measured: killed at 20 s on the tiny
    model's 96 names), so ``plan`` hung before #51; now the pattern itself is refused, from
    --tensor-type and from a recipe rule alike, in far less than a second."""
    t0 = time.monotonic()
    res = CliRunner().invoke(main, ["plan", "builtin:tiny-qwen35moe", "-r", "Q8_0", "--tensor-type", f"{pattern}=q4_0"])
    assert res.exit_code == 1 and res.output.startswith("error: --tensor-type") and "is refused:" in res.output, res.output
    recipe = tmp_path / "r.toml"
    recipe.write_text(f"name = \"r\"\nftype = \"Q8_0\"\n[[rules]]\npattern = '{pattern}'\ntype = \"Q4_0\"\n")
    with pytest.raises(RecipeError, match=r"r\.toml: rules\[0\]: pattern .* is refused"):
        Recipe.load(recipe)
    assert time.monotonic() - t0 < 30  # a wide margin: the work is a parse, not a match


def test_ordinary_patterns_pass():
    for p in (r"blk\.[0-9]+\.ffn_down", r"^blk\.(0|1)\.ffn_(down|gate|up)_exps\.weight$", r"attn_v", r"blk\.{mtp}\.",
              r".*_exps.*", r"blk\.\d{1,2}\.attn_(q|k|v)\.", r"blk\.[0-9]+\..*ffn_.*_exps"):
        Recipe.from_dict({"name": "x", "ftype": "Q8_0", "rules": [{"pattern": p, "type": "Q6_K"}]})


@pytest.mark.parametrize("doc", ["a = " + "[" * 5000 + "]" * 5000, "a = " + "{b = " * 3000 + "1" + "}" * 3000,
                                 "[" + ".".join(["t"] * 200) + "]\nx = 1"])
def test_a_deeply_nested_recipe_or_ladder_file_is_one_clear_error(doc, tmp_path):
    """Before #51 the first two ended in a RecursionError traceback from tomllib."""
    (tmp_path / "deep.toml").write_text(doc)
    with pytest.raises(RecipeError, match=r"deep\.toml: not valid TOML \(.*nested deeper than 16 levels"):
        Recipe.load(tmp_path / "deep.toml")
    with pytest.raises(LadderError, match=r"deep\.toml: not a TOML ladder file \(.*nested deeper than 16 levels"):
        load_ladder_file(tmp_path / "deep.toml")
    res = CliRunner().invoke(main, ["recipe", "show", str(tmp_path / "deep.toml")])
    assert res.exit_code == 1 and "nested deeper" in res.output and "Traceback" not in res.output, res.output
