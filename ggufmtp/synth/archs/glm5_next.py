"""GLM-5.3-Flash: ``glm5-next`` -- a hybrid of Kimi Delta Attention (KDA, linear) and nope-only MLA
with a k-pool DSA indexer, four mHC residual streams, and DeepSeek-style MoE.

Layout (names and shapes from ``src/models/glm5-next.cpp`` and ``conversion/glm.py``,
``Glm5NextModel``, at 0c1e570)
---------------------------------------------------------------------------------------------
``layers`` trunk blocks, then ONE NextN block ``blk.<layers>``. A trunk block is KDA when its
``attention.head_count_kv`` entry is 0 (the converter writes 0 for ``linear_attention`` layers and
pads the NextN entries with 1); here every 4th block is DSA (:func:`.qwen35.full_attention_interval`:
a hybrid memory needs at least one layer of each kind). KDA blocks: ``attn_q/k/v``, per-projection
short convolutions ``ssm_conv1d_q/k/v`` ``{d_conv, 1, d_inner, 1}`` (F32, the converter's 4-D
reshape), the low-rank decay gate ``ssm_f_a``/``ssm_f_b`` plus ``ssm_dt.bias``, ``ssm_a``
(``-exp(A_log)``), ``ssm_beta``, the low-rank output gate ``ssm_g_a``/``ssm_g_b``, ``ssm_norm`` and
``attn_output``. DSA blocks: deepseek2's MLA with ``qk_rope_head_dim`` 0 (the graph asserts
``n_rot == 0``) plus the indexer (``indexer.attn_q_b``/``attn_k``/``k_norm`` (weight and bias)/
``proj``, and the k-pool ``indexer_compressor_gate``/``indexer_compressor_ape``); every indexer is
"full" (``attention.indexer.types``, one entry per trunk block). Every trunk block also carries
the mHC mixers ``hc_attn_*``/``hc_ffn_*`` (``fn`` ``{4*n_embd, 24}``, ``base`` ``{24}``, ``scale``
``{3}``, F32 as the converter forces them); the NextN block has none. Block 0 has a dense FFN
(``leading_dense_block_count`` 1), the others and the NextN block DeepSeek-V3 MoE
(:func:`.base.biased_moe_ffn`). The NextN block is a DSA+MoE block plus its ``nextn.*`` tensors.

The bigram chain survives mHC: the embedding is copied into all 4 streams, ``hc_post``'s
Sinkhorn ``comb`` ends with a column normalisation (each destination stream takes a convex
combination of equal source streams, so they stay equal but for the ~1e-2 block outputs), and the
head averages the streams before ``output_norm``. ``hc_fn`` is small noise through ``hc_scale``
0.1, so the mixes vary a little per token, as in a trained model.

The pinned llama-server (0c1e570) has no GLM5-Next NextN graph
--------------------------------------------------------------
``build_arch_graph`` throws ``"GLM5-Next NextN graph not implemented yet"`` for
``LLM_GRAPH_TYPE_DECODER_MTP`` (``glm5-next.cpp:190``; the "trunk_only/mtp_only handling TODO" of
``load_arch_tensors`` is that follow-up: the NextN tensors are created, or skipped without
``load_mtp``, and only that graph would read them). So the file loads and the trunk serves the
bigram chain, but ``--spec-type draft-mtp`` cannot create its draft context, nor can the MTP
imatrix collector. An MTP-only sidecar does not load at all (the loader requires every trunk
tensor: ``blk.0.attn_norm.weight`` not found). And ``llama-imatrix`` dies with SIGSEGV on any
glm5-next trunk: a ubatch of more than 16 tokens takes the indexer's scatter path, whose
``ggml_arange`` node (``glm5-next.cpp:905``) has no ``src[0]``, and the collector reads
``src0->name`` of every node (``tools/imatrix/imatrix.cpp:239``); a trunk without DSA layers,
which would dodge it, aborts in the hybrid memory. Given an imatrix (``llama-imatrix -ub 16``
runs), plan, every recipe's quantization, audit, receipt and card work, and the quantized
artifacts serve the chain (vanilla). Which tensor the missing graph will read as its hidden state
is not known; ``eh_proj`` is the recipe's ``[I | 0]`` over ``concat(enorm(embed), hnorm(h))``, the
order of every other MTP graph, with ``h`` the post-``output_norm`` stream mean the trunk graph
already exports (``t_h_nextn``).
``llm_arch_supports_rs_rollback`` is true for glm5-next, so ``partial_rollback`` stays True.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..layout import DIMS, F32, SHAPE_TINY, Const, Constructed, Dims, Normal, TensorLayout
from ..tokenizer import build_vocab
from .base import HParam, SynthArch, SynthSpec, biased_moe_ffn, common_hyperparameters, in_std, norm, out_proj, weight
from .deepseek2 import EXPERT_GATING_SIGMOID, MLA, MlaDims, mla_attention
from .qwen35 import dense_ffn, full_attention_interval

#: deepseek2's tiny MLA without the rotary part: GLM5-Next's MLA is nope-only
NOPE_MLA = dataclasses.replace(MLA, qk_rope_head_dim=0, rms_eps=1e-5)


@dataclass(frozen=True)
class Glm5NextConfig:
    """What GLM-5.3-Flash's ``config.json`` sets besides :class:`Dims` / :class:`MlaDims`, shrunk:
    KDA head size, the indexer's geometry (``top_k`` a multiple of ``kpool``, as the loader
    asserts; ``n_head * head_dim`` 256 so ``indexer.attn_q_b`` stays a 256-multiple) and mHC."""

    kda_head_dim: int = 128  # linear_attn_config.head_dim: d_inner = n_head * 128 = 256
    indexer_n_head: int = 2
    indexer_head_dim: int = 128
    indexer_top_k: int = 16  # 4 pools of 4 tokens, plus the incomplete tail
    indexer_kpool: int = 4
    indexer_select_tail: bool = True
    hc_mult: int = 4  # the loader asserts 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    hc_scale: float = 0.1  # keeps the per-token mixes a small perturbation of hc_base
    layer_norm_eps: float = 1e-6  # the indexer's k_norm (LayerNorm); the converter writes 1e-6


GLM5 = Glm5NextConfig()


def kda_mixer(p: str, d: Dims, c: Glm5NextConfig) -> list[TensorLayout]:
    """A KDA block's mixer, as ``load_arch_tensors`` creates it for a recurrent layer."""
    n, hd, w = d.n_embd, c.kda_head_dim, in_std(d.n_embd)
    inner = hd * d.n_head
    convs = [TensorLayout(f"{p}ssm_conv1d_{x}.weight", (d.ssm_conv_kernel, 1, inner, 1), F32, Normal(0.5))
             for x in "qkv"]
    return convs + [
        weight(p + "attn_q.weight", (n, inner), w),
        weight(p + "attn_k.weight", (n, inner), w),
        weight(p + "attn_v.weight", (n, inner), w),
        weight(p + "ssm_f_a.weight", (n, hd), w),
        weight(p + "ssm_f_b.weight", (hd, inner), in_std(hd)),
        weight(p + "ssm_beta.weight", (n, d.n_head), w),
        TensorLayout(p + "ssm_a", (d.n_head,), F32, Constructed.SSM_A),
        TensorLayout(p + "ssm_dt.bias", (inner,), F32, Normal(0.1, mean=1.0)),
        weight(p + "ssm_g_a.weight", (n, hd), w),
        weight(p + "ssm_g_b.weight", (hd, inner), in_std(hd)),
        norm(p + "ssm_norm.weight", hd),
        out_proj(p + "attn_output.weight", inner, n),
    ]


