"""A large upload in several commits: which files go in which, in what order.

huggingface_hub 2.4's own multi-commit upload (``HfApi.upload_folder`` -> ``_upload_pipeline.
pipelined_upload``: batches committed one after another, ``(part N)`` on the follow-up commits'
messages, resumed by running the same call again) runs only over Xet: it is taken when
``utils.is_xet_available()`` (``hf_xet`` installed, ``HF_HUB_DISABLE_XET`` unset), hands every
non-regular file to an ``hf_xet`` ``XetSession`` upload commit, and lets hf_xet compute each file's
sha256 while it chunks and sends it. Without Xet, ``upload_folder`` is one ``create_commit``, and 2.4
has no ``upload_large_folder`` (nor ``hf upload-large-folder``). So ggufmtp makes the parts itself,
over the same ``create_commit`` (git-LFS) its one-commit upload uses: every file is hashed and
compared with the digest the publish gate approved before the first request, the LFS oid the Hub
checks each upload against is that digest, and each part is one ``create_commit`` with
``parent_commit`` the part before it (another writer in between fails the upload, never interleaves
with it). A rerun after a break resumes: ``create_commit`` drops files the Hub already holds with
the same oid (no commit at all when a part is all there), and the LFS batch API sends nothing for a
stored object.

A part never leaves the repo in a state the release would not serve as verified: a model file goes
up in one part with all its shards, its receipt and signature; MTP sidecars go first (alone they
are no model ``-hf`` loads), the card last (it names every file). Each intermediate listing goes
through the same ``-hf`` resolver check as the final one; where one would serve a model otherwise
than verified, the release goes up in one commit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

__all__ = ["DEFAULT_COMMIT_MAX_BYTES", "plan_parts"]

# at most this many bytes of files per commit by default: a 48G shard (the default split) with its
# receipt fits one part; a release of several such files goes up in several
DEFAULT_COMMIT_MAX_BYTES = 50 * 10**9


class _File(Protocol):
    @property
    def size(self) -> int: ...


F = TypeVar("F", bound=_File)


def _units(ops: Sequence[F], unit_of: Callable[[F], str | None],
           first: Callable[[F], bool]) -> tuple[list[list[F]], list[F]]:
    """The files grouped by ``unit_of`` (a model file set with its receipt and signatures), those
    holding a ``first`` file (the sidecars) first, then in upload order; and the files of no unit
    (the card, a receipt no file claims), which go last."""
    units: dict[str, list[F]] = {}
    last: list[F] = []
    for op in ops:
        key = unit_of(op)
        (units.setdefault(key, []) if key is not None else last).append(op)
    ahead = [k for k in units if any(first(op) for op in units[k])]
    return [units[k] for k in ahead] + [u for k, u in units.items() if k not in ahead], last


def plan_parts(ops: Sequence[F], max_bytes: int | None, unit_of: Callable[[F], str | None],
               first: Callable[[F], bool], problems: Callable[[Sequence[F]], list[str]]) -> list[list[F]]:
    """The commits of an upload, in order: one when the files fit ``max_bytes`` (None: always one),
    else the units (:func:`_units`) packed in order up to ``max_bytes`` a part (a unit larger than
    that alone), the files of no unit in the last. ``problems``: the ``-hf`` check of the repo once
    the files given are committed (the release goes up in one commit when a state between two parts
    fails it)."""
    if max_bytes is None or sum(op.size for op in ops) <= max_bytes:
        return [list(ops)]
    units, last = _units(ops, unit_of, first)
    parts: list[list[F]] = []
    for unit in units:
        if parts and sum(op.size for op in parts[-1]) + sum(op.size for op in unit) <= max_bytes:
            parts[-1] += unit
        else:
            parts.append(list(unit))
    if not parts:
        return [list(ops)]
    parts[-1] += last
    done: list[F] = []
    for part in parts[:-1]:
        done += part
        if problems(done):
            return [list(ops)]
    return parts
