"""Reading a GGUF model's structure, with its MTP (NextN) block: ``ggufmtp inspect``.

The header is read with :mod:`ggufmtp.gguf.reader` (fast on 248k-token vocabularies); tensor
data stays on disk and is reached through memory maps.
Split GGUFs (``name-00001-of-00003.gguf``) are read as one model: metadata from the first shard,
tensors from all of them (an MTP block may lie in any shard), each shard's ``split.*`` keys checked
as llama.cpp's loader checks them (:func:`split_problem`), so a reordered or renamed shard is
refused naming the file.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import re
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import Keys, LlamaFileType

from ..constants import MTP_ARCHITECTURES, NEXTN_ARCH_FALLBACKS, NEXTN_OPTIONAL_FALLBACKS, NEXTN_REQUIRED
from ..errors import GGUFReadError
from ..fmt import human_bytes
from ..jsontypes import JsonObject
from .reader import GGUFHeader, read_header, tensor_nbytes

SPLIT_RE = re.compile(r"^(?P<stem>.*)-(?P<idx>\d{5})-of-(?P<n>\d{5})\.gguf$")

# Tensors of a qwen35-family MTP block that the loader requires, as groups of alternatives
# (a fused tensor or its parts). From src/models/qwen35moe.cpp and qwen35.cpp at 0c1e570.
_ATTN = [("attn_norm",), ("post_attention_norm",), ("attn_qkv", "attn_q+attn_k+attn_v"), ("attn_output",),
         ("attn_q_norm",), ("attn_k_norm",)]
_MOE = [("ffn_gate_inp",), ("ffn_down_exps",), ("ffn_gate_up_exps", "ffn_gate_exps+ffn_up_exps"),
        ("ffn_gate_inp_shexp",), ("ffn_gate_shexp",), ("ffn_up_shexp",), ("ffn_down_shexp",)]
_DENSE = [("ffn_gate",), ("ffn_up",), ("ffn_down",)]
_ROUTED = [("ffn_gate_inp",), ("ffn_down_exps",), ("ffn_gate_up_exps", "ffn_gate_exps+ffn_up_exps")]
# src/models/glm4-moe.cpp and deepseek2.cpp (graph_mtp's asserts and load_block_mtp)
_GLM_ATTN = [("attn_norm",), ("post_attention_norm",), ("attn_qkv", "attn_q+attn_k+attn_v"), ("attn_output",)]
_MLA = [("attn_norm",), ("attn_q_a",), ("attn_q_a_norm",), ("attn_q_b",), ("attn_kv_a_mqa",),
        ("attn_kv_a_norm",), ("attn_k_b",), ("attn_v_b",), ("attn_output",), ("ffn_norm",)]
_SHARED = [("ffn_gate_shexp",), ("ffn_up_shexp",), ("ffn_down_shexp",)]
# src/models/deepseek32.cpp: its loader requires the DSA indexer in the MTP block too (glm-dsa's does not)
_INDEXER = [("indexer.k_norm",), ("indexer.proj",), ("indexer.attn_k",), ("indexer.attn_q_b",)]
# src/models/deepseek4.cpp (load_arch_tensors): a grouped low-rank output (attn_output_a/_b, no
# attn_output) and the block's hyper-connection mixes; exp_probs_b is a .bias, not checked here
_DSV4 = [("attn_norm",), ("attn_sinks",), ("attn_q_a",), ("attn_q_a_norm",), ("attn_q_b",), ("attn_kv",),
         ("attn_kv_a_norm",), ("attn_output_a",), ("attn_output_b",), ("ffn_norm",),
         ("hc_attn_fn",), ("hc_attn_base",), ("hc_attn_scale",), ("hc_ffn_fn",), ("hc_ffn_base",), ("hc_ffn_scale",)]
MTP_BLOCK_REQUIREMENTS: dict[str, list[tuple[str, ...]]] = {
    "qwen35moe": _ATTN + _MOE,
    "qwen3next": _ATTN + _MOE,
    "qwen35": _ATTN + _DENSE,
    "glm4moe": _GLM_ATTN + _ROUTED,
    "deepseek2": _MLA + _ROUTED + _SHARED,
    # src/models/bailingmoe3.cpp: an MLA block with a head-wise gate; its final norm is the block's own
    "bailingmoe3": _MLA + [("attn_gate",), ("layer_output_norm",)] + _ROUTED + _SHARED,
    "deepseek32": _MLA + _ROUTED + _SHARED + _INDEXER,
    "glm-dsa": _MLA + _ROUTED + _SHARED,
    "deepseek4": _DSV4 + _ROUTED + _SHARED,
}
# Other MTP architectures: at least a norm, some attention and some FFN.
_GENERIC_BLOCK = [("attn_norm",), ("attn_output", "attn_out"),
                  ("ffn_down", "ffn_down_exps", "ffn_down_shexp")]


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One tensor as stored: ``shape`` in GGUF order (ne0 first), ``type`` a GGML type name."""

    name: str
    shape: tuple[int, ...]
    type: str
    n_elements: int
    n_bytes: int
    shard: int = 0

    @property
    def block(self) -> int | None:
        m = re.match(r"blk\.(\d+)\.", self.name)
        return int(m.group(1)) if m else None


