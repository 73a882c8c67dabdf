"""Ranking and recommendation of ``ggufmtp tune``: one :class:`ConfigRow` per configuration searched
(measurements with 95% bootstrap CIs over its units) and the :class:`Recommendation`.

Recommendation rule
-------------------
Final ranking: every configuration of the final rung, with 95% percentile-bootstrap CIs of the
speedup and acceptance over units (:mod:`ggufmtp.stats`, 2000 resamples, seed 0), clustered
by prompt: units that share a suite prompt (at concurrency > 1 a unit is a batch of several prompts,
and batches wrap around the suite) are pooled into one resampling unit, so a prompt is never
counted as two independent observations (``ci_units`` says how many there were). The best is
the highest speedup point estimate among them (ties: the simpler configuration -- smaller k, then
n_min 0, p_min 0, backend sampling off, more slots). It is *recommended* when its speedup CI lower
bound exceeds 1.0; it is *clear* when that lower bound also exceeds the CI upper bound of every
other final configuration. When no configuration beats vanilla this way, the recommendation is to
run without MTP.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ... import stats
from ...fmt import ci_text, times
from ...fmt import finite_or_none as _num
from ..core.options import TuneConfig
from .search import ConfigStatus, Mismatch, SearchState, SHResult, UnitResult, rank_value

__all__ = ["RULE", "ConfigRow", "Recommendation", "config_row", "rank_configs", "recommend_config", "prompt_clusters"]

RULE = ("best = highest speedup point estimate among the final rung's configurations, all with output identical "
        "to vanilla or differing only where verify's numerics analysis explains it (ties: the simpler: smaller k, "
        "n-min 0, p-min 0, backend sampling off, more slots); recommended "
        "when its 95% bootstrap CI lower bound > 1.0, else run without MTP; 'clear' when that lower bound also "
        "exceeds every other final configuration's CI upper bound")

_NO_CI: list[float | None] = [None, None]


@dataclass
class ConfigRow:
    """One configuration searched: where it got to and what it measured (None: not measured)."""

    config: TuneConfig
    status: ConfigStatus
    reason: str | None
    rung: int
    merged_into: str | None
    units: int
    evaluations: int
    speedup: float | None = None
    speedup_ci95: list[float | None] = field(default_factory=lambda: list(_NO_CI))
    median_speedup: float | None = None
    acceptance: float | None = None
    acceptance_ci95: list[float | None] = field(default_factory=lambda: list(_NO_CI))
    draft_n: int | None = None  # None when no unit was measured
    draft_n_accepted: int | None = None
    mtp_tokens_per_second: float | None = None
    vanilla_tokens_per_second: float | None = None
    identical: bool | None = None
    lossless: bool | None = None  # identical, or differing only where numerics explain it
    mismatch: Mismatch | None = None  # the first non-identical reply
    ci_units: int | None = None  # the bootstrap's resampling units (prompt clusters); None when not measured

    @property
    def key(self) -> str:
        return self.config.key

    def to_dict(self) -> dict[str, Any]:
        """The ``ranking`` entry of tune's JSON (draft counts only when measured, mismatch only when any)."""
        d: dict[str, Any] = {
            "config": self.config.to_dict(), "key": self.key, "status": self.status.value, "reason": self.reason,
            "rung": self.rung, "merged_into": self.merged_into, "units": self.units, "evaluations": self.evaluations,
            "speedup": self.speedup, "speedup_ci95": list(self.speedup_ci95), "median_speedup": self.median_speedup,
            "acceptance": self.acceptance, "acceptance_ci95": list(self.acceptance_ci95)}
        if self.draft_n is not None:
            d.update(draft_n=self.draft_n, draft_n_accepted=self.draft_n_accepted)
        d.update(mtp_tokens_per_second=self.mtp_tokens_per_second,
                 vanilla_tokens_per_second=self.vanilla_tokens_per_second, identical=self.identical,
                 lossless=self.lossless, ci_units=self.ci_units)
        if self.mismatch is not None:
            d["mismatch"] = self.mismatch.to_dict()
        return d


@dataclass
class Recommendation:
    """What tune recommends (see :data:`RULE`); ``best`` is None when nothing reached the final rung."""

    best: str | None
    recommended: str | None
    mtp_beats_vanilla: bool
    clear: bool
    within_noise_of: list[str]
    why: str
    best_config: TuneConfig | None = None
    speedup: float | None = None
    speedup_ci95: list[float | None] | None = None
    acceptance: float | None = None
    equivalent_simpler: str | None = None  # the best's simpler twin that drafted exactly its tokens
    rule: str = RULE

    @property
    def recommended_config(self) -> TuneConfig | None:
        return self.best_config if self.recommended else None

    def to_dict(self) -> dict[str, Any]:
        if self.best is None:
            return {"best": None, "recommended": None, "mtp_beats_vanilla": False, "clear": False,
                    "within_noise_of": [], "rule": self.rule, "why": self.why}
        cfg = self.best_config.to_dict() if self.best_config else None
        d = {"best": self.best, "best_config": cfg, "recommended": self.recommended,
             "recommended_config": cfg if self.recommended else None, "speedup": self.speedup,
             "speedup_ci95": self.speedup_ci95, "acceptance": self.acceptance,
             "mtp_beats_vanilla": self.mtp_beats_vanilla, "clear": self.clear,
             "within_noise_of": list(self.within_noise_of), "rule": self.rule, "why": self.why}
        if self.equivalent_simpler is not None:
            d["equivalent_simpler"] = self.equivalent_simpler
        return d


