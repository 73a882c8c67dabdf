"""The records of a pull and its manifest, ``ggufmtp-pull.json``.

The manifest is written atomically next to the pulled files. It records repo, requested revision,
resolved commit, endpoint host, every file's size and sha256, the GGUF entry point (first shard of
a split model) and the Hub's metadata for the whole commit (``hub_files``), which lets a later
offline pull (``HF_HUB_OFFLINE=1``) verify the cached files without the network. Its content is
exactly ``PullResult.to_dict()``.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._version import __version__
from ..errors import HubError, HubManifestError
from ..files.fsutil import MAX_TEXT_FILE_BYTES, atomic_write_json, read_regular_file
from ..jsontypes import JsonObject

__all__ = ["MANIFEST_NAME", "MANIFEST_SCHEMA", "PulledCard", "PulledModel", "HubFile", "PullResult", "PullSource",
           "PulledFile",
           "read_manifest", "try_read_manifest", "write_manifest"]

log = logging.getLogger(__name__)

MANIFEST_NAME = "ggufmtp-pull.json"
MANIFEST_SCHEMA = "ggufmtp.pull/v1"


class PullSource(enum.StrEnum):
    """Where a pull's files came from."""

    HUB = "hub"  # downloaded / checked online
    CACHE = "cache"  # offline, from the cache or a --local-dir filled earlier
    LOCAL = "local"  # a plain local directory


@dataclass(frozen=True)
class PulledFile:
    """One file of a pull, as hashed on disk."""

    path: str  # path inside the repo / directory, POSIX separators
    size: int
    sha256: str
    verified: bool = False  # True when checked against the Hub's metadata for this commit

    def to_dict(self) -> JsonObject:
        return {"path": self.path, "size": self.size, "sha256": self.sha256, "verified": self.verified}


@dataclass(frozen=True)
class PulledModel:
    """One GGUF model of a pull: a single file, or every shard of a split model."""

    entry: str  # what to hand llama.cpp: the file itself, or the first shard of a split model
    shards: tuple[str, ...]  # every file of the model, in order (one item when not split)

    def to_dict(self) -> JsonObject:
        return {"entry": self.entry, "shards": list(self.shards)}


@dataclass(frozen=True)
class HubFile:
    """The Hub's metadata for one file of a commit: what a download must hash to."""

    path: str
    size: int | None
    sha256: str | None  # LFS sha256
    git_oid: str | None  # git blob id (regular files)

    def to_dict(self) -> JsonObject:
        return {"path": self.path, "size": self.size, "sha256": self.sha256, "git_oid": self.git_oid}

    @classmethod
    def from_dict(cls, d: Any) -> HubFile | None:
        """The entry a manifest recorded, or None when it is malformed (such entries are skipped)."""
        try:
            return cls(d["path"], d.get("size"), d.get("sha256"), d.get("git_oid"))
        except (KeyError, TypeError, AttributeError):
            return None


@dataclass(frozen=True)
class PulledCard:
    """What the pulled repo's model card (its README's YAML, as the Hub parses it: ``cardData``) says
    of the model: ``base_model``, the upstream model of a repo that is itself a conversion or a
    quantization (e.g. a BF16-GGUF repo), and its ``license``. Only a Hub model repo id (owner/name)
    and a short one-line license are kept: both reach published cards."""

    base_model: str | None = None
    license: str | None = None

    def to_dict(self) -> JsonObject:
        return {"base_model": self.base_model, "license": self.license}

    @classmethod
    def of(cls, data: Any) -> PulledCard | None:
        """The facts of ``cardData`` (or a manifest's ``card``); None when it says neither."""
        if not isinstance(data, dict):
            return None
        base = data.get("base_model")
        if isinstance(base, list) and len(base) == 1:  # a merge names several: none is "the" upstream
            base = base[0]
        lic = data.get("license")
        card = cls(base if isinstance(base, str) and _REPO_ID.fullmatch(base) else None,
                   lic if isinstance(lic, str) and _LICENSE.fullmatch(lic) else None)
        return card if card.base_model or card.license else None


_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}")
_LICENSE = re.compile(r"[\w.+-]{1,64}")


def hub_files_by_path(hub_files: list[HubFile] | None) -> dict[str, HubFile]:
    """``hub_files`` keyed by path (empty when there is no Hub metadata)."""
    return {f.path: f for f in hub_files or []}


