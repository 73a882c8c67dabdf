"""Every error class ggufmtp raises on purpose, in one place.

Each message names the file or thing at fault and what to do; the CLI prints it as one line and
exits non-zero. Where a builtin exception fits, a class co-inherits it (the huggingface_hub
convention, e.g. ``LocalEntryNotFoundError(FileNotFoundError, EntryNotFoundError)``), so callers
may catch either ``ggufmtp.errors.GGUFReadError`` or plain ``ValueError``.
"""

from __future__ import annotations

import os

__all__ = [
    "GgufmtpError", "DigestMismatch", "AuditDigestMismatch", "GGUFReadError", "RuntimeMissingError", "RuntimeBuildError", "RecipeError",
    "TomlError", "ImatrixError", "CorpusError", "PlanError", "QuantizeError", "UnpredictableHeader", "AuditError",
    "ServerError", "VerifyError", "MemoryPlanError",
    "SuiteError",
    "TuneError", "FatalTuneError", "LossyOptionError", "ProfileError", "BandwidthError", "SynthError", "HubError",
    "HubHTTPError", "HubDigestMismatchError", "HubManifestError", "HubRefusedError",
    "QualityError", "ModelMismatchError", "LogitsFileError", "HeadSweepError",
    "ConvertError", "ConvertDependencyError", "LadderError", "TrainError", "TrainDependencyError",
    "SearchError", "CardError",
]


class GgufmtpError(Exception):
    """Base class of every error ggufmtp raises on purpose. The CLI prints it as one line.

    Besides the message, an error carries the facts a caller may act on as fields (as
    huggingface_hub's errors carry their response): ``path``, the file at fault when there is one;
    a digest mismatch (:class:`DigestMismatch`) adds the ``expected`` and ``actual`` sha256; a
    server's failure (:class:`ServerError`) its ``log_path``."""

    def __init__(self, message: str = "", *, path: str | os.PathLike[str] | None = None):
        super().__init__(message)
        self.path: str | None = None if path is None else os.fspath(path)


class DigestMismatch(GgufmtpError):
    """A file's bytes are not the ones recorded for it: ``expected`` and ``actual`` are the two
    sha256 digests (``actual`` None when the file could not be hashed), ``path`` the file."""

    def __init__(self, message: str = "", *, path: str | os.PathLike[str] | None = None,
                 expected: str | None = None, actual: str | None = None):
        super().__init__(message, path=path)
        self.expected, self.actual = expected, actual


# ----------------------------------------------------------------------------- files and formats


class GGUFReadError(GgufmtpError, ValueError):
    """A file is not a readable GGUF (wrong magic, truncated, corrupt, hostile counts)."""


class ImatrixError(GgufmtpError, ValueError):
    """An imatrix file is malformed, invalid or made for another model."""


class CorpusError(GgufmtpError, ValueError):
    """A calibration/evaluation text corpus is missing, empty, binary or too short."""


class RecipeError(GgufmtpError, ValueError):
    """A recipe file is malformed or names an unknown type."""


class TomlError(GgufmtpError, ValueError):
    """Bytes that are not a TOML document ggufmtp reads (not UTF-8, not TOML, nested too deep:
    :func:`ggufmtp.files.tomlfile.loads_toml`); callers wrap it in their own error naming the file."""


# ----------------------------------------------------------------------------- the pinned runtime


class RuntimeMissingError(GgufmtpError, FileNotFoundError):
    """A llama.cpp binary or library could not be found."""


class RuntimeBuildError(GgufmtpError):
    """Building the llama.cpp runtime failed."""


class ServerError(GgufmtpError):
    """llama-server failed to start, crashed or misbehaved; ``log_path``: its log, when it has one."""

    def __init__(self, message: str = "", *, path: str | os.PathLike[str] | None = None,
                 log_path: str | os.PathLike[str] | None = None):
        super().__init__(message, path=path)
        self.log_path: str | None = None if log_path is None else os.fspath(log_path)


# ----------------------------------------------------------------------------- quantization


class PlanError(GgufmtpError):
    """Pre-flight checks failed; ``errors`` lists every problem found."""

    def __init__(self, message: str, errors: list[str] | None = None):
        super().__init__(message)
        self.errors = list(errors or [])


class QuantizeError(GgufmtpError):
    """Quantization failed or its result does not match the plan."""


# ----------------------------------------------------------------------------- provenance


