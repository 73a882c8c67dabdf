"""The nouns every measuring command reports (verify, tune, curve, profiles): the measured model
(:class:`ModelInfo`), the llama-server that served it (:class:`ServerInfo`), the bootstrap that gave
the confidence intervals (:class:`BootstrapInfo`) and the served file's identity
(:class:`ServedFile`: its sha256, checked unchanged after the run).

Each command's JSON kept the keys it always had, so a record's :meth:`~Keyed.to_dict` takes the
keys to write, in their order (by default every field, in field order).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import GgufmtpError, VerifyError
from ...files.digest_cache import DigestCache, FileKey, file_key
from ...files.hashing import sha256_cached
from ...gguf.model import split_shards
from ...provenance.numerics import EXCERPT_BEFORE
from ...provenance.statement import NamedDigest
from ...runtime.build import cache_root

__all__ = ["Keyed", "ModelInfo", "ArmFlags", "ServerInfo", "BootstrapInfo", "ServedFile", "ServedSet", "first_difference"]


class Keyed:
    """A dataclass whose JSON form is a chosen subset of its fields in a chosen order."""

    def to_dict(self, keys: Sequence[str] | None = None) -> dict[str, Any]:
        """The fields named by ``keys`` (default: all, in field order), values as plain JSON data."""
        d = dataclasses.asdict(self)  # type: ignore[call-overload]
        return d if keys is None else {k: d[k] for k in keys}


@dataclass(frozen=True)
class ModelInfo(Keyed):
    """The measured GGUF. ``sha256``: the digest of the bytes llama-server served (verify).
    ``mtp_block``: the first MTP block; ``mtp_blocks``: all of them, when the caller named them
    (a chain: ``nextn_predict_layers`` > 1); left out of the JSON when not named."""

    path: str
    size_bytes: int | None = None
    architecture: str | None = None
    mtp_block: int | None = None
    file_type: Any = None
    sha256: str | None = None
    mtp_blocks: list[int] | None = None
    sidecar: dict[str, str] | None = None  # the MTP-only sidecar served with it (-md): name and sha256
    shards: list[NamedDigest] | None = None  # a split model: every shard served, in order (ServedSet)

    def to_dict(self, keys: Sequence[str] | None = None) -> dict[str, Any]:
        d = super().to_dict(keys)
        for optional in ("mtp_blocks", "sidecar", "shards"):  # not named: the JSON such a record always had
            if d.get(optional) is None:
                d.pop(optional, None)
        return d

    @property
    def mtp_where(self) -> str:
        """``blk.4``, or ``blk.40, blk.41`` for a chain: the MTP blocks as reports name them."""
        blocks = self.mtp_blocks or [self.mtp_block]
        where = ", ".join(f"blk.{b}" for b in blocks)
        return f"{where} of sidecar {self.sidecar['name']}" if self.sidecar else where


# The keys of ``model`` in each command's JSON.
TUNE_MODEL_KEYS = ("path", "size_bytes", "architecture", "mtp_block", "mtp_blocks")
CURVE_MODEL_KEYS = ("path", "architecture", "mtp_block", "mtp_blocks")
PROFILES_MODEL_KEYS = ("path", "size_bytes")


@dataclass(frozen=True)
class ArmFlags:
    """The flags each arm's llama-server ran with (model and address left out): vanilla's, and the
    MTP arm's per draft window (``str(k)``)."""

    vanilla: list[str]
    mtp: dict[str, list[str]]


@dataclass(frozen=True)
class ServerInfo(Keyed):
    """The llama-server a measurement ran: its build and binary; for verify also the version, the
    flags of both arms (model and address left out; the MTP arm's per draft window) and the chat
    template's thinking modes; for tune the command lines as run."""

    build_info: str | None
    binary: str
    commit: str | None = None
    version: str | None = None
    variant: str | None = None
    flags: ArmFlags | None = None
    mtp_build_info: str | None = None
    chat_template_sha256: str | None = None
    thinking_modes: list[str] | None = None
    log: str | None = None
    vanilla: str | None = None  # tune: the vanilla server's command line as run
    measured_commands: dict[str, str] | None = None  # tune: the final configurations' command lines


