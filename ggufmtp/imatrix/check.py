"""Checking an imatrix against a model: validation, coverage, which target types need an imatrix.

Mirrors what llama-quantize (``tools/quantize/quantize.cpp``, ``src/llama-quant.cpp`` at 0c1e570)
accepts, refuses and requires, so that ``ggufmtp`` can say so before a long quantization starts.
Also makes plausible synthetic imatrices for tests and demos.
"""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import Keys

from ..errors import GGUFReadError, ImatrixError
from ..gguf.model import GGUFModel
from .entries import (
    DEFAULT_CHUNK_SIZE,
    KEY_CHUNK_COUNT,
    KEY_CHUNK_SIZE,
    KEY_DATASETS,
    Imatrix,
    ImatrixEntry,
    ImatrixFormat,
    convert_imatrix,
    lround_counts,
    mean_values,
    name_order,
)

__all__ = ["ASSERTED_IMATRIX_TYPES", "EXEMPT_TENSORS", "IMATRIX_REQUIRED_TYPES",
           "Coverage", "ImatrixProblem", "ModelTensors", "ProblemKind",
           "Severity", "ValidationReport", "coverage", "expected_size", "is_q2_k_s_ftype", "is_quantizable",
           "mtp_block_indices", "needs_imatrix", "read_model_tensors", "refuse_unusable_values", "synthetic_imatrix",
           "validate"]

# Types for which llama-quantize needs imatrix data (src/llama-quant.cpp: tensor_requires_imatrix).
IMATRIX_REQUIRED_TYPES = frozenset({"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS"})
# Exact names that never require an imatrix (tensor_name_match_token_embd / _output_weight);
# llama-imatrix never collects token embeddings (GET_ROWS, not MUL_MAT) and collects
# output.weight only with --process-output.
EXEMPT_TENSORS = frozenset({"token_embd.weight", "per_layer_token_embd.weight", "output.weight"})
# Types whose quantization asserts statistics whatever the tensor (ggml/src/ggml.c:
# ggml_quantize_requires_imatrix, GGML_ASSERT(imatrix != NULL) in ggml_quantize_chunk): the name
# exemption above does not reach that assert, so llama-quantize aborts on token_embd or output at one
# of these without statistics (a gpu-small search's token_embd at IQ2_XXS, 2026-11-29).
ASSERTED_IMATRIX_TYPES = frozenset({"IQ1_S", "IQ2_XXS", "IQ2_XS"})


# ------------------------------------------------------------------------------------------------
# model tensors, quantizability, MTP block
# ------------------------------------------------------------------------------------------------


def _n_dims(shape: Sequence[int]) -> int:
    """ggml_n_dims: dimensions up to the last one > 1 (at least 1)."""
    shape = list(shape)
    for i in range(len(shape) - 1, 0, -1):
        if shape[i] > 1:
            return i + 1
    return 1


_NOT_QUANTIZED_SUBSTRINGS = (
    "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
    "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight",
    "indexer.q_proj.weight", "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight",
    "time_mix_w2.weight", "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight",
    "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight",
    "time_mix_g2.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight", "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.",
    "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger", "a.rvq.codebook", "mm.a.code_embd",
)
_NOT_QUANTIZED_EXACT = ("position_embd.weight", "token_types.weight")


def is_quantizable(name: str, shape: Sequence[int], *, quantize_output_tensor: bool = True) -> bool:
    """Whether llama-quantize would quantize this tensor (the arch-independent rules of
    ``tensor_allows_quantization`` in src/llama-quant.cpp: >= 2 dims, name ending in ``weight``,
    no norms, router, conv1d, ...)."""
    if _n_dims(shape) < 2:
        return False
    if not name.endswith("weight"):
        return False
    if not quantize_output_tensor and name == "output.weight":
        return False
    if name in _NOT_QUANTIZED_EXACT:
        return False
    return not any(s in name for s in _NOT_QUANTIZED_SUBSTRINGS)


def expected_size(shape: Sequence[int]) -> int:
    """The imatrix size llama-quantize expects for a tensor: ``ne[0] * ne[2]``."""
    shape = list(shape) + [1] * (3 - len(shape))
    return int(shape[0]) * int(shape[2])


