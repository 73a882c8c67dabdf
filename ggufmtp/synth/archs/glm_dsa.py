"""GLM-5 / GLM-5.2 (``GlmMoeDsaForCausalLM``): ``glm-dsa``, DeepSeek sparse attention in GLM's
clothes.

The same blocks as ``deepseek32`` (:mod:`.deepseek32`: deepseek2's MLA with split ``attn_k_b`` /
``attn_v_b``, the lightning indexer, a leading dense block then sigmoid-routed experts with a
shared expert) and the same single MTP block, built by the same ``graph_mtp`` (dense MLA, indexer
unused, ``concat(enorm(embed), hnorm(h))`` with ``h`` the post-``output_norm`` trunk state). What
differs, read off ``src/models/glm-dsa.cpp`` and ``conversion/glm.py`` (``GlmMoeDsaModel``) at 0c1e570:

- GLM-5.2's *shared* indexer layers: ``attention.indexer.types`` (one bool per trunk layer, true =
  "full") marks the layers that own an indexer; a "shared" layer reuses the ``top_k`` of the last
  full layer (the graph asserts one precedes it), carries no indexer tensors (the loader takes
  every indexer tensor as optional) and has no indexer KV cache. Written here with GLM-5.2's
  pattern (``config.json`` ``indexer_types``: layers 0-1 full, then one full layer in four from
  layer 2), so a 4-layer trunk is full, full, full, shared. The key matters: without it the loader
  decides by the training context (``n_ctx_train < 1048576``: GLM-5/5.1, every layer full), and a
  tiny file's context is small;
- the indexer's RoPE is ``LLAMA_ROPE_TYPE_NORM`` (deepseek32: NEOX), like the rest of the model;
  no file difference;
- ``expert_gating_func`` is optional (sigmoid when absent); written anyway, as the converter's
  ``TextModel.set_gguf_parameters`` (``conversion/base.py``) writes it from ``scoring_func``;
- GLM-5's scalars: RoPE base 1e6, RMS epsilon 1e-5, ``routed_scaling_factor`` 2.5.

The MTP block carries an indexer like the trunk's full layers (optional for this loader, never read
by ``graph_mtp``), its ``nextn.*`` tensors as deepseek32's.
"""

from __future__ import annotations

import dataclasses

from .base import HParam, SynthSpec
from .deepseek2 import MLA
from .deepseek32 import DsaArch

#: GLM-5.2's ``indexer_types``: layers 0 and 1 own an indexer, then every fourth layer from 2
#: (``GLM_5_2_DEFAULT_INDEXER_TYPES`` in src/models/glm-dsa.cpp)
FULL_INDEXER_LEAD, FULL_INDEXER_EVERY = 2, 4

#: GLM-5's RoPE base, norm epsilon and routing scale on deepseek2's tiny MLA geometry
GLM_DSA_MLA = dataclasses.replace(MLA, expert_weights_scale=2.5, rope_freq_base=1e6, rms_eps=1e-5)


def full_indexer(il: int) -> bool:
    """Whether trunk layer ``il`` owns an indexer in GLM-5.2's pattern ("full"; else "shared")."""
    return il < FULL_INDEXER_LEAD or (il - FULL_INDEXER_LEAD) % FULL_INDEXER_EVERY == 0


class GlmDsa(DsaArch):
    """``glm-dsa``: deepseek32's blocks with GLM-5.2's full/shared indexer layers."""

    name = "glm-dsa"
    source = "src/models/glm-dsa.cpp"
    mla = GLM_DSA_MLA

    def hyperparameters(self, spec: SynthSpec) -> list[HParam]:
        # the converter writes indexer.types after the other indexer keys; one entry per trunk layer
        # (the loader reads n_layer() of them and rejects another length)
        return super().hyperparameters(spec) + [
            ("attention.indexer.types", [full_indexer(il) for il in range(spec.layers)])]

    def trunk_indexer(self, il: int, spec: SynthSpec) -> bool:
        return full_indexer(il)


ARCHES = (GlmDsa(),)
