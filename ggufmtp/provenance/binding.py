"""What binds a verification to the bytes and the source it claims: the head's reference, and every
shard served.

**The reference is the source.** The head finding (:mod:`ggufmtp.provenance.head`) says whether
quantizing kept the head, so the reference it is judged against must be the model the artifact was
quantized from: the receipt's source (``base_model.files``, or a split pair's ``pair.source_sha256``),
by sha256. :func:`bind_reference` decides, before anything is quantized or served, and the
verification records what proved it in the head section's ``reference.bound``
(:class:`ReferenceBinding`):

* ``{"by": "source", "source_sha256": [...]}``: the reference's files are exactly the source's;
* ``{"by": "reference receipt", "source_sha256": [...], "receipt_sha256": ..., "bpw": ...}``: another
  file (a Q8_0 variant where the BF16 source does not fit) whose own receipt
  (``REFERENCE.receipt.json``, intact, describing its bytes) names that same source, and that is
  more precise than the artifact (more bits per weight: a variant that is not cannot show what
  quantizing lost). ``receipt_sha256`` is the sha256 of that receipt file, ``source_sha256`` the
  source it names, ``bpw`` its ``result.bpw``;
* ``{"by": "none"}``: the artifact came without a receipt (a bare GGUF), so nothing names its source.
  The head is measured for the user, who is told it is unbound; a receipt refuses to take such a
  verification and ``audit`` (so the upload gate) fails it.

Never the artifact's own bytes: a reference with any digest of the artifact's (a copy, a hardlink)
is refused whatever its receipt says. ``audit`` re-checks the recorded binding against the receipt
it is in (:func:`head_binding_problem`) with the same rule.

**Every byte served is bound.** llama-server loads a split model from its first shard and reads the
rest (the MTP head lies in the last); verify hashes every shard before the servers start and checks
them unchanged after (:class:`~ggufmtp.measure.core.records.ServedSet`), and records them in
``model.shards``; a split artifact's verification must name exactly its receipt's subjects
(:func:`shards_problem`).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import VerifyError
from ..jsontypes import JsonObject
from .statement import Statement

__all__ = ["BoundBy", "ReferenceBinding", "ReferenceFacts", "bind_reference", "head_binding_problem",
           "shards_problem", "source_digests"]

_HEX = frozenset("0123456789abcdef")


class BoundBy(enum.StrEnum):
    """What proved that the head's reference is the artifact's source."""

    SOURCE = "source"  # the reference's files are the source's
    REFERENCE_RECEIPT = "reference receipt"  # its own receipt names the same source
    NONE = "none"  # no receipt named the artifact's source: unbound


@dataclass(frozen=True)
class ReferenceBinding:
    """The head section's ``reference.bound`` (module docstring)."""

    by: BoundBy
    source_sha256: tuple[str, ...] = ()  # the artifact's source, sorted; empty when unbound
    receipt_sha256: str | None = None  # by reference receipt: the sha256 of the reference's receipt file
    bpw: float | None = None  # by reference receipt: the reference's bits per weight (its receipt's result)

    def to_dict(self) -> JsonObject:
        d: JsonObject = {"by": self.by.value}
        if self.by != BoundBy.NONE:
            d["source_sha256"] = list(self.source_sha256)
        if self.by == BoundBy.REFERENCE_RECEIPT:
            d.update(receipt_sha256=self.receipt_sha256, bpw=self.bpw)
        return d

    @classmethod
    def of_dict(cls, d: Any) -> ReferenceBinding:
        """The recorded binding, strictly (ValueError naming what is not what verify writes)."""
        if not isinstance(d, Mapping):
            raise ValueError("no binding recorded (reference.bound)")
        try:
            by = BoundBy(str(d.get("by")))
        except ValueError:
            raise ValueError(f"reference.bound.by {d.get('by')!r} is not one of {[b.value for b in BoundBy]}") from None
        if by == BoundBy.NONE:
            return cls(by)
        source = d.get("source_sha256")
        if not isinstance(source, list) or not source or not all(_is_digest(s) for s in source):
            raise ValueError("reference.bound.source_sha256 is not a list of digests")
        if by == BoundBy.SOURCE:
            return cls(by, tuple(sorted(source)))
        bpw = d.get("bpw")
        if not _is_digest(d.get("receipt_sha256")) or not isinstance(bpw, (int, float)) or isinstance(bpw, bool) \
                or not math.isfinite(bpw):
            raise ValueError("reference.bound lacks the reference receipt's sha256 or bpw")
        return cls(by, tuple(sorted(source)), d["receipt_sha256"], float(bpw))

    def text(self) -> str:
        """How the reference is bound, for the console and the notes."""
        if self.by == BoundBy.SOURCE:
            return "the artifact's source (by sha256)"
        if self.by == BoundBy.REFERENCE_RECEIPT:
            return f"a variant of the artifact's source, by its receipt (sha256 {self.receipt_sha256}; bpw {self.bpw})"
        return "UNBOUND: no receipt of the artifact names its source"


