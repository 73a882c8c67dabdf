"""Is the MTP head preserved? The artifact's acceptance judged against a reference's, paired, with
three outcomes and a sequential design.

A publisher's question is whether quantizing kept the head, not whether the model's head clears a
fixed minimum: a near-lossless Q8_0 of a model whose head accepts 45 % is a good quant. So ``verify``
measures the reference's head (the source model's, or a more precise variant's made from it)
drafting on the artifact's own trunk with the MTP arm's settings and window, on the same suite,
seeds and modes (:mod:`ggufmtp.measure.verify.reference`): both heads then draft on the same text,
so the difference is the head's alone. Each (prompt, seed, mode) gives a :class:`HeadPair`: what the
artifact's head drafted and had accepted, and what the reference's did.

The judgment, per thinking mode, is the paired acceptance difference d (artifact minus reference,
each a ratio of sums over the prompts measured) against the non-inferiority margin m (the recipe's,
:data:`DEFAULT_MARGIN` 3 points unless it says otherwise, at most :data:`MAX_MARGIN`):

- **preserved** when the lower bound of d's interval lies above -m;
- **degraded** when the upper bound lies below -m;
- **inconclusive** otherwise: the evidence decides neither, and the finding says how much more
  would (:attr:`HeadFinding.needed_prompts`, from the measured variance). Never a failure word.

The design (fixed by ggufmtp; a receipt cannot choose it): the run's prompt budget N (``--limit``,
else the suite) is looked at after 8, 16, 32, ... prompts and at N (:func:`look_schedule`); the run
stops at the first look where every mode is decided. Each look j spends part of a one-sided error
:data:`ALPHA` (2.5 %) per direction by the spending function a(t) = ALPHA * t^3 (Kim-DeMets' power
family, close to O'Brien-Fleming's at the end), t = n_j / N (:func:`look_alpha`); its interval is
d +- q_j * se, q_j Student's t quantile (n_j - 1 degrees of freedom) of the look's share and se the
bootstrap standard error of d, scaled by sqrt(n / (n - 1)) (prompts resampled, a prompt's seeds
pooled, both arms together; :data:`RESAMPLES` resamples with the fixed generator seed
:data:`BOOT_SEED`). By the union bound the chance of calling a head preserved when its true
difference is -m or worse is nominally at most ALPHA over all looks, and so is the
chance of calling it degraded when it is -m or better (checked by simulation in
``tests/test_head_sequential.py``, 400 designed runs at a true loss of exactly the margin: 3.75 %
'preserved' and 1.0-1.75 % 'degraded' at budgets 16 and 54, the t interval on a bootstrap standard
error of few prompts being a little generous; the test bounds both at 5 %).
Early looks spend little (0.008 % at 8 of 54 prompts), so a clear case (a 25-point loss) stops at the
first look and a close one runs to the budget with most of ALPHA (2.0 % at the last of four looks).

The receipt records the pairs (in the order measured), the margin and the budget; ``audit`` re-derives
every look and finding from them (:meth:`HeadComparison.of_dict`, :meth:`HeadComparison.findings`)
and never reads a recorded finding; :meth:`HeadComparison.run_problems` checks the pairs are exactly
the run's prompt x seed x mode set, its window and its budget.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, TypeGuard

import numpy as np

from .. import stats
from ..fmt import pct
from ..fmt import points as _points
from ..jsontypes import JsonObject
from ..stats import MAX_MARGIN, check_margin
from .binding import ReferenceBinding
from .statement import NamedDigest

__all__ = ["ALPHA", "BOOT_SEED", "level_text", "DEFAULT_MARGIN", "FIRST_LOOK", "HeadComparison", "HeadDecision", "HeadFinding",
           "HeadPair", "MAX_MARGIN", "RESAMPLES", "ReferenceModel", "check_margin", "decide_head", "judge_head",
           "look_alpha", "look_schedule", "overall_decision"]

DEFAULT_MARGIN = 0.03  # 3 acceptance points: below the 4-8 points trunk precision moves (benchmarks/README.md)
ALPHA = 0.025  # one-sided error per direction, over every look of a run
RESAMPLES = stats.DEFAULT_RESAMPLES
BOOT_SEED = stats.DEFAULT_SEED
FIRST_LOOK = 8  # prompts at the first look; then doubling up to the budget
SPENDING_POWER = 3  # the alpha-spending function ALPHA * t^3 (Kim-DeMets power family)
MAX_PROMPTS = 4096  # a head section measuring more prompts is no verification of ours (bounded audit time)
MAX_PAIRS = 100_000  # a receipt's pairs past this are no verification of ours
DESIGN = "group-sequential, alpha spending ALPHA*t^3 (Kim-DeMets), t interval on the bootstrap standard error"
_NORMAL = NormalDist()


class HeadDecision(enum.StrEnum):
    """What the evidence says of the head; its value is the JSON string."""

    PRESERVED = "preserved"
    DEGRADED = "degraded"
    INCONCLUSIVE = "inconclusive"


def level_text(level: float) -> str:
    """A look's confidence as people read it: ``95%``, ``99.98%`` (two decimals at most)."""
    return f"{level * 100:.2f}".rstrip("0").rstrip(".") + "%"


