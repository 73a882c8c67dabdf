"""The one atomic writer: an output appears complete, durable and with normal permissions, or not at all.

A temp file in the target's folder receives the bytes, is fsynced, gets the permissions a plain
``open()`` would give (``0o666 & ~umask``, or the replaced file's mode), and is renamed over the
target; then the folder is fsynced so the rename itself survives a crash. ``mkstemp`` alone would
leave receipts and cards 0600.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import queue
import stat
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["atomic_write_bytes", "atomic_write_text", "atomic_write_json", "atomic_write_parts", "current_umask",
           "fsync_dir", "fsync_path", "json_text", "not_a_regular_file", "read_regular_file", "MAX_TEXT_FILE_BYTES"]

# The most a hand-written text file ggufmtp reads (ladder file, recipe, card, manifest, sidecar) may
# hold: far beyond any real one, so a mistaken path (a model, /dev/zero's like) is one clear error.
MAX_TEXT_FILE_BYTES = 16 * 1024 * 1024


def current_umask() -> int:
    """The process umask, read without changing it (``/proc``), else by the set-and-restore dance."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def fsync_path(path: str | os.PathLike) -> None:
    """fsync a file written by someone else (libllama closes its output without one)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(folder: Path) -> None:
    """fsync a directory so a rename into it is durable (a no-op where the OS refuses)."""
    with contextlib.suppress(OSError):
        fsync_path(folder)


def _target_mode(path: Path) -> int:
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        return 0o666 & ~current_umask()


class _BackgroundDigest:
    """sha256 in a worker thread, fed through a small bounded queue: hashlib releases the GIL on
    large buffers, so hashing overlaps the writes (synthesizing a 72 GB model pays for one, not both)."""

    def __init__(self) -> None:
        self._digest = hashlib.sha256()
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=4)
        self._thread = threading.Thread(target=self._run, name="ggufmtp-sha256", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (part := self._queue.get()) is not None:
            self._digest.update(part)

    def update(self, part: bytes) -> None:
        self._queue.put(part)

    def hexdigest(self) -> str:
        self.close()
        return self._digest.hexdigest()

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()


def _naming(e: OSError, path: Path) -> OSError:
    """The same kind of OSError, naming the target instead of the temp file (``x.md: No space left``)."""
    if e.errno is None:
        return e
    return OSError(e.errno, e.strerror, str(path))  # OSError(errno, ...) builds the matching subclass


def atomic_write_parts(path: str | os.PathLike, parts: Iterable[bytes], *, make_parents: bool = True) -> str:
    """Write the concatenation of ``parts`` to ``path`` atomically; returns its sha256 (hex).

    Parts are hashed in a worker thread while later parts are written, so a part must not be mutated
    after it is yielded (yield fresh bytes, not a reused buffer).

    Missing parent folders are created unless ``make_parents`` is False (then a missing folder is
    ``FileNotFoundError``). Raises ``OSError`` of the kind the OS reported, naming ``path`` (not the
    temp file; callers may wrap it in their own error); the temp file is removed on any failure,
    including KeyboardInterrupt."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if make_parents:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except FileExistsError:  # a file where a folder belongs (on the way to the target)
            raise NotADirectoryError(errno.ENOTDIR, f"a file is in the way of folder {folder}", str(path)) from None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as e:
        raise _naming(e, path) from e
    digest = _BackgroundDigest()
    try:
        os.fchmod(fd, _target_mode(path))
        with os.fdopen(fd, "wb") as fh:
            for part in parts:
                fh.write(part)
                digest.update(part)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)  # replaces a symlink itself, never writes through it
    except BaseException as e:
        digest.close()
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise _naming(e, path) from e
        raise
    fsync_dir(folder)
    return digest.hexdigest()


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    atomic_write_parts(path, (data,))
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def json_text(obj: Any) -> str:
    """The project's JSON file style: 2-space indent, keys in insertion order, a final newline."""
    return json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n"


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json_text(obj))


def not_a_regular_file(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be read as a file (``no such file``, ``is a directory``, ``is a FIFO, not
    a regular file``), or None when it is a regular file. Checked before opening: ``open()`` of a
    FIFO blocks until a writer appears, a device may never end."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "no such file"
    except OSError as e:
        return f"cannot read ({e.strerror or e})"
    return None if stat.S_ISREG(mode) else _not_regular(mode)


def _not_regular(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "is a directory"
    kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a plain file")
    return f"is {kind}, not a regular file"


def read_regular_file(path: str | os.PathLike, max_bytes: int) -> bytes:
    """The bytes of ``path``, which must be a regular file of at most ``max_bytes``: the one reader
    of the small files ggufmtp is handed (receipts, keys, ladder files, recipes, cards, sidecars).

    A FIFO, socket, device (a symlink to ``/dev/zero``) or directory is refused before any read,
    and the file is opened non-blocking and checked again by its descriptor, so nothing can make
    the read wait for a writer or run without end. Raises ``OSError`` naming ``path``, its
    ``strerror`` saying why (``no such file``, ``is a FIFO, not a regular file``, ``larger than
    ...``), for callers to wrap in their own error."""
    problem = not_a_regular_file(path)
    if problem == "no such file":
        raise FileNotFoundError(errno.ENOENT, problem, str(path))
    if problem is not None:
        raise OSError(errno.EISDIR if problem == "is a directory" else errno.EINVAL, problem, str(path))
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        mode = os.fstat(fh.fileno()).st_mode
        if not stat.S_ISREG(mode):  # replaced between the check and the open
            raise OSError(errno.EINVAL, _not_regular(mode), str(path))
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise OSError(errno.EFBIG, f"larger than {max_bytes:,} bytes, too large for what it should be", str(path))
    return data
