"""Qwen3-Next: ``qwen3next`` (Qwen3-Next-80B-A3B), the predecessor of ``qwen35moe``.

The same hybrid trunk (3 Gated DeltaNet : 1 gated full attention, ``full_attention_interval`` 4),
the same MoE with a gated shared expert, and one MTP block (a full-attention block plus its
``nextn.*`` tensors). What differs from qwen35moe, read off ``src/models/qwen3next.cpp`` and
``conversion/qwen.py`` (``Qwen3NextModel``) at 0c1e570:

- the linear attention's beta and alpha projections are ONE tensor, ``ssm_ba`` {n_embd,
  2 * n_v_heads} (HF ``in_proj_ba``), where qwen35 has ``ssm_beta`` and ``ssm_alpha``; the
  loader requires it. The converter splits HF's ``in_proj_qkvz`` into ``attn_qkv`` + ``attn_gate``
  (the loader's "optimized path"; the legacy ``ssm_in`` {n_embd, 2*key_dim + 2*value_dim} is
  optional and not written);
- plain NEOX rope: the converter writes no ``rope.dimension_sections`` (Qwen3-Next has no mrope);
- ``feed_forward_length`` (HF ``intermediate_size``) is written although every layer is MoE;
- the loader throws on a file without experts ("cannot have zero experts"): there is no dense variant;
- llama.cpp has no partial recurrent-state rollback for qwen3next (``llm_arch_supports_rs_rollback``
  is false): llama-server checkpoints the target before each draft and, when a draft is not wholly
  accepted, restores the checkpoint and decodes the accepted tokens plus the correction again as a
  "replay" draft, which is not counted as drafted, but verifying it yields one more token. Replies
  are unchanged (lossless), but the next draft starts one token later than in qwen35moe's loop, so
  ``(draft_n, draft_n_accepted)`` differ from qwen35moe's at f > 0 (equal when every draft is
  accepted); :func:`ggufmtp.synth.chain.simulate_acceptance` replays them (``partial_rollback``).
  Upstream: ggml-org/llama.cpp PR #28120 ("enable recurrent-state rollback for qwen3next /
  qwen4exp") was closed in favour of #28123, which adds qwen4exp only.

Every other tensor is qwen35moe's (:mod:`.qwen35` helpers).
"""

from __future__ import annotations

from ..layout import Dims, TensorLayout
from .base import HParam, SynthArch, SynthSpec, common_hyperparameters, in_std, norm, weight
from .qwen35 import (
    full_attention_interval,
    gated_attention,
    moe_ffn,
    moe_hyperparameters,
    qwen_rope_hyperparameters,
    recurrent_mixer,
    ssm_hyperparameters,
)

# qwen35's split beta/alpha projections, which qwen3next fuses into ssm_ba
_SPLIT_BETA_ALPHA = ("ssm_beta.weight", "ssm_alpha.weight")


def linear_attention(p: str, d: Dims) -> list[TensorLayout]:
    """qwen35's Gated DeltaNet mixer with ``ssm_beta`` / ``ssm_alpha`` replaced by the fused
    ``ssm_ba`` (per key head: beta for its value heads, then alpha -- the graph's reshape order)."""
    out: list[TensorLayout] = []
    for t in recurrent_mixer(p, d):
        if t.name == p + _SPLIT_BETA_ALPHA[0]:
            out.append(weight(p + "ssm_ba.weight", (d.n_embd, 2 * d.ssm_dt_rank), in_std(d.n_embd)))
        elif t.name != p + _SPLIT_BETA_ALPHA[1]:
            out.append(t)
    return out


def neox_rope_hyperparameters(d: Dims) -> list[HParam]:
    """qwen35's attention/rope keys without ``rope.dimension_sections`` (NEOX rope, no mrope)."""
    return [kv for kv in qwen_rope_hyperparameters(d) if kv[0] != "rope.dimension_sections"]


class Qwen3Next(SynthArch):
    """``qwen3next``: MoE only (the loader refuses zero experts)."""

    name = "qwen3next"
    source = "src/models/qwen3next.cpp"
    #: llm_arch_supports_rs_rollback(LLM_ARCH_QWEN3NEXT) is false at 0c1e570: rejected drafts are
    #: replayed from a checkpoint (see :func:`ggufmtp.synth.chain.simulate_acceptance`)
    partial_rollback = False

    def hyperparameters(self, spec: SynthSpec) -> list[HParam]:
        d = self.dims(spec)
        kv = common_hyperparameters(spec, d) + [("feed_forward_length", d.n_ff)]
        return kv + neox_rope_hyperparameters(d) + moe_hyperparameters(d) + ssm_hyperparameters(spec, d)

    def _block(self, il: int, spec: SynthSpec, recurrent: bool) -> list[TensorLayout]:
        d, p = self.dims(spec), f"blk.{il}."
        out = [norm(p + "attn_norm.weight", d.n_embd), norm(p + "post_attention_norm.weight", d.n_embd)]
        out += linear_attention(p, d) if recurrent else gated_attention(p, d)
        return out + moe_ffn(p, d)

    def trunk_block(self, il: int, spec: SynthSpec) -> list[TensorLayout]:
        return self._block(il, spec, recurrent=(il + 1) % full_attention_interval(spec) != 0)

    def mtp_block(self, il: int, spec: SynthSpec) -> list[TensorLayout]:
        return self._block(il, spec, recurrent=False)

    def servable(self, spec: SynthSpec) -> bool:
        return spec.layers >= 2 and not spec.mtp_only

    def unservable_reason(self, spec: SynthSpec) -> str:
        return super().unservable_reason(spec) or \
            "llama.cpp 0c1e570 needs >= 2 trunk layers for this hybrid architecture"


ARCHES = (Qwen3Next(),)