def look_schedule(budget: int) -> tuple[int, ...]:
    """The prompt counts at which a run of ``budget`` prompts looks: 8, 16, 32, ... and the budget
    (a doubling that would leave less than a quarter of the last step is merged into the budget)."""
    if budget <= FIRST_LOOK:
        return (max(budget, 1),)
    looks, n = [], FIRST_LOOK
    while n * 1.25 < budget:
        looks.append(n)
        n *= 2
    return (*looks, budget)


def _spent(t: float) -> float:
    """The error spent by information fraction t: Kim-DeMets' power family ALPHA * t^3 (close to
    O'Brien-Fleming at the end, without its near-zero first look: a t interval of 8 prompts at
    O'Brien-Fleming's 1e-8 could not call even a 25-point loss)."""
    return ALPHA * min(max(t, 0.0), 1.0) ** SPENDING_POWER


def look_alpha(schedule: Sequence[int], j: int) -> float:
    """The one-sided error look ``j`` (0-based) of ``schedule`` may spend (per direction)."""
    total = schedule[-1]
    prev = _spent(schedule[j - 1] / total) if j else 0.0
    return max(_spent(schedule[j] / total) - prev, 1e-12)


@dataclass(frozen=True)
class ReferenceModel:
    """The reference the head was measured against: its file name (no path), size and digest; a
    split reference's every shard (name and sha256); what binds it to the artifact's source
    (``bound``: :class:`~ggufmtp.provenance.binding.ReferenceBinding`, which ``audit`` checks); and
    ``head``, the reference's MTP head cut as a sidecar that drafted on the artifact's trunk."""

    name: str
    size_bytes: int
    sha256: str
    shards: tuple[NamedDigest, ...] | None = None
    bound: ReferenceBinding | None = None
    head: NamedDigest | None = None

    def to_dict(self) -> JsonObject:
        d: JsonObject = {"name": self.name, "size_bytes": self.size_bytes, "sha256": self.sha256}
        if self.shards is not None:
            d["shards"] = [dict(s) for s in self.shards]
        if self.head is not None:
            d["head"] = dict(self.head)
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
    """The judgment of one mode at the look that decided it (or the last look): both acceptances,
    their paired difference with the look's interval, and the decision against ``-margin``."""

    mode: str
    acceptance: float | None
    reference_acceptance: float | None
    difference: float | None
    difference_ci: tuple[float | None, float | None]
    level: float  # the interval's two-sided confidence at this look (1 - 2 * look_alpha)
    margin: float
    n_prompts: int
    drafted: int  # tokens the artifact's head drafted on those prompts
    look: int  # 1-based
    looks: int
    se: float | None = None

    @property
    def decision(self) -> HeadDecision:
        lo, hi = self.difference_ci
        if lo is not None and lo > -self.margin:
            return HeadDecision.PRESERVED
        if hi is not None and hi < -self.margin:
            return HeadDecision.DEGRADED
        return HeadDecision.INCONCLUSIVE

    @property
    def preserved(self) -> bool:
        return self.decision == HeadDecision.PRESERVED

    @property
    def evidence_factor(self) -> float | None:
        """For an inconclusive finding: how many times the prompts measured would decide it at the
        final look's confidence, from the measured variance (None: decided, or no variance known, or
        a difference sitting on the margin, which no sample size decides)."""
        if self.decision != HeadDecision.INCONCLUSIVE or self.se is None or self.difference is None:
            return None
        gap = abs(self.difference + self.margin)
        if gap < 1e-4:
            return None
        z = _NORMAL.inv_cdf(1 - ALPHA)  # a fresh fixed-size run: the whole ALPHA at one look
        return max((z * self.se / gap) ** 2, 1.0)

    @property
    def needed_prompts(self) -> int | None:
        f = self.evidence_factor
        return None if f is None else min(math.ceil(self.n_prompts * f * 1.1), 10 ** 6)  # 10 % for the estimate

    def needed_text(self) -> str:
        if self.decision != HeadDecision.INCONCLUSIVE:
            return ""
        if self.n_prompts < 2 or self.se is None:
            return f"at least {FIRST_LOOK} prompts drafted on by both heads"
        if self.needed_prompts is None:
            return "no sample size: the difference sits on the margin"
        f = self.evidence_factor or 1.0
        return (f"about {self.needed_prompts} prompts (--limit), or replies about {f:.1f}x longer (--max-tokens) "
                "where the variance is within replies")

    def reason(self, tag: str = "") -> str | None:
        """Why the head is not preserved (None: it is)."""
        d = self.decision
        if d == HeadDecision.PRESERVED:
            return None
        if d == HeadDecision.DEGRADED:
            return f"head{tag} degraded: {self.text()}: the whole interval lies below -{self.margin * 100:.1f} points"
        return f"head{tag} inconclusive: {self.text()}: decided by neither bound; needs {self.needed_text()}"

    def text(self) -> str:
        lo, hi = self.difference_ci
        return (f"{pct(self.acceptance)} vs reference {pct(self.reference_acceptance)}, difference "
                f"{_points(self.difference)} ({level_text(self.level)} CI {_points(lo)} to {_points(hi)}, look "
                f"{self.look} of {self.looks}, {self.n_prompts} prompts; margin {self.margin * 100:.1f} points)")

    def to_dict(self) -> JsonObject:
        return {"decision": self.decision.value, "acceptance": self.acceptance,
                "reference_acceptance": self.reference_acceptance, "difference": self.difference,
                "difference_ci": list(self.difference_ci), "level": self.level, "se": self.se, "margin": self.margin,
                "prompts": self.n_prompts, "drafted": self.drafted, "look": self.look, "looks": self.looks,
                "needed_prompts": self.needed_prompts, "evidence_factor": self.evidence_factor,
                "preserved": self.preserved}


