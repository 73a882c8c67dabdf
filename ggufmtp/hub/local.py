"""Pulls that need no network: a plain local directory, or (``HF_HUB_OFFLINE=1``) files pulled earlier.

Files on disk are hashed and, when an earlier online pull recorded the Hub's metadata in its
manifest, verified against it: a changed or corrupt local copy is refused
(``errors.HubDigestMismatchError``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

from ..errors import HubDigestMismatchError, HubError, HubManifestError, HubRefusedError
from .files import check_digests, check_safe_paths, complete_shard_selection, group_gguf_shards, hash_file, matches
from .manifest import (
    MANIFEST_NAME,
    HubFile,
    PulledFile,
    PullResult,
    PullSource,
    hub_files_by_path,
    try_read_manifest,
    write_manifest,
)
from .transport import raise_hub_error, storage_folder

__all__ = ["pull_directory", "pull_offline"]

log = logging.getLogger(__name__)

_SKIP_DIRS = {".git", ".cache"}  # .cache/huggingface holds huggingface_hub's local_dir bookkeeping
_WHERE_OFF = "offline mode is on (HF_HUB_OFFLINE=1)"


# ================================================================================================
# offline
# ================================================================================================


def pull_offline(repo_id: str, revision: str | None, include: list[str] | None, ldir: Path | None, cache: Path,
                 endpoint: str, progress: bool, secrets: Sequence[str], *, exclude: list[str] | None = None
                 ) -> PullResult:
    """Re-verify files pulled earlier into ``ldir`` (or the cache) without touching the network."""
    if ldir is not None:
        base, prev, commit = _offline_local_dir(repo_id, revision, ldir)
    else:
        base, prev, commit = _offline_cache(repo_id, revision, cache, endpoint, secrets)
    return pull_directory(base, include, progress, source=PullSource.CACHE, prev=prev, repo_id=repo_id,
                          requested_revision=revision, commit=commit, require_prev_selection=True, exclude=exclude)


def _offline_local_dir(repo_id: str, revision: str | None, base: Path) -> tuple[Path, PullResult, str | None]:
    """(folder, its manifest, its commit) for an offline pull into a --local-dir filled by an earlier pull."""
    prev = try_read_manifest(base)
    if prev is None or prev.repo_id != repo_id:
        raise HubManifestError(f"{_WHERE_OFF} and {base} holds no ggufmtp pull of {repo_id}: unset HF_HUB_OFFLINE "
                               "and pull once with network access")
    commit = prev.resolved_commit
    if revision is not None and revision not in (prev.requested_revision, commit) and not (
            commit and len(revision) >= 7 and commit.startswith(revision)):
        raise HubRefusedError(f"{_WHERE_OFF}: {base} holds {repo_id} @ {commit} (pulled as "
                              f"{prev.requested_revision or 'the default branch'}), which cannot be matched to "
                              f"revision {revision!r} without the network")
    return base, prev, commit


def _offline_cache(repo_id: str, revision: str | None, cache: Path, endpoint: str,
                   secrets: Sequence[str]) -> tuple[Path, PullResult | None, str]:
    """(snapshot folder, its manifest if it matches, commit) for an offline pull from the cache."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=endpoint)
    try:
        commit = str(api.resolve_revision(repo_id, revision=revision, cache_dir=cache, local_files_only=True)
                     .resolved)
    except Exception as e:  # RevisionResolutionError and friends
        raise_hub_error(
            f"{_WHERE_OFF} and {repo_id} @ {revision or 'the default branch'} is not in the cache {cache}: "
            "unset HF_HUB_OFFLINE and pull once with network access", e, secrets)
    base = storage_folder(cache, repo_id) / "snapshots" / commit
    if not base.is_dir():
        raise HubError(f"{_WHERE_OFF} and no files of {repo_id} @ {commit[:12]} are cached in {cache}: unset "
                       "HF_HUB_OFFLINE and pull once with network access")
    prev = try_read_manifest(base)
    if prev is not None and prev.resolved_commit != commit:
        prev = None
    return base, prev, commit


# ================================================================================================
# files on disk
# ================================================================================================


