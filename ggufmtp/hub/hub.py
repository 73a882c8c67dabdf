"""Pull checkpoints from, and publish artifacts to, the Hugging Face Hub.

Everything on the wire is ``huggingface_hub`` (written against 2.4): ``HfApi.resolve_revision``,
``list_repo_tree`` and ``hf_hub_download`` to pull, ``create_repo`` / ``create_branch`` /
``create_commit`` to publish. ggufmtp adds what a supply chain needs on top:

* **pinning** - the requested revision is resolved to a commit sha once; the listing and every
  download use that sha, so a branch that moves mid-pull cannot mix two versions;
* **verification** - every pulled file is hashed and compared with the Hub's own metadata (the LFS
  ``sha256`` for LFS files, the git blob id for regular files). A mismatch is refused and the bad
  download removed, but only when ggufmtp created it: files already in ``local_dir`` that ggufmtp
  did not pull are never overwritten or deleted;
* **a manifest** (``ggufmtp-pull.json``, written atomically next to the files) recording repo,
  requested revision, resolved commit, endpoint host, every file's size and sha256, the GGUF entry
  point (first shard of a split model) and the Hub's metadata for the whole commit, which lets a
  later offline pull (``HF_HUB_OFFLINE=1``) verify the cached files without the network;
* **one commit per upload** carrying the artifact(s), the receipt(s) and the model card;
* **tokens never leak**: they come from huggingface_hub's usual sources (``HF_TOKEN``, the token
  file, or the ``token`` argument) and are scrubbed from every error message and log record.

Resuming: huggingface_hub 2.4 resumes an interrupted plain-HTTP download *within the same call*
(``http_get`` retries with ``Range: bytes=<written>-`` up to 5 times without progress). Its
temporary ``<etag>.<uuid>.incomplete`` file is process-unique and deleted on failure, so a pull
that is killed restarts that file from zero; files completed earlier are not downloaded again.
Xet downloads (used when the Hub advertises Xet and ``hf_xet`` is installed) go through ``hf_xet``
instead; they are not exercised by the tests (the local fake Hub speaks plain HTTP/LFS only).
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import logging
import os
import re
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, Iterable, Iterator, Sequence
from urllib.parse import urlsplit

from .._version import __version__
from ..errors import HubError
from ..gguf.hashing import FileDigests, file_digests

__all__ = [
    "MANIFEST_NAME",
    "GGUFModel",
    "PullResult",
    "PulledFile",
    "UploadOperation",
    "UploadResult",
    "group_gguf_shards",
    "pull",
    "read_manifest",
    "upload",
]

log = logging.getLogger(__name__)

MANIFEST_NAME = "ggufmtp-pull.json"
MANIFEST_SCHEMA = "ggufmtp.pull/v1"
_SHARD_RE = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_HASH_PROGRESS_MIN = 256 * 1024 * 1024  # show a hashing bar only for files this big
_SKIP_DIRS = {".git", ".cache"}  # .cache/huggingface holds huggingface_hub's local_dir bookkeeping


# ================================================================================================
# Result types
# ================================================================================================


@dataclass(frozen=True)
class PulledFile:
    path: str  # path inside the repo / directory, POSIX separators
    size: int
    sha256: str
    verified: bool = False  # True when checked against the Hub's metadata for this commit

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256, "verified": self.verified}


@dataclass(frozen=True)
class GGUFModel:
    entry: str  # what to hand llama.cpp: the file itself, or the first shard of a split model
    shards: tuple[str, ...]  # every file of the model, in order (one item when not split)

    def to_dict(self) -> dict[str, Any]:
        return {"entry": self.entry, "shards": list(self.shards)}


@dataclass
class PullResult:
    """What ``pull`` fetched and verified; ``to_dict()`` is exactly the manifest's content."""

    repo_id: str | None  # None for a plain local directory
    source: str  # "hub" (downloaded/checked online), "cache" (offline), "local" (a directory)
    requested_revision: str | None
    resolved_commit: str | None
    endpoint_host: str | None
    local_dir: Path  # the directory holding the files (local_dir, cache snapshot, or the directory)
    files: list[PulledFile]
    gguf_models: list[GGUFModel]
    include: list[str] | None = None
    hub_files: list[dict[str, Any]] | None = None  # the Hub's metadata for every file of the commit
    manifest_path: Path | None = None

    @property
    def verified(self) -> bool:
        """Every file was checked against the Hub's checksums."""
        return bool(self.files) and all(f.verified for f in self.files)

    @property
    def model_entry(self) -> str | None:
        """The GGUF entry point (first shard) when the pull holds exactly one GGUF model."""
        return self.gguf_models[0].entry if len(self.gguf_models) == 1 else None

    @property
    def model_path(self) -> Path | None:
        entry = self.model_entry
        return self.local_dir / entry if entry else None

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": MANIFEST_SCHEMA,
            "ggufmtp_version": __version__,
            "source": self.source,
            "repo_id": self.repo_id,
            "requested_revision": self.requested_revision,
            "resolved_commit": self.resolved_commit,
            "endpoint_host": self.endpoint_host,
            "include": self.include,
            "local_dir": str(self.local_dir),
            "model_entry": self.model_entry,
            "gguf_models": [m.to_dict() for m in self.gguf_models],
            "verified": self.verified,
            "total_size": self.total_size,
            "files": [f.to_dict() for f in self.files],
            "hub_files": self.hub_files,
        }


