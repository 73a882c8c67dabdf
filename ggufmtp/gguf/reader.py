"""The one GGUF header reader: metadata and tensor table, no tensor data.

gguf-py's ``GGUFReader`` builds numpy views for every element of every array, which costs
about 6 s per open on a model with Qwen3.6's 248k-token vocabulary; ggufmtp opens a model several
times per command (plan, quantize, audit, receipt). This reader walks the header once with
``struct`` and skips large arrays (their length is kept), so opening costs a fraction of a second.

Value types, key names and layout constants come from gguf-py (``GGUFValueType``, ``Keys``,
``GGML_QUANT_SIZES``); the records mirror its ``ReaderField``/``ReaderTensor``. The header rules
are llama.cpp's (``ggml/src/gguf.cpp: gguf_init_from_file_impl``): no empty or duplicate keys,
``general.alignment`` a UINT32 power of two, tensor names under 64 bytes and unique, at most 4
non-negative dimensions. Hostile counts and truncation raise :class:`GGUFReadError` naming the
source; nothing is allocated from a count before the bytes it needs are known to exist.
"""

from __future__ import annotations

import dataclasses
import math
import mmap
import struct
from pathlib import Path
from typing import Any, NamedTuple

from gguf.constants import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_VERSION, GGMLQuantizationType, GGUFValueType, Keys

from ..errors import GGUFReadError
from ..files.fsutil import not_a_regular_file

__all__ = ["GGUF_MAGIC", "ByteCursor", "GGUFHeader", "HeaderField", "HeaderTensor", "parse_header", "read_header",
           "tensor_nbytes", "truncation"]

GGUF_MAGIC = b"GGUF"  # gguf.constants.GGUF_MAGIC as the 4 bytes that open the file
DEFAULT_ALIGNMENT = GGUF_DEFAULT_ALIGNMENT
SUPPORTED_VERSIONS = (2, GGUF_VERSION)
GGML_MAX_NAME = 64  # ggml.h: tensor names must be shorter
GGML_MAX_DIMS = 4
# Arrays up to this many elements are read into Python lists; longer ones are summarized.
SMALL_ARRAY = 4096

_SCALAR_FORMAT: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H", GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i", GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "Q", GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d",
}
_SCALAR_SIZE = {t: struct.calcsize("<" + f) for t, f in _SCALAR_FORMAT.items()}
# The smallest encodings, to refuse counts the remaining bytes cannot hold before looping over them:
# a key-value pair is a string length, a type and at least one byte of value; a tensor info is a
# name length, a dimension count, a type and an offset.
_MIN_KV_BYTES = 12
_MIN_TENSOR_BYTES = 24


class HeaderField(NamedTuple):
    """One metadata key-value pair (cf. gguf-py's ``ReaderField``), its value decoded.

    ``value`` is a Python scalar, string or list; an array longer than the reader's ``small_array``
    is ``None`` (its element count is in ``length``). ``value_span`` is the ``[start, end)`` of the
    type and value bytes, so that a value can be copied verbatim."""

    offset: int
    name: str
    type: GGUFValueType
    item_type: GGUFValueType | None
    value: Any
    length: int | None
    value_span: tuple[int, int]


@dataclasses.dataclass(frozen=True)
class HeaderTensor:
    """One tensor info (cf. gguf-py's ``ReaderTensor``) without its data."""

    name: str
    shape: tuple[int, ...]  # ne order (ne0 first), as gguf-py's ReaderTensor.shape
    type_id: int
    offset: int  # absolute file offset of the data


@dataclasses.dataclass
class GGUFHeader:
    """A GGUF file's header. ``metadata`` maps keys to values (long arrays summarized as
    ``"<array of N>"``, their lengths in ``array_lengths``); ``fields`` has the typed records."""

    version: int
    fields: dict[str, HeaderField]
    tensors: list[HeaderTensor]
    alignment: int
    data_offset: int
    file_size: int
    metadata: dict[str, Any] = dataclasses.field(init=False)
    array_lengths: dict[str, int] = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.metadata = {k: f.value if f.value is not None else f"<array of {f.length}>"
                         for k, f in self.fields.items()}
        self.array_lengths = {k: f.length for k, f in self.fields.items() if f.length is not None}


def truncation(what: str, offset: int, need: int, have: int) -> str:
    """How a file that ends too early is described (after its name) in GGUF and imatrix errors."""
    return f"is truncated: {what} needs {need} bytes at offset {offset} but only {have} remain"


class _Corrupt(Exception):
    """Internal: the header breaks the format's rules or ends early (the message says how, as a
    predicate of the file)."""


