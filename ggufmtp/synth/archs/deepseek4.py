"""DeepSeek-V4: ``deepseek4`` (DeepSeek-V4-Flash), with manifold-constrained hyper-connections.

Read off ``src/models/deepseek4.cpp`` (``load_arch_hparams``, ``load_arch_tensors``, ``graph``,
``graph_mtp``) and ``conversion/deepseek.py`` (``DeepseekV4Model``) at 0c1e570. What is new against
``deepseek2``:

- **Hyper-connections** (``hyper_connection.count`` 4, asserted): the residual stream is 4 parallel
  copies of width ``n_embd``. Around each attention and each FFN, ``hc_{attn,ffn}_fn`` /
  ``_base`` / ``_scale`` (F32, as the checkpoint stores them) compute per token a positive
  ``pre`` weight per copy (the sublayer's input is their weighted sum), a ``post`` weight per copy
  (how much of the sublayer's output each copy gets) and a Sinkhorn-normalised 4x4 ``comb`` whose
  rows sum to 1 (each copy's new value is a convex mix of the old ones). The head mixes the copies
  with the global ``output_hc_fn`` / ``_base`` / ``_scale`` before ``output_norm``.
- **Attention**: one shared K=V head (``attn_kv``, ``head_count_kv`` 1) with a low-rank query
  (``attn_q_a`` -> ``attn_q_a_norm`` -> ``attn_q_b``), per-head ``attn_sinks``, and a grouped
  low-rank output (``attn_output_a``, stored 2-D and reshaped per ``output_group_count`` group,
  then ``attn_output_b``; synth writes one group, see :class:`Dsv4Dims`). Every trunk layer is
  sliding-window; ``compress_ratios`` (``block_count`` entries) adds, per layer, compressed
  attention: 0 none, 4 CSA (``attn_compressor_*`` plus a lightning indexer, ``indexer.*`` /
  ``indexer_compressor_*``, picking ``indexer.top_k`` compressed blocks), 128 HCA. The trunk has two
  uncompressed layers, then CSA and HCA alternating (``{0, 0, 4, 128}`` for 4 layers, as
  ``tests/test-llama-archs.cpp`` lays deepseek4 out; see :func:`compress_ratio` for short trunks);
  the MTP block is 0 (its graph asserts it: it runs on a plain SWA cache).
- **MoE**: ``sqrtsoftplus`` routing (``expert_gating_func`` 4, the only one the loader takes) with
  the ``exp_probs_b`` selection bias, one shared expert of width ``expert_feed_forward_length``.
  V4-Flash routes its first 3 layers by token id (``hash_layer_count``, an I32 ``ffn_gate_tid2eid``
  table that llama-quantize never touches); synth writes ``hash_layer_count`` 0, the MTP block may
  not be hash-routed anyway.

One MTP block ``blk.<layers>`` (``graph_mtp`` asserts ``nextn_predict_layers`` 1): a full block plus
``nextn.*``. The converter exports MTP only as a sidecar (``--mtp``); the loader also takes the
combined file written here. Widths are tiny with every matrix's ``ne0`` a multiple of 256, so k-quants
apply to all of them. Matrices BF16; F32 for 1-D tensors, the router (``ffn_gate_inp``,
``exp_probs_b``), ``attn_sinks``, the compressors' ``ape`` tables and every ``hc_*`` tensor (float32
parameters in the checkpoint, which the converter keeps F32).

llama.cpp 0c1e570 quirks this layout steers around or that the arch matrix pins: ``key_length``
must differ from ``indexer.key_length`` and the trunk needs a CSA layer (otherwise a Hadamard
rotation size is searched on an empty cache: SIGFPE at context creation); a grouped
``attn_output_a`` cannot be quantized with an imatrix; llama-imatrix leaves ``nextn.eh_proj``
(hyper-connection-shaped input), ``output_hc_fn`` (not ``blk.*``) and the ``ape`` tables (read by
``get_rows``) without statistics, so IQ2_XXS (which requires them) is refused.

Why the bigram chain survives the hyper-connections: the 4 copies start equal (``hc_init`` repeats
the embedding) and each ``comb`` row sums to 1, so equal copies stay equal up to the blocks' ~1e-2
outputs, whatever ``hc_*`` weights say; the head's positive mix of equal copies is the embedding
again after ``output_norm``. In ``graph_mtp``, ``enorm(embed)`` is repeated to the 4 copies and
concatenated first with each ``hnorm``-ed copy of the trunk's (un-mixed) state, so ``eh_proj = [I|0]``
gives 4 equal copies of ``enorm(embed(next))``: the head drafts the chain like every other arch.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..layout import DIMS, F32, SHAPE_TINY, Const, Dims, Normal, TensorLayout
from .base import HParam, SynthArch, SynthSpec, biased_moe_ffn, common_hyperparameters, in_std, norm, out_proj, weight

GATING_SQRT_SOFTPLUS = 4  # LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS (src/llama-hparams.h)
CSA, HCA = 4, 128  # the compression ratios the loader takes besides 0 (DSV4_CSA_RATIO, DSV4_HCA_RATIO)


@dataclass(frozen=True)
class Dsv4Dims:
    """DeepSeek-V4-Flash's geometry, shrunk (real values in comments)."""

    n_head: int = 4  # 64
    # 512: key_length == value_length, nope + rope. Must differ from indexer_head_dim (as it does in
    # V4-Flash): when they are equal, llama_kv_cache forces the Hadamard K rotation on every cache,
    # and build_input_k_rot divides by zero for the MTP context's empty non-SWA cache (SIGFPE)
    head_dim: int = 256
    rope_dim: int = 64
    q_lora_rank: int = 256  # 1024
    # 8 in V4-Flash. 1 here because llama.cpp 0c1e570 cannot quantize a grouped attn_output_a with an
    # imatrix: the loader reshapes the 2-D file tensor to 3-D {n_head*head_dim/groups, o_lora, groups}
    # (load_arch_tensors, TENSOR_ALLOW_RESHAPE), so llama-imatrix records ne0*groups values for it
    # (one slice per group), while llama-quantize expects ne0 * ne2 = ne0 for the 2-D file tensor and
    # throws "imatrix size 1024 is different from tensor size 512" (src/llama-quant.cpp)
    o_groups: int = 1
    o_lora_rank: int = 256  # 1024
    hc_mult: int = 4  # asserted by build_hc_pre
    sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    sliding_window: int = 32  # 128; 32 so a test's reply already slides it
    indexer_heads: int = 4  # 64
    indexer_head_dim: int = 128
    indexer_top_k: int = 8  # 512
    n_expert_shared: int = 1
    expert_weights_scale: float = 1.5
    swiglu_limit: float = 10.0
    rope_freq_base: float = 10000.0
    compress_rope_freq_base: float = 160000.0
    rms_eps: float = 1e-6
    dense_lead: int = 2  # leading layers without compression

    @property
    def hc_mix(self) -> int:
        """``hc_*_fn``'s outputs: ``pre`` and ``post`` per copy, then the copies x copies ``comb``."""
        return (2 + self.hc_mult) * self.hc_mult


