"""The numbers of one verification: a request's measurements (:class:`Record`), the report of one
comparison (:func:`summarize`: acceptance and speedup with bootstrap CIs, per category, per seed,
per draft position, identical output), and what a draft-window sweep recommends
(:func:`recommend`, :func:`step_cost`).

Statistics (:mod:`ggufmtp.stats`): acceptance = sum(accepted) / sum(drafted); speedup = MTP
decode throughput / vanilla decode throughput; 95% percentile-bootstrap CIs resampling *prompts*
(a prompt's seeds pooled, arms paired).

Draft statistics as llama.cpp (#24536) and vLLM report them, from ``/metrics``: *mean acceptance
length* = 1 + accepted / verification steps (the tokens one target pass yields; also kept as
``tokens_per_step``) and *acceptance by position* = accepted at draft position i / verification
steps (a survival curve: non-increasing in i; also kept as ``per_position``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ... import stats
from ...errors import VerifyError
from ...fmt import finite_or_none as _num
from ..core.records import first_difference

if TYPE_CHECKING:
    from ...runtime.replies import Reply
    from ..core.suite import Prompt

__all__ = ["Record", "PairStats", "OutputMismatch", "Comparison", "ServingProfile", "StepCost", "StepCostPoint",
           "SweepRecommendation", "SweepAdvice", "summarize", "recommend", "step_cost", "format_step_cost",
           "BALANCED_TOLERANCE", "MAX_LISTED_MISMATCHES"]

BALANCED_TOLERANCE = 0.05
MAX_LISTED_MISMATCHES = 64



@dataclass
class Record:
    """One request's measurements."""

    arm: str  # "vanilla" | "mtp"
    k: int  # the MTP window of the comparison this request belongs to (vanilla requests too)
    endpoint: str  # "chat" (/v1/chat/completions) | "raw" (/completion)
    mode: str  # "default" | "thinking" | "no-thinking"
    prompt_id: str
    category: str
    seed: int
    order: int  # position in the overall request sequence
    predicted_n: int
    predicted_ms: float
    prompt_n: int | None
    draft_n: int | None
    draft_n_accepted: int | None
    text: str
    finish_reason: str | None = None
    n_drafts: int | None = None  # draft rounds (verification steps), from /metrics
    accepted_per_pos: list[int] | None = None  # from /metrics

    @property
    def tokens_per_second(self) -> float:
        """Decode throughput; NaN (None in the JSON) for a request that decoded nothing (:func:`~ggufmtp.stats.decoded`)."""
        n, ms = stats.decoded(self.predicted_n, self.predicted_ms)
        return n / ms * 1000.0 if ms > 0 else float("nan")

    @classmethod
    def of(cls, reply: Reply, *, arm: str, k: int, endpoint: str, mode: str, prompt: Prompt, seed: int,
           order: int) -> Record:
        """The record of ``reply`` (its timings, draft counts, text and finish reason), the answer
        to ``prompt`` with ``seed`` on ``arm``."""
        return cls(arm=arm, k=k, endpoint=endpoint, mode=mode, prompt_id=prompt.id, category=prompt.category,
                   seed=seed, order=order, predicted_n=reply.predicted_n, predicted_ms=reply.predicted_ms,
                   prompt_n=reply.prompt_n, draft_n=reply.draft_n, draft_n_accepted=reply.draft_n_accepted,
                   text=reply.text, finish_reason=reply.finish_reason)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["tokens_per_second"] = _num(self.tokens_per_second)
        return d




def _pairs(records: Sequence[Record], baseline: str = "vanilla") -> list[tuple[Record, Record]]:
    """(vanilla, mtp) pairs of one comparison, keyed by (prompt, seed); ``baseline``: the arm the
    MTP requests are paired with ("vanilla", or "vanilla-default" for the default vanilla arm)."""
    van = {(r.prompt_id, r.seed): r for r in records if r.arm == baseline}
    out = []
    for r in records:
        if r.arm == "mtp" and (r.prompt_id, r.seed) in van:
            out.append((van[(r.prompt_id, r.seed)], r))
    return out


