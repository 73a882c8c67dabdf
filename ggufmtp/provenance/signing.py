"""Signatures with the field's standard: OpenSSF model-signing for artifacts, DSSE for receipts.

- An artifact ``X.gguf`` is signed with the OpenSSF ``model-signing`` library (key-based
  elliptic-curve signing, offline) into ``X.gguf.sig``, a Sigstore bundle that the library's own
  verifier accepts: ``model_signing verify key X.gguf --signature X.gguf.sig --public_key pub.pem``.
- A receipt (an in-toto Statement v1) is signed with the same key by wrapping it in a DSSE
  envelope (``payloadType`` ``application/vnd.in-toto+json``; the signature covers DSSE's
  pre-authentication encoding of type and payload), made and checked by ``securesystemslib``'s
  DSSE implementation (installed with model-signing, through sigstore and tuf).

An unsigned receipt only carries its own checksum: it detects accidental edits, not forgery
(anyone can recompute it). Keys are PEM files; errors name the file, never its content.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, cast

from ..errors import AuditError
from ..files.fsutil import atomic_write_text, read_regular_file
from ..files.jsonfile import MAX_JSON_BYTES, one_line, parse_json_bytes, read_json_file
from ..jsontypes import JsonObject
from .statement import Envelope, Statement

log = logging.getLogger(__name__)

ENV_SIGNING_KEY = "GGUFMTP_SIGNING_KEY"
ENV_PUBLIC_KEY = "GGUFMTP_PUBLIC_KEY"
DSSE_PAYLOAD_TYPE = "application/vnd.in-toto+json"
UNSIGNED_NOTE = "unsigned: checksum only, detects accidental edits, not forgery"
SIGNATURE_SUFFIX = ".sig"

# A receipt is a few hundred KiB at most and a handful of levels deep: anything far beyond that is
# not a receipt, and reading it must not exhaust memory or the recursion limit.
_MAX_KEY_BYTES = 1024 * 1024
_CURVES = ("secp256r1", "secp384r1", "secp521r1")  # what model-signing accepts


# ----------------------------------------------------------------------------- keys


def resolve_signing_key(option: str | os.PathLike | None) -> Path | None:
    """The signing key to use: ``option``, else ``$GGUFMTP_SIGNING_KEY``, else None (unsigned).
    The key is loaded once here, so a bad key fails before any work (AuditError naming the file)."""
    return _resolve(option, ENV_SIGNING_KEY, load_private_key)


def resolve_public_key(option: str | os.PathLike | None) -> Path | None:
    """The public key to check signatures with: ``option``, else ``$GGUFMTP_PUBLIC_KEY``, else None."""
    return _resolve(option, ENV_PUBLIC_KEY, load_public_key)


def _resolve(option: str | os.PathLike | None, env: str, load) -> Path | None:
    where = option if option not in (None, "") else os.environ.get(env) or None
    if where is None:
        return None
    path = Path(where).expanduser()
    load(path)
    return path


def _key_bytes(path: Path, what: str) -> bytes:
    try:
        return read_regular_file(path, _MAX_KEY_BYTES)
    except OSError as e:
        raise AuditError(f"{what} {path}: cannot read it ({e.strerror or type(e).__name__})") from None


def load_private_key(path: str | os.PathLike):
    """The EC private key in the PEM file ``path`` (unencrypted PKCS#8 or SEC1)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    path = Path(path)
    data = _key_bytes(path, "signing key")
    _warn_if_readable(path)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise AuditError(f"signing key {path}: is encrypted; give an unencrypted PEM key file") from None
    except Exception:  # ValueError, UnsupportedAlgorithm...: never echo what the file holds
        raise AuditError(f"signing key {path}: not a PEM private key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise AuditError(f"signing key {path}: not an elliptic-curve private key (model-signing needs EC "
                         f"P-256, P-384 or P-521)")
    _check_curve(key.curve.name, path, "signing key")
    return key


_WARNED: set[str] = set()


def _warn_if_readable(path: Path) -> None:
    """One warning line (stderr, once per key file) when others than the owner may read a private key."""
    try:
        mode = path.stat().st_mode & 0o777
    except OSError:
        return
    if mode & 0o077 and str(path) not in _WARNED:
        _WARNED.add(str(path))
        who = "anyone" if mode & 0o007 else "its group"
        log.warning(f"warning: signing key {path} can be read by {who} (mode {mode:04o}); "
                    f"`chmod 600 {path.name}` keeps it private")


def load_public_key(path: str | os.PathLike):
    """The EC public key in the PEM file ``path``."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    path = Path(path)
    data = _key_bytes(path, "public key")
    try:
        key = serialization.load_pem_public_key(data)
    except Exception:  # never echo what the file holds
        raise AuditError(f"public key {path}: not a PEM public key") from None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise AuditError(f"public key {path}: not an elliptic-curve public key")
    _check_curve(key.curve.name, path, "public key")
    return key


def _check_curve(curve: str, path: Path, what: str) -> None:
    if curve not in _CURVES:
        raise AuditError(f"{what} {path}: curve {curve} is not supported (use P-256, P-384 or P-521)")


# ----------------------------------------------------------------------------- artifacts


def signature_path(artifact: str | os.PathLike) -> Path:
    """Where an artifact's signature lives: ``ARTIFACT.sig``."""
    artifact = Path(artifact)
    return artifact.with_name(artifact.name + SIGNATURE_SUFFIX)


def sign_artifact(artifact: str | os.PathLike, private_key: str | os.PathLike,
                  signature: str | os.PathLike | None = None) -> Path:
    """Sign ``artifact`` with model-signing into ``ARTIFACT.sig`` (or ``signature``; written
    atomically); returns its path. The bundle names the file by its name only, so a file signed
    where it is staged verifies under the same name anywhere."""
    from model_signing import signing

    artifact, private_key = Path(artifact), Path(private_key)
    load_private_key(private_key)
    if not artifact.is_file():
        raise AuditError(f"{artifact}: no such artifact to sign")
    out = Path(signature) if signature else signature_path(artifact)
    with tempfile.TemporaryDirectory(prefix="ggufmtp-sign-") as tmp:
        bundle = Path(tmp) / out.name
        try:
            signing.Config().use_elliptic_key_signer(private_key=private_key).sign(artifact, bundle)
        except OSError as e:
            raise AuditError(f"{artifact}: cannot sign it ({e.strerror or e})") from None
        text = bundle.read_text(encoding="utf-8")
    try:
        atomic_write_text(out, text)
    except OSError as e:
        raise AuditError(f"{out}: cannot write the signature ({e.strerror or type(e).__name__})") from None
    return out


def verify_artifact(artifact: str | os.PathLike, public_key: str | os.PathLike,
                    signature: str | os.PathLike | None = None) -> None:
    """Check ``artifact`` against its model-signing signature (default ``ARTIFACT.sig``) with
    ``public_key``, as ``model_signing verify key`` does. AuditError on any failure."""
    from model_signing import verifying

    artifact, public_key = Path(artifact), Path(public_key)
    load_public_key(public_key)
    sig = Path(signature) if signature else signature_path(artifact)
    if not os.path.lexists(sig):
        raise AuditError(f"{artifact}: no signature at {sig} (sign it with --signing-key)")
    try:  # a bundle is a small JSON file: anything else is refused before the verifier reads it
        read_regular_file(sig, MAX_JSON_BYTES)
    except OSError as e:
        raise AuditError(f"{artifact}: signature {sig}: {e.strerror or type(e).__name__}") from None
    if not artifact.is_file():
        raise AuditError(f"{artifact}: no such artifact")
    try:
        verifying.Config().use_elliptic_key_verifier(public_key=public_key).verify(artifact, sig)
    except Exception as e:  # the library raises ValueError, KeyError, protobuf and JSON errors alike
        raise AuditError(f"{artifact}: signature {sig} does not verify with {public_key}: "
                         f"{one_line(e)}") from None


# ----------------------------------------------------------------------------- DSSE envelopes


def is_envelope(data: Any) -> bool:
    """Whether parsed JSON is a DSSE envelope (rather than a plain statement)."""
    return isinstance(data, dict) and "payloadType" in data and "payload" in data


def sign_statement(statement: Statement, private_key: str | os.PathLike) -> Envelope:
    """The DSSE envelope (as JSON-ready dict) of ``statement``, signed with ``private_key``."""
    from securesystemslib.dsse import Envelope as DsseEnvelope
    from securesystemslib.signer import CryptoSigner

    key = load_private_key(private_key)
    payload = json.dumps(statement, indent=2, ensure_ascii=False, default=str).encode("utf-8") + b"\n"
    envelope = DsseEnvelope(payload=payload, payload_type=DSSE_PAYLOAD_TYPE, signatures={})
    envelope.sign(CryptoSigner(key))
    return cast(Envelope, envelope.to_dict())


_ENVELOPE_KEYS = {"payload", "payloadType", "signatures"}


def envelope_statement(envelope: JsonObject, where: str | os.PathLike) -> Any:
    """The JSON inside a DSSE envelope's payload (not verified: see :func:`verify_envelope`). The
    envelope holds DSSE's fields and nothing else."""
    extra = sorted(set(envelope) - _ENVELOPE_KEYS)
    if extra or not isinstance(envelope.get("signatures"), list):
        raise AuditError(f"{where}: not a DSSE envelope: " + (f"unknown field(s) {', '.join(extra)[:120]}" if extra
                                                              else "no signatures list"))
    if envelope.get("payloadType") != DSSE_PAYLOAD_TYPE:
        raise AuditError(f"{where}: DSSE payloadType is {str(envelope.get('payloadType'))[:80]!r}, "
                         f"not {DSSE_PAYLOAD_TYPE}")
    payload = envelope.get("payload")
    if not isinstance(payload, str):
        raise AuditError(f"{where}: DSSE payload is not a base64 string")
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise AuditError(f"{where}: DSSE payload is not valid base64") from None
    return parse_json_bytes(raw, f"{where} (DSSE payload)")


def verify_envelope(envelope: Envelope, public_key: Any, where: str | os.PathLike) -> None:
    """Check the DSSE signature of ``envelope`` with ``public_key`` (a PEM file, or a key object:
    the public half of a signing key); AuditError naming ``where``."""
    from securesystemslib.dsse import Envelope as DsseEnvelope
    from securesystemslib.signer import SSlibKey

    by_path = isinstance(public_key, (str, os.PathLike))
    key = SSlibKey.from_crypto(load_public_key(public_key) if by_path else public_key)
    name = public_key if by_path else "the signing key's public key"
    try:
        parsed = DsseEnvelope.from_dict(copy.deepcopy(cast(JsonObject, envelope)))
    except Exception as e:  # KeyError, FormatError, ValueError: a malformed envelope
        raise AuditError(f"{where}: not a well-formed DSSE envelope ({one_line(e)})") from None
    if parsed.payload_type != DSSE_PAYLOAD_TYPE:
        raise AuditError(f"{where}: DSSE payloadType is not {DSSE_PAYLOAD_TYPE}")
    try:
        parsed.verify([key], 1)
    except Exception:  # VerificationError: no signature by this key verifies
        raise AuditError(f"{where}: the receipt's DSSE signature does not verify with {name} "
                         f"(edited after signing, or signed with another key)") from None


def verify_receipt(path: str | os.PathLike, public_key: str | os.PathLike) -> None:
    """Check that the receipt at ``path`` is a DSSE envelope signed by ``public_key``'s key
    (AuditError otherwise; an unsigned receipt fails: its checksum proves nothing against forgery)."""
    data = read_json_file(path, "receipt")
    if not is_envelope(data):
        raise AuditError(f"{path}: {UNSIGNED_NOTE}; a signed receipt is required with a public key")
    verify_envelope(data, public_key, path)
