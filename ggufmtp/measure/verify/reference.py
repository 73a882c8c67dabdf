"""verify's reference arm: the reference model's MTP server in the same rotation, and the pairs it
gives (:mod:`ggufmtp.provenance.head` judges them).

The reference (``--reference MODEL``: the BF16 base, or a Q8_0 variant where BF16 does not fit) is
served with the MTP arm's exact configuration (window, server arguments, KV types, context, GPU
layers, tuned settings) with only the model changed, and answers every request of the suite in the
same ABBA rotation as the vanilla and MTP arms (V M R, R M V, ...). Its replies are not compared
with vanilla's (they may differ: another model); its drafted and accepted counts are paired with
the artifact's MTP arm by (prompt, seed, mode) at the shipped window on the chat endpoint.

Before anything is served, the reference is bound to the artifact's source
(:func:`~ggufmtp.provenance.binding.bind_reference`): the source named by the artifact's receipt
(given, else ``ARTIFACT.receipt.json`` beside it), or a more precise variant of it whose own receipt
(beside the reference) names that source; never the artifact's bytes. Every file of both is hashed
(:class:`~ggufmtp.measure.core.records.ServedSet`) and checked unchanged after the run.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ...errors import GgufmtpError, VerifyError
from ...files.hashing import sha256_file
from ...gguf.model import SPLIT_RE
from ...provenance.binding import BoundBy, ReferenceBinding, ReferenceFacts, bind_reference, source_digests
from ...provenance.head import HeadComparison, HeadPair, ReferenceModel
from ...provenance.receipt import Receipt, default_receipt_path, read_receipt
from ..core.arms import MTP, REFERENCE
from ..core.options import VerifyOptions
from ..core.records import ServedSet
from .summary import Record

__all__ = ["ReferenceArm", "artifact_receipt", "check_reference", "head_comparison"]


def _receipt_beside(path: Path) -> Path | None:
    """``FILE.receipt.json`` beside ``path`` (a split model's first shard: also the set's
    ``NAME.gguf.receipt.json``, as quantize names it), when there is one."""
    candidates = [default_receipt_path(path)]
    if (m := SPLIT_RE.match(path.name)) is not None:
        candidates.append(path.with_name(f"{m.group('stem')}.gguf.receipt.json"))
    return next((c for c in candidates if c.is_file()), None)


def _describing(path: Path, served: ServedSet, what: str) -> Receipt:
    """The receipt at ``path``, read strictly; VerifyError unless it is intact and its subjects are
    exactly the served files' digests."""
    try:
        rf = read_receipt(path)
    except GgufmtpError as e:
        raise VerifyError(f"{what}: {e}") from None
    if not rf.intact:
        raise VerifyError(f"{what} {path}: edited after it was written (its integrity digest does not match)")
    if [s.sha256 for s in rf.subjects] != served.digests:
        raise VerifyError(f"{what} {path} describes sha256 {', '.join(s.sha256 for s in rf.subjects)}, not "
                          f"{served.first.path.name}'s bytes (sha256 {', '.join(served.digests)})")
    return rf


def artifact_receipt(path: Path, served: ServedSet, given: str | os.PathLike | None) -> Receipt | None:
    """The artifact's receipt, which names its source: ``given``, else the one beside ``path``
    (None: a bare GGUF); VerifyError when it does not describe the served bytes."""
    found = Path(given) if given is not None else _receipt_beside(path)
    return _describing(found, served, "the artifact's receipt") if found is not None else None


def _facts(path: Path, served: ServedSet, source: frozenset[str] | None) -> ReferenceFacts:
    """What binds the reference: its digests and, unless it is the source itself, its own receipt's."""
    facts = ReferenceFacts(path.name, tuple(served.digests))
    found = _receipt_beside(path)
    if source is None or set(served.digests) == source or found is None:
        return facts
    st = _describing(found, served, "the reference's receipt").statement
    bpw = st["predicate"]["result"].get("bpw")
    return ReferenceFacts(path.name, facts.digests, source_digests(st), sha256_file(found),
                          float(bpw) if bpw is not None else None)


