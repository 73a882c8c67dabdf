"""The exact header ``llama_model_quantize`` will write, known before it writes it.

llama-quant (``src/llama-quant.cpp`` at 0c1e570, ``llama_model_quantize_impl``) writes a zero
placeholder of ``gguf_get_meta_size`` bytes, then every tensor's data in order (each padded with
zeros to 32 bytes), then seeks back and writes the real header. SHA-256 is sequential, so the
output can be hashed while it is written only if that header is known up front: this module
predicts it, byte for byte, from the source's header and the plan (the per-tensor types of
libllama's own dry run). :mod:`ggufmtp.quant.stream_hash` then hashes the prediction, follows
the data as it lands, and compares the prediction with the bytes on disk at the end; a wrong
prediction costs only the fallback to hashing the finished file.

What llama-quant does to the header, mirrored here:

- ``gguf_set_kv(ctx_out, ml.metadata)``: the first shard's key-value pairs in file order. Each is
  re-encoded by gguf.cpp, which gives back the source's bytes except that strings (keys, values,
  string-array items) pass through ``c_str()`` (cut at a NUL) and bools are normalized: such
  files are refused here rather than mirrored.
- ``gguf_set_val_u32`` of ``general.quantization_version`` (``GGML_QNT_VERSION``, 2) and
  ``general.file_type`` (the ftype): gguf.cpp's ``gguf_set_val_*`` REMOVES an existing key and
  APPENDS the new value (a key is never replaced in place), so both move to the end.
- ``gguf_remove_key`` of ``split.no``, ``split.count``, ``split.tensors.count``.
- every ``kv_override``, set the same way (INT as u32 of ``abs(value)``, FLOAT as f32, BOOL, STR
  as a string): ``--override-kv``'s, then the ``quantize.imatrix.*`` keys ggufmtp adds with an imatrix.
- ``block_count`` only changes with ``prune_layers``, which ggufmtp never passes.
- tensor infos of every shard's tensors in ``weight_name_comparer`` order (layer number, then
  name; non-``blk`` tensors first), with ``ggml_n_dims`` dimensions (trailing 1s dropped), the
  planned type and offsets recomputed with 32-byte padding; then zeros up to a multiple of 32.

The output context is ``gguf_init_empty()``: version 3 and alignment 32 whatever the source
says, and llama-quant pads the data with ``GGUF_DEFAULT_ALIGNMENT`` too. A source with another
``general.alignment`` would give a file whose header contradicts its layout: refused.

The header and the tensor infos are packed by gguf-py's ``GGUFWriter`` (into a temporary file);
the source's key-value pairs are copied verbatim from its header bytes (gguf.cpp writes them back
unchanged, see above), which also keeps a 248k-token vocabulary cheap.
"""

from __future__ import annotations

import dataclasses
import logging
import mmap
import re
import struct
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from gguf.constants import (
    GGML_QUANT_SIZES,
    GGUF_DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    GGUF_VERSION,
    GGMLQuantizationType,
    GGUFValueType,
    Keys,
)
from gguf.gguf_writer import GGUFWriter

from ..errors import GGUFReadError, UnpredictableHeader
from ..gguf.model import split_shards
from ..gguf.reader import GGUFHeader, HeaderField, read_header
from ..runtime.libllama import KVOverride, QuantizeParams
from .plan import Plan

__all__ = ["GGML_QNT_VERSION", "QUANT_ALIGNMENT", "PredictedHeader", "build_output_header",
           "predict_output_header", "quant_tensor_order"]

GGML_QNT_VERSION = 2  # ggml/include/ggml.h at 0c1e570
#: llama-quant pads with GGUF_DEFAULT_ALIGNMENT and its output context keeps gguf_init_empty's alignment
QUANT_ALIGNMENT = GGUF_DEFAULT_ALIGNMENT
_SPLIT_KEYS = (Keys.Split.LLM_KV_SPLIT_NO, Keys.Split.LLM_KV_SPLIT_COUNT, Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT)
_KV_KEY_MAX = 127  # llama_model_kv_override.key is char[128]
_KV_STR_MAX = 127  # .val_str is char[128]; ggufmtp (like llama-quantize) passes at most 127 bytes
# weight_name_comparer reads the layer with sscanf("blk.%d."): %d skips white space, takes a sign
_SSCANF_LAYER = re.compile(rb"blk\.[ \t\n\v\f\r]*([+-]?\d+)")
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class PredictedHeader:
    """What llama-quant will write: ``header`` is the first ``meta_size`` bytes of the output
    (key-value pairs, tensor infos, zero padding to 32), ``file_size`` the whole file's size."""

    header: bytes
    file_size: int
    n_tensors: int
    n_kv: int

    @property
    def meta_size(self) -> int:
        return len(self.header)

    @property
    def data_size(self) -> int:
        return self.file_size - self.meta_size


