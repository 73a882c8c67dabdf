"""Pull a checkpoint from the Hugging Face Hub (or index a local directory), verified, with a manifest.

Everything on the wire is ``huggingface_hub`` (written against 2.4): ``HfApi.resolve_revision``,
``list_repo_tree`` and ``snapshot_download`` (its worker threads; the selection is its
``allow_patterns``/``ignore_patterns`` matcher, ``filter_repo_objects``). ggufmtp adds what a
supply chain needs on top:

* **pinning** - the requested revision is resolved to a commit sha once; the listing and every
  download use that sha, so a branch that moves mid-pull cannot mix two versions;
* **verification** - every pulled file is hashed and compared with the Hub's own metadata (the LFS
  ``sha256`` for LFS files, the git blob id for regular files). A mismatch is refused
  (``errors.HubDigestMismatchError``) and the bad download removed, but only when ggufmtp created
  it: files already in ``local_dir`` that ggufmtp did not pull are never overwritten or deleted;
* **a manifest** (``manifest.MANIFEST_NAME``, see ``hub/manifest.py``) that lets a later offline pull
  (``HF_HUB_OFFLINE=1``) verify the cached files without the network.

Resuming: huggingface_hub 2.4 resumes an interrupted plain-HTTP download *within the same call*
(``http_get`` retries with ``Range: bytes=<written>-`` up to 5 times without progress). Its
temporary ``<etag>.<uuid>.incomplete`` file is process-unique and deleted on failure, so a pull
that is killed restarts that file from zero; files completed earlier are not downloaded again.
Xet downloads (used when the Hub advertises Xet and ``hf_xet`` is installed) go through ``hf_xet``
instead; they are not exercised by the tests (the local fake Hub speaks plain HTTP/LFS only).

Why the check is not ``HfApi.verify_repo_checksums`` (#42; ``benchmarks/pull_vs_snapshot.py``,
figures in ``benchmarks/README.md``): it lists the repo again and reports mismatches, not digests,
so the manifest's sha256 of every regular file would need a second read; it hashes the files one
after another and reads a regular file whole into memory for its git blob id; it cannot run
offline (it lists the Hub) nor tell a download this pull made from a user's file. ggufmtp checks
the downloads against the listing it pinned, a few files at once, with the one hasher.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._version import __version__
from ..errors import HubDigestMismatchError, HubError, HubHTTPError, HubRefusedError
from ..files.digest_cache import DigestCache
from ..files.hashing import FileDigests
from ..progress import is_disabled as progress_disabled
from .files import (
    COMMIT_RE,
    check_digests,
    check_safe_paths,
    complete_shard_selection,
    group_gguf_shards,
    hash_file,
    matches,
    normalize_include,
)
from .local import pull_directory, pull_offline
from .manifest import MANIFEST_NAME, HubFile, PulledCard, PulledFile, PullResult, PullSource, try_read_manifest, write_manifest
from .transport import (
    HubErrorContext,
    SilentBar,
    cache_dir,
    guard_secrets,
    host,
    hub_errors,
    is_offline,
    resolve_endpoint,
    storage_folder,
)

__all__ = ["pull"]

log = logging.getLogger(__name__)


def check_source_repo(repo_id: str) -> None:
    """HubRefusedError unless ``repo_id`` can be a Hub repo id, for a source that is not a local folder
    (``pull``, ``convert``): said before any request, not as the Hub client's error mid-way."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise HubRefusedError(f"{repo_id!r} is neither an existing directory nor a valid Hub repo id: {e}") from None

@dataclass
class _HubPull:
    """One pull from the Hub, its inputs checked and normalised in ``__post_init__``."""

    repo_id: str
    revision: str | None
    include: list[str] | None
    local_dir: Path | None
    token: str | bool | None
    progress: bool
    endpoint: str | None = None  # resolved to the effective endpoint
    cache: Path | None = None  # resolved to the effective cache directory
    exclude: list[str] | None = None
    secrets: Sequence[str] = field(default_factory=tuple)  # set while the secrets guard is active

    def __post_init__(self) -> None:
        check_source_repo(self.repo_id)
        self.endpoint = resolve_endpoint(self.endpoint)
        self.cache = cache_dir(self.cache)
        self.local_dir = Path(self.local_dir).expanduser().resolve() if self.local_dir is not None else None

    @property
    def errs(self) -> HubErrorContext:
        """The context ``hub_errors`` needs for this pull (its endpoint resolved in ``__post_init__``)."""
        return HubErrorContext(repo_id=self.repo_id, endpoint=self.endpoint, secrets=self.secrets,
                               revision=self.revision)


