"""``llama_model_quantize`` in a worker thread that Ctrl-C can stop (plan's dry run and quantize).

The C call cannot be interrupted, and a KeyboardInterrupt raised inside a ctypes log callback is
swallowed (the call would run on and the command exit 0). So the call runs in a worker thread
while the main thread waits in short joins, where Ctrl-C does land. On Ctrl-C the worker is asked
to stop: at its next log line (llama.cpp logs each tensor as it finishes it) the log callback
parks the thread for good, so the library writes nothing more; only once the worker has parked or
returned does the interrupt propagate, and a caller's ``finally`` may remove what it wrote.

A parked worker never returns: the process is expected to exit after the interrupt (the CLI does,
with status 130).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Callable

from ..runtime.libllama import QuantizeParams, llama_cpp_module, run_quantize

__all__ = ["WorkerRun", "run_quantize_interruptible"]


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
