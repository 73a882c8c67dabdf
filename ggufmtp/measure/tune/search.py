"""The search of ``ggufmtp tune`` (pure: no server here): the candidate configurations, their order,
the successive-halving schedule and the search itself, driven by an evaluator
(:mod:`ggufmtp.measure.tune.bench` measures on llama-server; tests pass fakes).

Search space
------------
One :class:`TuneConfig` = one llama-server command line with ``--spec-type draft-mtp``:

- ``--spec-draft-n-max`` in 1..8 (the draft window k);
- ``--spec-draft-p-min`` in {0, 0.5, 0.75, 0.9} (the MTP head stops drafting at the first token whose
  top probability is below it);
- ``--spec-draft-n-min`` in {0, 1, 2}, at most k. At llama.cpp 0c1e570 the MTP drafter
  (``common/speculative.cpp``, ``common_speculative_impl_draft_mtp::draft``) stops early only on
  ``p_min``, and a draft shorter than ``n_min`` is thrown away; with ``p_min = 0`` every draft has k
  tokens, so ``n_min`` changes nothing and only ``n_min = 0`` is searched there;
- target sampling on the backend (``-bs``) on/off and drafter sampling on the backend
  (``--spec-draft-backend-sampling`` / ``--no-spec-draft-backend-sampling``) on/off: only when
  llama-server lists these flags in ``--help`` AND the model is offloaded to a GPU; on a CPU run
  the two dimensions are skipped (and the result says so) -- the backend is then the CPU itself;
- ``--parallel`` (slots), for ``concurrency > 1`` only: {concurrency, ceil(concurrency / 2)}. More
  slots than concurrent clients are never busy, so they are not searched; fewer slots queue some
  requests, which keeps the batch per step smaller (where MTP's verification is cheaper).

Successive halving
------------------
The candidates are put in a deterministic order: anchors first (:func:`search_anchors`: the
defaults, the defaults with GPU sampling, then one best-guess configuration per window), then a
seeded shuffle, round-robin over k so that every prefix covers the windows evenly. Rung 0 measures the first ``n0`` of them on ``units0``
*units* (a unit = one suite prompt, under every seed; with ``concurrency > 1`` a unit is a batch of
``concurrency`` prompts sent at once); each later rung keeps the top ``1/eta`` of the survivors by
speedup -- the median of their per-unit speedups, which one stalled request on a busy machine barely
moves (the final ranking reports the ratio of sums with CIs, as verify) -- and doubles the number of units (earlier
measurements are kept and only the new units are
run), until at most ``final_size`` configurations remain -- that last rung is the final one; it
measures the whole suite when that costs at most half the budget (``final_on_suite``). ``n0``
is the largest number of candidates whose whole schedule fits in ``budget`` *evaluations*
(evaluation = one request to an MTP server; every one is paired with one vanilla request), so the
search never spends more than the budget; when every candidate fits, ``units0`` is doubled while it
still fits. A configuration whose output differs from vanilla on any request is dropped at once
(its remaining units are not run), as is one whose server fails to start, crashes or never drafts.
At each promotion a configuration whose draft-p-min/n-min has cut nothing yet (same drafted and
accepted counts as its twin without them on every common unit) is folded into that twin
(:func:`_merge_draft_twins`): timing noise alone separates the two, so one slot is enough.

"""

from __future__ import annotations

import dataclasses
import enum
import math
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import FatalTuneError, GgufmtpError, LossyOptionError, TuneError
from ..core.options import CUDA_GRAPH_OPT_ENV, TuneConfig
from ..core.records import Keyed, first_difference

__all__ = [
    "N_MAX_VALUES", "N_MIN_VALUES", "P_MIN_VALUES", "DEFAULT_UNITS0", "DEFAULT_ETA", "DEFAULT_FINAL_SIZE",
    "ConfigStatus", "Mismatch", "SearchSpace", "UnitResult", "Evaluator", "Rung", "SearchState", "SHResult", "candidate_space",
    "search_anchors", "order_candidates", "plan_rungs", "schedule_cost", "fit_schedule", "final_rung_units",
    "successive_halving", "inert_draft_limits", "rank_value",
]

