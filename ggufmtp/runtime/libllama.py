"""ctypes glue to libllama's quantizer through llama-cpp-python (loaded lazily).

``llama_model_quantize`` is driven with the same parameters llama-quantize would build from its
flags (tensor overrides, imatrix data, the ``quantize.imatrix.*`` key overrides), and its log is
captured: llama.cpp reports each tensor's decision there, which is how ggufmtp's plan and
progress bar follow what the library really does.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from ..constants import LLAMA_CPP_PYTHON_VERSION
from ..errors import RuntimeMissingError
from ..runtime.build import RUNTIME_JSON, configure_libllama

_LOG_LOCK = threading.Lock()


def llama_cpp_module():
    """Import llama_cpp, pointing it at the pinned runtime's libllama first."""
    configure_libllama()
    try:
        import llama_cpp  # noqa: WPS433
    except ImportError as e:  # one clear error, not a traceback from deep inside a stage
        raise RuntimeMissingError(
            f"llama-cpp-python is not importable ({e}): install ggufmtp with its dependencies "
            f"(pip install ggufmtp pulls llama-cpp-python {LLAMA_CPP_PYTHON_VERSION})") from None
    return llama_cpp


@dataclasses.dataclass(frozen=True)
class LoadedLibllama:
    """The libllama this process loaded, and the llama.cpp commit it was built from.

    libllama exports no commit of its own; ``commit_source`` says where it was read: the runtime
    record beside a ggufmtp-built library, or ``LLAMA_COMMIT`` of the ``libllama-common`` built with
    it (the string ``llama-server --version`` prints); None when neither is there."""

    path: Path | None
    commit: str | None
    commit_source: str | None
    variant: str | None = None
    build_flags: tuple[str, ...] = ()
    compiler: str | None = None


def loaded_libllama() -> LoadedLibllama:
    """Which libllama llama-cpp-python loaded here (loading it if needed), with its build facts."""
    lc = llama_cpp_module()
    name = getattr(getattr(getattr(lc, "llama_cpp", None), "_lib", None), "_name", None)
    path = Path(name) if name else None
    record = _runtime_record(path)
    commit, source = record.get("commit"), "runtime record"
    if not isinstance(commit, str) or not commit:
        commit, source = _common_commit(path), "LLAMA_COMMIT of libllama-common"
    flags = record.get("build_flags")
    return LoadedLibllama(path=path, commit=commit, commit_source=source if commit else None,
                          variant=record.get("variant"), compiler=record.get("compiler"),
                          build_flags=tuple(str(f) for f in flags) if isinstance(flags, list) else ())


