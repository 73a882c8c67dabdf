"""Importance-matrix (imatrix) files: read, write, convert, validate against a model, coverage.

Both formats that llama.cpp 0c1e570 reads (``common/imatrix-loader.cpp``) are supported exactly:

* **legacy ``.dat``** (little-endian), as ``IMatrixCollector::save_imatrix_legacy`` writes it
  (``tools/imatrix/imatrix.cpp``)::

      int32 n_entries
      n_entries x { int32 len; char name[len]; int32 ncall; int32 nval; float32 values[nval] }
      optional trailer: int32 chunk_count; int32 len; char dataset[len]

  The stored values are ``mean * ncall`` (one ``ncall`` per entry, also for MoE expert tensors).
  llama-imatrix always writes the trailer (with ``len = 0`` when it has no dataset name); very old
  files have none. Entries are sorted by name in files from llama-imatrix.

* **GGUF** (``IMatrixCollector::save_imatrix``): KV ``general.type = "imatrix"``,
  ``imatrix.datasets`` (string array), ``imatrix.chunk_count`` (u32), ``imatrix.chunk_size``
  (u32), in that order; then, for every entry in byte-sorted name order, the F32 tensors
  ``<name>.in_sum2`` (ne = [ne0, nmat]: raw sums of squared activations) and ``<name>.counts``
  (ne = [1, nmat]: tokens seen, per expert for MoE). The tensors are written with
  ``ggml_n_dims`` dimensions, so trailing 1s are dropped: a dense entry has ``in_sum2`` of ne
  ``[ne0]`` and ``counts`` of ne ``[1]``. Default alignment 32, zero padding after the header and
  after every tensor (including the last one: the loader requires it).

``mean_values`` reproduces what ``llama-quantize`` (``tools/quantize/quantize.cpp: load_imatrix``)
hands to ``llama_model_quantize``: GGUF ``in_sum2 / lround(counts)`` per matrix (1.0 where the
count is not positive), legacy ``values / ncall`` (as stored when ``ncall <= 0``).

Round trips are byte-identical for files from llama-imatrix and for files written here.
Not preserved: GGUF version 2 (rewritten as 3), bytes after the GGUF tensor data (ignored by
llama.cpp too), non-zero padding bytes, tensor infos not laid out as in_sum2/counts pairs, and
explicit trailing dimensions of 1 written by other tools (normalised like ``ggml_n_dims``).

Verified against the pinned runtime (tests/test_imatrix.py): files from a real llama-imatrix run
round-trip byte for byte; ``llama-imatrix --in-file`` rewrites our files byte for byte; our
GGUF <-> dat conversions equal llama-imatrix's own; and llama-quantize given ``mean_values`` (as a
.dat with ncall = 1) writes the same tensors as given the original GGUF imatrix.

What conversion loses is listed by ``conversion_losses``; in short: GGUF -> dat loses per-expert
counts (means are kept up to float rounding of ``(s/c)*ncall/ncall``), ``chunk_size``, all but the
last dataset and entries with no data at all; dat -> GGUF needs a ``chunk_size`` (llama-imatrix's
``-c``, default 512) to turn ``ncall`` into token counts and keeps means exactly when it is a
power of two.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import struct
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping, Sequence

import numpy as np

from ..gguf.hashing import sha256_file  # noqa: F401  (re-exported)
from ..errors import GGUFReadError, ImatrixError

__all__ = [
    "IMATRIX_REQUIRED_TYPES",
    "Coverage",
    "Imatrix",
    "ImatrixEntry",
    "ImatrixFormat",
    "ImatrixInfo",
    "ImatrixProblem",
    "ModelTensors",
    "ValidationReport",
    "conversion_losses",
    "convert_imatrix",
    "coverage",
    "imatrix_info",
    "imatrix_to_bytes",
    "is_quantizable",
    "mean_values",
    "mtp_block_indices",
    "needs_imatrix",
    "read_imatrix",
    "read_model_tensors",
    "synthetic_imatrix",
    "to_quantize_data",
    "validate",
    "write_imatrix",
]

ImatrixFormat = Literal["dat", "gguf"]
FORMATS: tuple[str, ...] = ("dat", "gguf")

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
GGUF_DEFAULT_ALIGNMENT = 32
GGML_MAX_NAME = 64  # ggml.h: names must be < 64 bytes (the loader refuses longer ones)
GGML_MAX_DIMS = 4
GGML_TYPE_F32 = 0
DEFAULT_CHUNK_SIZE = 512  # llama-imatrix: params.n_ctx = 512 unless -c is given

KEY_GENERAL_TYPE = "general.type"
KEY_GENERAL_ALIGNMENT = "general.alignment"
KEY_DATASETS = "imatrix.datasets"
KEY_CHUNK_COUNT = "imatrix.chunk_count"
KEY_CHUNK_SIZE = "imatrix.chunk_size"
STANDARD_KEYS = (KEY_GENERAL_TYPE, KEY_DATASETS, KEY_CHUNK_COUNT, KEY_CHUNK_SIZE)
SUFFIX_SUMS = ".in_sum2"
SUFFIX_COUNTS = ".counts"

# GGUF value types (gguf.h)
_T_U8, _T_I8, _T_U16, _T_I16, _T_U32, _T_I32, _T_F32, _T_BOOL, _T_STR, _T_ARR, _T_U64, _T_I64, _T_F64 = range(13)
_SCALAR_SIZE = {_T_U8: 1, _T_I8: 1, _T_U16: 2, _T_I16: 2, _T_U32: 4, _T_I32: 4, _T_F32: 4, _T_BOOL: 1,
                _T_U64: 8, _T_I64: 8, _T_F64: 8}
_TYPE_NAMES = {_T_U8: "UINT8", _T_I8: "INT8", _T_U16: "UINT16", _T_I16: "INT16", _T_U32: "UINT32",
               _T_I32: "INT32", _T_F32: "FLOAT32", _T_BOOL: "BOOL", _T_STR: "STRING", _T_ARR: "ARRAY",
               _T_U64: "UINT64", _T_I64: "INT64", _T_F64: "FLOAT64"}

# Types for which llama-quantize needs imatrix data (src/llama-quant.cpp: tensor_requires_imatrix).
IMATRIX_REQUIRED_TYPES = frozenset({"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS"})
# Exact names that never require an imatrix (tensor_name_match_token_embd / _output_weight);
# llama-imatrix never collects token embeddings (GET_ROWS, not MUL_MAT) and collects
# output.weight only with --process-output.
EXEMPT_TENSORS = frozenset({"token_embd.weight", "per_layer_token_embd.weight", "output.weight"})

_ENC = "utf-8"
_ERRS = "surrogateescape"  # names/datasets round-trip even when they are not valid UTF-8


# ------------------------------------------------------------------------------------------------
# data model
# ------------------------------------------------------------------------------------------------


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
    kind: ImatrixFormat = "gguf"

    @property
    def nmat(self) -> int:
        return int(self.values.shape[0]) if self.kind == "gguf" else 1

    @property
    def ne0(self) -> int:
        """Row length of one matrix (the whole ``nval`` for a legacy entry)."""
        return int(self.values.shape[-1])

    @property
    def nval(self) -> int:
        return int(self.values.size)

    @property
    def in_sum2(self) -> np.ndarray:
        if self.kind != "gguf":
            raise ImatrixError(f"entry {self.name!r} is a legacy .dat entry: it has no in_sum2 (use mean_values)")
        return self.values

    @property
    def ncall(self) -> int:
        if self.kind != "dat":
            raise ImatrixError(f"entry {self.name!r} is a GGUF entry: it has per-matrix counts, not ncall")
        return int(self.counts[0])

    def check(self) -> None:
        """Raise ImatrixError if the arrays are not shaped/typed as ``kind`` requires."""
        v, c = self.values, self.counts
        if self.kind == "gguf":
            ok = (isinstance(v, np.ndarray) and v.dtype == np.float32 and v.ndim == 2 and v.size > 0
                  and isinstance(c, np.ndarray) and c.dtype == np.float32 and c.ndim == 1
                  and c.shape[0] == v.shape[0])
            if not ok:
                raise ImatrixError(f"entry {self.name!r}: a GGUF entry needs float32 values (nmat, ne0) and "
                                   f"float32 counts (nmat,), got {_desc(v)} and {_desc(c)}")
        elif self.kind == "dat":
            ok = (isinstance(v, np.ndarray) and v.dtype == np.float32 and v.ndim == 1 and v.size > 0
                  and isinstance(c, np.ndarray) and c.shape == (1,) and np.issubdtype(c.dtype, np.integer))
            if not ok:
                raise ImatrixError(f"entry {self.name!r}: a .dat entry needs float32 values (nval,) and "
                                   f"integer counts [ncall], got {_desc(v)} and {_desc(c)}")
        else:
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
    format: ImatrixFormat = "gguf"
    path: Path | None = None
    sha256: str | None = None
    # --- fidelity details, so that re-writing a file reproduces it byte for byte -----------------
    dat_trailer: bool = True  # .dat: whether the chunk_count/dataset trailer is present
    gguf_kv_order: list[str] | None = None  # GGUF: keys in file order (None: the 4 standard keys)
    gguf_extra_kv: dict[str, bytes] = field(default_factory=dict)  # GGUF: other KVs, raw type+value

    @property
    def has_metadata(self) -> bool:
        """llama-quantize refuses a GGUF imatrix without datasets, chunk_count and chunk_size."""
        if self.format == "dat":
            return True
        keys = self.gguf_kv_order if self.gguf_kv_order is not None else list(STANDARD_KEYS)
        return all(k in keys for k in (KEY_DATASETS, KEY_CHUNK_COUNT, KEY_CHUNK_SIZE)) and self.chunk_size is not None

    def names(self) -> list[str]:
        return list(self.entries)


@dataclass
class ImatrixInfo:
    """A summary of an imatrix file (what ``ggufmtp imatrix info`` prints)."""

    path: str | None
    sha256: str | None
    format: str
    entries: int
    chunk_count: int
    chunk_size: int | None
    datasets: list[str]
    has_metadata: bool = True
    n_values: int = 0
    size_bytes: int | None = None

    @classmethod
    def from_imatrix(cls, im: Imatrix) -> "ImatrixInfo":
        size = None
        if im.path is not None:
            try:
                size = Path(im.path).stat().st_size
            except OSError:
                size = None
        return cls(
            path=str(im.path) if im.path is not None else None,
            sha256=im.sha256,
            format=im.format,
            entries=len(im.entries),
            chunk_count=im.chunk_count,
            chunk_size=im.chunk_size,
            datasets=list(im.datasets),
            has_metadata=im.has_metadata,
            n_values=sum(e.nval for e in im.entries.values()),
            size_bytes=size,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "sha256": self.sha256,
            "format": self.format,
            "entries": self.entries,
            "chunk_count": self.chunk_count,
            "chunk_size": self.chunk_size,
            "datasets": list(self.datasets),
            "has_metadata": self.has_metadata,
            "n_values": self.n_values,
            "size_bytes": self.size_bytes,
        }


def imatrix_info(path: str | os.PathLike) -> ImatrixInfo:
    return ImatrixInfo.from_imatrix(read_imatrix(path))


# ------------------------------------------------------------------------------------------------
# reading
# ------------------------------------------------------------------------------------------------


class _Short(Exception):
    """Internal: the buffer ended before ``what`` could be read."""

    def __init__(self, what: str, offset: int, need: int, have: int):
        super().__init__(what)
        self.what, self.offset, self.need, self.have = what, offset, need, have


class _Bad(Exception):
    """Internal: a value is invalid (message says which)."""


class _Cursor:
    def __init__(self, buf: bytes | memoryview):
        self.buf = memoryview(buf)
        self.pos = 0
        self.size = len(self.buf)

    @property
    def remaining(self) -> int:
        return self.size - self.pos

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or n > self.remaining:
            raise _Short(what, self.pos, n, self.remaining)
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str, what: str):
        s = struct.calcsize(fmt)
        return struct.unpack("<" + fmt, self.take(s, what))[0]

    def i32(self, what: str) -> int:
        return self.unpack("i", what)

    def u32(self, what: str) -> int:
        return self.unpack("I", what)

    def i64(self, what: str) -> int:
        return self.unpack("q", what)

    def u64(self, what: str) -> int:
        return self.unpack("Q", what)

    def gguf_str(self, what: str) -> str:
        n = self.u64(f"length of {what}")
        if n > self.remaining:
            raise _Short(what, self.pos, n, self.remaining)
        return bytes(self.take(n, what)).decode(_ENC, _ERRS)


def _read_bytes_hashed(path: Path) -> tuple[bytearray, str]:
    """Read a whole file into one buffer, hashing it on the way (no second pass, no join copy)."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            buf = bytearray(size)
            mv = memoryview(buf)
            pos = 0
            while pos < size:
                n = f.readinto(mv[pos:pos + (1 << 24)])
                if not n:
                    break
                h.update(mv[pos:pos + n])
                pos += n
            mv.release()
            if pos < size:  # the file shrank while we read it
                del buf[pos:]
            else:
                more = f.read()  # ... or grew
                if more:
                    h.update(more)
                    buf += more
    except FileNotFoundError:
        raise ImatrixError(f"imatrix file {path} does not exist") from None
    except IsADirectoryError:
        raise ImatrixError(f"imatrix file {path} is a directory, not a file") from None
    except OSError as e:
        raise ImatrixError(f"cannot read imatrix file {path}: {e.strerror or e}") from None
    return buf, h.hexdigest()