DSV4 = Dsv4Dims()


def compress_ratio(il: int, spec: SynthSpec, m: Dsv4Dims = DSV4) -> int:
    """Block ``il``'s ratio: 0 for the leading trunk layers and the MTP block, then CSA and HCA alternating."""
    # Fewer leading layers when the trunk is short: llama.cpp 0c1e570 needs at least one CSA layer.
    # Its lightning-indexer cache always gets the Hadamard K rotation (the indexer key length is the
    # cache's head size), and with no CSA layer that cache is empty: build_input_k_rot's search for
    # the rotation size divides by zero (SIGFPE in build_inp_dsv4, at context creation)
    lead = min(m.dense_lead, spec.layers - 1)
    if il >= spec.layers or il < lead:
        return 0
    return CSA if (il - lead) % 2 == 0 else HCA


def hyper_connection(stem: str, n_embd: int, n_out: int, n_scale: int) -> list[TensorLayout]:
    """``<stem>_fn`` / ``_base`` / ``_scale``, F32 like the checkpoint's: a mixing matrix out of the
    flattened copies (unit-variance mixes), small biases, unit scales. Any values keep the chain
    (see the module docstring): the copies stay equal whatever the mix."""
    hc_dim = DSV4.hc_mult * n_embd
    return [TensorLayout(f"{stem}_fn.weight", (hc_dim, n_out), F32, Normal(in_std(hc_dim))),
            TensorLayout(f"{stem}_base.weight", (n_out,), F32, Normal(0.1)),
            TensorLayout(f"{stem}_scale.weight", (n_scale,), F32, Const(1.0))]