def mtp_block_indices(block_count: int, nextn_predict_layers: int) -> list[int]:
    """Block indices of the MTP (NextN) layers: ``block_count - nextn .. block_count - 1``."""
    if nextn_predict_layers <= 0:
        return []
    return list(range(max(0, block_count - nextn_predict_layers), block_count))


_BLK = re.compile(r"^blk\.(\d+)\.")


def _block_of(name: str) -> int | None:
    m = _BLK.match(name)
    return int(m.group(1)) if m else None


@dataclass
class ModelTensors:
    """What imatrix checks need from a model GGUF: tensor shapes (ne order) and the MTP block."""

    path: str
    arch: str | None
    shapes: dict[str, tuple[int, ...]]
    block_count: int | None = None
    nextn_predict_layers: int = 0

    @property
    def mtp_blocks(self) -> list[int]:
        if self.block_count is None:
            return []
        return mtp_block_indices(self.block_count, self.nextn_predict_layers)


def read_model_tensors(path: str | os.PathLike) -> ModelTensors:
    """Read tensor shapes (ne order: ``ReaderTensor.shape`` in gguf-py is ne0 first) and the
    ``<arch>.block_count`` / ``<arch>.nextn_predict_layers`` keys of a model GGUF (any shard of a
    split model: all shards are read, headers only)."""
    p = Path(path)
    if not p.is_file():
        raise GGUFReadError(f"model file {p} does not exist")
    gm = GGUFModel(p)
    arch = gm.metadata.get(Keys.General.ARCHITECTURE)
    arch = str(arch) if arch is not None else None
    bc = gm.metadata.get(Keys.LLM.BLOCK_COUNT.format(arch=arch)) if arch else None
    nn = gm.metadata.get(Keys.LLM.NEXTN_PREDICT_LAYERS.format(arch=arch)) if arch else None
    shapes = gm.shapes()
    return ModelTensors(path=str(p), arch=arch, shapes=shapes,
                        block_count=int(bc) if bc is not None else None,
                        nextn_predict_layers=int(nn) if nn is not None else 0)


# ------------------------------------------------------------------------------------------------
# validation against a model
# ------------------------------------------------------------------------------------------------


class Severity(enum.StrEnum):
    """An error makes llama-quantize fail or quantize with garbage; a warning does not."""

    ERROR = "error"
    WARNING = "warning"


class ProblemKind(enum.StrEnum):
    """What an :class:`ImatrixProblem` is about."""

    UNKNOWN_TENSOR = "unknown_tensor"
    SIZE_MISMATCH = "size_mismatch"
    SHAPE_MISMATCH = "shape_mismatch"
    NON_FINITE = "non_finite"
    NEGATIVE = "negative"
    BAD_COUNTS = "bad_counts"
    NO_DATA = "no_data"
    MISSING_METADATA = "missing_metadata"


@dataclass
class ImatrixProblem:
    """One finding of :func:`validate` (``name``: the entry, None for the file as a whole)."""

    severity: Severity
    kind: ProblemKind
    name: str | None
    message: str

    def __post_init__(self) -> None:
        self.severity, self.kind = Severity(self.severity), ProblemKind(self.kind)

    def to_dict(self) -> dict[str, Any]:
        return {"severity": self.severity.value, "kind": self.kind.value, "name": self.name, "message": self.message}

    def __str__(self) -> str:
        return self.message


@dataclass
class ValidationReport:
    """What :func:`validate` found: ``matched`` entries fit the model's tensors."""

    path: str | None
    entries: int
    matched: int
    problems: list[ImatrixProblem] = field(default_factory=list)

    @property
    def errors(self) -> list[ImatrixProblem]:
        return [p for p in self.problems if p.severity == Severity.ERROR]

    @property
    def warnings(self) -> list[ImatrixProblem]:
        return [p for p in self.problems if p.severity == Severity.WARNING]

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "entries": self.entries, "matched": self.matched, "ok": self.ok,
                "problems": [p.to_dict() for p in self.problems]}


