"""A local Hugging Face safetensors checkpoint, read from its headers only (no tensor data loaded).

What ``convert`` and ``audit --source`` need to know before the converter runs: the config's layer
counts, the shards (from ``model.safetensors.index.json`` or a single ``model.safetensors``), every
tensor's dtype and shape, and the MTP head. Checkpoints name it in one of two ways, both read the
way the pinned converter reads them:

- Qwen3.5/3.6 and Qwen3-Next: ``mtp.*`` tensors; the layer count is the config's
  ``mtp_num_hidden_layers`` or, when the config omits it (Qwen3.6 does), inferred from the
  ``mtp.layers.<k>.*`` names;
- GLM-4.5/4.6/4.7, DeepSeek-V3 and kin: ``num_nextn_predict_layers`` NextN layers stored as ordinary
  decoder layers after the trunk, ``model.layers.<num_hidden_layers + k>.*`` (their ``eh_proj``,
  ``enorm``, ``hnorm``, ``shared_head.*`` and ``embed_tokens`` included).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypedDict, cast

from ..errors import ConvertError
from ..files.fsutil import MAX_TEXT_FILE_BYTES, read_regular_file
from ..files.hashing import sha256_file
from ..jsontypes import JsonObject

__all__ = ["SourceTensor", "MTPHead", "SourceCheckpoint", "read_checkpoint", "mtp_head", "SOURCE_SUFFIX", "NO_MTP"]

#: what "no MTP head" means in a checkpoint, for the errors that say so
NO_MTP = "no MTP tensors (no mtp.* tensors, and no NextN layers model.layers.<num_hidden_layers + k>.*)"

INDEX_NAME = "model.safetensors.index.json"
SOURCE_SUFFIX = ".source.json"  # sidecar next to a converted GGUF: what it was converted from
_MTP_LAYER = re.compile(r"^(?:model\.)?mtp\.layers\.(\d+)\.")
_DECODER_LAYER = re.compile(r"^(?:model\.)?(?:language_model\.)?layers\.(\d+)\.")


class HFConfig(TypedDict, total=False):
    """The keys of a checkpoint's ``config.json`` read here (it holds many more)."""

    architectures: list[str]
    num_hidden_layers: int
    mtp_num_hidden_layers: int
    num_nextn_predict_layers: int
    text_config: HFConfig  # multimodal configs nest the language model's keys here


@dataclass(frozen=True)
class SourceTensor:
    name: str
    dtype: str  # safetensors dtype name: BF16, F16, F32, ...
    shape: tuple[int, ...]
    file: str

    def to_dict(self) -> JsonObject:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "file": self.file}


@dataclass(frozen=True)
class MTPHead:
    """The MTP block a checkpoint carries, and what its config says about it."""

    tensors: list[SourceTensor]
    layers_in_config: int | None  # mtp_num_hidden_layers (or num_nextn_predict_layers), None when omitted
    layers_in_tensors: int  # 1 + the highest MTP layer index in the names (0 without such tensors)
    trunk_layers: int | None  # num_hidden_layers
    config_key: str = "mtp_num_hidden_layers"  # the config key counting them (GLM/DeepSeek: num_nextn_predict_layers)

    @property
    def present(self) -> bool:
        return bool(self.tensors)

    @property
    def layers(self) -> int:
        """The MTP layer count the converter should keep (config first, else inferred)."""
        return self.layers_in_config or self.layers_in_tensors

    def to_dict(self) -> JsonObject:
        return {"present": self.present, "layers": self.layers, "layers_in_config": self.layers_in_config,
                "layers_in_tensors": self.layers_in_tensors, "trunk_layers": self.trunk_layers,
                "config_key": self.config_key,
                "tensors": [t.to_dict() for t in self.tensors]}


def _text_config(config: HFConfig) -> HFConfig:
    """Multimodal Qwen3.5/3.6 configs nest the language model's keys under ``text_config``."""
    return {**config, **config.get("text_config", {})}


def mtp_head(config: HFConfig, tensors: list[SourceTensor]) -> MTPHead:
    """Which tensors form the MTP head and how many layers it has (``mtp.*`` tensors, else the
    NextN layers after the trunk)."""
    cfg = _text_config(config)
    trunk = cfg.get("num_hidden_layers")
    mtp = [t for t in tensors if t.name.startswith(("mtp.", "model.mtp."))]
    if mtp:
        indices = [int(m.group(1)) for t in mtp if (m := _MTP_LAYER.match(t.name))]
        in_config = cfg.get("mtp_num_hidden_layers")
        return MTPHead(mtp, int(in_config) if in_config else None, max(indices) + 1 if indices else 0, trunk)
    return _nextn_layers(cfg, tensors, trunk)