@dataclass(frozen=True)
class PairStats:
    """Acceptance and speedup of a set of (vanilla, MTP) pairs, with 95% bootstrap CIs over prompts."""

    acceptance: float | None
    acceptance_ci95: list[float | None]
    draft_n: int
    draft_n_accepted: int
    mtp_tokens_per_second: float | None
    vanilla_tokens_per_second: float | None
    speedup: float | None
    speedup_ci95: list[float | None]
    n_prompts: int
    n_pairs: int

    @property
    def tokens_per_second(self) -> float | None:
        """The MTP arm's decode throughput (an alias kept in the JSON)."""
        return self.mtp_tokens_per_second

    def to_dict(self) -> dict[str, Any]:
        return {"acceptance": self.acceptance, "acceptance_ci95": list(self.acceptance_ci95),
                "draft_n": self.draft_n, "draft_n_accepted": self.draft_n_accepted,
                "mtp_tokens_per_second": self.mtp_tokens_per_second, "tokens_per_second": self.tokens_per_second,
                "vanilla_tokens_per_second": self.vanilla_tokens_per_second, "speedup": self.speedup,
                "speedup_ci95": list(self.speedup_ci95), "n_prompts": self.n_prompts, "n_pairs": self.n_pairs}


@dataclass(frozen=True)
class OutputMismatch:
    """An MTP reply that differs from the vanilla reply to the same request: where, and the text around it."""

    prompt_id: str
    seed: int
    mode: str
    endpoint: str
    k: int
    first_difference_at: int
    vanilla: str
    mtp: str
    vanilla_tokens: int
    mtp_tokens: int
    # from the vanilla server (measure.verify.divergence): the divergence's token index, vanilla's
    # top-2 margin there (nats), whether vanilla's own one-batch evaluation flips it, and whether the
    # margin is within the run's numerics drift (None: not analysed)
    token_index: int | None = None
    margin_nats: float | None = None
    batched_flip: bool | None = None
    # the tokens there (texts; "" is an end-of-generation token): vanilla's, the MTP reply's,
    # vanilla's runner-up and vanilla's one-batch argmax; and their ids, as the servers generated and
    # listed them, which the rule judges (provenance.verdict.numerics_failure)
    vanilla_token: str | None = None
    mtp_token: str | None = None
    runner_up_token: str | None = None
    batched_token: str | None = None
    vanilla_token_id: int | None = None
    mtp_token_id: int | None = None
    runner_up_token_id: int | None = None
    batched_token_id: int | None = None
    explained: bool | None = None
    unexplained_why: str | None = None

    @classmethod
    def of(cls, v: Record, m: Record) -> OutputMismatch:
        i, a, b = first_difference(v.text, m.text)
        return cls(m.prompt_id, m.seed, m.mode, m.endpoint, m.k, i, a, b, v.predicted_n, m.predicted_n)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Comparison(PairStats):
    """The report of ONE comparison (window ``k``, ``endpoint``, ``mode``): its :class:`PairStats`,
    the same per category and per seed, draft statistics from ``/metrics`` (None when a request's
    deltas were not usable), per-position acceptance, and identical output."""

    k: int
    endpoint: str
    mode: str
    per_category: dict[str, PairStats] = field(default_factory=dict)
    per_seed: dict[str, PairStats] = field(default_factory=dict)
    requests_without_drafts: int = 0
    n_drafts: int | None = None
    mean_accepted_per_draft: float | None = None
    tokens_per_step: float | None = None
    per_position: list[float | None] | None = None
    identical_output_fraction: float | None = None
    identical: int = 0  # pairs whose replies are identical
    mismatch_count: int = 0
    mismatches: list[OutputMismatch] = field(default_factory=list)  # the first MAX_LISTED_MISMATCHES
    identical_prompts: int = 0  # prompts whose replies (every seed) are all identical
    identical_prompts_fraction: float | None = None
    mean_acceptance_length: float | None = None  # 1 + accepted / verification steps (= tokens_per_step)
    acceptance_by_position: list[float | None] | None = None  # accepted at i / verification steps (= per_position)
    has_default_vanilla: bool = False  # a default-configured vanilla arm ran (then the three below are set)
    default_vanilla_tokens_per_second: float | None = None
    speedup_vs_default_vanilla: float | None = None
    speedup_vs_default_vanilla_ci95: list[float | None] = field(default_factory=lambda: [None, None])

    @property
    def identical_outputs(self) -> dict[str, int]:
        return {"identical": self.identical, "pairs": self.n_pairs}

    def default_vanilla_dict(self) -> dict[str, Any]:
        """The default vanilla arm's keys (empty when that arm did not run: the keys are absent)."""
        if not self.has_default_vanilla:
            return {}
        return {"speedup_vs_default_vanilla": self.speedup_vs_default_vanilla,
                "speedup_vs_default_vanilla_ci95": list(self.speedup_vs_default_vanilla_ci95),
                "default_vanilla_tokens_per_second": self.default_vanilla_tokens_per_second}

    def to_dict(self) -> dict[str, Any]:
        return {"k": self.k, "endpoint": self.endpoint, "mode": self.mode, **PairStats.to_dict(self),
                "per_category": {c: r.to_dict() for c, r in self.per_category.items()},
                "per_seed": {s: r.to_dict() for s, r in self.per_seed.items()},
                "requests_without_drafts": self.requests_without_drafts, "n_drafts": self.n_drafts,
                "mean_accepted_per_draft": self.mean_accepted_per_draft, "tokens_per_step": self.tokens_per_step,
                "per_position": self.per_position, "identical_output_fraction": self.identical_output_fraction,
                "identical_outputs": self.identical_outputs, "mismatch_count": self.mismatch_count,
                "mismatches": [m.to_dict() for m in self.mismatches], "identical_prompts": self.identical_prompts,
                "identical_prompts_fraction": self.identical_prompts_fraction,
                "mean_acceptance_length": self.mean_acceptance_length,
                "acceptance_by_position": self.acceptance_by_position, **self.default_vanilla_dict()}


