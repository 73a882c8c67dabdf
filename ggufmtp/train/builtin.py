"""``builtin:tiny-qwen35moe-trained``: a model trained here once, converted, cached by content.

The ``tiny`` preset is trained on the CPU (about two minutes on two cores, one PyTorch thread: at
these widths a second thread costs more in synchronisation than it computes), exported in Qwen3.6's
layout and converted with ggufmtp's own convert path (the pinned converter), the same run a user
makes with ``ggufmtp train``. ``builtin:tiny-qwen35moe-trained-initial-head`` is the same trunk
with the head at its initial weights: the untrained head a trained one is measured against.

Cache: ``cache_root()/builtin/trained/<preset>-<key12>/`` where the key hashes the trainer's
version, the preset (model, tokenizer, data settings, schedule, seed) and the corpus's digest
(:meth:`~ggufmtp.train.config.TrainPreset.key`); ``train.json`` is written last, so a directory
without it is an interrupted run and is trained again. Concurrent callers wait on a lock file
instead of training twice. Each file inside is written atomically (the project's atomic writer;
the converter's output is staged and renamed by :func:`ggufmtp.hfconvert.convert.convert`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import TrainError
from ..jsontypes import JsonObject
from ..runtime.build import cache_root
from .config import TrainPreset, preset
from .data import build_corpus
from .trainer import INITIAL_GGUF, TRAINED_GGUF, TrainOptions, train

__all__ = ["TRAINED_BUILTINS", "TrainedModel", "is_trained_builtin", "ensure_trained", "trained_builtin_path",
           "default_cache_dir"]

# builtin name -> (preset, which head's GGUF)
TRAINED_BUILTINS: dict[str, tuple[str, str]] = {
    "tiny-qwen35moe-trained": ("tiny", "trained"),
    "tiny-qwen35moe-trained-initial-head": ("tiny", "initial"),
}


@dataclass(frozen=True)
class TrainedModel:
    """A trained preset in the cache: its directory, both GGUFs and its ``train.json`` record."""

    directory: Path
    gguf: Path
    initial_gguf: Path
    record: JsonObject  # train.json, as read
    cached: bool  # found in the cache (nothing was trained by this call)


def default_cache_dir() -> Path:
    return cache_root() / "builtin" / "trained"


def is_trained_builtin(name: str) -> bool:
    return name.removeprefix("builtin:") in TRAINED_BUILTINS


def _complete(directory: Path) -> TrainedModel | None:
    record_path = directory / "train.json"
    if not (record_path.is_file() and (directory / TRAINED_GGUF).is_file() and (directory / INITIAL_GGUF).is_file()):
        return None
    try:
        record = json.loads(record_path.read_text())
    except ValueError:
        return None
    return TrainedModel(directory, directory / TRAINED_GGUF, directory / INITIAL_GGUF, record, cached=True)


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_trained(which: str | TrainPreset, cache_dir: Path | None = None, *, progress: bool = False,
                   threads: int | None = None) -> TrainedModel:
    """The cached training of preset ``which``, trained (and converted) first when absent."""
    p = preset(which)
    corpus = build_corpus(p.data)
    directory = Path(cache_dir or default_cache_dir()) / f"{p.name}-{p.key(corpus.digest)[:12]}"
    if (done := _complete(directory)) is not None:
        return done
    with _locked(directory):
        if (done := _complete(directory)) is not None:  # another process trained it while we waited
            return done
        if progress:
            print(f"training {p.name} ({p.schedule.steps} steps, once; cached in {directory})", file=sys.stderr)
        res = train(TrainOptions(out_dir=directory, preset=p, threads=threads, progress=progress))
    if res.gguf is None or res.initial_gguf is None or _complete(directory) is None:
        raise TrainError(f"{directory}: training finished without both GGUFs")
    return TrainedModel(directory, res.gguf, res.initial_gguf, res.to_dict(), cached=False)


def trained_builtin_path(name: str, cache_dir: Path | None = None, progress: bool = False) -> Path:
    """The GGUF of trained built-in model ``name`` (``builtin:NAME`` or ``NAME``)."""
    key = name.removeprefix("builtin:")
    if key not in TRAINED_BUILTINS:
        raise TrainError(f"unknown trained built-in model {name!r}; known: {', '.join(sorted(TRAINED_BUILTINS))}")
    which, head = TRAINED_BUILTINS[key]
    made = ensure_trained(which, cache_dir, progress=progress)
    return made.gguf if head == "trained" else made.initial_gguf
