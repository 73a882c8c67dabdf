"""Importance-matrix (imatrix) files as bytes: read and write both formats llama.cpp knows.

The data model, the means and format conversion are in :mod:`ggufmtp.imatrix.entries`; checks
against a model (validation, coverage, which types need an imatrix) in :mod:`ggufmtp.imatrix.check`.

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
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from gguf.constants import GGUF_DEFAULT_ALIGNMENT, GGUF_VERSION, GGMLQuantizationType, GGUFValueType, Keys

from ..errors import GGUFReadError, ImatrixError
from ..files.fsutil import atomic_write_parts, not_a_regular_file
from ..gguf.reader import GGML_MAX_NAME, GGUF_MAGIC, ByteCursor, GGUFHeader, HeaderTensor, parse_header, truncation
from .entries import (
    KEY_CHUNK_COUNT,
    KEY_CHUNK_SIZE,
    KEY_DATASETS,
    KEY_GENERAL_TYPE,
    STANDARD_KEYS,
    TEXT_ENCODING,
    TEXT_ERRORS,
    Imatrix,
    ImatrixEntry,
    ImatrixFormat,
    convert_imatrix,
    imatrix_format,
)

__all__ = ["ImatrixInfo", "imatrix_from_bytes", "imatrix_info", "imatrix_to_bytes", "read_imatrix", "write_imatrix"]

KEY_GENERAL_ALIGNMENT = Keys.General.ALIGNMENT
SUFFIX_SUMS = ".in_sum2"
SUFFIX_COUNTS = ".counts"
_F32 = GGMLQuantizationType.F32
_DAT_HINT = "(neither a GGUF file nor a legacy .dat imatrix?)"


@dataclass
class ImatrixInfo:
    """A summary of an imatrix file (what ``ggufmtp imatrix info`` prints)."""

    path: str | None
    sha256: str | None
    format: ImatrixFormat
    entries: int
    chunk_count: int
    chunk_size: int | None
    datasets: list[str]
    has_metadata: bool = True
    n_values: int = 0
    size_bytes: int | None = None

    @classmethod
    def from_imatrix(cls, im: Imatrix) -> ImatrixInfo:
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
            "format": str(self.format),
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


class _Bad(Exception):
    """Internal: a value is invalid (the message says which, as a predicate of the file)."""


class _Short(_Bad):
    """Internal: a .dat file ends before an entry does (its message gets a hint at the start)."""


def refuse_unreadable_imatrix(path: str | os.PathLike) -> None:
    """ImatrixError unless ``path`` is a regular file, in the words :func:`read_imatrix` uses: what
    reads it later (``run``'s and ``ladder``'s quantize stages) checks it so before any work."""
    problem = not_a_regular_file(path)
    if problem == "no such file":
        raise ImatrixError(f"imatrix file {path} does not exist")
    if problem == "is a directory":
        raise ImatrixError(f"imatrix file {path} is a directory, not a file")
    if problem is not None:
        raise ImatrixError(f"imatrix file {path} {problem}")


def _read_bytes_hashed(path: Path) -> tuple[bytearray, str]:
    """Read a whole file into one buffer, hashing it on the way (no second pass, no join copy)."""
    h = hashlib.sha256()
    refuse_unreadable_imatrix(path)
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


def _parse_dat_entry(cur: ByteCursor, i: int) -> ImatrixEntry:
    off = cur.pos
    ln = cur.unpack("i", f"the name length of entry {i + 1}")
    if ln < 1:
        raise _Bad(f"has an invalid name length {ln} for entry {i + 1} at offset {off} {_DAT_HINT}")
    raw = bytes(cur.take(ln, f"the name of entry {i + 1}"))
    if b"\0" in raw:
        raise _Bad(f"has a NUL byte in the name of entry {i + 1} at offset {off + 4} {_DAT_HINT}")
    name = raw.decode(TEXT_ENCODING, TEXT_ERRORS)
    ncall = cur.unpack("i", f"ncall of entry {name!r}")
    nval = cur.unpack("i", f"the value count of entry {name!r}")
    if nval < 1:
        raise _Bad(f"has an invalid value count {nval} for entry {name!r} {_DAT_HINT}")
    vals = np.frombuffer(cur.take(4 * nval, f"the {nval} values of entry {name!r}"), dtype="<f4")
    return ImatrixEntry(name, vals.astype(np.float32, copy=True), np.array([ncall], dtype=np.int64),
                        ImatrixFormat.DAT)


def _parse_dat_entries(cur: ByteCursor, size: int) -> dict[str, ImatrixEntry]:
    if size < 4:
        raise _Bad(f"is too short ({size} bytes) to be an imatrix {_DAT_HINT}")
    n_entries = cur.unpack("i", "the entry count")
    if n_entries < 1:
        raise _Bad(f"has an invalid entry count {n_entries} {_DAT_HINT}")
    if n_entries > cur.remaining // 17:  # each entry takes at least 4+1+4+4+4 bytes
        raise _Bad(f"claims {n_entries} entries but has only {cur.remaining} bytes left (truncated, or "
                   f"neither a GGUF file nor a legacy .dat imatrix)")
    entries: dict[str, ImatrixEntry] = {}
    for i in range(n_entries):
        e = _parse_dat_entry(cur, i)
        if e.name in entries:
            raise _Bad(f"has a duplicate entry {e.name!r}")
        entries[e.name] = e
    return entries


def _parse_dat_trailer(cur: ByteCursor) -> tuple[int, list[str]]:
    """(chunk count, datasets) of the optional trailer llama-imatrix writes after the entries."""
    chunk_count = cur.unpack("i", "the chunk count of the trailer")
    ln = cur.unpack("i", "the dataset name length of the trailer")
    if ln < 0:
        raise _Bad(f"has an invalid dataset name length {ln} in its trailer")
    ds = bytes(cur.take(ln, "the dataset name of the trailer"))
    datasets = [ds.split(b"\0", 1)[0].decode(TEXT_ENCODING, TEXT_ERRORS)] if ln > 0 else []
    if cur.remaining:
        raise _Bad(f"has {cur.remaining} unexpected bytes after the trailer at offset {cur.pos} "
                   f"(corrupt, or several files joined?)")
    return chunk_count, datasets


def _parse_dat(data: bytes | bytearray, p: Path | str) -> Imatrix:
    cur = ByteCursor(memoryview(data), short=_Short, text_errors=TEXT_ERRORS)
    where = f"imatrix file {p}"
    try:
        entries = _parse_dat_entries(cur, len(data))
        trailer = bool(cur.remaining)
        chunk_count, datasets = _parse_dat_trailer(cur) if trailer else (0, [])
    except _Short as e:
        raise ImatrixError(f"{where} {e} {_DAT_HINT if cur.pos < 64 else ''}".rstrip()) from None
    except _Bad as e:
        raise ImatrixError(f"{where} {e}") from None
    return Imatrix(entries=entries, datasets=datasets, chunk_count=chunk_count, chunk_size=None,
                   format=ImatrixFormat.DAT, dat_trailer=trailer)


class _Span(NamedTuple):
    """Where one imatrix tensor's float32 data lie in the file."""

    name: str
    shape: tuple[int, ...]  # ne, padded with 1s to 4 dimensions
    offset: int
    n_elements: int


