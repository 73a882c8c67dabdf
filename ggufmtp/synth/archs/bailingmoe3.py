"""Ling 3.0 (``BailingMoeV3ForCausalLM``): ``bailingmoe3``.

Layout (names and shapes from ``src/models/bailingmoe3.cpp`` and ``conversion/bailingmoe3.py`` at 0c1e570)
---------------------------------------------------------------------------------------------------------
A hybrid trunk: Kimi Delta Attention (KDA) blocks and MLA blocks, the MLA ones where
``(il + 1) % layer_group_size == 0`` or past the last whole group (the converter's
``is_full_attention``; the group is 4, or ``layers`` for 2-3 trunk layers, as qwen35's interval:
the hybrid memory needs both kinds). The loader tells them apart by ``attention.head_count_kv``, a
per-layer array: 0 for KDA, 1 for MLA (one latent KV head) and for the MTP block. A KDA block:
``attn_q/k/v`` each through a depthwise causal conv (``ssm_conv1d_q/k/v``, 4-D ``{d_conv, 1,
d_inner, 1}``, F32), the forget gate ``ssm_f_a`` + ``ssm_dt.bias`` scaled by ``ssm_a`` (the
converter writes ``exp(A_log)``: positive, no ``.weight``), ``ssm_beta``, the output gate
``ssm_g_a``, a per-head ``ssm_norm`` and ``attn_output``. An MLA block is deepseek2's (``q_lora``,
split ``attn_k_b``/``attn_v_b``) plus a head-wise sigmoid gate ``attn_gate`` ``{n_embd, n_head}``.
Block 0 has a dense FFN (``leading_dense_block_count`` 1), the others DeepSeek-V3 MoE (sigmoid
router with ``exp_probs_b.bias``, a gated shared expert). ONE MTP block ``blk.<layers>``
(``graph_mtp`` asserts one): an MLA + MoE block, its ``nextn.eh_proj/enorm/hnorm``, and its final
norm ``blk.<layers>.layer_output_norm`` (``LLM_TENSOR_LAYER_OUT_NORM``, required), NOT
``nextn.shared_head_norm``. The loader creates no ``nextn.embed_tokens`` / ``shared_head_head``
for this arch (a file that had them would fail the tensor count): the head always reads
``token_embd`` and ``output``.

The bigram, in two halves of the width
--------------------------------------
Without ``nextn.embed_tokens`` the usual carrier of the ``wrong_successor_fraction`` /
``head_margin`` knobs is gone, and ``eh_proj`` is linear: no matrix maps a few hundred tokens'
embeddings onto chosen other ones. So the width is split in two halves U (first) and V: the text
row of token ``x`` in ``token_embd`` is ``[u(x) ; v(x)]`` with ``u`` the first half of the usual
embedding and ``v(x) = u(c(x))`` the draft embedding (``c`` the knob's corruption, competitors
mixed in for ``head_margin``); ``output[y] = (logit_scale / (n_embd/2)) * [sum_{x: s(x)=y} u(x) ; 0]``
reads U only, so the trunk's logits are the usual bigram's (the successor at ~24, the others
~N(0, 2.1)). ``eh_proj`` copies the V half of ``enorm(embed)`` into both halves and drops
``hnorm(h)`` (the graph's order, embedding first), so after ``layer_output_norm`` the head's
logits are ``output . [v ; v] / rms(v) = u-bigram of c(x)``: the head drafts ``s(c(x))``, exactly
the chain :func:`ggufmtp.synth.chain.simulate_acceptance` replays, with the margin
:func:`ggufmtp.synth.margins.with_competitors` solves for (it sees the half-width rows). The hidden
state ``h`` the graph passes is the trunk's post-``output_norm`` one, as the recipe assumes.
F32 for 1-D tensors, ``ssm_a``, the conv weights, ``ffn_gate_inp`` and ``exp_probs_b``; BF16 for
matrices. The pinned llama.cpp rolls a partly rejected draft back in place
(``llm_arch_supports_rs_rollback``: KDA keeps ``n_rs_seq`` conv/state snapshots).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..layout import BF16, DIMS, F32, SHAPE_TINY, Computed, Const, Dims, Normal, TensorLayout, global_tensors
from ..spec import spec_rng
from .base import HParam, SynthArch, SynthSpec, biased_moe_ffn, common_hyperparameters, in_std, norm, out_proj, weight
from .deepseek2 import MLA, mla_attention
from .qwen35 import dense_ffn

if TYPE_CHECKING:
    from ..tensors import TensorBuilder

#: ``LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID`` (``src/llama-hparams.h``)
GATING_SIGMOID = 2


@dataclass(frozen=True)
class LingConfig:
    """What Ling 3.0's ``config.json`` sets besides :class:`Dims`' widths (``BailingMoeV3Model``),
    shrunk: KDA heads as wide as the MLA value heads, ``n_head`` shared by both."""

    layer_group_size: int = 4  # one MLA block closes each group
    kda_head_dim: int = 128  # head_dim: d_inner = kda_head_dim * n_head
    kda_gate_lower_bound: float = -5.0  # kda_lower_bound (the loader asserts < 0)
    n_layer_dense_lead: int = 1  # first_k_dense_replace
    n_expert_shared: int = 1  # num_shared_experts
    expert_weights_scale: float = 2.5  # routed_scaling_factor
    rms_eps: float = 1e-6


LING = LingConfig()
LING_TINY = dataclasses.replace(DIMS[SHAPE_TINY], n_head=MLA.n_head, head_dim=LING.kda_head_dim, rms_eps=LING.rms_eps,
                                rope_freq_base=MLA.rope_freq_base)


def layer_group_size(spec: SynthSpec) -> int:
    """4, or ``layers`` for 2-3 trunk layers: with fewer blocks than a group the converter's rule
    makes every block MLA, and llama.cpp 0c1e570 aborts at warm-up (``GGML_ASSERT(buffer)``) on a
    hybrid memory without a recurrent layer -- as it does for 1 trunk layer, which stays MLA."""
    return LING.layer_group_size if spec.layers == 1 else min(LING.layer_group_size, spec.layers)


def is_mla(il: int, spec: SynthSpec) -> bool:
    """The converter's ``is_full_attention``: the MTP block, each group's last block, and the tail
    past the last whole group."""
    n, g = spec.layers, layer_group_size(spec)
    return il >= n or (il + 1) % g == 0 or il >= n // g * g


def kda_mixer(p: str, d: Dims) -> list[TensorLayout]:
    """One KDA mixer: conv'd ``q/k/v``, forget gate, beta, output gate and norm, ``attn_output``."""
    n, hd, w = d.n_embd, LING.kda_head_dim, in_std(d.n_embd)
    inner = hd * d.n_head
    conv = [TensorLayout(p + f"ssm_conv1d_{x}.weight", (d.ssm_conv_kernel, 1, inner, 1), F32, Normal(0.5)) for x in "qkv"]
    return conv + [
        weight(p + "attn_q.weight", (n, inner), w),
        weight(p + "attn_k.weight", (n, inner), w),
        weight(p + "attn_v.weight", (n, inner), w),
        weight(p + "ssm_f_a.weight", (n, inner), w),
        weight(p + "ssm_beta.weight", (n, d.n_head), w),
        TensorLayout(p + "ssm_a", (1, d.n_head), F32, Normal(0.1, mean=1.0)),  # exp(A_log) > 0
        TensorLayout(p + "ssm_dt.bias", (inner,), F32, Normal(0.1, mean=1.0)),
        weight(p + "ssm_g_a.weight", (n, inner), w),
        norm(p + "ssm_norm.weight", hd),
        out_proj(p + "attn_output.weight", inner, n),
    ]


