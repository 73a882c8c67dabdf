"""The publish gate: what ``upload`` requires of every artifact before a byte is sent.

For each artifact: the receipt that describes its bytes (by subject digest; every receipt must
describe one of the artifacts), then exactly the checks of ``ggufmtp audit ARTIFACT --receipt R
[--public-key K]`` (:func:`ggufmtp.provenance.audit.audit`; any failure refuses: an edited or
unsealed receipt, bytes that are not the recorded ones, a verdict its own figures contradict, a
signature that does not verify when a public key is configured by ``--public-key`` /
``$GGUFMTP_PUBLIC_KEY``), then a publishable verification of those bytes (verdict ``pass``, bound to
the digest, with at least the minimum evidence of :class:`~ggufmtp.provenance.verdict.Evidence`) unless
``allow_unverified``, in which case the card must say so where a reader sees it
(:data:`~ggufmtp.provenance.card.UNVERIFIED_HEADING` and each such file's name, outside HTML
comments). An MTP sidecar passes through its trunks' receipts (:mod:`.pair_gate`): it goes up beside a
trunk whose receipt names it and that it pairs with, and a trunk verified with a sidecar goes up with
it, audited as that pair. A passing verification whose thresholds judge nothing (a minimum of 0:
:func:`~ggufmtp.provenance.vacuous.vacuous_thresholds`) is refused unless the card says so too
(:data:`~ggufmtp.provenance.vacuous.VACUOUS_HEADING`, naming each threshold). A dry run goes through the same gate, so it
refuses exactly what the real upload refuses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import AuditError, HubRefusedError
from ..files.fsutil import MAX_TEXT_FILE_BYTES, read_regular_file
from ..jsontypes import JsonObject
from ..provenance.audit import AuditReport, Trust, audit
from ..provenance.card import UNVERIFIED_HEADING, unverified_reason
from ..provenance.receipt import Receipt, read_receipt
from ..provenance.signing import signature_path
from ..provenance.vacuous import VACUOUS_HEADING, vacuous_thresholds, visible_text
from .pair_gate import is_sidecar, sidecar_problem, trunk_sidecar

__all__ = ["ArtifactCheck", "PublishCheck", "check_publishable"]

ALLOW_HINT = "pass --allow-unverified to publish it anyway (its card must then say so)"


@dataclass(frozen=True)
class ArtifactCheck:
    """What the gate found for one artifact."""

    artifact: Path
    sha256: str
    receipt: Path
    receipt_signed: bool
    problem: str | None  # why it is not verified; None: a publishable verification of these bytes
    signature: Path | None  # ARTIFACT.sig when present (uploaded alongside)
    signatures_checked: bool  # receipt and artifact signatures verified with a public key
    trust: Trust | None = None  # the audit's

    @property
    def verified(self) -> bool:
        return self.problem is None

    def to_dict(self) -> JsonObject:
        return {"artifact": self.artifact.name, "sha256": self.sha256, "receipt": self.receipt.name,
                "receipt_signed": self.receipt_signed, "verified": self.verified, "problem": self.problem,
                "signature": self.signature.name if self.signature else None,
                "signatures_checked": self.signatures_checked, "trust": self.trust.value if self.trust else None}


@dataclass(frozen=True)
class PublishCheck:
    """The gate's findings for a whole upload."""

    artifacts: tuple[ArtifactCheck, ...]
    allow_unverified: bool

    @property
    def unverified(self) -> list[ArtifactCheck]:
        return [a for a in self.artifacts if not a.verified]

    def to_dict(self) -> list[JsonObject]:
        return [a.to_dict() for a in self.artifacts]


def _parsed(path: Path) -> Receipt:
    try:
        return read_receipt(path)
    except AuditError as e:
        raise HubRefusedError(f"refusing to upload with receipt {path}: {e}") from None


def _match(artifacts: Mapping[Path, str], receipts: list[Receipt]) -> dict[Path, Receipt]:
    """The receipt of each artifact (by subject digest, the one that also names the file first:
    two variants can hold the same bytes, e.g. a searched recipe's trunk that differs from a shipped
    one only in the head a sidecar layout drops); refuses an artifact no receipt describes and a
    receipt that describes none of the artifacts."""
    found: dict[Path, Receipt] = {}
    for art, sha in artifacts.items():
        named = (r for r in receipts if (s := r.subject_named(art.name)) is not None and s.sha256 == sha.lower())
        rc = next(named, None) or next((r for r in receipts if sha.lower() in r.digests()), None)
        if rc is None:
            described = "; ".join(f"{r.path} describes sha256 {', '.join(sorted(r.digests()))}" for r in receipts)
            raise HubRefusedError(f"no receipt describes {art} (sha256 {sha}): {described}. The receipt belongs "
                                  "to another file, or the artifact changed after it was written")
        found[art] = rc
    shas = {s.lower() for s in artifacts.values()}
    for r in receipts:
        if not r.digests() & shas:
            raise HubRefusedError(f"receipt {r.path} describes none of the files being uploaded (its sha256 "
                                  f"{', '.join(sorted(r.digests()))}): it belongs to another artifact")
    return found


