"""What ggufmtp puts between itself and huggingface_hub: secrets, errors, endpoint and cache.

* **Tokens never leak**: they come from huggingface_hub's usual sources (``HF_TOKEN``, the token
  file, or the ``token`` argument); while a Hub operation runs (``guard_secrets``) every log
  record of any logger and thread is scrubbed, and so is every error message (``hub_errors``).
* **One actionable error per failure**: ``hub_errors`` maps huggingface_hub / requests / httpx
  exceptions to the ggufmtp error of the right kind (``errors.HubHTTPError`` when the Hub or the
  network answered with an error or not at all, ``errors.HubRefusedError`` for input the client
  refused, plain ``errors.HubError`` for local trouble such as a full disk or offline cache misses).
* **Endpoint, offline mode and cache** are read when needed, never at import, so tests and
  callers may change ``HF_ENDPOINT`` / ``HF_HUB_OFFLINE`` / the cache at run time.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, NotRequired, TypedDict
from urllib.parse import urlsplit

from tqdm import tqdm

from ..errors import HubError, HubHTTPError, HubRefusedError

__all__ = ["SilentBar", "cache_dir", "guard_secrets", "host", "hub_errors", "is_offline", "raise_hub_error",
           "resolve_endpoint", "scrub", "storage_folder"]

# ================================================================================================
# Secrets: tokens never reach logs, messages or files
# ================================================================================================

_BEARER_RE = re.compile(r"(?i)\b(bearer\s+)[^\s'\",;]+")
_HF_TOKEN_RE = re.compile(r"\bhf_[A-Za-z0-9]{30,}\b")
_INSTALLED = "__installed__"  # reference count of the scrubbing log-record factory
_secrets_lock = threading.Lock()
_active_secrets: dict[str, int] = {}  # secret -> reference count
_previous_factory: Any = None


def scrub(text: str, secrets: Iterable[str] | None = None) -> str:
    """``text`` with the given (default: every active) secret, bearer tokens and ``hf_...`` tokens masked."""
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
        clean = scrub(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and record.exc_info[1] is not None:
            text = logging.Formatter().formatException(record.exc_info)
            clean_exc = scrub(text)
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


def _register_secrets(secrets: list[str]) -> None:
    global _previous_factory
    with _secrets_lock:
        if not _active_secrets.get(_INSTALLED):
            _previous_factory = logging.getLogRecordFactory()
            logging.setLogRecordFactory(_scrubbing_record_factory)
        _active_secrets[_INSTALLED] = _active_secrets.get(_INSTALLED, 0) + 1
        for s in secrets:
            _active_secrets[s] = _active_secrets.get(s, 0) + 1


def _release_secrets(secrets: list[str]) -> None:
    with _secrets_lock:
        for s in secrets:
            _active_secrets[s] -= 1
            if not _active_secrets[s]:
                del _active_secrets[s]
        _active_secrets[_INSTALLED] -= 1
        if not _active_secrets[_INSTALLED]:
            del _active_secrets[_INSTALLED]
            if logging.getLogRecordFactory() is _scrubbing_record_factory:
                logging.setLogRecordFactory(_previous_factory)


@contextlib.contextmanager
def guard_secrets(token: Any) -> Iterator[list[str]]:
    """Scrub the known tokens from every log record created while inside (any logger, any thread)."""
    secrets = _known_tokens(token)
    _register_secrets(secrets)
    try:
        yield secrets
    finally:
        _release_secrets(secrets)


def _exception_chain_text(e: BaseException) -> str:
    parts, seen = [], set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        parts.append(f"{e!r} {e}")
        e = e.__cause__ or e.__context__
    return "\n".join(parts)


def raise_hub_error(message: str, original: BaseException, secrets: Sequence[str],
                    kind: type[HubError] = HubError) -> None:
    """Raise ``kind(message)`` scrubbed of ``secrets``, chained to ``original`` unless that carries a secret."""
    message = scrub(message, secrets)
    chain = _exception_chain_text(original)
    if scrub(chain, secrets) != chain:
        raise kind(message) from None  # the cause itself carries a secret: do not chain it
    raise kind(message) from original


# ================================================================================================
# Errors from huggingface_hub / the network -> one actionable error of the right kind
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


_BAD_HEADER_HINT = (" - the token contains a newline or another character not allowed in an HTTP header: "
                    "fix HF_TOKEN / the token file / the token argument")


def _bad_header(e: BaseException) -> bool:
    return "Illegal header value" in str(e) or "Invalid header value" in str(e)


def _hf_error_message(e: BaseException, what: str, repo_id: str, endpoint: str, revision: str | None,
                      writing: bool) -> tuple[str, type[HubError]] | None:
    """The message and kind for one of huggingface_hub's own errors, or None when ``e`` is not one."""
    from huggingface_hub import errors as hf_errors

    if isinstance(e, hf_errors.GatedRepoError):
        return (f"{what}: {repo_id} is gated: accept its conditions at {endpoint}/{repo_id} with the account whose "
                "token you use (HF_TOKEN or `hf auth login`)", HubHTTPError)
    if isinstance(e, hf_errors.RepositoryNotFoundError):
        return (f"{what}: repository {repo_id} not found on {host(endpoint)} (or it is private and your token cannot "
                "see it): check the name; for private repos set HF_TOKEN or run `hf auth login`", HubHTTPError)
    if isinstance(e, hf_errors.RevisionNotFoundError):
        return (f"{what}: revision {revision!r} does not exist in {repo_id}: pass a branch, tag or full commit sha "
                "that exists (see the repo's 'Files and versions' tab)", HubHTTPError)
    if isinstance(e, hf_errors.RemoteEntryNotFoundError):
        return f"{what}: the file is not in {repo_id} at this revision ({_server_message(e)})", HubHTTPError
    if isinstance(e, (hf_errors.OfflineModeIsEnabled, hf_errors.LocalEntryNotFoundError)):
        return (f"{what}: offline mode is on (HF_HUB_OFFLINE=1) and the needed files are not in the local cache: "
                "unset HF_HUB_OFFLINE and pull once with network access", HubError)
    if isinstance(e, hf_errors.HfHubHTTPError):
        status = _http_status(e)
        if status in (401, 403):
            action = "a token with write access to that namespace" if writing else "a token that can read it"
            return (f"{what}: HTTP {status} from {host(endpoint)} ({_server_message(e)}): set HF_TOKEN or run "
                    f"`hf auth login` with {action}", HubHTTPError)
        return f"{what}: HTTP {status} from {host(endpoint)}: {_server_message(e)}", HubHTTPError
    return None


