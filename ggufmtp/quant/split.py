"""Split a GGUF into shards that llama.cpp loads as one model: ``--split-max-size``.

The shards are written by the pinned ``llama-gguf-split`` (built with the runtime), not by gguf-py's
writer (``GGUFWriter(split_max_size=...)``): it is the reference writer of the format llama.cpp's
loader reads (every shard carries ``split.no``, ``split.count`` and ``split.tensors.count``, the
first carries all metadata, names come from ``llama_split_path``: ``<prefix>-00001-of-0000N.gguf``)
and what publishers split their files with; it copies the key-value pairs as libggml parsed them,
where gguf-py's writer would re-type every value through Python, and it streams each tensor's bytes;
and it is the same llama.cpp commit as everything else ggufmtp runs.

A size is written as ``llama-gguf-split --split-max-size`` takes it: a whole number with ``M`` or
``G``, decimal (``48G`` = 48 x 10^9 bytes). A shard takes tensors until the next one would bring
its tensor data past the size (the first shard also holds the metadata; a single tensor larger than
the size gets a shard of its own). The default, :data:`DEFAULT_SPLIT_MAX_SIZE`, keeps every shard
under the Hugging Face Hub's 50 GB file limit, and a file no larger than it stays one file.

:func:`split_gguf` is what ``quantize`` (and so ``run`` and every ladder variant) calls on its
staged output; it takes paths only, so anything else that writes a GGUF can split it the same way.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path

from ..constants import SPLIT_TOOL
from ..errors import QuantizeError
from ..files.fsutil import fsync_path
from ..gguf.model import shard_path

__all__ = ["DEFAULT_SPLIT_MAX_SIZE", "HUB_FILE_LIMIT", "NO_SPLIT", "SplitSize", "parse_split_size", "split_gguf"]

HUB_FILE_LIMIT = 50 * 10**9  # the Hub refuses a file larger than 50 GB
_SIZE_RE = re.compile(r"^([1-9][0-9]{0,8})([MG])$")  # llama-gguf-split reads the number with %d
_UNIT = {"M": 10**6, "G": 10**9}
NO_SPLIT = "none"


@dataclasses.dataclass(frozen=True)
class SplitSize:
    """The largest shard to write, as ``llama-gguf-split --split-max-size`` takes it (``text``) and in bytes."""

    text: str

    def __post_init__(self) -> None:
        if not _SIZE_RE.match(self.text):
            raise QuantizeError(f"split size {self.text!r}: give a whole number of decimal megabytes or gigabytes "
                                f"as llama-gguf-split takes it (e.g. 48G, 500M), or {NO_SPLIT!r} for one file")

    @property
    def n_bytes(self) -> int:
        return int(self.text[:-1]) * _UNIT[self.text[-1]]

    def __str__(self) -> str:
        return self.text


DEFAULT_SPLIT_MAX_SIZE = SplitSize("48G")


def parse_split_size(text: str | SplitSize | None) -> SplitSize | None:
    """``--split-max-size``'s value: a :class:`SplitSize`, or None for ``none`` (never split).
    Raises :class:`QuantizeError` naming the value for anything else."""
    if text is None or isinstance(text, SplitSize):
        return text
    text = str(text).strip()
    return None if text.lower() == NO_SPLIT else SplitSize(text.upper())


def split_gguf(src: Path, out: Path, size: SplitSize, tool: Path | None = None) -> list[Path]:
    """Split the GGUF ``src`` into shards named for ``out`` (``out`` less ``.gguf``, then
    ``-00001-of-0000N.gguf``, in ``out``'s folder), each fsynced; returns them in order. ``src`` is
    left as it is. Raises :class:`QuantizeError` naming ``out`` when the tool fails, having removed
    whatever shards it wrote."""
    from ..runtime.build import find_binary

    exe = tool or find_binary(SPLIT_TOOL)
    prefix = out.with_name(out.name.removesuffix(".gguf"))
    cmd = [str(exe), "--split", "--split-max-size", size.text, str(src), str(prefix)]
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", check=False)
    m = re.search(r"^n_split: (\d+)$", proc.stdout, re.M)
    count = int(m.group(1)) if m else 0
    shards = [shard_path(out, i, count) for i in range(1, count + 1)]
    if proc.returncode != 0 or not shards or not all(s.is_file() for s in shards):
        for s in out.parent.glob(f"{prefix.name}-*-of-*.gguf"):
            s.unlink(missing_ok=True)
        tail = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()][-6:]
        raise QuantizeError(f"{out}: {SPLIT_TOOL} --split-max-size {size} failed (status {proc.returncode}):\n  "
                            + "\n  ".join(tail))
    for s in shards:
        fsync_path(s)
    return shards