def _runtime_record(lib: Path | None) -> dict:
    """``runtime.json`` of the ggufmtp runtime whose ``bin/`` holds ``lib`` ({} if none)."""
    if lib is None or lib.parent.name != "bin":
        return {}
    try:
        data = json.loads((lib.parent.parent / RUNTIME_JSON).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _common_commit(lib: Path | None) -> str | None:
    """``LLAMA_COMMIT`` exported by the ``libllama-common`` built beside ``lib``."""
    if lib is None:
        return None
    for cand in sorted(lib.parent.glob("libllama-common.so*")) + sorted(lib.parent.glob("libcommon.so*")):
        try:
            value = ctypes.c_char_p.in_dll(ctypes.CDLL(str(cand)), "LLAMA_COMMIT").value
        except (OSError, ValueError):
            continue
        if value:
            return value.decode("utf-8", errors="replace")
    return None


@dataclasses.dataclass
class KVOverride:
    """One ``llama_model_kv_override``: its tag is the value's Python type (bool, int, float, str)."""

    key: str
    value: bool | int | float | str


@dataclasses.dataclass
class QuantizeParams:
    """The inputs of one ``llama_model_quantize`` call (see ``include/llama.h``)."""

    ftype: int
    nthread: int = 0
    output_tensor_type: int | None = None
    token_embedding_type: int | None = None
    overrides: list[tuple[str, int]] = dataclasses.field(default_factory=list)  # (pattern, ggml type)
    imatrix: dict[str, np.ndarray] | None = None
    kv_overrides: list[KVOverride] = dataclasses.field(default_factory=list)
    dry_run: bool = False
    pure: bool = False  # --pure: the ftype's default type everywhere the overrides leave
    quantize_output_tensor: bool = True  # False: --leave-output-tensor
    allow_requantize: bool = False  # --allow-requantize


class _Built:
    """The ctypes params struct plus every buffer it points to (kept alive for the call)."""

    def __init__(self, p: QuantizeParams):
        lc = llama_cpp_module()
        self.params = lc.llama_model_quantize_default_params()
        self.params.ftype = p.ftype
        self.params.nthread = p.nthread
        self.params.dry_run = p.dry_run
        self.params.pure = p.pure
        self.params.quantize_output_tensor = p.quantize_output_tensor
        self.params.allow_requantize = p.allow_requantize
        if p.output_tensor_type is not None:
            self.params.output_tensor_type = p.output_tensor_type
        if p.token_embedding_type is not None:
            self.params.token_embedding_type = p.token_embedding_type
        self._keep: list = []
        if p.overrides:
            arr = (lc.llama_model_tensor_override * (len(p.overrides) + 1))()
            for i, (pattern, typ) in enumerate(p.overrides):
                b = pattern.encode()
                self._keep.append(b)
                arr[i].pattern = b
                arr[i].type = typ
            arr[len(p.overrides)].pattern = None
            arr[len(p.overrides)].type = len_ggml_types()
            self._keep.append(arr)
            self.params.tt_overrides = ctypes.cast(arr, ctypes.POINTER(lc.llama_model_tensor_override))
        if p.imatrix is not None:
            arr = (lc.llama_model_imatrix_data * (len(p.imatrix) + 1))()
            for i, (name, values) in enumerate(p.imatrix.items()):
                v = np.ascontiguousarray(values, dtype=np.float32)
                b = name.encode()
                self._keep += [v, b]
                arr[i].name = b
                arr[i].data = v.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
                arr[i].size = v.size
            arr[len(p.imatrix)].name = None
            self._keep.append(arr)
            self.params.imatrix = ctypes.cast(arr, ctypes.POINTER(lc.llama_model_imatrix_data))
        if p.kv_overrides:
            arr = (lc.llama_model_kv_override * (len(p.kv_overrides) + 1))()
            for i, kv in enumerate(p.kv_overrides):
                arr[i].key = kv.key.encode()
                if isinstance(kv.value, str):
                    arr[i].tag = lc.LLAMA_KV_OVERRIDE_TYPE_STR
                    # llama-quantize copies at most 127 bytes (strncpy + NUL): do the same.
                    arr[i].value.val_str = kv.value.encode()[:127]
                elif isinstance(kv.value, bool):  # before int: a bool is an int in Python
                    arr[i].tag = lc.LLAMA_KV_OVERRIDE_TYPE_BOOL
                    arr[i].value.val_bool = kv.value
                elif isinstance(kv.value, float):
                    arr[i].tag = lc.LLAMA_KV_OVERRIDE_TYPE_FLOAT
                    arr[i].value.val_f64 = kv.value
                else:
                    arr[i].tag = lc.LLAMA_KV_OVERRIDE_TYPE_INT
                    arr[i].value.val_i64 = int(kv.value)
            arr[len(p.kv_overrides)].key = b""
            self._keep.append(arr)
            self.params.kv_overrides = ctypes.cast(arr, ctypes.POINTER(lc.llama_model_kv_override))


def len_ggml_types() -> int:
    import gguf

    return max(int(t.value) for t in gguf.GGMLQuantizationType) + 1


@contextlib.contextmanager
def capture_log(on_line: Callable[[int, str], None] | None = None) -> Iterator[list[str]]:
    """Route libllama's log into a list of lines (and ``on_line(level, line)`` as they come)."""
    lc = llama_cpp_module()
    lines: list[str] = []
    buf: list[str] = []
    level_of_line = [1]

    def flush_line(text: str) -> None:
        lines.append(text)
        if on_line is not None:
            try:
                on_line(level_of_line[0], text)
            except Exception:  # a progress-bar error must never unwind through C
                pass

    @lc.llama_log_callback
    def callback(level, text, user_data):  # noqa: ARG001
        s = text.decode("utf-8", errors="replace") if text else ""
        if level != 5:
            level_of_line[0] = level
        buf.append(s)
        joined = "".join(buf)
        if "\n" in joined:
            *complete, rest = joined.split("\n")
            buf[:] = [rest] if rest else []
            for line in complete:
                flush_line(line)

    with _LOG_LOCK:
        from llama_cpp import _logger

        lc.llama_log_set(callback, ctypes.c_void_p(0))
        try:
            yield lines
        finally:
            if buf:
                flush_line("".join(buf))
            lc.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))


def run_quantize(src: str, dst: str, params: QuantizeParams,
                 on_line: Callable[[int, str], None] | None = None) -> tuple[int, list[str]]:
    """Call ``llama_model_quantize``; returns (status, log lines). Status 0 means success."""
    lc = llama_cpp_module()
    built = _Built(params)
    with capture_log(on_line) as lines:
        rc = lc.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(built.params))
    return int(rc), lines