def _other_error_message(e: BaseException, what: str, endpoint: str, writing: bool) -> tuple[str, type[HubError]]:
    """The message and kind for a transport, OS or other error raised inside a Hub operation."""
    if isinstance(e, _transport_errors()):
        if _bad_header(e):  # refused by the HTTP client itself: no retry will help
            return f"{what}: {type(e).__name__}: {e}{_BAD_HEADER_HINT}", HubRefusedError
        hint = "" if writing else "; to use files already downloaded, set HF_HUB_OFFLINE=1"
        return (f"{what}: cannot reach {endpoint} ({type(e).__name__}: {e}): check the network, proxy and HF_ENDPOINT"
                f"{hint}", HubHTTPError)
    if isinstance(e, OSError):  # local trouble (disk full, permissions)
        return f"{what}: {e}", HubError
    if isinstance(e, ValueError):  # huggingface_hub refusing bad input
        return f"{what}: {e}", HubRefusedError
    if isinstance(e, RuntimeError):  # huggingface_hub wrapping a failed upload
        return f"{what}: {_server_message(e.__cause__) if e.__cause__ else str(e)}", HubHTTPError
    # e.g. RevisionResolutionError, whose text embeds the transport error
    kind = HubRefusedError if _bad_header(e) else HubHTTPError
    return f"{what}: {type(e).__name__}: {e}{_BAD_HEADER_HINT if _bad_header(e) else ''}", kind


class HubErrorContext(TypedDict):
    """The keyword arguments of :func:`hub_errors` one pull or upload passes to each of its calls."""

    repo_id: str
    endpoint: str
    secrets: Sequence[str]
    revision: str | None
    writing: NotRequired[bool]


@contextlib.contextmanager
def hub_errors(what: str, *, repo_id: str, endpoint: str, secrets: Sequence[str], revision: str | None = None,
               writing: bool = False) -> Iterator[None]:
    """Turn any failure inside into one scrubbed ggufmtp error saying what failed and what to do."""
    try:
        yield
    except HubError as e:
        raise_hub_error(str(e), e, secrets, type(e))
    except Exception as e:  # KeyboardInterrupt and SystemExit pass through untouched
        found = _hf_error_message(e, what, repo_id, endpoint, revision, writing)
        message, kind = found or _other_error_message(e, what, endpoint, writing)
        raise_hub_error(message, e, secrets, kind)


# ================================================================================================
# Endpoint, offline mode, cache
# ================================================================================================


def resolve_endpoint(endpoint: str | None) -> str:
    """``endpoint`` if given, else ``$HF_ENDPOINT`` (read now, not at import), else the library default."""
    if endpoint:
        return endpoint.rstrip("/")
    if os.environ.get("HF_ENDPOINT"):
        return os.environ["HF_ENDPOINT"].rstrip("/")
    from huggingface_hub import constants

    return constants.ENDPOINT.rstrip("/")


def host(endpoint: str) -> str:
    """The endpoint's host[:port], never with ``user:password@``."""
    netloc = urlsplit(endpoint).netloc
    return netloc.rsplit("@", 1)[-1]


def is_offline() -> bool:
    """huggingface_hub's offline switch (``HF_HUB_OFFLINE``), as it reads it now."""
    from huggingface_hub import constants

    return bool(constants.is_offline_mode())


def cache_dir(path: str | os.PathLike | None) -> Path:
    """``path``, or huggingface_hub's cache (``HF_HUB_CACHE``), absolute."""
    from huggingface_hub import constants

    return Path(path if path is not None else constants.HF_HUB_CACHE).expanduser().resolve()


def storage_folder(cache: Path, repo_id: str) -> Path:
    """Where huggingface_hub keeps a model repo inside ``cache``."""
    return cache / ("models--" + repo_id.replace("/", "--"))


class SilentBar(tqdm):
    """tqdm switched off (``progress=False``): a class, as huggingface_hub's ``tqdm_class`` is
    (``snapshot_download`` sets totals on its bars and maps its workers through it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["disable"] = True
        super().__init__(*args, **kwargs)
