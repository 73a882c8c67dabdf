"""Xiaomi MiMo-V2 (``mimo2``: MiMo-V2-Flash, V2.5, V2.5-Pro): hybrid sliding-window / full attention
with attention sinks, a leading dense block then sigmoid-routed MoE blocks without shared experts,
and up to THREE chained MTP heads.

Layout (``src/models/mimo2.cpp`` and ``conversion/mimo.py`` ``MimoV2Model`` at 0c1e570)
--------------------------------------------------------------------------------------
``layers`` trunk blocks, then ``mtp_layers`` MTP blocks ``blk.<layers> ..`` (the checkpoints ship
3, ``model.mtp.layers.{0,1,2}``, which the converter appends as blocks; ``nextn_predict_layers`` =
their count). Trunk block ``il`` is full attention when ``il % 6 == 0`` and sliding-window
otherwise (MiMo-V2's 5 sliding : 1 full interleave; ``attention.sliding_window_pattern`` is the
per-layer array, with the MTP blocks appended as sliding, as the converter writes it); the window
is 32 tokens (the real 128) so that a test's reply slides it. Q/K heads are 192 wide (64 of them
rotated: ``partial_rotary_factor`` 0.334), V heads 128 (``attention.value_length``); the KV head
count differs between full and sliding layers (``attention.head_count_kv`` per layer, 1 and 2 here),
so the fused ``attn_qkv`` {n_embd, q + k + v} is wider in sliding blocks. The MTP graph asserts
the fused ``attn_qkv`` (the trunk graph would take split Q/K/V too), so every block carries it.
Sliding blocks carry ``attn_sinks`` {n_head} (MiMo-V2's ``add_swa_attention_sink_bias``; the full
layers have none), and ``attention.value_scale`` 0.707 scales every attention output. Block 0 has a
dense SiLU FFN, the other trunk blocks MoE (``ffn_gate_inp`` + ``exp_probs_b``, F32; gated
experts); the MTP blocks are sliding-window blocks with a dense FFN (the graph asserts
``ffn_gate/up/down``, of ``feed_forward_length``). Each MTP block holds ``nextn.eh_proj/enorm/hnorm``,
``nextn.embed_tokens`` when the knob corrupts successors, and ``layer_output_norm`` as its head
norm: the checkpoint's ``final_layernorm``, which the converter maps to ``LAYER_OUT_NORM``, not to
``nextn.shared_head_norm`` (the graph takes ``shared_head_norm``, then ``layer_output_norm``, then
``output_norm``). No ``shared_head_head``: the head falls back to ``output``.

The head's hidden input is the trunk's last residual before ``output_norm`` (the MTP graph
``hnorm``-s it itself), and the concat is ``[enorm(embed) ; hnorm(hidden)]``, as the recipe assumes.
With several heads, draft step ``i`` runs head ``i`` (``chain_heads`` in ``common/speculative.cpp``,
as for step35), so a draft is at most ``nextn_predict_layers`` long
(:func:`ggufmtp.synth.chain.effective_draft_n_max`). No recurrent state: partial rollback in place.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..layout import DIMS, F32, Dims, Normal, TensorLayout
from .base import HParam, SynthArch, SynthSpec, common_hyperparameters, in_std, norm, out_proj, weight
from .qwen35 import dense_ffn, moe_ffn

#: the MTP heads MiMo-V2 checkpoints ship (``MimoV2Model._n_nextn``); llama.cpp chains all of them
MIMO2_MTP_LAYERS = 3
#: full attention on block 0 and every 6th block after it, sliding-window otherwise
FULL_ATTENTION_EVERY = 6


@dataclass(frozen=True)
class MimoDims(Dims):
    """The tiny dims with MiMo-V2's attention geometry: 192-wide Q/K heads, 128-wide V heads (so
    ``attn_output``'s ``ne0`` is 256), more KV heads in sliding layers, a 32-token window."""

    head_dim_v: int = 128
    n_head_kv_swa: int = 2
    sliding_window: int = 32
    rope_freq_base_swa: float = 10000.0
    value_scale: float = 0.707  # attention_value_scale
    leading_dense: int = 1  # moe_layer_freq[0] == 0


def mimo_dims(base: Dims) -> MimoDims:
    """``base`` as :class:`MimoDims`, with MiMo-V2's head sizes, rope and norm eps."""
    shared = {f.name: getattr(base, f.name) for f in dataclasses.fields(Dims)}
    shared.update(head_dim=192, rope_dims=64, rope_freq_base=5e6, rms_eps=1e-5)
    return MimoDims(**shared)


