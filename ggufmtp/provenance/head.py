"""Is the MTP head preserved? The artifact's acceptance judged against a reference's, paired.

A publisher's question is whether quantizing kept the head, not whether the model's head clears a
fixed minimum: a near-lossless Q8_0 of a model whose head accepts 45 % is a good quant. So ``verify
--reference MODEL`` serves the reference (the BF16 base, or a Q8_0 variant where BF16 does not fit)
as a third server with the MTP arm's settings and window, in the same rotation, with the same
suite, seeds and modes. Each (prompt, seed, mode) gives a :class:`HeadPair`: what the artifact's
head drafted and had accepted, and what the reference's did.

The judgment (:func:`judge_head`), per thinking mode: the paired acceptance difference (artifact
minus reference, each a ratio of sums) with a 95 % percentile-bootstrap CI that resamples prompts
(a prompt's seeds pooled, the two arms resampled together). The head is *preserved* when the CI's
lower bound is above ``-margin`` (non-inferiority; :data:`DEFAULT_MARGIN`, 3 points). The receipt
records the pairs, the margin, the bootstrap settings and the reference's digest
(:meth:`HeadComparison.to_dict`); ``audit`` re-derives every figure and the finding from the pairs
(:meth:`HeadComparison.of_dict` and :func:`judge_head`) and never reads a recorded finding.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import stats
from ..fmt import pct
from ..fmt import points as _points
from ..jsontypes import JsonObject
from .binding import ReferenceBinding
from .statement import NamedDigest

__all__ = ["DEFAULT_MARGIN", "HeadComparison", "HeadFinding", "HeadPair", "ReferenceModel", "judge_head"]

DEFAULT_MARGIN = 0.03  # 3 acceptance points: below the 4-8 points trunk precision moves (benchmarks/README.md)
MAX_PAIRS = 100_000  # a receipt's pairs past this are no verification of ours


@dataclass(frozen=True)
class ReferenceModel:
    """The reference the head was measured against: its file name (no path), size and digest; a
    split reference's every shard (name and sha256); and what binds it to the artifact's source
    (``bound``: :class:`~ggufmtp.provenance.binding.ReferenceBinding`, which ``audit`` checks)."""

    name: str
    size_bytes: int
    sha256: str
    shards: tuple[NamedDigest, ...] | None = None
    bound: ReferenceBinding | None = None

    def to_dict(self) -> JsonObject:
        d: JsonObject = {"name": self.name, "size_bytes": self.size_bytes, "sha256": self.sha256}
        if self.shards is not None:
            d["shards"] = [dict(s) for s in self.shards]
        if self.bound is not None:
            d["bound"] = self.bound.to_dict()
        return d


@dataclass(frozen=True)
class HeadPair:
    """One request of the suite on the artifact's MTP server and on the reference's."""

    prompt_id: str
    seed: int
    mode: str
    drafted: int
    accepted: int
    reference_drafted: int
    reference_accepted: int

    def to_dict(self) -> JsonObject:
        return {"prompt_id": self.prompt_id, "seed": self.seed, "mode": self.mode, "drafted": self.drafted,
                "accepted": self.accepted, "reference_drafted": self.reference_drafted,
                "reference_accepted": self.reference_accepted}


@dataclass(frozen=True)
class HeadFinding:
    """The judgment of one mode: both acceptances, their paired difference with its 95 % CI, and
    whether the head is preserved (the CI's lower bound above ``-margin``)."""

    mode: str
    acceptance: float | None
    reference_acceptance: float | None
    difference: float | None
    difference_ci95: tuple[float | None, float | None]
    margin: float
    n_prompts: int

    @property
    def preserved(self) -> bool:
        lo = self.difference_ci95[0]
        return lo is not None and lo > -self.margin

    def reason(self, tag: str = "") -> str | None:
        """Why the head is not preserved (None: it is)."""
        if self.preserved:
            return None
        lo, hi = self.difference_ci95
        if lo is None:
            return (f"head{tag}: the paired acceptance difference has no confidence interval ({self.n_prompts} "
                    "prompt(s) drafted on both): non-inferiority cannot be shown")
        figures = (f"acceptance {pct(self.acceptance)} against the reference's {pct(self.reference_acceptance)}, "
                   f"difference {_points(self.difference)} (95% CI {_points(lo)} to {_points(hi)})")
        margin = f"-{self.margin * 100:.1f} points, the non-inferiority margin"
        if hi is not None and hi < -self.margin:
            return f"head{tag} degraded: {figures}: the whole interval lies below {margin}"
        return (f"head{tag} not shown preserved: {figures} reaches below {margin} (an interval "
                f"{(hi - lo) * 100 if hi is not None else float('nan'):.1f} points wide: more prompts or longer replies "
                "narrow it)")

    def text(self) -> str:
        lo, hi = self.difference_ci95
        return (f"{pct(self.acceptance)} vs reference {pct(self.reference_acceptance)}, difference "
                f"{_points(self.difference)} (95% CI {_points(lo)} to {_points(hi)}; margin {self.margin * 100:.1f} points)")

    def to_dict(self) -> JsonObject:
        return {"acceptance": self.acceptance, "reference_acceptance": self.reference_acceptance,
                "difference": self.difference, "difference_ci95": list(self.difference_ci95),
                "margin": self.margin, "n_prompts": self.n_prompts, "preserved": self.preserved}


@dataclass(frozen=True)
class HeadComparison:
    """What a verification measured of the head against its reference (see the module docstring)."""

    reference: ReferenceModel
    k: int
    margin: float
    resamples: int
    seed: int
    pairs: tuple[HeadPair, ...]

    @property
    def modes(self) -> list[str]:
        return list(dict.fromkeys(p.mode for p in self.pairs))

    def findings(self) -> dict[str, HeadFinding]:
        return {mode: judge_head([p for p in self.pairs if p.mode == mode], mode, self.margin, self.resamples,
                                 self.seed) for mode in self.modes}

    def to_dict(self) -> JsonObject:
        return {"reference": self.reference.to_dict(), "k": self.k, "margin": self.margin,
                "bootstrap": {"resamples": self.resamples, "seed": self.seed},
                "findings": {m: f.to_dict() for m, f in self.findings().items()},
                "pairs": [p.to_dict() for p in self.pairs]}

    @classmethod
    def of_dict(cls, d: Any) -> HeadComparison:
        """The recorded comparison, strictly: ValueError naming the first field that is not what
        verify writes (the findings are re-derived, never read)."""
        if not isinstance(d, Mapping):
            raise ValueError("the head section is not an object")
        ref, boot, pairs = d.get("reference"), d.get("bootstrap"), d.get("pairs")
        if not isinstance(ref, Mapping) or not isinstance(boot, Mapping) or not isinstance(pairs, list):
            raise ValueError("the head section lacks its reference, bootstrap or pairs")
        if not 0 < len(pairs) <= MAX_PAIRS:
            raise ValueError(f"the head section records {len(pairs)} pairs")
        margin: Any = d.get("margin")
        if not _is_number(margin) or not 0 <= margin <= 0.5:
            raise ValueError(f"head margin {margin!r}: not a number between 0 and 0.5")
        sha = ref.get("sha256")
        if not isinstance(sha, str) or len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
            raise ValueError("the reference's sha256 is not a digest")
        return cls(ReferenceModel(_str(ref.get("name"), "reference name"), _int(ref.get("size_bytes"), "reference size"),
                                  sha), _int(d.get("k"), "k", 1), float(margin), _int(boot.get("resamples"), "resamples", 1),
                   _int(boot.get("seed"), "bootstrap seed"), tuple(_pair(p) for p in pairs))


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _int(x: Any, what: str, minimum: int = 0) -> int:
    if not isinstance(x, int) or isinstance(x, bool) or x < minimum:
        raise ValueError(f"{what} {x!r}: not an integer >= {minimum}")
    return x


def _str(x: Any, what: str) -> str:
    if not isinstance(x, str) or not x or "/" in x or "\\" in x:
        raise ValueError(f"{what} {x!r}: not a file name")
    return x


def _pair(p: Any) -> HeadPair:
    if not isinstance(p, Mapping):
        raise ValueError("a head pair is not an object")
    counts = [_int(p.get(f), f) for f in ("drafted", "accepted", "reference_drafted", "reference_accepted")]
    if counts[1] > counts[0] or counts[3] > counts[2]:
        raise ValueError("a head pair accepts more tokens than it drafted")
    if not isinstance(p.get("prompt_id"), str) or not isinstance(p.get("mode"), str):
        raise ValueError("a head pair lacks its prompt or mode")
    return HeadPair(p["prompt_id"], _int(p.get("seed"), "seed"), p["mode"], *counts)


def judge_head(pairs: Sequence[HeadPair], mode: str, margin: float, resamples: int, seed: int) -> HeadFinding:
    """The paired acceptance difference of one mode's pairs, its 95 % CI over prompts, the finding."""
    units: dict[str, list[float]] = {}
    for p in pairs:
        u = units.setdefault(p.prompt_id, [0.0] * 4)
        for i, n in enumerate((p.accepted, p.drafted, p.reference_accepted, p.reference_drafted)):
            u[i] += n
    rows = [u for u in units.values() if u[1] > 0 and u[3] > 0]  # a prompt neither head drafted on says nothing
    x: np.ndarray = np.array(rows, dtype=np.float64).reshape(-1, 4)

    def diff(s: np.ndarray) -> np.ndarray:
        return s[..., 0] / s[..., 1] - s[..., 2] / s[..., 3]

    est = stats.bootstrap_sums(x, diff, resamples=resamples, seed=seed)
    tot = x.sum(axis=0) if len(rows) else np.zeros(4)
    return HeadFinding(mode, float(tot[0] / tot[1]) if tot[1] else None, float(tot[2] / tot[3]) if tot[3] else None,
                       est.value, (est.lo, est.hi), margin, len(rows))