def dsv4_attention(p: str, n: int, m: Dsv4Dims) -> list[TensorLayout]:
    """The sliding-window attention every block has: low-rank query, one K=V head, sinks, and the
    grouped low-rank output (``attn_output_a`` as the file stores it, 2-D)."""
    hq = m.n_head * m.head_dim
    return [
        TensorLayout(p + "attn_sinks.weight", (m.n_head,), F32, Normal(0.5)),
        weight(p + "attn_q_a.weight", (n, m.q_lora_rank), in_std(n)),
        norm(p + "attn_q_a_norm.weight", m.q_lora_rank),
        weight(p + "attn_q_b.weight", (m.q_lora_rank, hq), in_std(m.q_lora_rank)),
        weight(p + "attn_kv.weight", (n, m.head_dim), in_std(n)),
        norm(p + "attn_kv_a_norm.weight", m.head_dim),
        weight(p + "attn_output_a.weight", (hq // m.o_groups, m.o_lora_rank * m.o_groups), in_std(hq // m.o_groups)),
        out_proj(p + "attn_output_b.weight", m.o_groups * m.o_lora_rank, n),
    ]


def compressor(p: str, n: int, ratio: int, m: Dsv4Dims) -> list[TensorLayout]:
    """The compressed-attention tensors of a CSA (ratio 4: overlapping windows, so twice the width,
    plus the lightning indexer and its own compressor) or HCA (ratio 128) layer; ``ape`` F32."""
    width = (2 if ratio == CSA else 1) * m.head_dim
    out = [weight(p + "attn_compressor_kv.weight", (n, width), in_std(n)),
           weight(p + "attn_compressor_gate.weight", (n, width), in_std(n)),
           TensorLayout(p + "attn_compressor_ape.weight", (width, ratio), F32, Normal(0.1)),
           norm(p + "attn_compressor_norm.weight", m.head_dim)]
    if ratio == CSA:
        d = m.indexer_head_dim
        out += [weight(p + "indexer.proj.weight", (n, m.indexer_heads), in_std(n)),
                weight(p + "indexer.attn_q_b.weight", (m.q_lora_rank, m.indexer_heads * d), in_std(m.q_lora_rank)),
                weight(p + "indexer_compressor_kv.weight", (n, 2 * d), in_std(n)),
                weight(p + "indexer_compressor_gate.weight", (n, 2 * d), in_std(n)),
                TensorLayout(p + "indexer_compressor_ape.weight", (2 * d, ratio), F32, Normal(0.1)),
                norm(p + "indexer_compressor_norm.weight", d)]
    return out


def dsv4_hyperparameters(spec: SynthSpec, d: Dims, m: Dsv4Dims) -> list[HParam]:
    """The ``deepseek4.*`` keys past the common ones, as ``DeepseekV4Model.set_gguf_parameters``
    writes them (the base class's first, then V4's own)."""
    n_blocks = spec.layers + spec.n_mtp_blocks
    return [
        ("attention.head_count", m.n_head), ("attention.head_count_kv", 1),
        ("rope.freq_base", m.rope_freq_base), ("attention.layer_norm_rms_epsilon", m.rms_eps),
        ("expert_count", d.n_expert), ("expert_used_count", d.n_expert_used),
        ("expert_gating_func", GATING_SQRT_SOFTPLUS),
        ("attention.key_length", m.head_dim), ("attention.value_length", m.head_dim),
        ("rope.dimension_count", m.rope_dim), ("attention.q_lora_rank", m.q_lora_rank),
        ("attention.sliding_window", m.sliding_window),
        ("expert_feed_forward_length", d.n_ff_exp), ("expert_shared_count", m.n_expert_shared),
        ("expert_weights_scale", m.expert_weights_scale), ("expert_weights_norm", True),
        ("swiglu_clamp_exp", [m.swiglu_limit] * n_blocks), ("swiglu_clamp_shexp", [m.swiglu_limit] * n_blocks),
        ("attention.indexer.head_count", m.indexer_heads), ("attention.indexer.key_length", m.indexer_head_dim),
        ("attention.indexer.top_k", m.indexer_top_k),
        ("attention.output_group_count", m.o_groups), ("attention.output_lora_rank", m.o_lora_rank),
        ("attention.compress_ratios", [compress_ratio(il, spec, m) for il in range(n_blocks)]),
        ("attention.compress_rope_freq_base", m.compress_rope_freq_base),
        ("hyper_connection.count", m.hc_mult), ("hyper_connection.sinkhorn_iterations", m.sinkhorn_iters),
        ("hyper_connection.epsilon", m.hc_eps), ("hash_layer_count", 0),
        ("embedding_length_out", d.n_embd * m.hc_mult),
    ]


class DeepSeek4(SynthArch):
    """``deepseek4``: V4-Flash's block layout with hyper-connections, one MTP block."""

    name = "deepseek4"
    source = "src/models/deepseek4.cpp"
    shapes = (SHAPE_TINY,)
    max_mtp_layers = 1  # graph_mtp asserts n_layer_nextn == 1

    def dims(self, spec: SynthSpec) -> Dims:
        return DIMS[SHAPE_TINY]

    def hyperparameters(self, spec: SynthSpec) -> list[HParam]:
        d = self.dims(spec)
        return common_hyperparameters(spec, d) + dsv4_hyperparameters(spec, d, DSV4)

    def extra_globals(self, spec: SynthSpec) -> list[TensorLayout]:
        """The head's hyper-connection mix (``output_hc_*``; ``mtp.N.hc_head_*`` in an MTP-only
        conversion): one ``pre`` weight per copy, one scale."""
        return hyper_connection("output_hc", self.dims(spec).n_embd, DSV4.hc_mult, 1)

    def _block(self, il: int, spec: SynthSpec) -> list[TensorLayout]:
        d, p, m = self.dims(spec), f"blk.{il}.", DSV4
        out = [norm(p + "attn_norm.weight", d.n_embd)] + dsv4_attention(p, d.n_embd, m)
        # scales: pre, post, comb
        out += hyper_connection(p + "hc_attn", d.n_embd, m.hc_mix, 3) + hyper_connection(p + "hc_ffn", d.n_embd, m.hc_mix, 3)
        ratio = compress_ratio(il, spec, m)
        if ratio:
            out += compressor(p, d.n_embd, ratio, m)
        out.append(norm(p + "ffn_norm.weight", d.n_embd))
        return out + biased_moe_ffn(p, d, d.n_ff_exp * m.n_expert_shared)

    def trunk_block(self, il: int, spec: SynthSpec) -> list[TensorLayout]:
        return self._block(il, spec)

    def mtp_block(self, il: int, spec: SynthSpec) -> list[TensorLayout]:
        return self._block(il, spec)


ARCHES = (DeepSeek4(),)
