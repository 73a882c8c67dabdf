"""The one small on-disk map of ggufmtp's cache: facts that are slow to learn and fixed by their key.

The digest cache (sha256 by file identity), the llama.cpp commit a binary reports (by the binary's
file identity) and a corpus's token count (by model, corpus and commit) are each one JSON file
under the cache root, written atomically with the one atomic writer. A damaged, unreadable or
other-version file reads as empty; a write that fails only costs relearning the fact. The oldest
entries are dropped beyond ``max_entries``. Thread-safe within a process, and between processes:
a read-modify-write holds an exclusive ``flock`` on ``<file>.lock`` beside it, so two runs storing
at once both keep their entries (a file system without locks falls back to the thread lock alone).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..jsontypes import JsonObject
from .fsutil import atomic_write_json

__all__ = ["JsonMemo"]


class JsonMemo:
    """``{key: JSON value}`` in one file, ``{"version": N, "entries": {...}}``."""

    def __init__(self, path: str | Path, version: int = 1, max_entries: int = 4096):
        self.path, self.version, self.max_entries = Path(path), version, max_entries
        self._lock = threading.Lock()

    def get(self, key: str) -> Any | None:
        with self._lock:
            return self._load().get(key)

    def put(self, key: str, value: Any) -> bool:
        """Store ``value`` as the newest entry (the bound drops the least recently stored);
        whether the file was written."""
        def change(entries: JsonObject) -> bool:
            entries.pop(key, None)
            entries[key] = value
            return True
        return self.update(change)

    def pop(self, key: str) -> Any | None:
        """Remove ``key``; its value, or None when it was not there."""
        popped: list[Any] = []

        def change(entries: JsonObject) -> bool:
            popped.append(entries.pop(key, None))
            return popped[0] is not None
        self.update(change)
        return popped[0] if popped else None

    def update(self, change: Callable[[JsonObject], bool]) -> bool:
        """Apply ``change`` to the entries under the lock; it returns whether to write them back.
        Whether the file was written (a cache that cannot be written only costs relearning)."""
        with self._lock, self._file_lock():
            entries = self._load()
            if not change(entries):
                return False
            while len(entries) > self.max_entries:
                entries.pop(next(iter(entries)))
            with contextlib.suppress(OSError):
                atomic_write_json(self.path, {"version": self.version, "entries": entries})
                return True
            return False

    @contextlib.contextmanager
    def _file_lock(self) -> Iterator[None]:
        """An exclusive lock between processes for one read-modify-write (none where it cannot be had)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fh = open(self.path.with_name(self.path.name + ".lock"), "a")
        except OSError:
            yield
            return
        with fh:
            with contextlib.suppress(OSError):
                fcntl.flock(fh, fcntl.LOCK_EX)
            yield

    def _load(self) -> JsonObject:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict) or data.get("version") != self.version or not isinstance(data.get("entries"), dict):
            return {}
        return dict(data["entries"])