def config_row(st: SearchState, resamples: int = stats.DEFAULT_RESAMPLES,
               seed: int = stats.DEFAULT_SEED) -> ConfigRow:
    """The configuration's measurements with 95% bootstrap CIs over its units."""
    rs = st.results
    row = ConfigRow(config=st.config, status=st.status, reason=st.reason, rung=st.rung, merged_into=st.merged_into,
                    units=len(rs), evaluations=sum(max(1, r.requests) for r in rs))
    if not rs:
        return row
    x = prompt_clusters(rs)
    sp = stats.throughput_ratio(x[:, 0], x[:, 1], x[:, 2], x[:, 3], resamples=resamples, seed=seed)
    acc = stats.ratio_of_sums(x[:, 4], x[:, 5], resamples=resamples, seed=seed)
    tot = x.sum(axis=0)
    row.speedup, row.speedup_ci95 = _num(sp.value), [_num(sp.lo), _num(sp.hi)]
    row.median_speedup = _num(st.median_speedup())
    row.acceptance, row.acceptance_ci95 = _num(acc.value), [_num(acc.lo), _num(acc.hi)]
    row.draft_n, row.draft_n_accepted = int(tot[5]), int(tot[4])
    row.mtp_tokens_per_second = _num(tot[0] / tot[1] * 1000) if tot[1] > 0 else None
    row.vanilla_tokens_per_second = _num(tot[2] / tot[3] * 1000) if tot[3] > 0 else None
    row.identical = all(r.identical for r in rs)
    row.lossless = all(r.lossless for r in rs)
    row.mismatch = next((r.mismatch for r in rs if r.mismatch), None)
    row.ci_units = int(x.shape[0])
    return row


def prompt_clusters(results: Sequence[UnitResult]) -> np.ndarray:
    """One row per cluster of units that share a prompt (connected through their ``prompt_ids``;
    a unit without prompt ids is its own cluster): the summed [MTP tokens, MTP ms, vanilla tokens,
    vanilla ms, accepted, drafted] -- the bootstrap's resampling units."""
    parent = list(range(len(results)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[str, int] = {}
    for i, r in enumerate(results):
        for p in r.prompt_ids:
            j = first.setdefault(p, i)
            parent[root(i)] = root(j)
    sums: dict[int, np.ndarray] = {}
    for i, r in enumerate(results):
        row = np.array([r.mtp_tokens, r.mtp_ms, r.van_tokens, r.van_ms, r.draft_n_accepted, r.draft_n], float)
        sums[root(i)] = sums.get(root(i), 0) + row
    return np.array(list(sums.values()))


_STATUS_ORDER = {ConfigStatus.FINAL: 0, ConfigStatus.ELIMINATED: 1, ConfigStatus.DROPPED: 2, ConfigStatus.ACTIVE: 1}


def rank_configs(sh: SHResult, resamples: int = stats.DEFAULT_RESAMPLES,
                 seed: int = stats.DEFAULT_SEED) -> list[ConfigRow]:
    """Every configuration searched, final ones first (by speedup), then eliminated ones (by the rung
    they reached, then speedup), then dropped ones."""
    rows = [config_row(s, resamples, seed) for s in sh.states]
    rows.sort(key=lambda r: (_STATUS_ORDER[r.status], -r.rung,
                             -rank_value(r.speedup if r.status == ConfigStatus.FINAL else r.median_speedup),
                             r.config.complexity()))
    return rows


def recommend_config(rows: Sequence[ConfigRow]) -> Recommendation:
    """The recommendation from :func:`rank_configs` rows (see :data:`RULE`)."""
    final = [r for r in rows if r.status == ConfigStatus.FINAL and r.lossless]
    if not final:
        return Recommendation(best=None, recommended=None, mtp_beats_vanilla=False, clear=False, within_noise_of=[],
                              why="no configuration reached the final rung with output identical to vanilla (up to numerics)")
    final.sort(key=lambda r: (-rank_value(r.speedup), r.config.complexity()))
    best, others = final[0], final[1:]
    lo = (best.speedup_ci95 or _NO_CI)[0]
    beats = lo is not None and lo > 1.0
    clear = bool(others) and lo is not None and all(
        (r.speedup_ci95 or _NO_CI)[1] is not None and lo > r.speedup_ci95[1] for r in others)
    near = [r.key for r in others if lo is not None and (r.speedup_ci95 or _NO_CI)[1] is not None
            and r.speedup_ci95[1] >= lo]
    if beats:
        why = (f"{best.key}: speedup {best.speedup:.3f}x, CI lower bound {lo:.3f} > 1.0"
               + ("; clearly ahead of the other final configurations" if clear
                  else (f"; within noise of {', '.join(near)}" if near else "")))
    else:
        why = (f"no configuration beats vanilla with confidence (best {best.key}: speedup "
               f"{times(best.speedup, sign='x')}, CI {ci_text(best.speedup_ci95, sep='-')}): run without MTP here")
    return Recommendation(best=best.key, recommended=best.key if beats else None, mtp_beats_vanilla=beats,
                          clear=clear, within_noise_of=near, why=why, best_config=best.config, speedup=best.speedup,
                          speedup_ci95=best.speedup_ci95, acceptance=best.acceptance)
