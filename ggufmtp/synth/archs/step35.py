"""Step-3.5 (``step35``, e.g. Step-3.5-Flash): interleaved sliding-window / full attention with a
head-wise attention gate, leading dense FFN blocks then MoE blocks (sigmoid router with a selection
bias, an ungated shared expert), and SEVERAL chained MTP heads -- one per draft step.

Layout (names and shapes from ``src/models/step35.cpp`` and ``conversion/step3.py`` at 0c1e570)
-----------------------------------------------------------------------------------------------
``layers`` trunk blocks, then ``mtp_layers`` MTP blocks ``blk.<layers> .. blk.<layers+mtp_layers-1>``
(``nextn_predict_layers = mtp_layers``; the real model has 3: ``blk.45``-``blk.47``). Trunk block
``il`` is full attention when ``il % 4 == 0`` and sliding-window otherwise (Step-3.5-Flash's
``layer_types``); the MTP blocks are sliding-window blocks with a dense FFN, as the public Step-3.5
MTP ports describe the checkpoint's layers 45-47 (the converter copies the checkpoint's
``layer_types``, padding missing MTP entries with full attention). Block 0 is dense (``leading_dense_block_count`` 1),
the other trunk blocks MoE. Every block
has ``attn_q/k/v/output``, per-head ``attn_q_norm``/``attn_k_norm`` and the head-wise gate
``attn_gate`` ``{n_embd, n_head_l}``; the head count differs between full and sliding layers, so
``attention.head_count`` is a per-layer array, as the converter writes it. ``rope.dimension_count``
is absent (the loader halves the head dim for full layers: partial rotary factor 0.5 / 1.0). The
converter keeps every MTP layer's own ``shared_head`` (norm and output projection) and
``embed_tokens``, so each MTP block carries ``nextn.shared_head_head`` (here equal to ``output``)
and ``nextn.embed_tokens`` (``token_embd`` with the knob's corrupted rows) at every ``f``. F32 for 1-D tensors,
``ffn_gate_inp`` and ``exp_probs_b.bias``; BF16 for matrices.

Chained heads (``common/speculative.cpp``, ``common_speculative_impl_draft_mtp``, 0c1e570)
------------------------------------------------------------------------------------------
With ``nextn_predict_layers > 1`` the draft loop runs in ``chain_heads`` mode: draft step ``i``
runs the MTP graph of head ``i`` (``llama_set_nextn_layer_offset``), re-decoding the whole draft
prefix under that head, and the draft length is capped at the number of heads::

    n_max = min(--spec-draft-n-max, nextn_predict_layers)      # only when nextn_predict_layers > 1

So a 3-head file at ``--spec-draft-n-max 4`` drafts at most 3 tokens per step, and a 2-head file at
the default 3 drafts 2. One head (``mtp_layers=1``) is the ordinary single-head loop, uncapped (it
re-runs that one head for every step). Every head here is the same (tensors.py writes identical
``nextn`` tensors and the same corrupted ``embed_tokens`` into each block), so each head drafts
``s(c(x))`` and the replies' ``(draft_n, draft_n_accepted)`` are exactly
``simulate_acceptance(spec, last, n, k)``, which applies the cap
(:func:`ggufmtp.synth.chain.effective_draft_n_max`) and, given ``head_successors``, replays heads
that differ (one draft successor table per head); ``tests/test_arch_step35.py`` pins both against
llama-server, the second on a file whose first head is patched clean while the others stay corrupted. Cost, not behaviour: after
each verification the draft context catches up by running EVERY head over the verified tokens,
and draft step ``i`` re-decodes ``i + 1`` rows, so drafting work grows with the head count. An
MTP-only sidecar (``mtp_only``, ``--spec-draft-model`` next to an ``mtp=False`` trunk) chains its
heads the same way. Measured at 0c1e570 on the CPU runtime: no crash with 1-3 heads, with a
32-token window slid by 300-token replies.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..layout import BF16, DIMS, F32, SHAPE_TINY, Constructed, Dims, TensorLayout
from .base import HParam, SynthArch, SynthSpec, common_hyperparameters, in_std, norm, qk_norm_attention, weight
from .qwen35 import dense_ffn, moe_ffn

#: Step-3.5-Flash's MTP heads (``num_nextn_predict_layers``); llama.cpp chains all of them.
STEP35_MTP_LAYERS = 3
#: full attention every 4th layer from layer 0 (Step-3.5-Flash ``layer_types``), sliding otherwise
FULL_ATTENTION_EVERY = 4
#: ``LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID`` (``src/llama-hparams.h``): Step-3.5's router
GATING_SIGMOID = 2


@dataclass(frozen=True)
class Step35Dims(Dims):
    """The shared tiny dims plus Step-3.5's own: sliding layers' head count, window and RoPE base.

    Query widths ``head_dim * n_head`` are 256 (full) and 512 (sliding), ``attn_output``'s rows
    too: multiples of 256 so k-quants apply. The window is 32 tokens (Step-3.5-Flash: 512) so that
    a test's 64-token reply already slides it, in the trunk and in the chained heads alike."""

    n_head_swa: int = 4
    sliding_window: int = 32
    rope_freq_base_swa: float = 10000.0
    leading_dense: int = 1
    swiglu_limit: float = 7.0