def read_imatrix(path: str | os.PathLike) -> Imatrix:
    """Read a GGUF or legacy ``.dat`` imatrix; the format is detected by content (GGUF magic).

    Raises ImatrixError naming the file and the problem for missing, truncated, corrupt or
    non-imatrix files.
    """
    p = Path(path)
    data, digest = _read_bytes_hashed(p)
    if not data:
        raise ImatrixError(f"imatrix file {p} is empty")
    if data[:4] == GGUF_MAGIC:
        im = _parse_gguf(data, p)
    else:
        im = _parse_dat(data, p)
    im.path = p
    im.sha256 = digest
    return im


def imatrix_from_bytes(data: bytes | bytearray, name: str = "<bytes>") -> Imatrix:
    """Parse an imatrix held in memory (``name`` is used in error messages)."""
    if not data:
        raise ImatrixError(f"imatrix file {name} is empty")
    im = _parse_gguf(data, name) if data[:4] == GGUF_MAGIC else _parse_dat(data, name)
    im.sha256 = hashlib.sha256(data).hexdigest()
    return im


def _parse_dat(data: bytes | bytearray, p: Path | str) -> Imatrix:
    cur = _Cursor(data)
    where = f"imatrix file {p}"
    hint = "(neither a GGUF file nor a legacy .dat imatrix?)"
    try:
        if len(data) < 4:
            raise _Bad(f"is too short ({len(data)} bytes) to be an imatrix {hint}")
        n_entries = cur.i32("the entry count")
        if n_entries < 1:
            raise _Bad(f"has an invalid entry count {n_entries} {hint}")
        # each entry takes at least 4+1+4+4+4 bytes
        if n_entries > cur.remaining // 17:
            raise _Bad(f"claims {n_entries} entries but has only {cur.remaining} bytes left (truncated, or "
                       f"neither a GGUF file nor a legacy .dat imatrix)")
        entries: dict[str, ImatrixEntry] = {}
        for i in range(n_entries):
            off = cur.pos
            ln = cur.i32(f"the name length of entry {i + 1}")
            if ln < 1 or ln > cur.remaining:
                if ln > cur.remaining:
                    raise _Short(f"the name of entry {i + 1}", cur.pos, ln, cur.remaining)
                raise _Bad(f"has an invalid name length {ln} for entry {i + 1} at offset {off} {hint}")
            raw = bytes(cur.take(ln, f"the name of entry {i + 1}"))
            if b"\0" in raw:
                raise _Bad(f"has a NUL byte in the name of entry {i + 1} at offset {off + 4} {hint}")
            name = raw.decode(_ENC, _ERRS)
            ncall = cur.i32(f"ncall of entry {name!r}")
            nval = cur.i32(f"the value count of entry {name!r}")
            if nval < 1:
                raise _Bad(f"has an invalid value count {nval} for entry {name!r} {hint}")
            vals = np.frombuffer(cur.take(4 * nval, f"the {nval} values of entry {name!r}"), dtype="<f4")
            if name in entries:
                raise _Bad(f"has a duplicate entry {name!r}")
            entries[name] = ImatrixEntry(name, vals.astype(np.float32, copy=True),
                                         np.array([ncall], dtype=np.int64), "dat")
        trailer = False
        chunk_count = 0
        datasets: list[str] = []
        if cur.remaining:
            trailer = True
            chunk_count = cur.i32("the chunk count of the trailer")
            ln = cur.i32("the dataset name length of the trailer")
            if ln < 0:
                raise _Bad(f"has an invalid dataset name length {ln} in its trailer")
            ds = bytes(cur.take(ln, "the dataset name of the trailer"))
            if ln > 0:
                datasets.append(ds.split(b"\0", 1)[0].decode(_ENC, _ERRS))
            if cur.remaining:
                raise _Bad(f"has {cur.remaining} unexpected bytes after the trailer at offset {cur.pos} "
                           f"(corrupt, or several files joined?)")
    except _Short as e:
        raise ImatrixError(f"{where} is truncated: {e.what} needs {e.need} bytes at offset {e.offset} "
                           f"but only {e.have} remain {hint if cur.pos < 64 else ''}".rstrip()) from None
    except _Bad as e:
        raise ImatrixError(f"{where} {e}") from None
    return Imatrix(entries=entries, datasets=datasets, chunk_count=chunk_count, chunk_size=None,
                   format="dat", dat_trailer=trailer)


