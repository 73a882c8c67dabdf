"""What an architecture module provides to the synthesizer (:class:`SynthArch`), and the
tensor-layout helpers they share.

The synthetic models of every architecture follow the same recipe (see :mod:`ggufmtp.synth`):
``token_embd`` / ``output`` carry a bigram chain, every block writes ~1e-2 of the signal back into
the residual stream, and each MTP block's ``nextn.eh_proj`` is ``[I | 0]`` over
``concat(enorm(embed), hnorm(hidden))`` -- the order every MTP graph of llama.cpp 0c1e570 uses
(``src/models/<arch>.cpp``). An architecture module only says which tensors a block holds, with
which shapes, and which ``<arch>.*`` keys the loader reads.
"""

from __future__ import annotations

import math
from typing import Protocol

from ..layout import BF16, DIMS, F32, RESIDUAL_SCALE, SHAPE_TINY, Const, Dims, Normal, TensorLayout, global_tensors


class SynthSpec(Protocol):
    """What an architecture reads of a :class:`ggufmtp.synth.spec.SynthSpec` (not imported: the
    spec validates itself against the architectures)."""

    arch: str
    shape: str
    layers: int
    mtp_only: bool

    @property
    def n_mtp_blocks(self) -> int: ...

    @property
    def mtp_blocks(self) -> list[int]: ...


#: A ``<arch>.*`` hyperparameter: ints are written as uint32, floats as float32, lists as arrays.
HParam = tuple[str, "int | float | bool | str | list[int] | list[float] | list[bool]"]


class SynthArch:
    """One architecture the synthesizer writes. Subclasses set :attr:`name` and implement
    :meth:`hyperparameters`, :meth:`trunk_block` and :meth:`mtp_block`."""

    name: str = ""
    #: shapes this architecture can be written in (the real Qwen3.6 shapes are qwen35moe's and qwen35's only)
    shapes: tuple[str, ...] = (SHAPE_TINY,)
    #: how many MTP blocks a model of this architecture may carry (step35 chains several)
    max_mtp_layers: int = 1
    #: how llama.cpp's graph source names it, for error messages and the README table
    source: str = ""
    #: whether llama-server rolls a partly rejected draft back in place (no recurrent state, or
    #: ``llm_arch_supports_rs_rollback``); False: it restores a checkpoint and replays the accepted
    #: tokens, which shifts the next draft by one token (:func:`ggufmtp.synth.chain.simulate_acceptance`)
    partial_rollback: bool = True

    def dims(self, spec: SynthSpec) -> Dims:
        """Per-layer dimensions (the shape's; subclasses may adjust)."""
        return DIMS[spec.shape]

    def hyperparameters(self, spec: SynthSpec) -> list[HParam]:
        """``<arch>.*`` keys (without the prefix) in file order, ``block_count`` and
        ``nextn_predict_layers`` included (see :func:`common_hyperparameters`)."""
        raise NotImplementedError

    def trunk_block(self, il: int, spec: SynthSpec) -> list[TensorLayout]:
        """The tensors of trunk block ``il``."""
        raise NotImplementedError

    def mtp_block(self, il: int, spec: SynthSpec) -> list[TensorLayout]:
        """The transformer-block tensors of MTP block ``il`` (its ``nextn.*`` tensors come from
        :meth:`nextn`)."""
        raise NotImplementedError

    def global_tensors(self, spec: SynthSpec, n_vocab: int) -> list[TensorLayout]:
        """``token_embd``, ``output_norm``, ``output`` (:func:`~ggufmtp.synth.layout.global_tensors`);
        an architecture whose MTP head has no ``nextn.embed_tokens`` to carry the knob builds its own
        (bailingmoe3)."""
        return global_tensors(self.dims(spec).n_embd, n_vocab)

    def extra_globals(self, spec: SynthSpec) -> list[TensorLayout]:
        """Tensors outside the blocks besides ``token_embd`` / ``output_norm`` / ``output`` (kept in an
        MTP-only sidecar too: the MTP head uses them); none unless an architecture has its own."""
        return []

    def nextn(self, il: int, spec: SynthSpec, n_vocab: int, embed_tokens: bool) -> list[TensorLayout]:
        """The ``nextn.*`` tensors of MTP block ``il``."""
        from ..layout import nextn_tensors

        return nextn_tensors(il, self.dims(spec).n_embd, n_vocab, embed_tokens)

    def servable(self, spec: SynthSpec) -> bool:
        """Whether llama-server 0c1e570 can run the model on its own."""
        return spec.layers >= 1 and not spec.mtp_only

    def unservable_reason(self, spec: SynthSpec) -> str:
        """Why :meth:`servable` is False (shown by ``ggufmtp synth``)."""
        return "an MTP-only sidecar needs a target model next to it" if spec.mtp_only else ""


