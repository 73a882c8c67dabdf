"""Cohere2 MoE (``Cohere2MoeForCausalLM``): ``cohere2moe``.

Layout (names and shapes from ``src/models/cohere2moe.cpp`` and ``conversion/command_r.py``
(``Cohere2MoeModel``) at 0c1e570): ``layers`` trunk blocks, then ONE MTP block ``blk.<layers>``
(``nextn_predict_layers`` 1; the graph asserts one). Cohere's PARALLEL block: one ``attn_norm``
feeds both the attention (``attn_q/k/v``, ``attn_output``; no bias, no Q/K norm) and the FFN, and
the residual adds both (``inpL + attn_out + ffn_out``); there is no ``ffn_norm``. Block 0 has a
dense SwiGLU FFN (``leading_dense_block_count`` 1), the others routed experts (sigmoid router,
``ffn_gate_inp`` F32, no selection bias) plus one ungated shared expert, the two AVERAGED
(``(moe + shexp) * 0.5``). Trunk attention interleaves 3 sliding-window layers with 1 global one
(Command R7B's ``layer_types``; ``sliding_window_pattern`` is a per-layer bool array the converter
writes for the trunk only, so the MTP block reads as global); global layers use no RoPE except in
the leading dense block, sliding layers and the MTP block always rotate (whole head, NORM). The
window is 32 tokens (Command R7B: 4096) so a test's reply already slides it.

Norms are LayerNorm, not RMSNorm: HF's config has ``layer_norm_eps``, the converter writes
``attention.layer_norm_epsilon`` and no RMS epsilon, so the graphs use ``LLM_NORM`` (mean-centred,
weight only, no bias tensor). The MTP graph keeps the synth recipe's order, ``concat(enorm(embed),
hnorm(h))`` with ``h`` the trunk's post-``output_norm`` state, so ``eh_proj = [I | 0]`` still
passes ``LN(embed)`` through, and the head's output is ``LN(LN(embed) + ~1e-2)``, the trunk's
``LN(embed + ~1e-2)`` to within the blocks' writes: trunk and head agree as under RMSNorm (the
embeddings' mean over the width is ~0, so centring moves a logit by ~0.1 of a 24-logit margin).

Logit scaling: both graphs multiply the logits by ``logit_scale`` (0.25, Command R7B's). The
``output`` rows are written divided by it, so the scaled logits are the recipe's (successor at
``logit_scale`` of the spec, 24 by default) and the knobs keep their meaning (``head_margin`` in
logits, the softness of ``logit_scale``); greedy decoding would pick the same chain either way.
``nextn.embed_tokens`` is written only when a knob needs it (the loader treats it, like
``shared_head_head`` / ``shared_head_norm``, as optional and falls back to ``token_embd``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..layout import DIMS, SHAPE_TINY, Computed, Dims, TensorLayout
from .base import HParam, SynthArch, SynthSpec, biased_moe_ffn, common_hyperparameters, in_std, norm, out_proj, weight
from .qwen35 import dense_ffn

if TYPE_CHECKING:
    from ..tensors import TensorBuilder


@dataclass(frozen=True)
class CohereConfig:
    """What the Cohere2 MoE ``config.json`` sets besides :class:`Dims`' widths, as
    ``Cohere2MoeModel.set_gguf_parameters`` writes it."""

    logit_scale: float = 0.25  # Command R7B's; the graphs scale every logit by it
    sliding_window: int = 32
    sliding_every: int = 4  # layer_types: 3 sliding then 1 global, repeating
    n_layer_dense_lead: int = 1  # mlp_layer_types / first_k_dense_replace
    n_expert_shared: int = 1  # num_shared_experts ("average" combination)
    norm_eps: float = 1e-5  # layer_norm_eps
    rope_freq_base: float = 50000.0


COHERE = CohereConfig()
COHERE_TINY = dataclasses.replace(DIMS[SHAPE_TINY], rope_freq_base=COHERE.rope_freq_base, rms_eps=COHERE.norm_eps)


def is_sliding(il: int, spec: SynthSpec) -> bool:
    """Trunk block ``il`` is sliding-window unless it closes a group of 4; the MTP block is global."""
    return il < spec.layers and (il + 1) % COHERE.sliding_every != 0


def plain_attention(p: str, d: Dims) -> list[TensorLayout]:
    """Separate ``attn_q/k/v`` and ``attn_output``: no bias (the converter drops Cohere's zero
    biases), no Q/K norm."""
    n, hq, hkv, w = d.n_embd, d.head_dim * d.n_head, d.head_dim * d.n_head_kv, in_std(d.n_embd)
    return [weight(p + "attn_q.weight", (n, hq), w), weight(p + "attn_k.weight", (n, hkv), w),
            weight(p + "attn_v.weight", (n, hkv), w), out_proj(p + "attn_output.weight", hq, n)]


def cohere_moe_ffn(p: str, d: Dims) -> list[TensorLayout]:
    """Routed experts (sigmoid router) and an ungated shared expert: :func:`biased_moe_ffn` without
    the selection bias, which cohere2moe's graph does not take."""
    return [t for t in biased_moe_ffn(p, d, d.n_ff_exp * COHERE.n_expert_shared) if not t.name.endswith("exp_probs_b.bias")]


