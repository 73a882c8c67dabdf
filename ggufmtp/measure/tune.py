"""``ggufmtp tune``: search the llama-server settings that matter for MTP on this hardware, and
``ggufmtp curve``: the hardware's speedup-versus-acceptance curve (synthetic acceptance).

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
moves (the final ranking reports the ratio of sums with CIs, as verify) -- and doubles the number of units (earlier measurements are kept and only the new units are
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

Measurement: the vanilla server (``-np`` = concurrency) stays up for the whole search; one MTP
server at a time is started per (configuration, rung), warmed up (its warm-up reply must draft),
then every unit is sent to both in ABBA order (unit 0 vanilla first, unit 1 MTP first, ...), as
:mod:`ggufmtp.verify` does, at temperature 0 with ``cache_prompt: false``. Speedup of a unit set =
(sum MTP tokens / sum MTP time) / (sum vanilla tokens / sum vanilla time): time = the decode time of
``timings.predicted_ms`` at concurrency 1 (as verify), the wall time of the batch (first send to
last answer) at concurrency > 1 (aggregate output tok/s, prefill included, as a serving benchmark).

Recommendation rule
-------------------
Final ranking: every configuration of the final rung, with 95% percentile-bootstrap CIs of the
speedup and acceptance over units (:mod:`ggufmtp.stats`, 2000 resamples, seed 0). The best is the
highest speedup point estimate among them (ties: the simpler configuration -- smaller k, then
n_min 0, p_min 0, backend sampling off, more slots). It is *recommended* when its speedup CI lower
bound exceeds 1.0; it is *clear* when that lower bound also exceeds the CI upper bound of every
other final configuration. When no configuration beats vanilla this way, the recommendation is to
run without MTP: ``command`` is then the vanilla command, and ``mtp_command`` still gives the best
MTP configuration found. ``command`` is the exact llama-server command line that was measured (the
binary named ``llama-server``, the model's path, every flag except ``--host``/``--port``).

Acceptance curve
----------------
:func:`acceptance_curve` measures the speedup of THIS model's MTP drafting at set acceptance rates:
llama-server 0c1e570's ``--spec-synth-len L`` / ``--spec-synth-rates P0,..,Pk-1`` (benchmarking
only; ``tools/server/server-context.cpp``, ``server_sample_and_accept_synth``) accept draft position
i with probability ``rates[i] / rates[i-1]`` given the previous one was accepted (``rates`` are
unconditional, non-increasing, exactly k = effective ``--spec-draft-n-max`` values), from an RNG
seeded with the request's seed; drafted EOG tokens are never accepted. ``--spec-synth-len L`` is the
mean accepted length including the target token: the server solves ``L - 1 = sum_{i=1..k} p^i`` and
uses ``rates = p, p^2, .., p^k``. The two flags are mutually exclusive; both need an initialized
speculative context (any ``--spec-type``, here draft-mtp; the server exits otherwise). The drafter
still runs and its tokens are emitted, so the output is NOT the model's (not checked); only the cost
of drafting and verifying is real. A point at acceptance ``a`` (accepted / drafted at window k, the
metric verify reports) uses ``--spec-synth-len 1 + k*a`` -- geometric decay along the draft, as a
real head's -- so a user can read off what a head of acceptance ``a`` would gain on this machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import shlex
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from ..measure import stats
from ..errors import FatalTuneError, GgufmtpError, ServerError, TuneError, VerifyError
from ..fmt import ci_text, finite_or_none as _num
from ..runtime.server import LlamaServer, ServerConfig, binary_flags
from ..measure.suite import DEFAULT_SUITE, Prompt, Suite, load_suite, mode_request_fields, modes_for_template
from ..synth.factory import resolve_model

__all__ = [
    "TuneError", "FatalTuneError", "TuneConfig", "UnitResult", "Rung", "SHResult", "TuneResult", "CurveResult",
    "candidate_space", "search_anchors", "order_candidates", "plan_rungs", "final_rung_units", "schedule_cost",
    "fit_schedule",
    "successive_halving", "rank_configs", "recommend_config", "inert_draft_limits", "tune", "acceptance_curve",
    "format_tune", "format_curve", "server_command", "store_in_receipt", "geometric_rates",
    "synth_len_for_acceptance", "DEFAULT_BUDGET", "load_tuned_config",
]

CUDA_GRAPH_OPT_ENV = "GGML_CUDA_GRAPH_OPT"  # read by ggml-cuda at 0c1e570; off unless set to 1
N_MAX_VALUES = tuple(range(1, 9))
N_MIN_VALUES = (0, 1, 2)
P_MIN_VALUES = (0.0, 0.5, 0.75, 0.9)
DEFAULT_BUDGET = 240
DEFAULT_UNITS0 = 2
DEFAULT_ETA = 2
DEFAULT_FINAL_SIZE = 2
DEFAULT_MAX_TOKENS = 128
DEFAULT_CTX_PER_SLOT = 4096
DEFAULT_CURVE_RATES = (0.0, 0.25, 0.5, 0.75, 0.9, 1.0)
WARMUP_TOKENS = 24


# ----------------------------------------------------------------------------- configurations


@dataclass(frozen=True)
class TuneConfig:
    """One MTP server configuration. ``None`` for a backend-sampling switch = not searched (the flag
    is left out: llama-server's default applies)."""

    draft_n_max: int
    draft_n_min: int = 0
    draft_p_min: float = 0.0
    backend_sampling: bool | None = None  # -bs (target sampling on the backend)
    draft_backend_sampling: bool | None = None  # --[no-]spec-draft-backend-sampling
    parallel: int = 1
    cuda_graph_opt: bool | None = None  # GGML_CUDA_GRAPH_OPT=1 (ggml-cuda's concurrent-stream graph optimisation)
    threads: int | None = None  # the MTP server's --threads (None: the run's setting, else llama-server's default)

    def __post_init__(self) -> None:
        for name in ("draft_n_max", "draft_n_min", "parallel", "threads"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                raise TuneError(f"{name} {v!r}: must be an integer")
        if isinstance(self.draft_p_min, bool) or not isinstance(self.draft_p_min, (int, float)):
            raise TuneError(f"draft_p_min {self.draft_p_min!r}: must be a number")
        if self.draft_n_max < 1:
            raise TuneError(f"draft_n_max {self.draft_n_max}: must be at least 1")
        if not 0 <= self.draft_n_min <= self.draft_n_max:
            raise TuneError(f"draft_n_min {self.draft_n_min}: must be between 0 and draft_n_max {self.draft_n_max}")
        if not 0.0 <= self.draft_p_min <= 1.0:
            raise TuneError(f"draft_p_min {self.draft_p_min}: must be in [0, 1]")
        if self.parallel < 1:
            raise TuneError(f"parallel {self.parallel}: must be at least 1")
        if self.threads is not None and self.threads < 1:
            raise TuneError(f"threads {self.threads}: must be at least 1")

    @property
    def key(self) -> str:
        s = f"k={self.draft_n_max} nmin={self.draft_n_min} pmin={self.draft_p_min:g}"
        if self.backend_sampling is not None:
            s += f" bs={'on' if self.backend_sampling else 'off'}"
        if self.draft_backend_sampling is not None:
            s += f" dbs={'on' if self.draft_backend_sampling else 'off'}"
        s += f" np={self.parallel}"
        if self.cuda_graph_opt is not None:
            s += f" gopt={'on' if self.cuda_graph_opt else 'off'}"
        if self.threads is not None:
            s += f" t={self.threads}"
        return s

    def extra_args(self) -> list[str]:
        """Flags beyond those :class:`ServerConfig` writes itself."""
        out: list[str] = []
        if self.backend_sampling:
            out.append("-bs")
        if self.draft_backend_sampling is not None:
            out.append("--spec-draft-backend-sampling" if self.draft_backend_sampling
                       else "--no-spec-draft-backend-sampling")
        return out

    def env(self) -> dict[str, str]:
        """Environment variables the server needs for this configuration."""
        return {CUDA_GRAPH_OPT_ENV: "1"} if self.cuda_graph_opt else {}

    def server_fields(self, base: Mapping[str, Any]) -> dict[str, Any]:
        """``base`` (:class:`ServerConfig` fields shared with the vanilla arm) turned into the MTP
        server's: draft-mtp with this window, this configuration's flags appended (once: ``-bs`` may
        already be in ``base``), its environment added and its thread count in force."""
        kw = dict(base)
        shared = list(base.get("extra_args") or [])
        kw["extra_args"] = shared + [a for a in self.extra_args() if a not in shared]
        kw["env"] = {**(base.get("env") or {}), **self.env()} or None
        if self.threads is not None:
            kw["threads"] = self.threads
        kw.update(draft_mtp=True, draft_n_max=self.draft_n_max, draft_n_min=self.draft_n_min,
                  draft_p_min=self.draft_p_min)
        return kw

    def complexity(self) -> tuple:
        """Tie-break order: simpler first (fewer drafted tokens to verify, fewer non-default flags,
        more slots = less queueing)."""
        return (self.draft_n_max, self.draft_n_min, self.draft_p_min, bool(self.backend_sampling),
                self.draft_backend_sampling is False, bool(self.cuda_graph_opt), self.threads is not None,
                -self.parallel)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["key"] = self.key
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TuneConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    @classmethod
    def coerce(cls, value: Any) -> "TuneConfig":
        """``value`` as a configuration: a TuneConfig or its dict (e.g. tune's recommendation)."""
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            try:
                return cls.from_dict(value)
            except (TypeError, ValueError) as e:
                raise TuneError(f"tuned configuration {value!r}: {e}") from e
        raise TuneError(f"tuned: expected a TuneConfig or its dict, got {type(value).__name__}")


def candidate_space(concurrency: int = 1, gpu: bool = False, flags: Iterable[str] | None = None,
                    n_max_values: Sequence[int] = N_MAX_VALUES, n_min_values: Sequence[int] = N_MIN_VALUES,
                    p_min_values: Sequence[float] = P_MIN_VALUES,
                    cuda: bool = False) -> tuple[list[TuneConfig], dict[str, Any]]:
    """Every candidate configuration and a description of the dimensions (what was searched, what
    was skipped and why). ``flags`` = the flags llama-server lists in ``--help`` (None: all assumed);
    ``cuda``: the server offloads to a CUDA device (enables the CUDA graph-optimisation dimension)."""
    if concurrency < 1:
        raise TuneError(f"concurrency {concurrency}: must be at least 1")
    fl = set(flags) if flags is not None else None
    notes: list[str] = []
    has = (lambda f: fl is None or f in fl)
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
    dims = {
        "draft_n_max": list(n_max_values), "draft_n_min": list(n_min_values), "draft_p_min": list(p_min_values),
        "backend_sampling": [v for v in bs_values if v is not None] or None,
        "draft_backend_sampling": [v for v in dbs_values if v is not None] or None,
        "parallel": slots, "cuda_graph_opt": [v for v in gopt_values if v is not None] or None,
        "n_candidates": len(out), "notes": notes,
    }
    return out, dims


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
    best_guess = (lambda c: c.backend_sampling in (None, True) and not c.cuda_graph_opt)
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
    mismatch: dict[str, Any] | None = None


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


@dataclass
class _State:
    config: TuneConfig
    results: list[UnitResult] = field(default_factory=list)
    status: str = "active"  # active | eliminated | dropped | final
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
    states: list[_State]
    rungs: list[Rung]
    evaluations: int
    budget: int
    plan: list[tuple[int, int]]  # (configs, cumulative units) per rung as planned
    units0: int
    eta: int

    @property
    def final(self) -> list[_State]:
        return [s for s in self.states if s.status == "final"]

    def by_key(self) -> dict[str, _State]:
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
    states = [_State(c) for c in configs[:n0]]
    rungs: list[Rung] = []
    spent = 0
    active = list(states)
    for ri, (n_r, u_r) in enumerate(plan):
        last = ri == len(plan) - 1
        rung_spent = 0
        dropped: dict[str, str] = {}
        measured: list[str] = []
        for st in active:
            st.rung = ri
            todo = [u for u in range(u_r) if u not in st.units]
            if not todo:
                measured.append(st.config.key)
                continue
            # never exceed the budget, whatever the evaluator does
            room = (budget - spent) // max(1, unit_cost)
            todo = todo[:max(0, room)]
            try:
                res = evaluate(st.config, todo) if todo else []
                res = [r for r in res if r.unit in set(todo)][:len(todo)]
                err = None
            except FatalTuneError:
                raise
            except GgufmtpError as e:
                res, err = [], e
            cost = sum(max(1, r.requests) for r in res)
            spent += cost
            rung_spent += cost
            st.results.extend(res)
            measured.append(st.config.key)
            if err is not None:
                st.status, st.reason = "dropped", f"failed: {str(err).splitlines()[0][:300]}"
            elif any(not r.identical for r in res):
                st.status, st.reason = "dropped", "output differs from vanilla"
            elif len(res) < len(todo):
                st.status, st.reason = "dropped", "measured fewer units than asked (budget or evaluator)"
            if st.status == "dropped":
                dropped[st.config.key] = st.reason or ""
        alive = [s for s in active if s.status == "active"]
        alive.sort(key=lambda s: (-_finite(s.median_speedup()), s.config.complexity()))
        merged: dict[str, str] = {}
        if last:
            for s in alive:
                s.status = "final"
            kept: list[str] = []
        else:
            n_next = plan[ri + 1][0]
            ranked, merged = _merge_draft_twins(alive)
            keep, out = ranked[:n_next], ranked[n_next:]
            for s in out:
                s.status, s.reason = "eliminated", f"eliminated at rung {ri}"
            for s in alive:
                if s.config.key in merged:
                    s.status, s.merged_into = "eliminated", merged[s.config.key]
                    s.reason = (f"merged at rung {ri} into {s.merged_into}: drafted exactly its tokens "
                                "(its draft-p-min/n-min cut nothing), so only the simpler one goes on")
            kept = [s.config.key for s in keep]
            active = keep
        rungs.append(Rung(ri, u_r, measured, kept, dropped, rung_spent, merged))
        if log:
            best = alive[0] if alive else None
            log(f"rung {ri}: {len(measured)} configs x {u_r} units, {rung_spent} evaluations"
                + (f", best {best.config.key} at {_finite(best.median_speedup()):.3f}x (median)" if best else "")
                + (f", {len(dropped)} dropped" if dropped else "")
                + (f", {len(merged)} merged into their simpler draft twins" if merged else "")
                + (f"; keeping {len(kept)}" if not last else "; final"))
        if not alive:
            break
    return SHResult(states, rungs, spent, budget, plan, u0, eta)


def _finite(x: float | None) -> float:
    return float(x) if x is not None and np.isfinite(x) else -1.0


# ----------------------------------------------------------------------------- ranking / recommendation


def config_row(st: _State, resamples: int = stats.DEFAULT_RESAMPLES, seed: int = stats.DEFAULT_SEED) -> dict[str, Any]:
    """The configuration's measurements with 95% bootstrap CIs over its units."""
    rs = st.results
    row: dict[str, Any] = {"config": st.config.to_dict(), "key": st.config.key, "status": st.status,
                           "reason": st.reason, "rung": st.rung, "merged_into": st.merged_into, "units": len(rs),
                           "evaluations": sum(max(1, r.requests) for r in rs)}
    if not rs:
        row.update(speedup=None, speedup_ci95=[None, None], median_speedup=None, acceptance=None, acceptance_ci95=[None, None],
                   mtp_tokens_per_second=None, vanilla_tokens_per_second=None, identical=None)
        return row
    x = np.array([[r.mtp_tokens, r.mtp_ms, r.van_tokens, r.van_ms, r.draft_n_accepted, r.draft_n] for r in rs], float)
    sp = stats.throughput_ratio(x[:, 0], x[:, 1], x[:, 2], x[:, 3], resamples=resamples, seed=seed)
    acc = stats.ratio_of_sums(x[:, 4], x[:, 5], resamples=resamples, seed=seed)
    tot = x.sum(axis=0)
    row.update(
        speedup=_num(sp.value), speedup_ci95=[_num(sp.lo), _num(sp.hi)], median_speedup=_num(st.median_speedup()),
        acceptance=_num(acc.value), acceptance_ci95=[_num(acc.lo), _num(acc.hi)],
        draft_n=int(tot[5]), draft_n_accepted=int(tot[4]),
        mtp_tokens_per_second=_num(tot[0] / tot[1] * 1000) if tot[1] > 0 else None,
        vanilla_tokens_per_second=_num(tot[2] / tot[3] * 1000) if tot[3] > 0 else None,
        identical=all(r.identical for r in rs),
    )
    mism = [r.mismatch for r in rs if r.mismatch]
    if mism:
        row["mismatch"] = mism[0]
    return row


def rank_configs(sh: SHResult, resamples: int = stats.DEFAULT_RESAMPLES,
                 seed: int = stats.DEFAULT_SEED) -> list[dict[str, Any]]:
    """Every configuration searched, final ones first (by speedup), then eliminated ones (by the rung
    they reached, then speedup), then dropped ones."""
    order = {"final": 0, "eliminated": 1, "dropped": 2, "active": 1}
    rows = [config_row(s, resamples, seed) for s in sh.states]
    cfg = {s.config.key: s.config for s in sh.states}
    rows.sort(key=lambda r: (order[r["status"]], -r["rung"],
                             -_finite(r["speedup"] if r["status"] == "final" else r["median_speedup"]),
                             cfg[r["key"]].complexity()))
    return rows


RULE = ("best = highest speedup point estimate among the final rung's configurations, all with output identical "
        "to vanilla (ties: the simpler: smaller k, n-min 0, p-min 0, backend sampling off, more slots); recommended "
        "when its 95% bootstrap CI lower bound > 1.0, else run without MTP; 'clear' when that lower bound also "
        "exceeds every other final configuration's CI upper bound")


def recommend_config(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The recommendation from :func:`rank_configs` rows (see :data:`RULE`)."""
    final = [r for r in rows if r["status"] == "final" and r.get("identical")]
    if not final:
        return {"best": None, "recommended": None, "mtp_beats_vanilla": False, "clear": False,
                "within_noise_of": [], "rule": RULE,
                "why": "no configuration reached the final rung with output identical to vanilla"}
    cfg = {r["key"]: TuneConfig.from_dict(r["config"]) for r in final}
    final.sort(key=lambda r: (-_finite(r["speedup"]), cfg[r["key"]].complexity()))
    best = final[0]
    lo = (best.get("speedup_ci95") or [None, None])[0]
    others = final[1:]
    beats = lo is not None and lo > 1.0
    clear = bool(others) and lo is not None and all(
        (r.get("speedup_ci95") or [None, None])[1] is not None and lo > r["speedup_ci95"][1] for r in others)
    near = [r["key"] for r in others if lo is not None and (r.get("speedup_ci95") or [None, None])[1] is not None
            and r["speedup_ci95"][1] >= lo]
    if beats:
        why = (f"{best['key']}: speedup {best['speedup']:.3f}x, CI lower bound {lo:.3f} > 1.0"
               + ("; clearly ahead of the other final configurations" if clear
                  else (f"; within noise of {', '.join(near)}" if near else "")))
    else:
        why = (f"no configuration beats vanilla with confidence (best {best['key']}: speedup "
               f"{_fmt_x(best.get('speedup'))}, CI {_fmt_ci(best.get('speedup_ci95'))}): run without MTP here")
    return {"best": best["key"], "best_config": best["config"], "recommended": best["key"] if beats else None,
            "recommended_config": best["config"] if beats else None, "speedup": best.get("speedup"),
            "speedup_ci95": best.get("speedup_ci95"), "acceptance": best.get("acceptance"),
            "mtp_beats_vanilla": beats, "clear": clear, "within_noise_of": near, "rule": RULE, "why": why}


def _plain_twin(cfg: TuneConfig) -> TuneConfig:
    return dataclasses.replace(cfg, draft_n_min=0, draft_p_min=0.0)


def _drafts_alike(a: _State, b: _State) -> bool:
    """Whether two configurations drafted and had accepted the same number of tokens on every unit
    both were measured on (and there is at least one)."""
    mine = {r.unit: (r.draft_n, r.draft_n_accepted) for r in a.results}
    theirs = {r.unit: (r.draft_n, r.draft_n_accepted) for r in b.results}
    common = mine.keys() & theirs.keys()
    return bool(common) and all(mine[u] == theirs[u] for u in common)


def _merge_draft_twins(ranked: Sequence[_State]) -> tuple[list[_State], dict[str, str]]:
    """Promotion order for the next rung, with each configuration whose draft-p-min/n-min cut nothing
    so far folded into its twin without them: the twin takes the better rank of the two, so the pair
    holds one slot and the freed one goes to the next distinct configuration. (On the H200 such a
    pair reached the final rung twice, spending half of it on timing noise.) Key -> twin key."""
    plain = {s.config: s for s in ranked if s.config == _plain_twin(s.config)}
    order: list[_State] = []
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
        if st.status == "final" and twin is not None and twin is not st and _drafts_alike(st, twin):
            out[st.config.key] = twin.config.key
    return out


def _fmt_x(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}x"


def _fmt_ci(ci: Sequence[float | None] | None) -> str:
    return ci_text(ci, sep="-")


def _fmt_pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:.1f}%"


# ----------------------------------------------------------------------------- commands


def server_command(cfg: ServerConfig, binary: Path | None = None, binary_name: str | None = "llama-server") -> str:
    """The exact llama-server command line of ``cfg`` (as :class:`LlamaServer` would run it), without
    ``--host``/``--port``, after the environment assignments ``cfg.env`` adds; the binary named
    ``binary_name`` (None: its full path)."""
    b = Path(binary) if binary is not None else Path("llama-server")
    args = LlamaServer(cfg).build_command(b, 0)
    out: list[str] = [f"{k}={v}" for k, v in sorted((cfg.env or {}).items())] + [binary_name or str(b)]
    skip = False
    for a in args[1:]:
        if skip:
            skip = False
            continue
        if a in ("--host", "--port"):
            skip = True
            continue
        out.append(a)
    return shlex.join(out)


# ----------------------------------------------------------------------------- the real evaluator


def _text_of(resp: dict[str, Any]) -> str:
    ch = (resp.get("choices") or [{}])[0]
    msg = ch.get("message") or {}
    text = msg.get("content") or ""
    if msg.get("reasoning_content"):
        text = f"<think>{msg['reasoning_content']}</think>{text}"
    return text


def _mismatch(a: str, b: str, prompt_id: str, seed: int) -> dict[str, Any]:
    i = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))
    lo = max(0, i - 30)
    return {"prompt_id": prompt_id, "seed": seed, "first_difference_at": i, "vanilla": a[lo:i + 50],
            "mtp": b[lo:i + 50]}


@dataclass
class _Req:
    tokens: int
    ms: float  # decode ms (timings.predicted_ms)
    text: str
    draft_n: int
    draft_n_accepted: int


class _Bench:
    """Sends units of prompts to a server: one request per (prompt, seed), ``concurrency`` at a time."""

    def __init__(self, prompts: Sequence[Prompt], seeds: Sequence[int], mode: str, max_tokens: int,
                 concurrency: int):
        self.prompts, self.seeds, self.mode = list(prompts), list(seeds), mode
        self.max_tokens, self.concurrency = max_tokens, concurrency
        self.pool = ThreadPoolExecutor(max_workers=concurrency) if concurrency > 1 else None

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)

    def unit_prompts(self, unit: int) -> list[Prompt]:
        n, c = len(self.prompts), self.concurrency
        return [self.prompts[(unit * c + j) % n] for j in range(c)]

    def one(self, srv: LlamaServer, p: Prompt, seed: int, max_tokens: int | None = None) -> _Req:
        resp = srv.chat(p.chat_messages(), max_tokens=max_tokens or self.max_tokens, temperature=0.0, seed=seed,
                        cache_prompt=False, **mode_request_fields(self.mode))
        t = resp.get("timings") or {}
        if "predicted_n" not in t or "predicted_ms" not in t:
            raise ServerError(f"llama-server's answer has no timings.predicted_n/predicted_ms: {str(resp)[:200]}")
        return _Req(int(t["predicted_n"]), float(t["predicted_ms"]), _text_of(resp), int(t.get("draft_n") or 0),
                    int(t.get("draft_n_accepted") or 0))

    def run(self, srv: LlamaServer, unit: int) -> tuple[list[tuple[Prompt, int, _Req]], float]:
        """All requests of one unit; (results, wall ms). Concurrency 1: sequential."""
        jobs = [(p, s) for s in self.seeds for p in self.unit_prompts(unit)]
        t0 = time.perf_counter()
        if self.pool is None:
            out = [(p, s, self.one(srv, p, s)) for p, s in jobs]
        else:
            out = []
            # one batch of `concurrency` prompts per seed, sent at once
            for s in self.seeds:
                futs = [(p, self.pool.submit(self.one, srv, p, s)) for p in self.unit_prompts(unit)]
                out.extend((p, s, f.result()) for p, f in futs)
        return out, (time.perf_counter() - t0) * 1000.0


class _ServerEvaluator:
    """The evaluator of :func:`tune`: vanilla server resident, one MTP server per (config, rung)."""

    def __init__(self, base: dict[str, Any], van: LlamaServer, bench: _Bench, ctx_per_slot: int,
                 warm_prompt: Prompt, bar=None):
        self.base, self.van, self.bench = base, van, bench
        self.ctx_per_slot = ctx_per_slot
        self.warm_prompt = warm_prompt
        self.bar = bar
        self.pair_index = 0
        self.commands: dict[str, str] = {}
        self.logs: dict[str, str] = {}
        self.server_starts = 0

    def _vanilla(self, unit: int):
        try:
            return self.bench.run(self.van, unit)
        except GgufmtpError as e:
            raise FatalTuneError(f"vanilla server: {e}") from e

    def server_config(self, cfg: TuneConfig) -> ServerConfig:
        return ServerConfig(**cfg.server_fields({**self.base, "parallel": cfg.parallel,
                                                 "ctx_size": self.ctx_per_slot * cfg.parallel}))

    def __call__(self, cfg: TuneConfig, units: Sequence[int]) -> list[UnitResult]:
        out: list[UnitResult] = []
        self.server_starts += 1
        with LlamaServer(self.server_config(cfg)) as mtp:
            self.commands[cfg.key] = shlex.join(mtp.command)
            self.logs[cfg.key] = str(mtp.log_path)
            w = self.bench.one(mtp, self.warm_prompt, 0, WARMUP_TOKENS)
            if not w.draft_n:
                raise TuneError(f"{cfg.key}: speculation did not run (the warm-up reply has no timings.draft_n); "
                                f"log {mtp.log_path}")
            for u in units:
                if self.pair_index % 2 == 0:
                    van, van_ms = self._vanilla(u)
                    mt, mt_ms = self.bench.run(mtp, u)
                else:
                    mt, mt_ms = self.bench.run(mtp, u)
                    van, van_ms = self._vanilla(u)
                self.pair_index += 1
                if self.bar is not None:
                    self.bar.update(len(mt))
                ident, mism = True, None
                for (p, s, a), (_, _, b) in zip(van, mt):
                    if a.text != b.text:
                        ident, mism = False, _mismatch(a.text, b.text, p.id, s)
                        break
                if self.bench.concurrency > 1:  # aggregate output tok/s over the batch's wall time
                    m_ms, v_ms = mt_ms, van_ms
                else:  # decode throughput, as verify
                    m_ms, v_ms = sum(r.ms for _, _, r in mt), sum(r.ms for _, _, r in van)
                out.append(UnitResult(
                    unit=u, mtp_tokens=sum(r.tokens for _, _, r in mt), mtp_ms=m_ms,
                    van_tokens=sum(r.tokens for _, _, r in van), van_ms=v_ms, identical=ident,
                    draft_n=sum(r.draft_n for _, _, r in mt), draft_n_accepted=sum(r.draft_n_accepted for _, _, r in mt),
                    requests=len(mt), mismatch=mism))
                if not ident:
                    break
        return out


# ----------------------------------------------------------------------------- result


@dataclass
class TuneResult:
    model: dict[str, Any]
    concurrency: int
    space: dict[str, Any]
    schedule: dict[str, Any]
    rows: list[dict[str, Any]]
    recommendation: dict[str, Any]
    command: str
    mtp_command: str | None
    vanilla_command: str
    settings: dict[str, Any]
    hardware: dict[str, Any]
    server: dict[str, Any]
    notes: list[str]
    seconds: float = 0.0

    @property
    def final_rows(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["status"] == "final"]

    def to_dict(self) -> dict[str, Any]:
        """The receipt's ``verification.tuned`` object (``command`` is what the model card shows)."""
        rec = self.recommendation
        return {
            "kind": "ggufmtp tune",
            "command": self.command,
            "mtp_command": self.mtp_command,
            "vanilla_command": self.vanilla_command,
            "recommended": rec.get("recommended"),
            "recommended_config": rec.get("recommended_config"),
            "best": rec.get("best"),
            "best_config": rec.get("best_config"),
            "speedup": rec.get("speedup"),
            "speedup_ci95": rec.get("speedup_ci95"),
            "acceptance": rec.get("acceptance"),
            "mtp_beats_vanilla": rec.get("mtp_beats_vanilla"),
            "clear": rec.get("clear"),
            "within_noise_of": rec.get("within_noise_of"),
            "why": rec.get("why"),
            "rule": rec.get("rule"),
            "concurrency": self.concurrency,
            "model": self.model,
            "space": self.space,
            "schedule": self.schedule,
            "ranking": self.rows,
            "settings": self.settings,
            "hardware": self.hardware,
            "server": self.server,
            "notes": list(self.notes),
            "seconds": round(self.seconds, 2),
        }

    def table(self) -> str:
        return format_tune(self)


def format_tune(res: TuneResult) -> str:
    L: list[str] = []
    sch, st, hw = res.schedule, res.settings, res.hardware
    L.append(f"ggufmtp tune {Path(res.model['path']).name}  (concurrency {res.concurrency}; "
             f"{'GPU ' + str(hw.get('gpu')) + ', gpu_layers ' + str(hw.get('gpu_layers')) if hw.get('offloaded') else 'CPU, no GPU offload'})")
    L.append(f"search: {res.space['n_candidates']} candidates, {sch['n_searched']} searched by successive halving "
             f"(eta {sch['eta']}, {len(sch['rungs'])} rungs, units {' -> '.join(str(r['units']) for r in sch['rungs'])}"
             f"{', the last = the whole suite' if sch.get('final_on_suite') else ''}); "
             f"{sch['evaluations']}/{sch['budget']} evaluations; suite {st['suite']} x seeds {','.join(map(str, st['seeds']))}, "
             f"max_tokens {st['max_tokens']}")
    for n in res.space.get("notes") or []:
        if n not in res.notes:
            L.append(f"  note: {n}")
    L.append("")
    L.append(f"{'configuration':<40} {'status':<12} {'units':>5} {'acceptance':>10} {'median':>8}  "
             f"{'speedup (95% CI)':<26}")
    shown = 0
    for r in res.rows:
        if r["status"] == "eliminated" and shown >= 12:
            continue
        status = r["status"] if r["status"] != "eliminated" else f"out@rung{r['rung']}"
        if r["status"] == "dropped":
            status = "DROPPED"
        elif r.get("merged_into"):
            status = f"same@rung{r['rung']}"
        L.append(f"{r['key']:<40} {status:<12} {r['units']:>5} {_fmt_pct(r.get('acceptance')):>10} "
                 f"{_fmt_x(r.get('median_speedup')):>8}  "
                 f"{_fmt_x(r.get('speedup')) + ' ' + _fmt_ci(r.get('speedup_ci95')):<26}"
                 + (f"  {r['reason']}" if r["status"] == "dropped" else "")
                 + (f"  drafted as {r['merged_into']}" if r.get("merged_into") else ""))
        shown += 1
    hidden = len(res.rows) - shown
    if hidden > 0:
        L.append(f"... {hidden} more configurations eliminated at rung 0 (see --json)")
    L.append("")
    rec = res.recommendation
    if rec.get("recommended"):
        L.append(f"recommended: {rec['recommended']} ({rec['why']})")
    else:
        L.append(f"recommended: MTP off -- {rec.get('why')}")
    L.append(f"rule: {rec['rule']}")
    L.append("")
    L.append("command:")
    L.append(f"  {res.command}")
    if res.mtp_command and res.mtp_command != res.command:
        L.append("best MTP configuration (not recommended here):")
        L.append(f"  {res.mtp_command}")
    for n in res.notes:
        L.append(f"note: {n}")
    return "\n".join(L)


# ----------------------------------------------------------------------------- tune()


def _inspect_complete(path: Path) -> Any:
    from ..gguf.model import inspect_model

    if not path.is_file():
        raise TuneError(f"model {path}: no such file")
    rep = inspect_model(path)
    if rep.mtp_status != "complete":
        raise TuneError(f"model {path}: its MTP block is {rep.mtp_status}; tuning needs a complete MTP (NextN) block "
                        f"(see `ggufmtp inspect {path}`)")
    return rep


def _prepare(model, suite, limit, llama_cpp_bin):
    """(suite, model path, inspect report, llama-server binary, its flags) for a tune or curve run."""
    from ..runtime import build as runtime

    st = suite if isinstance(suite, Suite) else load_suite(suite)
    st = st.limit(limit)
    path = resolve_model(model)
    rep = _inspect_complete(path)
    try:
        binary = runtime.find_binary("llama-server", llama_cpp_bin)
        flags = binary_flags(binary)
    except GgufmtpError as e:
        raise TuneError(str(e)) from e
    return st, path, rep, binary, flags


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


def tune(
    model: str | os.PathLike,
    concurrency: int = 1,
    budget: int = DEFAULT_BUDGET,
    seeds: Sequence[int] = (42,),
    suite: str | os.PathLike | Suite = DEFAULT_SUITE,
    gpu_layers: int | str | None = None,
    llama_cpp_bin: str | os.PathLike | None = None,
    progress: bool = True,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    limit: int | None = None,
    threads: int | None = None,
    ctx_per_slot: int = DEFAULT_CTX_PER_SLOT,
    units0: int = DEFAULT_UNITS0,
    eta: int = DEFAULT_ETA,
    final_size: int = DEFAULT_FINAL_SIZE,
    final_on_suite: bool = True,
    candidates: Sequence[TuneConfig] | None = None,
    n_max_values: Sequence[int] = N_MAX_VALUES,
    n_min_values: Sequence[int] = N_MIN_VALUES,
    p_min_values: Sequence[float] = P_MIN_VALUES,
    order_seed: int = 0,
    mode: str | None = None,
    extra_args: Sequence[str] = (),
    bootstrap_resamples: int = stats.DEFAULT_RESAMPLES,
    log: Callable[[str], None] | None = None,
) -> TuneResult:
    """Search MTP server settings for ``model`` at ``concurrency`` (see the module docstring).

    ``budget``: evaluations (MTP requests; each paired with a vanilla request) the search may spend.
    ``candidates``: search these configurations instead of the built-in space (their order is kept).
    ``final_on_suite``: the final rung measures its configurations on the whole suite when that
    costs at most half the budget (else a note says so), so the recommendation rests on the
    prompts verify uses.
    ``mode``: thinking mode for templates with a thinking switch (default: the first, "thinking").
    """
    from tqdm import tqdm

    from ..measure.verify import hardware_info

    t0 = time.monotonic()
    if concurrency < 1:
        raise TuneError(f"concurrency {concurrency}: must be at least 1")
    seeds = [int(s) for s in seeds]
    if not seeds or len(set(seeds)) != len(seeds):
        raise TuneError(f"seeds {seeds}: need at least one, no duplicates")
    if max_tokens < 2:
        raise TuneError(f"max_tokens {max_tokens}: must be at least 2")
    st, path, rep, binary, flags = _prepare(model, suite, limit, llama_cpp_bin)
    hw = hardware_info(binary, gpu_layers)
    gpu = bool(hw["offloaded"])
    notes: list[str] = []
    if candidates is None:
        cuda = any(d.upper().startswith("CUDA") for d in hw.get("server_devices") or [])
        space_all, space = candidate_space(concurrency, gpu, flags, n_max_values, n_min_values, p_min_values, cuda)
        anchors = search_anchors(space_all)
        ordered = order_candidates(space_all, order_seed, anchors)
    else:
        ordered = list(dict.fromkeys(candidates))
        if not ordered:
            raise TuneError("candidates: empty")
        space = {"n_candidates": len(ordered), "notes": ["custom candidate list"], "custom": True}
    for n in space.get("notes") or []:
        if "not searched" in n:
            notes.append(n)
    if gpu_layers is not None and not gpu:
        notes.append(f"gpu_layers {gpu_layers} requested but this llama-server lists no GPU device: it ran on CPU")
    if not gpu:
        notes.append("CPU run: a small model is compute-bound on CPU, so speedups here say little about a GPU")

    unit_cost = len(seeds) * concurrency
    max_units = len(st.prompts)
    if concurrency > 1 and len(st.prompts) < concurrency:
        notes.append(f"the suite has {len(st.prompts)} prompts < concurrency {concurrency}: prompts repeat within a batch")

    log = log or ((lambda m: print(m, file=sys.stderr)) if progress else None)
    base = dict(model=path, threads=threads, gpu_layers=gpu_layers, llama_cpp_bin=llama_cpp_bin, metrics=True,
                extra_args=list(extra_args))
    van_cfg = ServerConfig(**base, parallel=concurrency, ctx_size=ctx_per_slot * concurrency)
    final_units = final_rung_units(final_on_suite, len(ordered), budget, units0, eta, final_size, max_units,
                               unit_cost, math.ceil(len(st.prompts) / concurrency), notes)
    n0, u0, plan = fit_schedule(len(ordered), budget, units0, eta, final_size, max_units, unit_cost, final_units)
    total = schedule_cost(plan, unit_cost)
    with contextlib.ExitStack() as stack:
        try:
            van = stack.enter_context(LlamaServer(van_cfg))
            props = van.props()
        except ServerError as e:
            raise TuneError(f"vanilla server: {e}") from e
        modes = modes_for_template(props.get("chat_template"))
        use_mode = mode or modes[0]
        if use_mode not in modes:
            raise TuneError(f"mode {use_mode!r}: this chat template supports {modes}")
        if len(modes) > 1:
            notes.append(f"chat template has a thinking switch: tuned in mode {use_mode!r} only")
        bench = _Bench(st.prompts, seeds, use_mode, max_tokens, concurrency)
        stack.callback(bench.close)
        bench.one(van, st.prompts[0], 0, WARMUP_TOKENS)  # warm-up
        bar = stack.enter_context(tqdm(total=total, desc="tune", unit="req", file=sys.stderr,
                                       disable=None if progress else True, leave=False, dynamic_ncols=True))
        ev = _ServerEvaluator(base, van, bench, ctx_per_slot, st.prompts[0], bar)
        sh = successive_halving(ordered, ev, budget, units0, eta, final_size, max_units, unit_cost, log=log,
                                    final_units=final_units)
        van_command = shlex.join(van.command)
        build_info = props.get("build_info")

    rows = rank_configs(sh, bootstrap_resamples)
    rec = recommend_config(rows)
    if all(r["status"] == "dropped" for r in rows):
        raise TuneError("every configuration was dropped: "
                        + "; ".join(f"{r['key']}: {r['reason']}" for r in rows[:4]))
    vanilla_command = server_command(van_cfg, binary)
    mtp_command = None
    if rec.get("best_config"):
        best_cfg = TuneConfig.from_dict(rec["best_config"])
        mtp_command = server_command(ev.server_config(best_cfg), binary)
    command = mtp_command if rec.get("recommended") else vanilla_command
    dropped = [r for r in rows if r["status"] == "dropped"]
    if dropped:
        notes.append(f"{len(dropped)} configuration(s) dropped: "
                     + "; ".join(f"{r['key']} ({r['reason']})" for r in dropped[:5]))
    if len(rec.get("within_noise_of") or []) and rec.get("recommended"):
        notes.append("the final configurations are within noise of each other; any of them is a fine choice")
    for key, twin in inert_draft_limits(sh).items():
        notes.append(f"{key} drafted exactly the tokens {twin} drafted on every prompt both were measured on: "
                     "its draft-p-min/n-min never cut a draft short here, so the simpler flags are equivalent")
        if key == rec.get("best"):
            rec["equivalent_simpler"] = twin
    schedule = {
        "method": "successive halving", "eta": eta, "units0": sh.units0, "final_size": final_size,
        "final_units": final_units, "final_on_suite": final_units is not None,
        "n_candidates": len(ordered), "n_searched": len(sh.states), "budget": budget,
        "evaluations": sh.evaluations, "planned_evaluations": total, "unit_cost": unit_cost,
        "unit": ("one prompt under every seed" if concurrency == 1
                 else f"a batch of {concurrency} prompts sent at once, under every seed"),
        "plan": [{"configs": n, "units": u} for n, u in sh.plan],
        "rungs": [r.to_dict() for r in sh.rungs], "server_starts": ev.server_starts + 1,
        "order": "anchors first (llama-server defaults; on a GPU the defaults with -bs, and with -bs and CUDA graph optimisation; "
                 "then every other draft-n-max with the best-guess flags, nearest the default first), then a seeded shuffle "
                 "round-robin over draft-n-max "
                 f"(seed {order_seed})",
    }
    settings = {
        "suite": st.name, "suite_sha256": st.sha256, "n_prompts": len(st.prompts), "seeds": seeds,
        "max_tokens": max_tokens, "temperature": 0.0, "mode": use_mode, "ctx_per_slot": ctx_per_slot,
        "threads": threads, "gpu_layers": gpu_layers, "cache_prompt": False,
        "speedup": ("decode throughput: (sum MTP tokens / sum MTP predicted_ms) / (same for vanilla)"
                    if concurrency == 1 else
                    "aggregate output tok/s: (sum MTP tokens / sum MTP batch wall time) / (same for vanilla)"),
        "interleave": "vanilla resident; per unit ABBA order vanilla/MTP",
        "bootstrap": {"unit": "unit (prompt or batch; seeds pooled)", "resamples": bootstrap_resamples,
                      "level": 0.95, "method": "percentile"},
    }
    server = {"binary": str(binary), "build_info": build_info, "vanilla": van_command,
              "measured_commands": {k: v for k, v in ev.commands.items()
                                    if k in {r["key"] for r in rows if r["status"] == "final"}}}
    res = TuneResult(
        model={"path": str(path), "size_bytes": path.stat().st_size, "architecture": rep.architecture,
               "mtp_block": rep.mtp_block},
        concurrency=concurrency, space=space, schedule=schedule, rows=rows, recommendation=rec, command=command,
        mtp_command=mtp_command, vanilla_command=vanilla_command, settings=settings, hardware=hw, server=server,
        notes=notes, seconds=time.monotonic() - t0)
    return res


# ----------------------------------------------------------------------------- acceptance curve


def synth_len_for_acceptance(acceptance: float, k: int) -> float:
    """``--spec-synth-len`` that gives mean acceptance ``acceptance`` (accepted / drafted) at window k."""
    if not 0.0 <= acceptance <= 1.0:
        raise TuneError(f"acceptance {acceptance}: must be in [0, 1]")
    return 1.0 + k * acceptance


def geometric_rates(acceptance: float, k: int) -> list[float]:
    """The unconditional per-position rates ``p, p^2, .., p^k`` with ``sum / k = acceptance`` (the
    same bisection llama-server does for ``--spec-synth-len``)."""
    target = acceptance * k
    if acceptance >= 1.0:
        return [1.0] * k
    if acceptance <= 0.0:
        return [0.0] * k
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(mid ** i for i in range(1, k + 1)) < target:
            lo = mid
        else:
            hi = mid
    p = (lo + hi) / 2
    return [p ** i for i in range(1, k + 1)]


@dataclass
class CurveResult:
    model: dict[str, Any]
    draft_n_max: int
    points: list[dict[str, Any]]
    real: dict[str, Any] | None
    breakeven_acceptance: float | None
    settings: dict[str, Any]
    hardware: dict[str, Any]
    server: dict[str, Any]
    notes: list[str]
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "ggufmtp curve", "model": self.model, "draft_n_max": self.draft_n_max,
                "points": self.points, "real": self.real, "breakeven_acceptance": self.breakeven_acceptance,
                "settings": self.settings, "hardware": self.hardware, "server": self.server,
                "notes": list(self.notes), "seconds": round(self.seconds, 2)}

    def table(self) -> str:
        return format_curve(self)


def _breakeven(points: Sequence[dict[str, Any]]) -> float | None:
    """Acceptance where the speedup crosses 1.0 (linear interpolation between measured points)."""
    pts = sorted((p["acceptance_set"], p["speedup"]) for p in points if p.get("speedup") is not None)
    if not pts:
        return None
    if pts[0][1] >= 1.0:
        return pts[0][0]
    for (a0, s0), (a1, s1) in zip(pts, pts[1:]):
        if s0 < 1.0 <= s1:
            return a0 + (1.0 - s0) * (a1 - a0) / (s1 - s0) if s1 != s0 else a1
    return None


def format_curve(res: CurveResult) -> str:
    L = [f"ggufmtp curve {Path(res.model['path']).name}  (k = {res.draft_n_max}; synthetic acceptance via "
         f"--spec-{res.settings['flag']}; {res.settings['n_prompts']} prompts x seeds "
         f"{','.join(map(str, res.settings['seeds']))}, max_tokens {res.settings['max_tokens']})",
         "",
         f"{'set acceptance':>14} {'synth flag':<26} {'measured acceptance (95% CI)':<30} {'tokens/step':>11} "
         f"{'mtp tok/s':>10} {'vanilla tok/s':>13}  speedup (95% CI)"]
    for p in res.points + ([res.real] if res.real else []):
        name = "real head" if p is res.real else f"{p['acceptance_set'] * 100:.0f}%"
        L.append(f"{name:>14} {p.get('flag_value') or '-':<26} "
                 f"{_fmt_pct(p.get('acceptance')) + ' ' + _fmt_ci_pct(p.get('acceptance_ci95')):<30} "
                 f"{_fmt_f(p.get('tokens_per_step')):>11} {_fmt_f(p.get('mtp_tokens_per_second')):>10} "
                 f"{_fmt_f(p.get('vanilla_tokens_per_second')):>13}  {_fmt_x(p.get('speedup'))} {_fmt_ci(p.get('speedup_ci95'))}")
    L.append("")
    be = res.breakeven_acceptance
    L.append("break-even acceptance (speedup 1.0): " + ("not reached in the measured range" if be is None
                                                       else f"{be * 100:.1f}%"))
    for n in res.notes:
        L.append(f"note: {n}")
    return "\n".join(L)


def _fmt_ci_pct(ci: Sequence[float | None] | None) -> str:
    return ci_text(ci, scale=100, digits=1, sep="-")


def _fmt_f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def acceptance_curve(
    model: str | os.PathLike,
    rates: Sequence[float] = DEFAULT_CURVE_RATES,
    draft_n_max: int = 3,
    synth_len: Sequence[float] | None = None,
    flag: str = "synth-len",
    seeds: Sequence[int] = (42, 1337),
    suite: str | os.PathLike | Suite = DEFAULT_SUITE,
    limit: int | None = 8,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    gpu_layers: int | str | None = None,
    llama_cpp_bin: str | os.PathLike | None = None,
    threads: int | None = None,
    ctx_size: int = DEFAULT_CTX_PER_SLOT,
    include_real: bool = True,
    progress: bool = True,
    bootstrap_resamples: int = stats.DEFAULT_RESAMPLES,
    extra_args: Sequence[str] = (),
) -> CurveResult:
    """Speedup versus synthetic acceptance on this hardware (see the module docstring).

    ``rates``: target acceptances (accepted / drafted at window ``draft_n_max``), each one point.
    ``synth_len``: instead, explicit ``--spec-synth-len`` values (mean accepted length incl. the target
    token, in [1, k+1]). ``flag``: "synth-len" (default) or "synth-rates" (the same geometric rates
    passed explicitly). ``include_real``: also measure the real head at the same k (identical output
    checked). Each point: one MTP server; vanilla stays up; requests ABBA-interleaved, batch size 1.
    """
    from tqdm import tqdm

    from ..measure.verify import hardware_info

    t0 = time.monotonic()
    k = int(draft_n_max)
    if k < 1:
        raise TuneError("draft_n_max must be at least 1")
    if flag not in ("synth-len", "synth-rates"):
        raise TuneError(f"flag {flag!r}: 'synth-len' or 'synth-rates'")
    seeds = [int(s) for s in seeds]
    if not seeds or len(set(seeds)) != len(seeds):
        raise TuneError(f"seeds {seeds}: need at least one, no duplicates")
    if synth_len is not None:
        lens = [float(x) for x in synth_len]
        for L_ in lens:
            if not 1.0 <= L_ <= k + 1:
                raise TuneError(f"synth_len {L_}: must be within [1, {k + 1}] at draft_n_max {k}")
        targets = [(L_ - 1.0) / k for L_ in lens]
    else:
        targets = [float(a) for a in rates]
        for a in targets:
            if not 0.0 <= a <= 1.0:
                raise TuneError(f"rate {a}: must be an acceptance in [0, 1]")
    if not targets:
        raise TuneError("no curve points")
    st, path, rep, binary, flags = _prepare(model, suite, limit, llama_cpp_bin)
    if "--spec-synth-len" not in flags or "--spec-synth-rates" not in flags:
        raise TuneError(f"{binary}: this llama-server has no --spec-synth-len/--spec-synth-rates flags; use the "
                        "knob models (ggufmtp.synth, wrong_successor_fraction) for a curve instead")
    hw = hardware_info(binary, gpu_layers)
    base = dict(model=path, threads=threads, gpu_layers=gpu_layers, llama_cpp_bin=llama_cpp_bin, metrics=True,
                ctx_size=ctx_size, parallel=1, extra_args=list(extra_args))
    notes = ["synthetic acceptance: draft tokens are accepted at random (RNG seeded by the request seed), so the "
             "output is not the model's and is not compared with vanilla; the drafting and verification cost is real"]
    if not hw["offloaded"]:
        notes.append("CPU run: a small model is compute-bound on CPU; the curve describes this machine only")
    points_spec: list[tuple[float, list[str], str]] = []
    for a in targets:
        if flag == "synth-len":
            L_ = synth_len_for_acceptance(a, k)
            val = f"{L_:.6g}"
            points_spec.append((a, ["--spec-synth-len", val], f"synth-len {val}"))
        else:
            r = geometric_rates(a, k)
            val = ",".join(f"{x:.6g}" for x in r)
            points_spec.append((a, ["--spec-synth-rates", val], f"synth-rates {val}"))
    n_req = (len(points_spec) + int(include_real)) * len(st.prompts) * len(seeds) * 2
    from ..measure.verify import _metrics_snapshot, _delta

    points: list[dict[str, Any]] = []
    real: dict[str, Any] | None = None
    with contextlib.ExitStack() as stack:
        try:
            van = stack.enter_context(LlamaServer(ServerConfig(**base)))
            props = van.props()
        except ServerError as e:
            raise TuneError(f"vanilla server: {e}") from e
        mode = modes_for_template(props.get("chat_template"))[0]
        bench = _Bench(st.prompts, seeds, mode, max_tokens, 1)
        bench.one(van, st.prompts[0], 0, WARMUP_TOKENS)
        bar = stack.enter_context(tqdm(total=n_req, desc="curve", unit="req", file=sys.stderr,
                                       disable=None if progress else True, leave=False, dynamic_ncols=True))
        pair = 0
        specs: list[tuple[float | None, list[str], str | None]] = list(points_spec)
        if include_real:
            specs.append((None, [], None))
        for a, args, label in specs:
            cfg = ServerConfig(**{**base, "extra_args": list(base["extra_args"]) + args}, draft_mtp=True,
                               draft_n_max=k)
            try:
                mtp = LlamaServer(cfg).start()
            except ServerError as e:
                raise TuneError(f"MTP server for {label or 'the real head'}: {e}") from e
            try:
                bench.one(mtp, st.prompts[0], 0, WARMUP_TOKENS)
                snap0 = _metrics_snapshot(mtp)
                units: list[list[float]] = []
                identical, n_pairs = 0, 0
                for pi, p in enumerate(st.prompts):
                    u = [0.0] * 6
                    for s0 in seeds:
                        # a distinct seed per request: the synthetic-acceptance RNG is seeded with it, so
                        # requests sharing a seed would accept at exactly the same steps
                        s = s0 * 1000 + pi
                        if pair % 2 == 0:
                            v = bench.one(van, p, s)
                            m = bench.one(mtp, p, s)
                        else:
                            m = bench.one(mtp, p, s)
                            v = bench.one(van, p, s)
                        pair += 1
                        bar.update(2)
                        u[0] += m.tokens; u[1] += m.ms; u[2] += v.tokens; u[3] += v.ms  # noqa: E702
                        u[4] += m.draft_n_accepted; u[5] += m.draft_n  # noqa: E702
                        identical += int(m.text == v.text)
                        n_pairs += 1
                    units.append(u)
                d = _delta(snap0, _metrics_snapshot(mtp))
                command = shlex.join(mtp.command)
            finally:
                mtp.stop()
            x = np.array(units)
            sp = stats.throughput_ratio(x[:, 0], x[:, 1], x[:, 2], x[:, 3], resamples=bootstrap_resamples)
            acc = stats.ratio_of_sums(x[:, 4], x[:, 5], resamples=bootstrap_resamples)
            tot = x.sum(axis=0)
            pt: dict[str, Any] = {
                "acceptance_set": a, "flag_value": label,
                "expected_tokens_per_step": (1.0 + k * a) if a is not None else None,
                "rates": geometric_rates(a, k) if a is not None else None,
                "acceptance": _num(acc.value), "acceptance_ci95": [_num(acc.lo), _num(acc.hi)],
                "draft_n": int(tot[5]), "draft_n_accepted": int(tot[4]), "n_drafts": d["drafts"],
                "tokens_per_step": _num(1 + d["accepted"] / d["drafts"]) if d["drafts"] else None,
                "per_position": [_num(c / d["drafts"]) for c in d["per_pos"]] if d["drafts"] else None,
                "mtp_tokens_per_second": _num(tot[0] / tot[1] * 1000) if tot[1] > 0 else None,
                "vanilla_tokens_per_second": _num(tot[2] / tot[3] * 1000) if tot[3] > 0 else None,
                "speedup": _num(sp.value), "speedup_ci95": [_num(sp.lo), _num(sp.hi)],
                "n_prompts": len(units), "n_pairs": n_pairs, "command": command,
            }
            if a is None:
                pt["acceptance_set"] = pt["acceptance"]
                pt["identical_output_fraction"] = identical / n_pairs if n_pairs else None
                real = pt
            else:
                points.append(pt)
        build_info = props.get("build_info")
    if real is not None and real.get("identical_output_fraction") not in (None, 1.0):
        notes.append(f"real head: only {real['identical_output_fraction'] * 100:.1f}% of replies identical to vanilla")
    return CurveResult(
        model={"path": str(path), "architecture": rep.architecture, "mtp_block": rep.mtp_block},
        draft_n_max=k, points=points, real=real, breakeven_acceptance=_breakeven(points),
        settings={"flag": flag, "seeds": seeds, "max_tokens": max_tokens, "n_prompts": len(st.prompts),
                  "suite": st.name, "mode": mode, "batch_size": 1,
                  "request_seed": "seed * 1000 + prompt index (distinct synthetic-acceptance RNG streams)", "gpu_layers": gpu_layers, "threads": threads,
                  "speedup": "decode throughput ratio (timings.predicted_ms), ABBA-interleaved with vanilla",
                  "acceptance_set": "target accepted/drafted at window k; --spec-synth-len = 1 + k * acceptance "
                                    "(geometric per-position rates p^i)"},
        hardware=hw, server={"binary": str(binary), "build_info": build_info}, notes=notes,
        seconds=time.monotonic() - t0)


# ----------------------------------------------------------------------------- receipt


def store_in_receipt(path: str | os.PathLike, model: str | os.PathLike | None = None,
                     **sections: dict[str, Any] | None) -> dict[str, Any]:
    """Add ``sections`` (e.g. ``tuned=...``, ``profiles=...``, ``acceptance_curve=...``) to the receipt's
    verification section, keeping every key verify wrote (``set_verification`` replaces the whole
    section, so it is loaded and merged first), re-seal and write it back. The receipt must already
    hold a verification (``ggufmtp verify MODEL --receipt R``). ``model``: refuse when its size differs
    from the verified model's."""
    from ..provenance.receipt import load_receipt, set_verification

    st = load_receipt(path)
    v = (st.get("predicate") or {}).get("verification")
    if not v:
        raise TuneError(f"{path}: the receipt has no verification section yet; run `ggufmtp verify MODEL "
                        f"--receipt {path}` first (tune, profiles and curve add to it)")
    if model is not None:
        want = (v.get("model") or {}).get("size_bytes")
        p = resolve_model(model)
        if want is not None and p.is_file() and p.stat().st_size != want:
            raise TuneError(f"{path}: its verification is of a {want}-byte model, not {p} ({p.stat().st_size} bytes)")
    old_tuned = v.get("tuned")
    if sections.get("tuned") and isinstance(old_tuned, dict) and old_tuned.get("kind") != "ggufmtp tune":
        sections["tuned"] = {**sections["tuned"], "verify_sweep": old_tuned}  # verify --sweep's, kept
    merged = dict(v)
    merged.update({k: val for k, val in sections.items() if val is not None})
    return set_verification(path, merged)


def load_tuned_config(path: str | os.PathLike) -> TuneConfig:
    """The recommended configuration in a receipt's ``verification.tuned`` or a ``tune --out`` JSON
    (the best measured one when tune recommended vanilla). Raises :class:`TuneError` naming the file."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except OSError as e:
        raise TuneError(f"{p}: cannot read: {e.strerror or e}") from e
    except json.JSONDecodeError as e:
        raise TuneError(f"{p}: not JSON ({e.msg} at line {e.lineno})") from e
    if not isinstance(data, dict):
        raise TuneError(f"{p}: expected a JSON object (a receipt or `ggufmtp tune --out` output)")
    t = ((data.get("predicate") or {}).get("verification") or {}).get("tuned") if "predicate" in data else data
    cfg = (t or {}).get("recommended_config") or (t or {}).get("best_config")
    if not isinstance(cfg, dict):
        raise TuneError(f"{p}: no tuned configuration (run `ggufmtp tune MODEL --receipt/--out {p.name}` first)")
    try:
        return TuneConfig.coerce(cfg)
    except TuneError as e:
        raise TuneError(f"{p}: {e}") from e
