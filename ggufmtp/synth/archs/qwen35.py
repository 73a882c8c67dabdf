"""Qwen3.5 / Qwen3.6: ``qwen35moe`` (MoE, e.g. 35B-A3B) and ``qwen35`` (dense, e.g. 27B).

A hybrid trunk (3 Gated DeltaNet : 1 full attention, ``full_attention_interval`` 4) and one MTP
block, a full-attention block plus its ``nextn.*`` tensors. Names and shapes from
``src/models/qwen35moe.cpp`` / ``qwen35.cpp`` and ``convert_hf_to_gguf.py`` at 0c1e570: the
attention's ``attn_q`` carries the output gate (2x the heads), ``ffn_gate_inp`` and
``ssm_conv1d`` are F32 as the converter writes them.
"""

from __future__ import annotations

from ..layout import F32, PUBLISHED, SHAPE_TINY, Constructed, Dims, Normal, TensorLayout
from .base import HParam, SynthArch, SynthSpec, common_hyperparameters, in_std, norm, out_proj, weight


def full_attention_interval(spec: SynthSpec) -> int:
    """4 (layers 0-2 Gated DeltaNet, 3 full attention, ...), or ``layers`` when there are 2 or 3
    trunk layers: llama.cpp 0c1e570 aborts at warm-up (``GGML_ASSERT(buffer)`` in the hybrid
    memory's ``set_input``) on a trunk without any attention layer, and equally on one without any
    recurrent layer -- so a 1-layer model (written with interval 4: one DeltaNet layer) loads in
    the GGUF tools but llama-server cannot run it."""
    return 4 if spec.layers == 1 else min(4, spec.layers)


def recurrent_mixer(p: str, d: Dims) -> list[TensorLayout]:
    """A Gated DeltaNet mixer (qwen35's fused ``attn_qkv``; qwen3next's split one differs)."""
    n, vdim, kdim, w = d.n_embd, d.ssm_inner, d.ssm_state * d.ssm_groups, in_std(d.n_embd)
    return [
        weight(p + "attn_qkv.weight", (n, 2 * kdim + vdim), w),
        weight(p + "attn_gate.weight", (n, vdim), w),
        TensorLayout(p + "ssm_conv1d.weight", (d.ssm_conv_kernel, d.conv_dim), F32, Normal(0.5)),
        TensorLayout(p + "ssm_dt.bias", (d.ssm_dt_rank,), F32, Normal(0.1, mean=1.0)),
        TensorLayout(p + "ssm_a", (d.ssm_dt_rank,), F32, Constructed.SSM_A),
        weight(p + "ssm_beta.weight", (n, d.ssm_dt_rank), w),
        weight(p + "ssm_alpha.weight", (n, d.ssm_dt_rank), w),
        norm(p + "ssm_norm.weight", d.ssm_state),
        out_proj(p + "ssm_out.weight", vdim, n),
    ]


def gated_attention(p: str, d: Dims) -> list[TensorLayout]:
    """Full attention whose ``attn_q`` carries the output gate (Qwen3-Next / Qwen3.5)."""
    n, hq, hkv, w = d.n_embd, d.head_dim * d.n_head, d.head_dim * d.n_head_kv, in_std(d.n_embd)
    return [
        weight(p + "attn_q.weight", (n, 2 * hq), w),
        weight(p + "attn_k.weight", (n, hkv), w),
        weight(p + "attn_v.weight", (n, hkv), w),
        out_proj(p + "attn_output.weight", hq, n),
        norm(p + "attn_q_norm.weight", d.head_dim),
        norm(p + "attn_k_norm.weight", d.head_dim),
    ]


def moe_ffn(p: str, d: Dims) -> list[TensorLayout]:
    """Routed experts plus a gated shared expert (Qwen3-Next / Qwen3.5 MoE)."""
    n, w = d.n_embd, in_std(d.n_embd)
    return [
        weight(p + "ffn_gate_inp.weight", (n, d.n_expert), w, F32),
        weight(p + "ffn_gate_exps.weight", (n, d.n_ff_exp, d.n_expert), w),
        weight(p + "ffn_up_exps.weight", (n, d.n_ff_exp, d.n_expert), w),
        out_proj(p + "ffn_down_exps.weight", d.n_ff_exp, n, d.n_expert),
        weight(p + "ffn_gate_inp_shexp.weight", (n,), w, F32),
        weight(p + "ffn_gate_shexp.weight", (n, d.n_ff_shexp), w),
        weight(p + "ffn_up_shexp.weight", (n, d.n_ff_shexp), w),
        out_proj(p + "ffn_down_shexp.weight", d.n_ff_shexp, n),
    ]