@dataclass(frozen=True)
class UploadOperation:
    path_in_repo: str
    local_path: Path
    size: int
    kind: str  # "artifact", "receipt" or "card"
    sha256: str | None = None  # None in dry runs (no hashing)

    def to_dict(self) -> dict[str, Any]:
        return {"path_in_repo": self.path_in_repo, "local_path": str(self.local_path), "size": self.size,
                "kind": self.kind, "sha256": self.sha256}


@dataclass
class UploadResult:
    repo_id: str
    revision: str
    dry_run: bool
    private: bool
    commit_message: str
    commit_description: str
    operations: list[UploadOperation]
    endpoint_host: str
    commit_sha: str | None = None
    commit_url: str | None = None
    repo_url: str | None = None

    @property
    def total_size(self) -> int:
        return sum(op.size for op in self.operations)

    def to_dict(self) -> dict[str, Any]:
        return {
            "repo_id": self.repo_id,
            "revision": self.revision,
            "dry_run": self.dry_run,
            "private": self.private,
            "endpoint_host": self.endpoint_host,
            "commit_message": self.commit_message,
            "commit_description": self.commit_description,
            "commit_sha": self.commit_sha,
            "commit_url": self.commit_url,
            "repo_url": self.repo_url,
            "total_size": self.total_size,
            "operations": [op.to_dict() for op in self.operations],
        }


# ================================================================================================
# Manifest
# ================================================================================================


def _atomic_write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2, sort_keys=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # replaces a symlink itself, never writes through it
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _write_manifest(result: PullResult) -> Path:
    path = result.local_dir / MANIFEST_NAME
    try:
        _atomic_write_json(path, result.to_dict())
    except OSError as e:
        raise HubError(f"cannot write the pull manifest {path}: {e.strerror or e}; "
                       "make the directory writable or pull into another --local-dir") from e
    result.manifest_path = path
    return path


def read_manifest(path: str | os.PathLike) -> PullResult:
    """Load a ``ggufmtp-pull.json`` (or the directory holding one) back into a ``PullResult``."""
    p = Path(path)
    if p.is_dir():
        p = p / MANIFEST_NAME
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise HubError(f"no pull manifest at {p}: run `ggufmtp pull` first") from None
    except (OSError, ValueError) as e:
        raise HubError(f"cannot read pull manifest {p}: {e}") from None
    if not isinstance(data, dict) or data.get("schema") != MANIFEST_SCHEMA:
        raise HubError(f"{p} is not a ggufmtp pull manifest (schema {MANIFEST_SCHEMA!r} expected)")
    try:
        files = [PulledFile(path=f["path"], size=int(f["size"]), sha256=f["sha256"], verified=bool(f.get("verified")))
                 for f in data["files"]]
        models = [GGUFModel(entry=m["entry"], shards=tuple(m["shards"])) for m in data.get("gguf_models") or []]
        return PullResult(
            repo_id=data.get("repo_id"), source=data["source"], requested_revision=data.get("requested_revision"),
            resolved_commit=data.get("resolved_commit"), endpoint_host=data.get("endpoint_host"),
            local_dir=p.parent, files=files, gguf_models=models, include=data.get("include"),
            hub_files=data.get("hub_files"), manifest_path=p,
        )
    except (KeyError, TypeError, ValueError) as e:
        raise HubError(f"pull manifest {p} is malformed ({e!r}); delete it and pull again") from None


def _try_read_manifest(directory: Path) -> PullResult | None:
    if not (directory / MANIFEST_NAME).is_file():
        return None
    try:
        return read_manifest(directory / MANIFEST_NAME)
    except HubError as e:
        log.warning("ignoring unreadable manifest: %s", e)
        return None


# ================================================================================================
# Secrets: tokens never reach logs, messages or files
# ================================================================================================

_BEARER_RE = re.compile(r"(?i)\b(bearer\s+)[^\s'\",;]+")
_HF_TOKEN_RE = re.compile(r"\bhf_[A-Za-z0-9]{30,}\b")
_secrets_lock = threading.Lock()
_active_secrets: dict[str, int] = {}  # secret -> reference count
_previous_factory: Any = None


def _scrub(text: str, secrets: Iterable[str] | None = None) -> str:
    if secrets is None:
        with _secrets_lock:
            secrets = list(_active_secrets)
    for s in sorted(secrets, key=len, reverse=True):
        text = text.replace(s, "***")
    text = _BEARER_RE.sub(r"\1***", text)
    return _HF_TOKEN_RE.sub("hf_***", text)