def scaled_output(builder: TensorBuilder) -> np.ndarray:
    """``output``'s rows divided by ``logit_scale``: the graphs' scaling gives the recipe's logits back."""
    return builder.output_rows() / COHERE.logit_scale


class Cohere2Moe(SynthArch):
    """``cohere2moe``: parallel LayerNorm blocks, a leading dense block then MoE; one MTP block."""

    name = "cohere2moe"
    source = "src/models/cohere2moe.cpp"
    shapes = (SHAPE_TINY,)
    max_mtp_layers = 1  # graph_mtp asserts n_layer_nextn == 1

    def dims(self, spec: SynthSpec) -> Dims:
        return COHERE_TINY

    def hyperparameters(self, spec: SynthSpec) -> list[HParam]:
        d = self.dims(spec)
        return common_hyperparameters(spec, d) + [
            ("feed_forward_length", d.n_ff),  # the leading dense block's FFN
            ("attention.head_count", d.n_head), ("attention.head_count_kv", d.n_head_kv),
            ("rope.freq_base", float(d.rope_freq_base)), ("attention.layer_norm_epsilon", float(d.rms_eps)),
            ("expert_count", d.n_expert), ("expert_used_count", d.n_expert_used),
            ("attention.key_length", d.head_dim), ("attention.value_length", d.head_dim),
            ("logit_scale", COHERE.logit_scale), ("attention.sliding_window", COHERE.sliding_window),
            ("attention.sliding_window_pattern", [is_sliding(il, spec) for il in range(spec.layers)]),
            ("expert_feed_forward_length", d.n_ff_exp), ("leading_dense_block_count", COHERE.n_layer_dense_lead),
            ("expert_weights_norm", False),  # norm_topk_prob's default
            ("expert_shared_count", COHERE.n_expert_shared),
            ("expert_shared_feed_forward_length", d.n_ff_exp * COHERE.n_expert_shared),
            ("rope.dimension_count", d.head_dim), ("rope.scaling.type", "none"),
        ]

    def global_tensors(self, spec: SynthSpec, n_vocab: int) -> list[TensorLayout]:
        return [t._replace(init=Computed(scaled_output)) if t.name == "output.weight" else t
                for t in super().global_tensors(spec, n_vocab)]

    def _block(self, il: int, spec: SynthSpec, moe: bool) -> list[TensorLayout]:
        d, p = self.dims(spec), f"blk.{il}."
        out = [norm(p + "attn_norm.weight", d.n_embd)] + plain_attention(p, d)
        return out + (cohere_moe_ffn(p, d) if moe else dense_ffn(p, d))

    def trunk_block(self, il: int, spec: SynthSpec) -> list[TensorLayout]:
        return self._block(il, spec, moe=il >= COHERE.n_layer_dense_lead)

    def mtp_block(self, il: int, spec: SynthSpec) -> list[TensorLayout]:
        # always MoE: graph_mtp asserts ffn_gate_inp (il is 0 when spec.mtp_block_suffixes lists names)
        return self._block(il, spec, moe=True)


ARCHES = (Cohere2Moe(),)