def overall_decision(findings: Mapping[str, HeadFinding]) -> HeadDecision:
    """Degraded if any mode is, preserved if every mode is, else inconclusive."""
    ds = [f.decision for f in findings.values()]
    if HeadDecision.DEGRADED in ds:
        return HeadDecision.DEGRADED
    return HeadDecision.PRESERVED if ds and all(d == HeadDecision.PRESERVED for d in ds) else HeadDecision.INCONCLUSIVE


@dataclass(frozen=True)
class HeadComparison:
    """What a verification measured of the head against its reference (see the module docstring).
    ``budget``: the prompts the run planned (the look schedule's last point); ``max_tokens``: the
    replies' limit. The pairs are in the order measured (prompt order defines the looks)."""

    reference: ReferenceModel
    k: int
    margin: float
    budget: int
    pairs: tuple[HeadPair, ...]
    max_tokens: int | None = None

    @property
    def modes(self) -> list[str]:
        return list(dict.fromkeys(p.mode for p in self.pairs))

    @property
    def prompts(self) -> list[str]:
        return list(dict.fromkeys(p.prompt_id for p in self.pairs))

    def findings(self) -> dict[str, HeadFinding]:
        return {mode: decide_head([p for p in self.pairs if p.mode == mode], mode, self.margin, self.budget)
                for mode in self.modes}

    def decision(self) -> HeadDecision:
        return overall_decision(self.findings())

    def to_dict(self) -> JsonObject:
        found = self.findings()
        return {"reference": self.reference.to_dict(), "k": self.k, "margin": self.margin,
                "decision": overall_decision(found).value, "prompts": len(self.prompts), "tokens": self.max_tokens,
                "budget": self.budget, "looks": list(look_schedule(self.budget)),
                "bootstrap": {"resamples": RESAMPLES, "seed": BOOT_SEED, "alpha": ALPHA, "design": DESIGN},
                "findings": {m: f.to_dict() for m, f in found.items()},
                "pairs": [p.to_dict() for p in self.pairs]}

    @classmethod
    def of_dict(cls, d: Any) -> HeadComparison:
        """The recorded comparison, strictly: ValueError naming the first field that is not what
        verify writes (the findings are re-derived, never read; the statistics are ggufmtp's, not
        the receipt's)."""
        if not isinstance(d, Mapping):
            raise ValueError("the head section is not an object")
        ref, boot, pairs = d.get("reference"), d.get("bootstrap"), d.get("pairs")
        if not isinstance(ref, Mapping) or not isinstance(boot, Mapping) or not isinstance(pairs, list):
            raise ValueError("the head section lacks its reference, bootstrap or pairs")
        if not 0 < len(pairs) <= MAX_PAIRS:
            raise ValueError(f"the head section records {len(pairs)} pairs")
        if (boot.get("resamples"), boot.get("seed")) != (RESAMPLES, BOOT_SEED):
            raise ValueError(f"the head's bootstrap ({boot.get('resamples')!r} resamples, seed {boot.get('seed')!r}) "
                             f"is not ggufmtp's ({RESAMPLES} resamples, seed {BOOT_SEED}): a receipt does not choose "
                             "its statistics")
        margin = check_margin(d.get("margin"))
        sha = ref.get("sha256")
        if not _is_digest(sha):
            raise ValueError("the reference's sha256 is not a digest")
        parsed = tuple(_pair(p) for p in pairs)
        n_prompts = len(dict.fromkeys(p.prompt_id for p in parsed))
        budget = _int(d.get("budget", n_prompts), "head budget", 1)
        if not n_prompts <= budget <= MAX_PROMPTS:
            raise ValueError(f"head budget {budget}: not between the {n_prompts} prompts measured and {MAX_PROMPTS}")
        tokens = d.get("tokens")
        return cls(ReferenceModel(_str(ref.get("name"), "reference name"), _int(ref.get("size_bytes"), "reference size"),
                                  sha, head=_head(ref.get("head"))), _int(d.get("k"), "k", 1), margin, budget, parsed,
                   None if tokens is None else _int(tokens, "head tokens", 1))

    def run_problems(self, settings: Mapping[str, Any], modes: Sequence[str]) -> list[str]:
        """Why these pairs are not the run's (its ``settings`` and ``modes``): the pairs must be exactly
        the measured prompts x seeds x modes, once each, at the run's window, budget and reply limit."""
        out = []
        seeds: list[Any] = settings["seeds"] if isinstance(settings.get("seeds"), list) else []
        if settings.get("draft_n_max") != self.k:
            out.append(f"the head was measured at window {self.k}, the run's is {settings.get('draft_n_max')!r}")
        if settings.get("n_prompts") != len(self.prompts):
            out.append(f"the head pairs cover {len(self.prompts)} prompts, the run measured "
                       f"{settings.get('n_prompts')!r}")
        if settings.get("prompt_budget", self.budget) != self.budget:
            out.append(f"the head's budget {self.budget} is not the run's {settings.get('prompt_budget')!r}")
        if self.max_tokens is not None and settings.get("max_tokens") != self.max_tokens:
            out.append(f"the head's replies of {self.max_tokens} tokens are not the run's {settings.get('max_tokens')!r}")
        keys = [(p.prompt_id, p.seed, p.mode) for p in self.pairs]
        want = {(p, s, m) for p in self.prompts for s in seeds for m in modes}
        if len(set(keys)) != len(keys):
            out.append("a (prompt, seed, mode) is paired twice in the head section")
        elif set(keys) != want:
            extra = sorted(set(keys) - want, key=str)[:1]
            missing = sorted(want - set(keys), key=str)[:1]
            out.append(f"the head pairs are not the run's prompt x seed x mode set (seeds {seeds}, modes "
                       f"{list(modes)})" + (f"; not in the run: {extra[0]}" if extra else "")
                       + (f"; missing: {missing[0]}" if missing else ""))
        return out