class UnpredictableHeader(QuantizeError):
    """quantize cannot predict its output's header exactly (the message says why); never shown to a
    user: the output is then hashed after the write instead of while it is written."""


class AuditError(GgufmtpError):
    """An artifact does not match its receipt, or a receipt cannot be read."""


class AuditDigestMismatch(AuditError, DigestMismatch):
    """An artifact, imatrix or model is not the file its receipt records: ``expected`` / ``actual``."""


# ----------------------------------------------------------------------------- measurement


class VerifyError(GgufmtpError):
    """Verification could not run (e.g. speculation never drafted)."""


class MemoryPlanError(VerifyError):
    """A phase of the verification does not fit the GPUs' free memory (refused before any work:
    :mod:`ggufmtp.runtime.memory`)."""


class SuiteError(VerifyError, ValueError):
    """A prompt suite file is missing or malformed."""


class TuneError(VerifyError):
    """The tuner (or the curve) could not run as asked."""


class FatalTuneError(TuneError):
    """A failure that is not the configuration's fault (e.g. the vanilla server died): stops the search."""


class LossyOptionError(TuneError):
    """A configuration's non-speculative settings change the output itself (its vanilla writes other
    text than the default vanilla): the speed it buys is not lossless, so it leaves the search."""


class ProfileError(VerifyError):
    """A serving profile could not run."""


class BandwidthError(GgufmtpError, ValueError):
    """The peak memory bandwidth given (flag or environment) is not a positive number."""


# ----------------------------------------------------------------------------- quality (eval, head sweep)


class QualityError(GgufmtpError):
    """A quality measurement (``eval``: llama-perplexity KL-divergence; ``head-sweep``) failed."""


class ModelMismatchError(QualityError, ValueError):
    """Two models that must be the same model (base and quant) are not: architecture or vocabulary differ."""


class LogitsFileError(QualityError, ValueError):
    """A base-logits file is truncated, not one, or would not fit on the disk."""


class HeadSweepError(QualityError):
    """A head-precision sweep cannot run or its variants are not comparable (trunks differ)."""


# ----------------------------------------------------------------------------- synthetic models


class SynthError(GgufmtpError, ValueError):
    """A synthetic model cannot be made as asked."""


# ----------------------------------------------------------------------------- the Hub


class HubError(GgufmtpError):
    """A Hugging Face Hub operation failed or was refused."""


class HubHTTPError(HubError, ConnectionError):
    """The Hub (or the network to it) answered with an error or not at all: a retry may succeed."""


class HubDigestMismatchError(HubError, DigestMismatch, ValueError):
    """A file's bytes do not match the digest the Hub (or an earlier pull) recorded for it:
    the download is corrupt or was altered. Retrying the same bytes will not help."""


class HubManifestError(HubError, ValueError):
    """A pull manifest is missing, unreadable or not ggufmtp's."""


class HubRefusedError(HubError, ValueError):
    """ggufmtp refused the operation before talking to the Hub (bad repo id, unsafe path, missing receipt)."""


# ----------------------------------------------------------------------------- from safetensors


class ConvertError(GgufmtpError, ValueError):
    """A safetensors checkpoint cannot be converted, or the converted GGUF lost part of it (the MTP block)."""


class ConvertDependencyError(ConvertError, ImportError):
    """The optional conversion dependencies (PyTorch, transformers) are not installed."""


class LadderError(GgufmtpError, ValueError):
    """A ladder that cannot run: a bad ladder file or option, a missing engine, a variant that failed."""


class CardError(GgufmtpError, ValueError):
    """A model card that cannot be written as asked: a ``--base-model`` that is not a Hub model repo id."""


class SearchError(GgufmtpError, ValueError):
    """A recipe search that cannot run or cannot succeed: a budget no allocation fits (the message
    names the smallest feasible size), a group without an allowed candidate, a bad sensitivity table."""


class TrainError(GgufmtpError, ValueError):
    """Training a model (``ggufmtp train``, ``builtin:*-trained``) cannot run: a bad option, no data, a
    diverged loss, or an output that would not convert."""


class TrainDependencyError(TrainError, ImportError):
    """The optional training dependencies (PyTorch, transformers) are not installed."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, delivered as an interrupt (``ggufmtp.__main__``) so that every cleanup written for
    Ctrl-C runs for it too; the CLI exits 143 for it."""