def _walk_files(base: Path) -> list[str]:
    out = []
    for root, dirs, files in os.walk(base):
        rel_root = Path(root).relative_to(base)
        dirs[:] = sorted(d for d in dirs if not (rel_root == Path(".") and d in _SKIP_DIRS))
        for name in files:
            rel = (rel_root / name).as_posix()
            if rel == MANIFEST_NAME or name.endswith(".incomplete") or name.startswith(f".{MANIFEST_NAME}."):
                continue
            if (Path(root) / name).is_file():  # follows symlinks (cache snapshots); skips broken ones
                out.append(rel)
    return sorted(out)


def pull_directory(base: Path, include: list[str] | None, progress: bool, *, source: PullSource,
                   prev: PullResult | None = None, repo_id: str | None = None, requested_revision: str | None = None,
                   commit: str | None = None, require_prev_selection: bool = False,
                   exclude: list[str] | None = None) -> PullResult:
    """Build (and verify, when Hub metadata is known) the manifest of files already on disk."""
    if prev is None and source == PullSource.LOCAL:
        prev = try_read_manifest(base)
        if prev is not None and prev.repo_id:
            repo_id, commit, requested_revision = prev.repo_id, prev.resolved_commit, prev.requested_revision
    expected = hub_files_by_path(prev.hub_files if prev else None)
    offline_prev = prev if require_prev_selection else None
    wanted = _wanted_on_disk(base, include, offline_prev, expected, repo_id, exclude)
    files = _verify_on_disk(base, wanted, expected, progress, repo_id, commit)
    models, _ = group_gguf_shards(f.path for f in files)
    result = PullResult(
        repo_id=repo_id, source=source, requested_revision=requested_revision, resolved_commit=commit,
        endpoint_host=prev.endpoint_host if prev else None, local_dir=base, files=files, gguf_models=models,
        include=include, hub_files=prev.hub_files if prev else None, exclude=exclude,
        card=prev.card if prev else None,
    )
    write_manifest(result)
    return result


def _wanted_on_disk(base: Path, include: list[str] | None, offline_prev: PullResult | None,
                    expected: dict[str, HubFile], repo_id: str | None, exclude: list[str] | None = None) -> list[str]:
    """The files to take from ``base``, in order; every one of them must be there.

    Offline (``offline_prev`` given) the repo is what the Hub said at the recorded commit, and
    without ``include`` the selection defaults to what was pulled last time."""
    present = _walk_files(base)
    where = f"{base}"
    if offline_prev is not None:
        universe = sorted(expected) if expected else present
        candidates = universe if include else [f.path for f in offline_prev.files]
        wanted = {p for p in candidates if matches(p, include, exclude)}
    else:
        universe = present
        wanted = {p for p in present if matches(p, include, exclude)}
    if not wanted:
        raise HubRefusedError(f"no file in {where} matches --include {include} --exclude {exclude}" if include or exclude
                              else f"{where} has no files")
    wanted = complete_shard_selection(wanted, set(universe) | set(present), where)
    check_safe_paths(sorted(wanted), where)
    absent = sorted(p for p in wanted if not (base / p).is_file())
    if absent:
        raise HubError(f"{len(absent)} file(s) of {repo_id or where} are not available locally "
                       f"({', '.join(absent[:5])}{' ...' if len(absent) > 5 else ''}): "
                       "pull them with network access (unset HF_HUB_OFFLINE)")
    return sorted(wanted)


def _verify_on_disk(base: Path, wanted: list[str], expected: dict[str, HubFile], progress: bool,
                    repo_id: str | None, commit: str | None) -> list[PulledFile]:
    """Hash every wanted file; refuse one that differs from the Hub metadata an earlier pull recorded."""
    files = []
    for path in wanted:
        exp = expected.get(path)
        try:
            d = hash_file(base / path, exp, progress)
        except OSError as e:
            raise HubError(f"cannot read {base / path}: {e}") from None
        ok, problem = check_digests(exp, d)
        if problem:
            raise HubDigestMismatchError(
                f"{base / path}: {problem} (recorded by the pull of {repo_id} @ {commit}). The local "
                "copy changed or is corrupt: delete it and pull again with network access",
                path=base / path, expected=exp.sha256 if exp else None, actual=d.sha256)
        files.append(PulledFile(path, d.size, d.sha256, verified=ok))
    unverified = [f.path for f in files if not f.verified]
    if unverified:
        log.info("%d file(s) in %s have no Hub checksum to compare with: %s", len(unverified), base,
                 ", ".join(unverified[:5]))
    return files
