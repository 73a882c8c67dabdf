"""Pinned versions and the GGUF/llama.cpp constants ggufmtp relies on, in one place."""

from __future__ import annotations

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
# The llama.cpp commit vendored in the llama-cpp-python sdist above; every receipt records it.
LLAMA_CPP_COMMIT = "0c1e570"
GGUF_VERSION = "0.19.0"

RUNTIME_BINARIES = ("llama-server", "llama-quantize", "llama-imatrix", "llama-perplexity")

# Architectures whose llama.cpp graph has an MTP (NextN) draft path (LLM_GRAPH_TYPE_DECODER_MTP).
# The runtime build derives the same set from the source it compiles (runtime.json's
# ``mtp_architectures``); tests/test_mtp_architectures.py fails when the two disagree.
MTP_ARCHITECTURES = frozenset(
    {
        "bailingmoe3", "cohere2moe", "deepseek2", "deepseek32", "deepseek4", "glm-dsa", "glm4moe", "glm5-next",
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