def _units(pairs: Sequence[tuple[Record, Record]]) -> dict[str, list[float]]:
    """Per prompt (seeds pooled): [accepted, drafted, MTP tokens, MTP ms, vanilla tokens, vanilla ms]
    (the tokens and ms of the requests that decoded: :func:`~ggufmtp.stats.decoded`)."""
    units: dict[str, list[float]] = {}
    for v, m in pairs:
        u = units.setdefault(m.prompt_id, [0.0] * 6)
        u[0] += m.draft_n_accepted or 0
        u[1] += m.draft_n or 0
        for i, (n, ms) in ((2, stats.decoded(m.predicted_n, m.predicted_ms)),
                           (4, stats.decoded(v.predicted_n, v.predicted_ms))):
            u[i] += n
            u[i + 1] += ms
    return units


def _row(pairs: Sequence[tuple[Record, Record]], boot: dict[str, Any]) -> PairStats:
    """Acceptance and speedup with bootstrap CIs over prompts (seeds pooled per prompt)."""
    units = _units(pairs)
    if not units:
        raise VerifyError("no vanilla/MTP request pairs to summarize")
    x = np.array(list(units.values()))
    acc = stats.ratio_of_sums(x[:, 0], x[:, 1], **boot)
    sp = stats.throughput_ratio(x[:, 2], x[:, 3], x[:, 4], x[:, 5], **boot)
    tot = x.sum(axis=0)
    return PairStats(
        acceptance=_num(acc.value), acceptance_ci95=[_num(acc.lo), _num(acc.hi)],
        draft_n=int(tot[1]), draft_n_accepted=int(tot[0]),
        mtp_tokens_per_second=_num(tot[2] / tot[3] * 1000) if tot[3] > 0 else None,
        vanilla_tokens_per_second=_num(tot[4] / tot[5] * 1000) if tot[5] > 0 else None,
        speedup=_num(sp.value), speedup_ci95=[_num(sp.lo), _num(sp.hi)], n_prompts=len(units), n_pairs=len(pairs))


