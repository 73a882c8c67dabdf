"""The GGUF key/values of a synthetic model: hyperparameters, tokenizer, and where it came from."""

from __future__ import annotations

import json

import gguf

from .chain import realized_fraction
from .layout import DIMS
from .spec import SYNTH_VERSION, SynthSpec, full_attention_interval
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
    for key, value in _hyperparameters(spec):
        name = f"{spec.arch}.{key}"
        if isinstance(value, list):
            w.add_array(name, value)
        elif isinstance(value, float):
            w.add_float32(name, value)
        else:
            w.add_uint32(name, value)


def _hyperparameters(spec: SynthSpec) -> list[tuple[str, int | float | list[int]]]:
    """``<arch>.*`` keys in file order: ints are uint32, floats float32, lists arrays (as llama.cpp reads them)."""
    d = DIMS[spec.shape]
    kv: list[tuple[str, int | float | list[int]]] = [
        ("context_length", d.ctx), ("embedding_length", d.n_embd),
        ("block_count", spec.layers + (1 if spec.mtp else 0)), ("nextn_predict_layers", 1 if spec.mtp else 0),
        ("attention.head_count", d.n_head), ("attention.head_count_kv", d.n_head_kv),
        ("attention.key_length", d.head_dim), ("attention.value_length", d.head_dim),
        ("attention.layer_norm_rms_epsilon", float(d.rms_eps)), ("rope.dimension_count", d.rope_dims),
        ("rope.dimension_sections", list(d.rope_sections)), ("rope.freq_base", float(d.rope_freq_base)),
    ]
    if spec.arch == "qwen35moe":
        kv += [("expert_count", d.n_expert), ("expert_used_count", d.n_expert_used),
               ("expert_feed_forward_length", d.n_ff_exp), ("expert_shared_feed_forward_length", d.n_ff_shexp)]
    else:
        kv += [("feed_forward_length", d.n_ff)]
    kv += [("ssm.conv_kernel", d.ssm_conv_kernel), ("ssm.state_size", d.ssm_state),
           ("ssm.group_count", d.ssm_groups), ("ssm.time_step_rank", d.ssm_dt_rank),
           ("ssm.inner_size", d.ssm_inner), ("full_attention_interval", full_attention_interval(spec))]
    return kv


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