def _scrubbing_record_factory(*args, **kwargs) -> logging.LogRecord:
    record = _previous_factory(*args, **kwargs)
    try:
        message = record.getMessage()
        clean = _scrub(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and record.exc_info[1] is not None:
            text = logging.Formatter().formatException(record.exc_info)
            clean_exc = _scrub(text)
            if clean_exc != text:
                record.exc_text = clean_exc  # formatters use exc_text when it is set
    except Exception:  # never break logging
        pass
    return record


def _known_tokens(token: Any) -> list[str]:
    """The token(s) huggingface_hub may send: the explicit one, HF_TOKEN, the token file."""
    out = []
    if isinstance(token, str):
        out.append(token)
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        if os.environ.get(var):
            out.append(os.environ[var])
    try:
        from huggingface_hub import constants

        out.append(Path(constants.HF_TOKEN_PATH).read_text(encoding="utf-8"))
    except Exception:
        pass
    variants = set()
    for t in out:  # as given, as huggingface_hub cleans file/env tokens, and as repr() escapes it
        for v in (t, t.replace("\r", "").replace("\n", "").strip(), repr(t)[1:-1]):
            variants.add(v)
    return [v for v in variants if len(v.strip()) >= 6]


@contextlib.contextmanager
def _guard_secrets(token: Any) -> Iterator[list[str]]:
    """Scrub the known tokens from every log record created while inside (any logger, any thread)."""
    global _previous_factory
    secrets = _known_tokens(token)
    with _secrets_lock:
        if not _active_secrets.get("__installed__"):
            _previous_factory = logging.getLogRecordFactory()
            logging.setLogRecordFactory(_scrubbing_record_factory)
        _active_secrets["__installed__"] = _active_secrets.get("__installed__", 0) + 1
        for s in secrets:
            _active_secrets[s] = _active_secrets.get(s, 0) + 1
    try:
        yield secrets
    finally:
        with _secrets_lock:
            for s in secrets:
                _active_secrets[s] -= 1
                if not _active_secrets[s]:
                    del _active_secrets[s]
            _active_secrets["__installed__"] -= 1
            if not _active_secrets["__installed__"]:
                del _active_secrets["__installed__"]
                if logging.getLogRecordFactory() is _scrubbing_record_factory:
                    logging.setLogRecordFactory(_previous_factory)


def _exception_chain_text(e: BaseException) -> str:
    parts, seen = [], set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        parts.append(f"{e!r} {e}")
        e = e.__cause__ or e.__context__
    return "\n".join(parts)


def _raise_hub_error(message: str, original: BaseException, secrets: Sequence[str]) -> None:
    message = _scrub(message, secrets)
    chain = _exception_chain_text(original)
    if _scrub(chain, secrets) != chain:
        raise HubError(message) from None  # the cause itself carries a secret: do not chain it
    raise HubError(message) from original


# ================================================================================================
# Errors from huggingface_hub / the network -> one actionable HubError
# ================================================================================================


def _transport_errors() -> tuple[type[BaseException], ...]:
    out: list[type[BaseException]] = []
    for mod, name in (("httpx2", "TransportError"), ("httpx", "TransportError"), ("requests", "ConnectionError"),
                      ("requests", "Timeout")):
        try:
            out.append(getattr(__import__(mod), name))
        except (ImportError, AttributeError):
            pass
    return tuple(out)


def _http_status(e: BaseException) -> int | None:
    response = getattr(e, "response", None)
    return getattr(response, "status_code", None)


def _server_message(e: BaseException) -> str:
    msg = getattr(e, "server_message", None)
    if msg:
        return str(msg).strip().splitlines()[0]
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


@contextlib.contextmanager
def _hub_errors(what: str, *, repo_id: str, endpoint: str, secrets: Sequence[str], revision: str | None = None,
                writing: bool = False) -> Iterator[None]:
    from huggingface_hub import errors as hf_errors

    try:
        yield
    except HubError as e:
        _raise_hub_error(str(e), e, secrets)
    except KeyboardInterrupt:
        raise
    except hf_errors.GatedRepoError as e:
        _raise_hub_error(
            f"{what}: {repo_id} is gated: accept its conditions at {endpoint}/{repo_id} with the account whose "
            "token you use (HF_TOKEN or `hf auth login`)", e, secrets)
    except hf_errors.RepositoryNotFoundError as e:
        _raise_hub_error(
            f"{what}: repository {repo_id} not found on {_host(endpoint)} (or it is private and your token cannot "
            "see it): check the name; for private repos set HF_TOKEN or run `hf auth login`", e, secrets)
    except hf_errors.RevisionNotFoundError as e:
        _raise_hub_error(
            f"{what}: revision {revision!r} does not exist in {repo_id}: pass a branch, tag or full commit sha "
            "that exists (see the repo's 'Files and versions' tab)", e, secrets)
    except hf_errors.RemoteEntryNotFoundError as e:
        _raise_hub_error(f"{what}: the file is not in {repo_id} at this revision ({_server_message(e)})", e, secrets)
    except (hf_errors.OfflineModeIsEnabled, hf_errors.LocalEntryNotFoundError) as e:
        _raise_hub_error(
            f"{what}: offline mode is on (HF_HUB_OFFLINE=1) and the needed files are not in the local cache: "
            "unset HF_HUB_OFFLINE and pull once with network access", e, secrets)
    except hf_errors.HfHubHTTPError as e:
        status = _http_status(e)
        if status in (401, 403):
            action = "a token with write access to that namespace" if writing else "a token that can read it"
            _raise_hub_error(
                f"{what}: HTTP {status} from {_host(endpoint)} ({_server_message(e)}): set HF_TOKEN or run "
                f"`hf auth login` with {action}", e, secrets)
        _raise_hub_error(f"{what}: HTTP {status} from {_host(endpoint)}: {_server_message(e)}", e, secrets)
    except _transport_errors() as e:
        if _bad_header(e):
            _raise_hub_error(f"{what}: {type(e).__name__}: {e}{_BAD_HEADER_HINT}", e, secrets)
        hint = "" if writing else "; to use files already downloaded, set HF_HUB_OFFLINE=1"
        _raise_hub_error(
            f"{what}: cannot reach {endpoint} ({type(e).__name__}: {e}): check the network, proxy and HF_ENDPOINT"
            f"{hint}", e, secrets)
    except OSError as e:
        _raise_hub_error(f"{what}: {e}", e, secrets)
    except (ValueError, RuntimeError) as e:  # huggingface_hub raises these for bad input / failed uploads
        detail = _server_message(e.__cause__) if isinstance(e, RuntimeError) and e.__cause__ else str(e)
        _raise_hub_error(f"{what}: {detail}", e, secrets)
    except Exception as e:  # e.g. RevisionResolutionError, whose text embeds the transport error
        _raise_hub_error(f"{what}: {type(e).__name__}: {e}{_BAD_HEADER_HINT if _bad_header(e) else ''}", e, secrets)


_BAD_HEADER_HINT = (" - the token contains a newline or another character not allowed in an HTTP header: "
                    "fix HF_TOKEN / the token file / the token argument")


def _bad_header(e: BaseException) -> bool:
    return "Illegal header value" in str(e) or "Invalid header value" in str(e)


# ================================================================================================
# Helpers
# ================================================================================================


def _resolve_endpoint(endpoint: str | None) -> str:
    """``endpoint`` if given, else ``$HF_ENDPOINT`` (read now, not at import), else the library default."""
    if endpoint:
        return endpoint.rstrip("/")
    if os.environ.get("HF_ENDPOINT"):
        return os.environ["HF_ENDPOINT"].rstrip("/")
    from huggingface_hub import constants

    return constants.ENDPOINT.rstrip("/")


def _host(endpoint: str) -> str:
    netloc = urlsplit(endpoint).netloc
    return netloc.rsplit("@", 1)[-1]  # never keep user:password@


def _is_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.is_offline_mode())


