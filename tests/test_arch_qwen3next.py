"""``ggufmtp synth --arch qwen3next`` (Qwen3-Next-80B-A3B layout): the GGUF as the pinned converter
writes the family, and the pinned llama-server serving it with ``--spec-type draft-mtp``.

qwen3next differs from qwen35moe in its linear attention (``ssm_ba`` fused beta/alpha) and in its
rope keys, and llama.cpp 0c1e570 cannot roll its recurrent state back partially: rejected drafts are
replayed from a checkpoint, which changes the draft accounting (pinned below against
the replay in :func:`simulate_acceptance`; the same chain on qwen35moe is counted without it).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import gguf
import pytest

from ggufmtp.errors import ServerError
from ggufmtp.gguf.model import GGUFModel, MTPStatus, check_mtp
from ggufmtp.runtime.server import LlamaServer, ServerConfig, require_drafting
from ggufmtp.synth.archs.registry import arch_for
from ggufmtp.synth.chain import predict_tokens, simulate_acceptance
from ggufmtp.synth.layout import BF16, F32
from ggufmtp.synth.spec import SynthSpec, expected_acceptance
from ggufmtp.synth.tokenizer import build_vocab
from ggufmtp.synth.writer import synthesize

PROMPTS = ["Tell me about the sea.", "Explain gravity to a child.", "How do I bake bread?"]
N_TOKENS = 64
SPEC = SynthSpec(arch="qwen3next")  # 4 trunk layers (0-2 Gated DeltaNet, 3 full attention) + MTP blk.4
SPEC_F50 = SynthSpec(arch="qwen3next", wrong_successor_fraction=0.5)

# Tensor names per block kind (src/llama-arch.cpp LLM_TENSOR_* names; src/models/qwen3next.cpp
# load_arch_tensors, the optimized linear-attention path the converter writes: no legacy ssm_in)
NORMS = {"attn_norm", "post_attention_norm"}
MOE = {"ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps",
       "ffn_gate_inp_shexp", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"}
DELTANET = {"attn_qkv", "attn_gate", "ssm_conv1d", "ssm_dt", "ssm_a", "ssm_ba", "ssm_norm", "ssm_out"}
ATTENTION = {"attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm"}
NEXTN = {"nextn.eh_proj", "nextn.enorm", "nextn.hnorm", "nextn.shared_head_norm"}


def _block_kinds(model: GGUFModel, il: int) -> set[str]:
    p = f"blk.{il}."
    return {n.removeprefix(p).removesuffix(".weight").removesuffix(".bias")
            for n in model.tensors if n.startswith(p)}


# ----------------------------------------------------------------------------- the GGUF


def test_layout_keys_and_mtp_block(tmp_path):
    res = synthesize(tmp_path / "q3n.gguf", SPEC, progress=False)
    m = GGUFModel(res.path)
    assert m.architecture == "qwen3next" and res.servable
    chk = check_mtp(m)
    assert chk.status == MTPStatus.COMPLETE and chk.block == 4 and not chk.missing and not chk.problems
    # the keys load_arch_hparams (and the common loader) read, as Qwen3NextModel writes them
    key = lambda k: m.arch_key(k)  # noqa: E731
    assert (key("block_count"), key("nextn_predict_layers"), key("full_attention_interval")) == (5, 1, 4)
    assert (key("ssm.conv_kernel"), key("ssm.state_size"), key("ssm.group_count"),
            key("ssm.time_step_rank"), key("ssm.inner_size")) == (4, 128, 1, 2, 256)
    assert (key("expert_count"), key("expert_used_count"), key("expert_feed_forward_length"),
            key("expert_shared_feed_forward_length")) == (4, 2, 256, 256)
    assert key("embedding_length") == 256 and key("attention.key_length") == key("attention.value_length") == 128
    for k in ("context_length", "feed_forward_length", "attention.head_count", "attention.head_count_kv",
              "attention.layer_norm_rms_epsilon", "rope.dimension_count", "rope.freq_base"):
        assert key(k) is not None, k
    assert key("rope.dimension_sections") is None  # NEOX rope, no mrope (unlike qwen35moe)
    # per block: DeltaNet 0-2, full attention 3, the MTP block 4 = full attention + nextn
    for il in range(3):
        assert _block_kinds(m, il) == NORMS | DELTANET | MOE, il
    assert _block_kinds(m, 3) == NORMS | ATTENTION | MOE
    assert _block_kinds(m, 4) == NORMS | ATTENTION | MOE | NEXTN
    assert not _block_kinds(m, 5)
    # every other tensor is one gguf-py (the venv's) names for qwen3next; its list lacks nextn.*
    known = {gguf.TENSOR_NAMES[t].format(bid=il) for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.QWEN3NEXT]
             for il in range(5)}
    assert {n.removesuffix(".weight").removesuffix(".bias") for n in m.tensors if ".nextn." not in n} <= known


def test_shapes_and_storage_types(tmp_path):
    m = GGUFModel(synthesize(tmp_path / "q3n.gguf", SPEC_F50, progress=False).path)
    t = m.tensors
    # fused beta/alpha {n_embd, 2 * n_v_heads}; q/k/v fused, z separate (conv_dim = 2*128 + 256)
    assert t["blk.0.ssm_ba.weight"].shape == (256, 4)
    assert t["blk.0.attn_qkv.weight"].shape == (256, 512) and t["blk.0.attn_gate.weight"].shape == (256, 256)
    assert t["blk.0.ssm_conv1d.weight"].shape == (4, 512)
    assert t["blk.3.attn_q.weight"].shape == (256, 512)  # the output gate doubles q
    assert t["blk.4.nextn.eh_proj.weight"].shape == (512, 256)
    assert t["blk.4.nextn.embed_tokens.weight"].shape == t["token_embd.weight"].shape  # f > 0 only
    f32 = {n for n, ti in t.items() if ti.type == gguf.GGMLQuantizationType(F32).name}
    bf16 = {n for n, ti in t.items() if ti.type == gguf.GGMLQuantizationType(BF16).name}
    assert f32 | bf16 == set(t)
    assert {"blk.0.ssm_conv1d.weight", "blk.0.ffn_gate_inp.weight", "blk.4.ffn_gate_inp.weight",
            "blk.0.ssm_a", "blk.0.ssm_dt.bias", "blk.4.nextn.enorm.weight"} <= f32
    assert all(len(t[n].shape) == 1 or n.endswith(("ffn_gate_inp.weight", "ssm_conv1d.weight")) for n in f32)
    assert {"blk.0.ssm_ba.weight", "blk.0.ssm_out.weight", "blk.4.ffn_down_exps.weight"} <= bf16


def test_one_trunk_layer_is_not_servable(tmp_path):
    res = synthesize(tmp_path / "one.gguf", SynthSpec(arch="qwen3next", layers=1), progress=False)
    assert not res.servable  # the runtime pin is test_one_trunk_layer_aborts_at_warm_up
    assert "2 trunk layers" in arch_for("qwen3next").unservable_reason(res.spec)
    assert not synthesize(tmp_path / "s.gguf", SynthSpec(arch="qwen3next", mtp_only=True), progress=False).servable


# ----------------------------------------------------------------------------- llama-server


def _cfg(model: Path, **kw) -> ServerConfig:
    kw.setdefault("threads", 2)
    kw.setdefault("ctx_size", 4096)
    return ServerConfig(model=model, **kw)


def _last_prompt_token(srv: LlamaServer, prompt: str) -> int:
    return srv.chat_prompt_tokens([{"role": "user", "content": prompt}])[-1]


def _serve(srv: LlamaServer, spec: SynthSpec, k: int):
    """(texts, (drafted, accepted), replayed simulation, qwen35moe-loop simulation) over PROMPTS;
    asserts every reply is the bigram chain from its prompt's last token."""
    texts, got, replayed, plain = [], [0, 0], [0, 0], [0, 0]
    for p in PROMPTS:
        r = srv.chat([{"role": "user", "content": p}], max_tokens=N_TOKENS)
        texts.append(r["choices"][0]["message"]["content"])
        assert r["timings"]["predicted_n"] == N_TOKENS
        last = _last_prompt_token(srv, p)
        assert texts[-1] == build_vocab().decode(predict_tokens(spec, last, N_TOKENS))
        for acc, counts in ((got, require_drafting(r)),
                            (replayed, simulate_acceptance(spec, last, N_TOKENS, k)),
                            (plain, simulate_acceptance(dataclasses.replace(spec, arch="qwen35moe"), last, N_TOKENS, k))):
            acc[0], acc[1] = acc[0] + counts[0], acc[1] + counts[1]
    return texts, tuple(got), tuple(replayed), tuple(plain)