N_MAX_VALUES = tuple(range(1, 9))
N_MIN_VALUES = (0, 1, 2)
P_MIN_VALUES = (0.0, 0.5, 0.75, 0.9)
DEFAULT_UNITS0 = 2
DEFAULT_ETA = 2
DEFAULT_FINAL_SIZE = 2


# ----------------------------------------------------------------------------- configurations


def candidate_space(concurrency: int = 1, gpu: bool = False, flags: Iterable[str] | None = None,
                    n_max_values: Sequence[int] = N_MAX_VALUES, n_min_values: Sequence[int] = N_MIN_VALUES,
                    p_min_values: Sequence[float] = P_MIN_VALUES,
                    cuda: bool = False) -> tuple[list[TuneConfig], SearchSpace]:
    """Every candidate configuration and a description of the dimensions (what was searched, what
    was skipped and why). ``flags`` = the flags llama-server lists in ``--help`` (None: all assumed);
    ``cuda``: the server offloads to a CUDA device (enables the CUDA graph-optimisation dimension)."""
    if concurrency < 1:
        raise TuneError(f"concurrency {concurrency}: must be at least 1")
    fl = set(flags) if flags is not None else None
    notes: list[str] = []
    has = (lambda f: fl is None or f in fl)  # noqa: E731 (a local one-liner)
    if gpu and has("-bs"):
        bs_values: tuple[bool | None, ...] = (False, True)
    else:
        bs_values = (None,)
        notes.append("target backend sampling (-bs) not searched: "
                     + ("no GPU offload (on CPU the backend is the CPU)" if not gpu else "this llama-server has no -bs flag"))
    if gpu and has("--spec-draft-backend-sampling") and has("--no-spec-draft-backend-sampling"):
        dbs_values: tuple[bool | None, ...] = (True, False)
    else:
        dbs_values = (None,)
        notes.append("drafter backend sampling (--spec-draft-backend-sampling) not searched: "
                     + ("no GPU offload (on CPU the backend is the CPU)" if not gpu
                        else "this llama-server has no --[no-]spec-draft-backend-sampling flag"))
    if gpu and cuda:
        gopt_values: tuple[bool | None, ...] = (False, True)
    else:
        gopt_values = (None,)
        notes.append(f"{CUDA_GRAPH_OPT_ENV} not searched: " + ("no CUDA device offloaded" if not gpu else "not a CUDA device"))
    if concurrency > 1:
        slots = sorted({concurrency, math.ceil(concurrency / 2)}, reverse=True)
    else:
        slots = [1]
    out: list[TuneConfig] = []
    for k in n_max_values:
        for pmin in p_min_values:
            for nmin in n_min_values:
                if nmin > k or (pmin == 0 and nmin != 0):
                    continue
                for bs in bs_values:
                    for dbs in dbs_values:
                        for np_ in slots:
                            for gopt in gopt_values:
                                out.append(TuneConfig(int(k), int(nmin), float(pmin), bs, dbs, int(np_), gopt))
    if any(p == 0 for p in p_min_values) and any(n > 0 for n in n_min_values):
        notes.append("draft-n-min > 0 searched only with draft-p-min > 0: at 0c1e570 the MTP drafter stops "
                     "early only on p-min, so with p-min 0 every draft has k tokens and n-min changes nothing")
    return out, SearchSpace(
        n_candidates=len(out), notes=notes, draft_n_max=list(n_max_values), draft_n_min=list(n_min_values),
        draft_p_min=list(p_min_values), backend_sampling=[v for v in bs_values if v is not None] or None,
        draft_backend_sampling=[v for v in dbs_values if v is not None] or None, parallel=slots,
        cuda_graph_opt=[v for v in gopt_values if v is not None] or None)