def shard_path(out: Path, index: int, count: int) -> Path:
    """Shard ``index`` (1-based) of ``count`` of the model ``out`` names, as llama.cpp's
    ``llama_split_path`` names it: ``Model-Q8_0.gguf`` -> ``Model-Q8_0-00001-of-00003.gguf``."""
    return out.with_name(f"{out.name.removesuffix('.gguf')}-{index:05d}-of-{count:05d}.gguf")


def split_shards(path: Path) -> list[Path]:
    """All shards of a split GGUF given any one of them (or ``[path]`` if it is not split)."""
    m = SPLIT_RE.match(path.name)
    if not m:
        return [path]
    n = int(m.group("n"))
    shards = [shard_path(path.with_name(m.group("stem") + ".gguf"), i, n) for i in range(1, n + 1)]
    missing = [s.name for s in shards if not s.exists()]
    if missing:
        raise GGUFReadError(f"{path}: split GGUF is missing shard(s) {', '.join(missing)}")
    return shards


def refuse_later_shard(path: str | os.PathLike) -> None:
    """GGUFReadError when ``path`` is a split model's shard other than the first: llama.cpp loads a
    split model only from its first shard (a later one: "illegal split file idx")."""
    p = Path(path)
    m = SPLIT_RE.match(p.name)
    if m and int(m.group("idx")) != 1:
        first = shard_path(p.with_name(m.group("stem") + ".gguf"), 1, int(m.group("n")))
        raise GGUFReadError(f"{p}: shard {int(m.group('idx'))} of {int(m.group('n'))} of a split model; give its first "
                            f"shard, {first.name}: llama.cpp loads a split model from it")


def split_problem(shard: Path, header: GGUFHeader, index: int, count: int) -> str | None:
    """What llama.cpp's loader would refuse in shard ``index`` (0-based) of ``count`` (1 and 0 for a
    file given alone), or None: a shard whose ``split.no`` is not its place in the set (reordered or
    renamed), a first shard whose ``split.count`` is not the set's size, a file that declares itself
    a shard of a set without a shard's name (llama.cpp could not find its siblings)."""
    md = header.metadata
    declared = md.get(Keys.Split.LLM_KV_SPLIT_COUNT)
    no = md.get(Keys.Split.LLM_KV_SPLIT_NO)
    if count == 1:
        if isinstance(declared, int) and declared > 1:
            return (f"{shard}: declares itself shard {no if isinstance(no, int) else 0} of a {declared}-file split "
                    f"(split.count {declared}) but is not named as one (NAME-00001-of-{declared:05d}.gguf): "
                    f"llama.cpp cannot find its other shards")
        return None
    if no != index:
        return (f"{shard}: named shard {index + 1} of {count}, but its split.no {no} makes it "
                + (f"shard {no + 1}" if isinstance(no, int) else "no shard") + ": the shards were reordered or renamed")
    if index == 0 and declared != count:
        return f"{shard}: split.count is {declared}, but the set has {count} files by its names"
    return None


