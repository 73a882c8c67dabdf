"""llama.cpp's own projection of a server's memory: ``llama-fit-params --fit-print on``.

``tools/fit-params`` (built with the runtime: ``constants.FIT_PARAMS_TOOL``) loads the model with
``no_alloc`` (nothing is allocated, no tensor data is read), creates the context the flags describe
and prints, per device and for the host, the MiB of the model's buffers, of the context's (KV cache
and recurrent states) and of the compute buffer the scheduler reserves for the worst-case graph
(``common_fit_print`` in ``common/fit.cpp``: ``llama_get_memory_breakdown``, each figure
``bytes / 1024 / 1024`` in integer arithmetic, i.e. floored)::

    CUDA0 17094 512 493
    Host 1043 0 12

What it covers, at the pinned commit (0c1e570): the MAIN context only, as the flags of
``LLAMA_EXAMPLE_FIT_PARAMS`` configure it. It takes the common flags (``-c``, ``-np``, ``-ub``,
``-b``, ``-ngl``, ``-ctk``/``-ctv``, ``-fa``, ``-ot``, ``--cpu-moe``, ``--n-cpu-moe``, ``-ts``,
``-sm``, ``-mg``, ...) but none of speculative decoding's (``--spec-type`` is a server flag), so
it never loads the MTP block (``load_mtp`` false), has no MTP draft context, keeps no recurrent
rollback states (``n_rs_seq`` 0) and reserves the graph with every token of the physical batch an
output (``n_outputs_max`` 0 means ``n_batch``; llama-server sets slots x (1 + draft window)).
The memory plan asks it only for the graphs its own estimate is low for, and takes the larger of the
two (:func:`ggufmtp.runtime.compute.planned_compute`): that last reservation over-states a server's
buffer by up to one logits tensor (501 MiB projected, 76.02 reported at a 248,320-token vocabulary).

A projection is cached in ``fit-params.json`` of ggufmtp's cache, by the model files' identity
(path, size, mtime, ctime of every shard), the flags, the binary's identity and
``$CUDA_VISIBLE_DEVICES``: a ladder plans every arm against the same source model and settings and
runs the tool once. Every failure (not built, exit status, output it cannot parse) is an answer
with no projection and a note saying why, never an exception: the plan then falls back to
ggufmtp's estimate.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..constants import FIT_PARAMS_TOOL
from ..errors import RuntimeMissingError
from ..files.digest_cache import file_key
from ..files.memo import JsonMemo
from ..gguf.model import split_shards
from . import build as runtime

__all__ = ["DeviceFigures", "Projection", "Projected", "sizing_flags", "ubatch_of", "parse_fit_print", "project_memory"]

MIB = 1024 * 1024
DEFAULT_UBATCH = 512  # llama.cpp's default physical batch (-ub)
TIMEOUT_S = 300.0  # a dry run reads only the GGUF header; a CUDA build also initialises every GPU
MEMO_FILE = "fit-params.json"
MEMO_VERSION = 1
#: Flags that size a server's memory and take a value, as ``common/arg.cpp`` spells them
VALUED_FLAGS = frozenset({
    "-c", "--ctx-size", "-np", "--parallel", "-b", "--batch-size", "-ub", "--ubatch-size",
    "-ngl", "--gpu-layers", "--n-gpu-layers", "-ctk", "--cache-type-k", "-ctv", "--cache-type-v",
    "-fa", "--flash-attn", "-ot", "--override-tensor", "-ncmoe", "--n-cpu-moe", "-ncffn", "--n-cpu-ffn",
    "-ts", "--tensor-split", "-sm", "--split-mode", "-mg", "--main-gpu", "-dev", "--device",
})
#: ... and those that take none
SWITCH_FLAGS = frozenset({
    "-cmoe", "--cpu-moe", "--swa-full", "-kvo", "--kv-offload", "-nkvo", "--no-kv-offload",
    "--op-offload", "--no-op-offload", "-kvu", "--kv-unified", "-no-kvu", "--no-kv-unified",
    "--repack", "-nr", "--no-repack",
})
_LINE = re.compile(r"^(\S+) (\d+) (\d+) (\d+)\s*$")


@dataclass(frozen=True)
class DeviceFigures:
    """One line of ``--fit-print on``: a device (or ``Host``) and its MiB, floored."""

    device: str
    model_mib: int
    context_mib: int
    compute_mib: int

    def to_dict(self) -> dict[str, int | str]:
        return {"device": self.device, "model_mib": self.model_mib, "context_mib": self.context_mib,
                "compute_mib": self.compute_mib}


@dataclass(frozen=True)
class Projection:
    """llama.cpp's projection of one server's main context: per GPU in llama.cpp's device order,
    and the host; ``flags``: what it was asked with (the model left out: no local path)."""

    gpus: tuple[DeviceFigures, ...]
    host: DeviceFigures
    flags: tuple[str, ...]

    def to_dict(self) -> dict[str, object]:
        return {"gpus": [g.to_dict() for g in self.gpus], "host": self.host.to_dict(), "flags": list(self.flags)}


@dataclass(frozen=True)
class Projected:
    """The answer for one server: a projection, or None and the ``note`` saying why not."""

    projection: Projection | None
    note: str = ""


def sizing_flags(args: Sequence[str]) -> list[str]:
    """The flags of ``args`` (a server's command-line arguments) that size its memory, with their
    values, in their order (llama.cpp's parser lets a later flag win, as the server's does)."""
    out: list[str] = []
    it = iter(args)
    for a in it:
        name = a.split("=", 1)[0] if a.startswith("--") else a
        if name in SWITCH_FLAGS:
            out.append(a)
        elif name in VALUED_FLAGS:
            out.append(a)
            if "=" not in a:
                value = next(it, None)
                if value is not None:
                    out.append(value)
    return out


def ubatch_of(args: Sequence[str]) -> int:
    """The physical batch ``args`` give llama.cpp: the last ``-ub`` (default 512), capped by the
    last ``-b`` (``llama-context.cpp``: ``n_ubatch = min(n_batch, n_ubatch)``)."""
    ub, b = DEFAULT_UBATCH, None
    for flag, value in zip(args, args[1:], strict=False):
        if flag in ("-ub", "--ubatch-size") and value.isdigit():
            ub = int(value)
        elif flag in ("-b", "--batch-size") and value.isdigit():
            b = int(value)
    return min(ub, b) if b else ub


def parse_fit_print(text: str) -> tuple[tuple[DeviceFigures, ...], DeviceFigures]:
    """(the GPUs, the host) of ``--fit-print on``'s stdout; ValueError when it is not that."""
    rows = [DeviceFigures(m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)))
            for m in map(_LINE.match, text.splitlines()) if m]
    hosts = [r for r in rows if r.device == "Host"]
    if len(hosts) != 1 or rows[-1] is not hosts[0]:
        raise ValueError(f"expected '<device> <model> <context> <compute>' lines ending with one 'Host' line, "
                         f"got {text.strip()[:200]!r}")
    return tuple(rows[:-1]), hosts[0]


