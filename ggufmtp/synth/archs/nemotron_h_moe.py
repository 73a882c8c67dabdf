"""Nemotron-H MoE (``nemotron_h_moe``, e.g. Nemotron 3 Super): a hybrid trunk of Mamba-2, attention
and MoE blocks, and ONE MTP block that folds an attention sub-layer and a MoE sub-layer together.

Layout (``src/models/nemotron-h.cpp``'s loader, which ``nemotron-h-moe.cpp`` reuses, its
``graph_mtp``, and ``conversion/nemotron.py`` ``NemotronHModel`` at 0c1e570)
---------------------------------------------------------------------------------------------------
Each trunk block is ONE of three kinds, as ``hybrid_override_pattern`` spells them: ``M`` Mamba-2
(``ssm_in``, ``ssm_conv1d`` + bias, ``ssm_dt.bias``, ``ssm_a`` / ``ssm_d`` {1, n_ssm_head},
grouped ``ssm_norm`` {d_inner / n_group, n_group}, ``ssm_out``), ``*`` attention (separate
``attn_q/k/v``, ``attn_output``; NoPE: the graph applies no rope) or ``E`` MoE (``ffn_gate_inp``
and ``exp_probs_b`` F32, sigmoid routing, ungated ReLU^2 experts ``ffn_up/down_exps`` behind the
latent projections ``ffn_latent_down/up`` (``moe_latent_size``, Nemotron 3 Super's layout), an
ungated shared expert ``ffn_up/down_shexp``); every block has only ``attn_norm``. The loader reads
the kind off two per-layer arrays the converter writes: recurrent iff ``attention.head_count_kv[i]``
and ``feed_forward_length[i]`` are both 0, attention iff only the latter is. The pattern here is
``ME*E`` repeated (``M*`` with 2 layers: the hybrid memory needs both an attention and a recurrent
layer, as in qwen35). The MTP block ``blk.<layers>`` is in both arrays (the converter registers it
as an attention AND an MLP layer): ``nextn.enorm/hnorm/eh_proj/shared_head_norm``, ``attn_norm``,
``attn_q/k/v/output``, ``post_attention_norm`` and the MoE sub-layer. Required keys besides the
usual: ``attention.layer_norm_epsilon`` (the MTP head's final norm is a LayerNorm, not RMS) and the
``ssm.*`` sizes (``time_step_rank`` = Mamba heads). F32 for 1-D tensors, norms, ``ssm_a``/``ssm_d``
(no ``.weight`` suffix), ``ssm_conv1d`` and ``ffn_gate_inp``; BF16 for matrices.

No ``nextn.embed_tokens``: the knob's successor memory
---------------------------------------------------------
The loader creates no ``nextn.embed_tokens`` / ``nextn.shared_head_head`` for this arch (the graph
would use them, but a file carrying either fails with "wrong number of tensors"), so the knob
cannot corrupt the head's embeddings. Instead the MTP block's shared expert is a key-value memory
that rewrites each corrupted token's embedding: slot ``j`` of ``ffn_up_shexp`` holds the key
``(4 / n_embd) * rmsnorm(embed(t_j))`` of corrupted token ``t_j`` and column ``j`` of
``ffn_down_shexp`` the value ``(rmsnorm(embed(src_j)) - rmsnorm(embed(t_j))) / 16``. ReLU^2 makes the
slot fire 16 for its own token and ~(z/4)^2, z ~ N(0, 1), for any other, so after ``t_j`` the head's
residual becomes ``rmsnorm(embed(src_j))`` (+ a few % of leakage) and it drafts ``s(src_j)`` --
exactly the draft successor :func:`ggufmtp.synth.chain.chain_for` gives, so
:func:`~ggufmtp.synth.chain.simulate_acceptance` holds unchanged. The other slots are the usual
~1e-2 noise; the memory has a slot per token of the vocabulary (768 after rounding up to 256), so
every ``f`` fits. ``head_margin`` (which needs ``nextn.embed_tokens``) is refused.

Rollback: ``llm_arch_supports_rs_rollback(LLM_ARCH_NEMOTRON_H_MOE)`` is true at 0c1e570
(``src/llama-arch.cpp``), so llama-server rolls the Mamba state back in place after a partly
rejected draft (``partial_rollback`` True), unlike qwen3next's checkpoint replay.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...errors import SynthError
from ..layout import BF16, F32, RESIDUAL_SCALE, Computed, Const, Dims, Normal, TensorLayout
from ..spec import spec_rng
from ..tokenizer import build_vocab
from .base import HParam, SynthArch, SynthSpec, common_hyperparameters, in_std, norm, out_proj, weight

#: one period of the trunk's ``hybrid_override_pattern``: M Mamba-2, E MoE, * attention
PATTERN = "ME*E"
#: the memory key's gain: a slot fires KEY_GAIN^2 for its own token
KEY_GAIN = 4.0


@dataclass(frozen=True)
class NemotronHConfig:
    """The Mamba-2 and MoE sizes :class:`~ggufmtp.synth.layout.Dims` lacks (Nemotron 3 Super's
    geometry, shrunk: 8 Mamba heads of 64, 2 groups, state 128; every matmul's ``ne0`` a multiple
    of 256 so k-quants apply)."""

    ssm_heads: int = 8  # mamba_num_heads (ssm.time_step_rank)
    ssm_head_dim: int = 64  # mamba_head_dim
    ssm_groups: int = 2  # n_groups
    ssm_state: int = 128
    ssm_conv: int = 4
    moe_latent: int = 256  # moe_latent_size
    n_expert_shared: int = 1
    expert_weights_scale: float = 2.5  # routed_scaling_factor
    norm_eps: float = 1e-5  # layer_norm_epsilon (RMS norms fall back to it)

    @property
    def d_inner(self) -> int:
        return self.ssm_heads * self.ssm_head_dim

    @property
    def conv_dim(self) -> int:
        return self.d_inner + 2 * self.ssm_groups * self.ssm_state


NEMOTRON = NemotronHConfig()


def layer_pattern(layers: int) -> str:
    """The trunk's ``hybrid_override_pattern``: ``ME*E`` repeated, ``M*`` for 2 layers."""
    return "M*" if layers == 2 else "".join(PATTERN[i % len(PATTERN)] for i in range(layers))