VERIFY_SERVER_KEYS = ("build_info", "binary", "commit", "version", "variant", "flags", "mtp_build_info",
                      "chat_template_sha256", "thinking_modes", "log")
TUNE_SERVER_KEYS = ("binary", "build_info", "vanilla", "measured_commands")
CURVE_SERVER_KEYS = ("binary", "build_info")


@dataclass(frozen=True)
class BootstrapInfo(Keyed):
    """How the 95% confidence intervals were computed."""

    unit: str
    resamples: int
    level: float = 0.95
    method: str = "percentile"
    rng: str | None = None
    acceptance: str | None = None
    speedup: str | None = None


VERIFY_BOOTSTRAP_KEYS = ("unit", "method", "level", "resamples", "rng", "acceptance", "speedup")
TUNE_BOOTSTRAP_KEYS = ("unit", "resamples", "level", "method")


@dataclass(frozen=True)
class ServedFile:
    """A model file's identity as llama-server is about to serve it: the sha256 of its bytes, and
    the file's key (device, inode, size, mtime_ns and ctime_ns: the digest cache's) that shows it
    unchanged afterwards. ctime cannot be set back by a writer, so an edit that restores the size
    and mtime is still seen."""

    path: Path
    sha256: str
    key: FileKey

    @property
    def size(self) -> int:
        return self.key.size

    @classmethod
    def of(cls, path: str | os.PathLike) -> ServedFile:
        """Hash ``path``; VerifyError when it changes while being hashed. The digest ggufmtp recorded
        for this very file, unchanged (device, inode, size, mtime, ctime: :mod:`ggufmtp.files.digest_cache`),
        is reused: a ladder verified each variant against a 21.6 GB BF16 reference and hashed it again
        for every variant (~15 s of a core each time); ``check_unchanged`` still holds the run to the
        key the digest belongs to."""
        p = Path(path)
        before = file_key(p.stat())
        digest, _ = sha256_cached(p, DigestCache.under(cache_root()))
        out = cls(p, digest, before)
        out.check_unchanged("while it was hashed")
        return out

    def check_unchanged(self, when: str = "during the run") -> None:
        """VerifyError naming the file when its key differs from when it was hashed."""
        try:
            now = file_key(self.path.stat())
        except OSError as e:
            raise VerifyError(f"model {self.path}: gone {when} ({e.strerror or e}); the measured bytes "
                              "cannot be named") from e
        if now != self.key:
            raise VerifyError(f"model {self.path}: changed {when} (file key {self.key.text()} -> {now.text()}: device:inode:size:"
                              f"mtime_ns:ctime_ns); the measured bytes are not the ones hashed (sha256 "
                              f"{self.sha256}): verify again on a file nothing writes to")


@dataclass(frozen=True)
class ServedSet:
    """Every file llama-server loads for one model: a split model's shards in order (it reads the
    MTP head from the last one), else the one file; each a :class:`ServedFile`, hashed before the
    servers start and checked unchanged after the run, so no byte served goes unnamed."""

    files: tuple[ServedFile, ...]

    @classmethod
    def of(cls, path: str | os.PathLike) -> ServedSet:
        """Hash ``path`` and, when it is a split model's first shard, every other shard."""
        try:
            shards = split_shards(Path(path))
        except GgufmtpError as e:
            raise VerifyError(str(e)) from None
        return cls(tuple(ServedFile.of(s) for s in shards))

    @property
    def first(self) -> ServedFile:
        """The file a server is given (``-m``): a split model's first shard."""
        return self.files[0]

    @property
    def digests(self) -> list[str]:
        return [f.sha256 for f in self.files]

    def shards(self) -> list[NamedDigest] | None:
        """Every shard by name and sha256 (None for one file): the verification's ``model.shards``."""
        return [NamedDigest(name=f.path.name, sha256=f.sha256) for f in self.files] if len(self.files) > 1 else None

    def check_unchanged(self, when: str = "during the run") -> None:
        for f in self.files:
            f.check_unchanged(when)


def first_difference(a: str, b: str) -> tuple[int, str, str]:
    """Where two replies first differ, with 30 characters before it (``EXCERPT_BEFORE``) to 50 after, of each."""
    i = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))
    lo = max(0, i - EXCERPT_BEFORE)
    return i, a[lo:i + 50], b[lo:i + 50]
