"""The options of :func:`ggufmtp.quality.eval.evaluate` (``ggufmtp eval``, ``run --eval``, a
ladder's ``[eval]`` table): :class:`EvalOptions`, one frozen record, checked once, when built. A
module of its own, light to import, so that the command line, :class:`~ggufmtp.run_options.RunOptions`
and the ladder read its defaults without loading the evaluation."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields

from ..errors import QualityError
from ..imatrix.corpus import DEFAULT_CORPUS
from ..jsontypes import JsonObject

__all__ = ["DEFAULT_CTX", "MIN_CTX", "EvalOptions"]

#: eval's defaults, written once: the API, the command line, ``run --eval`` and the ladder read them here
DEFAULT_CTX = 512
MIN_CTX = 16  # tokens per chunk: llama-perplexity scores the second half of each


def _count(name: str, v: object, minimum: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise QualityError(f"{name} {v!r}: must be an integer of at least {minimum}")


@dataclass(frozen=True)
class EvalOptions:
    """What :func:`~ggufmtp.quality.eval.evaluate` measures with (the defaults are ``ggufmtp eval``'s).

    ``corpus``: the evaluation text, a UTF-8 file or ``builtin:NAME``; ``ctx_size``: tokens per
    chunk (llama-perplexity ``-c``; the second half of each chunk is scored); ``chunks``: the first
    N chunks only (None: every chunk the corpus makes). ``gpu_layers``, ``threads``: llama-perplexity's
    ``--n-gpu-layers`` and ``--threads``; ``llama_cpp_bin``: its binary or directory (default: the
    built runtime's). QualityError naming the first bad setting; a corpus that does not exist or
    is too short is refused by ``evaluate`` (CorpusError), before any llama-perplexity process."""

    corpus: str | os.PathLike = DEFAULT_CORPUS
    ctx_size: int = DEFAULT_CTX
    chunks: int | None = None
    gpu_layers: int | str | None = None
    threads: int | None = None
    llama_cpp_bin: str | os.PathLike | None = None

    def __post_init__(self) -> None:
        _count("ctx_size", self.ctx_size, MIN_CTX)
        for name in ("chunks", "threads"):
            if getattr(self, name) is not None:
                _count(name, getattr(self, name), 1)

    def to_dict(self) -> JsonObject:
        """Every setting, in JSON form (paths as strings): what a cached eval stage is keyed by."""
        return {f.name: (str(v) if isinstance(v := getattr(self, f.name), os.PathLike) else v) for f in fields(self)}