def _nextn_layers(cfg: HFConfig, tensors: list[SourceTensor], trunk: int | None) -> MTPHead:
    """GLM/DeepSeek: ``model.layers.<trunk + k>.*``; the converter keeps ``num_nextn_predict_layers``."""
    key: Literal["num_nextn_predict_layers", "mtp_num_hidden_layers"] = (
        "num_nextn_predict_layers" if "num_nextn_predict_layers" in cfg else "mtp_num_hidden_layers")
    in_config = int(cfg[key]) if cfg.get(key) else None
    if not isinstance(trunk, int):
        return MTPHead([], in_config, 0, None, key)
    after = [(int(m.group(1)), t) for t in tensors if (m := _DECODER_LAYER.match(t.name)) and int(m.group(1)) >= trunk]
    indices = {i for i, _ in after}
    return MTPHead([t for _, t in after], in_config, max(indices) - trunk + 1 if indices else 0, trunk, key)


@dataclass
class SourceCheckpoint:
    """A local safetensors checkpoint directory."""

    directory: Path
    config: HFConfig
    shards: list[str]
    tensors: list[SourceTensor]
    mtp: MTPHead
    sha256: dict[str, str] = field(default_factory=dict)  # file -> digest, filled by ``hash_files``

    @property
    def architecture(self) -> str | None:
        archs = self.config.get("architectures") or []
        return archs[0] if archs else None

    def files(self) -> list[str]:
        """Every file the conversion reads: config, tokenizer files, index and shards."""
        names = sorted(p.name for p in self.directory.iterdir() if p.is_file() and (
            p.suffix in (".json", ".model", ".txt", ".jinja") or p.name in self.shards))
        return [n for n in names if not n.startswith(".") and n != "ggufmtp-manifest.json"]

    def hash_files(self, progress: bool = False) -> dict[str, str]:
        self.sha256 = {n: sha256_file(self.directory / n, progress=progress) for n in self.files()}
        return self.sha256


def _load_json(path: Path) -> JsonObject:
    try:
        data = json.loads(read_regular_file(path, MAX_TEXT_FILE_BYTES).decode("utf-8"))
    except FileNotFoundError:
        raise ConvertError(f"{path}: no such file (a Hugging Face checkpoint has config.json next to its "
                           f"safetensors)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConvertError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(data, dict):
        raise ConvertError(f"{path}: not a JSON object")
    return data


def _shard_names(directory: Path) -> list[str]:
    index = directory / INDEX_NAME
    if index.is_file():
        weight_map = _load_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ConvertError(f"{index}: no weight_map")
        names = sorted(set(weight_map.values()))
        missing = [n for n in names if not (directory / n).is_file()]
        if missing:
            raise ConvertError(f"{index} names shards that are not in {directory}: {', '.join(missing)}")
        return names
    single = sorted(p.name for p in directory.glob("*.safetensors"))
    if not single:
        raise ConvertError(f"{directory}: no *.safetensors files (and no {INDEX_NAME})")
    return single


def _shard_tensors(path: Path) -> list[SourceTensor]:
    """Names, dtypes and shapes from one shard's header (safetensors reads only the header here)."""
    from safetensors import safe_open

    out = []
    try:
        with safe_open(str(path), framework="numpy") as f:
            for name in f.keys():
                sl = f.get_slice(name)
                out.append(SourceTensor(name, sl.get_dtype(), tuple(sl.get_shape()), path.name))
    except Exception as e:  # safetensors raises SafetensorError (and OSError) for damaged files
        raise ConvertError(f"{path}: not a readable safetensors file ({str(e).strip() or type(e).__name__}); "
                           f"the shard is damaged or incomplete: download it again") from None
    if path.stat().st_size < _data_end(path):
        raise ConvertError(f"{path}: truncated (its header describes more bytes than the file holds); "
                           f"download it again")
    return out


def _data_end(path: Path) -> int:
    """The file size a safetensors header promises: 8 + header length + the largest data offset."""
    with open(path, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(n))
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
    return 8 + n + max(ends, default=0)


def read_checkpoint(directory: str | Path) -> SourceCheckpoint:
    """Read a checkpoint's config and shard headers; a damaged shard is one clear error naming it."""
    directory = Path(directory).expanduser().resolve()
    if not directory.is_dir():
        raise ConvertError(f"{directory}: no such directory")
    config = cast(HFConfig, _load_json(directory / "config.json"))
    shards = _shard_names(directory)
    tensors = [t for s in shards for t in _shard_tensors(directory / s)]
    return SourceCheckpoint(directory, config, shards, tensors, mtp_head(config, tensors))