def _read_gguf_kv(cur: _Cursor, key: str) -> tuple[int, int | None, Any, bytes]:
    """Read type+value; returns (type, array element type, python value, raw bytes of type+value)."""
    start = cur.pos
    vtype = cur.i32(f"the type of {key}")
    atype = None
    if vtype == _T_ARR:
        atype = cur.i32(f"the array type of {key}")
        n = cur.u64(f"the array length of {key}")
        if atype == _T_STR:
            vals = []
            for _ in range(n):
                vals.append(cur.gguf_str(f"an element of {key}"))
                # (bounded by the file size: every element needs at least 8 bytes)
            value: Any = vals
        elif atype in _SCALAR_SIZE:
            cur.take(_SCALAR_SIZE[atype] * n, f"the {n} elements of {key}")
            value = None
        else:
            raise _Bad(f"key {key!r} has invalid GGUF array type {atype}")
    elif vtype == _T_STR:
        value = cur.gguf_str(f"the value of {key}")
    elif vtype in _SCALAR_SIZE:
        raw = cur.take(_SCALAR_SIZE[vtype], f"the value of {key}")
        fmt = {_T_U8: "B", _T_I8: "b", _T_U16: "H", _T_I16: "h", _T_U32: "I", _T_I32: "i", _T_F32: "f",
               _T_BOOL: "b", _T_U64: "Q", _T_I64: "q", _T_F64: "d"}[vtype]
        value = struct.unpack("<" + fmt, raw)[0]
    else:
        raise _Bad(f"key {key!r} has invalid GGUF type {vtype}")
    return vtype, atype, value, bytes(cur.buf[start:cur.pos])


