"""How a corpus is run through a model to collect importance statistics: :class:`ImatrixSettings`
(llama-imatrix's own options, which the MTP collector takes too), checked when built, and
:class:`CollectMode`, which layers the MTP collector collects."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ..errors import ImatrixError
from .entries import DEFAULT_CHUNK_SIZE

__all__ = ["CollectMode", "ImatrixSettings"]


@dataclass(frozen=True)
class ImatrixSettings:
    """How a corpus is run through a model to collect statistics: llama-imatrix's own options,
    checked once, when built (ImatrixError naming the first bad one).

    ``chunks``: at most this many chunks (None: all the corpus holds); ``ctx_size``: tokens per
    chunk (``-c``); ``gpu_layers`` / ``threads``: llama.cpp's ``-ngl`` / ``-t`` (None: its defaults).
    """

    chunks: int | None = None
    ctx_size: int = DEFAULT_CHUNK_SIZE
    gpu_layers: int | str | None = None
    threads: int | None = None

    def __post_init__(self) -> None:
        for name in ("chunks", "ctx_size", "threads"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ImatrixError(f"{name} must be at least 1, got {value}")


class CollectMode(enum.StrEnum):
    """Which layers the MTP collector (:mod:`ggufmtp.imatrix.mtp`) collects. Compares equal to its value."""

    HEAD = "head"  # the MTP block only
    TRUNK = "trunk"  # the trunk layers only: the proof mode, whose numbers equal llama-imatrix's
    BOTH = "both"  # the trunk layers and the MTP block in one pass (llama-imatrix's file plus the head's entries)
