"""DeepSeek-V3.2 (``DeepseekV32ForCausalLM``, e.g. DeepSeek-V3.2-Exp): ``deepseek32``, DeepSeek
sparse attention (DSA) on top of deepseek2's MLA.

Every block is a deepseek2 block (MLA attention with split ``attn_k_b`` / ``attn_v_b``; a leading
dense FFN block, then routed experts with sigmoid gating and the ``exp_probs_b`` bias plus a shared
expert -- the :mod:`.deepseek2` helpers) plus the *lightning indexer*, which picks the ``top_k``
cached tokens each query attends to: ``indexer.attn_q_b`` {q_lora_rank, n_idx_head * idx_head}
(from the query's low-rank latent), ``indexer.attn_k`` {n_embd, idx_head} (one key head, LayerNorm
``indexer.k_norm`` weight and bias), and the per-head score weights ``indexer.proj`` {n_embd,
n_idx_head}, which ``prepare_tensors`` keeps F32 (``conversion/base.py``: "DSA indexer weights
should be F32"). Names, shapes and keys from ``src/models/deepseek32.cpp`` (``load_arch_hparams``,
``load_arch_tensors``, ``graph``, ``graph_mtp``) and ``conversion/deepseek.py`` (``DeepseekV32Model``:
``DeepseekV2Model``'s keys plus ``attention.indexer.{head_count,key_length,top_k}`` and
``nextn_predict_layers``; unlike ``DeepseekV2Model`` it keeps the MTP layer) at 0c1e570.

One MTP block ``blk.<layers>`` (``graph_mtp`` asserts ``n_layer_nextn == 1``, MLA and an MoE FFN):
a whole DSA decoder block -- the loader *requires* its indexer tensors too, though ``graph_mtp``
runs dense MLA over its own plain KV cache and never reads them -- plus its ``nextn.*`` tensors.
Its input is ``concat(enorm(embed), hnorm(h))`` with ``h`` the trunk's post-``output_norm`` state
(``t_h_nextn``), the order :mod:`ggufmtp.synth` assumes.

Tiny widths: the MLA geometry of :data:`.deepseek2.MLA`; the indexer's head is 128 wide (as the real
model's): the trunk graph multiplies indexer queries and keys by a Hadamard rotation whose size is
the largest power of two (>= 64) dividing the head, so the head must be a power of two, and at
least ``qk_rope_head_dim`` (``GGML_ASSERT(n_rot <= n_embd_indexer_head)``). ``top_k`` is the
training context (the real model: 2048): the graph keeps ``min(n_kv, top_k)`` tokens, so every
cached token stays selected and sparse attention equals dense MLA at any context the file allows.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..layout import F32, Const, Dims, TensorLayout
from .base import HParam, SynthArch, SynthSpec, biased_moe_ffn, common_hyperparameters, in_std, norm, weight
from .deepseek2 import MLA, MlaDims, mla_attention, mla_hyperparameters
from .qwen35 import dense_ffn


@dataclass(frozen=True)
class IndexerDims:
    """The lightning indexer's widths: query heads, the (single) key head's width, tokens kept."""

    n_head: int = 2  # index_n_heads (64 in DeepSeek-V3.2, 32 in GLM-5)
    head_dim: int = 128  # index_head_dim: a power of two (the Hadamard rotation), >= qk_rope_head_dim
    top_k: int | None = None  # index_topk; None: the training context (every token kept)


INDEXER = IndexerDims()

#: DeepSeek-V3.2's routing scale and norm epsilon, on deepseek2's tiny MLA geometry (its RoPE is
#: YaRN-scaled from a 4k base; the tiny context needs no scaling)
DEEPSEEK32_MLA = dataclasses.replace(MLA, expert_weights_scale=2.5, rope_freq_base=10000.0, rms_eps=1e-6)


def indexer_tensors(p: str, d: Dims, m: MlaDims, ix: IndexerDims) -> list[TensorLayout]:
    """The lightning indexer of one block: query/key projections (BF16), the key LayerNorm (weight
    ones, bias zeros) and the head weights ``indexer.proj`` (F32, as the converter keeps it)."""
    n = d.n_embd
    return [
        norm(p + "indexer.k_norm.weight", ix.head_dim),
        TensorLayout(p + "indexer.k_norm.bias", (ix.head_dim,), F32, Const(0.0)),
        weight(p + "indexer.proj.weight", (n, ix.n_head), in_std(n), F32),
        weight(p + "indexer.attn_k.weight", (n, ix.head_dim), in_std(n)),
        weight(p + "indexer.attn_q_b.weight", (m.q_lora_rank, ix.n_head * ix.head_dim), in_std(m.q_lora_rank)),
    ]


def indexer_hyperparameters(d: Dims, ix: IndexerDims) -> list[HParam]:
    """``attention.indexer.*`` as ``DeepseekV32Model`` / ``GlmMoeDsaModel`` write them."""
    return [("attention.indexer.head_count", ix.n_head), ("attention.indexer.key_length", ix.head_dim),
            ("attention.indexer.top_k", d.ctx if ix.top_k is None else ix.top_k)]


class DsaArch(SynthArch):
    """A DSA model: deepseek2's MLA blocks plus a lightning indexer; one MoE MTP block. Subclasses
    set :attr:`mla` and say which trunk blocks carry an indexer (:meth:`trunk_indexer`)."""

    mla: MlaDims = DEEPSEEK32_MLA
    indexer: IndexerDims = INDEXER

    def hyperparameters(self, spec: SynthSpec) -> list[HParam]:
        d = self.dims(spec)
        return (common_hyperparameters(spec, d) + mla_hyperparameters(spec, d, self.mla)
                + indexer_hyperparameters(d, self.indexer))

    def trunk_indexer(self, il: int, spec: SynthSpec) -> bool:
        """Whether trunk block ``il`` carries indexer tensors: every one (deepseek32)."""
        return True

    def _block(self, il: int, spec: SynthSpec, moe: bool, indexer: bool) -> list[TensorLayout]:
        d, m, p = self.dims(spec), self.mla, f"blk.{il}."
        out = [norm(p + "attn_norm.weight", d.n_embd)] + mla_attention(p, d, m)
        if indexer:
            out += indexer_tensors(p, d, m, self.indexer)
        out.append(norm(p + "ffn_norm.weight", d.n_embd))
        return out + (biased_moe_ffn(p, d, d.n_ff_exp * m.n_expert_shared) if moe else dense_ffn(p, d))

    def trunk_block(self, il: int, spec: SynthSpec) -> list[TensorLayout]:
        return self._block(il, spec, moe=il >= self.mla.leading_dense_blocks, indexer=self.trunk_indexer(il, spec))

    def mtp_block(self, il: int, spec: SynthSpec) -> list[TensorLayout]:
        # always MoE (graph_mtp asserts ffn_gate_inp) and with an indexer (the checkpoints' MTP
        # layer is a whole DSA decoder layer); not decided from ``il``, which is 0 when
        # spec.mtp_block_suffixes lists the block's tensor names
        return self._block(il, spec, moe=True, indexer=True)


class DeepSeek32(DsaArch):
    """``deepseek32``: every block, the MTP block included, carries an indexer (all required)."""

    name = "deepseek32"
    source = "src/models/deepseek32.cpp"


ARCHES = (DeepSeek32(),)