def _parse_gguf(data: bytes | bytearray, p: Path | str) -> Imatrix:
    cur = _Cursor(data)
    where = f"imatrix file {p}"
    try:
        cur.take(4, "the magic")
        version = cur.u32("the GGUF version")
        if version in (0, 1) or version > GGUF_VERSION or (version & 0xFFFF) == 0:
            raise _Bad(f"has unsupported GGUF version {version}")
        n_tensors = cur.i64("the tensor count")
        n_kv = cur.i64("the key-value count")
        if n_tensors < 0 or n_kv < 0:
            raise _Bad(f"has a corrupt header (tensor count {n_tensors}, key-value count {n_kv})")
        if n_kv > cur.remaining // 12 or n_tensors > cur.remaining // 24:
            raise _Bad(f"is truncated or corrupt: its header lists {n_tensors} tensors and {n_kv} keys but "
                       f"only {cur.remaining} bytes follow")
        kv_order: list[str] = []
        values: dict[str, tuple[int, int | None, Any, bytes]] = {}
        for i in range(n_kv):
            key = cur.gguf_str(f"key {i}")
            if not key:
                raise _Bad(f"has an empty key (key-value pair {i})")
            if key in values:
                raise _Bad(f"has a duplicate key {key!r}")
            values[key] = _read_gguf_kv(cur, key)
            kv_order.append(key)

        alignment = GGUF_DEFAULT_ALIGNMENT
        if KEY_GENERAL_ALIGNMENT in values:
            t, _, v, _ = values[KEY_GENERAL_ALIGNMENT]
            if t != _T_U32:
                raise _Bad(f"has {KEY_GENERAL_ALIGNMENT} of type {_TYPE_NAMES.get(t, t)}, not UINT32")
            if v == 0 or v & (v - 1):
                raise _Bad(f"has alignment {v}, which is not a power of 2")
            alignment = v

        gtype = values.get(KEY_GENERAL_TYPE)
        if gtype is not None and not (gtype[0] == _T_STR and gtype[2] == "imatrix"):
            shown = gtype[2] if gtype[0] == _T_STR else _TYPE_NAMES.get(gtype[0], gtype[0])
            raise _Bad(f"is a GGUF file but not an imatrix (general.type = {shown!r})")

        datasets: list[str] = []
        if KEY_DATASETS in values:
            t, at, v, _ = values[KEY_DATASETS]
            if t != _T_ARR or at != _T_STR:
                raise _Bad(f"has {KEY_DATASETS} that is not an array of strings")
            datasets = list(v)
        chunk_count, chunk_size = 0, None
        for key in (KEY_CHUNK_COUNT, KEY_CHUNK_SIZE):
            if key in values:
                t, _, v, _ = values[key]
                if t != _T_U32:
                    # gguf_get_val_u32 asserts on any other type: llama-quantize would abort
                    raise _Bad(f"has {key} of type {_TYPE_NAMES.get(t, t)}; llama.cpp requires UINT32")
                if key == KEY_CHUNK_COUNT:
                    chunk_count = v
                else:
                    chunk_size = v

        infos = []
        seen: set[str] = set()
        for i in range(n_tensors):
            name = cur.gguf_str(f"the name of tensor {i}")
            if len(name.encode(_ENC, _ERRS)) >= GGML_MAX_NAME:
                raise _Bad(f"has tensor name {name!r} of {len(name.encode(_ENC, _ERRS))} bytes "
                           f"(llama.cpp allows at most {GGML_MAX_NAME - 1})")
            if name in seen:
                raise _Bad(f"has a duplicate tensor {name!r}")
            seen.add(name)
            n_dims = cur.u32(f"the dimension count of tensor {name!r}")
            if n_dims > GGML_MAX_DIMS:
                raise _Bad(f"has tensor {name!r} with {n_dims} dimensions (at most {GGML_MAX_DIMS})")
            ne = [cur.i64(f"the shape of tensor {name!r}") for _ in range(n_dims)]
            if any(x < 0 for x in ne):
                raise _Bad(f"has tensor {name!r} with a negative dimension {ne}")
            ne += [1] * (GGML_MAX_DIMS - n_dims)
            ttype = cur.i32(f"the type of tensor {name!r}")
            offset = cur.u64(f"the data offset of tensor {name!r}")
            infos.append((name, ne, ttype, offset))

        foreign = [n for n, *_ in infos if not (n.endswith(SUFFIX_SUMS) or n.endswith(SUFFIX_COUNTS))]
        if foreign:
            arch = values.get("general.architecture")
            what = f" (general.architecture = {arch[2]!r})" if arch is not None and arch[0] == _T_STR else ""
            raise _Bad(f"is a GGUF file but not an imatrix{what}: tensor {foreign[0]!r} is neither "
                       f"<name>{SUFFIX_SUMS} nor <name>{SUFFIX_COUNTS}")

        # data section: aligned start, tensors laid out contiguously with padding (as the loader checks)
        data_start = _pad(cur.pos, alignment) if n_tensors > 0 else cur.pos
        expected = 0
        spans = []
        for name, ne, ttype, offset in infos:
            if ttype != GGML_TYPE_F32:
                raise _Bad(f"has tensor {name!r} of ggml type {ttype}; imatrix tensors must be F32")
            nel = math.prod(ne)
            if offset != expected:
                raise _Bad(f"has tensor {name!r} at data offset {offset}, expected {expected}")
            spans.append((name, ne, data_start + offset, nel))
            expected += _pad(4 * nel, alignment)
        if data_start + expected > len(data):
            raise _Short("the tensor data", data_start, expected, max(0, len(data) - data_start))
    except _Short as e:
        raise ImatrixError(f"{where} is truncated: {e.what} needs {e.need} bytes at offset {e.offset} "
                           f"but only {e.have} remain") from None
    except _Bad as e:
        raise ImatrixError(f"{where} {e}") from None

    sums: dict[str, tuple[list[int], int, int]] = {}
    cnts: dict[str, tuple[list[int], int, int]] = {}
    order: list[str] = []
    for name, ne, off, nel in spans:
        if name.endswith(SUFFIX_SUMS):
            base, target = name[: -len(SUFFIX_SUMS)], sums
        elif name.endswith(SUFFIX_COUNTS):
            base, target = name[: -len(SUFFIX_COUNTS)], cnts
        else:  # pragma: no cover - rejected above
            raise ImatrixError(f"{where} has tensor {name!r}, which is neither <name>{SUFFIX_SUMS} nor "
                               f"<name>{SUFFIX_COUNTS}")
        if not base:
            raise ImatrixError(f"{where} has a tensor named just {name!r}")
        if base not in sums and base not in cnts:
            order.append(base)
        target[base] = (ne, off, nel)
    if not order:
        raise ImatrixError(f"{where} contains no imatrix entries (no tensors)")

    entries: dict[str, ImatrixEntry] = {}
    for base in order:
        if base not in sums or base not in cnts:
            have = SUFFIX_SUMS if base in sums else SUFFIX_COUNTS
            raise ImatrixError(f"{where}: entry {base!r} has {have} but not "
                               f"{SUFFIX_COUNTS if have == SUFFIX_SUMS else SUFFIX_SUMS}")
        (sne, soff, snel), (coff, cnel) = sums[base], cnts[base][1:]
        if sne[2] != 1 or sne[3] != 1:
            raise ImatrixError(f"{where}: {base}{SUFFIX_SUMS} has shape {sne[:4]}, expected [ne0, nmat]")
        ne0, nmat = sne[0], sne[1]
        if snel == 0:
            raise ImatrixError(f"{where}: {base}{SUFFIX_SUMS} is empty")
        if cnel != nmat:
            raise ImatrixError(f"{where}: {base}{SUFFIX_COUNTS} has {cnel} values but {base}{SUFFIX_SUMS} "
                               f"holds {nmat} matrices")
        v = np.frombuffer(data, dtype="<f4", count=snel, offset=soff).astype(np.float32).reshape(nmat, ne0)
        c = np.frombuffer(data, dtype="<f4", count=cnel, offset=coff).astype(np.float32).reshape(nmat)
        entries[base] = ImatrixEntry(base, v, c, "gguf")

    extra = {k: values[k][3] for k in kv_order if k not in STANDARD_KEYS}
    return Imatrix(entries=entries, datasets=datasets, chunk_count=chunk_count, chunk_size=chunk_size,
                   format="gguf", gguf_kv_order=kv_order, gguf_extra_kv=extra)


