"""Hy3 (Tencent Hunyuan 3, ``HYV3ForCausalLM``): ``hy_v3``.

Layout (names and shapes from ``src/models/hy-v3.cpp`` and ``conversion/hunyuan.py`` (``HYV3Model``)
at 0c1e570): ``layers`` trunk blocks, then ONE MTP block ``blk.<layers>`` (``nextn_predict_layers``
1). Every block is a pre-norm transformer block: ``attn_norm``, separate ``attn_q/k/v`` with
per-head ``attn_q_norm``/``attn_k_norm`` (RMS, before RoPE; NEOX rotation over the whole head:
no ``rope.dimension_count``, the graph asserts ``n_rot == head_dim``), ``attn_output``,
``ffn_norm``, then a dense SwiGLU FFN in the leading block (``first_k_dense_replace`` 1) and MoE
in the others: sigmoid router (``ffn_gate_inp``, F32) with the selection bias ``exp_probs_b`` and
an ungated shared expert. The loader decides dense or MoE per block by which tensors are present
(all of them are optional) and reads no ``leading_dense_block_count``; the converter writes none.

Two quirks of the pinned loader: the router bias is ``blk.N.exp_probs_b`` WITHOUT the ``.bias``
suffix every other MoE arch uses (``tn(LLM_TENSOR_FFN_EXP_PROBS_B, i)``; a ``.bias`` tensor would
be left over and fail the load), and the MTP block is a complete decoder block (MoE here, like the
blocks it follows) whose trailing ``final_layernorm`` the converter renames to
``nextn.shared_head_norm``. The real checkpoint has no MTP ``embed_tokens`` / ``shared_head.head``
(the graph falls back to ``token_embd`` / ``output``), so ``nextn.embed_tokens`` is written only
when a knob needs it (``wrong_successor_fraction`` or ``head_margin`` > 0), as for qwen35moe.

The MTP graph (``graph_mtp``) is the synth recipe's: ``concat(enorm(embed), hnorm(h))`` with the
embedding first, ``h`` the trunk's post-``output_norm`` hidden state (RMS norms throughout), so
``eh_proj = [I | 0]`` passes the embedding through. F32 for 1-D tensors, ``ffn_gate_inp`` and
``exp_probs_b``; BF16 for matrices.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..layout import DIMS, SHAPE_TINY, Dims, TensorLayout
from .base import HParam, SynthArch, SynthSpec, biased_moe_ffn, common_hyperparameters, norm, qk_norm_attention
from .qwen35 import dense_ffn

#: ``LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID`` (``src/llama-hparams.h``): what the converter writes
GATING_SIGMOID = 2


@dataclass(frozen=True)
class HyV3Config:
    """What Hy3's ``config.json`` sets besides :class:`Dims`' widths, as ``HYV3Model`` writes it."""

    n_layer_dense_lead: int = 1  # first_k_dense_replace: blk.0 dense, later blocks (and the MTP block) MoE
    n_expert_shared: int = 1  # num_shared_experts: shared width = moe_intermediate_size * this
    expert_weights_scale: float = 1.0  # router_scaling_factor
    expert_weights_norm: bool = True  # route_norm


HY = HyV3Config()

#: the tiny widths with a norm epsilon of 1e-5 (the rotation is over the whole 128-wide head)
HY_TINY = dataclasses.replace(DIMS[SHAPE_TINY], rms_eps=1e-5)


def hy_moe_ffn(p: str, d: Dims) -> list[TensorLayout]:
    """The DeepSeek-style MoE of :func:`biased_moe_ffn`, its selection bias named as hy_v3's loader
    asks for it: ``exp_probs_b`` without the ``.bias`` suffix."""
    return [t._replace(name=p + "exp_probs_b") if t.name == p + "exp_probs_b.bias" else t
            for t in biased_moe_ffn(p, d, d.n_ff_exp * HY.n_expert_shared)]


class HyV3(SynthArch):
    """``hy_v3``: one leading dense block, then MoE blocks; one MoE MTP block."""

    name = "hy_v3"
    source = "src/models/hy-v3.cpp"
    shapes = (SHAPE_TINY,)
    max_mtp_layers = 1  # one head, as the converter writes it (graph_mtp could chain more by nextn_layer_offset)

    def dims(self, spec: SynthSpec) -> Dims:
        return HY_TINY

    def hyperparameters(self, spec: SynthSpec) -> list[HParam]:
        d = self.dims(spec)
        return common_hyperparameters(spec, d) + [
            ("feed_forward_length", d.n_ff),  # the leading dense block's FFN
            ("attention.head_count", d.n_head), ("attention.head_count_kv", d.n_head_kv),
            ("rope.freq_base", float(d.rope_freq_base)), ("attention.layer_norm_rms_epsilon", float(d.rms_eps)),
            ("expert_count", d.n_expert), ("expert_used_count", d.n_expert_used),
            ("attention.key_length", d.head_dim), ("attention.value_length", d.head_dim),
            ("expert_feed_forward_length", d.n_ff_exp),
            ("expert_shared_feed_forward_length", d.n_ff_exp * HY.n_expert_shared),
            ("expert_weights_norm", HY.expert_weights_norm), ("expert_weights_scale", HY.expert_weights_scale),
            ("expert_gating_func", GATING_SIGMOID),
        ]

    def _block(self, il: int, spec: SynthSpec, moe: bool) -> list[TensorLayout]:
        d, p = self.dims(spec), f"blk.{il}."
        out = [norm(p + "attn_norm.weight", d.n_embd)] + qk_norm_attention(p, d)
        out.append(norm(p + "ffn_norm.weight", d.n_embd))
        return out + (hy_moe_ffn(p, d) if moe else dense_ffn(p, d))

    def trunk_block(self, il: int, spec: SynthSpec) -> list[TensorLayout]:
        return self._block(il, spec, moe=il >= HY.n_layer_dense_lead)

    def mtp_block(self, il: int, spec: SynthSpec) -> list[TensorLayout]:
        # MoE whatever ``il`` (spec.mtp_block_suffixes asks for block 0 to list the omittable tensors)
        return self._block(il, spec, moe=True)


ARCHES = (HyV3(),)