def memory_slots(shape: str) -> int:
    """The shared expert's width: a memory slot per token of the (unpadded) vocabulary, so every
    corruptible text token has one, rounded up to 256 (k-quants)."""
    return -(-build_vocab(shape).n_text_vocab // 256) * 256


def rms_normed(x: np.ndarray, eps: float) -> np.ndarray:
    """``rmsnorm`` of each row, as the graph computes it (weight 1)."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def _corrupted(b) -> tuple[np.ndarray, np.ndarray]:
    """The corrupted tokens (ascending: slot order) and the token whose embedding each drafts from."""
    bad = np.flatnonzero(b.chain.corrupted)
    return bad, b.chain.embed_source[bad]


def memory_keys(name: str, n_embd: int, n_slots: int, eps: float) -> Computed:
    """``ffn_up_shexp`` {n_embd, n_slots}: a key per corrupted token, gaussian noise elsewhere."""
    def make(b) -> np.ndarray:
        z = spec_rng(b.spec, name).standard_normal((n_slots, n_embd), dtype=np.float32) * np.float32(in_std(n_embd))
        bad, _ = _corrupted(b)
        z[: len(bad)] = (KEY_GAIN / n_embd) * rms_normed(b.embeddings()[bad], eps)
        return z

    return Computed(make)


def memory_values(name: str, n_embd: int, n_slots: int, eps: float) -> Computed:
    """``ffn_down_shexp`` {n_slots, n_embd}: what each slot adds to turn its token's embedding into
    its source's; ~1e-2 noise elsewhere (``out_proj``'s scale)."""
    def make(b) -> np.ndarray:
        std = np.float32(RESIDUAL_SCALE / math.sqrt(n_slots))
        z = spec_rng(b.spec, name).standard_normal((n_embd, n_slots), dtype=np.float32) * std
        bad, src = _corrupted(b)
        e = b.embeddings()
        z[:, : len(bad)] = ((rms_normed(e[src], eps) - rms_normed(e[bad], eps)) / KEY_GAIN**2).T
        return z

    return Computed(make)


def ssm_a(name: str, n: int) -> Computed:
    """``ssm_a`` {1, n}: the builder's stable decays ``-exp(U(0, 1.5))`` (``Constructed.SSM_A`` sizes
    itself by ``ne0``, which is 1 here)."""
    return Computed(lambda b: np.concatenate(list(b.ssm_a(name, n))))


def mamba2_mixer(p: str, d: Dims, c: NemotronHConfig) -> list[TensorLayout]:
    """A Mamba-2 mixer: ``ssm_in`` projects to z, x, B, C and dt (``2*d_inner + 2*n_group*d_state +
    n_head``), then the causal conv, the selective scan and the grouped, gated RMS norm."""
    n, w = d.n_embd, in_std(d.n_embd)
    return [
        weight(p + "ssm_in.weight", (n, 2 * c.d_inner + 2 * c.ssm_groups * c.ssm_state + c.ssm_heads), w),
        TensorLayout(p + "ssm_conv1d.weight", (c.ssm_conv, c.conv_dim), F32, Normal(0.5)),
        # the graph adds the bias unconditionally, although the loader calls it optional
        TensorLayout(p + "ssm_conv1d.bias", (c.conv_dim,), F32, Normal(0.1)),
        TensorLayout(p + "ssm_dt.bias", (c.ssm_heads,), F32, Normal(0.1, mean=1.0)),
        TensorLayout(p + "ssm_a", (1, c.ssm_heads), F32, ssm_a(p + "ssm_a", c.ssm_heads)),
        TensorLayout(p + "ssm_d", (1, c.ssm_heads), F32, Const(1.0)),
        TensorLayout(p + "ssm_norm.weight", (c.d_inner // c.ssm_groups, c.ssm_groups), F32, Const(1.0)),
        out_proj(p + "ssm_out.weight", c.d_inner, n),
    ]


def nope_attention(p: str, d: Dims) -> list[TensorLayout]:
    """Separate Q/K/V (no bias, no Q/K norms) and the output projection back into the stream."""
    n, hq, hkv, w = d.n_embd, d.head_dim * d.n_head, d.head_dim * d.n_head_kv, in_std(d.n_embd)
    return [weight(p + "attn_q.weight", (n, hq), w), weight(p + "attn_k.weight", (n, hkv), w),
            weight(p + "attn_v.weight", (n, hkv), w), out_proj(p + "attn_output.weight", hq, n)]


def latent_moe(p: str, d: Dims, c: NemotronHConfig, n_slots: int, memory: bool) -> list[TensorLayout]:
    """Sigmoid-routed ReLU^2 experts behind the latent projections, plus the ungated shared expert
    (``memory``: the MTP block's successor memory, see the module docstring)."""
    n, lat, w = d.n_embd, c.moe_latent, in_std(d.n_embd)
    up, down = p + "ffn_up_shexp.weight", p + "ffn_down_shexp.weight"
    shared = [TensorLayout(up, (n, n_slots), BF16, memory_keys(up, n, n_slots, c.norm_eps)),
              TensorLayout(down, (n_slots, n), BF16, memory_values(down, n, n_slots, c.norm_eps))] if memory \
        else [weight(up, (n, n_slots), w), out_proj(down, n_slots, n)]
    return [
        weight(p + "ffn_gate_inp.weight", (n, d.n_expert), w, F32),
        weight(p + "exp_probs_b.bias", (d.n_expert,), 0.01, F32),
        weight(p + "ffn_latent_down.weight", (n, lat), w),
        weight(p + "ffn_latent_up.weight", (lat, n), in_std(lat)),
        weight(p + "ffn_up_exps.weight", (lat, d.n_ff_exp, d.n_expert), in_std(lat)),
        out_proj(p + "ffn_down_exps.weight", d.n_ff_exp, lat, d.n_expert),
    ] + shared


class NemotronHMoe(SynthArch):
    """``nemotron_h_moe``: Mamba-2 / attention / MoE trunk blocks, one folded attention+MoE MTP block."""

    name = "nemotron_h_moe"
    source = "src/models/nemotron-h-moe.cpp"
    #: llm_arch_supports_rs_rollback(LLM_ARCH_NEMOTRON_H_MOE) is true at 0c1e570: partial rollback in place
    partial_rollback = True

    def hyperparameters(self, spec: SynthSpec) -> list[HParam]:
        d, c = self.dims(spec), NEMOTRON
        kinds = layer_pattern(spec.layers) + "+" * spec.n_mtp_blocks  # +: the MTP block, attention and MoE
        return common_hyperparameters(spec, d) + [
            ("feed_forward_length", [d.n_ff_exp if k in "E+" else 0 for k in kinds]),
            ("attention.head_count", d.n_head),
            ("attention.head_count_kv", [d.n_head_kv if k in "*+" else 0 for k in kinds]),
            ("attention.key_length", d.head_dim), ("attention.value_length", d.head_dim),
            ("attention.layer_norm_epsilon", c.norm_eps), ("rope.scaling.finetuned", False),
            ("expert_count", d.n_expert), ("expert_used_count", d.n_expert_used),
            ("expert_feed_forward_length", d.n_ff_exp), ("expert_shared_feed_forward_length", memory_slots(spec.shape)),
            ("expert_shared_count", c.n_expert_shared), ("expert_weights_norm", True),
            ("expert_weights_scale", c.expert_weights_scale), ("expert_group_count", 1),
            ("moe_latent_size", c.moe_latent),
            ("ssm.conv_kernel", c.ssm_conv), ("ssm.state_size", c.ssm_state), ("ssm.group_count", c.ssm_groups),
            ("ssm.inner_size", c.d_inner), ("ssm.time_step_rank", c.ssm_heads),
        ]

    def trunk_block(self, il: int, spec: SynthSpec) -> list[TensorLayout]:
        d, p = self.dims(spec), f"blk.{il}."
        kind = layer_pattern(spec.layers)[il]
        out = [norm(p + "attn_norm.weight", d.n_embd)]
        if kind == "M":
            return out + mamba2_mixer(p, d, NEMOTRON)
        if kind == "*":
            return out + nope_attention(p, d)
        return out + latent_moe(p, d, NEMOTRON, memory_slots(spec.shape), memory=False)

    def mtp_block(self, il: int, spec: SynthSpec) -> list[TensorLayout]:
        d, p = self.dims(spec), f"blk.{il}."
        out = [norm(p + "attn_norm.weight", d.n_embd)] + nope_attention(p, d)
        out.append(norm(p + "post_attention_norm.weight", d.n_embd))
        return out + latent_moe(p, d, NEMOTRON, memory_slots(spec.shape), memory=True)

    def nextn(self, il: int, spec: SynthSpec, n_vocab: int, embed_tokens: bool) -> list[TensorLayout]:
        """``eh_proj``, ``enorm``, ``hnorm`` and ``shared_head_norm`` only: the loader creates no
        ``embed_tokens`` (the memory carries the knob instead), so ``head_margin`` cannot be written."""
        if getattr(spec, "head_margin", 0.0):
            raise SynthError(f"head_margin: arch {self.name} has no nextn.embed_tokens to carry it "
                             "(llama.cpp 0c1e570's loader does not read one)")
        return super().nextn(il, spec, n_vocab, False)

    def servable(self, spec: SynthSpec) -> bool:
        return spec.layers >= 2 and not spec.mtp_only

    def unservable_reason(self, spec: SynthSpec) -> str:
        return super().unservable_reason(spec) or \
            "llama.cpp 0c1e570 needs >= 2 trunk layers for this hybrid architecture (an attention and a Mamba-2 one)"


ARCHES = (NemotronHMoe(),)