def _pad(n: int, align: int) -> int:
    return (n + align - 1) // align * align


# ------------------------------------------------------------------------------------------------
# writing
# ------------------------------------------------------------------------------------------------


def _check_imatrix(im: Imatrix, fmt: str) -> None:
    if not im.entries:
        raise ImatrixError("cannot write an imatrix with no entries (llama.cpp refuses such files)")
    for name, e in im.entries.items():
        if e.name != name:
            raise ImatrixError(f"entry key {name!r} does not match its name {e.name!r}")
        if e.kind != fmt:
            raise ImatrixError(f"entry {name!r} is a {e.kind} entry in a {fmt} imatrix (use convert_imatrix)")
        e.check()
        if not name or "\0" in name:
            raise ImatrixError(f"invalid entry name {name!r}")


def _gguf_str(s: str) -> bytes:
    b = s.encode(_ENC, _ERRS)
    return struct.pack("<Q", len(b)) + b


def _u32(v: int, what: str) -> int:
    if not isinstance(v, (int, np.integer)) or not 0 <= int(v) <= 0xFFFFFFFF:
        raise ImatrixError(f"{what} = {v!r} does not fit in a uint32")
    return int(v)


def _i32(v: int, what: str) -> int:
    if not isinstance(v, (int, np.integer)) or not -(2**31) <= int(v) < 2**31:
        raise ImatrixError(f"{what} = {v!r} does not fit in an int32")
    return int(v)