@dataclasses.dataclass(frozen=True)
class _OutTensor:
    """One tensor info as gguf.cpp will write it: ``ne`` trimmed like ``ggml_n_dims``."""

    name: str
    ne: tuple[int, ...]
    type: GGMLQuantizationType
    nbytes: int


def predict_output_header(model: str | Path, plan: Plan, params: QuantizeParams | None = None) -> PredictedHeader | None:
    """The header and size of the file ``llama_model_quantize(model, ..., params)`` writes, or None
    when it cannot be predicted exactly (:func:`build_output_header` says why). ``params``: the
    call's parameters (default ``plan.params``); only ``ftype`` and ``kv_overrides`` matter."""
    try:
        return build_output_header(model, plan, params)
    except (UnpredictableHeader, GGUFReadError, OSError) as e:
        log.debug("output header not predicted: %s", e)
    except Exception as e:  # noqa: BLE001 - an optimization: never fail a quantize over it
        log.warning("output header prediction failed (%s: %s); the output is hashed after the write",
                    type(e).__name__, e)
    return None


def build_output_header(model: str | Path, plan: Plan, params: QuantizeParams | None = None) -> PredictedHeader:
    """:func:`predict_output_header`, raising :class:`UnpredictableHeader` with the reason instead
    of returning None (``GGUFReadError``/``OSError`` for an unreadable source)."""
    params = params if params is not None else plan.params
    if params is None:
        raise UnpredictableHeader("the plan carries no quantize parameters")
    shards = split_shards(Path(model))
    first = read_header(shards[0])
    _refuse_other_alignment(first)
    tensors = _output_tensors([first] + [read_header(s) for s in shards[1:]], plan)
    kept, new = _output_kvs(shards[0], first, params)
    kv_bytes, ti_bytes = _pack_with_gguf_py(new, tensors)
    n_kv = len(kept) + len(new)
    head = struct.pack("<IIqq", GGUF_MAGIC, GGUF_VERSION, len(tensors), n_kv)
    meta = b"".join([head, *kept, kv_bytes, ti_bytes])
    meta += bytes(GGUFWriter.ggml_pad(len(meta), QUANT_ALIGNMENT) - len(meta))
    data = sum(GGUFWriter.ggml_pad(t.nbytes, QUANT_ALIGNMENT) for t in tensors)
    return PredictedHeader(header=meta, file_size=len(meta) + data, n_tensors=len(tensors), n_kv=n_kv)


def _refuse_other_alignment(header: GGUFHeader) -> None:
    if header.alignment != QUANT_ALIGNMENT:
        raise UnpredictableHeader(f"the source sets {Keys.General.ALIGNMENT} = {header.alignment}: llama-quant "
                                  f"copies the key but lays the output out with {QUANT_ALIGNMENT}")


# ----------------------------------------------------------------------------- key-value pairs


@dataclasses.dataclass(frozen=True)
class _NewKV:
    """A value llama-quant sets: packed by gguf-py."""

    key: str
    value: bool | int | float | bytes
    vtype: GGUFValueType


