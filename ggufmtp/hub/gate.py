"""The publish gate: what ``upload`` requires of every artifact before a byte is sent.

For each artifact: a receipt that parses (plain in-toto statement or DSSE envelope) and whose
subject digest is the artifact's sha256; a passing verification bound to those bytes (verdict
``pass``, ``verification.model.sha256`` equal to the digest) unless ``allow_unverified``, in which
case the card must say so (:data:`~ggufmtp.provenance.card.UNVERIFIED_HEADING`); and, when a
public key is configured (``--public-key`` / ``$GGUFMTP_PUBLIC_KEY``), a valid receipt signature and
a valid artifact signature ``ARTIFACT.sig``. Every receipt must describe one of the artifacts.
A dry run goes through the same gate, so it refuses exactly what the real upload refuses.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import AuditError, HubRefusedError
from ..provenance.card import UNVERIFIED_HEADING, unverified_reason
from ..provenance.receipt import read_receipt
from ..provenance.signing import signature_path, verify_artifact, verify_receipt

__all__ = ["ArtifactCheck", "PublishCheck", "check_publishable"]

ALLOW_HINT = "pass --allow-unverified to publish it anyway (its card must then say so)"


@dataclass(frozen=True)
class ArtifactCheck:
    """What the gate found for one artifact."""

    artifact: Path
    sha256: str
    receipt: Path
    receipt_signed: bool
    problem: str | None  # why it is not verified; None: a passing verification of these bytes
    signature: Path | None  # ARTIFACT.sig when present (uploaded alongside)
    signatures_checked: bool  # receipt and artifact signatures checked against a public key

    @property
    def verified(self) -> bool:
        return self.problem is None

    def to_dict(self) -> dict[str, Any]:
        return {"artifact": self.artifact.name, "sha256": self.sha256, "receipt": self.receipt.name,
                "receipt_signed": self.receipt_signed, "verified": self.verified, "problem": self.problem,
                "signature": self.signature.name if self.signature else None,
                "signatures_checked": self.signatures_checked}


@dataclass(frozen=True)
class PublishCheck:
    """The gate's findings for a whole upload."""

    artifacts: tuple[ArtifactCheck, ...]
    allow_unverified: bool

    @property
    def unverified(self) -> list[ArtifactCheck]:
        return [a for a in self.artifacts if not a.verified]

    def to_dict(self) -> list[dict[str, Any]]:
        return [a.to_dict() for a in self.artifacts]


@dataclass(frozen=True)
class _Receipt:
    path: Path
    statement: dict[str, Any]
    signed: bool

    def digests(self) -> set[str]:
        subjects = self.statement.get("subject")
        out = set()
        for s in subjects if isinstance(subjects, list) else []:
            dig = s.get("digest") if isinstance(s, dict) else None
            sha = dig.get("sha256") if isinstance(dig, dict) else None
            if isinstance(sha, str):
                out.add(sha.lower())
        return out


def _parsed(path: Path) -> _Receipt:
    try:
        rf = read_receipt(path)
    except AuditError as e:
        raise HubRefusedError(f"refusing to upload with receipt {path}: {e}") from None
    return _Receipt(path, rf.statement, bool(rf.signed))


def _match(artifacts: Mapping[Path, str], receipts: list[_Receipt]) -> dict[Path, _Receipt]:
    """The receipt of each artifact (by subject digest); refuses an artifact no receipt describes
    and a receipt that describes none of the artifacts."""
    found: dict[Path, _Receipt] = {}
    for art, sha in artifacts.items():
        rc = next((r for r in receipts if sha.lower() in r.digests()), None)
        if rc is None:
            described = "; ".join(f"{r.path} describes sha256 {', '.join(sorted(r.digests())) or '(none)'}"
                                  for r in receipts)
            raise HubRefusedError(f"no receipt describes {art} (sha256 {sha}): {described}. The receipt belongs "
                                  "to another file, or the artifact changed after it was written")
        found[art] = rc
    shas = {s.lower() for s in artifacts.values()}
    for r in receipts:
        if not r.digests() & shas:
            raise HubRefusedError(f"receipt {r.path} describes none of the files being uploaded (its sha256 "
                                  f"{', '.join(sorted(r.digests())) or '(none)'}): it belongs to another artifact")
    return found


def _check_signatures(art: Path, rc: _Receipt, public_key: Path) -> None:
    """The receipt's DSSE signature, then the artifact's model-signing signature ``ARTIFACT.sig``."""
    sig = signature_path(art)
    try:
        verify_receipt(rc.path, public_key)
        if not sig.is_file():
            raise AuditError(f"{art} has no signature {sig.name}: sign it (`--signing-key`) or publish without "
                             "--public-key / $GGUFMTP_PUBLIC_KEY")
        verify_artifact(art, public_key, sig)
    except AuditError as e:
        raise HubRefusedError(f"refusing to upload {art}: signature check against {public_key} failed: {e}") from None


def _check_card(card: Path | None, unverified: list[ArtifactCheck]) -> None:
    if card is None or not unverified:
        return
    try:
        text = card.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise HubRefusedError(f"cannot read the card {card}: {e}") from None
    if UNVERIFIED_HEADING not in text:
        names = ", ".join(a.artifact.name for a in unverified)
        raise HubRefusedError(f"the card {card} does not state that {names} is not verified (no "
                              f"{UNVERIFIED_HEADING!r} section): regenerate it with `ggufmtp card` from the receipt")


def check_publishable(artifacts: Mapping[Path, str], receipts: Sequence[Path], card: Path | None = None, *,
                      allow_unverified: bool = False, public_key: Path | None = None) -> PublishCheck:
    """Check an upload against the gate (module docstring); ``artifacts`` maps each artifact to its
    sha256. Raises HubRefusedError naming the file and the reason; returns the findings."""
    parsed = [_parsed(Path(r)) for r in receipts]
    matched = _match(artifacts, parsed)
    checks = []
    for art, sha in artifacts.items():
        rc = matched[art]
        if public_key is not None:
            _check_signatures(art, rc, public_key)
        problem = unverified_reason(rc.statement, sha)
        if problem and not allow_unverified:
            raise HubRefusedError(f"refusing to publish {art}: {problem}; {ALLOW_HINT}")
        sig = signature_path(art)
        checks.append(ArtifactCheck(art, sha, rc.path, rc.signed, problem, sig if sig.is_file() else None,
                                    public_key is not None))
    result = PublishCheck(tuple(checks), allow_unverified)
    _check_card(card, result.unverified)
    return result