def is_sliding(il: int, spec: SynthSpec) -> bool:
    """Trunk block ``il`` is sliding-window unless ``il % 6 == 0``; MTP blocks are sliding."""
    return il >= spec.layers or il % FULL_ATTENTION_EVERY != 0


def fused_attention(p: str, d: MimoDims, sliding: bool) -> list[TensorLayout]:
    """The fused ``attn_qkv`` ([Q | K | V] rows, as the converter regroups ``qkv_proj``), the output
    projection, and the sinks of a sliding block."""
    n_kv = d.n_head_kv_swa if sliding else d.n_head_kv
    n, hq, hv = d.n_embd, d.head_dim * d.n_head, d.head_dim_v * d.n_head
    out = [weight(p + "attn_qkv.weight", (n, hq + n_kv * (d.head_dim + d.head_dim_v)), in_std(n)),
           out_proj(p + "attn_output.weight", hv, n)]
    if sliding:
        out.append(TensorLayout(p + "attn_sinks.weight", (d.n_head,), F32, Normal(0.5)))
    return out


def routed_moe(p: str, d: Dims) -> list[TensorLayout]:
    """Qwen's routed experts without any shared expert, plus the sigmoid router's selection bias
    ``exp_probs_b`` (``noaux_tc``'s ``e_score_correction_bias``)."""
    experts = [t for t in moe_ffn(p, d) if "_shexp" not in t.name]
    return experts + [weight(p + "exp_probs_b.bias", (d.n_expert,), 0.01, F32)]


class Mimo2(SynthArch):
    """``mimo2``: MiMo-V2 with ``mtp_layers`` (1-3) chained MTP heads."""

    name = "mimo2"
    source = "src/models/mimo2.cpp"
    max_mtp_layers = MIMO2_MTP_LAYERS

    def dims(self, spec: SynthSpec) -> MimoDims:
        return mimo_dims(DIMS[spec.shape])

    def hyperparameters(self, spec: SynthSpec) -> list[HParam]:
        d = self.dims(spec)
        swa = [is_sliding(il, spec) for il in range(spec.layers + spec.n_mtp_blocks)]
        return common_hyperparameters(spec, d) + [
            ("feed_forward_length", d.n_ff), ("attention.head_count", d.n_head),
            ("attention.head_count_kv", [d.n_head_kv_swa if s else d.n_head_kv for s in swa]),
            ("attention.key_length", d.head_dim), ("attention.value_length", d.head_dim_v),
            ("rope.dimension_count", d.rope_dims), ("rope.freq_base", float(d.rope_freq_base)),
            ("rope.freq_base_swa", float(d.rope_freq_base_swa)),
            ("attention.layer_norm_rms_epsilon", float(d.rms_eps)),
            ("expert_count", d.n_expert), ("expert_used_count", d.n_expert_used),
            ("expert_feed_forward_length", d.n_ff_exp),
            ("attention.sliding_window", d.sliding_window), ("attention.sliding_window_pattern", swa),
            ("attention.value_scale", d.value_scale),
        ]

    def _block(self, il: int, spec: SynthSpec, moe: bool) -> list[TensorLayout]:
        d, p = self.dims(spec), f"blk.{il}."
        out = [norm(p + "attn_norm.weight", d.n_embd)] + fused_attention(p, d, is_sliding(il, spec))
        out.append(norm(p + "ffn_norm.weight", d.n_embd))
        return out + (routed_moe(p, d) if moe else dense_ffn(p, d))

    def trunk_block(self, il: int, spec: SynthSpec) -> list[TensorLayout]:
        return self._block(il, spec, moe=il >= self.dims(spec).leading_dense)

    def mtp_block(self, il: int, spec: SynthSpec) -> list[TensorLayout]:
        # dense: graph_mtp asserts ffn_gate/up/down
        return self._block(il, spec, moe=False)

    def nextn(self, il: int, spec: SynthSpec, n_vocab: int, embed_tokens: bool) -> list[TensorLayout]:
        """The ``nextn.*`` tensors with the head norm as the converter names it, ``layer_output_norm``
        (the checkpoint's ``final_layernorm``), instead of ``nextn.shared_head_norm``."""
        own = [t for t in super().nextn(il, spec, n_vocab, embed_tokens) if ".shared_head_norm." not in t.name]
        return own + [norm(f"blk.{il}.layer_output_norm.weight", self.dims(spec).n_embd)]


ARCHES = (Mimo2(),)
