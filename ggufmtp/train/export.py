"""A trained model as the checkpoint Qwen publishes: Qwen3.6's safetensors layout, small.

What the published Qwen/Qwen3.6-35B-A3B repository holds (config and index; see
``/work/shared/llama-cpp-facts.md``) and the pinned converter reads (``conversion/qwen.py``,
``Qwen3_5MoeTextModel`` with ``_QwenMtpMixin``):

- ``config.json``: ``architectures: ["Qwen3_5MoeForConditionalGeneration"]``, ``model_type:
  "qwen3_5_moe"``, the text model under ``text_config`` (``layer_types``, ``full_attention_interval``,
  ``mtp_num_hidden_layers: 1``, ``rope_parameters`` with ``mrope_section``/``mrope_interleaved``,
  ``partial_rotary_factor``) and, ours, ``ggufmtp_trained`` (what trained it, the sha256 of its
  tokenizer.json: the converter's runner then declares the tokenizer, see
  :mod:`ggufmtp.hfconvert.runner`). No vision tower: nothing here trains one, and the converter's
  text path skips it anyway;
- the language model under ``model.language_model.*``, ``lm_head.weight`` at the top, experts
  packed without ``.weight`` (``mlp.experts.gate_up_proj`` [E, 2 x ff, hidden], ``mlp.experts.down_proj``
  [E, hidden, ff]), the 19 ``mtp.*`` tensors at the top (``mtp.fc``, ``mtp.pre_fc_norm_embedding``,
  ``mtp.pre_fc_norm_hidden``, ``mtp.norm``, ``mtp.layers.0.*``);
- every tensor BF16, norms zero-centred (``w``, the converter adds 1), ``A_log`` as trained
  (the converter writes ``-exp(A_log)``), conv1d as [channels, 1, kernel];
- ``model.safetensors.index.json`` over the shard(s); ``tokenizer.json``, ``tokenizer_config.json``
  with the ChatML template.

The converter's own transforms (norm offset, ``A_log``, V-head reordering for
``linear_num_value_heads > linear_num_key_heads``, expert unpacking) are therefore exercised
exactly as on a real checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from ..files.fsutil import atomic_write_text
from ..jsontypes import JsonObject
from .config import TRAINER_VERSION, ModelConfig
from .model import Model, config_from_text_config, new_model, require_torch
from .tokenizer import TokenizerFiles, write_tokenizer_files

if TYPE_CHECKING:  # annotations only: torch is imported when a model is built
    from torch import Tensor

__all__ = ["HF_ARCHITECTURE", "MARKER", "checkpoint_tensors", "export_checkpoint", "load_checkpoint"]

HF_ARCHITECTURE = "Qwen3_5MoeForConditionalGeneration"
MARKER = "ggufmtp_trained"  # config.json key of a checkpoint ggufmtp trained (hfconvert.runner reads it)
INDEX_NAME = "model.safetensors.index.json"
SHARD_BYTES = 2 * 1024**3  # the converter streams shards; 2 GiB each by default, as large releases split theirs


def _published_name(trunk_key: str) -> str:
    """transformers' ``Qwen3_5MoeForCausalLM`` name -> the published ConditionalGeneration name."""
    if trunk_key == "lm_head.weight":
        return trunk_key
    return "model.language_model." + trunk_key.removeprefix("model.")


class TrainMarker(TypedDict):
    """config.json's ``ggufmtp_trained`` as the trainer gives it (the export adds the trainer's
    version and the tokenizer's digest)."""

    preset: str
    key: str
    seed: int
    steps: int
    data_digest: str
    head: str  # trained | initial


def checkpoint_tensors(model: Model, head_state: dict[str, Tensor] | None = None) -> dict[str, Tensor]:
    """Every tensor of the checkpoint (BF16, contiguous, on the CPU), under its published name;
    ``head_state`` replaces the head's weights (the untrained head's export)."""
    torch = require_torch()
    out: dict[str, Tensor] = {}
    for k, v in model.trunk.state_dict().items():
        out[_published_name(k)] = v.detach().to("cpu", torch.bfloat16).contiguous()
    for k, v in (head_state if head_state is not None else model.head.state_dict()).items():
        out[f"mtp.{k}"] = v.detach().to("cpu", torch.bfloat16).contiguous()
    return out


def _config(cfg: ModelConfig, tok: TokenizerFiles, vocab_size: int, marker: TrainMarker) -> JsonObject:
    """The checkpoint's config.json."""
    return {"architectures": [HF_ARCHITECTURE], "model_type": "qwen3_5_moe",
            "text_config": cfg.text_config(vocab_size, tok.eos_id), "tie_word_embeddings": False,
            "dtype": "bfloat16", MARKER: {**marker, "trainer": TRAINER_VERSION, "tokenizer_sha256": tok.sha256}}


def _write_shards(directory: Path, tensors: dict[str, Tensor], shard_bytes: int) -> list[str]:
    """Shards of about ``shard_bytes`` (tensors whole, in order) and the index over them."""
    from ..synth.hf import write_shard_files

    sizes = {n: t.numel() * t.element_size() for n, t in tensors.items()}
    groups: list[list[str]] = [[]]
    acc = 0
    for name in tensors:
        if groups[-1] and acc + sizes[name] > shard_bytes:
            groups.append([])
            acc = 0
        groups[-1].append(name)
        acc += sizes[name]
    return write_shard_files(directory, tensors, groups)


def export_checkpoint(directory: Path, model: Model, cfg: ModelConfig, tok: TokenizerFiles, *,
                      marker: TrainMarker, head_state: dict[str, Tensor] | None = None,
                      shard_bytes: int = SHARD_BYTES) -> Path:
    """Write the checkpoint into ``directory`` (created); ``marker`` goes into config.json's
    ``ggufmtp_trained`` (the preset, key, seed, data digest, which head); shards of at most
    ``shard_bytes`` (where no single tensor is larger)."""
    directory.mkdir(parents=True, exist_ok=True)
    tensors = checkpoint_tensors(model, head_state)
    vocab_size = tensors["lm_head.weight"].shape[0]
    atomic_write_text(directory / "config.json", json.dumps(_config(cfg, tok, vocab_size, marker), indent=2) + "\n")
    write_tokenizer_files(directory, tok)
    _write_shards(directory, tensors, shard_bytes)
    return directory


def load_checkpoint(directory: Path) -> Model:
    """A checkpoint :func:`export_checkpoint` wrote, loaded STRICTLY into transformers' modules and the
    head (float32): every published name must be a parameter and every parameter must be there."""
    torch = require_torch()
    from safetensors.torch import load_file

    directory = Path(directory)
    config = json.loads((directory / "config.json").read_text())
    shards = sorted(set(json.loads((directory / INDEX_NAME).read_text())["weight_map"].values()))
    tensors: dict[str, Tensor] = {}
    for shard in shards:
        tensors.update(load_file(str(directory / shard)))
    model = new_model(config_from_text_config(config["text_config"]))
    trunk = {("lm_head.weight" if k == "lm_head.weight" else "model." + k.removeprefix("model.language_model.")):
             v.to(torch.float32) for k, v in tensors.items() if not k.startswith("mtp.")}
    model.trunk.load_state_dict(trunk, strict=True)
    model.head.load_state_dict({k.removeprefix("mtp."): v.to(torch.float32) for k, v in tensors.items()
                                if k.startswith("mtp.")}, strict=True)
    model.train(False)
    return model
