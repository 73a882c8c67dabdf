"""The base-logits file of ``llama-perplexity --kl-divergence-base``: its size, its header, and the
cache that keeps one per (base model, corpus, context, chunks).

Format (``tools/perplexity/perplexity.cpp`` at 0c1e570, little-endian): ``"_logits_"`` (8 bytes),
``uint32 n_ctx``, ``int32 n_vocab``, ``int32 n_chunk``, ``int32 tokens[n_ctx * n_chunk]``, then per
chunk ``(n_ctx - 1 - n_ctx/2)`` rows of ``nv = 2*((n_vocab+1)/2) + 4`` uint16 (the log-probabilities
of the second half of the window, quantized to 16 bits, plus min/scale words). So the size is known
from the header alone, which is how a truncated file is told from a whole one: ``--kl-divergence``
itself reads a short file, prints "failed reading log-probs" and still exits 0.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import struct
from pathlib import Path

from ..errors import LogitsFileError
from ..files.memo import JsonMemo
from ..runtime.build import cache_root

MAGIC = b"_logits_"
HEADER = struct.Struct("<8sIii")


def row_words(n_vocab: int) -> int:
    """uint16 words per token row (``nv`` in perplexity.cpp)."""
    return 2 * ((n_vocab + 1) // 2) + 4


def logits_file_bytes(n_ctx: int, n_vocab: int, n_chunk: int) -> int:
    """Exact size of the base-logits file for ``n_chunk`` chunks of ``n_ctx`` tokens."""
    scored = n_ctx - 1 - n_ctx // 2
    return HEADER.size + 4 * n_ctx * n_chunk + 2 * n_chunk * scored * row_words(n_vocab)


@dataclasses.dataclass(frozen=True)
class LogitsHeader:
    """What a base-logits file says it holds."""

    n_ctx: int
    n_vocab: int
    n_chunk: int

    @property
    def expected_bytes(self) -> int:
        return logits_file_bytes(self.n_ctx, self.n_vocab, self.n_chunk)


def read_logits_header(path: Path) -> LogitsHeader:
    """The header of a base-logits file; LogitsFileError when it is not one."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(HEADER.size)
    except OSError as e:
        raise LogitsFileError(f"{path}: cannot read the base-logits file ({e.strerror or e})") from None
    if len(raw) < HEADER.size:
        raise LogitsFileError(f"{path}: truncated base-logits file ({len(raw)} bytes, not even a header); "
                              "delete it and rerun to recompute the base logits")
    magic, n_ctx, n_vocab, n_chunk = HEADER.unpack(raw)
    if magic != MAGIC or n_ctx <= 0 or n_vocab <= 0 or n_chunk <= 0:
        raise LogitsFileError(f"{path}: not a llama-perplexity base-logits file (magic {magic!r}, n_ctx {n_ctx}, "
                              f"n_vocab {n_vocab}, n_chunk {n_chunk})")
    return LogitsHeader(n_ctx, n_vocab, n_chunk)


def check_logits_file(path: Path, n_vocab: int | None = None) -> LogitsHeader:
    """Refuse a base-logits file whose size is not the one its header implies (truncated or padded),
    or whose vocabulary is not ``n_vocab``."""
    head = read_logits_header(path)
    have = path.stat().st_size
    if have != head.expected_bytes:
        what = "truncated" if have < head.expected_bytes else "longer than its header says"
        raise LogitsFileError(f"{path}: {what} base-logits file ({have:,} bytes; its header "
                              f"(n_ctx {head.n_ctx}, n_vocab {head.n_vocab}, {head.n_chunk} chunks) needs "
                              f"{head.expected_bytes:,}); delete it and rerun to recompute the base logits")
    if n_vocab is not None and head.n_vocab != n_vocab:
        raise LogitsFileError(f"{path}: base logits over a vocabulary of {head.n_vocab} tokens, the model has "
                              f"{n_vocab}")
    return head


def refuse_without_room(folder: Path, need: int) -> None:
    """LogitsFileError when ``folder``'s file system has less than ``need`` bytes free (plus 1%)."""
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if free < need * 1.01:
        raise LogitsFileError(f"{folder}: the base logits need {need:,} bytes ({need / 2**30:.2f} GiB) and the disk "
                              f"has {free:,} free; free space, point $GGUFMTP_CACHE elsewhere, or use fewer --chunks")


@dataclasses.dataclass(frozen=True)
class CacheKey:
    """What a cached base-logits file depends on."""

    base_sha256: str
    corpus_sha256: str
    ctx_size: int
    chunks: int  # -1 = all the corpus holds
    commit: str

    def digest(self) -> str:
        blob = json.dumps(dataclasses.asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:24]


def cache_dir() -> Path:
    return cache_root() / "kld"


def tokens_memo() -> JsonMemo:
    """Token counts of corpora, by (base sha256, corpus sha256, llama.cpp commit): see eval."""
    return JsonMemo(cache_dir() / "tokens.json")


def cached_paths(key: CacheKey) -> tuple[Path, Path]:
    """(logits file, its JSON record) for ``key`` in the ggufmtp cache."""
    stem = cache_dir() / key.digest()
    return stem.with_suffix(".logits"), stem.with_suffix(".json")