@dataclass(frozen=True)
class SearchSpace(Keyed):
    """The dimensions searched (the values of each; None: not searched) and why any was skipped
    (``notes``); ``custom``: a given candidate list instead of the built-in space."""

    n_candidates: int
    notes: list[str]
    custom: bool = False
    draft_n_max: list[int] | None = None
    draft_n_min: list[int] | None = None
    draft_p_min: list[float] | None = None
    backend_sampling: list[bool] | None = None
    draft_backend_sampling: list[bool] | None = None
    parallel: list[int] | None = None
    cuda_graph_opt: list[bool] | None = None

    def to_dict(self, keys: Sequence[str] | None = None) -> dict[str, Any]:
        """The ``space`` object of tune's JSON."""
        if keys is None:
            keys = (("n_candidates", "notes", "custom") if self.custom else
                    ("draft_n_max", "draft_n_min", "draft_p_min", "backend_sampling", "draft_backend_sampling",
                     "parallel", "cuda_graph_opt", "n_candidates", "notes"))
        return super().to_dict(keys)


def search_anchors(space: Sequence[TuneConfig], default_n_max: int = 3) -> list[TuneConfig]:
    """The candidates every search measures first, in this order: llama-server's defaults; on a GPU
    the same with the target's sampling on the GPU (the largest single gain the facts file
    measured) and that with CUDA's graph optimisation; then a window sweep: every other
    draft-n-max, nearest the default first, with the best-guess flags (GPU sampling where
    searched, no graph optimisation, n-min 0, p-min 0). The window matters as much as the flags
    (on the H200, k=4 with GPU sampling beat k=3 by 3%), and a seeded shuffle alone can miss it."""
    slots = max((c.parallel for c in space), default=1)
    plain = [c for c in space if c.draft_n_min == 0 and c.draft_p_min == 0.0 and c.parallel == slots
             and c.draft_backend_sampling in (None, True)]

    def first(pred: Callable[[TuneConfig], bool]) -> list[TuneConfig]:
        return [c for c in plain if pred(c)][:1]

    k0 = default_n_max
    anchors = first(lambda c: c.draft_n_max == k0 and c.backend_sampling in (None, False) and not c.cuda_graph_opt)
    anchors += first(lambda c: c.draft_n_max == k0 and c.backend_sampling is True and not c.cuda_graph_opt)
    anchors += first(lambda c: c.draft_n_max == k0 and c.backend_sampling is True and bool(c.cuda_graph_opt))
    best_guess = (lambda c: c.backend_sampling in (None, True) and not c.cuda_graph_opt)  # noqa: E731 (a local one-liner)
    for k in sorted({c.draft_n_max for c in plain} - {k0}, key=lambda k: (abs(k - k0), -k)):
        anchors += first(lambda c, k=k: c.draft_n_max == k and best_guess(c))
    return anchors


def order_candidates(configs: Sequence[TuneConfig], seed: int = 0,
                     anchors: Sequence[TuneConfig] = ()) -> list[TuneConfig]:
    """Deterministic search order: ``anchors`` first (those among the candidates), then a seeded
    shuffle re-ordered round-robin over ``draft_n_max``, so every prefix covers the windows evenly."""
    rng = random.Random(seed)
    pool = list(dict.fromkeys(configs))
    first = [a for a in anchors if a in pool]
    rest = [c for c in pool if c not in first]
    rng.shuffle(rest)
    by_k: dict[int, list[TuneConfig]] = {}
    for c in rest:
        by_k.setdefault(c.draft_n_max, []).append(c)
    ks = sorted(by_k)
    rng.shuffle(ks)
    inter: list[TuneConfig] = []
    while any(by_k.values()):
        for k in ks:
            if by_k[k]:
                inter.append(by_k[k].pop(0))
    return first + inter



# ----------------------------------------------------------------------------- successive halving