def _gguf_metadata(header: GGUFHeader) -> tuple[list[str], int, int | None]:
    """(datasets, chunk_count, chunk_size) with the types llama.cpp requires of them."""
    gtype = header.fields.get(KEY_GENERAL_TYPE)
    if gtype is not None and not (gtype.type == GGUFValueType.STRING and gtype.value == "imatrix"):
        shown = gtype.value if gtype.type == GGUFValueType.STRING else gtype.type.name
        raise _Bad(f"is a GGUF file but not an imatrix (general.type = {shown!r})")
    datasets: list[str] = []
    if KEY_DATASETS in header.fields:
        f = header.fields[KEY_DATASETS]
        if f.type != GGUFValueType.ARRAY or f.item_type != GGUFValueType.STRING:
            raise _Bad(f"has {KEY_DATASETS} that is not an array of strings")
        datasets = list(f.value)
    counts: dict[str, int | None] = {KEY_CHUNK_COUNT: 0, KEY_CHUNK_SIZE: None}
    for key in counts:
        f = header.fields.get(key)
        if f is not None:
            if f.type != GGUFValueType.UINT32:
                # gguf_get_val_u32 asserts on any other type: llama-quantize would abort
                raise _Bad(f"has {key} of type {f.type.name}; llama.cpp requires UINT32")
            counts[key] = f.value
    return datasets, counts[KEY_CHUNK_COUNT] or 0, counts[KEY_CHUNK_SIZE]


