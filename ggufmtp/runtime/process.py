"""Process-level helpers of :mod:`ggufmtp.runtime.server`: who owns a listening port, whether a
port is free, an exit status in words, the Linux parent-death signal for child processes, and
whether a starting process still makes progress."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["HOST", "StartupWatch", "owns_listening_port", "port_in_use", "describe_exit", "die_with_parent",
           "stop_process", "stall_timeout_default"]

HOST = "127.0.0.1"


def owns_listening_port(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds the socket listening on 127.0.0.1:``port`` (Linux /proc;
    True where /proc cannot tell)."""
    try:
        want = f"0100007F:{port:04X}"
        inodes = set()
        with open("/proc/net/tcp") as fh:
            for line in fh.readlines()[1:]:
                f = line.split()
                if len(f) > 9 and f[1] == want and f[3] == "0A":  # LISTEN
                    inodes.add(f"socket:[{f[9]}]")
        if not inodes:
            return False
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                    return True
        return False
    except OSError:
        return True


def port_in_use(port: int) -> bool:
    """Whether ``port`` on 127.0.0.1 is taken (bound by another process, or not ours to bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((HOST, port))
        except OSError as e:
            return e.errno in (errno.EADDRINUSE, errno.EACCES)
    return False


def describe_exit(rc: int) -> str:
    """A process exit status in words (``exit code 1``, ``killed by signal SIGKILL``)."""
    if rc < 0:
        try:
            return f"killed by signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit code {rc}"


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (runs in the child between fork and exec)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def stop_process(proc: subprocess.Popen, grace: float = 10) -> None:
    """End a child that is still running: SIGTERM, then SIGKILL after ``grace`` seconds; reaped either way."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


STALL_ENV = "GGUFMTP_SERVER_STALL_TIMEOUT"


def stall_timeout_default() -> float | None:
    """Seconds without progress after which a starting llama-server counts as hung:
    ``$GGUFMTP_SERVER_STALL_TIMEOUT`` (0 = never), else 120 (a big model's load prints a dot per
    percent, far more often)."""
    try:
        value = float(os.environ.get(STALL_ENV, "120"))
    except ValueError:
        value = 120.0
    return value if value > 0 else None


class StartupWatch:
    """Whether a starting process makes progress: its log grows, or it listens on its port.

    A process that is alive, prints nothing new and does not listen for ``limit`` seconds is
    stalled; one that listens (answering 503 while it loads) is left to the startup timeout."""

    def __init__(self, log_path: str | os.PathLike | None, limit: float | None):
        self.log_path = Path(log_path) if log_path is not None else None
        self.limit = limit
        self._size = -1
        self._since = time.monotonic()

    def idle_for(self) -> float:
        """Seconds since the log last grew."""
        try:
            size = self.log_path.stat().st_size if self.log_path is not None else -1
        except OSError:
            size = -1
        now = time.monotonic()
        if size != self._size:
            self._size, self._since = size, now
        return now - self._since

    def stalled(self, listening: bool) -> bool:
        idle = self.idle_for()
        return bool(self.limit) and not listening and idle > self.limit