def dense_ffn(p: str, d: Dims, n_ff: int | None = None) -> list[TensorLayout]:
    n, f, w = d.n_embd, n_ff or d.n_ff, in_std(d.n_embd)
    return [weight(p + "ffn_gate.weight", (n, f), w), weight(p + "ffn_up.weight", (n, f), w),
            out_proj(p + "ffn_down.weight", f, n)]


def qwen_rope_hyperparameters(d: Dims) -> list[HParam]:
    return [("attention.head_count", d.n_head), ("attention.head_count_kv", d.n_head_kv),
            ("attention.key_length", d.head_dim), ("attention.value_length", d.head_dim),
            ("attention.layer_norm_rms_epsilon", float(d.rms_eps)), ("rope.dimension_count", d.rope_dims),
            ("rope.dimension_sections", list(d.rope_sections)), ("rope.freq_base", float(d.rope_freq_base))]


def moe_hyperparameters(d: Dims) -> list[HParam]:
    return [("expert_count", d.n_expert), ("expert_used_count", d.n_expert_used),
            ("expert_feed_forward_length", d.n_ff_exp), ("expert_shared_feed_forward_length", d.n_ff_shexp)]


def ssm_hyperparameters(spec: SynthSpec, d: Dims) -> list[HParam]:
    return [("ssm.conv_kernel", d.ssm_conv_kernel), ("ssm.state_size", d.ssm_state),
            ("ssm.group_count", d.ssm_groups), ("ssm.time_step_rank", d.ssm_dt_rank),
            ("ssm.inner_size", d.ssm_inner), ("full_attention_interval", full_attention_interval(spec))]


class Qwen35(SynthArch):
    """``qwen35moe`` (``moe=True``) or ``qwen35``."""

    max_mtp_layers = 2  # llama-quantize takes 2 (GGUF-level tests); llama-server's MTP graph asserts 1

    def __init__(self, moe: bool):
        self.moe = moe
        self.name = "qwen35moe" if moe else "qwen35"
        # tiny, and the real shape of the released model of this architecture (35B-A3B / 27B)
        self.shapes = (SHAPE_TINY, *(s for s, m in PUBLISHED.items() if m.arch == self.name))
        self.source = "src/models/qwen35moe.cpp" if moe else "src/models/qwen35.cpp"

    def hyperparameters(self, spec: SynthSpec) -> list[HParam]:
        d = self.dims(spec)
        kv = common_hyperparameters(spec, d) + qwen_rope_hyperparameters(d)
        kv += moe_hyperparameters(d) if self.moe else [("feed_forward_length", d.n_ff)]
        return kv + ssm_hyperparameters(spec, d)

    def _block(self, il: int, spec: SynthSpec, recurrent: bool) -> list[TensorLayout]:
        d, p = self.dims(spec), f"blk.{il}."
        out = [norm(p + "attn_norm.weight", d.n_embd), norm(p + "post_attention_norm.weight", d.n_embd)]
        out += recurrent_mixer(p, d) if recurrent else gated_attention(p, d)
        return out + (moe_ffn(p, d) if self.moe else dense_ffn(p, d))

    def trunk_block(self, il: int, spec: SynthSpec) -> list[TensorLayout]:
        return self._block(il, spec, recurrent=(il + 1) % full_attention_interval(spec) != 0)

    def mtp_block(self, il: int, spec: SynthSpec) -> list[TensorLayout]:
        return self._block(il, spec, recurrent=False)

    def servable(self, spec: SynthSpec) -> bool:
        return spec.layers >= 2 and not spec.mtp_only and spec.n_mtp_blocks <= 1

    def unservable_reason(self, spec: SynthSpec) -> str:
        if spec.n_mtp_blocks > 1:  # GGML_ASSERT(hparams.n_layer_nextn == 1) in the MTP graph
            return f"llama.cpp 0c1e570's {self.name} MTP graph supports a single MTP block"
        return super().unservable_reason(spec) or \
            "llama.cpp 0c1e570 needs >= 2 trunk layers for this hybrid architecture"


ARCHES = (Qwen35(moe=True), Qwen35(moe=False))