@dataclass(frozen=True)
class Mismatch:
    """Where an MTP reply first differs from vanilla's, with the text around it."""

    prompt_id: str
    seed: int
    first_difference_at: int
    vanilla: str
    mtp: str
    # verify's numerics analysis on the vanilla server (ggufmtp.measure.verify.divergence), when it ran:
    # vanilla's top-2 margin where the replies part, the drift batching alone caused, and whether
    # the one is within the other (explained_by_numerics)
    margin_nats: float | None = None
    drift_nats: float | None = None
    explained: bool = False
    why: str | None = None  # why the analysis has no margin (the reply did not reproduce, a cap, ...)

    @classmethod
    def of(cls, vanilla: str, mtp: str, prompt_id: str, seed: int) -> Mismatch:
        """The first difference of two replies, 30 characters before it to 50 after."""
        i, v, m = first_difference(vanilla, mtp)
        return cls(prompt_id, seed, i, v, m)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class UnitResult:
    """One unit (prompt, or batch of prompts) measured on one configuration and on vanilla."""

    unit: int
    mtp_tokens: float
    mtp_ms: float
    van_tokens: float
    van_ms: float
    identical: bool = True
    draft_n: int = 0
    draft_n_accepted: int = 0
    requests: int = 1  # evaluations (MTP requests) this unit cost
    mismatch: Mismatch | None = None
    prompt_ids: tuple[str, ...] = ()  # the suite prompts of the unit (several at concurrency > 1)
    explained: bool = False  # every differing reply of the unit is explained by numerics

    @property
    def lossless(self) -> bool:
        """Output identical to vanilla's, or differing only where numerics explain it (as verify judges)."""
        return self.identical or self.explained


Evaluator = Callable[[TuneConfig, Sequence[int]], list[UnitResult]]


@dataclass
class Rung:
    index: int
    units: int  # units each configuration of this rung has been measured on (cumulative)
    configs: list[str]  # keys measured in this rung
    kept: list[str]  # keys promoted to the next rung (empty for the final rung)
    dropped: dict[str, str]  # key -> reason (mismatch, failure)
    evaluations: int  # spent in this rung
    merged: dict[str, str] = field(default_factory=dict)  # key -> its simpler draft twin (see _merge_draft_twins)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class ConfigStatus(enum.StrEnum):
    """Where a configuration stands in the search."""

    ACTIVE = "active"  # still being measured
    ELIMINATED = "eliminated"  # ranked out (or merged into its draft twin) at a promotion
    DROPPED = "dropped"  # output differed from vanilla, or its server failed
    FINAL = "final"  # measured on the final rung


@dataclass
class SearchState:
    """One configuration's progress through the search: its measured units and its status."""

    config: TuneConfig
    results: list[UnitResult] = field(default_factory=list)
    status: ConfigStatus = ConfigStatus.ACTIVE
    reason: str | None = None
    rung: int = 0
    merged_into: str | None = None  # the simpler draft twin that went on in its place

    @property
    def units(self) -> set[int]:
        return {r.unit for r in self.results}

    def median_speedup(self) -> float:
        """Median of the per-unit speedups: what the rungs rank by (one stalled request on a shared
        machine moves a ratio of sums a lot, a median hardly)."""
        r = [(u.mtp_tokens / u.mtp_ms) / (u.van_tokens / u.van_ms) for u in self.results
             if u.mtp_ms > 0 and u.van_ms > 0 and u.van_tokens > 0]
        return float(np.median(r)) if r else float("nan")

    def speedup(self) -> float:
        if not self.results:
            return float("nan")
        mt = sum(r.mtp_tokens for r in self.results)
        mm = sum(r.mtp_ms for r in self.results)
        vt = sum(r.van_tokens for r in self.results)
        vm = sum(r.van_ms for r in self.results)
        if mm <= 0 or vm <= 0 or vt <= 0:
            return float("nan")
        return (mt / mm) / (vt / vm)


@dataclass
class SHResult:
    states: list[SearchState]
    rungs: list[Rung]
    evaluations: int
    budget: int
    plan: list[tuple[int, int]]  # (configs, cumulative units) per rung as planned
    units0: int
    eta: int

    @property
    def final(self) -> list[SearchState]:
        return [s for s in self.states if s.status == ConfigStatus.FINAL]

    def by_key(self) -> dict[str, SearchState]:
        return {s.config.key: s for s in self.states}


