"""What the pinned ggml can do with each tensor type, read from ggml itself, and the pre-flight
that refuses what llama-quantize would abort on.

The traits come from the loaded libggml (``ggml_get_type_traits``, ``ggml_quantize_requires_imatrix``,
reached through the libllama that llama-cpp-python loaded: the same build the quantizer runs), one row
per name of gguf-py's :class:`gguf.GGMLQuantizationType`; no list of types is kept here.

Where the pinned llama.cpp (``src/llama-quant.cpp``, ``ggml/src/ggml.c``, ``ggml/src/gguf.cpp`` at
0c1e570) aborts instead of refusing, for a tensor it converts from ``from_type`` to ``to_type``:

- ``ggml_quantize_chunk`` has a case for F32 and for every type with a ``to_float`` trait (F16,
  BF16 and the quantization types), and for no other: I8, I16, I32, I64, F64, Q8_1 and Q8_K (the
  matmul helper types) end in ``GGML_ASSERT(result == nrows * row_size)``. :attr:`GgmlType.writable`.
- ``gguf_set_tensor_type`` asserts that the block size divides the row width (``ne[0]``).
  ``tensor_type_fallback`` keeps that true for the ftype's mix and ``--tensor-type`` (Q6_K on a
  128-wide row becomes Q8_0, an IQ type IQ4_NL, a 32-block type that does not fit F16; the dry run
  reports it and the plan shows the type it falls back to), but ``--token-embedding-type`` and
  ``--output-tensor-type`` return before it: a type whose block does not divide their rows aborts.
- Dequantizing the source needs a ``to_float`` trait (llama.cpp throws, after the earlier tensors
  are written, for anything else).
- ``ggml_quantize_chunk`` asserts statistics for :attr:`GgmlType.requires_imatrix` types whatever the
  tensor; :func:`ggufmtp.imatrix.check.needs_imatrix` covers them, and the plan's coverage check refuses
  a tensor planned as one without them.

A ``--tensor-type`` type with a block over 32 and no fallback (Q1_0, NVFP4, Q8_K) on a row it does
not divide makes llama.cpp throw in its first pass, which the plan's dry run reports as its error.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
from collections.abc import Sequence

import gguf

__all__ = ["GgmlType", "ggml_type", "ggml_types", "tensor_problem", "unwritable_types", "writable_problem",
           "writable_type"]


class _Traits(ctypes.Structure):
    """``struct ggml_type_traits`` (ggml/include/ggml.h at 0c1e570)."""

    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p), ("from_float_ref", ctypes.c_void_p)]


@dataclasses.dataclass(frozen=True)
class GgmlType:
    """One ggml type as the pinned ggml describes it."""

    name: str  # gguf-py's spelling (Q4_K, IQ2_XXS, I8)
    value: int
    block_size: int
    type_size: int
    is_quantized: bool
    dequantizable: bool  # a to_float trait: llama.cpp can read it back to float
    requires_imatrix: bool  # ggml_quantize_requires_imatrix: ggml asserts statistics for it

    @property
    def writable(self) -> bool:
        """Whether llama.cpp can quantize a float tensor to it (``ggml_quantize_chunk`` has a case)."""
        return self.name == "F32" or (self.dequantizable and self.block_size > 0)

    def fits(self, row_width: int) -> bool:
        """Whether a row of ``row_width`` elements is whole blocks of this type."""
        return self.block_size > 0 and row_width % self.block_size == 0


@functools.lru_cache(maxsize=1)
def ggml_types() -> dict[str, GgmlType]:
    """Every gguf-py type name -> its traits in the loaded libggml (loads libllama)."""
    from ..runtime.libllama import llama_cpp_module

    lib = llama_cpp_module().llama_cpp._lib  # libggml's symbols resolve through libllama's handle
    traits = lib.ggml_get_type_traits
    traits.argtypes, traits.restype = [ctypes.c_int], ctypes.POINTER(_Traits)
    needs = lib.ggml_quantize_requires_imatrix
    needs.argtypes, needs.restype = [ctypes.c_int], ctypes.c_bool
    out = {}
    for t in gguf.GGMLQuantizationType:
        tr = traits(int(t.value)).contents
        if (tr.type_name or b"").decode().upper() != t.name:  # gguf-py and this ggml disagree: not this type
            continue
        out[t.name] = GgmlType(name=t.name, value=int(t.value), block_size=int(tr.blck_size),
                               type_size=int(tr.type_size), is_quantized=bool(tr.is_quantized),
                               dequantizable=bool(tr.to_float), requires_imatrix=bool(needs(int(t.value))))
    return out


def ggml_type(name: str) -> GgmlType | None:
    """The traits of ``name`` (gguf-py's spelling, any case), or None when the pinned ggml lacks it."""
    return ggml_types().get(name.strip().upper())


def unwritable_types() -> list[str]:
    """The type names llama.cpp cannot quantize to (I8 ... F64, Q8_1, Q8_K at 0c1e570)."""
    return [t.name for t in ggml_types().values() if not t.writable]


def writable_problem(type_name: str) -> str | None:
    """Why llama.cpp cannot quantize any tensor to ``type_name``, or None when it can."""
    t = ggml_type(type_name)
    if t is None:
        return f"{type_name} is not a type of the pinned ggml"
    if not t.writable:
        return (f"{t.name} is not a type llama.cpp can quantize to (ggml has no conversion from float to it; "
                f"llama-quantize aborts on it)")
    return None


def writable_type(name: str, where: str) -> str:
    """A type named where ggufmtp will quantize to it (``search --types``, ``head-sweep --types``), as
    gguf-py spells it; RecipeError naming ``where``, before any work, for a name that is no type or
    one llama.cpp cannot quantize to."""
    from ..errors import RecipeError
    from .recipe import normalize_type

    qt = normalize_type(name, where)
    if problem := writable_problem(qt):
        raise RecipeError(f"{where}: {problem}")
    return qt


def tensor_problem(name: str, shape: Sequence[int], from_type: str, to_type: str) -> str | None:
    """Why llama-quantize would abort converting tensor ``name`` (``shape`` in ne order) from
    ``from_type`` to ``to_type`` as planned, or None when it would not (the same type: a copy)."""
    if from_type == to_type:
        return None
    problem = writable_problem(to_type)
    if problem is not None:
        return f"{name}: {problem}"
    src = ggml_type(from_type)
    if src is None or not (src.name == "F32" or src.dequantizable):
        return f"{name}: llama.cpp cannot read a {from_type} tensor back to float to convert it to {to_type}"
    dst = ggml_types()[to_type]
    if not dst.fits(int(shape[0])):
        return (f"{name}: rows of {shape[0]} values are not whole {to_type} blocks of {dst.block_size} "
                f"(llama.cpp falls back to another type only for --tensor-type and the ftype's mix, not for "
                f"--token-embedding-type or --output-tensor-type: llama-quantize aborts); choose a type whose "
                f"block divides {shape[0]}")
    return None