def _cache_dir(cache_dir: str | os.PathLike | None) -> Path:
    from huggingface_hub import constants

    return Path(cache_dir if cache_dir is not None else constants.HF_HUB_CACHE).expanduser().resolve()


def _storage_folder(cache_dir: Path, repo_id: str) -> Path:
    return cache_dir / ("models--" + repo_id.replace("/", "--"))


def _unsafe_reason(path: str) -> str | None:
    """Why a repo filename cannot be written under a directory, or None when it is safe."""
    if not path or "\0" in path:
        return "empty or NUL in the name"
    if path.startswith(("/", "\\")) or PurePosixPath(path).is_absolute() or PureWindowsPath(path).anchor:
        return "absolute path"
    if ".." in path.replace("\\", "/").split("/"):
        return "contains a '..' component"
    return None


def _check_safe_paths(paths: Iterable[str], where: str) -> None:
    bad = [(p, r) for p in paths if (r := _unsafe_reason(p))]
    if bad:
        listing = ", ".join(f"{p!r} ({r})" for p, r in bad[:5])
        raise HubError(
            f"{where} contains file names that would escape the download directory: {listing}. Refusing to pull; "
            "exclude them with --include or ask the repo owner to rename them")


def _normalize_include(include: str | Sequence[str] | None) -> list[str] | None:
    if include is None:
        return None
    if isinstance(include, str):
        include = [include]
    pats = [p for p in include if p]
    return pats or None


def _matches(path: str, include: list[str] | None) -> bool:
    return include is None or any(fnmatch.fnmatchcase(path, pat) for pat in include)


def _fmt_size(n: int) -> str:
    step = 1000.0
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < step or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= step
    return f"{n} B"


def group_gguf_shards(paths: Iterable[str]) -> tuple[list[GGUFModel], dict[str, list[str]]]:
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
    models = [GGUFModel(entry=p, shards=(p,)) for p in singles]
    missing: dict[str, list[str]] = {}
    for (stem, count), shards in sorted(groups.items()):
        names = [f"{stem}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]
        absent = [n for i, n in enumerate(names, 1) if i not in shards]
        if absent:
            missing[names[0]] = absent
        else:
            models.append(GGUFModel(entry=names[0], shards=tuple(names)))
    models.sort(key=lambda m: m.entry)
    return models, missing


def _complete_shard_selection(selected: set[str], available: set[str], where: str) -> set[str]:
    """Add the sibling shards of any selected shard; refuse when a selected split model is incomplete."""
    out = set(selected)
    models, missing = group_gguf_shards(available)
    for m in models:
        if out & set(m.shards):
            out |= set(m.shards)

    def key(p: str) -> tuple[str, str] | None:
        m = _SHARD_RE.match(p)
        return (m["stem"], m["count"]) if m else None

    selected_keys = {key(p) for p in out} - {None}
    problems = [f"{entry} (missing {', '.join(absent)})" for entry, absent in missing.items()
                if key(entry) in selected_keys]
    if problems:
        raise HubError(f"split GGUF model incomplete in {where}: " + "; ".join(problems) +
                       ". All shards of a split model are needed: re-upload or pull the missing shard(s)")
    return out


class _SilentBar:
    """A do-nothing stand-in for tqdm (``progress=False``)."""

    def __init__(self, *args, **kwargs):
        self.n = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n=1):
        self.n += n or 0

    def __getattr__(self, name):  # close, refresh, set_postfix_str, update_transfer...
        return lambda *a, **k: None