@dataclass(frozen=True)
class ReferenceFacts:
    """What is known of a reference: its name, the digests of every file served (first shard first)
    and, when its own receipt was read, the source that receipt names, the receipt file's sha256 and
    the reference's bits per weight."""

    name: str
    digests: tuple[str, ...]
    source: frozenset[str] | None = None
    receipt_sha256: str | None = None
    bpw: float | None = None


def source_digests(statement: Statement) -> frozenset[str]:
    """The source a receipt's artifact was made from: a split pair's ``pair.source_sha256``, else
    the base model's file digests."""
    pair = statement["predicate"].get("pair")
    if pair is not None:
        return frozenset(pair["source_sha256"])
    return frozenset(f["sha256"] for f in statement["predicate"]["base_model"]["files"])


def _digests(ds: Sequence[str] | frozenset[str]) -> str:
    return ", ".join(sorted(ds))


def bind_reference(ref: ReferenceFacts, source: frozenset[str] | None, artifact: Sequence[str],
                   artifact_bpw: float | None) -> ReferenceBinding:
    """The binding of ``ref`` to the artifact whose files have the digests ``artifact`` and whose
    receipt names ``source`` (None: the artifact has no receipt); VerifyError naming both digests
    when the reference is the artifact's bytes or neither the source nor a more precise variant of it
    by its own receipt (module docstring). ``artifact_bpw`` None: not known yet (before quantizing)."""
    own = sorted(set(ref.digests) & set(artifact))
    if own:
        raise VerifyError(f"reference {ref.name} (sha256 {ref.digests[0]}) is the artifact's own bytes (sha256 "
                          f"{own[0]}): a copy or a link of the artifact cannot show what quantizing kept; the reference "
                          f"is the source model the artifact was made from")
    if source is None:
        return ReferenceBinding(BoundBy.NONE)
    if set(ref.digests) == source:
        return ReferenceBinding(BoundBy.SOURCE, tuple(sorted(source)))
    where = f"reference {ref.name} (sha256 {ref.digests[0]}) is not the artifact's source (sha256 {_digests(source)})"
    if ref.source is None:
        raise VerifyError(f"{where}, and no receipt beside it ({ref.name}.receipt.json) says it was made from that "
                          f"source: give the source model, or a variant of it that has its receipt")
    if ref.source != source:
        raise VerifyError(f"{where}: its receipt says it was made from source sha256 {_digests(ref.source)}, another "
                          f"model")
    if artifact_bpw is not None and (ref.bpw is None or ref.bpw <= artifact_bpw):
        raise VerifyError(f"{where}, and as a variant of it ({ref.bpw} bits per weight) it is no more precise than the "
                          f"artifact ({artifact_bpw}): a reference must hold more of the source than the artifact")
    return ReferenceBinding(BoundBy.REFERENCE_RECEIPT, tuple(sorted(source)), ref.receipt_sha256, ref.bpw)


def _subject_digests(st: Statement) -> list[str]:
    return [s["digest"]["sha256"] for s in st["subject"]]


