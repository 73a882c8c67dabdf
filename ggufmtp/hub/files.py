"""Which files a pull takes and how each is checked: include patterns, safe paths, GGUF shards, digests."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path, PurePosixPath, PureWindowsPath

from ..errors import HubRefusedError
from ..files.hashing import FileDigests, file_digests
from .manifest import HubFile, PulledModel

__all__ = ["COMMIT_RE", "HASH_PROGRESS_MIN", "SHA256_RE", "check_digests", "check_safe_paths",
           "complete_shard_selection", "group_gguf_shards", "hash_file", "matches", "normalize_include"]

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
HASH_PROGRESS_MIN = 256 * 1024 * 1024  # show a hashing bar only for files this big
_SHARD_RE = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")


# ================================================================================================
# Selection
# ================================================================================================


def normalize_include(include: str | Sequence[str] | None) -> list[str] | None:
    """``include`` as a list of non-empty patterns, or None (everything)."""
    if include is None:
        return None
    if isinstance(include, str):
        include = [include]
    pats = [p for p in include if p]
    return pats or None


def matches(path: str, include: list[str] | None, exclude: list[str] | None = None) -> bool:
    """``path`` is selected by huggingface_hub's ``allow_patterns=include`` and
    ``ignore_patterns=exclude`` (fnmatch, ``*`` crosses ``/``, a pattern ending in ``/`` takes the
    folder): it matches one of ``include`` (or there are none) and none of ``exclude``."""
    from huggingface_hub.utils import filter_repo_objects

    return any(True for _ in filter_repo_objects([path], allow_patterns=include, ignore_patterns=exclude))


def _unsafe_reason(path: str) -> str | None:
    """Why a repo filename cannot be written under a directory, or None when it is safe."""
    if not path or "\0" in path:
        return "empty or NUL in the name"
    if path.startswith(("/", "\\")) or PurePosixPath(path).is_absolute() or PureWindowsPath(path).anchor:
        return "absolute path"
    if ".." in path.replace("\\", "/").split("/"):
        return "contains a '..' component"
    return None


def check_safe_paths(paths: Iterable[str], where: str) -> None:
    """Refuse file names that would land outside the download directory."""
    bad = [(p, r) for p in paths if (r := _unsafe_reason(p))]
    if bad:
        listing = ", ".join(f"{p!r} ({r})" for p, r in bad[:5])
        raise HubRefusedError(
            f"{where} contains file names that would escape the download directory: {listing}. Refusing to pull; "
            "exclude them with --include or ask the repo owner to rename them")


# ================================================================================================
# Split GGUF models
# ================================================================================================


def group_gguf_shards(paths: Iterable[str]) -> tuple[list[PulledModel], dict[str, list[str]]]:
    """Group ``.gguf`` paths into models: ``x-00001-of-00003.gguf`` .. ``-00003-`` form one model.

    Returns ``(models, missing)``: ``missing`` maps a split model's entry (its first shard name,
    even when that shard itself is absent) to the shard names absent from ``paths``.
    """
    groups: dict[tuple[str, int], dict[int, str]] = {}
    singles: list[str] = []
    for p in sorted(set(paths)):
        if not p.lower().endswith(".gguf"):
            continue
        m = _SHARD_RE.match(p)
        if m and 1 <= int(m["index"]) <= int(m["count"]):
            groups.setdefault((m["stem"], int(m["count"])), {})[int(m["index"])] = p
        else:
            singles.append(p)
    models = [PulledModel(entry=p, shards=(p,)) for p in singles]
    missing: dict[str, list[str]] = {}
    for (stem, count), shards in sorted(groups.items()):
        names = [f"{stem}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]
        absent = [n for i, n in enumerate(names, 1) if i not in shards]
        if absent:
            missing[names[0]] = absent
        else:
            models.append(PulledModel(entry=names[0], shards=tuple(names)))
    models.sort(key=lambda m: m.entry)
    return models, missing


def _shard_key(p: str) -> tuple[str, str] | None:
    m = _SHARD_RE.match(p)
    return (m["stem"], m["count"]) if m else None


def complete_shard_selection(selected: set[str], available: set[str], where: str) -> set[str]:
    """Add the sibling shards of any selected shard; refuse when a selected split model is incomplete."""
    out = set(selected)
    models, missing = group_gguf_shards(available)
    for m in models:
        if out & set(m.shards):
            out |= set(m.shards)
    selected_keys = {_shard_key(p) for p in out} - {None}
    problems = [f"{entry} (missing {', '.join(absent)})" for entry, absent in missing.items()
                if _shard_key(entry) in selected_keys]
    if problems:
        raise HubRefusedError(f"split GGUF model incomplete in {where}: " + "; ".join(problems) +
                              ". All shards of a split model are needed: re-upload or pull the missing shard(s)")
    return out


# ================================================================================================
# Digests
# ================================================================================================


def check_digests(exp: HubFile | None, d: FileDigests) -> tuple[bool, str | None]:
    """(verified, mismatch message). Unverifiable (no metadata) -> (False, None)."""
    if exp is None:
        return False, None
    if exp.size is not None and exp.size != d.size:
        hub_id = f"sha256 {exp.sha256}" if exp.sha256 else f"git blob id {exp.git_oid}"
        return False, (f"size mismatch: the Hub says {exp.size} bytes ({hub_id}), the file has {d.size} bytes "
                       f"(sha256 {d.sha256})")
    if exp.sha256:
        if exp.sha256 != d.sha256:
            return False, f"sha256 mismatch: the Hub's LFS metadata says {exp.sha256}, the file hashes to {d.sha256}"
        return True, None
    if exp.git_oid and d.git_sha1:
        if exp.git_oid != d.git_sha1:
            return False, (f"git blob id mismatch: the Hub says {exp.git_oid}, the file hashes to {d.git_sha1} "
                           f"(sha256 {d.sha256})")
        return True, None
    return False, None


def hash_file(path: Path, exp: HubFile | None, progress: bool) -> FileDigests:
    """Hash ``path`` as ``exp`` needs it (the git blob id too for regular, non-LFS files)."""
    git = exp is not None and not exp.sha256 and bool(exp.git_oid)
    size = path.stat().st_size
    return file_digests(path, git_blob=git, progress=progress and size >= HASH_PROGRESS_MIN)
