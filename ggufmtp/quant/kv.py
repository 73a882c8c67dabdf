"""llama-quantize's options beyond the per-tensor types, read as it reads them: ``--override-kv``,
``--include-weights``/``--exclude-weights`` and ``--tensor-type-file``.

- ``--override-kv KEY=TYPE:VALUE`` (common/common.cpp ``string_parse_kv_override``): TYPE is
  ``int``, ``float``, ``bool`` (``true``/``false``) or ``str`` (at most 127 bytes); the key under
  128 bytes. llama-quant sets each in the output (an int as u32 of its absolute value, a float as
  f32), before the ``quantize.imatrix.*`` keys, and the loader reads the input with them too.
  llama.cpp reads a malformed number leniently (``atol``: ``12x`` is 12); here it is an error, and
  so is a number the output cannot hold (an int beyond the u32 range, a float beyond f32's or not finite).
- ``--include-weights NAME`` / ``--exclude-weights NAME`` (tools/quantize ``prepare_imatrix``):
  only / not the imatrix entries whose name contains NAME (a substring, not a pattern); never
  both. With no entry left, no imatrix is passed at all (and no ``quantize.imatrix.*`` key written).
- ``--tensor-type-file FILE``: ``PATTERN=TYPE`` items separated by spaces or newlines, each as
  ``--tensor-type`` (``parse_tensor_type_file``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..errors import RecipeError
from ..files.fsutil import MAX_TEXT_FILE_BYTES, read_regular_file
from ..runtime.libllama import KVOverride

KV_KEY_MAX = 127  # llama_model_kv_override.key is char[128]
KV_STR_MAX = 127  # and val_str too
U32_MAX = 2**32 - 1  # llama-quant: gguf_set_val_u32(key, (uint32_t)std::abs(val_i64))
F32_MAX = 3.4028234663852886e38  # and gguf_set_val_f32(key, val_f64)


def parse_kv_override(text: str) -> KVOverride:
    """``KEY=TYPE:VALUE`` as llama.cpp's ``string_parse_kv_override``; RecipeError naming the flag."""
    key, sep, typed = text.partition("=")
    where = f"--override-kv {text!r}"
    if not sep or not key or len(key.encode()) > KV_KEY_MAX:
        raise RecipeError(f"{where}: malformed (want KEY=TYPE:VALUE, TYPE int, float, bool or str, "
                          f"the key under 128 bytes)")
    kind, colon, value = typed.partition(":")
    if not colon or kind not in ("int", "float", "bool", "str"):
        raise RecipeError(f"{where}: the type must be int, float, bool or str (KEY=TYPE:VALUE)")
    if kind == "str":
        if len(value.encode()) > KV_STR_MAX:
            raise RecipeError(f"{where}: a str value is at most 127 bytes")
        return KVOverride(key, value)
    if kind == "bool":
        if value not in ("true", "false"):
            raise RecipeError(f"{where}: a bool is true or false")
        return KVOverride(key, value == "true")
    try:
        number = int(value) if kind == "int" else float(value)
    except ValueError:
        raise RecipeError(f"{where}: {value!r} is not a{'n int' if kind == 'int' else ' float'}") from None
    _check_written(where, number)
    return KVOverride(key, number)


def _check_written(where: str, number: int | float) -> None:
    """RecipeError unless llama-quant's output holds ``number``: an int is written as a u32 of its
    absolute value (-5 as 5, as llama-quantize does; but 5000000000 would become 705032704, and past
    int64 ctypes and ``atol`` disagree), a float as an f32 (1e39 would become inf)."""
    if isinstance(number, int) and abs(number) > U32_MAX:
        raise RecipeError(f"{where}: an int is written as a u32 of its absolute value (at most {U32_MAX}); "
                          f"{number} would not survive it")
    if isinstance(number, float) and not (math.isfinite(number) and abs(number) <= F32_MAX):
        raise RecipeError(f"{where}: a float is written as an f32: a finite number of at most {F32_MAX:.4g} "
                          f"in size, not {number}")


def check_weights_filter(include: Sequence[str], exclude: Sequence[str]) -> None:
    if include and exclude:
        raise RecipeError("--include-weights and --exclude-weights cannot be used together (as in llama-quantize)")


def kept_entries(names: Iterable[str], include: Sequence[str], exclude: Sequence[str]) -> list[str]:
    """The imatrix entries llama-quantize keeps with these ``--include-weights``/``--exclude-weights``."""
    check_weights_filter(include, exclude)
    out = [n for n in names if not any(x in n for x in exclude)]
    return [n for n in out if any(x in n for x in include)] if include else out


def read_tensor_type_file(path: str | Path) -> list[str]:
    """The ``PATTERN=TYPE`` items of a ``--tensor-type-file``; RecipeError naming the file."""
    try:
        data = read_regular_file(Path(path), MAX_TEXT_FILE_BYTES)
    except OSError as e:
        raise RecipeError(f"{path}: {e.strerror or type(e).__name__} (--tensor-type-file)") from None
    try:
        return data.decode().split()
    except UnicodeDecodeError:
        raise RecipeError(f"{path}: not UTF-8 text (--tensor-type-file)") from None