def _shapes_of(tensors: Mapping[str, Sequence[int]] | ModelTensors) -> dict[str, tuple[int, ...]]:
    if isinstance(tensors, ModelTensors):
        return tensors.shapes
    return {k: tuple(int(x) for x in v) for k, v in tensors.items()}


def _count_problems(name: str, e: ImatrixEntry) -> list[ImatrixProblem]:
    """Counts that are not usable (errors) or show no data (warnings: llama-quantize falls back)."""
    if e.kind == ImatrixFormat.DAT:
        if e.ncall > 0:
            return []
        if e.ncall < 0:  # refused like the GGUF format's negative counts
            return [ImatrixProblem(Severity.ERROR, ProblemKind.BAD_COUNTS, name,
                                   f"{name}: ncall is {e.ncall} (a token count cannot be negative)")]
        return [ImatrixProblem(Severity.WARNING, ProblemKind.NO_DATA, name,
                               f"{name}: ncall is {e.ncall} (llama-quantize uses the stored values as-is)")]
    bad = int(np.count_nonzero(~np.isfinite(e.counts) | (e.counts < 0)))
    if bad:
        return [ImatrixProblem(Severity.ERROR, ProblemKind.BAD_COUNTS, name,
                               f"{name}: {bad} of {e.nmat} counts are negative or not finite")]
    zero = int(np.count_nonzero(lround_counts(e.counts) <= 0))
    if not zero:
        return []
    what = "has no data" if zero == e.nmat else f"has no data for {zero} of {e.nmat} experts"
    return [ImatrixProblem(Severity.WARNING, ProblemKind.NO_DATA, name,
                           f"{name} {what} (llama-quantize uses 1.0 there)")]


def _value_problems(name: str, e: ImatrixEntry) -> list[ImatrixProblem]:
    """Means llama-quantize refuses ("imatrix contains non-finite value"), then the counts' problems."""
    e.check()
    means = mean_values(e)
    out = []
    nonfinite = int(np.count_nonzero(~np.isfinite(means)))
    if nonfinite:
        out.append(ImatrixProblem(Severity.ERROR, ProblemKind.NON_FINITE, name,
                                  f"{name}: {nonfinite} of {means.size} values are NaN or infinite"))
    with np.errstate(invalid="ignore"):
        neg = int(np.count_nonzero(means < 0))
    if neg:
        out.append(ImatrixProblem(Severity.ERROR, ProblemKind.NEGATIVE, name,
                                  f"{name}: {neg} of {means.size} values are negative (sums of squares cannot be)"))
    return out + _count_problems(name, e)


def refuse_unusable_values(im: Imatrix) -> None:
    """Raise ImatrixError for the first entry whose values or counts llama-quantize would refuse
    (NaN, infinite, negative), naming the file: such an imatrix is not converted or used."""
    src = f"imatrix {im.path}" if im.path else "imatrix"
    for name, e in im.entries.items():
        errors = [p for p in _value_problems(name, e) if p.severity == Severity.ERROR]
        if errors:
            raise ImatrixError(f"{src} is not usable: {errors[0].message}")


def _shape_problem(name: str, e: ImatrixEntry, shape: tuple[int, ...]) -> ImatrixProblem | None:
    """A size other than ``ne0 * n_expert`` (quantize throws "imatrix size ... is different from
    tensor size", except for token embeddings) or per-expert rows that do not match the tensor."""
    want = expected_size(shape)
    if e.nval != want:
        token_embd = name in ("token_embd.weight", "per_layer_token_embd.weight")
        return ImatrixProblem(Severity.WARNING if token_embd else Severity.ERROR, ProblemKind.SIZE_MISMATCH, name,
                              f"{name}: imatrix has {e.nval} values, the tensor {list(shape)} "
                              f"needs {want} (ne0 * n_expert)")
    n_exp = shape[2] if len(shape) > 2 else 1
    if e.kind == ImatrixFormat.GGUF and e.nmat > 1 and (e.nmat != n_exp or e.ne0 != shape[0]):
        return ImatrixProblem(Severity.ERROR, ProblemKind.SHAPE_MISMATCH, name,
                              f"{name}: imatrix holds {e.nmat} rows of {e.ne0}, the tensor "
                              f"{list(shape)} has {n_exp} experts of {shape[0]} columns")
    return None


