"""One error hierarchy; every message names the file or thing at fault and what to do."""

from __future__ import annotations


class GgufmtpError(Exception):
    """Base class of every error ggufmtp raises on purpose. The CLI prints it as one line."""


class GGUFReadError(GgufmtpError):
    """A file is not a readable GGUF (wrong magic, truncated, corrupt)."""


class RuntimeMissingError(GgufmtpError):
    """A llama.cpp binary or library could not be found."""


class RuntimeBuildError(GgufmtpError):
    """Building the llama.cpp runtime failed."""


class RecipeError(GgufmtpError):
    """A recipe file is malformed or names an unknown type."""


class ImatrixError(GgufmtpError):
    """An imatrix file is malformed, invalid or made for another model."""


class PlanError(GgufmtpError):
    """Pre-flight checks failed; ``errors`` lists every problem found."""

    def __init__(self, message: str, errors: list[str] | None = None):
        super().__init__(message)
        self.errors = list(errors or [])


class QuantizeError(GgufmtpError):
    """Quantization failed or its result does not match the plan."""


class AuditError(GgufmtpError):
    """An artifact does not match its receipt."""


class ServerError(GgufmtpError):
    """llama-server failed to start, crashed or misbehaved."""


class VerifyError(GgufmtpError):
    """Verification could not run (e.g. speculation never drafted)."""


class HubError(GgufmtpError):
    """A Hugging Face Hub operation failed or was refused."""