def _refuse_foreign_tensors(header: GGUFHeader) -> None:
    foreign = [t.name for t in header.tensors if not t.name.endswith((SUFFIX_SUMS, SUFFIX_COUNTS))]
    if foreign:
        arch = header.fields.get(Keys.General.ARCHITECTURE)
        what = f" (general.architecture = {arch.value!r})" if arch and arch.type == GGUFValueType.STRING else ""
        raise _Bad(f"is a GGUF file but not an imatrix{what}: tensor {foreign[0]!r} is neither "
                   f"<name>{SUFFIX_SUMS} nor <name>{SUFFIX_COUNTS}")


def _span(t: HeaderTensor) -> _Span:
    return _Span(t.name, t.shape + (1,) * (4 - len(t.shape)), t.offset, math.prod(t.shape))


def _gguf_spans(header: GGUFHeader) -> list[_Span]:
    """The tensors' data, laid out contiguously with padding from the aligned data section (as the
    loader checks), all F32 and inside the file."""
    _refuse_foreign_tensors(header)
    expected = 0
    spans = []
    for t in header.tensors:
        if t.type_id != _F32:
            raise _Bad(f"has tensor {t.name!r} of ggml type {t.type_id}; imatrix tensors must be F32")
        if t.offset - header.data_offset != expected:
            raise _Bad(f"has tensor {t.name!r} at data offset {t.offset - header.data_offset}, expected {expected}")
        spans.append(_span(t))
        expected += _pad(4 * spans[-1].n_elements, header.alignment)
    if header.data_offset + expected > header.file_size:
        have = max(0, header.file_size - header.data_offset)
        raise _Bad(truncation("the tensor data", header.data_offset, expected, have))
    return spans


def _pair_spans(spans: list[_Span], where: str) -> list[tuple[str, _Span, _Span]]:
    """(entry name, in_sum2 span, counts span) in file order of the entries."""
    sums: dict[str, _Span] = {}
    cnts: dict[str, _Span] = {}
    order: list[str] = []
    for s in spans:
        is_sums = s.name.endswith(SUFFIX_SUMS)
        base = s.name[: -len(SUFFIX_SUMS if is_sums else SUFFIX_COUNTS)]
        if not base:
            raise ImatrixError(f"{where} has a tensor named just {s.name!r}")
        if base not in sums and base not in cnts:
            order.append(base)
        (sums if is_sums else cnts)[base] = s
    if not order:
        raise ImatrixError(f"{where} contains no imatrix entries (no tensors)")
    for base in order:
        if base not in sums or base not in cnts:
            have, lacks = (SUFFIX_SUMS, SUFFIX_COUNTS) if base in sums else (SUFFIX_COUNTS, SUFFIX_SUMS)
            raise ImatrixError(f"{where}: entry {base!r} has {have} but not {lacks}")
    return [(base, sums[base], cnts[base]) for base in order]


def _gguf_entry(data: bytes | bytearray, base: str, sums: _Span, cnts: _Span, where: str) -> ImatrixEntry:
    if sums.shape[2] != 1 or sums.shape[3] != 1:
        raise ImatrixError(f"{where}: {base}{SUFFIX_SUMS} has shape {list(sums.shape)}, expected [ne0, nmat]")
    ne0, nmat = sums.shape[0], sums.shape[1]
    if sums.n_elements == 0:
        raise ImatrixError(f"{where}: {base}{SUFFIX_SUMS} is empty")
    if cnts.n_elements != nmat:
        raise ImatrixError(f"{where}: {base}{SUFFIX_COUNTS} has {cnts.n_elements} values but {base}{SUFFIX_SUMS} "
                           f"holds {nmat} matrices")
    v = np.frombuffer(data, dtype="<f4", count=sums.n_elements, offset=sums.offset).astype(np.float32)
    c = np.frombuffer(data, dtype="<f4", count=cnts.n_elements, offset=cnts.offset).astype(np.float32)
    return ImatrixEntry(base, v.reshape(nmat, ne0), c.reshape(nmat), ImatrixFormat.GGUF)