def _unknown_names_warning(unknown: list[str]) -> ImatrixProblem:
    sample = ", ".join(unknown[:5]) + (" ..." if len(unknown) > 5 else "")
    return ImatrixProblem(Severity.WARNING, ProblemKind.UNKNOWN_TENSOR, None,
                          f"{len(unknown)} entries name tensors the model does not have "
                          f"(llama-quantize ignores them): {sample}")


def _refuse_other_model(src: str, total: int, unknown: list[str], mismatched: list[str]) -> None:
    bad_n = len(unknown) + len(mismatched)
    parts = []
    if unknown:
        parts.append(f"{len(unknown)} unknown tensor names (e.g. {unknown[0]})")
    if mismatched:
        parts.append(f"{len(mismatched)} size mismatches (e.g. {mismatched[0]})")
    raise ImatrixError(f"{src} was made for another model: {bad_n} of {total} entries do not match "
                       f"the model's tensors ({'; '.join(parts)})")


def _refuse_errors(src: str, report: ValidationReport) -> None:
    first = report.errors[0].message
    more = f" (and {len(report.errors) - 1} more problems)" if len(report.errors) > 1 else ""
    raise ImatrixError(f"{src} is not usable for this model: {first}{more}")


def validate(im: Imatrix, tensors: Mapping[str, Sequence[int]] | ModelTensors, *,
             strict: bool = True, wrong_model_fraction: float = 0.5) -> ValidationReport:
    """Check ``im`` against a model's tensors ``{name: shape}`` (GGUF ne order).

    Errors (would make llama-quantize fail or quantize with garbage): non-finite or negative
    means (quantize throws "imatrix contains non-finite value"), sizes other than ``ne0 * ne2``
    for tensors in the model (quantize throws "imatrix size ... is different from tensor size",
    except for token_embd), per-expert layout that does not match the tensor, negative or
    non-finite counts, a GGUF imatrix without its metadata keys. Warnings: names the model does not
    have (ignored by quantize), experts/entries without data (means fall back to 1.0).

    An imatrix where more than ``wrong_model_fraction`` of the entries are unknown or have the
    wrong size is refused (ImatrixError "... was made for another model ...") whatever ``strict``
    says; with ``strict`` any other error raises too.
    """
    shapes = _shapes_of(tensors)
    src = f"imatrix {im.path}" if im.path else "imatrix"
    problems: list[ImatrixProblem] = []
    if not im.has_metadata:
        problems.append(ImatrixProblem(Severity.ERROR, ProblemKind.MISSING_METADATA, None,
                                       f"{src} lacks {KEY_DATASETS}, {KEY_CHUNK_COUNT} or {KEY_CHUNK_SIZE}: "
                                       f"llama-quantize refuses it"))
    unknown: list[str] = []
    mismatched: list[str] = []
    for name, e in im.entries.items():
        problems += _value_problems(name, e)
        if name not in shapes:
            unknown.append(name)
            continue
        shape_problem = _shape_problem(name, e, shapes[name])
        if shape_problem is not None:
            problems.append(shape_problem)
            if shape_problem.kind == ProblemKind.SIZE_MISMATCH:
                mismatched.append(name)
    if unknown:
        problems.append(_unknown_names_warning(unknown))
    total, bad_n = len(im.entries), len(unknown) + len(mismatched)
    report = ValidationReport(path=str(im.path) if im.path else None, entries=total,
                              matched=total - bad_n, problems=problems)
    if total and bad_n > wrong_model_fraction * total:
        _refuse_other_model(src, total, unknown, mismatched)
    if strict and report.errors:
        _refuse_errors(src, report)
    return report


# ------------------------------------------------------------------------------------------------
# coverage and imatrix requirements
# ------------------------------------------------------------------------------------------------


