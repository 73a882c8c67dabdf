"""The imatrix data model: entries, whole files, the means llama-quantize uses, format conversion.

Byte-level reading and writing is :mod:`ggufmtp.imatrix.format`; checks against a model are
:mod:`ggufmtp.imatrix.check`. The two formats and their arithmetic are described in ``format``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import Keys

from ..errors import ImatrixError

__all__ = ["DEFAULT_CHUNK_SIZE", "Imatrix", "ImatrixEntry", "ImatrixFormat", "conversion_losses", "convert_imatrix",
           "imatrix_format", "lround_counts", "mean_values", "to_quantize_data"]


class ImatrixFormat(enum.StrEnum):
    """The two imatrix file formats llama.cpp reads. Compares equal to its value."""

    DAT = "dat"  # legacy, IMatrixCollector::save_imatrix_legacy
    GGUF = "gguf"  # IMatrixCollector::save_imatrix


FORMATS: tuple[str, ...] = tuple(f.value for f in ImatrixFormat)
DEFAULT_CHUNK_SIZE = 512  # llama-imatrix: params.n_ctx = 512 unless -c is given

KEY_GENERAL_TYPE = Keys.General.TYPE
KEY_DATASETS = Keys.IMatrix.DATASETS
KEY_CHUNK_COUNT = Keys.IMatrix.CHUNK_COUNT
KEY_CHUNK_SIZE = Keys.IMatrix.CHUNK_SIZE
STANDARD_KEYS = (KEY_GENERAL_TYPE, KEY_DATASETS, KEY_CHUNK_COUNT, KEY_CHUNK_SIZE)

TEXT_ENCODING = "utf-8"
TEXT_ERRORS = "surrogateescape"  # names/datasets round-trip even when they are not valid UTF-8


def imatrix_format(value: str) -> ImatrixFormat:
    """``value`` as an :class:`ImatrixFormat`; ImatrixError for anything but "dat" and "gguf"."""
    try:
        return ImatrixFormat(value)
    except ValueError:
        raise ImatrixError(f"unknown imatrix format {value!r} (expected dat or gguf)") from None


def name_order(name: str) -> bytes:
    """Sort key of entry names: byte order, as llama-imatrix sorts them (std::string compare)."""
    return name.encode(TEXT_ENCODING, TEXT_ERRORS)


@dataclass(eq=False)  # numpy arrays: compare entries field by field
class ImatrixEntry:
    """Statistics for one weight tensor.

    ``kind == "gguf"``: ``values`` is the raw ``in_sum2`` (float32, shape ``(nmat, ne0)``, i.e.
    numpy order of ne ``[ne0, nmat]``) and ``counts`` the token counts as stored (float32,
    shape ``(nmat,)``).

    ``kind == "dat"``: ``values`` are the stored ``mean * ncall`` (float32, shape ``(nval,)``;
    ``nval = ne0 * n_expert`` expert-major for 3-D expert tensors) and ``counts`` is
    ``[ncall]`` (int64, shape ``(1,)``).
    """

    name: str
    values: np.ndarray
    counts: np.ndarray
    kind: ImatrixFormat = ImatrixFormat.GGUF

    def __post_init__(self) -> None:
        try:
            self.kind = ImatrixFormat(self.kind)
        except ValueError:
            raise ImatrixError(f"entry {self.name!r}: unknown kind {self.kind!r}") from None

    @property
    def nmat(self) -> int:
        return int(self.values.shape[0]) if self.kind == ImatrixFormat.GGUF else 1

    @property
    def ne0(self) -> int:
        """Row length of one matrix (the whole ``nval`` for a legacy entry)."""
        return int(self.values.shape[-1])

    @property
    def nval(self) -> int:
        return int(self.values.size)

    @property
    def in_sum2(self) -> np.ndarray:
        if self.kind != ImatrixFormat.GGUF:
            raise ImatrixError(f"entry {self.name!r} is a legacy .dat entry: it has no in_sum2 (use mean_values)")
        return self.values

    @property
    def ncall(self) -> int:
        if self.kind != ImatrixFormat.DAT:
            raise ImatrixError(f"entry {self.name!r} is a GGUF entry: it has per-matrix counts, not ncall")
        return int(self.counts[0])

    def check(self) -> None:
        """Raise ImatrixError if the arrays are not shaped/typed as ``kind`` requires."""
        v, c = self.values, self.counts
        if self.kind == ImatrixFormat.GGUF:
            ok = (isinstance(v, np.ndarray) and v.dtype == np.float32 and v.ndim == 2 and v.size > 0
                  and isinstance(c, np.ndarray) and c.dtype == np.float32 and c.ndim == 1
                  and c.shape[0] == v.shape[0])
            if not ok:
                raise ImatrixError(f"entry {self.name!r}: a GGUF entry needs float32 values (nmat, ne0) and "
                                   f"float32 counts (nmat,), got {_desc(v)} and {_desc(c)}")
        elif self.kind == ImatrixFormat.DAT:
            ok = (isinstance(v, np.ndarray) and v.dtype == np.float32 and v.ndim == 1 and v.size > 0
                  and isinstance(c, np.ndarray) and c.shape == (1,) and np.issubdtype(c.dtype, np.integer))
            if not ok:
                raise ImatrixError(f"entry {self.name!r}: a .dat entry needs float32 values (nval,) and "
                                   f"integer counts [ncall], got {_desc(v)} and {_desc(c)}")
        else:  # a kind assigned after construction
            raise ImatrixError(f"entry {self.name!r}: unknown kind {self.kind!r}")


def _desc(a: Any) -> str:
    if isinstance(a, np.ndarray):
        return f"{a.dtype}{list(a.shape)}"
    return type(a).__name__


@dataclass(eq=False)
class Imatrix:
    """A whole imatrix file. ``entries`` keep file order (llama-imatrix sorts them by name)."""

    entries: dict[str, ImatrixEntry]
    datasets: list[str] = field(default_factory=list)
    chunk_count: int = 0
    chunk_size: int | None = None  # GGUF only (None: absent, always None for .dat)
    format: ImatrixFormat = ImatrixFormat.GGUF
    path: Path | None = None
    sha256: str | None = None
    # --- fidelity details, so that re-writing a file reproduces it byte for byte -----------------
    dat_trailer: bool = True  # .dat: whether the chunk_count/dataset trailer is present
    gguf_kv_order: list[str] | None = None  # GGUF: keys in file order (None: the 4 standard keys)
    gguf_extra_kv: dict[str, bytes] = field(default_factory=dict)  # GGUF: other KVs, raw type+value

    def __post_init__(self) -> None:
        self.format = imatrix_format(self.format)

    @property
    def has_metadata(self) -> bool:
        """llama-quantize refuses a GGUF imatrix without datasets, chunk_count and chunk_size."""
        if self.format == ImatrixFormat.DAT:
            return True
        keys = self.gguf_kv_order if self.gguf_kv_order is not None else list(STANDARD_KEYS)
        return all(k in keys for k in (KEY_DATASETS, KEY_CHUNK_COUNT, KEY_CHUNK_SIZE)) and self.chunk_size is not None

    def names(self) -> list[str]:
        return list(self.entries)


def lround_counts(counts: np.ndarray) -> np.ndarray:
    """``(float) std::lround(c)`` as common_imatrix_load + load_imatrix do, for float32 ``c``.

    lround rounds half away from zero; NaN, infinities and values outside int64 give LONG_MIN on
    x86-64 (not positive, so the mean falls back to 1).
    """
    c = counts.astype(np.float64)
    with np.errstate(invalid="ignore"):
        r = np.where(c >= 0, np.floor(c + 0.5), -np.floor(-c + 0.5))
        bad = ~np.isfinite(c) | (np.abs(r) >= 2.0**63)
    r = np.where(bad, -(2.0**63), r)
    return r.astype(np.float32)


def mean_values(entry: ImatrixEntry) -> np.ndarray:
    """The per-column means llama-quantize passes to ``llama_model_quantize`` (float32, 1-D).

    Size ``ne0`` for a 2-D weight, ``ne0 * n_expert`` (expert-major) for a 3-D expert tensor.
    GGUF: ``in_sum2[j] / count[j]`` per matrix j, with ``count = (float) lround(counts[j])`` and 1.0
    for the whole matrix when ``count <= 0``. Legacy: ``values / (float) ncall`` when ``ncall > 0``,
    else the stored values unchanged (tools/quantize/quantize.cpp: load_imatrix).
    """
    entry.check()
    if entry.kind == ImatrixFormat.GGUF:
        cnt = lround_counts(entry.counts)
        pos = cnt > 0
        safe = np.where(pos, cnt, np.float32(1)).astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            means = entry.values / safe[:, None]
        means = np.where(pos[:, None], means, np.float32(1)).astype(np.float32)
        return np.ascontiguousarray(means.reshape(-1))
    ncall = int(entry.counts[0])
    if ncall > 0:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return np.ascontiguousarray((entry.values / np.float32(ncall)).astype(np.float32))
    return np.ascontiguousarray(entry.values.astype(np.float32, copy=True))


def to_quantize_data(im: Imatrix) -> dict[str, np.ndarray]:
    """``{name: float32 means}`` for every entry: what a caller passes as ``llama_model_imatrix_data``.

    Keep the arrays alive for the duration of the ``llama_model_quantize`` call.
    """
    return {name: mean_values(e) for name, e in im.entries.items()}


def _losses_to_dat(im: Imatrix) -> list[str]:
    out: list[str] = []
    multi = [n for n, e in im.entries.items() if e.nmat > 1]
    if multi:
        out.append(f"per-matrix token counts of {len(multi)} MoE entries are merged into one ncall "
                   f"(means are kept, up to float rounding)")
    else:
        out.append("token counts become one ncall per entry (means are kept, up to float rounding)")
    empty = [n for n, e in im.entries.items() if not np.any(lround_counts(e.counts) != 0)]
    if empty:
        out.append(f"{len(empty)} entries with no data at all are dropped (llama-imatrix does the same): "
                   + ", ".join(empty[:5]) + (" ..." if len(empty) > 5 else ""))
    if im.chunk_size is not None:
        out.append(f"chunk_size ({im.chunk_size}) is not stored in .dat files")
    if len(im.datasets) > 1:
        out.append(f"only the last of {len(im.datasets)} datasets is kept ({im.datasets[-1]!r})")
    extra = [k for k in im.gguf_extra_kv]
    if extra:
        out.append("extra GGUF metadata is dropped: " + ", ".join(extra))
    return out


def _losses_to_gguf(im: Imatrix) -> list[str]:
    out = ["ncall becomes token counts ncall * chunk_size; means are exact when chunk_size is a power of two"]
    zero = [n for n, e in im.entries.items() if int(e.counts[0]) <= 0]
    if zero:
        out.append(f"{len(zero)} entries have ncall <= 0: llama-quantize used their values as-is, "
                   f"after conversion their means become 1.0")
    return out


def conversion_losses(im: Imatrix, to_format: ImatrixFormat | str) -> list[str]:
    """What converting ``im`` to ``to_format`` does not preserve (empty when nothing is lost)."""
    to_format = imatrix_format(to_format)
    if to_format == im.format:
        return []
    return _losses_to_dat(im) if to_format == ImatrixFormat.DAT else _losses_to_gguf(im)


def _entry_to_dat(e: ImatrixEntry, chunk_size: int) -> ImatrixEntry | None:
    """save_imatrix_legacy's arithmetic for one GGUF entry (None: no data, the entry is skipped)."""
    e.check()
    cnt_i = lround_counts(e.counts).astype(np.float64)
    if not np.any(cnt_i != 0):
        return None  # save_imatrix_legacy: "entry has no data - skipping"
    q = int(cnt_i.max()) + (chunk_size - 1)
    ncall = q // chunk_size if q >= 0 else -((-q) // chunk_size)  # C++ integer division truncates
    cnt = cnt_i.astype(np.float32)
    zero = cnt == 0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        val = np.where(zero[:, None], np.float32(1), e.values)
        c = np.where(zero, np.float32(1), cnt).astype(np.float32)
        tmp = ((val / c[:, None]).astype(np.float32) * np.float32(ncall)).astype(np.float32)
    return ImatrixEntry(e.name, np.ascontiguousarray(tmp.reshape(-1)), np.array([ncall], dtype=np.int64),
                        ImatrixFormat.DAT)