def _gguf_parts(im: Imatrix) -> list[bytes | memoryview]:
    _check_imatrix(im, "gguf")
    kv_order = im.gguf_kv_order if im.gguf_kv_order is not None else list(STANDARD_KEYS)
    alignment = GGUF_DEFAULT_ALIGNMENT
    kv_blobs = []
    for key in kv_order:
        if key == KEY_GENERAL_TYPE:
            val = struct.pack("<i", _T_STR) + _gguf_str("imatrix")
        elif key == KEY_DATASETS:
            val = struct.pack("<iiQ", _T_ARR, _T_STR, len(im.datasets)) + b"".join(_gguf_str(d) for d in im.datasets)
        elif key == KEY_CHUNK_COUNT:
            val = struct.pack("<iI", _T_U32, _u32(im.chunk_count, "chunk_count"))
        elif key == KEY_CHUNK_SIZE:
            if im.chunk_size is None:
                raise ImatrixError("a GGUF imatrix needs chunk_size (llama-quantize refuses files without it)")
            val = struct.pack("<iI", _T_U32, _u32(im.chunk_size, "chunk_size"))
        elif key in im.gguf_extra_kv:
            val = im.gguf_extra_kv[key]
            if key == KEY_GENERAL_ALIGNMENT:
                t, a = struct.unpack("<iI", val[:8]) if len(val) >= 8 else (-1, 0)
                if t != _T_U32 or a == 0 or a & (a - 1):
                    raise ImatrixError(f"invalid {KEY_GENERAL_ALIGNMENT} in the extra metadata")
                alignment = a
        else:
            raise ImatrixError(f"metadata key {key!r} is listed in gguf_kv_order but has no value")
        kv_blobs.append(_gguf_str(key) + val)
    if len(set(kv_order)) != len(kv_order):
        raise ImatrixError("gguf_kv_order lists a key twice")

    infos = []
    datas: list[bytes | memoryview] = []
    offset = 0
    for name, e in im.entries.items():
        for suffix, arr, ne in ((SUFFIX_SUMS, e.values, [e.ne0, e.nmat]), (SUFFIX_COUNTS, e.counts, [1, e.nmat])):
            tname = name + suffix
            if len(tname.encode(_ENC, _ERRS)) >= GGML_MAX_NAME:
                raise ImatrixError(f"tensor name {tname!r} is too long for GGUF (at most {GGML_MAX_NAME - 1} "
                                   f"bytes; llama-imatrix would silently truncate it)")
            n_dims = 2 if ne[1] > 1 else 1  # ggml_n_dims
            info = _gguf_str(tname) + struct.pack("<I", n_dims) + struct.pack(f"<{n_dims}q", *ne[:n_dims])
            info += struct.pack("<iQ", GGML_TYPE_F32, offset)
            infos.append(info)
            raw = np.ascontiguousarray(arr, dtype="<f4").tobytes()
            pad = _pad(len(raw), alignment) - len(raw)
            datas.append(raw)
            if pad:
                datas.append(b"\0" * pad)
            offset += len(raw) + pad
    header = GGUF_MAGIC + struct.pack("<Iqq", GGUF_VERSION, len(infos), len(kv_blobs))
    meta = header + b"".join(kv_blobs) + b"".join(infos)
    meta += b"\0" * (_pad(len(meta), alignment) - len(meta))
    return [meta, *datas]


def _dat_parts(im: Imatrix) -> list[bytes]:
    _check_imatrix(im, "dat")
    out = [struct.pack("<i", _i32(len(im.entries), "entry count"))]
    for name, e in im.entries.items():
        b = name.encode(_ENC, _ERRS)
        out.append(struct.pack("<i", len(b)) + b)
        out.append(struct.pack("<ii", _i32(e.ncall, f"ncall of {name}"), _i32(e.nval, f"nval of {name}")))
        out.append(np.ascontiguousarray(e.values, dtype="<f4").tobytes())
    if im.dat_trailer:
        ds = im.datasets[-1].encode(_ENC, _ERRS) if im.datasets else b""
        out.append(struct.pack("<ii", _i32(im.chunk_count, "chunk_count"), len(ds)) + ds)
    elif im.datasets or im.chunk_count:
        raise ImatrixError("dat_trailer is False but the imatrix has a chunk count or dataset to store")
    return out


def imatrix_to_bytes(im: Imatrix, format: ImatrixFormat | None = None) -> bytes:
    fmt = format or im.format
    if fmt not in FORMATS:
        raise ImatrixError(f"unknown imatrix format {fmt!r} (expected dat or gguf)")
    if fmt != im.format:
        im = convert_imatrix(im, fmt)
    parts = _gguf_parts(im) if fmt == "gguf" else _dat_parts(im)
    return b"".join(bytes(p) for p in parts)


def write_imatrix(im: Imatrix, path: str | os.PathLike, format: ImatrixFormat | None = None,
                  *, chunk_size: int | None = None) -> str:
    """Write ``im`` to ``path`` atomically (temp file in the same folder + ``os.replace``).

    ``format`` defaults to ``im.format``; another format converts first (see ``convert_imatrix``,
    ``chunk_size`` is used for dat -> GGUF). Returns the SHA-256 of the written file.
    """
    fmt = format or im.format
    if fmt not in FORMATS:
        raise ImatrixError(f"unknown imatrix format {fmt!r} (expected dat or gguf)")
    if fmt != im.format:
        im = convert_imatrix(im, fmt, chunk_size=chunk_size)
    parts = _gguf_parts(im) if fmt == "gguf" else _dat_parts(im)
    p = Path(path)
    folder = p.parent if str(p.parent) else Path(".")
    h = hashlib.sha256()
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=folder)
    except OSError as e:
        raise ImatrixError(f"cannot write imatrix file {p}: {e.strerror or e}") from None
    try:
        try:
            mode = p.stat().st_mode & 0o777
        except OSError:
            mode = 0o666 & ~_umask()
        os.fchmod(fd, mode)  # mkstemp creates 0600; give the file the usual permissions
        with os.fdopen(fd, "wb") as f:
            for part in parts:
                f.write(part)
                h.update(part)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except OSError as e:
        _unlink_quiet(tmp)
        raise ImatrixError(f"cannot write imatrix file {p}: {e.strerror or e}") from None
    except BaseException:
        _unlink_quiet(tmp)
        raise
    return h.hexdigest()