def needs_imatrix(type_name: str, ftype: str | int | None = None, tensor_name: str | None = None) -> bool:
    """Whether quantizing a tensor to ``type_name`` requires imatrix data.

    Mirrors ``tensor_requires_imatrix`` (src/llama-quant.cpp): IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S,
    IQ3_XXS always; Q2_K only when the file type (``ftype``: "Q2_K_S", "MOSTLY_Q2_K_S",
    "LLAMA_FTYPE_MOSTLY_Q2_K_S" or 21) is Q2_K_S; for ``token_embd.weight``,
    ``per_layer_token_embd.weight`` and ``output.weight`` only the types ggml itself asserts
    statistics for (IQ1_S, IQ2_XXS, IQ2_XS: llama.cpp aborts there instead of refusing).
    """
    t = type_name.upper().removeprefix("GGML_TYPE_")
    if tensor_name is not None and tensor_name in EXEMPT_TENSORS:
        return t in ASSERTED_IMATRIX_TYPES
    if t in IMATRIX_REQUIRED_TYPES:
        return True
    if t == "Q2_K":
        return is_q2_k_s_ftype(ftype)
    return False


def is_q2_k_s_ftype(ftype: str | int | None) -> bool:
    if ftype is None:
        return False
    if isinstance(ftype, (int, np.integer)):
        return int(ftype) == 21  # LLAMA_FTYPE_MOSTLY_Q2_K_S (include/llama.h)
    f = str(ftype).upper().removeprefix("LLAMA_FTYPE_").removeprefix("MOSTLY_")
    return f == "Q2_K_S"


