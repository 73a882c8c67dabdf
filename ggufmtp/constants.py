"""Pinned versions and the GGUF/llama.cpp constants ggufmtp relies on, in one place."""

from __future__ import annotations

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
# The llama.cpp commit vendored in the llama-cpp-python sdist above; every receipt records it.
LLAMA_CPP_COMMIT = "0c1e570"
GGUF_VERSION = "0.19.0"

RUNTIME_BINARIES = ("llama-server", "llama-quantize", "llama-imatrix", "llama-perplexity")

# Architectures whose llama.cpp graph has an MTP (NextN) draft path.
MTP_ARCHITECTURES = frozenset(
    {"qwen35moe", "qwen35", "qwen3next", "glm4moe", "deepseek2", "deepseek32", "mimo2", "step35", "glm-dsa"}
)

# NextN tensors the loader requires for these architectures (besides the block's own
# attention/FFN tensors); the optional ones fall back to token_embd / output / output_norm.
NEXTN_REQUIRED = ("nextn.eh_proj", "nextn.enorm", "nextn.hnorm")
NEXTN_OPTIONAL_FALLBACKS = {
    "nextn.embed_tokens": "token_embd",
    "nextn.shared_head_head": "output",
    "nextn.shared_head_norm": "output_norm",
}
