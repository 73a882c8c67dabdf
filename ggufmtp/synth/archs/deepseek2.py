"""DeepSeek-V2/V3-style MLA models: ``deepseek2`` as GLM-4.7-Flash (``Glm4MoeLiteForCausalLM``) writes it.

Multi-head latent attention (MLA): queries through a low-rank ``attn_q_a`` -> ``attn_q_a_norm`` ->
``attn_q_b``; keys and values through one shared latent, ``attn_kv_a_mqa`` (``kv_lora_rank`` latent
plus the ``qk_rope`` rotary part) -> ``attn_kv_a_norm``, decompressed per head by ``attn_k_b`` /
``attn_v_b`` -- the split the converter writes from HF's ``kv_b_proj`` (``DeepseekV2Model.modify_tensors``
at 0c1e570; only legacy files carry the unsplit ``attn_kv_b``, which the MTP graph refuses). The
first ``leading_dense_block_count`` blocks have a dense FFN, the others routed experts (sigmoid
gating, ``exp_probs_b`` correction bias, normalised and scaled top-k weights) plus a shared expert.
One MTP block (``nextn_predict_layers`` 1, ``blk.<layers>``): an MoE block plus its ``nextn.*``
tensors; ``src/models/deepseek2.cpp`` (``graph_mtp``) asserts MLA, ``q_lora_rank`` > 0 and an MoE
FFN there.

Only ``Glm4MoeLiteModel`` keeps the MTP layer (``DeepseekV2Model`` itself has ``skip_mtp = True``),
so the keys are those it writes for GLM-4.7-Flash, with tiny widths: every matmul's ``ne0`` is a
multiple of 256 (``qk_nope`` 256, ``q_lora`` 256, ``kv_lora`` 512, ``n_head * v_head`` 256) so k-quants
apply to every matrix.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..layout import Dims, TensorLayout
from ..tokenizer import build_vocab
from .base import HParam, SynthArch, SynthSpec, biased_moe_ffn, common_hyperparameters, in_std, norm, out_proj, weight
from .qwen35 import dense_ffn

EXPERT_GATING_SIGMOID = 2  # LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID (src/llama-hparams.h)


@dataclass(frozen=True)
class MlaDims:
    """The attention and expert widths :class:`~ggufmtp.synth.layout.Dims` lacks (GLM-4.7-Flash's
    geometry, shrunk): ranks of the low-rank projections and the per-head splits."""

    n_head: int = 2
    q_lora_rank: int = 256
    kv_lora_rank: int = 512  # as every real MLA model (and test-llama-archs.cpp)
    qk_nope_head_dim: int = 256
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    n_expert_shared: int = 1
    leading_dense_blocks: int = 1  # GLM-4.7-Flash's first_k_dense_replace
    expert_weights_scale: float = 1.8  # its routed_scaling_factor
    rope_freq_base: float = 1e6
    rms_eps: float = 1e-5

    @property
    def k_head_mla(self) -> int:
        """``key_length_mla``: a query/key head once decompressed (nope + rope)."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def k_head_cache(self) -> int:
        """``key_length``: the cached row, latent + rope (MLA runs as MQA over it)."""
        return self.kv_lora_rank + self.qk_rope_head_dim


MLA = MlaDims()


def mla_attention(p: str, d: Dims, m: MlaDims) -> list[TensorLayout]:
    """The MLA attention of one block, split ``attn_k_b`` / ``attn_v_b`` as the converter writes it."""
    n = d.n_embd
    return [
        norm(p + "attn_q_a_norm.weight", m.q_lora_rank),
        norm(p + "attn_kv_a_norm.weight", m.kv_lora_rank),
        weight(p + "attn_q_a.weight", (n, m.q_lora_rank), in_std(n)),
        weight(p + "attn_q_b.weight", (m.q_lora_rank, m.n_head * m.k_head_mla), in_std(m.q_lora_rank)),
        weight(p + "attn_kv_a_mqa.weight", (n, m.k_head_cache), in_std(n)),
        weight(p + "attn_k_b.weight", (m.qk_nope_head_dim, m.kv_lora_rank, m.n_head), in_std(m.qk_nope_head_dim)),
        weight(p + "attn_v_b.weight", (m.kv_lora_rank, m.v_head_dim, m.n_head), in_std(m.kv_lora_rank)),
        out_proj(p + "attn_output.weight", m.n_head * m.v_head_dim, n),
    ]


def mla_hyperparameters(spec: SynthSpec, d: Dims, m: MlaDims) -> list[HParam]:
    """What ``Glm4MoeLiteModel.set_gguf_parameters`` writes besides the common keys: one KV head
    (MLA runs as MQA), the cached (``key_length``/``value_length``) and decompressed (``*_mla``) head
    sizes, the ranks, and the routing of the experts."""
    return [
        ("feed_forward_length", d.n_ff), ("attention.head_count", m.n_head), ("attention.head_count_kv", 1),
        ("rope.freq_base", m.rope_freq_base), ("attention.layer_norm_rms_epsilon", m.rms_eps),
        ("expert_count", d.n_expert), ("expert_used_count", d.n_expert_used),
        ("expert_group_count", 1), ("expert_group_used_count", 1), ("expert_gating_func", EXPERT_GATING_SIGMOID),
        ("leading_dense_block_count", m.leading_dense_blocks), ("vocab_size", len(build_vocab(spec.shape))),
        ("attention.q_lora_rank", m.q_lora_rank), ("attention.kv_lora_rank", m.kv_lora_rank),
        ("attention.key_length", m.k_head_cache), ("attention.value_length", m.kv_lora_rank),
        ("attention.key_length_mla", m.k_head_mla), ("attention.value_length_mla", m.v_head_dim),
        ("expert_feed_forward_length", d.n_ff_exp), ("expert_shared_count", m.n_expert_shared),
        ("expert_weights_scale", m.expert_weights_scale), ("expert_weights_norm", True),
        ("rope.dimension_count", m.qk_rope_head_dim),
    ]


class DeepSeek2(SynthArch):
    """``deepseek2``: leading dense block(s), then MoE blocks; the MTP block is MoE."""

    name = "deepseek2"
    source = "src/models/deepseek2.cpp"

    def hyperparameters(self, spec: SynthSpec) -> list[HParam]:
        d = self.dims(spec)
        return common_hyperparameters(spec, d) + mla_hyperparameters(spec, d, MLA)

    def _block(self, il: int, spec: SynthSpec, moe: bool) -> list[TensorLayout]:
        d, p = self.dims(spec), f"blk.{il}."
        out = [norm(p + "attn_norm.weight", d.n_embd)] + mla_attention(p, d, MLA)
        out.append(norm(p + "ffn_norm.weight", d.n_embd))
        return out + (biased_moe_ffn(p, d, d.n_ff_exp * MLA.n_expert_shared) if moe else dense_ffn(p, d))

    def trunk_block(self, il: int, spec: SynthSpec) -> list[TensorLayout]:
        return self._block(il, spec, moe=il >= MLA.leading_dense_blocks)

    def mtp_block(self, il: int, spec: SynthSpec) -> list[TensorLayout]:
        # always MoE: graph_mtp asserts it, and the block follows >= 1 trunk block, so it is past
        # the leading dense one (il is 0 when spec.mtp_block_suffixes lists the names)
        return self._block(il, spec, moe=True)


ARCHES = (DeepSeek2(),)