def _parse_gguf(data: bytes | bytearray, p: Path | str) -> Imatrix:
    where = f"imatrix file {p}"
    try:
        header = parse_header(data, where, small_array=None, text_errors=TEXT_ERRORS)
        datasets, chunk_count, chunk_size = _gguf_metadata(header)
        spans = _gguf_spans(header)
    except GGUFReadError as e:
        raise ImatrixError(str(e)) from None
    except _Bad as e:
        raise ImatrixError(f"{where} {e}") from None
    entries = {base: _gguf_entry(data, base, s, c, where) for base, s, c in _pair_spans(spans, where)}
    extra = {k: bytes(data[f.value_span[0]:f.value_span[1]]) for k, f in header.fields.items()
             if k not in STANDARD_KEYS}
    return Imatrix(entries=entries, datasets=datasets, chunk_count=chunk_count, chunk_size=chunk_size,
                   format=ImatrixFormat.GGUF, gguf_kv_order=list(header.fields), gguf_extra_kv=extra)


def _pad(n: int, align: int) -> int:
    return (n + align - 1) // align * align


# ------------------------------------------------------------------------------------------------
# writing
# ------------------------------------------------------------------------------------------------


def _check_imatrix(im: Imatrix, fmt: ImatrixFormat) -> None:
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
    b = s.encode(TEXT_ENCODING, TEXT_ERRORS)
    return struct.pack("<Q", len(b)) + b


def _u32(v: int, what: str) -> int:
    if not isinstance(v, (int, np.integer)) or not 0 <= int(v) <= 0xFFFFFFFF:
        raise ImatrixError(f"{what} = {v!r} does not fit in a uint32")
    return int(v)


def _i32(v: int, what: str) -> int:
    if not isinstance(v, (int, np.integer)) or not -(2**31) <= int(v) < 2**31:
        raise ImatrixError(f"{what} = {v!r} does not fit in an int32")
    return int(v)


def _extra_alignment(raw: bytes) -> int:
    """The alignment in a verbatim ``general.alignment`` value (type + value bytes)."""
    t, a = struct.unpack("<iI", raw[:8]) if len(raw) >= 8 else (-1, 0)
    if t != GGUFValueType.UINT32 or a == 0 or a & (a - 1):
        raise ImatrixError(f"invalid {KEY_GENERAL_ALIGNMENT} in the extra metadata")
    return a


def _gguf_value(im: Imatrix, key: str) -> bytes:
    """The type + value bytes of one metadata key."""
    if key == KEY_GENERAL_TYPE:
        return struct.pack("<i", GGUFValueType.STRING) + _gguf_str("imatrix")
    if key == KEY_DATASETS:
        return (struct.pack("<iiQ", GGUFValueType.ARRAY, GGUFValueType.STRING, len(im.datasets))
                + b"".join(_gguf_str(d) for d in im.datasets))
    if key == KEY_CHUNK_COUNT:
        return struct.pack("<iI", GGUFValueType.UINT32, _u32(im.chunk_count, "chunk_count"))
    if key == KEY_CHUNK_SIZE:
        if im.chunk_size is None:
            raise ImatrixError("a GGUF imatrix needs chunk_size (llama-quantize refuses files without it)")
        return struct.pack("<iI", GGUFValueType.UINT32, _u32(im.chunk_size, "chunk_size"))
    if key in im.gguf_extra_kv:
        return im.gguf_extra_kv[key]
    raise ImatrixError(f"metadata key {key!r} is listed in gguf_kv_order but has no value")


