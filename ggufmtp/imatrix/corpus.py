"""Text corpora for calibration (``imatrix compute``) and evaluation (``eval``).

A corpus is a UTF-8 text file, named either by its path or as ``builtin:NAME`` for one that ships
with ggufmtp (``ggufmtp/data/corpora/NAME.txt``, text the project wrote itself: code, math, prose
and chat). :func:`resolve_corpus` turns a reference into a :class:`Corpus` (path, name, sha256,
size); :func:`check_corpus_text` refuses, with one error naming the file, what llama.cpp's tools
would choke on or silently mis-read: a missing or empty file, binary data, and text shorter than
the tokens one run needs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import CorpusError
from ..files.fsutil import not_a_regular_file
from ..files.hashing import sha256_file

__all__ = ["BUILTIN_CORPORA", "BUILTIN_CORPUS_PREFIX", "DEFAULT_CORPUS", "Corpus", "builtin_corpus_path",
           "check_corpus_text", "min_tokens_for", "resolve_corpus"]

BUILTIN_CORPUS_PREFIX = "builtin:"
CORPORA_DIR = Path(__file__).resolve().parent.parent / "data" / "corpora"
BUILTIN_CORPORA = ("calib-v1",)
DEFAULT_CORPUS = BUILTIN_CORPUS_PREFIX + BUILTIN_CORPORA[0]
_SNIFF_BYTES = 1 << 16  # where a NUL byte betrays a binary file (as git and grep look)


@dataclass(frozen=True)
class Corpus:
    """A resolved corpus. ``name`` is ``builtin:NAME`` or the file's name; ``bytes`` its size."""

    path: Path
    name: str
    sha256: str
    bytes: int

    @property
    def builtin(self) -> bool:
        return self.name.startswith(BUILTIN_CORPUS_PREFIX)

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "name": self.name, "sha256": self.sha256, "bytes": self.bytes}


def builtin_corpus_path(name: str) -> Path:
    """The file of built-in corpus ``name`` (without the ``builtin:`` prefix)."""
    if name not in BUILTIN_CORPORA:
        raise CorpusError(f"unknown built-in corpus builtin:{name} (available: "
                          + ", ".join(BUILTIN_CORPUS_PREFIX + n for n in BUILTIN_CORPORA) + ")")
    path = CORPORA_DIR / f"{name}.txt"
    if not path.is_file():  # a broken install, not a user error, but say which file
        raise CorpusError(f"built-in corpus builtin:{name} is missing from the installation ({path})")
    return path


def resolve_corpus(ref: str | os.PathLike) -> Corpus:
    """``builtin:NAME`` or a path to a text file, as a :class:`Corpus` (hashed).

    Only checks that the file exists and is a regular file; :func:`check_corpus_text` checks the text.
    """
    text_ref = os.fspath(ref)
    if isinstance(ref, str) and text_ref.startswith(BUILTIN_CORPUS_PREFIX):
        name = text_ref[len(BUILTIN_CORPUS_PREFIX):]
        path = builtin_corpus_path(name)
        label = text_ref
    else:
        path = Path(text_ref)
        label = path.name
        problem = not_a_regular_file(path)
        if problem is not None:
            raise CorpusError(f"corpus file {path}: {problem}")
    try:
        digest = sha256_file(path)
        size = path.stat().st_size
    except OSError as e:
        raise CorpusError(f"cannot read corpus file {path}: {e.strerror or e}") from None
    return Corpus(path=path.resolve(), name=label, sha256=digest, bytes=size)


def min_tokens_for(ctx_size: int, *, chunks: int = 1) -> int:
    """Tokens a corpus needs for ``chunks`` chunks of ``ctx_size``. llama-imatrix and
    llama-perplexity refuse fewer than two chunks' worth (``tokens < 2 * n_ctx``)."""
    return max(2, chunks) * ctx_size


def _read_text(corpus: Corpus) -> str:
    try:
        data = corpus.path.read_bytes()
    except OSError as e:
        raise CorpusError(f"cannot read corpus file {corpus.path}: {e.strerror or e}") from None
    if not data:
        raise CorpusError(f"corpus file {corpus.path} is empty")
    nul = data.find(b"\0", 0, _SNIFF_BYTES)
    if nul >= 0:
        raise CorpusError(f"corpus file {corpus.path} is binary, not text (NUL byte at offset {nul})")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CorpusError(f"corpus file {corpus.path} is not UTF-8 text (invalid byte at offset {e.start})") from None
    if not text.strip():
        raise CorpusError(f"corpus file {corpus.path} holds only whitespace")
    return text


def check_corpus_text(corpus: Corpus, *, min_tokens: int | None = None, n_tokens: int | None = None) -> str:
    """Refuse a corpus that is empty, binary, not UTF-8, or shorter than ``min_tokens``; return its text.

    ``n_tokens`` is the count from the model's tokenizer when the caller has it. Without it the size
    in bytes is the bound: byte-level BPE and SentencePiece with byte fallback never make more tokens
    than bytes, so a file of fewer bytes than ``min_tokens`` is certainly too short.
    """
    text = _read_text(corpus)
    if min_tokens is None:
        return text
    if n_tokens is not None and n_tokens < min_tokens:
        raise CorpusError(f"corpus file {corpus.path} is too short: it tokenizes to {n_tokens} tokens, "
                          f"{min_tokens} are needed")
    if n_tokens is None and corpus.bytes < min_tokens:
        raise CorpusError(f"corpus file {corpus.path} is too short: {corpus.bytes} bytes cannot make the "
                          f"{min_tokens} tokens needed")
    return text


def check_later_inputs(imatrix: str | os.PathLike | None, corpora: Sequence[str | os.PathLike | None]) -> None:
    """What a run or a ladder reads in a later stage, checked before any work (one error, not a
    failure after quantizing): the imatrix file, in :func:`~ggufmtp.imatrix.format.read_imatrix`'s
    words, and each corpus given (the imatrix's, the eval's), as :func:`resolve_corpus` and
    :func:`check_corpus_text` read it."""
    from .format import refuse_unreadable_imatrix

    if imatrix:
        refuse_unreadable_imatrix(imatrix)
    for ref in corpora:
        if ref:
            check_corpus_text(resolve_corpus(ref))