def project_memory(model: str | os.PathLike, flags: Sequence[str],
                   llama_cpp_bin: str | os.PathLike | None = None) -> Projected:
    """llama.cpp's projection of the main context of a server of ``model`` started with ``flags``
    (cached: see the module docstring); ``llama_cpp_bin``: the llama-server binary or its folder
    (``llama-fit-params`` beside it), default the built runtime's. Never raises for the tool's
    failures: the answer then has no projection and a note."""
    try:
        exe = _binary(llama_cpp_bin)
    except RuntimeMissingError:
        return Projected(None, f"{FIT_PARAMS_TOOL} is not built (a runtime from before ggufmtp used it): run "
                               f"`ggufmtp runtime build` to add it")
    path = Path(model)
    key = _memo_key(path, flags, exe)
    memo = JsonMemo(runtime.cache_root() / MEMO_FILE, version=MEMO_VERSION, max_entries=512)
    known = memo.get(key) if key else None
    if isinstance(known, str):
        try:
            return Projected(Projection(*parse_fit_print(known), tuple(flags)))
        except ValueError:
            pass  # a damaged entry: asked again
    answer, stdout = _run(exe, path, flags)
    if answer.projection is not None and key:
        memo.put(key, stdout)
    return answer


def _binary(llama_cpp_bin: str | os.PathLike | None) -> Path:
    """``llama-fit-params`` beside the given llama-server (or in the given folder), else the
    runtime's; never built here (a plan must not start a compile): RuntimeMissingError."""
    where = None
    if llama_cpp_bin is not None:
        p = Path(llama_cpp_bin).expanduser()
        where = p if p.is_dir() else p.parent
    return runtime.find_binary(FIT_PARAMS_TOOL, where, build=False)


def _memo_key(model: Path, flags: Sequence[str], exe: Path) -> str | None:
    try:
        files = [f"{p.resolve()}:{file_key(os.stat(p)).text()}" for p in split_shards(model)]
        tool = f"{exe.resolve()}:{file_key(os.stat(exe)).text()}"
    except (OSError, ValueError):
        return None
    parts = [*files, tool, "\0".join(flags), os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _run(exe: Path, model: Path, flags: Sequence[str]) -> tuple[Projected, str]:
    """Run the tool once: (the answer, its stdout). The notes name the model by its file name only."""
    argv = [str(exe), "--fit-print", "on", "--model", str(model), *flags]
    env = {**os.environ, "GGML_NO_BACKTRACE": "1"}  # a failed load aborts; no gdb attach for a backtrace
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, env=env,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return Projected(None, f"{FIT_PARAMS_TOOL} did not answer within {TIMEOUT_S:.0f} s"), ""
    except OSError as e:
        return Projected(None, f"{FIT_PARAMS_TOOL} could not run ({e.strerror})"), ""
    if proc.returncode != 0:
        why = _last_error(proc.stderr, model)
        return Projected(None, f"{FIT_PARAMS_TOOL} failed on {model.name} (exit status {proc.returncode})"
                               + (f": {why}" if why else "")), ""
    try:
        gpus, host = parse_fit_print(proc.stdout)
    except ValueError:
        return Projected(None, f"{FIT_PARAMS_TOOL} printed no memory projection for {model.name}"), ""
    return Projected(Projection(gpus, host, tuple(flags))), proc.stdout


def _last_error(stderr: str, model: Path) -> str:
    """The last error line of the tool's log, local paths replaced by the model's file name."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    pick = next((ln for ln in reversed(lines) if re.search(r"\berror\b|what\(\)|\bE\b", ln)), "")
    pick = re.sub(r"^[\d.]+ [EWI] ", "", pick)
    return pick.replace(str(model), model.name).replace(str(model.parent), "<dir>")[:200]