def plan_rungs(n_configs: int, units0: int = DEFAULT_UNITS0, eta: int = DEFAULT_ETA,
               final_size: int = DEFAULT_FINAL_SIZE, max_units: int | None = None,
               final_units: int | None = None) -> list[tuple[int, int]]:
    """``[(configs, cumulative units), ...]`` per rung: halve (by ``eta``) and double the units until at
    most ``final_size`` configurations remain. Units are capped at ``max_units``; once capped, the next
    rung cuts straight to ``final_size`` (more rungs would measure nothing new). ``final_units``
    raises the last rung to at least that many units (capped too), so the finalists are compared
    on, e.g., the whole suite rather than on its first prompts."""
    if n_configs < 1:
        raise TuneError("no configurations to search")
    if units0 < 1 or eta < 2 or final_size < 1:
        raise TuneError("units0 >= 1, eta >= 2 and final_size >= 1 are required")
    cap = max_units if max_units is not None else 1 << 30
    u = min(units0, cap)
    n = n_configs
    plan = [(n, u)]
    while n > final_size:
        if u >= cap:
            plan.append((final_size, u))
            break
        n = max(final_size, math.ceil(n / eta))
        u = min(u * 2, cap)
        plan.append((n, u))
    if final_units is not None:
        n_last, u_last = plan[-1]
        plan[-1] = (n_last, max(u_last, min(final_units, cap)))
    return plan


def schedule_cost(plan: Sequence[tuple[int, int]], unit_cost: int = 1) -> int:
    """Evaluations the plan spends at most (each rung measures only the units its survivors lack)."""
    cost, prev = 0, 0
    for n, u in plan:
        cost += n * (u - prev) * unit_cost
        prev = u
    return cost


def fit_schedule(n_candidates: int, budget: int, units0: int = DEFAULT_UNITS0, eta: int = DEFAULT_ETA,
                 final_size: int = DEFAULT_FINAL_SIZE, max_units: int | None = None,
                 unit_cost: int = 1, final_units: int | None = None) -> tuple[int, int, list[tuple[int, int]]]:
    """``(n0, units0, plan)``: the most candidates whose schedule fits in ``budget``; when all fit,
    ``units0`` doubles while the schedule still fits (more evidence per configuration)."""
    if n_candidates < 1:
        raise TuneError("no candidate configurations")

    def cost(n: int, u0: int) -> int:
        return schedule_cost(plan_rungs(n, u0, eta, final_size, max_units, final_units), unit_cost)

    n_min = min(n_candidates, final_size)
    if cost(n_min, units0) > budget:
        raise TuneError(f"budget {budget} evaluations is too small: the smallest search ({n_min} configurations, "
                        f"{units0} units of {unit_cost} request(s)) needs {cost(n_min, units0)}")
    lo, hi = n_min, n_candidates
    while lo < hi:  # cost is monotone in n
        mid = (lo + hi + 1) // 2
        if cost(mid, units0) <= budget:
            lo = mid
        else:
            hi = mid - 1
    n0, u0 = lo, units0
    if n0 == n_candidates:
        while (max_units is None or u0 * 2 <= max_units) and cost(n0, u0 * 2) <= budget:
            u0 *= 2
    return n0, u0, plan_rungs(n0, u0, eta, final_size, max_units, final_units)


def successive_halving(configs: Sequence[TuneConfig], evaluate: Evaluator, budget: int,
                       units0: int = DEFAULT_UNITS0, eta: int = DEFAULT_ETA, final_size: int = DEFAULT_FINAL_SIZE,
                       max_units: int | None = None, unit_cost: int = 1,
                       log: Callable[[str], None] | None = None, final_units: int | None = None) -> SHResult:
    """Successive halving over ``configs`` (already ordered: the first ``n0`` are searched).

    ``evaluate(config, units)`` measures ``config`` on the given unit indices and returns one
    :class:`UnitResult` per unit measured; it may stop early after a non-identical unit or raise
    :class:`GgufmtpError` (the configuration is then dropped). Every returned result is charged
    ``result.requests`` evaluations; the schedule is sized so that the total never exceeds ``budget``.
    """
    n0, u0, plan = fit_schedule(len(configs), budget, units0, eta, final_size, max_units, unit_cost, final_units)
    states = [SearchState(c) for c in configs[:n0]]
    rungs: list[Rung] = []
    spent = 0
    active = list(states)
    for ri, (_, u_r) in enumerate(plan):
        last = ri == len(plan) - 1
        measured, dropped, rung_spent = _measure_rung(active, ri, u_r, evaluate, budget - spent, unit_cost)
        spent += rung_spent
        alive = [s for s in active if s.status == ConfigStatus.ACTIVE]
        alive.sort(key=lambda s: (-rank_value(s.median_speedup()), s.config.complexity()))
        if last:
            for s in alive:
                s.status = ConfigStatus.FINAL
            kept, merged = [], {}
        else:
            active, merged = _promote(alive, plan[ri + 1][0], ri)
            kept = [s.config.key for s in active]
        rungs.append(Rung(ri, u_r, measured, kept, dropped, rung_spent, merged))
        if log:
            log(_rung_line(rungs[-1], alive, last))
        if not alive:
            break
    return SHResult(states, rungs, spent, budget, plan, u0, eta)


