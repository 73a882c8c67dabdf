"""A fast reader of a GGUF file's header: metadata and tensor table, no tensor data.

gguf-py's ``GGUFReader`` builds numpy views for every element of every array, which costs
about 6 s per open on a model with Qwen3.6's 248k-token vocabulary; ggufmtp opens a model several
times per command (plan, quantize, audit, receipt). This reader walks the header once with
``struct`` and skips large arrays (their length is kept), so opening costs a fraction of a second.
Value types and layout follow gguf-py's constants (``gguf.GGUFValueType``, ``GGML_QUANT_SIZES``).
"""

from __future__ import annotations

import dataclasses
import mmap
import struct
from pathlib import Path
from typing import Any

from ..errors import GGUFReadError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# Arrays up to this many elements are read into Python lists; longer ones are summarized.
SMALL_ARRAY = 4096

# gguf.GGUFValueType ids -> struct format of one scalar
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


@dataclasses.dataclass(frozen=True)
class HeaderTensor:
    name: str
    shape: tuple[int, ...]  # ne order (ne0 first), as gguf-py's ReaderTensor.shape
    type_id: int
    offset: int  # absolute file offset of the data


@dataclasses.dataclass
class GGUFHeader:
    version: int
    metadata: dict[str, Any]
    array_lengths: dict[str, int]
    tensors: list[HeaderTensor]
    data_offset: int
    file_size: int


class _Truncated(Exception):
    pass


class _Cursor:
    def __init__(self, buf: mmap.mmap | bytes):
        self.buf = buf
        self.pos = 0
        self.size = len(buf)

    def need(self, n: int) -> None:
        if self.pos + n > self.size:
            raise _Truncated(f"needs {n} bytes at offset {self.pos}, file has {self.size}")

    def unpack(self, fmt: str) -> Any:
        n = struct.calcsize(fmt)
        self.need(n)
        v = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += n
        return v

    def string(self) -> str:
        n = self.unpack("<Q")
        self.need(n)
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def skip_strings(self, count: int) -> None:
        buf, pos, size, unpack = self.buf, self.pos, self.size, struct.unpack_from
        for _ in range(count):
            if pos + 8 > size:
                raise _Truncated(f"string array runs past the end of the file ({size} bytes)")
            pos += 8 + unpack("<Q", buf, pos)[0]
        if pos > size:
            raise _Truncated(f"string array runs past the end of the file ({size} bytes)")
        self.pos = pos


def _value(cur: _Cursor, vtype: int) -> tuple[Any, int | None]:
    """(value, array length or None). Long arrays come back as None with their length."""
    if vtype in _SCALAR:
        return cur.unpack(_SCALAR[vtype]), None
    if vtype == _STRING:
        return cur.string(), None
    if vtype != _ARRAY:
        raise ValueError(f"unknown GGUF value type {vtype}")
    itype = cur.unpack("<I")
    count = cur.unpack("<Q")
    if itype == _STRING:
        if count <= SMALL_ARRAY:
            return [cur.string() for _ in range(count)], count
        cur.skip_strings(count)
        return None, count
    if itype not in _SCALAR:
        raise ValueError(f"unsupported GGUF array item type {itype}")
    width = struct.calcsize(_SCALAR[itype])
    cur.need(width * count)
    if count <= SMALL_ARRAY:
        vals = list(struct.unpack_from(f"<{count}{_SCALAR[itype][1]}", cur.buf, cur.pos))
        cur.pos += width * count
        return vals, count
    cur.pos += width * count
    return None, count


def read_header(path: str | Path) -> GGUFHeader:
    """Parse ``path``'s header; raises :class:`GGUFReadError` naming the file and the problem."""
    path = Path(path)
    if not path.exists():
        raise GGUFReadError(f"{path}: no such file")
    if path.is_dir():
        raise GGUFReadError(f"{path}: is a directory, not a GGUF file")
    try:
        fh = open(path, "rb")
    except OSError as e:
        raise GGUFReadError(f"{path}: cannot read ({e.strerror})") from None
    with fh:
        size = path.stat().st_size
        if size < 4 or fh.read(4) != GGUF_MAGIC:
            fh.seek(0)
            raise GGUFReadError(f"{path}: not a GGUF file (magic {fh.read(4)!r}, expected b'GGUF')")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            try:
                return _parse(mm, size, path)
            except _Truncated as e:
                raise GGUFReadError(f"{path}: truncated GGUF ({e})") from None
            except (ValueError, UnicodeDecodeError, struct.error, OverflowError) as e:
                raise GGUFReadError(f"{path}: corrupt GGUF header ({e})") from None


def _parse(mm: mmap.mmap, size: int, path: Path) -> GGUFHeader:
    cur = _Cursor(mm)
    cur.pos = 4
    version = cur.unpack("<I")
    if version not in (2, 3):
        raise ValueError(f"unsupported GGUF version {version}")
    n_tensors = cur.unpack("<Q")
    n_kv = cur.unpack("<Q")
    if n_tensors > size or n_kv > size:
        raise ValueError(f"implausible counts ({n_tensors} tensors, {n_kv} keys)")
    metadata: dict[str, Any] = {}
    lengths: dict[str, int] = {}
    for _ in range(n_kv):
        key = cur.string()
        vtype = cur.unpack("<I")
        val, n = _value(cur, vtype)
        if n is not None:
            lengths[key] = n
        metadata[key] = val if val is not None else f"<array of {n}>"
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        n_dims = cur.unpack("<I")
        if n_dims > 8:
            raise ValueError(f"tensor {name}: {n_dims} dimensions")
        shape = tuple(cur.unpack("<Q") for _ in range(n_dims))
        type_id = cur.unpack("<I")
        offset = cur.unpack("<Q")
        infos.append((name, shape, type_id, offset))
    align = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT) or DEFAULT_ALIGNMENT)
    data_offset = cur.pos + (-cur.pos) % align
    tensors = [HeaderTensor(n, s, t, data_offset + o) for n, s, t, o in infos]
    return GGUFHeader(version, metadata, lengths, tensors, data_offset, size)


def tensor_nbytes(shape: tuple[int, ...], type_id: int) -> tuple[int, int, str]:
    """(n_elements, n_bytes, type name) of a tensor, from gguf-py's block sizes."""
    import gguf

    qt = gguf.GGMLQuantizationType(type_id)
    block, tsize = gguf.GGML_QUANT_SIZES[qt]
    n = 1
    for d in shape:
        n *= int(d)
    return n, n // block * tsize, qt.name