def _arch_count(header: GGUFHeader, key_template: str) -> int | None:
    """``<arch>.<key>`` of the file's own architecture as an int (None when absent or not a number)."""
    arch = header.metadata.get(Keys.General.ARCHITECTURE)
    try:
        return int(header.metadata[key_template.format(arch=arch)])
    except (KeyError, TypeError, ValueError):
        return None


def has_mtp_head(path: str | os.PathLike) -> bool | None:
    """Whether llama-server would find an MTP head in ``path``: it looks for
    ``blk.<block_count-1>.nextn.eh_proj.weight``. None if the file cannot be read as a GGUF or has
    no block count. Reads the header only."""
    try:
        headers = [read_header(s) for s in split_shards(Path(path))]  # the head may be in any shard
    except (OSError, ValueError):  # GGUFReadError is a ValueError; OSError: mmap of an odd file
        return None
    n = _arch_count(headers[0], Keys.LLM.BLOCK_COUNT)
    if n is None:
        return None
    return any(t.name == f"blk.{n - 1}.nextn.eh_proj.weight" for h in headers for t in h.tensors)


def is_mtp_sidecar(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an MTP-only file (``nextn_predict_layers > 0`` and no trunk), the kind
    ``--spec-draft-model`` takes; False when it cannot be read."""
    try:
        headers = [read_header(s) for s in split_shards(Path(path))]
    except (OSError, ValueError):
        return False
    nextn = _arch_count(headers[0], Keys.LLM.NEXTN_PREDICT_LAYERS) or 0
    return nextn > 0 and all(t.name != "blk.0.attn_norm.weight" for h in headers for t in h.tensors)


class GGUFModel:
    """A GGUF model (one file or all shards of a split one): metadata and tensor table.

    ``metadata`` maps keys to Python values, except arrays longer than a few thousand items
    (the tokenizer's), which are summarised as ``"<array of N>"`` (read them with gguf-py).
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.shards = split_shards(self.path)
        self.metadata: dict[str, Any] = {}
        self.tensors: OrderedDict[str, TensorInfo] = OrderedDict()
        self.tensor_data_offsets: dict[str, int] = {}
        declared_tensors = None
        for i, shard in enumerate(self.shards):
            header = read_header(shard)
            if (problem := split_problem(shard, header, i, len(self.shards))) is not None:
                raise GGUFReadError(problem)
            if i == 0:
                self.metadata = header.metadata
                declared_tensors = header.metadata.get(Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT)
            for t in header.tensors:
                try:
                    n_el, n_bytes, type_name = tensor_nbytes(t.shape, t.type_id)
                except ValueError:
                    raise GGUFReadError(f"{shard}: tensor {t.name} has unknown type id {t.type_id}") from None
                if t.offset + n_bytes > header.file_size:
                    raise GGUFReadError(f"{shard}: truncated GGUF (tensor {t.name} ends at byte "
                                        f"{t.offset + n_bytes}, file has {header.file_size} bytes)")
                if t.name in self.tensors:  # llama.cpp: "invalid model: tensor '...' is duplicated"
                    raise GGUFReadError(f"{shard}: tensor {t.name} is also in {self.shards[self.tensors[t.name].shard]}")
                self.tensors[t.name] = TensorInfo(name=t.name, shape=tuple(int(x) for x in t.shape),
                                                  type=type_name, n_elements=n_el, n_bytes=n_bytes, shard=i)
                self.tensor_data_offsets[t.name] = t.offset
        if len(self.shards) > 1 and declared_tensors != len(self.tensors):
            raise GGUFReadError(f"{self.shards[0]}: split.tensors.count is {declared_tensors}, but the "
                                f"{len(self.shards)} shards hold {len(self.tensors)} tensors")

    # --- architecture ---------------------------------------------------------------------
    @property
    def architecture(self) -> str:
        return str(self.metadata.get(Keys.General.ARCHITECTURE, "unknown"))

    def arch_key(self, suffix: str, default: Any = None) -> Any:
        return self.metadata.get(f"{self.architecture}.{suffix}", default)

    @property
    def block_count(self) -> int:
        return int(self.metadata.get(Keys.LLM.BLOCK_COUNT.format(arch=self.architecture), 0) or 0)

    @property
    def nextn_predict_layers(self) -> int:
        return int(self.metadata.get(Keys.LLM.NEXTN_PREDICT_LAYERS.format(arch=self.architecture), 0) or 0)

    @property
    def trunk_layers(self) -> int:
        return self.block_count - self.nextn_predict_layers

    @property
    def mtp_blocks(self) -> list[int]:
        """Indices of the MTP blocks: the last ``nextn_predict_layers`` of ``block_count``."""
        n = self.nextn_predict_layers
        return list(range(self.block_count - n, self.block_count)) if n > 0 else []

    @property
    def file_type(self) -> str | None:
        ft = self.metadata.get(Keys.General.FILE_TYPE)
        if ft is None:
            return None
        try:
            return LlamaFileType(int(ft)).name.replace("MOSTLY_", "")
        except ValueError:
            return str(ft)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: t.shape for name, t in self.tensors.items()}

    @property
    def size_bytes(self) -> int:
        return sum(s.stat().st_size for s in self.shards)

    @property
    def n_params(self) -> int:
        return sum(t.n_elements for t in self.tensors.values())

    @property
    def tensor_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors.values())

    @property
    def bpw(self) -> float:
        return 8.0 * self.tensor_bytes / self.n_params if self.n_params else 0.0

    def tensor_types(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for t in self.tensors.values():
            slot = out.setdefault(t.type, {"count": 0, "bytes": 0})
            slot["count"] += 1
            slot["bytes"] += t.n_bytes
        return dict(sorted(out.items(), key=lambda kv: -kv[1]["bytes"]))

    def type_table(self) -> dict[str, str]:
        return {name: t.type for name, t in self.tensors.items()}


class MTPStatus(enum.StrEnum):
    """How llama.cpp's loader would see a file's MTP (NextN) block. Compares equal to its value."""

    COMPLETE = "complete"
    INCOMPLETE = "incomplete"
    ABSENT = "absent"
    SIDECAR = "sidecar"  # an MTP block without the trunk (``--spec-draft-model`` file)


@dataclasses.dataclass
class MTPCheck:
    """The MTP blocks' presence and completeness. ``block``: the first MTP block (what single-block
    readers use); ``blocks``: every one of them (``nextn_predict_layers`` > 1: step35's chain)."""

    status: MTPStatus
    block: int | None
    tensors: dict[str, str]  # every MTP block's tensors, block by block
    missing: list[str]
    fallbacks: dict[str, str]  # optional tensor -> what llama.cpp uses instead
    problems: list[str]
    blocks: list[int] = dataclasses.field(default_factory=list)


def _has(names: set[str], prefix: str, alt: str) -> bool:
    return all(f"{prefix}{part}.weight" in names for part in alt.split("+"))


def _missing_block_tensors(model: GGUFModel, names: set[str], blocks: list[int]) -> list[str]:
    """Tensors the loader requires in each MTP block that the file lacks (first alternative named)."""
    missing: list[str] = []
    for b in blocks:
        p = f"blk.{b}."
        for req in NEXTN_REQUIRED:
            if f"{p}{req}.weight" not in names:
                missing.append(f"{p}{req}.weight")
        for alternatives in MTP_BLOCK_REQUIREMENTS.get(model.architecture, _GENERIC_BLOCK):
            if not any(_has(names, p, alt) for alt in alternatives):
                missing.append(f"{p}{alternatives[0].split('+')[0]}.weight")
    return missing


def _fallbacks(names: set[str], blocks: list[int], arch: str = "") -> dict[str, str]:
    """Optional NextN tensors the MTP blocks lack -> the tensor llama.cpp uses instead."""
    fallbacks = {}
    for b in blocks:
        for opt, fallback in NEXTN_OPTIONAL_FALLBACKS.items():
            if f"blk.{b}.{opt}.weight" not in names:
                fb = NEXTN_ARCH_FALLBACKS.get(arch, {}).get(opt, fallback).format(block=b) + ".weight"
                if fb not in names and opt in NEXTN_ARCH_FALLBACKS.get(arch, {}):
                    fb = f"{fallback}.weight"  # mimo2: its layer_output_norm is optional too
                if fallback == "output" and fb not in names:
                    fb = "token_embd.weight"  # tied embeddings: output falls back to token_embd
                fallbacks[f"blk.{b}.{opt}.weight"] = fb
    return fallbacks


def block_prefixes(blocks: list[int]) -> tuple[str, ...]:
    """``("blk.40.", "blk.41.")``: the name prefixes of ``blocks`` (``str.startswith`` takes the tuple)."""
    return tuple(f"blk.{b}." for b in blocks)


def format_blocks(blocks: list[int]) -> str:
    """``blk.40`` or ``blk.40, blk.41``: MTP blocks as messages name them."""
    return ", ".join(f"blk.{b}" for b in blocks)


def _mtp_tensors(model: GGUFModel, blocks: list[int]) -> dict[str, str]:
    """Every tensor of the MTP blocks -> its type, block by block (blk.9 before blk.10), by name within one."""
    prefixes = block_prefixes(blocks)
    picked = [t for t in model.tensors.values() if t.name.startswith(prefixes)]
    return {t.name: t.type for t in sorted(picked, key=lambda t: (t.block, t.name))}


def check_mtp(model: GGUFModel) -> MTPCheck:
    """Decide ``mtp_status`` the way llama.cpp's loader would see the file."""
    names = set(model.tensors)
    nextn_names = sorted(n for n in names if ".nextn." in n)
    blocks = model.mtp_blocks
    if not blocks:
        if nextn_names:
            return MTPCheck(MTPStatus.INCOMPLETE, None, {n: model.tensors[n].type for n in nextn_names},
                            [f"{model.architecture}.nextn_predict_layers (metadata says 0, file has NextN tensors)"],
                            {}, ["NextN tensors present but nextn_predict_layers is 0"])
        return MTPCheck(MTPStatus.ABSENT, None, {}, [], {}, [])
    block_tensors = _mtp_tensors(model, blocks)
    missing = _missing_block_tensors(model, names, blocks)
    problems: list[str] = []
    if model.architecture not in MTP_ARCHITECTURES:
        problems.append(f"architecture {model.architecture} has no MTP draft graph in llama.cpp")
    trunk_present = "blk.0.attn_norm.weight" in names or any(
        t.block is not None and t.block < blocks[0] for t in model.tensors.values()
    )
    if not trunk_present and block_tensors:
        status = MTPStatus.SIDECAR if not missing else MTPStatus.INCOMPLETE
    elif missing or problems:
        status = MTPStatus.INCOMPLETE
    else:
        status = MTPStatus.COMPLETE
    return MTPCheck(status, blocks[0], block_tensors, missing, _fallbacks(names, blocks, model.architecture), problems, blocks)


@dataclasses.dataclass
class ModelReport:
    """What ``ggufmtp inspect`` reports."""

    path: str
    shards: list[str]
    architecture: str
    block_count: int
    trunk_layers: int
    nextn_predict_layers: int
    mtp_block: int | None  # the first MTP block (kept for single-block readers)
    mtp_blocks: list[int]  # every MTP block
    mtp_status: MTPStatus
    mtp_tensors: dict[str, str]
    mtp_missing: list[str]
    mtp_fallbacks: dict[str, str]
    mtp_problems: list[str]
    file_type: str | None
    tensor_types: dict[str, dict[str, int]]
    n_tensors: int
    n_params: int
    size_bytes: int
    bpw: float

    def to_dict(self) -> JsonObject:
        d = dataclasses.asdict(self)
        d["mtp_status"] = self.mtp_status.value
        return d


def inspect_model(path: str | Path) -> ModelReport:
    """Read ``path`` (any shard of a split model works) and report its MTP structure (``ggufmtp.inspect``
    also takes ``builtin:NAME``)."""
    model = GGUFModel(path)
    mtp = check_mtp(model)
    return ModelReport(
        path=str(model.path),
        shards=[str(s) for s in model.shards],
        architecture=model.architecture,
        block_count=model.block_count,
        trunk_layers=model.trunk_layers,
        nextn_predict_layers=model.nextn_predict_layers,
        mtp_block=mtp.block,
        mtp_blocks=list(mtp.blocks),
        mtp_status=mtp.status,
        mtp_tensors=mtp.tensors,
        mtp_missing=mtp.missing,
        mtp_fallbacks=mtp.fallbacks,
        mtp_problems=mtp.problems,
        file_type=model.file_type,
        tensor_types=model.tensor_types(),
        n_tensors=len(model.tensors),
        n_params=model.n_params,
        size_bytes=model.size_bytes,
        bpw=round(model.bpw, 4),
    )


def format_report(r: ModelReport) -> str:
    """``ggufmtp inspect``'s text output."""
    lines = [
        f"model         {r.path}" + (f"  ({len(r.shards)} shards)" if len(r.shards) > 1 else ""),
        f"architecture  {r.architecture}",
        f"blocks        {r.block_count} ({r.trunk_layers} trunk + {r.nextn_predict_layers} MTP)",
        f"file type     {r.file_type or '-'}",
        f"size          {human_bytes(r.size_bytes)}, {r.n_params:,} params, {r.bpw:.2f} bpw, {r.n_tensors} tensors",
        "tensor types  " + ", ".join(f"{t}: {v['count']} ({human_bytes(v['bytes'])})"
                                     for t, v in r.tensor_types.items()),
        "",
        f"MTP status    {r.mtp_status.upper()}" + _blocks_phrase(r.mtp_blocks),
    ]
    several = len(r.mtp_blocks) > 1
    block = None
    for name, typ in r.mtp_tensors.items():
        m = re.match(r"blk\.(\d+)\.", name)
        if several and m and int(m.group(1)) != block:  # a heading per block of a chain
            block = int(m.group(1))
            lines.append(f"  blk.{block} (MTP block {r.mtp_blocks.index(block) + 1} of {len(r.mtp_blocks)})"
                         if block in r.mtp_blocks else f"  blk.{block}")
        lines.append(f"  {name:<44} {typ}")
    for name, fb in r.mtp_fallbacks.items():
        lines.append(f"  {name:<44} absent -> falls back to {fb}")
    for name in r.mtp_missing:
        lines.append(f"  MISSING {name}")
    for p in r.mtp_problems:
        lines.append(f"  problem: {p}")
    return "\n".join(lines)


def _blocks_phrase(blocks: list[int]) -> str:
    """``  (block blk.4)`` or ``  (2 blocks: blk.4, blk.5)``; empty without MTP blocks."""
    if not blocks:
        return ""
    if len(blocks) == 1:
        return f"  (block blk.{blocks[0]})"
    return f"  ({len(blocks)} blocks: {format_blocks(blocks)})"


def tensor_array(model: GGUFModel, name: str) -> np.ndarray:
    """The raw bytes of one tensor as a uint8 memmap (no copy)."""
    t = model.tensors[name]
    shard = model.shards[t.shard]
    off = model.tensor_data_offsets[name]
    return np.memmap(shard, dtype=np.uint8, mode="r", offset=off, shape=(t.n_bytes,))


def template_supports_thinking(chat_template: str | None) -> bool:
    """Whether a chat template (``tokenizer.chat_template``) has a thinking switch (it reads
    ``enable_thinking``, as the Qwen3, Qwen3.5/3.6 and GLM-4.5 templates do). llama-server passes
    ``chat_template_kwargs`` through."""
    return bool(chat_template) and "enable_thinking" in str(chat_template)