def _umask() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def _unlink_quiet(p: str) -> None:
    try:
        os.unlink(p)
    except OSError:
        pass


# ------------------------------------------------------------------------------------------------
# means (what llama-quantize passes to llama_model_quantize) and conversion
# ------------------------------------------------------------------------------------------------


def _lround_to_f32(counts: np.ndarray) -> np.ndarray:
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
    if entry.kind == "gguf":
        cnt = _lround_to_f32(entry.counts)
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


def conversion_losses(im: Imatrix, to_format: ImatrixFormat) -> list[str]:
    """What converting ``im`` to ``to_format`` does not preserve (empty when nothing is lost)."""
    if to_format == im.format:
        return []
    out: list[str] = []
    if to_format == "dat":
        multi = [n for n, e in im.entries.items() if e.nmat > 1]
        if multi:
            out.append(f"per-matrix token counts of {len(multi)} MoE entries are merged into one ncall "
                       f"(means are kept, up to float rounding)")
        else:
            out.append("token counts become one ncall per entry (means are kept, up to float rounding)")
        empty = [n for n, e in im.entries.items() if not np.any(_lround_to_f32(e.counts) != 0)]
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
    else:
        out.append("ncall becomes token counts ncall * chunk_size; means are exact when chunk_size is a "
                   "power of two")
        zero = [n for n, e in im.entries.items() if int(e.counts[0]) <= 0]
        if zero:
            out.append(f"{len(zero)} entries have ncall <= 0: llama-quantize used their values as-is, "
                       f"after conversion their means become 1.0")
    return out


