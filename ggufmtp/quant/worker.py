"""``llama_model_quantize`` in a worker thread that Ctrl-C can stop (plan's dry run and quantize).

The C call cannot be interrupted, and a KeyboardInterrupt raised inside a ctypes log callback is
swallowed (the call would run on and the command exit 0). So the call runs in a worker thread
while the main thread waits in short joins, where Ctrl-C does land. On Ctrl-C the worker is asked
to stop: at its next log line (llama.cpp logs each tensor as it finishes it) the log callback
parks the thread for good, so the library writes nothing more; only once the worker has parked or
returned does the interrupt propagate, and a caller's ``finally`` may remove what it wrote.

A parked worker never returns: the process is expected to exit after the interrupt (the CLI does,
with status 130).

:class:`BackgroundHash` is the other worker: the receipt's sha256 digests, computed in a thread
while the quantization runs (the input: the page cache shares its bytes with libllama's reads) or
while the audit runs (the output), so hashing is off the critical path where cores allow.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..files.digest_cache import DigestCache
from ..files.hashing import file_digests, sha256_cached
from ..runtime.libllama import QuantizeParams, llama_cpp_module, run_quantize

__all__ = ["BackgroundHash", "WorkerRun", "lowest_priority", "normal_priority", "run_quantize_interruptible",
           "thread_read_bytes"]


@dataclasses.dataclass
class WorkerRun:
    """What the quantization thread hands back: libllama's status and log, or what it raised."""

    rc: int | None = None
    log: list[str] = dataclasses.field(default_factory=list)
    exc: BaseException | None = None


class _Worker:
    def __init__(self, src: str, dst: str, params: QuantizeParams, on_line: Callable[[int, str], None] | None):
        self.src, self.dst, self.params, self.on_line = src, dst, params, on_line
        self.result = WorkerRun()
        self.stop_requested = threading.Event()
        self.parked = threading.Event()
        self.thread = threading.Thread(target=self._work, name="ggufmtp-quantize", daemon=True)

    def _line(self, level: int, line: str) -> None:
        if self.stop_requested.is_set():
            self.parked.set()
            threading.Event().wait()  # never returns: the C loop stays stopped here
        if self.on_line is not None:
            self.on_line(level, line)

    def _work(self) -> None:
        try:
            self.result.rc, self.result.log = run_quantize(self.src, self.dst, self.params, self._line)
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            self.result.exc = e

    def wait(self) -> None:
        while self.thread.is_alive():
            self.thread.join(0.2)

    def stop(self) -> None:
        """Ask the worker to stop and wait until it has parked or returned (further Ctrl-Cs
        only repeat the request: returning early would let the library write on)."""
        self.stop_requested.set()
        while self.thread.is_alive() and not self.parked.is_set():
            try:
                self.thread.join(0.1)
            except KeyboardInterrupt:
                continue


def run_quantize_interruptible(src: str, dst: str, params: QuantizeParams,
                               on_line: Callable[[int, str], None] | None = None) -> WorkerRun:
    """:func:`ggufmtp.runtime.libllama.run_quantize` in a worker thread; a KeyboardInterrupt in
    the calling thread stops the worker (see the module docstring) and is then re-raised."""
    llama_cpp_module().llama_backend_init()
    worker = _Worker(src, dst, params, on_line)
    worker.thread.start()
    try:
        worker.wait()
    except KeyboardInterrupt:
        worker.stop()
        raise
    return worker.result


def thread_read_bytes() -> int:
    """Bytes the calling thread has read through read(2) so far (0 where /proc does not say)."""
    try:
        with open("/proc/thread-self/io", encoding="ascii") as f:
            for line in f:
                if line.startswith("rchar:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def lowest_priority() -> int | None:
    """Put the calling thread at nice 19 (Linux: nice is per thread); its native id, or None where
    the OS would not. For the hashing threads: they take the cores the quantization leaves idle."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        return threading.get_native_id()
    return None


def normal_priority(native_id: int | None) -> None:
    """Back to nice 0 for a thread :func:`lowest_priority` lowered, once the command waits for it
    (where the OS lets a process raise a thread's priority again: root or RLIMIT_NICE)."""
    if native_id is not None:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, native_id, 0)


class _Cancelled(Exception):
    pass


class BackgroundHash:
    """sha256 of ``paths`` in a thread, started at once. ``cache``: reuse (and record) digests of
    the local digest cache (the input of a quantize: a file ``pull`` verified is not read again).
    ``background``: run at the lowest CPU priority (nice 19, this thread only), so it takes the
    cores the quantization leaves idle and slows it as little as possible.

    :meth:`result` waits and returns ``{resolved path: sha256}``; :meth:`cancel` stops it at the
    next chunk. Every digest is of the bytes on disk (read now, or read earlier by ggufmtp from
    this very file, unchanged: see :mod:`ggufmtp.files.digest_cache`)."""

    def __init__(self, paths: list[Path], cache: DigestCache | None = None, background: bool = False):
        self.paths, self.cache, self.background = [Path(p) for p in paths], cache, background
        self.digests: dict[str, str] = {}
        self.from_cache = 0
        self.seconds = 0.0
        self.read_bytes = 0
        self._hashed = 0  # bytes the hash's reader thread read for it (its own rchar is not ours)
        self.exc: BaseException | None = None
        self._cancel = threading.Event()
        self._niced: int | None = None
        self.thread = threading.Thread(target=self._work, name="ggufmtp-sha256", daemon=True)
        self.thread.start()

    def _work(self) -> None:
        if self.background:
            self._niced = lowest_priority()
        t0, r0 = time.perf_counter(), thread_read_bytes()
        try:
            for p in self.paths:
                self.digests[str(p.resolve())] = self._hash(p)
        except _Cancelled:
            pass
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            self.exc = e
        finally:
            self.seconds = time.perf_counter() - t0
            self.read_bytes = thread_read_bytes() - r0 + self._hashed

    def _hash(self, path: Path) -> str:
        if self.cache is None:
            return file_digests(path, on_chunk=self._check).sha256
        digest, cached = sha256_cached(path, self.cache, on_chunk=self._check)
        self.from_cache += cached
        return digest

    def _check(self, n: int) -> None:
        self._hashed += n
        if self._cancel.is_set():
            raise _Cancelled

    def result(self) -> dict[str, str]:
        """Wait for the digests (Ctrl-C lands between short joins); re-raises what hashing raised."""
        while self.thread.is_alive():
            self.thread.join(0.2)
        if self.exc is not None:
            raise self.exc
        return dict(self.digests)

    def hurry(self) -> None:
        """Back to normal priority once the command waits for it (where the OS lets a process
        raise a thread's priority again: root or RLIMIT_NICE; elsewhere it runs on at nice 19,
        which only matters while other processes keep every core busy). Its read-ahead thread
        (:func:`ggufmtp.files.hashing.file_digests`) keeps the nice 19 it inherited: it only copies
        from the page cache, and by then the quantization has left every core idle."""
        if self.thread.is_alive():
            normal_priority(self._niced)

    def cancel(self) -> None:
        self._cancel.set()