@dataclass
class Coverage:
    """Which quantizable tensors of a model have imatrix statistics."""

    quantizable: list[str]
    covered: list[str]
    missing: list[str]  # trunk tensors without statistics (not MTP, not exempt)
    missing_mtp: list[str]  # MTP block tensors without statistics (llama-imatrix never collects them)
    missing_exempt: list[str]  # token_embd / output: never collected by default, never required
    mtp_blocks: list[int] = field(default_factory=list)

    @property
    def missing_all(self) -> list[str]:
        return self.missing + self.missing_mtp + self.missing_exempt

    @property
    def missing_by_block(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for n in self.missing_all:
            b = _block_of(n)
            out.setdefault(f"blk.{b}" if b is not None else "other", []).append(n)
        return out

    @property
    def complete(self) -> bool:
        """True when every trunk tensor is covered (MTP and exempt tensors aside)."""
        return not self.missing

    def blocking(self, target_types: Mapping[str, str], ftype: str | int | None = None) -> list[str]:
        """Tensors without statistics whose target type needs an imatrix: llama-quantize would throw
        "Missing importance matrix for tensor ..." on each of them."""
        covered = set(self.covered)
        return [n for n, t in target_types.items() if n not in covered and needs_imatrix(t, ftype, n)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "quantizable": len(self.quantizable),
            "covered": len(self.covered),
            "missing": list(self.missing),
            "missing_mtp": list(self.missing_mtp),
            "missing_exempt": list(self.missing_exempt),
            "mtp_blocks": list(self.mtp_blocks),
            "missing_by_block": self.missing_by_block,
            "complete": self.complete,
        }


def coverage(im: Imatrix, tensors: Mapping[str, Sequence[int]] | ModelTensors,
             quantizable: set[str] | None = None, *, mtp_blocks: Iterable[int] | None = None) -> Coverage:
    """Quantizable tensors of the model with no statistics in ``im``, grouped.

    ``quantizable`` defaults to ``is_quantizable`` over ``tensors``; ``mtp_blocks`` defaults to
    the blocks of a ``ModelTensors`` (``block_count - nextn_predict_layers ..``), else none.
    An entry counts as covering a tensor only when its size matches (``ne0 * ne2``).
    """
    shapes = _shapes_of(tensors)
    if mtp_blocks is None:
        mtp_blocks = tensors.mtp_blocks if isinstance(tensors, ModelTensors) else []
    mtp = set(int(b) for b in mtp_blocks)
    if quantizable is None:
        names = [n for n, s in shapes.items() if is_quantizable(n, s)]
    else:
        names = [n for n in shapes if n in quantizable] + sorted(set(quantizable) - set(shapes))
    covered, missing, missing_mtp, exempt = [], [], [], []
    for n in names:
        e = im.entries.get(n)
        if e is not None and (n not in shapes or e.nval == expected_size(shapes[n])):
            covered.append(n)
        elif _block_of(n) in mtp:
            missing_mtp.append(n)
        elif n in EXEMPT_TENSORS:
            exempt.append(n)
        else:
            missing.append(n)
    return Coverage(quantizable=names, covered=covered, missing=missing, missing_mtp=missing_mtp,
                    missing_exempt=exempt, mtp_blocks=sorted(mtp))


# ------------------------------------------------------------------------------------------------
# synthetic imatrix (tests, demos)
# ------------------------------------------------------------------------------------------------


def _collected_by_llama_imatrix(name: str, shape: Sequence[int], process_output: bool) -> bool:
    # collect_imatrix: MUL_MAT / MUL_MAT_ID on weights named blk.* (and output.weight with
    # --process-output); token embeddings are GET_ROWS, conv1d is SSM_CONV, norms are MUL. The one
    # 1-D matmul weight known here is the shared-expert gate (ffn_gate_inp_shexp, n_out = 1).
    if name == "output.weight":
        return process_output and _n_dims(shape) >= 2
    if not name.startswith("blk.") or not name.endswith(".weight"):
        return False
    if "ssm_conv1d" in name:
        return False
    return _n_dims(shape) >= 2 or "ffn_gate_inp_shexp" in name


def synthetic_imatrix(
    tensors: Mapping[str, Sequence[int]] | ModelTensors,
    exclude_prefixes: Sequence[str] = (),
    *,
    mtp_blocks: Iterable[int] | None = None,
    format: ImatrixFormat | str = ImatrixFormat.GGUF,
    seed: int = 0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    chunk_count: int = 8,
    dataset: str = "synthetic-calibration.txt",
    process_output: bool = False,
) -> Imatrix:
    """A plausible imatrix for a model's tensors (positive, finite values), like llama-imatrix makes:
    entries for the 2-D/3-D ``blk.*`` matmul weights (and ``output.weight`` with
    ``process_output``), sorted by name, never for the MTP block (``mtp_blocks``, defaulting to a
    ``ModelTensors``' MTP blocks) nor for names starting with one of ``exclude_prefixes``.
    Expert tensors get uneven per-expert counts, as routing produces. Deterministic for ``seed``.
    """
    shapes = _shapes_of(tensors)
    if mtp_blocks is None:
        mtp_blocks = tensors.mtp_blocks if isinstance(tensors, ModelTensors) else []
    excl = tuple(exclude_prefixes) + tuple(f"blk.{b}." for b in mtp_blocks)
    rng = np.random.default_rng(seed)
    n_tok = chunk_size * chunk_count
    entries: dict[str, ImatrixEntry] = {}
    for name in sorted(shapes, key=name_order):
        shape = shapes[name]
        if excl and name.startswith(excl):
            continue
        if not _collected_by_llama_imatrix(name, shape, process_output):
            continue
        ne0 = int(shape[0])
        n_exp = int(shape[2]) if _n_dims(shape) >= 3 else 1
        if n_exp > 1:
            # top-k routing: every token visits k distinct experts, so no expert sees more than n_tok
            k = min(2, n_exp)
            p = rng.dirichlet(np.full(n_exp, 4.0))
            counts = np.clip(np.round(p * k * n_tok), 1, n_tok).astype(np.float32)
        else:
            counts = np.array([n_tok], dtype=np.float32)
        means = rng.lognormal(mean=-1.0, sigma=1.0, size=(n_exp, ne0)).astype(np.float32)
        sums = (means * counts[:, None]).astype(np.float32)
        entries[name] = ImatrixEntry(name, sums, counts, ImatrixFormat.GGUF)
    if not entries:
        raise ImatrixError("synthetic_imatrix: the model has no tensor llama-imatrix would collect")
    im = Imatrix(entries=entries, datasets=[dataset], chunk_count=chunk_count, chunk_size=chunk_size,
                 format=ImatrixFormat.GGUF)
    return convert_imatrix(im, format)