def _draft_stats(mtp: Sequence[Record], accepted: int) -> dict[str, Any]:
    """Draft rounds, mean accepted per round, tokens per step and per-position acceptance (from the
    /metrics deltas; all None unless every request has them)."""
    if not all(m.n_drafts is not None for m in mtp):
        return {}
    n_drafts = sum(m.n_drafts or 0 for m in mtp)
    out: dict[str, Any] = {"n_drafts": n_drafts,
                           "mean_accepted_per_draft": _num(accepted / n_drafts) if n_drafts else None,
                           "tokens_per_step": _num(1 + accepted / n_drafts) if n_drafts else None}
    out["mean_acceptance_length"] = out["tokens_per_step"]
    if all(m.accepted_per_pos is not None for m in mtp) and n_drafts:
        width = max(len(m.accepted_per_pos or []) for m in mtp)
        acc = np.zeros(width)
        for m in mtp:
            acc[: len(m.accepted_per_pos or [])] += np.array(m.accepted_per_pos or [], dtype=float)
        out["per_position"] = out["acceptance_by_position"] = [_num(a / n_drafts) for a in acc]
    return out


def _identity(pairs: Sequence[tuple[Record, Record]]) -> dict[str, Any]:
    """Identical output over the pairs (requests) and over the distinct prompts (a prompt counts
    as identical when the replies under every seed are)."""
    same = [v.text == m.text for v, m in pairs]
    mism = [OutputMismatch.of(v, m) for (v, m), s in zip(pairs, same) if not s]
    by_prompt: dict[str, bool] = {}
    for (_, m), s in zip(pairs, same):
        by_prompt[m.prompt_id] = by_prompt.get(m.prompt_id, True) and s
    return dict(identical_output_fraction=_num(sum(same) / len(same)), identical=int(sum(same)),
                mismatch_count=len(mism), mismatches=mism[:MAX_LISTED_MISMATCHES],
                identical_prompts=sum(by_prompt.values()),
                identical_prompts_fraction=_num(sum(by_prompt.values()) / len(by_prompt)))


def _against_default(records: Sequence[Record], boot: dict[str, Any]) -> dict[str, Any]:
    """MTP against the default vanilla arm (nothing when that arm did not run)."""
    pairs = _pairs(records, "vanilla-default")
    if not pairs:
        return {}
    row = _row(pairs, boot)
    return dict(has_default_vanilla=True, default_vanilla_tokens_per_second=row.vanilla_tokens_per_second,
                speedup_vs_default_vanilla=row.speedup, speedup_vs_default_vanilla_ci95=list(row.speedup_ci95))


def summarize(records: Sequence[Record], categories: Sequence[str] | None = None,
              resamples: int = stats.DEFAULT_RESAMPLES, boot_seed: int = stats.DEFAULT_SEED) -> Comparison:
    """The report of ONE comparison (one k, endpoint and mode): overall, per category, per seed,
    draft statistics, per-position acceptance, identical output."""
    boot = {"resamples": resamples, "seed": boot_seed}
    pairs = _pairs(records)
    if not pairs:
        raise VerifyError("no vanilla/MTP request pairs to summarize")
    m0 = pairs[0][1]
    overall = _row(pairs, boot)
    cats = list(categories) if categories else sorted({m.category for _, m in pairs})
    per_category = {c: _row([p for p in pairs if p[1].category == c], boot)
                    for c in cats if any(p[1].category == c for p in pairs)}
    per_seed = {str(s): _row([p for p in pairs if p[1].seed == s], boot) for s in sorted({m.seed for _, m in pairs})}
    mtp = [m for _, m in pairs]
    return Comparison(
        **dataclasses.asdict(overall), k=m0.k, endpoint=m0.endpoint, mode=m0.mode, per_category=per_category,
        per_seed=per_seed, requests_without_drafts=sum(1 for m in mtp if not m.draft_n),
        **_draft_stats(mtp, overall.draft_n_accepted), **_identity(pairs), **_against_default(records, boot))