def kpool_indexer(p: str, d: Dims, m: MlaDims, c: Glm5NextConfig) -> list[TensorLayout]:
    """The DSA indexer with k-pool compression; ``proj`` and the pool gate/bias F32 (the converter
    forces ``INDEXER_PROJ`` and ``indexer_compressor_*``)."""
    n, hd = d.n_embd, c.indexer_head_dim
    return [
        norm(p + "indexer.k_norm.weight", hd),
        TensorLayout(p + "indexer.k_norm.bias", (hd,), F32, Const(0.0)),
        weight(p + "indexer.proj.weight", (n, c.indexer_n_head), in_std(n), F32),
        weight(p + "indexer.attn_k.weight", (n, hd), in_std(n)),
        weight(p + "indexer.attn_q_b.weight", (m.q_lora_rank, c.indexer_n_head * hd), in_std(m.q_lora_rank)),
        weight(p + "indexer_compressor_gate.weight", (n, hd), in_std(n), F32),
        weight(p + "indexer_compressor_ape.weight", (hd, c.indexer_kpool), 0.1, F32),
    ]


def hyper_connections(p: str, d: Dims, c: Glm5NextConfig) -> list[TensorLayout]:
    """The mHC mixers around the attention and the FFN of a trunk block (F32)."""
    hc, n_mix = c.hc_mult, (2 + c.hc_mult) * c.hc_mult
    out: list[TensorLayout] = []
    for site in ("attn", "ffn"):
        out += [weight(f"{p}hc_{site}_fn.weight", (hc * d.n_embd, n_mix), in_std(hc * d.n_embd), F32),
                weight(f"{p}hc_{site}_base.weight", (n_mix,), 0.1, F32),
                TensorLayout(f"{p}hc_{site}_scale.weight", (3,), F32, Const(c.hc_scale))]
    return out


