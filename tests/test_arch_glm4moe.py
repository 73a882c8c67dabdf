"""``ggufmtp synth --arch glm4moe`` (GLM-4.5 / GLM-4.5-Air): the file is laid out as the pinned
converter writes that family, and the pinned llama-server serves it with ``--spec-type draft-mtp``
with exactly the acceptance the knob sets.

Expected names, shapes and keys are written out here from llama.cpp 0c1e570's
``src/llama-arch.cpp`` (tensor names), ``src/models/glm4-moe.cpp`` (``load_arch_hparams``,
``load_arch_tensors``) and ``conversion/glm.py`` (``Glm4MoeModel``), not read back from the module.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ggufmtp.gguf.model import GGUFModel, MTPStatus, check_mtp
from ggufmtp.runtime.server import LlamaServer, ServerConfig, require_drafting
from ggufmtp.synth.chain import predict_tokens, simulate_acceptance
from ggufmtp.synth.spec import SynthSpec, mtp_block_suffixes
from ggufmtp.synth.tokenizer import build_vocab
from ggufmtp.synth.writer import synthesize

PROMPTS = ["Tell me about the sea.", "How do I bake bread?", "What is a computer program?"]
N_TOKENS = 48
K = 3

# one leading dense block (blk.0), one MoE block (blk.1), the NextN block blk.2
SPEC = SynthSpec(arch="glm4moe", layers=2)
SPEC_F50 = dataclasses.replace(SPEC, wrong_successor_fraction=0.5)
# GLM-4.6 ships its NextN block without embed_tokens / shared_head_head (the loader falls back)
SPEC_GLM46 = dataclasses.replace(SPEC, omit_tensors=("nextn.embed_tokens", "nextn.shared_head_head"))

N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF, N_EXPERT, N_FF_EXP = 256, 2, 1, 128, 512, 4, 256

ATTENTION = {"attn_norm.weight": (N_EMBD,), "attn_q.weight": (N_EMBD, N_HEAD * HEAD_DIM),
             "attn_q.bias": (N_HEAD * HEAD_DIM,), "attn_k.weight": (N_EMBD, N_HEAD_KV * HEAD_DIM),
             "attn_k.bias": (N_HEAD_KV * HEAD_DIM,), "attn_v.weight": (N_EMBD, N_HEAD_KV * HEAD_DIM),
             "attn_v.bias": (N_HEAD_KV * HEAD_DIM,), "attn_output.weight": (N_HEAD * HEAD_DIM, N_EMBD),
             "post_attention_norm.weight": (N_EMBD,)}
DENSE_FFN = {"ffn_gate.weight": (N_EMBD, N_FF), "ffn_up.weight": (N_EMBD, N_FF), "ffn_down.weight": (N_FF, N_EMBD)}
MOE_FFN = {"ffn_gate_inp.weight": (N_EMBD, N_EXPERT), "exp_probs_b.bias": (N_EXPERT,),
           "ffn_gate_exps.weight": (N_EMBD, N_FF_EXP, N_EXPERT), "ffn_up_exps.weight": (N_EMBD, N_FF_EXP, N_EXPERT),
           "ffn_down_exps.weight": (N_FF_EXP, N_EMBD, N_EXPERT),
           # n_ff_shexp = n_ff_exp * expert_shared_count (1)
           "ffn_gate_shexp.weight": (N_EMBD, N_FF_EXP), "ffn_up_shexp.weight": (N_EMBD, N_FF_EXP),
           "ffn_down_shexp.weight": (N_FF_EXP, N_EMBD)}
NEXTN = {"nextn.eh_proj.weight": (2 * N_EMBD, N_EMBD), "nextn.enorm.weight": (N_EMBD,),
         "nextn.hnorm.weight": (N_EMBD,), "nextn.shared_head_norm.weight": (N_EMBD,),
         "nextn.embed_tokens.weight": (N_EMBD, None), "nextn.shared_head_head.weight": (N_EMBD, None)}

# what Glm4MoeModel.set_gguf_parameters writes for GLM-4.5-Air's config (at the tiny widths)
KEYS = {"block_count": 3, "nextn_predict_layers": 1, "context_length": 4096, "embedding_length": N_EMBD,
        "feed_forward_length": N_FF, "attention.head_count": N_HEAD, "attention.head_count_kv": N_HEAD_KV,
        "attention.key_length": HEAD_DIM, "attention.value_length": HEAD_DIM,
        "rope.dimension_count": HEAD_DIM // 2, "expert_count": N_EXPERT, "expert_used_count": 2,
        "expert_group_count": 1, "expert_group_used_count": 1,
        "expert_feed_forward_length": N_FF_EXP, "expert_shared_count": 1, "leading_dense_block_count": 1,
        "expert_gating_func": 2, "expert_weights_scale": 1.0, "expert_weights_norm": True}


def _write(tmp_path: Path, spec: SynthSpec):
    return synthesize(tmp_path / f"{spec.digest()[:12]}.gguf", spec, progress=False)


def _expected_block(il: int) -> dict[str, tuple]:
    ffn = DENSE_FFN if il == 0 else MOE_FFN
    out = {**ATTENTION, **ffn, **(NEXTN if il == 2 else {})}
    return {f"blk.{il}.{k}": v for k, v in out.items()}


# ----------------------------------------------------------------------------- the GGUF


def test_tensors_keys_and_mtp_block_as_the_converter_writes_them(tmp_path):
    res = _write(tmp_path, SPEC)
    assert res.servable and res.mtp_blocks == [2]
    m = GGUFModel(res.path)
    assert m.architecture == "glm4moe"
    check = check_mtp(m)
    assert (check.status, check.block, check.missing, check.problems) == (MTPStatus.COMPLETE, 2, [], [])
    assert check.fallbacks == {}  # GLM-4.5 carries all three optional head tensors
    for key, value in KEYS.items():  # bool/float/int as llama.cpp reads them (True == 1 would hide a uint32)
        assert (m.arch_key(key), type(m.arch_key(key))) == (value, type(value)), key
    # no rope sections: llama.cpp would take the file for GLM-4.5V (M-RoPE)
    assert m.arch_key("rope.dimension_sections") is None
    n_vocab = m.tensors["token_embd.weight"].shape[1]
    expected = {"token_embd.weight": (N_EMBD, n_vocab), "output_norm.weight": (N_EMBD,),
                "output.weight": (N_EMBD, n_vocab)}
    for il in range(3):
        expected |= {k: tuple(n_vocab if x is None else x for x in v) for k, v in _expected_block(il).items()}
    assert m.shapes() == expected
    for name, t in m.tensors.items():
        # the converter keeps 1-D tensors and the router F32; matrices stay BF16
        f32 = len(t.shape) == 1 or name.endswith("ffn_gate_inp.weight")
        assert t.type == ("F32" if f32 else "BF16"), name
    # what --omit-tensors offers is the NextN block's own (MoE) tensors
    suffixes = mtp_block_suffixes(SPEC)
    assert {"ffn_gate_inp", "exp_probs_b.bias", "nextn.shared_head_head"} <= set(suffixes)
    assert "ffn_gate" not in suffixes


def test_glm46_layout_and_sidecar(tmp_path):
    m = GGUFModel(_write(tmp_path, SPEC_GLM46).path)
    check = check_mtp(m)
    assert check.status == MTPStatus.COMPLETE
    assert check.fallbacks == {"blk.2.nextn.embed_tokens.weight": "token_embd.weight",
                               "blk.2.nextn.shared_head_head.weight": "output.weight"}
    side = _write(tmp_path, dataclasses.replace(SPEC, mtp_only=True))
    assert not side.servable
    sm = GGUFModel(side.path)
    assert check_mtp(sm).status == MTPStatus.SIDECAR
    assert {n for n in sm.tensors if not n.startswith("blk.")} == {"token_embd.weight", "output_norm.weight",
                                                                  "output.weight"}
    assert {n.split(".")[1] for n in sm.tensors if n.startswith("blk.")} == {"2"}


# ----------------------------------------------------------------------------- llama-server


def _cfg(model: Path, **kw) -> ServerConfig:
    return ServerConfig(model=model, threads=2, ctx_size=4096, **kw)


def _serve(srv: LlamaServer, spec: SynthSpec, drafting: bool) -> tuple[list[str], int, int, int, int]:
    """(texts, drafted, accepted, simulated drafted, simulated accepted) over PROMPTS; every reply
    is checked against the bigram chain from its prompt's last token."""
    texts, d, a, sd, sa = [], 0, 0, 0, 0
    for p in PROMPTS:
        msgs = [{"role": "user", "content": p}]
        r = srv.chat(msgs, max_tokens=N_TOKENS)
        texts.append(r["choices"][0]["message"]["content"])
        assert r["timings"]["predicted_n"] == N_TOKENS
        last = srv.chat_prompt_tokens(msgs)[-1]
        assert texts[-1] == build_vocab().decode(predict_tokens(spec, last, N_TOKENS))
        if drafting:
            dd, aa = require_drafting(r)
            s_d, s_a = simulate_acceptance(spec, last, N_TOKENS, K)
            d, a, sd, sa = d + dd, a + aa, sd + s_d, sa + s_a
        else:
            assert "draft_n" not in r["timings"]
    return texts, d, a, sd, sa


@pytest.mark.parametrize("spec", [SPEC, SPEC_GLM46], ids=["glm45", "glm46-fallbacks"])
def test_draft_mtp_accepts_every_draft_at_f0(llama_server_bin, synth_model, spec):
    with LlamaServer(_cfg(synth_model(spec), draft_mtp=True, draft_n_max=K)) as srv:
        texts, d, a, sd, sa = _serve(srv, spec, drafting=True)
    assert d > 0 and (d, a) == (sd, sa) and a == d
    assert len(set(texts)) == len(texts)


def test_acceptance_matches_the_knob_and_vanilla_gives_the_same_texts(llama_server_bin, synth_model):
    model = synth_model(SPEC_F50)
    with LlamaServer(_cfg(model, draft_mtp=True, draft_n_max=K)) as srv:
        drafted, d, a, sd, sa = _serve(srv, SPEC_F50, drafting=True)
    assert (d, a) == (sd, sa)
    assert 0 < a / d < 0.6  # formula (0.5 + 0.25 + 0.125) / 3 = 0.29 over long replies
    with LlamaServer(_cfg(model)) as srv:
        plain, *_ = _serve(srv, SPEC_F50, drafting=False)
    assert plain == drafted