def _measure_rung(active: Sequence[SearchState], ri: int, units: int, evaluate: Evaluator, room: int,
                  unit_cost: int) -> tuple[list[str], dict[str, str], int]:
    """Measure every active configuration on the units it lacks up to ``units``, dropping those that
    fail or differ from vanilla; never spends more than ``room`` evaluations. (keys measured,
    dropped key -> reason, evaluations spent)."""
    spent = 0
    dropped: dict[str, str] = {}
    measured: list[str] = []
    for st in active:
        st.rung = ri
        todo = [u for u in range(units) if u not in st.units]
        if not todo:
            measured.append(st.config.key)
            continue
        # never exceed the budget, whatever the evaluator does
        todo = todo[:max(0, (room - spent) // max(1, unit_cost))]
        try:
            res = evaluate(st.config, todo) if todo else []
            res = [r for r in res if r.unit in set(todo)][:len(todo)]
            err = None
        except FatalTuneError:
            raise
        except GgufmtpError as e:
            res, err = [], e
        spent += sum(max(1, r.requests) for r in res)
        st.results.extend(res)
        measured.append(st.config.key)
        reason = _drop_reason(err, res, todo)
        if reason is not None:
            st.status, st.reason = ConfigStatus.DROPPED, reason
            dropped[st.config.key] = reason
    return measured, dropped, spent


def _drop_reason(err: Exception | None, res: Sequence[UnitResult], todo: Sequence[int]) -> str | None:
    """Why a configuration leaves the search after a measurement (None: it stays)."""
    if isinstance(err, LossyOptionError):
        return str(err).splitlines()[0][:400]
    if err is not None:
        return f"failed: {str(err).splitlines()[0][:300]}"
    lost = next((r for r in res if not r.lossless), None)
    if lost is not None:  # with the analysis's reason where it has no margin (e.g. vanilla's reply did not reproduce)
        why = lost.mismatch.why if lost.mismatch is not None else None
        return "output differs from vanilla" + (f" ({why})" if why else "")
    if len(res) < len(todo):
        return "measured fewer units than asked (budget or evaluator)"
    return None


def _promote(alive: Sequence[SearchState], n_next: int, ri: int) -> tuple[list[SearchState], dict[str, str]]:
    """The top ``n_next`` of ``alive`` (ranked) go on, draft twins folded first; the rest are
    eliminated. (kept states, merged key -> twin key)."""
    ranked, merged = _merge_draft_twins(alive)
    keep, out = ranked[:n_next], ranked[n_next:]
    for s in out:
        s.status, s.reason = ConfigStatus.ELIMINATED, f"eliminated at rung {ri}"
    for s in alive:
        if s.config.key in merged:
            s.status, s.merged_into = ConfigStatus.ELIMINATED, merged[s.config.key]
            s.reason = (f"merged at rung {ri} into {s.merged_into}: drafted exactly its tokens "
                        "(its draft-p-min/n-min cut nothing), so only the simpler one goes on")
    return list(keep), merged


def _rung_line(rung: Rung, alive: Sequence[SearchState], last: bool) -> str:
    """The progress line of one rung."""
    best = alive[0] if alive else None
    return (f"rung {rung.index}: {len(rung.configs)} configs x {rung.units} units, {rung.evaluations} evaluations"
            + (f", best {best.config.key} at {rank_value(best.median_speedup()):.3f}x (median)" if best else "")
            + (f", {len(rung.dropped)} dropped" if rung.dropped else "")
            + (f", {len(rung.merged)} merged into their simpler draft twins" if rung.merged else "")
            + (f"; keeping {len(rung.kept)}" if not last else "; final"))


def rank_value(x: float | None) -> float:
    """``x`` as a sort key: -1.0 when missing or not finite (ranked below every measured speedup)."""
    return float(x) if x is not None and np.isfinite(x) else -1.0



def _plain_twin(cfg: TuneConfig) -> TuneConfig:
    return dataclasses.replace(cfg, draft_n_min=0, draft_p_min=0.0)


def _drafts_alike(a: SearchState, b: SearchState) -> bool:
    """Whether two configurations drafted and had accepted the same number of tokens on every unit
    both were measured on (and there is at least one)."""
    mine = {r.unit: (r.draft_n, r.draft_n_accepted) for r in a.results}
    theirs = {r.unit: (r.draft_n, r.draft_n_accepted) for r in b.results}
    common = mine.keys() & theirs.keys()
    return bool(common) and all(mine[u] == theirs[u] for u in common)


def _merge_draft_twins(ranked: Sequence[SearchState]) -> tuple[list[SearchState], dict[str, str]]:
    """Promotion order for the next rung, with each configuration whose draft-p-min/n-min cut nothing
    so far folded into its twin without them: the twin takes the better rank of the two, so the pair
    holds one slot and the freed one goes to the next distinct configuration. (On the H200 such a
    pair reached the final rung twice, spending half of it on timing noise.) Key -> twin key."""
    plain = {s.config: s for s in ranked if s.config == _plain_twin(s.config)}
    order: list[SearchState] = []
    merged: dict[str, str] = {}
    for s in ranked:
        twin = plain.get(_plain_twin(s.config))
        rep = twin if twin is not None and twin is not s and _drafts_alike(s, twin) else s
        if rep is not s:
            merged[s.config.key] = rep.config.key
        if rep not in order:
            order.append(rep)
    return order, merged


def inert_draft_limits(sh: SHResult) -> dict[str, str]:
    """Final configurations whose draft-p-min/n-min changed nothing: on every unit measured for both,
    they drafted and had accepted exactly the tokens of the same configuration without those
    limits. Key -> the simpler equivalent's key. (On a confident head p-min never cuts a draft, and
    the two then differ only by timing noise, which can still rank them apart.)"""
    plain = {s.config: s for s in sh.states if s.config == _plain_twin(s.config)}
    out: dict[str, str] = {}
    for st in sh.states:
        twin = plain.get(_plain_twin(st.config))
        if st.status == ConfigStatus.FINAL and twin is not None and twin is not st and _drafts_alike(st, twin):
            out[st.config.key] = twin.config.key
    return out



def final_rung_units(on_suite: bool, n_candidates: int, budget: int, units0: int, eta: int, final_size: int,
                 max_units: int, unit_cost: int, suite_units: int, notes: list[str]) -> int | None:
    """The final rung's units: the whole suite when asked and its final rung costs at most half the
    budget (the finalists are then ranked on the prompts verify uses: on an H200 the suite's first
    32 prompts favoured k=2 while the whole suite favoured k=4), else None (plain doubling), with a
    note saying why."""
    if not on_suite:
        return None
    why = None
    try:
        _, _, plan = fit_schedule(n_candidates, budget, units0, eta, final_size, max_units, unit_cost, suite_units)
        prev = plan[-2][1] if len(plan) > 1 else 0
        final_cost = plan[-1][0] * (plan[-1][1] - prev) * unit_cost
        if final_cost * 2 > budget:
            why = f"it would cost {final_cost} of the {budget} evaluations"
    except TuneError:
        why = "it does not fit"
    if why:
        notes.append(f"finalists compared on the first prompts, not on the whole suite ({suite_units} units): {why} "
                     f"(raise --budget)")
        return None
    return suite_units