def convert_imatrix(im: Imatrix, to_format: ImatrixFormat, *, chunk_size: int | None = None) -> Imatrix:
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
    if to_format not in FORMATS:
        raise ImatrixError(f"unknown imatrix format {to_format!r} (expected dat or gguf)")
    if to_format == im.format:
        return im
    src = f"imatrix {im.path}" if im.path else "imatrix"
    if to_format == "dat":
        cs = im.chunk_size if im.chunk_size else chunk_size
        if not cs or cs <= 0:
            raise ImatrixError(f"{src} has no chunk_size; pass chunk_size to convert it to .dat")
        entries = {}
        for name, e in im.entries.items():
            e.check()
            cnt_i = _lround_to_f32(e.counts).astype(np.float64)
            if not np.any(cnt_i != 0):
                continue  # save_imatrix_legacy: "entry has no data - skipping"
            mx = int(cnt_i.max())
            q = mx + (cs - 1)
            ncall = q // cs if q >= 0 else -((-q) // cs)  # C++ integer division truncates
            cnt = cnt_i.astype(np.float32)
            zero = cnt == 0
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                val = np.where(zero[:, None], np.float32(1), e.values)
                c = np.where(zero, np.float32(1), cnt).astype(np.float32)
                tmp = ((val / c[:, None]).astype(np.float32) * np.float32(ncall)).astype(np.float32)
            entries[name] = ImatrixEntry(name, np.ascontiguousarray(tmp.reshape(-1)),
                                         np.array([ncall], dtype=np.int64), "dat")
        if not entries:
            raise ImatrixError(f"{src} has no entry with data: nothing to write as .dat")
        return Imatrix(entries=entries, datasets=im.datasets[-1:], chunk_count=im.chunk_count, chunk_size=None,
                       format="dat", dat_trailer=True)
    cs = chunk_size if chunk_size is not None else DEFAULT_CHUNK_SIZE
    if cs <= 0:
        raise ImatrixError(f"chunk_size must be positive, got {cs}")
    entries = {}
    for name, e in im.entries.items():
        e.check()
        with np.errstate(over="ignore", invalid="ignore"):
            vals = (np.float32(0) + e.values * np.float32(cs)).astype(np.float32)
        count = float(np.float32(int(e.counts[0]) * cs))
        entries[name] = ImatrixEntry(name, vals.reshape(1, -1), np.array([count], dtype=np.float32), "gguf")
    return Imatrix(entries=dict(sorted(entries.items(), key=lambda kv: kv[0].encode(_ENC, _ERRS))),
                   datasets=list(im.datasets), chunk_count=im.chunk_count, chunk_size=int(cs), format="gguf")


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
    ``<arch>.block_count`` / ``<arch>.nextn_predict_layers`` keys of a model GGUF."""
    from ..gguf.model import GGUFModel  # the fast header reader; split models read as one

    p = Path(path)
    if not p.is_file():
        raise GGUFReadError(f"model file {p} does not exist")
    gm = GGUFModel(p)
    arch = gm.metadata.get("general.architecture")
    arch = str(arch) if arch is not None else None
    bc = gm.metadata.get(f"{arch}.block_count") if arch else None
    nn = gm.metadata.get(f"{arch}.nextn_predict_layers") if arch else None
    shapes = gm.shapes()
    return ModelTensors(path=str(p), arch=arch, shapes=shapes,
                        block_count=int(bc) if bc is not None else None,
                        nextn_predict_layers=int(nn) if nn is not None else 0)


# ------------------------------------------------------------------------------------------------
# validation against a model
# ------------------------------------------------------------------------------------------------


@dataclass
class ImatrixProblem:
    severity: Literal["error", "warning"]
    kind: str  # unknown_tensor, size_mismatch, shape_mismatch, non_finite, negative, bad_counts,
    #            no_data, missing_metadata
    name: str | None
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"severity": self.severity, "kind": self.kind, "name": self.name, "message": self.message}

    def __str__(self) -> str:
        return self.message


@dataclass
class ValidationReport:
    path: str | None
    entries: int
    matched: int
    problems: list[ImatrixProblem] = field(default_factory=list)

    @property
    def errors(self) -> list[ImatrixProblem]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def warnings(self) -> list[ImatrixProblem]:
        return [p for p in self.problems if p.severity == "warning"]

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
    unknown: list[str] = []
    mismatched: list[str] = []

    if not im.has_metadata:
        problems.append(ImatrixProblem("error", "missing_metadata", None,
                                       f"{src} lacks {KEY_DATASETS}, {KEY_CHUNK_COUNT} or {KEY_CHUNK_SIZE}: "
                                       f"llama-quantize refuses it"))
    for name, e in im.entries.items():
        e.check()
        means = mean_values(e)
        nonfinite = int(np.count_nonzero(~np.isfinite(means)))
        if nonfinite:
            problems.append(ImatrixProblem("error", "non_finite", name,
                                           f"{name}: {nonfinite} of {means.size} values are NaN or infinite"))
        with np.errstate(invalid="ignore"):
            neg = int(np.count_nonzero(means < 0))
        if neg:
            problems.append(ImatrixProblem("error", "negative", name,
                                           f"{name}: {neg} of {means.size} values are negative "
                                           f"(sums of squares cannot be)"))
        if e.kind == "gguf":
            bad = int(np.count_nonzero(~np.isfinite(e.counts) | (e.counts < 0)))
            if bad:
                problems.append(ImatrixProblem("error", "bad_counts", name,
                                               f"{name}: {bad} of {e.nmat} counts are negative or not finite"))
            zero = int(np.count_nonzero(_lround_to_f32(e.counts) <= 0))
            if zero and not bad:
                what = "has no data" if zero == e.nmat else f"has no data for {zero} of {e.nmat} experts"
                problems.append(ImatrixProblem("warning", "no_data", name,
                                               f"{name} {what} (llama-quantize uses 1.0 there)"))
        elif e.ncall <= 0:
            problems.append(ImatrixProblem("warning", "no_data", name,
                                           f"{name}: ncall is {e.ncall} (llama-quantize uses the stored values as-is)"))

        if name not in shapes:
            unknown.append(name)
            continue
        shape = shapes[name]
        want = expected_size(shape)
        if e.nval != want:
            mismatched.append(name)
            sev = "warning" if name in ("token_embd.weight", "per_layer_token_embd.weight") else "error"
            problems.append(ImatrixProblem(sev, "size_mismatch", name,
                                           f"{name}: imatrix has {e.nval} values, the tensor {list(shape)} "
                                           f"needs {want} (ne0 * n_expert)"))
            continue
        if e.kind == "gguf" and e.nmat > 1:
            n_exp = shape[2] if len(shape) > 2 else 1
            if e.nmat != n_exp or e.ne0 != shape[0]:
                problems.append(ImatrixProblem("error", "shape_mismatch", name,
                                               f"{name}: imatrix holds {e.nmat} rows of {e.ne0}, the tensor "
                                               f"{list(shape)} has {n_exp} experts of {shape[0]} columns"))

    if unknown:
        sample = ", ".join(unknown[:5]) + (" ..." if len(unknown) > 5 else "")
        problems.append(ImatrixProblem("warning", "unknown_tensor", None,
                                       f"{len(unknown)} entries name tensors the model does not have "
                                       f"(llama-quantize ignores them): {sample}"))
    total = len(im.entries)
    bad_n = len(unknown) + len(mismatched)
    report = ValidationReport(path=str(im.path) if im.path else None, entries=total,
                              matched=total - bad_n, problems=problems)
    if total and bad_n > wrong_model_fraction * total:
        parts = []
        if unknown:
            parts.append(f"{len(unknown)} unknown tensor names (e.g. {unknown[0]})")
        if mismatched:
            parts.append(f"{len(mismatched)} size mismatches (e.g. {mismatched[0]})")
        raise ImatrixError(f"{src} was made for another model: {bad_n} of {total} entries do not match "
                           f"the model's tensors ({'; '.join(parts)})")
    if strict and report.errors:
        first = report.errors[0].message
        more = f" (and {len(report.errors) - 1} more problems)" if len(report.errors) > 1 else ""
        raise ImatrixError(f"{src} is not usable for this model: {first}{more}")
    return report


# ------------------------------------------------------------------------------------------------
# coverage and imatrix requirements
# ------------------------------------------------------------------------------------------------


def needs_imatrix(type_name: str, ftype: str | int | None = None, tensor_name: str | None = None) -> bool:
    """Whether quantizing a tensor to ``type_name`` requires imatrix data.

    Mirrors ``tensor_requires_imatrix`` (src/llama-quant.cpp): IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S,
    IQ3_XXS always; Q2_K only when the file type (``ftype``: "Q2_K_S", "MOSTLY_Q2_K_S",
    "LLAMA_FTYPE_MOSTLY_Q2_K_S" or 21) is Q2_K_S; never for ``token_embd.weight``,
    ``per_layer_token_embd.weight`` and ``output.weight``.
    """
    if tensor_name is not None and tensor_name in EXEMPT_TENSORS:
        return False
    t = type_name.upper().removeprefix("GGML_TYPE_")
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
    format: ImatrixFormat = "gguf",
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
    for name in sorted(shapes, key=lambda s: s.encode(_ENC, _ERRS)):
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
        entries[name] = ImatrixEntry(name, sums, counts, "gguf")
    if not entries:
        raise ImatrixError("synthetic_imatrix: the model has no tensor llama-imatrix would collect")
    im = Imatrix(entries=entries, datasets=[dataset], chunk_count=chunk_count, chunk_size=chunk_size,
                 format="gguf")
    return convert_imatrix(im, "dat") if format == "dat" else im