def step35_dims(base: Dims) -> Step35Dims:
    """``base`` (the shape's dims) as :class:`Step35Dims`, with Step-3.5's RoPE base and norm eps."""
    shared = {f.name: getattr(base, f.name) for f in dataclasses.fields(Dims)}
    shared.update(rope_freq_base=5e6, rms_eps=1e-5)
    return Step35Dims(**shared)


def is_sliding(il: int, spec: SynthSpec) -> bool:
    """Trunk block ``il`` is sliding-window unless ``il % 4 == 0``; MTP blocks are sliding."""
    return il >= spec.layers or il % FULL_ATTENTION_EVERY != 0


def is_moe(il: int, spec: SynthSpec, d: Step35Dims) -> bool:
    """Trunk blocks after the leading dense ones are MoE; MTP blocks are dense."""
    return d.leading_dense <= il < spec.layers


def gated_attention(p: str, d: Step35Dims, n_head: int) -> list[TensorLayout]:
    """Attention with per-head Q/K norms and the head-wise gate ``attn_gate`` (``g_proj``)."""
    return qk_norm_attention(p, d, n_head) + [weight(p + "attn_gate.weight", (d.n_embd, n_head), in_std(d.n_embd))]


def step35_moe(p: str, d: Step35Dims) -> list[TensorLayout]:
    """Qwen's routed experts and shared expert without its gate (Step-3.5's shared expert is always
    added), plus the router's selection bias ``exp_probs_b.bias`` (``moe.router_bias``)."""
    experts = [t for t in moe_ffn(p, d) if not t.name.endswith("ffn_gate_inp_shexp.weight")]
    return experts + [weight(p + "exp_probs_b.bias", (d.n_expert,), 0.1, F32)]


class Step35(SynthArch):
    """``step35``: Step-3.5 with ``mtp_layers`` chained MTP heads."""

    name = "step35"
    source = "src/models/step35.cpp"
    shapes = (SHAPE_TINY,)
    max_mtp_layers = STEP35_MTP_LAYERS

    def dims(self, spec: SynthSpec) -> Step35Dims:
        return step35_dims(DIMS[spec.shape])

    def hyperparameters(self, spec: SynthSpec) -> list[HParam]:
        d = self.dims(spec)
        blocks = range(spec.layers + spec.n_mtp_blocks)
        swa = [is_sliding(il, spec) for il in blocks]
        # the converter's per-layer SwiGLU clamps: MoE layers clamped, dense and MTP layers not (0.0)
        clamps = [d.swiglu_limit if is_moe(il, spec, d) else 0.0 for il in blocks]
        return common_hyperparameters(spec, d) + [
            ("feed_forward_length", d.n_ff),
            ("attention.head_count", [d.n_head_swa if s else d.n_head for s in swa]),
            ("attention.head_count_kv", [d.n_head_kv for _ in swa]),
            ("rope.freq_base", float(d.rope_freq_base)),
            ("rope.freq_base_swa", float(d.rope_freq_base_swa)),
            ("attention.layer_norm_rms_epsilon", float(d.rms_eps)),
            ("expert_count", d.n_expert), ("expert_used_count", d.n_expert_used),
            ("expert_gating_func", GATING_SIGMOID),
            ("attention.key_length", d.head_dim), ("attention.value_length", d.head_dim),
            ("attention.sliding_window", d.sliding_window),
            ("attention.sliding_window_pattern", swa),
            ("expert_feed_forward_length", d.n_ff_exp), ("expert_shared_feed_forward_length", d.n_ff_shexp),
            ("expert_weights_scale", 1.0), ("expert_weights_norm", True),
            ("leading_dense_block_count", d.leading_dense), ("moe_every_n_layers", 1),
            ("swiglu_clamp_exp", clamps), ("swiglu_clamp_shexp", clamps),
        ]

    def _block(self, il: int, spec: SynthSpec) -> list[TensorLayout]:
        d, p = self.dims(spec), f"blk.{il}."
        n_head = d.n_head_swa if is_sliding(il, spec) else d.n_head
        out = [norm(p + "attn_norm.weight", d.n_embd)] + gated_attention(p, d, n_head)
        out.append(norm(p + "ffn_norm.weight", d.n_embd))
        return out + (step35_moe(p, d) if is_moe(il, spec, d) else dense_ffn(p, d))

    def trunk_block(self, il: int, spec: SynthSpec) -> list[TensorLayout]:
        return self._block(il, spec)

    def mtp_block(self, il: int, spec: SynthSpec) -> list[TensorLayout]:
        return self._block(il, spec)

    def nextn(self, il: int, spec: SynthSpec, n_vocab: int, embed_tokens: bool) -> list[TensorLayout]:
        """The ``nextn.*`` tensors with each head's own ``embed_tokens`` (always: step35 files carry
        one per MTP layer; ``token_embd``'s rows when nothing is corrupted) and output projection
        ``shared_head_head`` (the checkpoint's ``transformer.shared_head.output``), equal to
        ``output`` so every head keeps the trunk's bigram head."""
        head = TensorLayout(f"blk.{il}.nextn.shared_head_head.weight", (self.dims(spec).n_embd, n_vocab), BF16,
                            Constructed.OUTPUT)
        return super().nextn(il, spec, n_vocab, True) + [head]


ARCHES = (Step35(),)