class ByteCursor:
    """Reads little-endian values from a buffer (bytes, bytearray, mmap, memoryview), checking
    every length first: reading past the end raises ``short(truncation(...))``. Also serves the
    legacy .dat imatrix parser, with its own ``short``."""

    def __init__(self, buf: Any, *, short: type[Exception], text_errors: str = "replace"):
        self.buf = buf
        self.pos = 0
        self.size = len(buf)
        self.short = short
        self.text_errors = text_errors

    @property
    def remaining(self) -> int:
        return self.size - self.pos

    def need(self, n: int, what: str) -> None:
        if n < 0 or n > self.remaining:
            raise self.short(truncation(what, self.pos, n, self.remaining))

    def take(self, n: int, what: str) -> Any:
        """The next ``n`` bytes (a view when the buffer is a memoryview)."""
        self.need(n, what)
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str, what: str) -> Any:
        n = struct.calcsize("<" + fmt)
        self.need(n, what)
        v = struct.unpack_from("<" + fmt, self.buf, self.pos)[0]
        self.pos += n
        return v

    def raw_string(self, what: str) -> bytes:
        """A GGUF string (uint64 length, bytes) undecoded."""
        return bytes(self.take(self.unpack("Q", f"length of {what}"), what))

    def string(self, what: str) -> str:
        return self.raw_string(what).decode("utf-8", errors=self.text_errors)

    def skip_strings(self, count: int, what: str) -> None:
        buf, pos, size, unpack = self.buf, self.pos, self.size, struct.unpack_from
        for _ in range(count):
            if pos + 8 > size:
                raise self.short(truncation(what, pos, 8, max(0, size - pos)))
            pos += 8 + unpack("<Q", buf, pos)[0]
        if pos > size:
            raise self.short(truncation(what, self.pos, pos - self.pos, self.remaining))
        self.pos = pos


def _value_type(code: int, key: str, what: str = "type") -> GGUFValueType:
    try:
        return GGUFValueType(code)
    except ValueError:
        raise _Corrupt(f"key {key!r} has invalid GGUF {what} {code}") from None


def _read_array(cur: ByteCursor, key: str, small_array: int | None) -> tuple[GGUFValueType, Any, int]:
    """(item type, values or None when longer than ``small_array``, length) of an ARRAY value."""
    itype = _value_type(cur.unpack("i", f"the array type of {key}"), key, "array type")
    count = cur.unpack("Q", f"the array length of {key}")
    keep = small_array is None or count <= small_array
    if itype == GGUFValueType.STRING:
        if keep:  # every element needs at least 8 bytes, so the file size bounds this loop
            return itype, [cur.string(f"an element of {key}") for _ in range(count)], count
        cur.skip_strings(count, f"the {count} elements of {key}")
        return itype, None, count
    if itype not in _SCALAR_FORMAT:  # nested arrays: llama.cpp refuses them too
        raise _Corrupt(f"key {key!r} has invalid GGUF array type {int(itype)}")
    nbytes = _SCALAR_SIZE[itype] * count
    cur.need(nbytes, f"the {count} elements of {key}")
    vals = list(struct.unpack_from(f"<{count}{_SCALAR_FORMAT[itype]}", cur.buf, cur.pos)) if keep else None
    cur.pos += nbytes
    return itype, vals, count


def _read_field(cur: ByteCursor, index: int, small_array: int | None) -> HeaderField:
    offset = cur.pos
    key = cur.string(f"key {index}")
    if not key:
        raise _Corrupt(f"has an empty key (key-value pair {index})")
    start = cur.pos
    vtype = _value_type(cur.unpack("i", f"the type of {key}"), key)
    item_type, length = None, None
    if vtype == GGUFValueType.ARRAY:
        item_type, value, length = _read_array(cur, key, small_array)
    elif vtype == GGUFValueType.STRING:
        value = cur.string(f"the value of {key}")
    else:
        value = cur.unpack(_SCALAR_FORMAT[vtype], f"the value of {key}")
    return HeaderField(offset, key, vtype, item_type, value, length, (start, cur.pos))


def _read_counts(cur: ByteCursor) -> tuple[int, int, int]:
    """(version, tensor count, key-value count), refusing counts the file cannot hold."""
    version = cur.unpack("I", "the GGUF version")
    if version not in SUPPORTED_VERSIONS:
        raise _Corrupt(f"has unsupported GGUF version {version}")
    n_tensors = cur.unpack("q", "the tensor count")
    n_kv = cur.unpack("q", "the key-value count")
    if n_tensors < 0 or n_kv < 0:
        raise _Corrupt(f"has a corrupt header (tensor count {n_tensors}, key-value count {n_kv})")
    if n_kv > cur.remaining // _MIN_KV_BYTES or n_tensors > cur.remaining // _MIN_TENSOR_BYTES:
        raise _Corrupt(f"is truncated or corrupt: its header lists {n_tensors} tensors and {n_kv} keys but "
                       f"only {cur.remaining} bytes follow")
    return version, n_tensors, n_kv


def _read_fields(cur: ByteCursor, n_kv: int, small_array: int | None) -> dict[str, HeaderField]:
    fields: dict[str, HeaderField] = {}
    for i in range(n_kv):
        f = _read_field(cur, i, small_array)
        if f.name in fields:
            raise _Corrupt(f"has a duplicate key {f.name!r}")
        fields[f.name] = f
    return fields