# ================================================================================================
# pull
# ================================================================================================


@dataclass
class _Expected:
    path: str
    size: int | None
    sha256: str | None  # LFS sha256
    git_oid: str | None  # git blob id (regular files)

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256, "git_oid": self.git_oid}


def _expected_from_hub_files(hub_files: list[dict] | None) -> dict[str, _Expected]:
    out = {}
    for f in hub_files or []:
        try:
            out[f["path"]] = _Expected(f["path"], f.get("size"), f.get("sha256"), f.get("git_oid"))
        except (KeyError, TypeError):
            continue
    return out


def _check_digests(exp: _Expected | None, d: FileDigests) -> tuple[bool, str | None]:
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


def _hash(path: Path, exp: _Expected | None, progress: bool) -> FileDigests:
    git = exp is not None and not exp.sha256 and bool(exp.git_oid)
    size = path.stat().st_size
    return file_digests(path, git_blob=git, progress=progress and size >= _HASH_PROGRESS_MIN)


def pull(
    repo_id: str,
    revision: str | None = None,
    include: str | Sequence[str] | None = None,
    local_dir: str | os.PathLike | None = None,
    token: str | bool | None = None,
    progress: bool = True,
    *,
    endpoint: str | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> PullResult:
    """Download (or re-verify) a model repo pinned to one commit, verify every file, write the manifest.

    ``repo_id`` may also be a local directory: the manifest is then built from the files in it
    (verified against the Hub's checksums if an earlier pull left a manifest there).

    ``include``: fnmatch patterns matched against repo paths (``*`` crosses ``/``). Selecting any
    shard of a split GGUF selects all of them; a missing shard is an error naming it.
    ``local_dir``: where to put the files; default: the Hugging Face cache (the manifest then sits
    in the cache's snapshot folder). ``endpoint``: default ``$HF_ENDPOINT`` or huggingface.co.
    With ``HF_HUB_OFFLINE=1`` nothing touches the network: files come from the cache / local_dir
    and are checked against the Hub metadata recorded by the last online pull.
    """
    include = _normalize_include(include)
    as_path = Path(os.path.expanduser(str(repo_id)))
    looks_like_path = str(repo_id).startswith((".", "/", "~")) or "\\" in str(repo_id)
    if as_path.is_dir():
        if revision is not None:
            raise HubError(f"{repo_id} is a local directory: --revision only applies to Hub repos")
        if local_dir is not None and Path(local_dir).resolve() != as_path.resolve():
            raise HubError(f"{repo_id} is a local directory: files are used in place, drop --local-dir")
        return _pull_directory(as_path.resolve(), include, progress, source="local")
    if looks_like_path:
        raise HubError(f"{repo_id}: no such directory (and not a Hub repo id of the form namespace/name)")

    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise HubError(f"{repo_id!r} is neither an existing directory nor a valid Hub repo id: {e}") from None

    endpoint = _resolve_endpoint(endpoint)
    cache = _cache_dir(cache_dir)
    ldir = Path(local_dir).expanduser().resolve() if local_dir is not None else None
    with _guard_secrets(token) as secrets:
        if _is_offline():
            return _pull_offline(repo_id, revision, include, ldir, cache, endpoint, progress, secrets)
        return _pull_online(repo_id, revision, include, ldir, cache, endpoint, token, progress, secrets)


def _pull_online(repo_id, revision, include, ldir, cache, endpoint, token, progress, secrets) -> PullResult:
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.hf_api import RepoFile

    api = HfApi(endpoint=endpoint, token=token, library_name="ggufmtp", library_version=__version__)
    rev_label = revision or "the default branch"
    errs = dict(repo_id=repo_id, endpoint=endpoint, secrets=secrets, revision=revision)

    # 1. pin: one commit sha for the whole pull (also caches refs/<rev> for later offline pulls)
    with _hub_errors(f"resolving {repo_id} @ {rev_label}", **errs):
        resolved = api.resolve_revision(repo_id, revision=revision, cache_dir=cache)
    commit = str(getattr(resolved, "resolved", resolved))
    if not _COMMIT_RE.match(commit):
        raise HubError(f"{_host(endpoint)} resolved {repo_id} @ {rev_label} to {commit!r}, not a commit sha; "
                       "check HF_ENDPOINT points at a Hugging Face Hub")

    # 2. list the files *at that commit*, with the Hub's checksums
    with _hub_errors(f"listing {repo_id} @ {commit[:12]}", **errs):
        tree = [e for e in api.list_repo_tree(repo_id, recursive=True, revision=commit) if isinstance(e, RepoFile)]
    hub: dict[str, _Expected] = {
        e.path: _Expected(e.path, e.size, e.lfs.sha256 if e.lfs is not None else None, e.blob_id) for e in tree
    }
    where = f"{repo_id} @ {commit[:12]}"
    if MANIFEST_NAME in hub:
        log.warning("%s contains its own %s; ggufmtp's manifest takes that name, so that file is not pulled",
                    where, MANIFEST_NAME)
    available = {p for p in hub if p != MANIFEST_NAME}
    selected = {p for p in available if _matches(p, include)}
    if not selected:
        sample = ", ".join(sorted(available)[:10]) or "(the repo is empty)"
        raise HubError(f"no file of {where} matches --include {include}: the repo has {sample}"
                       + (" ..." if len(available) > 10 else ""))
    selected = _complete_shard_selection(selected, available, where)
    _check_safe_paths(sorted(selected), where)
    order = sorted(selected)

    # 3. files already in local_dir: reuse them if they are the Hub's; never clobber the user's own
    reused: dict[str, FileDigests] = {}
    if ldir is not None:
        reused = _check_preexisting(ldir, order, hub, commit, where, progress)

    # 4. download (pinned to the commit) and verify, hashing file i while file i+1 downloads
    storage = _storage_folder(cache, repo_id)
    tqdm_class = None if progress else _SilentBar
    base_dir: Path | None = ldir
    results: dict[str, PulledFile] = {}
    pending: list[tuple[str, Path, bool, Future]] = []

    def collect(block: bool) -> None:
        for item in list(pending):
            path, local, created, fut = item
            if not block and not fut.done():
                continue
            pending.remove(item)
            digests = fut.result()
            ok, problem = _check_digests(hub[path], digests)
            if problem:
                removed = _discard_bad_download(local, created, ldir is None)
                raise HubError(f"{where}: {path}: {problem}. {removed} The download is corrupt or was altered in "
                               "transit: pull again; if it persists, report it to the repo owner")
            results[path] = PulledFile(path, digests.size, digests.sha256, verified=ok)

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ggufmtp-hash") as hasher:
        try:
            for path in order:
                collect(block=False)
                if path in reused:
                    d = reused[path]
                    results[path] = PulledFile(path, d.size, d.sha256, verified=True)
                    continue
                exp = hub[path]
                created = True
                if ldir is None:
                    etag = exp.sha256 or exp.git_oid
                    created = not (etag and (storage / "blobs" / etag).exists())
                with _hub_errors(f"downloading {path} from {where}", **errs):
                    local = Path(hf_hub_download(
                        repo_id, path, revision=commit, local_dir=ldir, cache_dir=cache, token=token,
                        endpoint=endpoint, tqdm_class=tqdm_class,
                        library_name="ggufmtp", library_version=__version__,
                    ))
                if base_dir is None:  # cache mode: the snapshot folder of this commit
                    base_dir = local
                    for _ in PurePosixPath(path).parts:
                        base_dir = base_dir.parent
                pending.append((path, local, created, hasher.submit(_hash, local, exp, progress)))
            collect(block=True)
        except BaseException:
            for *_, fut in pending:
                fut.cancel()
            raise

    if base_dir is None:  # everything was reused from local_dir
        base_dir = ldir
    files = [results[p] for p in order]
    models, _ = group_gguf_shards(order)
    result = PullResult(
        repo_id=repo_id, source="hub", requested_revision=revision, resolved_commit=commit,
        endpoint_host=_host(endpoint), local_dir=base_dir, files=files, gguf_models=models, include=include,
        hub_files=[hub[p].to_dict() for p in sorted(hub)],
    )
    _write_manifest(result)
    return result


def _check_preexisting(ldir: Path, order: list[str], hub: dict[str, _Expected], commit: str, where: str,
                       progress: bool) -> dict[str, FileDigests]:
    """Hash files already at their destination. Matching the Hub -> reuse. Otherwise they may only be
    replaced when an earlier ggufmtp pull put them there unchanged; anything else is the user's."""
    prev = _try_read_manifest(ldir)
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
        exp = hub[path]
        try:
            d = _hash(dest, exp, progress)
        except OSError as e:
            raise HubError(f"cannot read {dest} to check it against {where}: {e}") from None
        ok, problem = _check_digests(exp, d)
        if ok:
            reuse[path] = d
        elif ours.get(path) == d.sha256:
            continue  # our earlier download of another revision: huggingface_hub may replace it
        else:
            conflicts.append(f"{dest} ({problem or 'cannot be verified'}; not downloaded by ggufmtp)")
    if conflicts:
        raise HubError(
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


def _pull_offline(repo_id, revision, include, ldir, cache, endpoint, progress, secrets) -> PullResult:
    where_off = "offline mode is on (HF_HUB_OFFLINE=1)"
    if ldir is not None:
        base = ldir
        prev = _try_read_manifest(base)
        if prev is None or prev.repo_id != repo_id:
            raise HubError(f"{where_off} and {base} holds no ggufmtp pull of {repo_id}: unset HF_HUB_OFFLINE and "
                           "pull once with network access")
        commit = prev.resolved_commit
        if revision is not None and revision not in (prev.requested_revision, commit) and not (
                commit and len(revision) >= 7 and commit.startswith(revision)):
            raise HubError(f"{where_off}: {base} holds {repo_id} @ {commit} (pulled as "
                           f"{prev.requested_revision or 'the default branch'}), which cannot be matched to "
                           f"revision {revision!r} without the network")
    else:
        from huggingface_hub import HfApi

        api = HfApi(endpoint=endpoint)
        try:
            commit = str(api.resolve_revision(repo_id, revision=revision, cache_dir=cache, local_files_only=True)
                         .resolved)
        except Exception as e:  # RevisionResolutionError and friends
            _raise_hub_error(
                f"{where_off} and {repo_id} @ {revision or 'the default branch'} is not in the cache {cache}: "
                "unset HF_HUB_OFFLINE and pull once with network access", e, secrets)
        base = _storage_folder(cache, repo_id) / "snapshots" / commit
        if not base.is_dir():
            raise HubError(f"{where_off} and no files of {repo_id} @ {commit[:12]} are cached in {cache}: unset "
                           "HF_HUB_OFFLINE and pull once with network access")
        prev = _try_read_manifest(base)
        if prev is not None and prev.resolved_commit != commit:
            prev = None
    result = _pull_directory(base, include, progress, source="cache", prev=prev, repo_id=repo_id,
                             requested_revision=revision, commit=commit, require_prev_selection=True)
    return result


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


def _pull_directory(base: Path, include, progress, *, source: str, prev: PullResult | None = None,
                    repo_id: str | None = None, requested_revision: str | None = None, commit: str | None = None,
                    require_prev_selection: bool = False) -> PullResult:
    """Build (and verify, when Hub metadata is known) the manifest of files already on disk."""
    if prev is None and source == "local":
        prev = _try_read_manifest(base)
        if prev is not None and prev.repo_id:
            repo_id, commit, requested_revision = prev.repo_id, prev.resolved_commit, prev.requested_revision
    expected = _expected_from_hub_files(prev.hub_files if prev else None)
    present = _walk_files(base)
    where = f"{base}"
    if require_prev_selection and prev is not None:
        # offline: the repo is what the Hub said at this commit; default to what was pulled last time
        universe = sorted(expected) if expected else present
        wanted = {p for p in universe if _matches(p, include)} if include else {f.path for f in prev.files}
    else:
        universe = present
        wanted = {p for p in present if _matches(p, include)}
    if not wanted:
        raise HubError(f"no file in {where} matches --include {include}" if include else f"{where} has no files")
    wanted = _complete_shard_selection(wanted, set(universe) | set(present), where)
    _check_safe_paths(sorted(wanted), where)
    absent = sorted(p for p in wanted if not (base / p).is_file())
    if absent:
        raise HubError(f"{len(absent)} file(s) of {repo_id or where} are not available locally "
                       f"({', '.join(absent[:5])}{' ...' if len(absent) > 5 else ''}): "
                       "pull them with network access (unset HF_HUB_OFFLINE)")
    files = []
    for path in sorted(wanted):
        exp = expected.get(path)
        try:
            d = _hash(base / path, exp, progress)
        except OSError as e:
            raise HubError(f"cannot read {base / path}: {e}") from None
        ok, problem = _check_digests(exp, d)
        if problem:
            raise HubError(f"{base / path}: {problem} (recorded by the pull of {repo_id} @ {commit}). The local "
                           "copy changed or is corrupt: delete it and pull again with network access")
        files.append(PulledFile(path, d.size, d.sha256, verified=ok))
    if not all(f.verified for f in files):
        unverified = [f.path for f in files if not f.verified]
        log.info("%d file(s) in %s have no Hub checksum to compare with: %s", len(unverified), where,
                 ", ".join(unverified[:5]))
    models, _ = group_gguf_shards(f.path for f in files)
    result = PullResult(
        repo_id=repo_id, source=source, requested_revision=requested_revision, resolved_commit=commit,
        endpoint_host=prev.endpoint_host if prev else None, local_dir=base, files=files, gguf_models=models,
        include=include, hub_files=prev.hub_files if prev else None,
    )
    _write_manifest(result)
    return result


# ================================================================================================
# upload
# ================================================================================================


def _as_paths(items: str | os.PathLike | Iterable[str | os.PathLike] | None) -> list[Path]:
    if items is None:
        return []
    if isinstance(items, (str, os.PathLike)):
        return [Path(items)]
    return [Path(i) for i in items]


def default_commit_message(artifact_name: str, recipe_name: str | None, artifact_sha256: str | None) -> str:
    facts = []
    if recipe_name:
        facts.append(f"recipe {recipe_name}")
    if artifact_sha256:
        facts.append(f"sha256 {artifact_sha256}")
    return f"Upload {artifact_name}" + (f" ({', '.join(facts)})" if facts else "") + " with ggufmtp"


def upload(
    repo_id: str,
    files: Sequence[str | os.PathLike],
    receipt: str | os.PathLike | Sequence[str | os.PathLike],
    card: str | os.PathLike | None = None,
    private: bool = False,
    revision: str | None = None,
    token: str | bool | None = None,
    dry_run: bool = False,
    commit_message: str | None = None,
    *,
    recipe_name: str | None = None,
    artifact_sha256: str | None = None,
    endpoint: str | None = None,
    progress: bool = True,
) -> UploadResult:
    """Publish artifact(s), their receipt(s) and the model card (as README.md) in ONE commit.

    Creates the repo if needed (``private`` only applies to a new repo) and the branch
    ``revision`` if it does not exist. The default commit message names ``recipe_name`` and
    ``artifact_sha256`` (which must be the sha256 of one of ``files``). ``dry_run`` validates
    the inputs and lists the operations and sizes without any network access (and without
    hashing, so ``artifact_sha256`` is not checked).
    """
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise HubError(f"{repo_id!r} is not a valid Hub repo id (namespace/name): {e}") from None
    if revision is not None and (not revision or _COMMIT_RE.match(revision)):
        raise HubError(f"--revision {revision!r}: uploads go to a branch name, not a commit sha")
    if artifact_sha256 is not None and not _SHA256_RE.match(artifact_sha256):
        raise HubError(f"artifact sha256 {artifact_sha256!r} is not a 64-hex-digit sha256")

    artifacts, receipts = _as_paths(files), _as_paths(receipt)
    if not artifacts:
        raise HubError("nothing to upload: pass at least one artifact file")
    if not receipts:
        raise HubError("every upload carries its receipt: pass at least one receipt file")
    planned: list[tuple[str, Path, str]] = [(p.name, p, "artifact") for p in artifacts]
    planned += [(p.name, p, "receipt") for p in receipts]
    if card is not None:
        planned.append(("README.md", Path(card), "card"))
    seen: dict[str, Path] = {}
    ops: list[UploadOperation] = []
    for name, p, kind in planned:
        if not p.is_file():
            raise HubError(f"{kind} {p} does not exist or is not a regular file")
        if name in seen:
            raise HubError(f"two files would both be uploaded as {name!r}: {seen[name]} and {p}"
                           + ("; the model card is uploaded as README.md, so rename the other one"
                              if name == "README.md" else "; rename one of them"))
        seen[name] = p
        ops.append(UploadOperation(name, p.resolve(), p.stat().st_size, kind))

    endpoint = _resolve_endpoint(endpoint)
    branch = revision or "main"
    if not dry_run:
        hashed = []
        for op in ops:
            try:
                digest = file_digests(op.local_path, progress=progress and op.size >= _HASH_PROGRESS_MIN).sha256
            except OSError as e:
                raise HubError(f"cannot read {op.local_path}: {e}") from None
            hashed.append(UploadOperation(op.path_in_repo, op.local_path, op.size, op.kind, digest))
        ops = hashed
        if artifact_sha256 is not None and artifact_sha256 not in {o.sha256 for o in ops if o.kind == "artifact"}:
            listing = ", ".join(f"{o.path_in_repo}={o.sha256}" for o in ops if o.kind == "artifact")
            raise HubError(f"the receipt's artifact sha256 {artifact_sha256} matches none of the files being "
                           f"uploaded ({listing}): the receipt describes another file; re-run the receipt step")

    named = next((o for o in ops if o.kind == "artifact" and artifact_sha256 and o.sha256 == artifact_sha256),
                 next(o for o in ops if o.kind == "artifact"))
    message = commit_message or default_commit_message(named.path_in_repo, recipe_name, artifact_sha256)
    description = "\n".join(
        ["Files in this commit:", ""]
        + [f"- `{o.path_in_repo}` ({o.kind}, {_fmt_size(o.size)}"
           + (f", sha256 `{o.sha256}`)" if o.sha256 else ")") for o in ops]
        + ["", f"Published with ggufmtp {__version__}."]
    )
    result = UploadResult(repo_id=repo_id, revision=branch, dry_run=dry_run, private=private,
                          commit_message=message, commit_description=description, operations=ops,
                          endpoint_host=_host(endpoint))
    if dry_run:
        return result

    from huggingface_hub import CommitOperationAdd, HfApi
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    restore_bars = not progress and not are_progress_bars_disabled()
    if restore_bars:
        disable_progress_bars()
    try:
        with _guard_secrets(token) as secrets:
            api = HfApi(endpoint=endpoint, token=token, library_name="ggufmtp", library_version=__version__)
            errs = dict(repo_id=repo_id, endpoint=endpoint, secrets=secrets, revision=revision, writing=True)
            with _hub_errors(f"creating repo {repo_id}", **errs):
                repo_url = api.create_repo(repo_id, private=True if private else None, exist_ok=True,
                                           repo_type="model")
            if branch != "main":
                with _hub_errors(f"creating branch {branch} in {repo_id}", **errs):
                    api.create_branch(repo_id, branch=branch, exist_ok=True, repo_type="model")
            additions = []
            for op in ops:
                add = CommitOperationAdd(path_in_repo=op.path_in_repo, path_or_fileobj=str(op.local_path))
                add.upload_info.sha256 = bytes.fromhex(op.sha256)  # hashed above: don't hash twice
                additions.append(add)
            with _hub_errors(f"committing {len(ops)} file(s) to {repo_id} @ {branch}", **errs):
                info = api.create_commit(repo_id, additions, commit_message=message, commit_description=description,
                                         revision=revision, repo_type="model")
    finally:
        if restore_bars:
            enable_progress_bars()
    result.commit_sha = getattr(info, "oid", None)
    result.commit_url = getattr(info, "commit_url", None)
    result.repo_url = str(repo_url)
    return result
