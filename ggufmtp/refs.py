"""The one model-reference resolver: ``builtin:NAME``, a local path, or a Hub repo ``owner/name[@rev]``.

The command line and the public functions that read a model (``inspect``, ``plan``, ``quantize``,
``verify``, ``evaluate``, ``compute_imatrix``) take a path or ``builtin:NAME`` and make it a path
with :func:`local_model_arg`; :mod:`ggufmtp.pipeline` (``run``) and the ladder also pull a Hub
repo (:func:`resolve`). A built-in model is synthesized once and cached
(:func:`ggufmtp.synth.builtin.builtin_path`; ``*-trained`` ones are trained once,
:func:`ggufmtp.train.builtin.trained_builtin_path`); a Hub repo is pulled, pinned to a commit.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import GgufmtpError

if TYPE_CHECKING:  # annotations only: the Hub client is imported when a pull happens
    from .hub.manifest import PullResult

BUILTIN_PREFIX = "builtin:"


class RefKind(enum.StrEnum):
    """Where a model reference points."""

    BUILTIN = "builtin"
    LOCAL = "local"
    HUB = "hub"


@dataclasses.dataclass(frozen=True)
class ModelRef:
    """A parsed model reference. ``ident``: ``builtin:NAME``, an absolute path, or a repo id."""

    kind: RefKind
    ident: str
    revision: str | None = None


@dataclasses.dataclass(frozen=True)
class ResolvedModel:
    """A reference made local: the model's path and, for a Hub pull, the pull's manifest."""

    path: Path
    manifest: PullResult | None = None


def is_builtin(model: str | os.PathLike) -> bool:
    return str(model).startswith(BUILTIN_PREFIX)


def parse_model_ref(model: str) -> ModelRef:
    """``builtin:NAME`` | an existing local path | ``REPO_ID[@REV]``; anything else is an error."""
    if is_builtin(model):
        return ModelRef(RefKind.BUILTIN, model)
    if Path(model).exists():
        return ModelRef(RefKind.LOCAL, str(Path(model).resolve()))
    repo, _, rev = model.partition("@")
    if repo.count("/") != 1 or repo.startswith(("/", ".")):
        raise GgufmtpError(f"{model}: not a file, not builtin:NAME and not a Hub repo id (owner/name[@revision])")
    return ModelRef(RefKind.HUB, repo, rev or None)


def builtin_model_path(name: str) -> Path:
    """The path of built-in model ``builtin:NAME`` (synthesized, or for ``*-trained`` trained and
    converted, on first use, then cached)."""
    # Function-level imports: synthesizing pulls in numpy and the GGUF writer, training PyTorch,
    # which a command that never names a built-in model should not pay for at start-up.
    from .train.builtin import is_trained_builtin, trained_builtin_path

    if is_trained_builtin(name):
        return trained_builtin_path(name, progress=True)  # minutes the first time: say so on stderr
    from .synth.builtin import builtin_path

    return builtin_path(name)


def local_model_arg(model: str | os.PathLike) -> str:
    """A model argument of a command or function that needs a file: ``builtin:NAME`` becomes the
    synthesized model's path; anything else is passed on unchanged, as a string (the caller checks
    it, with its own error)."""
    return str(builtin_model_path(str(model))) if is_builtin(model) else os.fspath(model)


def resolve(ref: ModelRef, *, local_dir: str | os.PathLike | None = None, include: Sequence[str] | None = None,
            token: str | bool | None = None, progress: bool = True) -> ResolvedModel:
    """Make ``ref`` a local model file: synthesize a built-in one, take a path as is, or pull a
    Hub repo into ``local_dir`` (``include`` selects the files) and require exactly one model there."""
    if ref.kind is RefKind.BUILTIN:
        return ResolvedModel(builtin_model_path(ref.ident))
    if ref.kind is RefKind.LOCAL:
        return ResolvedModel(Path(ref.ident))
    # Function-level import: huggingface_hub is a heavy optional dependency of this step only.
    from .hub.pull import pull

    res = pull(ref.ident, revision=ref.revision, include=include, local_dir=local_dir, token=token, progress=progress)
    if res.model_path is None:
        raise GgufmtpError(f"{ref.ident}: the pulled files hold {len(res.gguf_models)} GGUF models; "
                           f"choose one with --include")
    return ResolvedModel(Path(res.model_path), res)