def glm5_next_hyperparameters(spec: SynthSpec, d: Dims, m: MlaDims, c: Glm5NextConfig) -> list[HParam]:
    """The ``glm5-next.*`` keys past the common ones, in ``Glm5NextModel.set_gguf_parameters``' order."""
    kinds = [il >= spec.layers or not is_recurrent(il, spec) for il in range(spec.layers + spec.n_mtp_blocks)]
    return [
        ("feed_forward_length", d.n_ff), ("attention.head_count", d.n_head),
        ("attention.layer_norm_rms_epsilon", float(m.rms_eps)),
        ("expert_count", d.n_expert), ("expert_used_count", d.n_expert_used),
        ("expert_gating_func", EXPERT_GATING_SIGMOID),
        # 0 marks a KDA layer; the NextN block is DSA
        ("attention.head_count_kv", [1 if attn else 0 for attn in kinds]),
        ("vocab_size", len(build_vocab(spec.shape))), ("attention.layer_norm_epsilon", float(c.layer_norm_eps)),
        ("ssm.conv_kernel", d.ssm_conv_kernel), ("kda.head_dim", c.kda_head_dim),
        ("attention.q_lora_rank", m.q_lora_rank), ("attention.kv_lora_rank", m.kv_lora_rank),
        ("rope.dimension_count", m.qk_rope_head_dim),
        ("attention.key_length", m.k_head_cache), ("attention.value_length", m.kv_lora_rank),
        ("attention.key_length_mla", m.k_head_mla), ("attention.value_length_mla", m.v_head_dim),
        ("attention.indexer.head_count", c.indexer_n_head), ("attention.indexer.key_length", c.indexer_head_dim),
        ("attention.indexer.top_k", c.indexer_top_k), ("attention.indexer.kpool", c.indexer_kpool),
        ("attention.indexer.kpool_select_tail", c.indexer_select_tail),
        ("attention.indexer.types", [True] * spec.layers),
        ("hyper_connection.count", c.hc_mult), ("hyper_connection.sinkhorn_iterations", c.hc_sinkhorn_iters),
        ("hyper_connection.epsilon", float(c.hc_eps)),
        ("leading_dense_block_count", m.leading_dense_blocks), ("expert_feed_forward_length", d.n_ff_exp),
        ("expert_shared_count", m.n_expert_shared), ("expert_weights_scale", m.expert_weights_scale),
        ("expert_weights_norm", True),
    ]


def is_recurrent(il: int, spec: SynthSpec) -> bool:
    """Trunk block ``il`` is KDA unless it is the last of each ``full_attention_interval``."""
    return (il + 1) % full_attention_interval(spec) != 0


class Glm5Next(SynthArch):
    """``glm5-next``: KDA/DSA hybrid trunk with mHC, one NextN (DSA + MoE) block."""

    name = "glm5-next"
    source = "src/models/glm5-next.cpp"
    shapes = (SHAPE_TINY,)
    max_mtp_layers = 1  # the memory's MTP context holds "a single DSA layer"
    # llm_arch_supports_rs_rollback(LLM_ARCH_GLM5_NEXT) is true at 0c1e570
    partial_rollback = True

    def dims(self, spec: SynthSpec) -> Dims:
        return dataclasses.replace(DIMS[spec.shape], rms_eps=NOPE_MLA.rms_eps)

    def hyperparameters(self, spec: SynthSpec) -> list[HParam]:
        d = self.dims(spec)
        return common_hyperparameters(spec, d) + glm5_next_hyperparameters(spec, d, NOPE_MLA, GLM5)

    def _block(self, il: int, spec: SynthSpec, recurrent: bool, moe: bool) -> list[TensorLayout]:
        d, m, p = self.dims(spec), NOPE_MLA, f"blk.{il}."
        out = [norm(p + "attn_norm.weight", d.n_embd)]
        if recurrent:
            out += kda_mixer(p, d, GLM5)
        else:
            out += mla_attention(p, d, m) + kpool_indexer(p, d, m, GLM5)
        out.append(norm(p + "ffn_norm.weight", d.n_embd))
        return out + (biased_moe_ffn(p, d, d.n_ff_exp * m.n_expert_shared) if moe else dense_ffn(p, d))

    def trunk_block(self, il: int, spec: SynthSpec) -> list[TensorLayout]:
        block = self._block(il, spec, is_recurrent(il, spec), moe=il >= NOPE_MLA.leading_dense_blocks)
        return block + hyper_connections(f"blk.{il}.", self.dims(spec), GLM5)

    def mtp_block(self, il: int, spec: SynthSpec) -> list[TensorLayout]:
        # DSA + MoE: past the leading dense block whatever ``il`` (0 when the spec lists suffixes)
        return self._block(il, spec, recurrent=False, moe=True)

    def servable(self, spec: SynthSpec) -> bool:
        return spec.layers >= 2 and not spec.mtp_only

    def unservable_reason(self, spec: SynthSpec) -> str:
        if spec.mtp_only:  # the loader creates every trunk tensor with flags 0
            return "llama.cpp 0c1e570's glm5-next loader requires the trunk (no MTP-only sidecar)"
        return super().unservable_reason(spec) or \
            "llama.cpp 0c1e570 needs >= 2 trunk layers for this hybrid architecture"


ARCHES = (Glm5Next(),)
