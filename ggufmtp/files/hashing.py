"""Streaming file digests with bounded memory.

``sha256_file`` is the one function the rest of ggufmtp (receipts, audit, hub) uses to hash an
artifact: a reader thread fills a few preallocated buffers with ``readinto`` while the calling
thread hands ``hashlib`` ``memoryview`` slices of the filled ones (no copy, no per-chunk
allocation). Both release the GIL, so the read's copy from the page cache overlaps the hash and
sha256 runs at the CPU's own speed (on the H200 machine a serial read-then-hash loop reached 1.13
GB/s against OpenSSL's 1.36; here 1.25 against 1.46 pipelined). quantize hashes its output while
libllama writes it (:mod:`ggufmtp.quant.stream_hash`) and comes here only when that is not possible. Memory stays at
``_BUFFERS * chunk_size``.

It is also the only function that fills the local digest cache (:mod:`.digest_cache`):
``file_digests(..., cache=c)`` records what it read when the file did not change meanwhile, and
:func:`sha256_cached` reuses such a digest for a file that is provably the same, unchanged.

Why not the standard library's ``hashlib.file_digest`` (#42; ``benchmarks/hash_throughput.py``,
figures in ``benchmarks/README.md``): it hashes one file object into one digest and calls nothing
per chunk, and the callers need more from the one pass: the Hub's check of a regular file needs
the sha256 and the git blob sha1 (two ``file_digest`` passes: 2.42 s per GB against 2.25 s here), the
progress bars and quantize's ``on_chunk`` need each chunk. Speed is not the reason: for a bare
sha256 it was 5% faster on a 2-core machine with every core busy, where the read-ahead thread has
no core to overlap on (0.93 against 0.88 GB/s, 1 GB from page cache, 5 interleaved runs); a second
code path for that case would be a second implementation of the one hash.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .digest_cache import DigestCache

__all__ = ["CHUNK_SIZE", "FileDigests", "file_digests", "git_blob_sha1", "sha256_cached", "sha256_file"]

#: Read size. 4 MiB is past the point where larger reads stop helping on local disks and page
#: cache, and small enough to keep memory flat while hashing many files concurrently.
CHUNK_SIZE = 4 * 1024 * 1024
_MIN_CHUNK, _MAX_CHUNK = 1024 * 1024, 8 * 1024 * 1024
#: Buffers in flight between the reader thread and the hasher: one being read, one being hashed,
#: one spare so neither waits on the other's jitter.
_BUFFERS = 3


@dataclass(frozen=True)
class FileDigests:
    size: int
    sha256: str
    git_sha1: str | None = None  # git blob id: sha1(b"blob <size>\0" + content)


def _progress_bar(path: Path, total: int, enabled: bool):
    if not enabled:
        return None
    from ..progress import bar

    return bar(total, f"sha256 {path.name}", "B", unit_scale=True)


def file_digests(
    path: str | os.PathLike,
    *,
    git_blob: bool = False,
    progress: bool = False,
    chunk_size: int = CHUNK_SIZE,
    on_chunk: Callable[[int], None] | None = None,
    cache: DigestCache | None = None,
) -> FileDigests:
    """Hash ``path`` in one pass: sha256, plus the git blob sha1 when ``git_blob`` is set.

    ``on_chunk(n)`` is called after each chunk (for callers with their own progress display).
    ``cache``: record the sha256 there when the file did not change while it was read.
    Raises ``OSError`` (``FileNotFoundError``, ``IsADirectoryError``...) like ``open`` does.
    """
    path = Path(path)
    chunk_size = max(_MIN_CHUNK, min(_MAX_CHUNK, int(chunk_size)))
    with open(path, "rb", buffering=0) as f:
        before = os.fstat(f.fileno())
        size = before.st_size
        try:  # tell the kernel we read sequentially once: bigger read-ahead, less cache pollution
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        except (AttributeError, OSError):
            pass
        sha256 = hashlib.sha256()
        sha1 = None
        if git_blob:
            sha1 = hashlib.sha1(usedforsecurity=False)
            sha1.update(b"blob %d\0" % size)
        bar = _progress_bar(path, size, progress)
        read = 0
        try:
            # closing(): the reader thread stops here, before the file closes, even on an exception
            with contextlib.closing(_read_ahead(f, min(chunk_size, max(size, 1)))) as chunks:
                for chunk in chunks:
                    sha256.update(chunk)
                    if sha1 is not None:
                        sha1.update(chunk)
                    read += len(chunk)
                    if bar is not None:
                        bar.update(len(chunk))
                    if on_chunk is not None:
                        on_chunk(len(chunk))
        finally:
            if bar is not None:
                bar.close()
        after = os.fstat(f.fileno())
    if sha1 is not None and read != size:
        # The file changed size while we read it: the git header we hashed is wrong.
        raise OSError(f"{path} changed size while being hashed ({size} -> {read} bytes); retry when it is stable")
    digests = FileDigests(size=read, sha256=sha256.hexdigest(), git_sha1=sha1.hexdigest() if sha1 is not None else None)
    if cache is not None and read == size:
        cache.record(path, digests.sha256, before, after)
    return digests


def _read_ahead(f, chunk_size: int):
    """Yield memoryviews of ``f``'s successive chunks, read by a thread one or two chunks ahead.

    A yielded view is valid until the next one is requested. Errors of the reader thread are
    raised here; a caller that stops early (an exception, a closed generator) stops the thread."""
    free: queue.Queue[bytearray | None] = queue.Queue()
    filled: queue.Queue[tuple[bytearray, int] | BaseException] = queue.Queue()
    for _ in range(_BUFFERS):
        free.put(bytearray(chunk_size))

    def reader() -> None:
        try:
            while (buf := free.get()) is not None:
                n = f.readinto(buf)
                filled.put((buf, n))
                if not n:
                    return
        except BaseException as exc:  # handed to the consumer, which raises it in its own thread
            filled.put(exc)

    thread = threading.Thread(target=reader, name=f"read {getattr(f, 'name', '?')}", daemon=True)
    thread.start()
    try:
        while True:
            item = filled.get()
            if isinstance(item, BaseException):
                raise item
            buf, n = item
            if not n:
                return
            with memoryview(buf) as view:
                yield view[:n]
            free.put(buf)
    finally:
        free.put(None)  # the reader stops at its next buffer request (it is never blocked elsewhere)
        thread.join()


def sha256_file(path: str | os.PathLike, progress: bool = False, *, chunk_size: int = CHUNK_SIZE) -> str:
    """Hex sha256 of the file at ``path``, streamed in ``chunk_size`` reads (1-8 MiB)."""
    return file_digests(path, progress=progress, chunk_size=chunk_size).sha256


def sha256_cached(path: str | os.PathLike, cache: DigestCache, progress: bool = False,
                  on_chunk: Callable[[int], None] | None = None) -> tuple[str, bool]:
    """(sha256 of ``path``, whether it came from ``cache``): the digest ggufmtp recorded for this
    very file unchanged (same device, inode, size, mtime and ctime), else hashed now and recorded.
    Never for an auditor: ``audit`` re-reads the bytes with :func:`sha256_file`."""
    known = cache.lookup(path)
    if known is not None:
        return known, True
    return file_digests(path, progress=progress, cache=cache, on_chunk=on_chunk).sha256, False


def git_blob_sha1(data: bytes) -> str:
    """Git's blob id of ``data`` (what the Hub reports as ``oid`` for non-LFS files)."""
    h = hashlib.sha1(usedforsecurity=False)
    h.update(b"blob %d\0" % len(data))
    h.update(data)
    return h.hexdigest()
