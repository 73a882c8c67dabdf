"""The output's sha256, computed while libllama writes it.

``llama_model_quantize`` writes a zero placeholder for the header, then the tensor data front to
back, then the real header at offset 0 (:mod:`ggufmtp.quant.output_header`). With the header
predicted, :class:`StreamingOutputHash` hashes it first, then follows the growing file in a
low-priority thread, hashing the data region as it lands (from the page cache: the bytes were
just written), so that when libllama returns only the last few MiB are left to read.

The digest is only trusted after a check of the file as it ended up: the path still names the
file that was followed, its size is the predicted size and its first ``meta_size`` bytes are the
predicted header. Then the bytes hashed are the bytes on disk (the data region is written once,
sequentially, and never rewritten; bytes are read only below the file's size, and while the
writer runs a margin below it). Anything else (a wrong prediction, a file that shrank or was
replaced, a read error, a cancel) yields a :class:`StreamResult` whose status says so and whose
``sha256`` is None: the caller then hashes the finished file the ordinary way
(:func:`ggufmtp.files.hashing.file_digests`). The hasher never raises into the caller.

Memory stays at one ``chunk_size`` buffer (4 MiB) plus the predicted header itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import hashlib
import os
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO

from ..files.digest_cache import DigestCache, file_key
from ..files.hashing import CHUNK_SIZE
from ..jsontypes import JsonObject
from .output_header import PredictedHeader
from .worker import BackgroundHash, lowest_priority, normal_priority

__all__ = ["OutputDigest", "StreamResult", "StreamStatus", "StreamingOutputHash"]

#: While the writer runs, stay this far below the file's current size: insurance against reading
#: a page whose size update raced ahead of its bytes (the margin is read after the writer ends).
SAFETY_MARGIN = 1 << 20
#: How long the thread sleeps when no new bytes are ready (writer_finished/cancel wake it at once).
POLL_SECONDS = 0.05


class StreamStatus(enum.StrEnum):
    """How a streaming hash ended. Only VERIFIED carries a digest."""

    VERIFIED = "verified"
    SIZE_MISMATCH = "size-mismatch"  # the finished file's size is not the predicted one
    HEADER_MISMATCH = "header-mismatch"  # its first meta_size bytes are not the predicted header
    PREEXISTING = "preexisting"  # the path existed before the writer started: refused at once
    REPLACED = "replaced"  # the file shrank, vanished or the path names another file now
    CANCELLED = "cancelled"
    ERROR = "error"  # a read failed, or the file never appeared


@dataclasses.dataclass(frozen=True)
class StreamResult:
    """``sha256``: hex digest of the file's bytes on disk, only when ``status`` is VERIFIED.
    ``seconds``: the thread's own wall time; ``tail_seconds``: from :meth:`StreamingOutputHash.writer_finished`
    to the result (what a caller waiting right away would wait); ``read_bytes``: bytes it read."""

    status: StreamStatus
    sha256: str | None
    size: int
    detail: str = ""
    seconds: float = 0.0
    tail_seconds: float = 0.0
    read_bytes: int = 0

    @property
    def ok(self) -> bool:
        return self.status == StreamStatus.VERIFIED

    def to_dict(self) -> JsonObject:
        d = dataclasses.asdict(self)
        d["status"] = self.status.value
        return d


class _Cancelled(Exception):
    pass


class _Mismatch(Exception):
    def __init__(self, status: StreamStatus, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


class StreamingOutputHash:
    """sha256 of the file libllama is writing at ``path``, hashed as it is written (module
    docstring). Construct it BEFORE the writer starts (the path must not exist yet: a file there
    could be a stale one the writer truncates under us); it starts its thread at once.

    Then: :meth:`writer_finished` when the writer returned (non-blocking: the thread reads the
    rest and verifies), :meth:`result` to wait for the :class:`StreamResult` (or :meth:`finish`
    for both); :meth:`cancel` on failure or Ctrl-C. ``background``: nice 19 for its thread (Linux:
    per thread), like :class:`ggufmtp.quant.worker.BackgroundHash`."""

    def __init__(self, path: str | os.PathLike, predicted: PredictedHeader, *, background: bool = True,
                 chunk_size: int = CHUNK_SIZE, margin: int = SAFETY_MARGIN, poll_seconds: float = POLL_SECONDS):
        self.path, self.predicted = Path(path), predicted
        self.background, self.chunk_size, self.margin, self.poll_seconds = background, chunk_size, margin, poll_seconds
        self.read_bytes = 0
        self.verified_stat: os.stat_result | None = None  # the file as verified (VERIFIED only)
        self._finished = threading.Event()
        self._cancel = threading.Event()
        self._wake = threading.Event()
        self._finished_at: float | None = None
        self._niced: int | None = None
        self._result: StreamResult | None = None
        self.thread = threading.Thread(target=self._work, name="ggufmtp-sha256-stream", daemon=True)
        if os.path.lexists(self.path):
            self._result = StreamResult(StreamStatus.PREEXISTING, None, -1,
                                        f"{self.path} existed before the writer started")
            return
        self.thread.start()

    # --- the caller's side ------------------------------------------------------------------
    def writer_finished(self) -> None:
        """The writer returned and closed the file: read what is left, then verify. Raises the
        thread back to normal priority where the OS allows (the caller is about to wait for it)."""
        if self._finished_at is None:
            self._finished_at = time.perf_counter()
        self._finished.set()
        self._wake.set()
        if self.thread.is_alive():
            normal_priority(self._niced)

    def result(self) -> StreamResult:
        """Wait for the outcome (Ctrl-C lands between short joins). Without :meth:`writer_finished`
        or :meth:`cancel` first, this waits for ever: the thread follows the file until told."""
        while self.thread.is_alive():
            self.thread.join(0.2)
        assert self._result is not None
        return self._result

    def finish(self) -> StreamResult:
        """:meth:`writer_finished`, then :meth:`result`."""
        self.writer_finished()
        return self.result()

    def cancel(self) -> None:
        """Stop at the next chunk or poll; :meth:`result` then says CANCELLED (unless it had ended)."""
        self._cancel.set()
        self._wake.set()

    @property
    def seconds(self) -> float:
        return self._result.seconds if self._result is not None else 0.0

    # --- the thread -------------------------------------------------------------------------
    def _work(self) -> None:
        if self.background:
            self._niced = lowest_priority()
        t0 = time.perf_counter()
        status, digest, size, detail = StreamStatus.ERROR, None, -1, ""
        try:
            digest, size = self._follow_and_verify()
            status = StreamStatus.VERIFIED
        except _Cancelled:
            status, detail = StreamStatus.CANCELLED, "cancelled"
        except _Mismatch as e:
            status, detail = e.status, e.detail
        except OSError as e:
            status, detail = StreamStatus.ERROR, f"{self.path}: {e.strerror or e}"
        except Exception as e:  # noqa: BLE001 - never into the caller: it falls back to a full hash
            status, detail = StreamStatus.ERROR, f"{type(e).__name__}: {e}"
        end = time.perf_counter()
        tail = end - self._finished_at if self._finished_at is not None else 0.0
        self._result = StreamResult(status, digest if status == StreamStatus.VERIFIED else None, size, detail,
                                    end - t0, max(0.0, tail), self.read_bytes)

    def _check_cancel(self) -> None:
        if self._cancel.is_set():
            raise _Cancelled

    def _open_when_created(self) -> BinaryIO:
        """The writer creates the file after loading the model: wait for it."""
        while True:
            self._check_cancel()
            finished = self._finished.is_set()
            try:
                return open(self.path, "rb", buffering=0)
            except FileNotFoundError:
                if finished:
                    raise _Mismatch(StreamStatus.ERROR, f"{self.path} never appeared") from None
            self._wake.wait(self.poll_seconds)
            self._wake.clear()

    def _follow_and_verify(self) -> tuple[str, int]:
        with self._open_when_created() as f:
            h = hashlib.sha256(self.predicted.header)
            self._follow(f, h)
            return h.hexdigest(), self._verify(f)

    def _read_at(self, f: BinaryIO, pos: int, into: memoryview) -> int:
        f.seek(pos)
        n = f.readinto(into) or 0
        self.read_bytes += n
        return n

    def _follow(self, f: BinaryIO, h: Any) -> None:
        """Hash [meta_size, predicted file_size) as it lands; returns once the writer finished
        and everything below the final size was hashed."""
        buf = memoryview(bytearray(self.chunk_size))
        pos, end = self.predicted.meta_size, self.predicted.file_size
        while True:
            done = self._finished.is_set()  # before the fstat: once set, the size seen is final
            size = os.fstat(f.fileno()).st_size
            if size < pos and pos > self.predicted.meta_size:
                raise _Mismatch(StreamStatus.REPLACED, f"{self.path} shrank to {size} bytes after {pos} were hashed")
            limit = min(end, size if done else size - self.margin)
            progressed = pos < limit
            while pos < limit:
                self._check_cancel()
                n = self._read_at(f, pos, buf[:min(self.chunk_size, limit - pos)])
                if n <= 0:
                    raise _Mismatch(StreamStatus.REPLACED, f"{self.path} ended at {pos} bytes, below its size {size}")
                h.update(buf[:n])
                pos += n
            if done:
                if pos != end:
                    raise _Mismatch(StreamStatus.SIZE_MISMATCH,
                                    f"{self.path} has {size} bytes, predicted {end}")
                return
            if not progressed:
                self._check_cancel()
                self._wake.wait(self.poll_seconds)
                self._wake.clear()

    def _verify(self, f: BinaryIO) -> int:
        """The path still names the file followed, whose size and header are the predicted ones."""
        st = os.fstat(f.fileno())
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            raise _Mismatch(StreamStatus.REPLACED, f"{self.path} was removed") from None
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            raise _Mismatch(StreamStatus.REPLACED, f"{self.path} names another file than the one hashed")
        if st.st_size != self.predicted.file_size:
            raise _Mismatch(StreamStatus.SIZE_MISMATCH,
                            f"{self.path} has {st.st_size} bytes, predicted {self.predicted.file_size}")
        self._compare_header(f)
        if file_key(os.fstat(f.fileno())) != file_key(st):
            raise _Mismatch(StreamStatus.REPLACED, f"{self.path} changed while its header was compared")
        self.verified_stat = st
        return st.st_size

    def _compare_header(self, f: BinaryIO) -> None:
        header = memoryview(self.predicted.header)
        buf = memoryview(bytearray(min(self.chunk_size, len(header)) or 1))
        pos = 0
        while pos < len(header):
            self._check_cancel()
            n = self._read_at(f, pos, buf[:min(len(buf), len(header) - pos)])
            if n <= 0:
                raise _Mismatch(StreamStatus.REPLACED, f"{self.path} ended inside its header at {pos}")
            if buf[:n] != header[pos:pos + n]:
                first = pos + next(i for i in range(n) if buf[i] != header[pos + i])
                raise _Mismatch(StreamStatus.HEADER_MISMATCH,
                                f"{self.path}: header byte {first} differs from the prediction")
            pos += n


class OutputDigest:
    """The staged output's sha256 for quantize's receipt: streamed while libllama writes it when
    its header was predicted (``predicted``), else hashed after the write; a stream whose check
    fails falls back to hashing the finished file too, so the digest is always of the bytes on
    disk. The same surface as :class:`~ggufmtp.quant.worker.BackgroundHash` for the stage clock
    (``result``, ``seconds``, ``read_bytes``, ``cancel``); ``how`` says which path gave the digest.

    Construct it before libllama starts (the stream must see the file appear), call
    :meth:`writer_finished` when libllama returned, :meth:`result` when the digest is needed, and
    :meth:`remember` just before the rename that publishes the file."""

    def __init__(self, staged: Path, predicted: PredictedHeader | None, cache: DigestCache):
        self.staged, self.cache = Path(staged), cache
        self.stream = StreamingOutputHash(staged, predicted) if predicted is not None else None
        self.fallback: BackgroundHash | None = None
        self.how = "streamed" if self.stream is not None else "after the write (header not predicted)"
        self._sha: str | None = None

    def writer_finished(self) -> None:
        if self.stream is not None:
            self.stream.writer_finished()
        else:
            self.fallback = BackgroundHash([self.staged], cache=self.cache)

    def result(self) -> dict[str, str]:
        if self.stream is not None and self.fallback is None:
            r = self.stream.result()
            if r.ok:
                self._sha = r.sha256
                return {str(self.staged.resolve()): str(r.sha256)}
            self.how = f"after the write (stream {r.status.value}: {r.detail})"
            self.fallback = BackgroundHash([self.staged], cache=self.cache)
        assert self.fallback is not None, "writer_finished() first"
        return self.fallback.result()

    @property
    def seconds(self) -> float:
        return (self.stream.seconds if self.stream is not None else 0.0) + (self.fallback.seconds if self.fallback else 0.0)

    @property
    def read_bytes(self) -> int:
        return (self.stream.read_bytes if self.stream is not None else 0) + (self.fallback.read_bytes if self.fallback else 0)

    def remember(self) -> None:
        """Record a streamed digest in the digest cache while the file is still as verified (the
        hashed-after-the-write path records its own): called at publish time, by when the header
        write is past the cache's racy window for any output worth caching."""
        stream = self.stream
        if self._sha is not None and stream is not None and stream.verified_stat is not None:
            with contextlib.suppress(OSError):
                self.cache.record(self.staged, self._sha, stream.verified_stat, os.stat(self.staged))

    def cancel(self) -> None:
        if self.stream is not None:
            self.stream.cancel()
        if self.fallback is not None:
            self.fallback.cancel()
