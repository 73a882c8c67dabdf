"""A local cache of sha256 digests that ggufmtp computed itself from the bytes on disk.

A receipt names the sha256 of every input file; hashing a 72 GB checkpoint again for each quantize
costs a minute. The digest that ``pull`` computed (and checked against the Hub's LFS sha256), or
that an earlier quantize computed, is reused while the file is provably the same file, unchanged:
the entry is keyed by ``(st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns)``. ``mtime`` can be
set back (``touch -d``, ``os.utime``) but ``ctime`` cannot (the kernel sets it on every write and on
``utime`` itself), so an edit that restores size and mtime still misses; a file replaced by
another (rename, copy) has another inode and misses too.

Entries are inserted only by :func:`ggufmtp.files.hashing.file_digests` (the one hashing function)
and by ``pull`` for a download whose digest matched the Hub's, and by ``quantize`` for its own
output hashed while libllama wrote it (:class:`ggufmtp.quant.stream_hash.OutputDigest`, with the
file's stat as verified); ``quantize`` then moves its output's entry across the rename that
publishes it (:meth:`DigestCache.follow_rename`). All of them record only when the file's key
was the same before and after it was read and its ctime is older than :data:`RACY_NS` then
(:data:`RACY_COARSE_NS` on a file system stamping whole seconds: :func:`racy_window`; a write in
the same timestamp tick as the hash could otherwise keep the key; the "racy git" problem). A file
the cache did not hash is never in it. ``audit`` never consults it: an auditor re-reads the bytes.

The cache is one JSON file (``digests.json``) in a folder the caller chooses (ggufmtp uses
``<cache root>/digests``), written atomically; a damaged or unreadable cache is treated as empty.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

from .memo import JsonMemo

__all__ = ["DigestCache", "FileKey", "RACY_COARSE_NS", "RACY_NS", "file_key", "racy_window"]

#: An entry whose file changed less than this before the hash finished is not recorded: file
#: timestamps come from a coarse clock (a few ms per tick), so a write right after the last read
#: could leave the key as it was.
RACY_NS = 100_000_000
#: ... and on a file system that stamps whole seconds (ext4 with 128-byte inodes, some network and
#: FAT-family mounts: 2 s), a tick is that long: a file whose stamps both fall on a whole second is
#: judged by this window instead (a fine-grained stamp lands there once in 10^9, costing a cache miss).
RACY_COARSE_NS = 2_000_000_000


def racy_window(st: os.stat_result) -> int:
    """The time after a file's last change during which its key may not yet show a later write."""
    coarse = st.st_mtime_ns % 1_000_000_000 == 0 and st.st_ctime_ns % 1_000_000_000 == 0
    return RACY_COARSE_NS if coarse else RACY_NS
#: Oldest entries are dropped beyond this many (a few hundred bytes each).
MAX_ENTRIES = 4096
CACHE_FILE = "digests.json"
_VERSION = 1


@dataclasses.dataclass(frozen=True)
class FileKey:
    """What identifies a file and every change to it: device, inode, size, mtime and ctime (ns)."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    def text(self) -> str:
        return f"{self.dev}:{self.ino}:{self.size}:{self.mtime_ns}:{self.ctime_ns}"


def file_key(st: os.stat_result) -> FileKey:
    return FileKey(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class DigestCache:
    """Digests of files ggufmtp hashed, by :class:`FileKey` (a :class:`~.memo.JsonMemo`)."""

    def __init__(self, folder: str | os.PathLike):
        self.path = Path(folder) / CACHE_FILE
        self._memo = JsonMemo(self.path, version=_VERSION, max_entries=MAX_ENTRIES)

    @classmethod
    def under(cls, cache_root: str | os.PathLike) -> DigestCache:
        """ggufmtp's digest cache: ``digests/`` in its cache root (``runtime.build.cache_root()``)."""
        return cls(Path(cache_root) / "digests")

    def lookup(self, path: str | os.PathLike) -> str | None:
        """The sha256 recorded for ``path`` as it is now, or None (never hashed by ggufmtp, changed
        since, unreadable)."""
        try:
            key = file_key(os.stat(path))
        except OSError:
            return None
        entry = self._memo.get(key.text())
        return entry.get("sha256") if isinstance(entry, dict) else None

    def record(self, path: str | os.PathLike, sha256: str, before: os.stat_result, after: os.stat_result) -> bool:
        """Remember ``sha256`` for ``path``, read between the ``before`` and ``after`` stats of the
        open file. Only :func:`ggufmtp.files.hashing.file_digests`, ``pull`` (for a download
        whose digest matched the Hub's) and quantize's streamed output digest call this. Returns whether it
        was recorded: not when the file changed during the read or too recently (:func:`racy_window`)."""
        key = file_key(before)
        if key != file_key(after) or time.time_ns() - after.st_ctime_ns < racy_window(after):
            return False
        return self._memo.put(key.text(), {"sha256": sha256, "path": str(Path(path).absolute())})

    def follow_rename(self, before: os.stat_result, path: str | os.PathLike) -> bool:
        """Move the entry of a file that ggufmtp itself renamed to ``path`` (quantize publishing
        its staged output, hashed in its private partial folder): a rename keeps the bytes, inode,
        size and mtime but sets ctime, so without this the digest just computed would be unknown
        under the file's new key. ``before`` is the file's stat taken right before the rename; only
        an entry recorded for exactly that key moves, and only to the same inode with the same size
        and mtime. Whether it moved."""
        try:
            after = os.stat(path)
        except OSError:
            return False
        old, new = file_key(before), file_key(after)
        if (old.dev, old.ino, old.size, old.mtime_ns) != (new.dev, new.ino, new.size, new.mtime_ns):
            return False

        def move(entries: dict) -> bool:
            entry = entries.pop(old.text(), None)
            if not isinstance(entry, dict):
                return False
            entries[new.text()] = {**entry, "path": str(Path(path).absolute())}
            return True
        return self._memo.update(move)

    def forget(self, path: str | os.PathLike) -> bool:
        """Drop the entry of ``path`` as it is now (benchmarks measuring a cold hash); whether one was there."""
        try:
            key = file_key(os.stat(path)).text()
        except OSError:
            return False
        return self._memo.pop(key) is not None