def _int(x: Any, what: str, minimum: int = 0) -> int:
    if not isinstance(x, int) or isinstance(x, bool) or x < minimum:
        raise ValueError(f"{what} {x!r}: not an integer >= {minimum}")
    return x


def _str(x: Any, what: str) -> str:
    if not isinstance(x, str) or not x or "/" in x or "\\" in x:
        raise ValueError(f"{what} {x!r}: not a file name")
    return x


def _is_digest(x: Any) -> TypeGuard[str]:
    return isinstance(x, str) and len(x) == 64 and all(c in "0123456789abcdef" for c in x)


def _head(x: Any) -> NamedDigest | None:
    """The reference head's name and sha256 as recorded (None: a receipt from before the head was
    recorded)."""
    if x is None:
        return None
    if not isinstance(x, Mapping) or not _is_digest(x.get("sha256")):
        raise ValueError("the reference head is not a name and a sha256")
    return NamedDigest(name=_str(x.get("name"), "reference head name"), sha256=x["sha256"])


def _pair(p: Any) -> HeadPair:
    if not isinstance(p, Mapping):
        raise ValueError("a head pair is not an object")
    counts = [_int(p.get(f), f) for f in ("drafted", "accepted", "reference_drafted", "reference_accepted")]
    if counts[1] > counts[0] or counts[3] > counts[2]:
        raise ValueError("a head pair accepts more tokens than it drafted")
    if not isinstance(p.get("prompt_id"), str) or not isinstance(p.get("mode"), str):
        raise ValueError("a head pair lacks its prompt or mode")
    return HeadPair(p["prompt_id"], _int(p.get("seed"), "seed"), p["mode"], *counts)