@dataclass(frozen=True)
class ServingProfile:
    """One serving profile of a sweep's recommendation (low latency, balanced, MTP off)."""

    profile: str
    k: int | None
    recommended: bool
    use: str
    acceptance: float | None
    speedup: float | None
    speedup_ci95: list[float | None] | None
    flags: str

    @classmethod
    def of(cls, name: str, r: Comparison | None, use: str, recommended: bool) -> ServingProfile:
        """The profile that runs window ``r.k`` (None: MTP off)."""
        if r is None:
            return cls(name, None, recommended, use, None, 1.0, None, "(no --spec-type)")
        return cls(name, r.k, recommended, use, r.acceptance, r.speedup, r.speedup_ci95,
                   f"--spec-type draft-mtp --spec-draft-n-max {r.k}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class StepCostPoint:
    k: int
    ms_per_step: float | None


@dataclass(frozen=True)
class StepCost:
    """ms per verification step fitted as ``fixed_ms + per_position_ms * k`` (see :func:`step_cost`)."""

    fixed_ms: float | None
    per_position_ms: float | None
    vanilla_ms_per_token: float | None
    per_position_in_vanilla_tokens: float | None
    points: list[StepCostPoint]
    model: str = "ms per verification step = fixed_ms + per_position_ms * k (least squares over the windows)"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class SweepRecommendation:
    """What a draft-window sweep recommends for one mode (see :func:`recommend`); ``step_cost`` is
    :func:`step_cost` of the same rows once verify adds it."""

    recommended_k: int | None
    best_k: int
    best_speedup: float | None
    best_speedup_ci95: list[float | None] | None
    clear: bool
    within_noise_of: list[int]
    mtp_beats_vanilla: bool
    balanced_k: int
    rule: str
    profiles: list[ServingProfile]
    notes: list[str]
    step_cost: StepCost | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class SweepAdvice:
    """verify's ``tuned`` section after a sweep: the recommendation of every mode, the first mode's
    on top with the llama-server command line to paste."""

    mode: str
    command: str
    by_mode: dict[str, SweepRecommendation]

    @property
    def top(self) -> SweepRecommendation:
        return self.by_mode[self.mode]

    def to_dict(self) -> dict[str, Any]:
        return {**self.top.to_dict(), "command": self.command, "mode": self.mode,
                "by_mode": {m: r.to_dict() for m, r in self.by_mode.items()}}


def _lossless(r: Comparison) -> bool:
    """Whether every MTP reply of the row equals vanilla's."""
    return r.identical_output_fraction == 1.0 and not r.mismatch_count


def _ci(r: Comparison) -> list[float | None]:
    return list(r.speedup_ci95 or [None, None])


def recommend(rows: Sequence[Comparison], min_identical: float = 1.0,
              tolerance: float = BALANCED_TOLERANCE) -> SweepRecommendation:
    """Recommended draft window and profiles from a sweep's rows (one mode, chat arm).

    Each row needs ``k``, ``speedup``, ``speedup_ci95``, ``acceptance``, ``identical_output_fraction``
    and ``mismatch_count``. Only windows without a single mismatch are eligible, whatever
    ``min_identical`` allows the verdict (a window that changes the output is never recommended);
    when none is, MTP off is advised. See the module docstring for the rules."""
    if not rows:
        raise ValueError("no sweep rows")
    eligible = [r for r in rows if _lossless(r)]
    notes = []
    if not eligible:
        eligible = list(rows)
        notes.append("every window gave replies that differ from vanilla: none is recommended (MTP off)")
    ranked = sorted(eligible, key=lambda r: (-(r.speedup or 0.0), r.k))
    best = ranked[0]
    others = [r for r in eligible if r is not best]
    lo = _ci(best)[0]
    clear = bool(others) and lo is not None and all(_ci(r)[1] is not None and lo > _ci(r)[1] for r in others)
    beats_vanilla = lo is not None and lo > 1.0 and _lossless(best)
    within = [r for r in eligible if (r.speedup or 0) >= (1 - tolerance) * (best.speedup or 0)]
    balanced = min(within, key=lambda r: r.k)
    near = [r.k for r in others if _ci(r)[1] is not None and lo is not None and _ci(r)[1] >= lo]
    profiles = [
        ServingProfile.of("low latency", best,
                          "batch size 1: single-user chat, coding agents (the highest measured speedup)", beats_vanilla),
        ServingProfile.of("balanced", balanced, f"a few concurrent requests: the smallest window within "
                          f"{tolerance:.0%} of the best speedup, so fewer rejected draft tokens are verified per step",
                          beats_vanilla),
        ServingProfile.of("MTP off", None,
                          "no window beats vanilla here (every speedup CI lower bound <= 1.0): run without speculation"
                          if not beats_vanilla else
                          "saturated servers where verification cost dominates (not measured: verify runs batch size 1)",
                          not beats_vanilla),
    ]
    return SweepRecommendation(
        recommended_k=best.k if beats_vanilla else None, best_k=best.k, best_speedup=best.speedup,
        best_speedup_ci95=best.speedup_ci95, clear=clear, within_noise_of=near, mtp_beats_vanilla=beats_vanilla,
        balanced_k=balanced.k,
        rule=("best k = highest speedup point estimate among windows without a mismatch (ties: smaller k); "
              "'clear' when its CI lower bound exceeds every other window's CI upper bound; balanced = smallest k "
              f"within {tolerance:.0%} of the best speedup; MTP off when no window's speedup CI lower bound > 1.0"),
        profiles=profiles, notes=notes)


def step_cost(rows: Sequence[Comparison]) -> StepCost | None:
    """What a speculative step costs on this machine, from a sweep's rows (one mode): ms per
    verification step (tokens per step / MTP tok/s) fitted by least squares as ``fixed_ms +
    per_position_ms * k``, beside vanilla's ms per token. ``per_position_ms`` is what one more draft
    position costs (its draft pass plus one more token to verify): the figure a faster drafter or
    runtime has to cut. None unless at least two windows drafted."""
    pts = [(int(r.k), 1000.0 * r.tokens_per_step / r.mtp_tokens_per_second) for r in rows
           if r.tokens_per_step and r.mtp_tokens_per_second]
    if len({k for k, _ in pts}) < 2:
        return None
    per_position, fixed = np.polyfit([k for k, _ in pts], [m for _, m in pts], 1)
    van = [1000.0 / r.vanilla_tokens_per_second for r in rows if r.vanilla_tokens_per_second]
    van_ms = float(np.mean(van)) if van else None
    return StepCost(fixed_ms=_num(fixed), per_position_ms=_num(per_position), vanilla_ms_per_token=_num(van_ms),
                    per_position_in_vanilla_tokens=_num(per_position / van_ms) if van_ms else None,
                    points=[StepCostPoint(k, _num(m)) for k, m in pts])


def format_step_cost(sc: StepCost | None) -> str | None:
    if not sc or sc.fixed_ms is None or sc.per_position_ms is None:
        return None
    steps = ", ".join(f"k={p.k:d} {p.ms_per_step:.2f} ms" for p in sc.points)
    line = (f"step cost: {sc.fixed_ms:.2f} ms + {sc.per_position_ms:.2f} ms per draft position "
            f"({steps} per verification step)")
    if sc.vanilla_ms_per_token:
        line += (f"; a vanilla token {sc.vanilla_ms_per_token:.2f} ms, so a draft position costs "
                 f"{sc.per_position_in_vanilla_tokens:.2f} of one")
    return line
