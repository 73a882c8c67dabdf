"""GLM-4.5 / GLM-4.5-Air: ``glm4moe``.

A trunk of ``leading_dense_block_count`` (1) dense blocks, then MoE blocks (sigmoid routing with an
``exp_probs_b`` selection bias, one shared expert), then ONE NextN block ``blk.<layers>``: a
complete MoE block plus its ``nextn.*`` tensors. Names and shapes from ``src/models/glm4-moe.cpp``
(``load_arch_tensors``, ``graph_mtp``) and ``conversion/glm.py`` (``Glm4MoeModel``) at 0c1e570.

The GLM-4.5-Air layout (``attention_bias``: ``attn_q/k/v.bias``; no ``use_qk_norm``, so no
``attn_q_norm``/``attn_k_norm`` -- GLM-4.5 355B has them, the loader takes either). The shared
expert's width is ``expert_feed_forward_length * expert_shared_count``: the loader reads no
``expert_shared_feed_forward_length`` for this arch and the converter writes none.

The NextN block carries all three optional head tensors, as GLM-4.5's checkpoints do
(``model.layers.N.embed_tokens`` / ``shared_head.head`` / ``shared_head.norm``, which the converter
maps to ``nextn.embed_tokens`` / ``nextn.shared_head_head`` / ``nextn.shared_head_norm``):
``embed_tokens`` is ``token_embd`` with the knob's corrupted rows, ``shared_head_head`` a copy of
``output``. GLM-4.6 ships without ``embed_tokens`` and ``shared_head_head`` (llama.cpp then falls
back to ``token_embd`` / ``output``): ``omit_tensors=("nextn.embed_tokens", "nextn.shared_head_head")``
writes that layout, at ``wrong_successor_fraction`` 0 only (the corrupted rows live in ``embed_tokens``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..layout import BF16, DIMS, F32, SHAPE_TINY, Constructed, Dims, Normal, TensorLayout, nextn_tensors
from .base import HParam, SynthArch, SynthSpec, biased_moe_ffn, common_hyperparameters, in_std, norm, out_proj, weight
from .qwen35 import dense_ffn


@dataclass(frozen=True)
class GlmMoeConfig:
    """What GLM-4.5's ``config.json`` sets besides the per-layer widths of :class:`Dims`, as
    ``Glm4MoeModel.set_gguf_parameters`` writes it (GLM-4.5-Air's values)."""

    n_layer_dense_lead: int = 1  # first_k_dense_replace: blk.0 is dense, the rest (and the NextN block) MoE
    n_expert_shared: int = 1  # n_shared_experts
    expert_weights_scale: float = 1.0  # routed_scaling_factor (2.5 in GLM-4.5 355B)
    expert_weights_norm: bool = True  # norm_topk_prob
    n_expert_groups: int = 1  # n_group / topk_group: one group, so no group-limited routing
    partial_rotary_factor: float = 0.5  # rope.dimension_count = head_dim * 0.5
    gating_func_sigmoid: int = 2  # gguf.ExpertGatingFuncType.SIGMOID


GLM = GlmMoeConfig()

#: the tiny shape's widths with GLM's norm epsilon and rope base; no rope sections: the loader
#: switches to M-RoPE (GLM-4.5V) when ``rope.dimension_sections`` is present
GLM_TINY = dataclasses.replace(DIMS[SHAPE_TINY], rope_freq_base=1e6, rms_eps=1e-5, rope_sections=(0, 0, 0, 0))


def biased_attention(p: str, d: Dims) -> list[TensorLayout]:
    """Separate ``attn_q/k/v`` with F32 biases (``attention_bias``), ``attn_output`` back into the stream."""
    n, hq, hkv, w = d.n_embd, d.head_dim * d.n_head, d.head_dim * d.n_head_kv, in_std(d.n_embd)
    return [
        weight(p + "attn_q.weight", (n, hq), w),
        TensorLayout(p + "attn_q.bias", (hq,), F32, Normal(0.02)),
        weight(p + "attn_k.weight", (n, hkv), w),
        TensorLayout(p + "attn_k.bias", (hkv,), F32, Normal(0.02)),
        weight(p + "attn_v.weight", (n, hkv), w),
        TensorLayout(p + "attn_v.bias", (hkv,), F32, Normal(0.02)),
        out_proj(p + "attn_output.weight", hq, n),
    ]


def glm_moe_hyperparameters(d: Dims) -> list[HParam]:
    """The ``glm4moe.*`` keys past the common ones, in the converter's order."""
    return [
        ("feed_forward_length", d.n_ff),  # intermediate_size: the leading dense blocks' FFN
        ("attention.head_count", d.n_head), ("attention.head_count_kv", d.n_head_kv),
        ("rope.freq_base", float(d.rope_freq_base)), ("attention.layer_norm_rms_epsilon", float(d.rms_eps)),
        ("expert_count", d.n_expert), ("expert_used_count", d.n_expert_used),
        ("expert_group_count", GLM.n_expert_groups), ("expert_group_used_count", GLM.n_expert_groups),
        ("attention.key_length", d.head_dim), ("attention.value_length", d.head_dim),
        ("rope.dimension_count", int(d.head_dim * GLM.partial_rotary_factor)),
        ("expert_feed_forward_length", d.n_ff_exp), ("expert_shared_count", GLM.n_expert_shared),
        ("leading_dense_block_count", GLM.n_layer_dense_lead),
        ("expert_gating_func", GLM.gating_func_sigmoid),
        ("expert_weights_scale", GLM.expert_weights_scale), ("expert_weights_norm", GLM.expert_weights_norm),
    ]


class Glm4Moe(SynthArch):
    """``glm4moe``: GLM-4.5-Air's block layout, one NextN block."""

    name = "glm4moe"
    source = "src/models/glm4-moe.cpp"
    shapes = (SHAPE_TINY,)
    max_mtp_layers = 1  # graph_mtp asserts n_layer_nextn == 1

    def dims(self, spec: SynthSpec) -> Dims:
        return GLM_TINY

    def hyperparameters(self, spec: SynthSpec) -> list[HParam]:
        d = self.dims(spec)
        return common_hyperparameters(spec, d) + glm_moe_hyperparameters(d)

    def _block(self, il: int, spec: SynthSpec, moe: bool) -> list[TensorLayout]:
        d, p = self.dims(spec), f"blk.{il}."
        out = [norm(p + "attn_norm.weight", d.n_embd)] + biased_attention(p, d)
        out.append(norm(p + "post_attention_norm.weight", d.n_embd))
        return out + (biased_moe_ffn(p, d, d.n_ff_exp * GLM.n_expert_shared) if moe else dense_ffn(p, d))

    def trunk_block(self, il: int, spec: SynthSpec) -> list[TensorLayout]:
        # the loader decides dense or MoE by block index: il >= n_layer_dense_lead is MoE
        return self._block(il, spec, moe=il >= GLM.n_layer_dense_lead)

    def mtp_block(self, il: int, spec: SynthSpec) -> list[TensorLayout]:
        # always MoE: its index (layers >= 1) is past the leading dense block; not decided from
        # ``il`` because spec.mtp_block_suffixes asks for block 0 to list the omittable tensors
        return self._block(il, spec, moe=True)

    def nextn(self, il: int, spec: SynthSpec, n_vocab: int, embed_tokens: bool) -> list[TensorLayout]:
        """All three optional head tensors, whatever the knobs (GLM-4.5's checkpoints carry them)."""
        n = self.dims(spec).n_embd
        head = TensorLayout(f"blk.{il}.nextn.shared_head_head.weight", (n, n_vocab), BF16, Constructed.OUTPUT)
        return nextn_tensors(il, n, n_vocab, embed_tokens=True) + [head]


ARCHES = (Glm4Moe(),)