def _output_kvs(path: Path, header: GGUFHeader, params: QuantizeParams) -> tuple[list[bytes], list[_NewKV]]:
    """(the source's key-value records that stay, verbatim and in order; the values set after
    them, in the order they end up). Every ``gguf_set_val_*`` removes the key and appends it, so
    the values llama-quant sets form the tail, ordered by when each was last set."""
    new: dict[str, _NewKV] = {}

    def set_val(kv: _NewKV) -> None:
        new.pop(kv.key, None)  # remove + append, as gguf_set_val_* does
        new[kv.key] = kv

    set_val(_NewKV(Keys.General.QUANTIZATION_VERSION, GGML_QNT_VERSION, GGUFValueType.UINT32))
    set_val(_NewKV(Keys.General.FILE_TYPE, int(params.ftype) & 0xFFFFFFFF, GGUFValueType.UINT32))
    removed = set(_SPLIT_KEYS)
    for key in _SPLIT_KEYS:
        new.pop(key, None)
    for o in params.kv_overrides:
        set_val(_override(o))
    dropped = removed | set(new)
    fields = [f for f in header.fields.values() if f.name not in dropped]
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        kept = [_copied_record(mm, f) for f in fields]
    return kept, list(new.values())


def _override(o: KVOverride) -> _NewKV:
    """A kv_override as llama-quant sets it (``llama_model_kv_override`` as ggufmtp's ``_Built`` fills it)."""
    key = o.key.encode()
    if not key or len(key) > _KV_KEY_MAX or b"\0" in key:
        raise UnpredictableHeader(f"kv override key {o.key!r} does not fit llama_model_kv_override.key")
    if isinstance(o.value, str):
        value = o.value.encode()[:_KV_STR_MAX].split(b"\0", 1)[0]  # char[128], read back as a C string
        return _NewKV(o.key, value, GGUFValueType.STRING)
    if isinstance(o.value, bool):  # LLAMA_KV_OVERRIDE_TYPE_BOOL -> gguf_set_val_bool
        return _NewKV(o.key, o.value, GGUFValueType.BOOL)
    if isinstance(o.value, float):  # LLAMA_KV_OVERRIDE_TYPE_FLOAT -> gguf_set_val_f32((float) double)
        return _NewKV(o.key, float(np.float32(o.value)), GGUFValueType.FLOAT32)
    # LLAMA_KV_OVERRIDE_TYPE_INT -> gguf_set_val_u32((uint32_t) std::abs(int64))
    return _NewKV(o.key, abs(int(o.value)) & 0xFFFFFFFF, GGUFValueType.UINT32)


def _copied_record(buf: mmap.mmap, f: HeaderField) -> bytes:
    """The key-value record as the source stores it, which is what gguf.cpp writes back unless a
    string holds a NUL (``c_str()`` cuts it) or a bool is neither 0 nor 1."""
    start, end = f.value_span
    raw = buf[f.offset:end]
    if b"\0" in raw[8:start - f.offset]:
        raise UnpredictableHeader(f"key {f.name!r} holds a NUL byte (gguf.cpp cuts it there)")
    body = memoryview(raw)[start - f.offset + 4:]  # after the type (a view: `in` would test ints)
    if f.type == GGUFValueType.STRING and raw.find(b"\0", start - f.offset + 12) != -1:
        raise UnpredictableHeader(f"the value of {f.name!r} holds a NUL byte (gguf.cpp cuts it there)")
    if f.type == GGUFValueType.BOOL:
        _check_bools(f.name, body)
    if f.type == GGUFValueType.ARRAY and f.item_type == GGUFValueType.BOOL:
        _check_bools(f.name, body[12:])
    if f.type == GGUFValueType.ARRAY and f.item_type == GGUFValueType.STRING and _strings_hold_nul(body[12:]):
        raise UnpredictableHeader(f"an element of {f.name!r} holds a NUL byte (gguf.cpp cuts it there)")
    return raw


def _check_bools(key: str, values: memoryview) -> None:
    if bytes(values).translate(None, b"\0\1"):
        raise UnpredictableHeader(f"{key!r} holds a bool that is neither 0 nor 1")


def _strings_hold_nul(items: memoryview) -> bool:
    """Whether any string of a packed string array (uint64 length, bytes; ...) holds a NUL: the
    region is exactly the length prefixes and the strings, so it does when the region holds more
    zero bytes than its prefixes do (one walk over the lengths, no per-string search)."""
    data = bytes(items)
    lengths, pos, size, unpack = [], 0, len(data), struct.unpack_from
    while pos < size:
        n = unpack("<Q", data, pos)[0]
        lengths.append(n)
        pos += 8 + n
    prefix_zeros = int(np.count_nonzero(np.array(lengths, dtype="<u8").view(np.uint8) == 0))
    return data.count(0) != prefix_zeros