def _to_dat(im: Imatrix, chunk_size: int | None, src: str) -> Imatrix:
    cs = im.chunk_size if im.chunk_size else chunk_size
    if not cs or cs <= 0:
        raise ImatrixError(f"{src} has no chunk_size; pass chunk_size to convert it to .dat")
    entries = {}
    for name, e in im.entries.items():
        converted = _entry_to_dat(e, cs)
        if converted is not None:
            entries[name] = converted
    if not entries:
        raise ImatrixError(f"{src} has no entry with data: nothing to write as .dat")
    return Imatrix(entries=entries, datasets=im.datasets[-1:], chunk_count=im.chunk_count, chunk_size=None,
                   format=ImatrixFormat.DAT, dat_trailer=True)


def _to_gguf(im: Imatrix, chunk_size: int | None) -> Imatrix:
    cs = chunk_size if chunk_size is not None else DEFAULT_CHUNK_SIZE
    if cs <= 0:
        raise ImatrixError(f"chunk_size must be positive, got {cs}")
    entries = {}
    for name, e in im.entries.items():
        e.check()
        with np.errstate(over="ignore", invalid="ignore"):
            vals = (np.float32(0) + e.values * np.float32(cs)).astype(np.float32)
        count = float(np.float32(int(e.counts[0]) * cs))
        entries[name] = ImatrixEntry(name, vals.reshape(1, -1), np.array([count], dtype=np.float32),
                                     ImatrixFormat.GGUF)
    return Imatrix(entries=dict(sorted(entries.items(), key=lambda kv: name_order(kv[0]))),
                   datasets=list(im.datasets), chunk_count=im.chunk_count, chunk_size=int(cs),
                   format=ImatrixFormat.GGUF)


def convert_imatrix(im: Imatrix, to_format: ImatrixFormat | str, *, chunk_size: int | None = None) -> Imatrix:
    """Convert between formats with the arithmetic llama-imatrix uses (``--in-file`` + save).

    GGUF -> dat (``save_imatrix_legacy``): ``ncall = ceil(max(counts) / chunk_size)``,
    ``value = (in_sum2 / count) * ncall`` per matrix (a matrix with count 0 stores ``1 * ncall``),
    entries whose counts are all zero are dropped; the dataset is the last one. ``chunk_size`` is
    the file's (or the argument when the file has none).

    dat -> GGUF (``load_imatrix`` legacy branch): ``in_sum2 = values * chunk_size``,
    ``counts = [ncall * chunk_size]`` (one matrix, also for expert tensors); ``chunk_size``
    defaults to 512 (llama-imatrix's default ``-c``). The chunk count and dataset are kept
    (llama-imatrix would recompute the chunk count as ``max(ncall)``).
    """
    to_format = imatrix_format(to_format)
    if to_format == im.format:
        return im
    if to_format == ImatrixFormat.DAT:
        return _to_dat(im, chunk_size, f"imatrix {im.path}" if im.path else "imatrix")
    return _to_gguf(im, chunk_size)