def _audited(art: Path, rc: Receipt, public_key: Path | None, sidecar: Path | None = None) -> AuditReport:
    """``ggufmtp audit ART --receipt RC [--public-key K] [--sidecar S]``; HubRefusedError naming every failure."""
    report = audit(art, rc.path, progress=False, public_key=public_key, sidecar=sidecar)
    if not report.ok:
        failed = "; ".join(f"{c.name}: {c.detail}" for c in report.failures)
        raise HubRefusedError(f"refusing to upload {art}: `ggufmtp audit` fails ({len(report.failures)} check(s)): "
                              f"{failed}")
    return report


def _card_text(card: Path) -> str:
    """What a reader of the card sees (its HTML comments dropped)."""
    try:
        return visible_text(read_regular_file(card, MAX_TEXT_FILE_BYTES).decode("utf-8", errors="replace"))
    except OSError as e:
        raise HubRefusedError(f"cannot read the card {card}: {e.strerror or type(e).__name__}") from None


def _check_card(card: Path | None, unverified: list[ArtifactCheck], vacuous: dict[Path, dict[str, str]]) -> None:
    """The card must say, where a reader sees it, which artifacts are not verified (its
    ``## Not verified`` section and each one's name) and which thresholds judge nothing (its
    ``## Thresholds that judge nothing`` section and each one's key)."""
    if not unverified and not vacuous:
        return
    text = _card_text(card) if card is not None else ""
    unnamed = [a.artifact.name for a in unverified if a.artifact.name not in text]
    if unverified and (card is None or UNVERIFIED_HEADING not in text or unnamed):
        names = ", ".join(unnamed or [a.artifact.name for a in unverified])
        where = (f"the card {card} does not state" if card is not None else "there is no card (--card) stating")
        raise HubRefusedError(f"{where} that {names} is not verified (a visible {UNVERIFIED_HEADING!r} section "
                              f"naming each such file; HTML comments do not count): regenerate it with `ggufmtp "
                              f"card` from the receipt")
    for art, found in vacuous.items():
        unsaid = [k for k in found if card is None or VACUOUS_HEADING not in text or k not in text]
        if unsaid:
            raise HubRefusedError(f"refusing to publish {art}: its verification's thresholds judge nothing ("
                                  f"{'; '.join(found[k] for k in unsaid)}), and "
                                  f"{f'the card {card}' if card is not None else 'no card (--card)'} does not say so "
                                  f"(a visible {VACUOUS_HEADING!r} section naming each; `ggufmtp card` writes it)")


def _covered_shard(art: Path, rc: Receipt, artifacts: Mapping[Path, str]) -> bool:
    """Whether ``art`` is a later shard of a split artifact (its receipt's ``result.split``) whose
    first shard, beside it, is in the upload too: that shard's audit checks every shard of the set.
    A later shard without its first is refused (a partial set)."""
    names = [s.name for s in rc.subjects]
    if rc.predicate["result"].get("split") is None or art.name not in names[1:]:
        return False
    if art.parent / rc.artifact.name not in artifacts:
        raise HubRefusedError(f"refusing a partial split set: {art.name} is a shard of {rc.artifact.name}, which is "
                              f"not in the upload (a split artifact goes up whole: {', '.join(names)})")
    return True


def check_publishable(artifacts: Mapping[Path, str], receipts: Sequence[Path], card: Path | None = None, *,
                      allow_unverified: bool = False, public_key: Path | None = None) -> PublishCheck:
    """Check an upload against the gate (module docstring); ``artifacts`` maps each artifact to its
    sha256. Raises HubRefusedError naming the file and the reason; returns the findings."""
    parsed = [_parsed(Path(r)) for r in receipts]
    matched = _match(artifacts, parsed)
    checks = []
    vacuous: dict[Path, dict[str, str]] = {}
    for art, sha in artifacts.items():
        rc = matched[art]
        if _covered_shard(art, rc, artifacts):
            continue
        report = _audited(art, rc, public_key, trunk_sidecar(art, rc, artifacts))
        problem = (sidecar_problem(art, sha, artifacts, matched) if is_sidecar(rc)
                   else unverified_reason(rc.statement, sha))
        if problem and not allow_unverified:
            raise HubRefusedError(f"refusing to publish {art}: {problem}; {ALLOW_HINT}")
        sig = signature_path(art)
        checks.append(ArtifactCheck(art, sha, rc.path, rc.signed, problem, sig if sig.is_file() else None,
                                    report.trust == Trust.VERIFIED, report.trust))
        if problem is None and (found := vacuous_thresholds(rc.verification)):
            vacuous[art] = found
    result = PublishCheck(tuple(checks), allow_unverified)
    _check_card(card, [a for a in result.unverified if not is_sidecar(matched[a.artifact])], vacuous)
    return result
