"""``ggufmtp synth --arch deepseek2``: a GLM-4.7-Flash-style MLA model with one NextN block.

The file is checked against what llama.cpp 0c1e570 expects (``src/llama-arch.cpp`` names,
``src/models/deepseek2.cpp`` tensors and hparams, the converter's ``Glm4MoeLiteModel`` keys), then
served by the pinned llama-server with ``--spec-type draft-mtp``: the replies are the bigram chain
and the draft accounting equals :func:`simulate_acceptance` exactly.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ggufmtp.gguf.model import GGUFModel, MTPStatus, check_mtp
from ggufmtp.runtime.server import LlamaServer, ServerConfig, require_drafting
from ggufmtp.synth.archs.registry import arch_for
from ggufmtp.synth.chain import predict_tokens, simulate_acceptance
from ggufmtp.synth.spec import SynthSpec
from ggufmtp.synth.tokenizer import build_vocab
from ggufmtp.synth.writer import SynthResult, synthesize

PROMPTS = ["Tell me about the sea.", "Explain gravity to a child.", "How do I bake bread?"]
N_TOKENS = 48
LAYERS = 2  # block 0 dense (leading_dense_block_count 1), block 1 MoE, MTP block blk.2 (MoE)

MLA_ATTENTION = ["attn_norm.weight", "attn_q_a_norm.weight", "attn_kv_a_norm.weight", "attn_q_a.weight",
                 "attn_q_b.weight", "attn_kv_a_mqa.weight", "attn_k_b.weight", "attn_v_b.weight",
                 "attn_output.weight", "ffn_norm.weight"]
DENSE_FFN = ["ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"]
MOE_FFN = ["ffn_gate_inp.weight", "exp_probs_b.bias", "ffn_gate_exps.weight", "ffn_up_exps.weight",
           "ffn_down_exps.weight", "ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight"]
NEXTN = ["nextn.eh_proj.weight", "nextn.enorm.weight", "nextn.hnorm.weight", "nextn.shared_head_norm.weight"]


def _spec(f: float = 0.0, layers: int = LAYERS, **kw) -> SynthSpec:
    return SynthSpec(arch="deepseek2", layers=layers, wrong_successor_fraction=f, **kw)


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> SynthResult:
    """The default tiny deepseek2 (no runtime needed to write or read it)."""
    return synthesize(tmp_path_factory.mktemp("ds2") / "ds2.gguf", _spec(), progress=False)


# ----------------------------------------------------------------------------- the file


def test_tensor_names_per_block_as_llama_arch_names_them(written):
    m = GGUFModel(written.path)
    blocks: dict[int, set[str]] = {}
    for name in m.tensors:
        if name.startswith("blk."):
            _, il, rest = name.split(".", 2)
            blocks.setdefault(int(il), set()).add(rest)
    assert {n for n in m.tensors if not n.startswith("blk.")} == {"token_embd.weight", "output_norm.weight",
                                                                   "output.weight"}
    assert blocks[0] == set(MLA_ATTENTION + DENSE_FFN)  # the leading dense block
    assert blocks[1] == set(MLA_ATTENTION + MOE_FFN)
    assert blocks[2] == set(MLA_ATTENTION + MOE_FFN + NEXTN)  # graph_mtp asserts an MoE FFN
    # the converter's split of kv_b_proj, never the legacy fused tensor (the MTP graph needs wk_b)
    assert not any("attn_kv_b" in n or "ffn_gate_inp_shexp" in n for n in m.tensors)


def test_shapes_and_storage_types(written):
    m = GGUFModel(written.path)
    shape = lambda n: m.tensors[f"blk.1.{n}"].shape  # noqa: E731
    # ggml order (ne0 first), as load_arch_tensors creates them: n_embd 256, 2 heads, q_lora 256,
    # kv_lora 512, qk_nope 256 + qk_rope 64, v_head 128, 4 experts of 256, one shared expert
    assert shape("attn_q_a.weight") == (256, 256)
    assert shape("attn_q_b.weight") == (256, 2 * 320)
    assert shape("attn_kv_a_mqa.weight") == (256, 512 + 64)
    assert shape("attn_k_b.weight") == (256, 512, 2)
    assert shape("attn_v_b.weight") == (512, 128, 2)
    assert shape("attn_output.weight") == (2 * 128, 256)
    assert shape("ffn_gate_exps.weight") == (256, 256, 4)
    assert shape("ffn_down_shexp.weight") == (256, 256)
    assert shape("exp_probs_b.bias") == (4,)
    # every matrix's row length is a multiple of 256 (k-quants apply to all of them)
    assert all(t.shape[0] % 256 == 0 for t in m.tensors.values() if len(t.shape) > 1)
    for name, t in m.tensors.items():
        f32 = len(t.shape) == 1 or name.endswith("ffn_gate_inp.weight")
        assert t.type == ("F32" if f32 else "BF16"), name


def test_metadata_the_loader_reads(written):
    m = GGUFModel(written.path)
    assert m.architecture == "deepseek2"
    assert (m.block_count, m.nextn_predict_layers, m.mtp_blocks) == (LAYERS + 1, 1, [LAYERS])
    expected = {
        "attention.q_lora_rank": 256, "attention.kv_lora_rank": 512,
        "attention.key_length": 576, "attention.value_length": 512,  # the cached latent row (MQA)
        "attention.key_length_mla": 320, "attention.value_length_mla": 128,  # decompressed heads
        "attention.head_count": 2, "attention.head_count_kv": 1, "rope.dimension_count": 64,
        "leading_dense_block_count": 1, "expert_count": 4, "expert_used_count": 2,
        "expert_shared_count": 1, "expert_feed_forward_length": 256, "feed_forward_length": 512,
        "expert_gating_func": 2, "expert_weights_norm": True, "vocab_size": len(build_vocab()),
    }
    assert {k: m.arch_key(k) for k in expected} == expected
    assert m.arch_key("expert_weights_scale") == pytest.approx(1.8)
    assert m.arch_key("attention.layer_norm_rms_epsilon") == pytest.approx(1e-5)


def test_mtp_check_is_complete_and_the_model_servable(written):
    check = check_mtp(GGUFModel(written.path))
    assert check.status == MTPStatus.COMPLETE, check
    assert written.servable and written.mtp_blocks == [LAYERS]
    # one trunk layer (dense only; the MTP block is still MoE) serves; an MTP-only sidecar alone does not
    assert arch_for("deepseek2").servable(_spec(layers=1))
    assert not arch_for("deepseek2").servable(_spec(mtp_only=True))


# ----------------------------------------------------------------------------- llama-server


def _cfg(model: Path, **kw) -> ServerConfig:
    return ServerConfig(model=model, threads=2, ctx_size=4096, **kw)


def _last_prompt_token(srv: LlamaServer, prompt: str) -> int:
    return srv.chat_prompt_tokens([{"role": "user", "content": prompt}])[-1]


def _replies(srv: LlamaServer) -> list[tuple[str, dict, int]]:
    """(text, timings, last prompt token) per prompt."""
    out = []
    for p in PROMPTS:
        r = srv.chat([{"role": "user", "content": p}], max_tokens=N_TOKENS)
        assert r["timings"]["predicted_n"] == N_TOKENS  # the chain never yields EOS
        out.append((r["choices"][0]["message"]["content"], r, _last_prompt_token(srv, p)))
    return out


@pytest.mark.parametrize("f,k", [(0.0, 3), (0.5, 3)])
def test_draft_mtp_acceptance_is_exactly_the_simulated_one(llama_server_bin, synth_model, f, k):
    spec = _spec(f)
    model = synth_model(spec)
    with LlamaServer(_cfg(model, draft_mtp=True, draft_n_max=k)) as srv:
        replies = _replies(srv)
        metrics = srv.metrics()
    drafted = accepted = sim_d = sim_a = 0
    for text, r, last in replies:
        assert text == build_vocab().decode(predict_tokens(spec, last, N_TOKENS))
        d, a = require_drafting(r)
        s_d, s_a = simulate_acceptance(spec, last, N_TOKENS, k)
        drafted, accepted, sim_d, sim_a = drafted + d, accepted + a, sim_d + s_d, sim_a + s_a
    assert (drafted, accepted) == (sim_d, sim_a)
    assert drafted > 0
    if f == 0:
        assert accepted == drafted
    else:
        assert accepted < 0.9 * drafted
    assert metrics["llamacpp:spec_decode_num_draft_tokens_total"] == drafted
    assert len({t for t, _, _ in replies}) == len(PROMPTS)


def test_vanilla_gives_the_same_texts(llama_server_bin, synth_model):
    spec = _spec(0.5)
    with LlamaServer(_cfg(synth_model(spec))) as srv:
        replies = _replies(srv)
    for text, r, last in replies:
        assert "draft_n" not in r["timings"]
        assert text == build_vocab().decode(predict_tokens(spec, last, N_TOKENS))
