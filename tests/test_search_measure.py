"""The search's measuring side (issue #43) on ``builtin:tiny-qwen35moe-trained``, at a small size.

Groups partition the quantizable tensors and each group's pattern matches exactly its tensors with
the recipe's own matcher; a candidate's bytes are what llama-quantize writes for the group (the real
quantized file read back); a 4-bit type on the routed experts costs far more KLD than Q8_0 (the
designed margin: Q4_0 keeps 16x the Q8_0 quantization step, so on the trained model its KLD is an
order of magnitude above; we ask for 3x and a floor); a second measurement with the same inputs
starts no llama.cpp process (the cache).

The model's widths are 128 (64 for the experts' down projection), so 256-block k-quants and IQ types
are not candidates there (llama-quantize would fall back): Q4_0, Q8_0 (32-blocks) and Q1_0 (128) are.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ggufmtp.gguf.model import GGUFModel
from ggufmtp.imatrix.check import is_quantizable
from ggufmtp.quant.quantize import quantize
from ggufmtp.quant.recipe import QuantizeFlags, Recipe
from ggufmtp.search.groups import candidates, group_rule, groups_of, matching_tensors
from ggufmtp.search.records import GroupRole

pytestmark = pytest.mark.runtime


@pytest.fixture(scope="module")
def model(llama_runtime) -> Path:
    from ggufmtp.refs import builtin_model_path

    return builtin_model_path("tiny-qwen35moe-trained")


@pytest.fixture(scope="module")
def groups(model):
    return groups_of(model, layers_per_group=2)


def test_groups_partition_the_quantizable_tensors_and_patterns_match_exactly(model, groups):
    gm = GGUFModel(model)
    quantizable = {n for n, t in gm.tensors.items() if is_quantizable(n, t.shape)}
    covered = [n for g in groups for n in g.tensors]
    assert sorted(covered) == sorted(quantizable)  # every 2-D weight, each in exactly one group
    assert not any(n.startswith("blk.") and "ffn_gate_inp" in n for n in covered)  # routers stay F32
    for g in groups:
        assert sorted(matching_tensors(g.pattern, gm.tensors, gm.mtp_blocks)) == sorted(g.tensors), g.name
        assert g.n_params == sum(gm.tensors[n].n_elements for n in g.tensors)
    roles = {g.role for g in groups}
    assert {GroupRole.MTP_EH_PROJ, GroupRole.MTP_ATTENTION, GroupRole.MTP_EXPERTS, GroupRole.MTP_REST,
            GroupRole.ROUTED_EXPERTS, GroupRole.SHARED_EXPERT, GroupRole.RECURRENT, GroupRole.ATTENTION,
            GroupRole.TOKEN_EMBEDDING, GroupRole.OUTPUT} <= roles
    by_name = {g.name: g for g in groups}
    assert by_name["mtp.eh_proj"].tensors == ("blk.4.nextn.eh_proj.weight",)
    assert "{mtp}" in by_name["mtp.attn"].pattern  # an ordinary recipe rule, whatever the head's block
    assert set(by_name["routed_experts.0-1"].tensors) == {f"blk.{i}.ffn_{p}_exps.weight" for i in (0, 1)
                                                          for p in ("gate", "up", "down")}
    assert all(re.fullmatch(r"blk\.[0-2]\..*", n) for n in by_name["recurrent.0-1"].tensors + by_name["recurrent.2"].tensors)


def test_candidates_respect_block_sizes_and_the_imatrix(model, groups):
    cands = candidates(model, groups, ["Q8_0", "Q4_0", "Q4_K", "Q1_0", "IQ2_XXS"])
    types = {(c.group, c.qtype) for c in cands}
    assert ("routed_experts.0-1", "Q4_0") in types
    assert ("routed_experts.0-1", "Q4_K") not in types  # rows of 128 and 64: a 256-block type falls back
    assert ("routed_experts.0-1", "Q1_0") not in types  # ffn_down_exps rows of 64 < Q1_0's 128-block
    assert ("attn.3", "Q1_0") in types
    assert not any(c.qtype == "IQ2_XXS" for c in cands)
    with_imatrix = candidates(model, groups, ["IQ2_XXS"], imatrix=True)
    assert [c.group for c in with_imatrix] == ["mtp.eh_proj"]  # the one group whose rows (256) take its block


@pytest.mark.parametrize(("group", "qtype"), [("routed_experts.0-1", "Q4_0"), ("mtp.attn", "Q1_0")])
def test_a_candidates_bytes_are_what_llama_quantize_writes(model, groups, tmp_path, group, qtype):
    g = next(x for x in groups if x.name == group)
    cand = next(c for c in candidates(model, groups, [qtype]) if c.group == group)
    recipe = Recipe.load("Q8_0").with_flags(QuantizeFlags(tensor_types=(group_rule(g, qtype),)))
    out = quantize(model, recipe, tmp_path / "q.gguf", progress=False).output
    written = GGUFModel(out).tensors
    assert {written[n].type for n in g.tensors} == {qtype}
    assert sum(written[n].n_bytes for n in g.tensors) == cand.n_bytes