def _existing(path: str | os.PathLike) -> Path:
    p = Path(path)
    if not p.is_file():
        raise VerifyError(f"reference {p}: no such file (--reference: the BF16 base or a Q8_0 variant)")
    return p


def check_reference(options: VerifyOptions | None, source_model: str | os.PathLike) -> ReferenceBinding | None:
    """Before anything is quantized (``run``, ``ladder``): the reference ``options`` name (None: none)
    is the source model or a variant of it by its own receipt; VerifyError naming both digests."""
    reference = options.reference if options is not None else None
    if reference is None:
        return None
    _existing(reference)
    source = frozenset(ServedSet.of(source_model).digests)
    served = ServedSet.of(reference)
    return bind_reference(_facts(Path(reference), served, source), source, (), None)


@dataclass(frozen=True)
class ReferenceArm:
    """The reference as served: its path, every file's bytes checked before and after the run, and
    what binds it to the artifact's source."""

    path: Path
    served: ServedSet
    binding: ReferenceBinding

    @staticmethod
    def check_path(path: str | os.PathLike, artifact: Path) -> None:
        """VerifyError when the reference is missing or is the artifact itself."""
        p = _existing(path)
        if p.resolve() == artifact.resolve():
            raise VerifyError(f"reference {p}: the artifact itself; a reference is another file (the BF16 base)")

    @classmethod
    def of(cls, path: str | os.PathLike, artifact: ServedSet, receipt: str | os.PathLike | None,
           check_model: Callable[[Path], object]) -> ReferenceArm:
        """The reference at ``path``: another file (:meth:`check_path`) that ``check_model`` accepts
        (verify's: a complete MTP block; its error names the reference), hashed (every shard) and
        bound to the source named by the artifact's receipt (:func:`artifact_receipt` of ``receipt``)."""
        cls.check_path(path, artifact.first.path)
        try:
            check_model(Path(path))
        except VerifyError as e:
            raise VerifyError(f"reference: {e}") from None
        found = artifact_receipt(artifact.first.path, artifact, receipt)
        served = ServedSet.of(path)
        source = source_digests(found.statement) if found is not None else None
        bpw = found.predicate["result"].get("bpw") if found is not None else None
        binding = bind_reference(_facts(Path(path), served, source), source, artifact.digests, bpw)
        return cls(Path(path), served, binding)

    def model(self) -> ReferenceModel:
        shards = self.served.shards()
        return ReferenceModel(self.path.name, self.served.first.size, self.served.first.sha256,
                              tuple(shards) if shards else None, self.binding)

    def notes(self) -> list[str]:
        """What the reader must know of the reference's binding (an unbound one: not publishable)."""
        if self.binding.by != BoundBy.NONE:
            return []
        return [f"the head was judged against {self.path.name}, but the artifact has no receipt naming its source, so "
                "nothing shows that reference is the model it was made from: the head finding is unbound (a receipt "
                "will not take this verification; verify with the artifact's receipt to publish it)"]


def head_comparison(records: Sequence[Record], ref: ReferenceArm, k: int, margin: float, resamples: int,
                    seed: int) -> HeadComparison:
    """The pairs of the artifact's MTP arm and the reference arm at window ``k`` on the chat endpoint."""
    at = [r for r in records if r.k == k and r.endpoint == "chat"]
    refs = {(r.prompt_id, r.seed, r.mode): r for r in at if r.arm == REFERENCE}
    pairs = tuple(HeadPair(m.prompt_id, m.seed, m.mode, m.draft_n or 0, m.draft_n_accepted or 0,
                           refs[key].draft_n or 0, refs[key].draft_n_accepted or 0)
                  for m in at if m.arm == MTP and (key := (m.prompt_id, m.seed, m.mode)) in refs)
    if not pairs:
        raise VerifyError("the reference arm answered no request of the main comparison")
    return HeadComparison(ref.model(), k, margin, resamples, seed, pairs)