def _gguf_kv_blobs(im: Imatrix) -> tuple[list[bytes], int]:
    """(key-value blobs in file order, data alignment)."""
    kv_order = im.gguf_kv_order if im.gguf_kv_order is not None else list(STANDARD_KEYS)
    blobs = [_gguf_str(key) + _gguf_value(im, key) for key in kv_order]
    if len(set(kv_order)) != len(kv_order):
        raise ImatrixError("gguf_kv_order lists a key twice")
    if KEY_GENERAL_ALIGNMENT in kv_order:  # (_gguf_value raised above unless it is an extra key)
        return blobs, _extra_alignment(im.gguf_extra_kv[KEY_GENERAL_ALIGNMENT])
    return blobs, GGUF_DEFAULT_ALIGNMENT


def _gguf_tensor_info(tname: str, ne: list[int], offset: int) -> bytes:
    if len(tname.encode(TEXT_ENCODING, TEXT_ERRORS)) >= GGML_MAX_NAME:
        raise ImatrixError(f"tensor name {tname!r} is too long for GGUF (at most {GGML_MAX_NAME - 1} "
                           f"bytes; llama-imatrix would silently truncate it)")
    n_dims = 2 if ne[1] > 1 else 1  # ggml_n_dims
    return (_gguf_str(tname) + struct.pack("<I", n_dims) + struct.pack(f"<{n_dims}q", *ne[:n_dims])
            + struct.pack("<iQ", _F32, offset))


def _gguf_parts(im: Imatrix) -> list[bytes]:
    _check_imatrix(im, ImatrixFormat.GGUF)
    kv_blobs, alignment = _gguf_kv_blobs(im)
    infos: list[bytes] = []
    datas: list[bytes] = []
    offset = 0
    for name, e in im.entries.items():
        for suffix, arr, ne in ((SUFFIX_SUMS, e.values, [e.ne0, e.nmat]), (SUFFIX_COUNTS, e.counts, [1, e.nmat])):
            infos.append(_gguf_tensor_info(name + suffix, ne, offset))
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
    _check_imatrix(im, ImatrixFormat.DAT)
    out = [struct.pack("<i", _i32(len(im.entries), "entry count"))]
    for name, e in im.entries.items():
        b = name.encode(TEXT_ENCODING, TEXT_ERRORS)
        out.append(struct.pack("<i", len(b)) + b)
        out.append(struct.pack("<ii", _i32(e.ncall, f"ncall of {name}"), _i32(e.nval, f"nval of {name}")))
        out.append(np.ascontiguousarray(e.values, dtype="<f4").tobytes())
    if im.dat_trailer:
        ds = im.datasets[-1].encode(TEXT_ENCODING, TEXT_ERRORS) if im.datasets else b""
        out.append(struct.pack("<ii", _i32(im.chunk_count, "chunk_count"), len(ds)) + ds)
    elif im.datasets or im.chunk_count:
        raise ImatrixError("dat_trailer is False but the imatrix has a chunk count or dataset to store")
    return out


def _file_parts(im: Imatrix, format: ImatrixFormat | str | None, chunk_size: int | None) -> list[bytes]:
    """The bytes of ``im`` written as ``format`` (converted first when it is another one)."""
    fmt = imatrix_format(format or im.format)
    if fmt != im.format:
        im = convert_imatrix(im, fmt, chunk_size=chunk_size)
    return _gguf_parts(im) if fmt == ImatrixFormat.GGUF else _dat_parts(im)


def imatrix_to_bytes(im: Imatrix, format: ImatrixFormat | str | None = None) -> bytes:
    """The file ``write_imatrix`` would write, in memory."""
    return b"".join(_file_parts(im, format, None))


def write_imatrix(im: Imatrix, path: str | os.PathLike, format: ImatrixFormat | str | None = None,
                  *, chunk_size: int | None = None) -> str:
    """Write ``im`` to ``path`` atomically (:func:`ggufmtp.files.fsutil.atomic_write_parts`).

    ``format`` defaults to ``im.format``; another format converts first (see ``convert_imatrix``,
    ``chunk_size`` is used for dat -> GGUF). Returns the SHA-256 of the written file.
    """
    parts = _file_parts(im, format, chunk_size)
    try:  # like llama-imatrix, never creates folders: a mistyped -o path fails instead
        return atomic_write_parts(path, parts, make_parents=False)
    except OSError as e:
        raise ImatrixError(f"cannot write imatrix file {Path(path)}: {e.strerror or e}") from None