def pull(
    repo_id: str,
    *,
    revision: str | None = None,
    include: str | Sequence[str] | None = None,
    exclude: str | Sequence[str] | None = None,
    local_dir: str | os.PathLike | None = None,
    token: str | bool | None = None,
    progress: bool = True,
    endpoint: str | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> PullResult:
    """Download (or re-verify) a model repo pinned to one commit, verify every file, write the manifest.

    ``repo_id`` may also be a local directory: the manifest is then built from the files in it
    (verified against the Hub's checksums if an earlier pull left a manifest there).

    ``include``, ``exclude``: huggingface_hub's ``allow_patterns`` and ``ignore_patterns``
    (fnmatch patterns matched against repo paths, ``*`` crosses ``/``). Selecting any shard of a
    split GGUF selects all of them; a missing shard is an error naming it.
    ``local_dir``: where to put the files; default: the Hugging Face cache (the manifest then sits
    in the cache's snapshot folder). ``endpoint``: default ``$HF_ENDPOINT`` or huggingface.co.
    With ``HF_HUB_OFFLINE=1`` nothing touches the network: files come from the cache / local_dir
    and are checked against the Hub metadata recorded by the last online pull.
    """
    include, exclude = normalize_include(include), normalize_include(exclude)
    directory = _as_local_directory(repo_id, revision, local_dir)
    if directory is not None:
        return pull_directory(directory, include, progress, source=PullSource.LOCAL, exclude=exclude)
    req = _HubPull(repo_id, revision, include, local_dir, token, progress, endpoint, cache_dir, exclude=exclude)
    with guard_secrets(token) as secrets:
        req.secrets = secrets
        if is_offline():
            return pull_offline(req.repo_id, req.revision, req.include, req.local_dir, req.cache, req.endpoint,
                                req.progress, req.secrets, exclude=req.exclude)
        return _pull_online(req)


def _as_local_directory(repo_id: str, revision: str | None, local_dir: str | os.PathLike | None) -> Path | None:
    """``repo_id`` as an existing directory, None when it names a Hub repo; refuses a path that is neither."""
    as_path = Path(os.path.expanduser(str(repo_id)))
    looks_like_path = str(repo_id).startswith((".", "/", "~")) or "\\" in str(repo_id)
    if as_path.is_dir():
        if revision is not None:
            raise HubRefusedError(f"{repo_id} is a local directory: --revision only applies to Hub repos")
        if local_dir is not None and Path(local_dir).resolve() != as_path.resolve():
            raise HubRefusedError(f"{repo_id} is a local directory: files are used in place, drop --local-dir")
        return as_path.resolve()
    if looks_like_path:
        raise HubRefusedError(f"{repo_id}: no such directory (and not a Hub repo id of the form namespace/name)")
    return None


# ================================================================================================
# online: pin, list, select, check what is there, download and verify, record
# ================================================================================================


def _pull_online(req: _HubPull) -> PullResult:
    from huggingface_hub import HfApi

    api = HfApi(endpoint=req.endpoint, token=req.token, library_name="ggufmtp", library_version=__version__)
    commit = _pin_commit(api, req)
    hub = _list_commit(api, req, commit)
    where = f"{req.repo_id} @ {commit[:12]}"
    order = _select(hub, req.include, where, req.exclude)
    reused = _check_preexisting(req.local_dir, order, hub, where, req.progress) if req.local_dir is not None else {}
    base_dir, files = _Downloads(req, commit, hub, where).run(order, reused)
    models, _ = group_gguf_shards(order)
    result = PullResult(
        repo_id=req.repo_id, source=PullSource.HUB, requested_revision=req.revision, resolved_commit=commit,
        endpoint_host=host(req.endpoint), local_dir=base_dir, files=files, gguf_models=models,
        include=req.include, hub_files=[hub[p] for p in sorted(hub)], exclude=req.exclude,
        card=_read_card(api, req, commit) if "README.md" in hub else None,
    )
    write_manifest(result)
    return result


def _read_card(api: Any, req: _HubPull, commit: str) -> PulledCard | None:
    """What the repo's model card says of the model at ``commit`` (the Hub's parse of its README's
    YAML, ``cardData``): the upstream ``base_model`` of a repo that is itself a conversion or a
    quantization, and the license. The release's card names that upstream model, so the Hub's model
    tree lists the release under it, not under the repo pulled."""
    with hub_errors(f"reading the model card of {req.repo_id} @ {commit[:12]}", **req.errs):
        info = api.model_info(req.repo_id, revision=commit)
    data = getattr(info, "card_data", None)
    return PulledCard.of(data.to_dict() if data is not None else None)


def _pin_commit(api: Any, req: _HubPull) -> str:
    """One commit sha for the whole pull (also caches refs/<rev> for later offline pulls)."""
    rev_label = req.revision or "the default branch"
    with hub_errors(f"resolving {req.repo_id} @ {rev_label}", **req.errs):
        resolved = api.resolve_revision(req.repo_id, revision=req.revision, cache_dir=req.cache)
    commit = str(getattr(resolved, "resolved", resolved))
    if not COMMIT_RE.match(commit):
        raise HubHTTPError(f"{host(req.endpoint)} resolved {req.repo_id} @ {rev_label} to {commit!r}, not a commit "
                           "sha; check HF_ENDPOINT points at a Hugging Face Hub")
    return commit


def _list_commit(api: Any, req: _HubPull, commit: str) -> dict[str, HubFile]:
    """Every file *at that commit*, with the Hub's checksums."""
    from huggingface_hub.hf_api import RepoFile

    with hub_errors(f"listing {req.repo_id} @ {commit[:12]}", **req.errs):
        tree = [e for e in api.list_repo_tree(req.repo_id, recursive=True, revision=commit)
                if isinstance(e, RepoFile)]
    return {e.path: HubFile(e.path, e.size, e.lfs.sha256 if e.lfs is not None else None, e.blob_id) for e in tree}


def _select(hub: dict[str, HubFile], include: list[str] | None, where: str, exclude: list[str] | None = None
            ) -> list[str]:
    """The repo paths to pull, in order: those matching ``include`` and not ``exclude``, with whole
    split models, all safe."""
    if MANIFEST_NAME in hub:
        log.warning("%s contains its own %s; ggufmtp's manifest takes that name, so that file is not pulled",
                    where, MANIFEST_NAME)
    available = {p for p in hub if p != MANIFEST_NAME}
    selected = {p for p in available if matches(p, include, exclude)}
    if not selected:
        sample = ", ".join(sorted(available)[:10]) or "(the repo is empty)"
        raise HubRefusedError(f"no file of {where} matches --include {include}"
                              + (f" and not --exclude {exclude}" if exclude else "") + f": the repo has {sample}"
                              + (" ..." if len(available) > 10 else ""))
    selected = complete_shard_selection(selected, available, where)
    check_safe_paths(sorted(selected), where)
    return sorted(selected)


def _check_preexisting(ldir: Path, order: list[str], hub: dict[str, HubFile], where: str,
                       progress: bool) -> dict[str, FileDigests]:
    """Hash files already at their destination. Matching the Hub -> reuse. Otherwise they may only be
    replaced when an earlier ggufmtp pull put them there unchanged; anything else is the user's."""
    prev = try_read_manifest(ldir)
    ours = {f.path: f.sha256 for f in prev.files} if prev is not None else {}
    reuse: dict[str, FileDigests] = {}
    conflicts = []
    for path in order:
        dest = ldir / path
        if not (dest.exists() or dest.is_symlink()):
            continue
        if not dest.is_file():
            conflicts.append(f"{dest} exists and is not a regular file")
            continue
        try:
            d = hash_file(dest, hub[path], progress)
        except OSError as e:
            raise HubError(f"cannot read {dest} to check it against {where}: {e}") from None
        ok, problem = check_digests(hub[path], d)
        if ok:
            reuse[path] = d
        elif ours.get(path) != d.sha256:  # else: our download of another revision, which may be replaced
            conflicts.append(f"{dest} ({problem or 'cannot be verified'}; not downloaded by ggufmtp)")
    if conflicts:
        raise HubRefusedError(
            f"refusing to overwrite files in {ldir} that differ from {where}: " + "; ".join(conflicts) +
            ". ggufmtp never replaces files it did not download: move them away or choose another --local-dir")
    return reuse


def _discard_bad_download(local: Path, created: bool, cache_mode: bool) -> str:
    """Remove a download that failed verification, but only when this pull created it."""
    if not created:
        target = local.resolve() if cache_mode else local
        return (f"The copy at {target} predates this pull, so it was left in place: delete it (or clear the cache "
                "entry with `hf cache delete`) before pulling again.")
    try:
        if cache_mode:
            blob = local.resolve()
            local.unlink(missing_ok=True)
            if blob != local:
                blob.unlink(missing_ok=True)
        else:
            local.unlink(missing_ok=True)
        return "The bad download was removed."
    except OSError as e:
        return f"Removing the bad download {local} failed ({e}): delete it by hand."


def _hash_keyed(local: Path, exp: HubFile, progress: bool) -> tuple[os.stat_result, FileDigests]:
    """The file's identity before it is read, and its digests (recorded once verified)."""
    before = os.stat(local)
    return before, hash_file(local, exp, progress)


def _remember_verified(local: Path, before: os.stat_result, digests: FileDigests) -> None:
    """Put a download that matched the Hub's digest in the local digest cache, keyed by the file's
    identity before it was read and unchanged since, so quantize's receipt need not read it again."""
    from ..runtime.build import cache_root

    with contextlib.suppress(OSError):
        DigestCache.under(cache_root()).record(local, digests.sha256, before, os.stat(local))


class _Downloads:
    """Download the selected files pinned to one commit with huggingface_hub's ``snapshot_download``
    (its worker threads, its resume and cache layout), then verify each against the listing."""

    def __init__(self, req: _HubPull, commit: str, hub: dict[str, HubFile], where: str):
        self.req, self.commit, self.hub, self.where = req, commit, hub, where

    def run(self, order: list[str], reused: dict[str, FileDigests]) -> tuple[Path, list[PulledFile]]:
        """(the folder holding the files, the verified files in ``order``)."""
        results = {p: PulledFile(p, d.size, d.sha256, verified=True) for p, d in reused.items()}
        todo = [p for p in order if p not in reused]
        base_dir = self.req.local_dir
        if todo:
            created = {p: self._creates(p) for p in todo}
            base_dir = self._download(todo)
            results |= self._verify(base_dir, todo, created)
        assert base_dir is not None  # local_dir mode, or a download found the snapshot folder
        return base_dir, [results[p] for p in order]

    def _creates(self, path: str) -> bool:
        """Whether downloading ``path`` creates its file (in the cache: no blob of that digest yet)."""
        req, exp = self.req, self.hub[path]
        if req.local_dir is not None:
            return True
        etag = exp.sha256 or exp.git_oid
        return not (etag and (storage_folder(req.cache, req.repo_id) / "blobs" / etag).exists())

    def _download(self, todo: list[str]) -> Path:
        """The folder huggingface_hub put ``todo`` in: ``local_dir``, or the commit's snapshot folder.
        The paths are passed as ``allow_patterns`` escaped, so each matches only itself."""
        from huggingface_hub import snapshot_download

        req = self.req
        with hub_errors(f"downloading {len(todo)} file(s) from {self.where}", **req.errs):
            folder = snapshot_download(
                req.repo_id, revision=self.commit, allow_patterns=[glob.escape(p) for p in todo],
                local_dir=req.local_dir, cache_dir=req.cache, token=req.token, endpoint=req.endpoint,
                tqdm_class=None if req.progress and not progress_disabled() else SilentBar,
                library_name="ggufmtp", library_version=__version__,
            )
        return Path(folder)

    def _verify(self, base_dir: Path, todo: list[str], created: dict[str, bool]) -> dict[str, PulledFile]:
        """Hash the downloads (a few at once: hashlib releases the GIL) and check each against the
        Hub's metadata; a mismatch removes the bad download when this pull created it."""
        results: dict[str, PulledFile] = {}
        workers = max(1, min(len(todo), os.cpu_count() or 1, 4))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ggufmtp-hash") as hasher:
            jobs = {p: hasher.submit(_hash_keyed, base_dir / p, self.hub[p], self.req.progress) for p in todo}
            try:
                for path, job in jobs.items():
                    local = base_dir / path
                    try:
                        before, digests = job.result()
                    except OSError as e:  # e.g. a Hub error after which huggingface_hub fell back to local files
                        raise HubError(f"{self.where}: {path} is not readable where it was downloaded ({e})") from None
                    ok, problem = check_digests(self.hub[path], digests)
                    if problem:
                        removed = _discard_bad_download(local, created[path], self.req.local_dir is None)
                        raise HubDigestMismatchError(
                            f"{self.where}: {path}: {problem}. {removed} The download is corrupt or was altered in "
                            "transit: pull again; if it persists, report it to the repo owner",
                            path=local, expected=self.hub[path].sha256, actual=digests.sha256)
                    results[path] = PulledFile(path, digests.size, digests.sha256, verified=ok)
                    if ok:
                        _remember_verified(local, before, digests)
            except BaseException:
                for job in jobs.values():
                    job.cancel()
                raise
        return results
