"""verify's reference arm: the reference model's MTP server in the same rotation, and the pairs it
gives (:mod:`ggufmtp.provenance.head` judges them).

The reference (``--reference MODEL``: the BF16 base, or a Q8_0 variant where BF16 does not fit) is
served with the MTP arm's exact configuration (window, server arguments, KV types, context, GPU
layers, tuned settings) with only the model changed, and answers every request of the suite in the
same ABBA rotation as the vanilla and MTP arms (V M R, R M V, ...). Its replies are not compared
with vanilla's (they may differ: another model); its drafted and accepted counts are paired with
the artifact's MTP arm by (prompt, seed, mode) at the shipped window on the chat endpoint.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ...errors import VerifyError
from ...provenance.head import HeadComparison, HeadPair, ReferenceModel
from ..core.arms import MTP, REFERENCE
from ..core.records import ServedFile
from .summary import Record

__all__ = ["ReferenceArm", "head_comparison"]


@dataclass(frozen=True)
class ReferenceArm:
    """The reference file as served: its path, and the bytes checked before and after the run."""

    path: Path
    served: ServedFile

    @staticmethod
    def check_path(path: str | os.PathLike, artifact: Path) -> None:
        """VerifyError when the reference is missing or is the artifact itself."""
        p = Path(path)
        if not p.is_file():
            raise VerifyError(f"reference {p}: no such file (--reference: the BF16 base or a Q8_0 variant)")
        if p.resolve() == artifact.resolve():
            raise VerifyError(f"reference {p}: the artifact itself; a reference is another file (the BF16 base)")

    @classmethod
    def of(cls, path: str | os.PathLike, artifact: Path) -> ReferenceArm:
        """The reference at ``path``, hashed (:meth:`check_path` first)."""
        cls.check_path(path, artifact)
        return cls(Path(path), ServedFile.of(path))

    def model(self) -> ReferenceModel:
        return ReferenceModel(self.path.name, self.served.size, self.served.sha256)


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
