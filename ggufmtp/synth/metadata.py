"""The GGUF key/values of a synthetic model: hyperparameters, tokenizer, and where it came from."""

from __future__ import annotations

import json

import gguf

from .archs.registry import arch_for
from .chain import realized_fraction
from .spec import SYNTH_VERSION, SynthSpec
from .tokenizer import CHAT_TEMPLATE, Vocab


def add_metadata(w: gguf.GGUFWriter, spec: SynthSpec, vocab: Vocab) -> None:
    """Add every key/value of ``spec``'s model to ``w`` (``general.architecture`` is the writer's own)."""
    _add_hyperparameters(w, spec)
    _add_tokenizer(w, vocab)
    w.add_string("ggufmtp.synth.spec", json.dumps(spec.to_dict(), sort_keys=True))
    w.add_uint32("ggufmtp.synth.version", SYNTH_VERSION)
    w.add_float32("ggufmtp.synth.wrong_successor_fraction", float(realized_fraction(spec)))


def _add_hyperparameters(w: gguf.GGUFWriter, spec: SynthSpec) -> None:
    w.add_string("general.type", "model")
    w.add_string("general.name", f"ggufmtp synthetic {spec.shape} {spec.arch}")
    w.add_uint32("general.file_type", int(gguf.LlamaFileType.MOSTLY_BF16))
    w.add_uint32("general.quantization_version", gguf.GGML_QUANT_VERSION)
    for key, value in arch_for(spec.arch).hyperparameters(spec):
        _add_value(w, f"{spec.arch}.{key}", value)


def _add_value(w: gguf.GGUFWriter, name: str, value) -> None:
    """As llama.cpp reads them: ints uint32, floats float32, bools bool, strings, lists arrays."""
    if isinstance(value, list):
        w.add_array(name, value)
    elif isinstance(value, bool):
        w.add_bool(name, value)
    elif isinstance(value, float):
        w.add_float32(name, value)
    elif isinstance(value, str):
        w.add_string(name, value)
    else:
        w.add_uint32(name, value)


def _add_tokenizer(w: gguf.GGUFWriter, vocab: Vocab) -> None:
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "qwen2")
    w.add_array("tokenizer.ggml.tokens", list(vocab.tokens))
    w.add_array("tokenizer.ggml.token_type", list(vocab.token_types))
    w.add_array("tokenizer.ggml.merges", list(vocab.merges))
    w.add_uint32("tokenizer.ggml.eos_token_id", vocab.eos)
    w.add_uint32("tokenizer.ggml.padding_token_id", vocab.pad)
    w.add_uint32("tokenizer.ggml.bos_token_id", vocab.bos)
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    w.add_string("tokenizer.chat_template", CHAT_TEMPLATE)