# ----------------------------------------------------------------------------- tensor infos


def quant_tensor_order(names: Sequence[str]) -> list[str]:
    """``names`` in llama-quant's write order: ``llama_model_loader::weight_name_comparer`` (the
    ``sscanf("blk.%d.")`` layer, -1 when absent, then the name's bytes)."""
    return sorted(names, key=lambda n: (_layer_of(n.encode()), n.encode()))


def _layer_of(name: bytes) -> int:
    m = _SSCANF_LAYER.match(name)
    if m is None:
        return -1
    layer = int(m.group(1))
    if not _INT32_MIN <= layer <= _INT32_MAX:
        raise UnpredictableHeader(f"tensor {name!r}: layer number overflows sscanf's int")
    return layer


def _output_tensors(headers: list[GGUFHeader], plan: Plan) -> list[_OutTensor]:
    """Every shard's tensors in llama-quant's order, as the planned types make them."""
    planned = {t.name: t.to_type for t in plan.tensors}
    source = {t.name: t for h in headers for t in h.tensors}
    if set(planned) != set(source) or len(planned) != len(plan.tensors):
        raise UnpredictableHeader("the plan's tensors are not the model's")
    order = quant_tensor_order(list(source))
    if order != [t.name for t in plan.tensors]:  # the dry run logged them in write order
        raise UnpredictableHeader("llama-quant's tensor order differs from the plan's")
    return [_out_tensor(name, source[name].shape, planned[name]) for name in order]


def _out_tensor(name: str, shape: tuple[int, ...], type_name: str) -> _OutTensor:
    if "\0" in name or "\ufffd" in name:
        raise UnpredictableHeader(f"tensor name {name!r} does not survive gguf.cpp's copy")
    try:
        qtype = GGMLQuantizationType[type_name]
    except KeyError:
        raise UnpredictableHeader(f"tensor {name}: planned type {type_name!r} unknown to gguf-py") from None
    ne = list(shape) + [1] * (4 - len(shape))
    if any(d <= 0 for d in ne):
        raise UnpredictableHeader(f"tensor {name} has an empty dimension {list(shape)}")
    block, type_size = GGML_QUANT_SIZES[qtype]
    if ne[0] % block:
        raise UnpredictableHeader(f"tensor {name}: {ne[0]} columns do not fill {qtype.name} blocks of {block}")
    n_dims = next((i + 1 for i in range(3, 0, -1) if ne[i] > 1), 1)  # ggml_n_dims
    nbytes = ne[0] // block * type_size * ne[1] * ne[2] * ne[3]
    return _OutTensor(name, tuple(ne[:n_dims]), qtype, nbytes)


# ----------------------------------------------------------------------------- packing


def _pack_with_gguf_py(new: list[_NewKV], tensors: list[_OutTensor]) -> tuple[bytes, bytes]:
    """(the set key-value records, the tensor infos) as gguf-py's GGUFWriter packs them; its
    offsets are gguf.cpp's (each tensor's size padded to the alignment, from 0)."""
    with tempfile.TemporaryDirectory(prefix="ggufmtp-header-") as d:
        path = Path(d) / "header.gguf"
        w = GGUFWriter(path, arch="")
        if w.data_alignment != QUANT_ALIGNMENT:
            raise UnpredictableHeader(f"gguf-py pads to {w.data_alignment}, llama-quant to {QUANT_ALIGNMENT}")
        w.kv_data[0].clear()  # the constructor adds general.architecture: llama-quant's order is the source's
        for kv in new:
            w.add_key_value(kv.key, kv.value, kv.vtype)
        for t in tensors:
            # numpy order (gguf-py reverses it back to ne); a non-uint8 dtype keeps the shape as given
            w.add_tensor_info(t.name, tuple(reversed(t.ne)), np.dtype(np.float32), t.nbytes, raw_dtype=t.type)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        kv_end = path.stat().st_size
        w.write_ti_data_to_file()
        w.close()
        packed = path.read_bytes()
    head = struct.calcsize("<IIqq")
    return packed[head:kv_end], packed[kv_end:]