def _alignment(fields: dict[str, HeaderField]) -> int:
    f = fields.get(Keys.General.ALIGNMENT)
    if f is None:
        return DEFAULT_ALIGNMENT
    if f.type != GGUFValueType.UINT32:
        raise _Corrupt(f"has {Keys.General.ALIGNMENT} of type {f.type.name}, not UINT32")
    if f.value == 0 or f.value & (f.value - 1):
        raise _Corrupt(f"has alignment {f.value}, which is not a power of 2")
    return f.value


def _read_tensor_info(cur: ByteCursor, index: int) -> tuple[str, tuple[int, ...], int, int]:
    """(name, shape, type id, offset relative to the data section) of one tensor info."""
    raw = cur.raw_string(f"the name of tensor {index}")
    name, n_bytes = raw.decode("utf-8", errors=cur.text_errors), len(raw)
    if n_bytes >= GGML_MAX_NAME:
        raise _Corrupt(f"has tensor name {name!r} of {n_bytes} bytes (llama.cpp allows at most {GGML_MAX_NAME - 1})")
    n_dims = cur.unpack("I", f"the dimension count of tensor {name!r}")
    if n_dims > GGML_MAX_DIMS:
        raise _Corrupt(f"has tensor {name!r} with {n_dims} dimensions (at most {GGML_MAX_DIMS})")
    shape = tuple(cur.unpack("q", f"the shape of tensor {name!r}") for _ in range(n_dims))
    if any(d < 0 for d in shape):
        raise _Corrupt(f"has tensor {name!r} with a negative dimension {list(shape)}")
    type_id = cur.unpack("i", f"the type of tensor {name!r}")
    offset = cur.unpack("Q", f"the data offset of tensor {name!r}")
    return name, shape, type_id, offset


def _read_tensor_infos(cur: ByteCursor, n_tensors: int) -> list[tuple[str, tuple[int, ...], int, int]]:
    infos, seen = [], set()
    for i in range(n_tensors):
        info = _read_tensor_info(cur, i)
        if info[0] in seen:
            raise _Corrupt(f"has a duplicate tensor {info[0]!r}")
        seen.add(info[0])
        infos.append(info)
    return infos


def parse_header(buf: Any, source: str, *, small_array: int | None = SMALL_ARRAY,
                 text_errors: str = "replace") -> GGUFHeader:
    """Parse the header in ``buf`` (bytes, bytearray, mmap or memoryview of a whole GGUF file).

    ``source`` names the file in errors ("x.gguf", "imatrix file y.gguf"); arrays longer than
    ``small_array`` elements are skipped (``None``: keep them all); strings are decoded from UTF-8
    with ``text_errors`` ("surrogateescape" to write them back byte for byte). Raises
    :class:`GGUFReadError` "<source> is truncated: ..." or "<source> <what is wrong>"."""
    cur = ByteCursor(buf, short=_Corrupt, text_errors=text_errors)
    try:
        if bytes(buf[:4]) != GGUF_MAGIC:
            raise _Corrupt(f"is not a GGUF file (magic {bytes(buf[:4])!r}, expected {GGUF_MAGIC!r})")
        cur.pos = 4
        version, n_tensors, n_kv = _read_counts(cur)
        fields = _read_fields(cur, n_kv, small_array)
        alignment = _alignment(fields)
        infos = _read_tensor_infos(cur, n_tensors)
    except _Corrupt as e:
        raise GGUFReadError(f"{source} {e}") from None
    # llama.cpp seeks to the aligned data section only when there are tensors
    data_offset = cur.pos + (-cur.pos) % alignment if n_tensors else cur.pos
    tensors = [HeaderTensor(n, s, t, data_offset + o) for n, s, t, o in infos]
    return GGUFHeader(version, fields, tensors, alignment, data_offset, cur.size)


def read_header(path: str | Path) -> GGUFHeader:
    """Parse ``path``'s header through a memory map (tensor data is never read).

    Raises :class:`GGUFReadError` naming the file and the problem."""
    path = Path(path)
    problem = not_a_regular_file(path)
    if problem == "is a directory":
        raise GGUFReadError(f"{path}: is a directory, not a GGUF file")
    if problem is not None:
        raise GGUFReadError(f"{path}: {problem}")
    try:
        fh = open(path, "rb")
    except OSError as e:
        raise GGUFReadError(f"{path}: cannot read ({e.strerror})") from None
    with fh:
        magic = fh.read(4)
        if magic != GGUF_MAGIC:
            raise GGUFReadError(f"{path}: not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return parse_header(mm, str(path))


def tensor_nbytes(shape: tuple[int, ...], type_id: int) -> tuple[int, int, str]:
    """(n_elements, n_bytes, type name) of a tensor, from gguf-py's block sizes.

    Raises ``ValueError`` for a type id gguf-py does not know."""
    qt = GGMLQuantizationType(type_id)
    block, tsize = GGML_QUANT_SIZES[qt]
    n = math.prod(int(d) for d in shape)
    return n, n // block * tsize, qt.name
