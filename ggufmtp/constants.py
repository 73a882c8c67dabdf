"""Pinned versions and the GGUF/llama.cpp constants ggufmtp relies on, in one place."""

from __future__ import annotations

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
# The llama.cpp commit vendored in the llama-cpp-python sdist above; every receipt records it.
LLAMA_CPP_COMMIT = "0c1e570"
GGUF_VERSION = "0.19.0"

RUNTIME_BINARIES = ("llama-server", "llama-quantize", "llama-imatrix", "llama-perplexity")
# Built with the runtime, but a runtime built before one was added still loads: it gets the binary
# built into its bin dir on first use (runtime/build.py: ensure_extra_binary), not a full rebuild.
SPLIT_TOOL = "llama-gguf-split"
# llama.cpp's own memory projection (tools/fit-params, ``--fit-print on``), read by the memory plan
FIT_PARAMS_TOOL = "llama-fit-params"
EXTRA_BINARIES = (SPLIT_TOOL, FIT_PARAMS_TOOL)

# Architectures whose llama.cpp graph has an MTP (NextN) draft path (LLM_GRAPH_TYPE_DECODER_MTP).
# glm5-next mentions the graph type at 0c1e570 only to throw "NextN graph not implemented yet".
# The runtime build derives the same set from the source it compiles (runtime.json's
# ``mtp_architectures``); tests/test_mtp_architectures.py fails when the two disagree.
MTP_ARCHITECTURES = frozenset(
    {
        "bailingmoe3", "cohere2moe", "deepseek2", "deepseek32", "deepseek4", "glm-dsa", "glm4moe",
        "hy_v3", "mimo2", "nemotron_h_moe", "qwen35", "qwen35moe", "qwen3next", "step35",
    }
)

# NextN tensors the loader requires for these architectures (besides the block's own
# attention/FFN tensors); the optional ones fall back to token_embd / output / output_norm.
NEXTN_REQUIRED = ("nextn.eh_proj", "nextn.enorm", "nextn.hnorm")
NEXTN_OPTIONAL_FALLBACKS = {
    "nextn.embed_tokens": "token_embd",
    "nextn.shared_head_head": "output",
    "nextn.shared_head_norm": "output_norm",
}
# Where an architecture's MTP graph reads another tensor in place of an optional NextN one ({block}:
# the MTP block): bailingmoe3 loads no nextn.shared_head_norm, its final norm is the block's required
# layer_output_norm (src/models/bailingmoe3.cpp, LLM_TENSOR_LAYER_OUT_NORM).
NEXTN_ARCH_FALLBACKS: dict[str, dict[str, str]] = {
    "bailingmoe3": {"nextn.shared_head_norm": "blk.{block}.layer_output_norm"},
    # src/models/mimo2.cpp graph_mtp: shared_head_norm, else the block's (optional) layer_output_norm,
    # which is where the converter puts the checkpoint's final_layernorm, else output_norm
    "mimo2": {"nextn.shared_head_norm": "blk.{block}.layer_output_norm"},
}