def gated_mla(p: str, d: Dims) -> list[TensorLayout]:
    """deepseek2's MLA attention plus the head-wise output gate ``attn_gate``."""
    return mla_attention(p, d, MLA) + [weight(p + "attn_gate.weight", (d.n_embd, MLA.n_head), in_std(d.n_embd))]


# ----------------------------------------------------------------------------- the split bigram


def _halves(b: TensorBuilder) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(u, v, out_u)``: the trunk's half-width embeddings, the head's (corrupted rows, competitors
    for ``head_margin``) and ``output``'s U half."""
    s, ch = b.spec, b.chain
    u = b.embeddings()[:, : b.d.n_embd // 2]
    out_u = np.zeros_like(u)
    np.add.at(out_u, ch.successor, u)
    out_u *= np.float32(s.logit_scale / u.shape[1])
    v = u[ch.embed_source]
    if s.head_margin > 0:
        from ..margins import with_competitors

        v = with_competitors(v, u, out_u, ch, s.head_margin, spec_rng(s, "competitors"))
    return u, v, out_u


def split_embeddings(b: TensorBuilder) -> np.ndarray:
    """``token_embd``: ``[u(x) ; v(x)]`` per text token."""
    u, v, _ = _halves(b)
    return np.concatenate([u, v], axis=1)


def split_output(b: TensorBuilder) -> np.ndarray:
    """``output``: ``[out_u(y) ; 0]``: the trunk's logits read U only."""
    _, _, out_u = _halves(b)
    return np.concatenate([out_u, np.zeros_like(out_u)], axis=1)


def swap_eh_proj(key: str) -> Computed:
    """``eh_proj`` (numpy ``[out, in]`` over ``[enorm(embed) ; hnorm(h)]``): the V half of the
    embedding into both output halves, ``h`` dropped; ``eh_proj_noise`` as for ``[I | 0]``."""
    def make(b: TensorBuilder) -> np.ndarray:
        n = b.d.n_embd
        h = n // 2
        m = np.zeros((n, 2 * n), dtype=np.float32)
        m[np.arange(n), h + np.arange(n) % h] = 1.0
        if b.spec.eh_proj_noise:
            noise = spec_rng(b.spec, key).standard_normal(m.shape, dtype=np.float32)
            m += noise * np.float32(b.spec.eh_proj_noise / math.sqrt(2 * n))
        return m

    return Computed(make)


# ----------------------------------------------------------------------------- the architecture


class BailingMoe3(SynthArch):
    """``bailingmoe3``: KDA/MLA hybrid trunk, one MLA+MoE MTP block, the split bigram."""

    name = "bailingmoe3"
    source = "src/models/bailingmoe3.cpp"
    shapes = (SHAPE_TINY,)
    max_mtp_layers = 1  # graph_mtp asserts n_layer_nextn == 1

    def dims(self, spec: SynthSpec) -> Dims:
        return LING_TINY

    def hyperparameters(self, spec: SynthSpec) -> list[HParam]:
        d, m = self.dims(spec), MLA
        blocks = range(spec.layers + spec.n_mtp_blocks)
        return common_hyperparameters(spec, d) + [
            ("feed_forward_length", d.n_ff), ("attention.head_count", d.n_head),
            ("attention.head_count_kv", [1 if is_mla(il, spec) else 0 for il in blocks]),
            ("rope.freq_base", float(d.rope_freq_base)), ("attention.layer_norm_rms_epsilon", float(d.rms_eps)),
            ("expert_count", d.n_expert), ("expert_used_count", d.n_expert_used),
            ("expert_gating_func", GATING_SIGMOID),
            # the converter's key_length is the cached MLA row; value_length stays TextModel's head_dim
            ("attention.key_length", m.k_head_cache), ("attention.value_length", LING.kda_head_dim),
            ("ssm.conv_kernel", d.ssm_conv_kernel), ("kda.head_dim", LING.kda_head_dim),
            ("kda.safe_gate", True), ("kda.gate_lower_bound", LING.kda_gate_lower_bound),
            ("attention.q_lora_rank", m.q_lora_rank), ("attention.kv_lora_rank", m.kv_lora_rank),
            ("rope.dimension_count", m.qk_rope_head_dim),
            ("attention.key_length_mla", m.k_head_mla), ("attention.value_length_mla", m.v_head_dim),
            ("expert_feed_forward_length", d.n_ff_exp),
            ("expert_shared_feed_forward_length", d.n_ff_exp * LING.n_expert_shared),
            ("expert_shared_count", LING.n_expert_shared), ("leading_dense_block_count", LING.n_layer_dense_lead),
            ("expert_weights_scale", LING.expert_weights_scale), ("expert_weights_norm", True),
        ]

    def global_tensors(self, spec: SynthSpec, n_vocab: int) -> list[TensorLayout]:
        """The split bigram's ``token_embd`` and ``output`` (the tiny vocabulary has no padding rows)."""
        made = {"token_embd.weight": Computed(split_embeddings), "output.weight": Computed(split_output)}
        return [t._replace(init=made.get(t.name, t.init)) for t in global_tensors(self.dims(spec).n_embd, n_vocab)]

    def _block(self, il: int, spec: SynthSpec, mla: bool, moe: bool) -> list[TensorLayout]:
        d, p = self.dims(spec), f"blk.{il}."
        out = [norm(p + "attn_norm.weight", d.n_embd)] + (gated_mla(p, d) if mla else kda_mixer(p, d))
        out.append(norm(p + "ffn_norm.weight", d.n_embd))
        return out + (biased_moe_ffn(p, d, d.n_ff_exp * LING.n_expert_shared) if moe else dense_ffn(p, d))

    def trunk_block(self, il: int, spec: SynthSpec) -> list[TensorLayout]:
        return self._block(il, spec, mla=is_mla(il, spec), moe=il >= LING.n_layer_dense_lead)

    def mtp_block(self, il: int, spec: SynthSpec) -> list[TensorLayout]:
        # always MLA + MoE, whatever ``il`` (spec.mtp_block_suffixes asks for block 0)
        return self._block(il, spec, mla=True, moe=True)

    def nextn(self, il: int, spec: SynthSpec, n_vocab: int, embed_tokens: bool) -> list[TensorLayout]:
        """``eh_proj`` (the half swap), ``enorm``, ``hnorm`` and the block's ``layer_output_norm``;
        never ``nextn.embed_tokens`` (the knobs live in ``token_embd``'s V half)."""
        n, p = self.dims(spec).n_embd, f"blk.{il}."
        return [TensorLayout(p + "nextn.eh_proj.weight", (2 * n, n), BF16, swap_eh_proj(p + "nextn.eh_proj")),
                TensorLayout(p + "nextn.enorm.weight", (n,), F32, Const(1.0)),
                TensorLayout(p + "nextn.hnorm.weight", (n,), F32, Const(1.0)),
                norm(p + "layer_output_norm.weight", n)]

    def servable(self, spec: SynthSpec) -> bool:
        return spec.layers >= 2 and not spec.mtp_only

    def unservable_reason(self, spec: SynthSpec) -> str:
        return super().unservable_reason(spec) or \
            "llama.cpp 0c1e570 needs >= 2 trunk layers for bailingmoe3: a 1-layer trunk is one MLA block, and " \
            "the hybrid memory without a KDA layer aborts at warm-up (GGML_ASSERT(buffer))"


ARCHES = (BailingMoe3(),)