# ----------------------------------------------------------------------------- shared helpers


def weight(name: str, ne: tuple[int, ...], std: float, dtype: int = BF16) -> TensorLayout:
    """A gaussian matrix (BF16 unless said otherwise)."""
    return TensorLayout(name, ne, dtype, Normal(std))


def norm(name: str, n: int) -> TensorLayout:
    """An RMS-norm weight of ones (F32, as the converter writes 1-D tensors)."""
    return TensorLayout(name, (n,), F32, Const(1.0))


def out_proj(name: str, n_in: int, n_out: int, n_expert: int = 0, dtype: int = BF16) -> TensorLayout:
    """A projection back into the residual stream (``n_expert`` > 0: one per expert): ~1e-2 of the signal."""
    ne = (n_in, n_out, n_expert) if n_expert else (n_in, n_out)
    return TensorLayout(name, ne, dtype, Normal(RESIDUAL_SCALE / math.sqrt(n_in)))


def in_std(n_embd: int) -> float:
    """The std of a projection out of the residual stream (unit-variance outputs)."""
    return 1.0 / math.sqrt(n_embd)


def qk_norm_attention(p: str, d: Dims, n_head: int | None = None) -> list[TensorLayout]:
    """Separate ``attn_q/k/v`` with per-head RMS ``attn_q_norm``/``attn_k_norm``, no bias, no gate
    (hy_v3; step35 adds its head-wise gate). ``n_head``: the query heads (default ``d.n_head``)."""
    nh = d.n_head if n_head is None else n_head
    n, hq, hkv, w = d.n_embd, d.head_dim * nh, d.head_dim * d.n_head_kv, in_std(d.n_embd)
    return [
        weight(p + "attn_q.weight", (n, hq), w),
        weight(p + "attn_k.weight", (n, hkv), w),
        weight(p + "attn_v.weight", (n, hkv), w),
        out_proj(p + "attn_output.weight", hq, n),
        norm(p + "attn_q_norm.weight", d.head_dim),
        norm(p + "attn_k_norm.weight", d.head_dim),
    ]


def biased_moe_ffn(p: str, d: Dims, n_ff_shared: int) -> list[TensorLayout]:
    """DeepSeek-V3-style MoE (glm4moe, deepseek2): routed experts chosen by sigmoid scores plus the
    selection bias ``exp_probs_b`` (``e_score_correction_bias``; router and bias F32, as the
    converter keeps them), and ungated shared experts of width ``n_ff_shared`` (no
    ``ffn_gate_inp_shexp``, unlike Qwen's)."""
    n, w = d.n_embd, in_std(d.n_embd)
    return [
        weight(p + "ffn_gate_inp.weight", (n, d.n_expert), w, F32),
        weight(p + "exp_probs_b.bias", (d.n_expert,), 0.01, F32),
        weight(p + "ffn_gate_exps.weight", (n, d.n_ff_exp, d.n_expert), w),
        weight(p + "ffn_up_exps.weight", (n, d.n_ff_exp, d.n_expert), w),
        out_proj(p + "ffn_down_exps.weight", d.n_ff_exp, n, d.n_expert),
        weight(p + "ffn_gate_shexp.weight", (n, n_ff_shared), w),
        weight(p + "ffn_up_shexp.weight", (n, n_ff_shared), w),
        out_proj(p + "ffn_down_shexp.weight", n_ff_shared, n),
    ]


def common_hyperparameters(spec: SynthSpec, d: Dims) -> list[HParam]:
    """The keys every architecture's loader reads first: context, width, block counts."""
    return [("context_length", d.ctx), ("embedding_length", d.n_embd),
            ("block_count", spec.layers + spec.n_mtp_blocks), ("nextn_predict_layers", spec.n_mtp_blocks)]