def _units(pairs: Sequence[HeadPair]) -> dict[str, list[float]]:
    """Per prompt (in order of first appearance), its pairs' summed counts: accepted, drafted,
    reference accepted, reference drafted."""
    units: dict[str, list[float]] = {}
    for p in pairs:
        u = units.setdefault(p.prompt_id, [0.0] * 4)
        for i, n in enumerate((p.accepted, p.drafted, p.reference_accepted, p.reference_drafted)):
            u[i] += n
    return units


def _diff(s: np.ndarray) -> np.ndarray:
    return s[..., 0] / s[..., 1] - s[..., 2] / s[..., 3]


def judge_head(pairs: Sequence[HeadPair], mode: str, margin: float, schedule: Sequence[int] | None = None,
               look: int | None = None) -> HeadFinding:
    """The finding of one mode's ``pairs`` at look ``look`` (0-based) of ``schedule`` (default: one
    look at the prompts given, the whole ALPHA)."""
    units = _units(pairs)
    rows = [u for u in units.values() if u[1] > 0 and u[3] > 0]  # a prompt neither head drafted on says nothing
    sched = tuple(schedule) if schedule else (len(units) or 1,)
    j = len(sched) - 1 if look is None else look
    a = look_alpha(sched, j)
    x: np.ndarray = np.array(rows, dtype=np.float64).reshape(-1, 4)
    est = stats.bootstrap_sums(x, _diff, resamples=RESAMPLES, seed=BOOT_SEED)
    tot = x.sum(axis=0) if len(rows) else np.zeros(4)
    lo = hi = None
    se = est.sd * math.sqrt(len(rows) / (len(rows) - 1)) if est.sd is not None and len(rows) > 1 else None
    if est.value is not None and se is not None:
        q = _t_quantile(1 - a, len(rows) - 1)
        lo, hi = est.value - q * se, est.value + q * se
    return HeadFinding(mode, float(tot[0] / tot[1]) if tot[1] else None, float(tot[2] / tot[3]) if tot[3] else None,
                       est.value, (lo, hi), 1 - 2 * a, margin, len(rows), int(tot[1]), j + 1, len(sched), se)


def _t_quantile(p: float, df: int) -> float:
    """Student's t quantile by the Cornish-Fisher expansion in 1/df (Abramowitz & Stegun 26.7.5):
    the bootstrap standard error of a few prompts is itself uncertain, so the interval is a t one."""
    z = _NORMAL.inv_cdf(p)
    v = float(max(df, 1))
    return (z + (z ** 3 + z) / (4 * v) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * v ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * v ** 3))


def decide_head(pairs: Sequence[HeadPair], mode: str, margin: float, budget: int) -> HeadFinding:
    """The finding at the first look of ``budget``'s schedule that decides, else at the last look the
    pairs reach (prompts in the order measured)."""
    schedule = look_schedule(budget)
    order = list(_units(pairs))
    finding = None
    for j, n in enumerate(schedule):
        if n > len(order):
            break
        keep = set(order[:n])
        finding = judge_head([p for p in pairs if p.prompt_id in keep], mode, margin, schedule, j)
        if finding.decision != HeadDecision.INCONCLUSIVE:
            return finding
    # the last look the pairs reached (prompts past it, which a run that stops at looks never has, are
    # left out); fewer prompts than the first look: judged at the first look's confidence
    return finding if finding is not None else judge_head(pairs, mode, margin, schedule, 0)