def _metric_counts(m: dict[str, float]) -> tuple[float, float]:
    return m["llamacpp:spec_decode_num_draft_tokens_total"], m["llamacpp:spec_decode_num_accepted_tokens_total"]


def test_draft_mtp_full_acceptance(llama_server_bin, synth_model):
    k = 3
    with LlamaServer(_cfg(synth_model(SPEC), draft_mtp=True, draft_n_max=k)) as srv:
        texts, got, replayed, plain = _serve(srv, SPEC, k)
        m = srv.metrics()
    # no draft is rejected, so no replay: the qwen35moe loop's counts, acceptance 1.0
    assert got == replayed == plain and got[0] > 0 and got[0] == got[1]
    assert _metric_counts(m) == got
    assert len(set(texts)) == len(texts)


def test_draft_mtp_half_wrong_replays_rejected_drafts(llama_server_bin, synth_model):
    """At f=0.5 the counts are exactly the replayed simulation's and NOT the qwen35moe loop's:
    llama.cpp 0c1e570 has no partial rollback for qwen3next (an upgrade adding it, as the closed
    ggml-org/llama.cpp PR #28120 proposed, breaks this pin: then the counts become ``plain``)."""
    k = 3
    model = synth_model(SPEC_F50)
    with LlamaServer(_cfg(model, draft_mtp=True, draft_n_max=k)) as srv:
        texts, got, replayed, plain = _serve(srv, SPEC_F50, k)
        m = srv.metrics()
    assert got == replayed and got != plain
    assert _metric_counts(m) == got
    assert abs(got[1] / got[0] - expected_acceptance(0.5, k)) < 0.1 and got[1] < got[0]
    # speculative decoding stays lossless: vanilla gives the same texts
    with LlamaServer(_cfg(model)) as vanilla:
        plain_texts = [vanilla.chat([{"role": "user", "content": p}], max_tokens=N_TOKENS)
                       ["choices"][0]["message"]["content"] for p in PROMPTS]
    assert plain_texts == texts


def test_mtp_only_sidecar_next_to_the_trunk(llama_server_bin, synth_model):
    """The qwen3next loader takes an MTP-only file (trunk tensors optional) as --spec-draft-model."""
    k = 3
    sidecar = synth_model(SynthSpec(arch="qwen3next", mtp_only=True, wrong_successor_fraction=0.5))
    assert check_mtp(GGUFModel(sidecar)).status == MTPStatus.SIDECAR
    target = synth_model(SynthSpec(arch="qwen3next", mtp=False))
    with LlamaServer(_cfg(target, draft_mtp=True, draft_n_max=k, draft_model=sidecar)) as srv:
        _, got, replayed, _ = _serve(srv, SPEC_F50, k)
    assert got == replayed


def test_one_trunk_layer_aborts_at_warm_up(llama_server_bin, synth_model):
    """llama.cpp 0c1e570 aborts on a hybrid trunk without an attention layer (as for qwen35moe)."""
    spec = SynthSpec(arch="qwen3next", layers=1)
    with pytest.raises(ServerError, match="SIGABRT") as e:
        LlamaServer(_cfg(synth_model(spec), draft_mtp=True)).start()
    assert "GGML_ASSERT(buffer)" in str(e.value)