@dataclass
class PullResult:
    """What ``pull`` fetched and verified; ``to_dict()`` is exactly the manifest's content."""

    repo_id: str | None  # None for a plain local directory
    source: PullSource
    requested_revision: str | None
    resolved_commit: str | None
    endpoint_host: str | None
    local_dir: Path  # the directory holding the files (local_dir, cache snapshot, or the directory)
    files: list[PulledFile]
    gguf_models: list[PulledModel]
    include: list[str] | None = None
    hub_files: list[HubFile] | None = None  # the Hub's metadata for every file of the commit
    manifest_path: Path | None = None
    exclude: list[str] | None = None  # the pull's ignore patterns (``include``: its allow patterns)
    card: PulledCard | None = None  # what the repo's model card says of the model (base_model, license)

    def __post_init__(self) -> None:
        self.source = PullSource(self.source)

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
        """The file to hand llama.cpp when the pull holds exactly one GGUF model."""
        entry = self.model_entry
        return self.local_dir / entry if entry else None

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)

    def to_dict(self) -> JsonObject:
        return {
            "schema": MANIFEST_SCHEMA,
            "ggufmtp_version": __version__,
            "source": self.source.value,
            "repo_id": self.repo_id,
            "requested_revision": self.requested_revision,
            "resolved_commit": self.resolved_commit,
            "endpoint_host": self.endpoint_host,
            "include": self.include,
            "exclude": self.exclude,
            "local_dir": str(self.local_dir),
            "model_entry": self.model_entry,
            "gguf_models": [m.to_dict() for m in self.gguf_models],
            "verified": self.verified,
            "total_size": self.total_size,
            "files": [f.to_dict() for f in self.files],
            "hub_files": None if self.hub_files is None else [h.to_dict() for h in self.hub_files],
            "card": None if self.card is None else self.card.to_dict(),
        }


def write_manifest(result: PullResult) -> Path:
    """Write ``result`` as the manifest in its ``local_dir`` (atomically) and note where."""
    path = result.local_dir / MANIFEST_NAME
    try:
        atomic_write_json(path, result.to_dict())
    except OSError as e:
        raise HubError(f"cannot write the pull manifest {path}: {e.strerror or e}; "
                       "make the directory writable or pull into another --local-dir") from e
    result.manifest_path = path
    return path


def _load_manifest_json(p: Path) -> JsonObject:
    try:
        data = json.loads(read_regular_file(p, MAX_TEXT_FILE_BYTES).decode("utf-8"))
    except FileNotFoundError:
        raise HubManifestError(f"no pull manifest at {p}: run `ggufmtp pull` first") from None
    except OSError as e:
        raise HubManifestError(f"cannot read pull manifest {p}: {e.strerror or type(e).__name__}") from None
    except ValueError as e:
        raise HubManifestError(f"cannot read pull manifest {p}: {e}") from None
    if not isinstance(data, dict) or data.get("schema") != MANIFEST_SCHEMA:
        raise HubManifestError(f"{p} is not a ggufmtp pull manifest (schema {MANIFEST_SCHEMA!r} expected)")
    return data


def _recorded_hub_files(raw: Any) -> list[HubFile] | None:
    if raw is None:
        return None
    entries = (HubFile.from_dict(x) for x in (raw if isinstance(raw, list) else []))
    return [h for h in entries if h is not None]


def read_manifest(path: str | os.PathLike) -> PullResult:
    """Load a ``ggufmtp-pull.json`` (or the directory holding one) back into a ``PullResult``."""
    p = Path(path)
    if p.is_dir():
        p = p / MANIFEST_NAME
    data = _load_manifest_json(p)
    try:
        files = [PulledFile(path=f["path"], size=int(f["size"]), sha256=f["sha256"], verified=bool(f.get("verified")))
                 for f in data["files"]]
        models = [PulledModel(entry=m["entry"], shards=tuple(m["shards"])) for m in data.get("gguf_models") or []]
        return PullResult(
            repo_id=data.get("repo_id"), source=data["source"], requested_revision=data.get("requested_revision"),
            resolved_commit=data.get("resolved_commit"), endpoint_host=data.get("endpoint_host"),
            local_dir=p.parent, files=files, gguf_models=models, include=data.get("include"), exclude=data.get("exclude"),
            hub_files=_recorded_hub_files(data.get("hub_files")), manifest_path=p, card=PulledCard.of(data.get("card")),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise HubManifestError(f"pull manifest {p} is malformed ({e!r}); delete it and pull again") from None


def try_read_manifest(directory: Path) -> PullResult | None:
    """The manifest in ``directory``, or None when there is none or it cannot be read (logged)."""
    if not (directory / MANIFEST_NAME).is_file():
        return None
    try:
        return read_manifest(directory / MANIFEST_NAME)
    except HubError as e:
        log.warning("ignoring unreadable manifest: %s", e)
        return None
