"""Training a Qwen3.5/3.6-MoE-layout model whose MTP head LEARNED its job (issue #29).

Every other model ggufmtp makes has a head designed to a known acceptance (:mod:`ggufmtp.synth`);
this package trains one, as DeepSeek-V3 and Qwen train theirs: the trunk (transformers' own
``qwen3_5_moe`` modules: Gated DeltaNet, gated full attention, routed + shared experts) and an MTP
head laid out as published checkpoints lay it out (``mtp.fc`` over
``[pre_fc_norm_embedding(embed(x[t+1])); pre_fc_norm_hidden(h[t])]``, one full-attention MoE layer,
``mtp.norm``, the shared ``lm_head``), jointly, LM loss + weighted MTP loss. ``h[t]`` is the trunk's
post-norm hidden state: what the pinned llama.cpp feeds the head (``src/models/qwen35moe.cpp``).

- ``config``     the presets (model, tokenizer, data, schedule) and the content key of a run
- ``data``       the corpus: chat turns made from this Python's standard library, held-out split
- ``tokenizer``  a byte-level BPE trained on the corpus (``tokenizers``), ChatML template
- ``model``      the torch modules (trunk from transformers, our MTP head) and the losses
- ``export``     the published Qwen3.6 checkpoint layout (``Qwen3_5MoeForConditionalGeneration``)
- ``trainer``    the training loop (progress bar, loss log, held-out evaluation): :func:`train`
- ``builtin``    ``builtin:tiny-qwen35moe-trained``: trained once, converted, cached by content

torch and transformers are imported only when a model is built or trained (the ``train`` extra).
"""