def _recorded_reference(ref: Mapping[str, Any]) -> tuple[str, tuple[str, ...]]:
    """The recorded reference's name and the digests of every file it served (ValueError: malformed)."""
    name, sha, shards = ref.get("name"), ref.get("sha256"), ref.get("shards")
    if not isinstance(name, str) or not isinstance(sha, str) or not _is_digest(sha):
        raise ValueError("the head's reference has no name or sha256")
    if shards is None:
        return name, (sha,)
    if not isinstance(shards, list) or len(shards) < 2 or not all(
            isinstance(s, Mapping) and _is_digest(s.get("sha256")) for s in shards) or shards[0]["sha256"] != sha:
        raise ValueError("the head's reference.shards is not its shards' digests, its sha256 first")
    return name, tuple(s["sha256"] for s in shards)


def head_binding_problem(st: Statement, v: Mapping[str, Any]) -> str | None:
    """Why the head section of verification ``v`` is not judged against the source of the receipt
    ``st`` (None: it is, or no reference was measured): :func:`bind_reference` again, on what the
    verification recorded."""
    head = v.get("head")
    if head is None:
        return None
    ref = head.get("reference") if isinstance(head, Mapping) else None
    if not isinstance(ref, Mapping):
        return "the head section names no reference"
    try:
        name, digests = _recorded_reference(ref)
        bound = ReferenceBinding.of_dict(ref.get("bound"))
    except ValueError as e:
        return (f"the head was judged against {ref.get('name')} (sha256 {ref.get('sha256')}), and nothing shows it is "
                f"the artifact's source: {e}")
    source = source_digests(st)
    if bound.by == BoundBy.NONE:
        return (f"the head was judged against {name} (sha256 {digests[0]}), which nothing binds to the artifact's "
                f"source (sha256 {_digests(source)}): it was verified without the artifact's receipt; verify again "
                f"with it (--receipt)")
    if set(bound.source_sha256) != source:
        return (f"the head's reference {name} was bound to source sha256 {_digests(bound.source_sha256)}, but this "
                f"receipt's source is sha256 {_digests(source)}")
    facts = ReferenceFacts(name, digests, frozenset(bound.source_sha256) if bound.by == BoundBy.REFERENCE_RECEIPT
                           else None, bound.receipt_sha256, bound.bpw)
    try:
        bind_reference(facts, source, _subject_digests(st), st["predicate"]["result"].get("bpw"))
    except VerifyError as e:
        return str(e)
    return None


def shards_problem(st: Statement, v: Mapping[str, Any]) -> str | None:
    """Why the verification ``v`` does not name every file of the receipt's split artifact as served
    (``model.shards``, each by name and sha256, in the receipt's order; None: it does, or the artifact
    is one file and the verification names no shards)."""
    subjects = [(s["name"], s["digest"]["sha256"]) for s in st["subject"]]
    model = v.get("model")
    recorded = model.get("shards") if isinstance(model, Mapping) else None
    if len(subjects) == 1:
        return None if recorded is None else (f"the verification names {len(recorded)} shards served; the receipt's "
                                              f"artifact is one file, {subjects[0][0]}")
    if recorded is None:
        return (f"the verification names only the first of the {len(subjects)} shards it served ({subjects[0][0]}): "
                f"the others, the MTP head's among them, were served unnamed; verify again")
    served = [(s.get("name"), s.get("sha256")) for s in recorded if isinstance(s, Mapping)]
    if served == subjects:
        return None
    diff = next(((a, b) for a, b in zip(served, subjects, strict=False) if a != b), None)
    if diff is None:
        return f"the verification served {len(served)} shards; the receipt's artifact has {len(subjects)}"
    (name, sha), (want_name, want) = diff
    return (f"the verification served shard {name} with sha256 {sha}; the receipt's shard {want_name} has sha256 "
            f"{want}")


def _is_digest(x: Any) -> bool:
    return isinstance(x, str) and len(x) == 64 and set(x) <= _HEX
