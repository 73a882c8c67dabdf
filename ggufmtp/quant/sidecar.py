"""``ggufmtp sidecar``: split a full MTP model into an MTP-only sidecar (and optionally its trunk).

The pinned llama.cpp (0c1e570) serves a model's MTP head from a separate file: ``llama-server -m
TRUNK -md mtp-<Model>-<TYPE>.gguf --spec-type draft-mtp`` (``-md`` is ``--spec-draft-model``;
``common/arg.cpp``), and ``-hf owner/repo:TAG`` takes a file whose path holds ``mtp-`` as that
draft (``common/download.cpp``, ``find_best_mtp``). The converter writes such a file with
``--mtp`` and the trunk without the head with ``--no-mtp`` (``conversion/qwen.py``); this module
makes both from a GGUF, as the converter lays them out:

* the **sidecar** keeps every key/value of the model (``block_count`` still counts the MTP
  layers, ``nextn_predict_layers`` > 0) and only the tensors outside the blocks (``token_embd``,
  ``output_norm``, ``output``) plus the MTP blocks. The loader knows it by the missing
  ``blk.0.attn_norm.weight`` and loads the trunk's tensors as not required
  (``src/models/qwen35moe.cpp``, ``mtp_only``);
* the **trunk** keeps every tensor but the MTP blocks, ``block_count`` is the trunk's,
  ``nextn_predict_layers`` is left out and per-layer arrays lose the MTP layers' entries.

Tensor bytes are copied as they are (gguf-py reads and writes them): nothing is quantized here.
The head's types are the recipe's because the source is quantized first by the project's one
quantization path (:func:`ggufmtp.quant.quantize.quantize`: in-process libllama) when a recipe is
given, so the sidecar's head is byte for byte the full variant's. Files are written under a hidden
partial name and renamed into place only after their receipts are written
(:mod:`ggufmtp.provenance.pair`): a failure leaves nothing half-written.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter, Keys

from ..errors import QuantizeError
from ..files.fsutil import fsync_dir, fsync_path
from ..gguf.model import GGUFModel, MTPStatus, block_prefixes, check_mtp, format_blocks, split_shards
from .naming import model_name, name_problem, sidecar_file_name
from .quantize import QuantizeResult
from .split import SplitSize

__all__ = ["Role", "SidecarOptions", "SidecarResult", "make_sidecar", "make_trunk", "write_part", "sidecar_default_name"]

PARTIAL_MARK = ".partial-"


class Role(enum.StrEnum):
    """Which part of a split model a file is."""

    SIDECAR = "sidecar"  # the MTP blocks with token_embd/output_norm/output (``-md``)
    TRUNK = "trunk"  # every tensor but the MTP blocks (``-m``)


@dataclasses.dataclass(frozen=True)
class SidecarOptions:
    """What ``ggufmtp sidecar`` makes. ``recipe``: quantize the model with it first (a shipped
    recipe, a .toml file or a llama-quantize type), else the model's tensors are kept as they are;
    ``imatrix``/``threads``: for that quantization; ``trunk_out``: also write the trunk there.
    (The receipts are the caller's: :func:`make_sidecar`'s ``before_publish``.)"""

    recipe: str | None = None
    imatrix: str | None = None
    threads: int = 0
    trunk_out: Path | None = None
    progress: bool = False


@dataclasses.dataclass
class SidecarResult:
    """The files written (``trunk``/``trunk_receipt`` None unless asked for)."""

    sidecar: Path
    sidecar_receipt: Path | None
    trunk: Path | None
    trunk_receipt: Path | None
    mtp_blocks: list[int]
    types: dict[str, str]  # the sidecar's head tensors -> type

    def to_dict(self) -> dict[str, object]:
        return {"sidecar": str(self.sidecar), "sidecar_receipt": _str(self.sidecar_receipt),
                "trunk": _str(self.trunk), "trunk_receipt": _str(self.trunk_receipt),
                "mtp_blocks": self.mtp_blocks, "types": self.types}

    def summary(self) -> str:
        lines = [f"sidecar {self.sidecar} ({self.sidecar.stat().st_size:,} bytes, {format_blocks(self.mtp_blocks)})"]
        eh = {n: t for n, t in self.types.items() if ".nextn.eh_proj." in n}
        lines += [f"  {n:<44} {t}" for n, t in eh.items()]
        if self.trunk is not None:
            lines.append(f"trunk   {self.trunk} ({self.trunk.stat().st_size:,} bytes)")
        lines += [f"receipt {r}" for r in (self.sidecar_receipt, self.trunk_receipt) if r is not None]
        return "\n".join(lines)


def _str(p: Path | None) -> str | None:
    return None if p is None else str(p)


def sidecar_default_name(model_arg: str, model_file: Path, type_name: str) -> str:
    """``mtp-<Model>-<TYPE>.gguf`` (quant/naming.py's :func:`sidecar_file_name`)."""
    return sidecar_file_name(model_name(model_arg, model_file), type_name)


def _check_source(model: Path) -> GGUFModel:
    """The model to split: one file (not a split GGUF) with a complete MTP block."""
    if not model.is_file():
        raise QuantizeError(f"{model}: no such file")
    if len(split_shards(model)) > 1:
        raise QuantizeError(f"{model}: a split GGUF; merge it first (llama-gguf-split --merge): sidecar reads one file")
    gm = GGUFModel(model)
    mtp = check_mtp(gm)
    if mtp.status == MTPStatus.SIDECAR:
        raise QuantizeError(f"{model}: is already an MTP-only sidecar; give the full model")
    if mtp.status != MTPStatus.COMPLETE:
        missing = f" (missing {', '.join(mtp.missing[:3])})" if mtp.missing else ""
        raise QuantizeError(f"{model}: its MTP block is {mtp.status}{missing}; a sidecar needs a complete MTP block")
    return gm


def write_part(src: Path, out: Path, role: Role) -> None:
    """Write ``role``'s part of the full model ``src`` to ``out`` (created or replaced as is: the
    caller stages it): key/values and tensor bytes copied with gguf-py, nothing re-quantized. ``src``
    may be a split model's first shard: the key/values are the first shard's (its ``split.*`` keys
    left out) and the tensors are read from whichever shard holds them (verify's reference head)."""
    gm = GGUFModel(src)
    mtp = gm.mtp_blocks
    prefixes = block_prefixes(mtp)
    readers = [GGUFReader(s) for s in gm.shards]
    reader = readers[0]
    arch = gm.architecture
    keep: Callable[[str], bool] = ((lambda n: n.startswith(prefixes) or not n.startswith("blk.")) if role == Role.SIDECAR
                                   else (lambda n: not n.startswith(prefixes)))
    writer = GGUFWriter(out, arch=arch)
    try:
        for field in reader.fields.values():
            if field.name == Keys.General.ARCHITECTURE or field.name.startswith(("GGUF.", "split.")):
                continue
            value = field.contents()
            if field.name == Keys.General.ALIGNMENT:
                writer.add_custom_alignment(int(value))
                continue
            if role == Role.TRUNK:
                value = _trunk_value(field.name, value, arch, gm.block_count, gm.trunk_layers)
                if value is None:
                    continue
            vtype = field.types[0]
            writer.add_key_value(field.name, value, vtype,
                                 sub_type=field.types[-1] if vtype == GGUFValueType.ARRAY else None)
        tensors = [t for r in readers for t in r.tensors if keep(t.name)]
        for t in tensors:
            writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for t in tensors:
            writer.write_tensor_data(np.asarray(t.data))
    finally:
        writer.close()
    fsync_path(out)


# <arch>.* arrays that are not per layer, whatever their length (M-RoPE's sections: 4 entries)
_NOT_PER_LAYER = (Keys.Rope.DIMENSION_SECTIONS,)


def _trunk_value(key: str, value: object, arch: str, block_count: int, trunk_layers: int) -> object | None:
    """A key's value in the trunk-only file (None: left out), as ``convert_hf_to_gguf.py --no-mtp``
    writes it: the trunk's block count, no ``nextn_predict_layers``, per-layer arrays (an ``<arch>.``
    array with ``block_count`` entries) cut to the trunk."""
    if key == Keys.LLM.NEXTN_PREDICT_LAYERS.format(arch=arch):
        return None
    if key == Keys.LLM.BLOCK_COUNT.format(arch=arch):
        return trunk_layers
    per_layer = key.startswith(f"{arch}.") and key not in {k.format(arch=arch) for k in _NOT_PER_LAYER}
    if per_layer and isinstance(value, list) and len(value) == block_count:
        return value[:trunk_layers]
    return value


def _stage_dir(out: Path) -> Path:
    work = out.with_name(f".{out.name}{PARTIAL_MARK}{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    try:
        work.mkdir(parents=True)
    except OSError as e:
        raise QuantizeError(f"{out}: cannot write beside it ({e.strerror or e})") from None
    return work


@dataclasses.dataclass(frozen=True)
class StagedPair:
    """The split as staged, before it is published: what a receipt writer binds. ``full`` is the file
    that was split (``model``, or the variant ``quantized`` from it with ``imatrix``); ``sidecar`` and
    ``trunk`` are (staged file, final path)."""

    model: Path
    model_arg: str
    full: Path
    quantized: QuantizeResult | None
    imatrix: str | None
    sidecar: tuple[Path, Path]
    trunk: tuple[Path, Path] | None


# Writes the staged files' receipts, returns (sidecar receipt, trunk receipt): provenance.pair's.
ReceiptWriter = Callable[[StagedPair], "tuple[Path | None, Path | None]"]


def make_sidecar(model: str | Path, out: str | Path, options: SidecarOptions | None = None,
                 model_arg: str | None = None, before_publish: ReceiptWriter | None = None) -> SidecarResult:
    """Write the MTP-only sidecar of ``model`` to ``out`` (and the trunk to ``options.trunk_out``);
    ``before_publish`` writes each staged file's receipt before anything is published (the CLI
    passes :func:`ggufmtp.provenance.pair.pair_receipt_writer`'s: each receipt binds its file to the
    other and to the source). QuantizeError naming the file before any work when the model cannot
    be split, or the recipe's own errors; nothing is left behind on failure."""
    o = options or SidecarOptions()
    model, out = Path(model), Path(out)
    trunk_out = Path(o.trunk_out) if o.trunk_out else None
    _refuse_paths(model, out, trunk_out)
    _check_source(model)
    work = _stage_dir(out)
    try:
        full, quantized = model, None
        if o.recipe is not None:
            from .naming import variant_file_name
            from .quantize import quantize
            from .recipe import Recipe

            rec = Recipe.load(o.recipe)
            variant = work / variant_file_name(model_name(model_arg or str(model), model), rec.release_tag)
            quantized = quantize(model, rec, variant, imatrix=o.imatrix, threads=o.threads, progress=o.progress)
            full = quantized.output
        staged_sidecar = work / out.name
        write_part(full, staged_sidecar, Role.SIDECAR)
        staged_trunk: Path | None = None
        if trunk_out is not None:
            (work / "trunk").mkdir()
            staged_trunk = work / "trunk" / trunk_out.name  # staged under its final name: its receipt names it
            write_part(full, staged_trunk, Role.TRUNK)
        staged = StagedPair(model, model_arg or str(model), full, quantized, o.imatrix, (staged_sidecar, out),
                            (staged_trunk, trunk_out) if staged_trunk and trunk_out else None)
        receipts = before_publish(staged) if before_publish is not None else (None, None)
        if staged_trunk is not None and trunk_out is not None:
            os.replace(staged_trunk, trunk_out)
            fsync_dir(trunk_out.parent)
        os.replace(staged_sidecar, out)
        fsync_dir(out.parent)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    head = check_mtp(GGUFModel(out))
    return SidecarResult(out, receipts[0], trunk_out, receipts[1], list(head.blocks), dict(head.tensors))


def make_trunk(full: str | Path, out: str | Path, before_publish: Callable[[list[Path], Path], Path | None],
               split: SplitSize | None = None) -> list[Path]:
    """Write the trunk of the full model ``full`` to ``out`` (a ladder's trunk-only variant, its
    sidecar made apart), as shards named for ``out`` by the pinned ``llama-gguf-split`` when larger
    than ``split`` (:mod:`.split`): staged, ``before_publish(staged files, final first file)`` writes
    their receipt, then each is renamed into place (the first shard last) and what an earlier trunk
    at ``out`` left that these replace is removed. Returns the published files, the first first.
    QuantizeError naming the file when ``full`` cannot be split."""
    from .quantize import remove_replaced
    from .split import split_gguf

    full, out = Path(full), Path(out)
    _refuse_paths(full, out, None)
    if problem := name_problem(out.name):
        raise QuantizeError(f"{out}: {problem}; name the trunk as a variant (<Model>-<TAG>.gguf)")
    _check_source(full)
    work = _stage_dir(out)
    try:
        staged = work / out.name  # staged under its final name: its receipt names it
        write_part(full, staged, Role.TRUNK)
        files = [staged]
        if split is not None and staged.stat().st_size > split.n_bytes:
            files = split_gguf(staged, staged, split)  # the shards' names are the published ones
            staged.unlink()
        finals = [out] if len(files) == 1 else [out.parent / f.name for f in files]
        before_publish(files, finals[0])
        for f, final in reversed(list(zip(files, finals, strict=True))):
            os.replace(f, final)
        remove_replaced(out, finals)
        fsync_dir(out.parent)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return finals


def _refuse_paths(model: Path, out: Path, trunk_out: Path | None) -> None:
    """Outputs that would overwrite the input or each other, or a folder, are refused up front."""
    outs = [p for p in (out, trunk_out) if p is not None]
    for p in outs:
        if p.suffix.lower() != ".gguf":
            raise QuantizeError(f"{p}: an output must be a .gguf file")
        if p.is_dir():
            raise QuantizeError(f"{p}: is a directory; give a file path")
        if p.exists() and model.exists() and p.resolve() == model.resolve():
            raise QuantizeError(f"{p}: is the input model; give another output path")
        if not p.parent.is_dir():
            raise QuantizeError(f"{p}: its folder {p.parent} does not exist")
    if trunk_out is not None and trunk_out.resolve() == out.resolve():
        raise QuantizeError(f"{out}: the sidecar and the trunk would be the same file")
    if trunk_out is not None and (problem := name_problem(trunk_out.name)):
        raise QuantizeError(f"{trunk_out}: {problem}; name the trunk as a variant (<Model>-<TAG>.gguf)")
