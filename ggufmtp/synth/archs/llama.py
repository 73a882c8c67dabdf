"""``llama``: a dense transformer with no MTP (NextN) graph in llama.cpp 0c1e570.

The counter-example of issue #21: the commands must refuse an MTP recipe on it with one clear
error naming the architectures that do have an MTP graph
(:data:`ggufmtp.constants.MTP_ARCHITECTURES`), so it is only written with ``mtp=False``.

Names, shapes and keys from ``src/models/llama.cpp`` (``load_arch_tensors``: ``attn_norm``,
``attn_q/k/v``, ``attn_output``, ``ffn_norm``, ``ffn_gate/up/down`` per block; ``output`` is
optional there but the converter writes it) and ``conversion/llama.py`` (``LlamaModel``: the base
keys plus ``vocab_size`` and ``rope.dimension_count`` = the head size, which the graph asserts;
no ``nextn_predict_layers``). The tokenizer and chat template are every synthetic model's.
"""

from __future__ import annotations

from ...errors import SynthError
from ..layout import SHAPE_TINY, TensorLayout
from ..tokenizer import build_vocab
from .base import HParam, SynthArch, SynthSpec, in_std, norm, out_proj, weight
from .qwen35 import dense_ffn

#: Why an MTP block cannot be written for it (shown by ``ggufmtp synth --arch llama``).
NO_MTP_GRAPH = ("arch llama has no MTP (NextN) graph in llama.cpp 0c1e570 (src/models/llama.cpp): "
                "write it without the MTP block (--no-mtp / SynthSpec(mtp=False))")


class Llama(SynthArch):
    """Dense ``llama``: RMS-norm attention (no output gate, no Q/K norms) and a SwiGLU FFN."""

    name = "llama"
    source = "src/models/llama.cpp"
    shapes = (SHAPE_TINY,)
    # 1 only because SynthSpec.validate requires 1 <= mtp_layers <= max_mtp_layers even with mtp=False;
    # any MTP block is refused in mtp_block below.
    max_mtp_layers = 1

    def hyperparameters(self, spec: SynthSpec) -> list[HParam]:
        d = self.dims(spec)
        # llama's graph asserts n_rot == head size: the rope covers the whole head
        return [("context_length", d.ctx), ("embedding_length", d.n_embd), ("feed_forward_length", d.n_ff),
                ("block_count", spec.layers), ("attention.head_count", d.n_head),
                ("attention.head_count_kv", d.n_head_kv), ("rope.freq_base", float(d.rope_freq_base)),
                ("attention.layer_norm_rms_epsilon", float(d.rms_eps)),
                ("vocab_size", len(build_vocab(spec.shape))), ("rope.dimension_count", d.head_dim)]

    def trunk_block(self, il: int, spec: SynthSpec) -> list[TensorLayout]:
        d, p = self.dims(spec), f"blk.{il}."
        n, hq, hkv, w = d.n_embd, d.head_dim * d.n_head, d.head_dim * d.n_head_kv, in_std(d.n_embd)
        attn = [norm(p + "attn_norm.weight", n),
                weight(p + "attn_q.weight", (n, hq), w), weight(p + "attn_k.weight", (n, hkv), w),
                weight(p + "attn_v.weight", (n, hkv), w), out_proj(p + "attn_output.weight", hq, n)]
        return attn + [norm(p + "ffn_norm.weight", n)] + dense_ffn(p, d)

    def mtp_block(self, il: int, spec: SynthSpec) -> list[TensorLayout]:
        """None: SynthSpec.validate also asks with ``mtp=False`` (for the omit-tensor names), and
        gets an empty block then; a spec that wants the block gets :data:`NO_MTP_GRAPH`."""
        if spec.n_mtp_blocks or spec.mtp_only:
            raise SynthError(NO_MTP_GRAPH)
        return []

    def servable(self, spec: SynthSpec) -> bool:
        return spec.layers >= 1 and not spec.n_mtp_blocks and not spec.mtp_only

    def unservable_reason(self, spec: SynthSpec) -> str:
        return NO_MTP_GRAPH if spec.n_mtp_blocks or spec.mtp_only else ""


ARCHES = (Llama(),)
