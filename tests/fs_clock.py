"""Test helper: wait for the file system's clock instead of sleeping a guessed while.

A file's ctime is stamped at the file system's granularity: a kernel tick (1-10 ms, the coarse
clock) on ext4, xfs, btrfs and tmpfs, up to a second or two on others. A test whose point is that
an edit moves ctime (the digest cache's key, a served file's identity) must make that edit after
the clock has passed the file's current ctime; a fixed ``time.sleep(0.01)`` only does on some
machines.
"""

from __future__ import annotations

import time
from pathlib import Path


def past_the_ctime_of(path: Path, timeout: float = 10.0) -> None:
    """Return once a change made now gets a ctime later than ``path``'s, as the file system in
    ``path``'s folder stamps it (a probe file there, removed again); AssertionError after ``timeout``."""
    before = path.stat().st_ctime_ns
    probe = path.with_name(f".{path.name}.clock-probe")
    deadline = time.monotonic() + timeout
    try:
        while True:
            probe.unlink(missing_ok=True)
            probe.touch()  # a new file: its ctime is the file system's now
            if probe.stat().st_ctime_ns > before:
                return
            assert time.monotonic() < deadline, f"the file system's clock did not pass {path}'s ctime in {timeout} s"
            time.sleep(0.001)
    finally:
        probe.unlink(missing_ok=True)
