"""The workloads of ``ggufmtp profiles`` (A-D, the vLLM write-up's serving profiles), one arm's
result on one (:class:`ProfileResult`), and the decision table comparing the arms.

Decision table
--------------
Per workload (see :func:`decision_table`): MTP helps = "no" unless its output tok/s beats vanilla
by more than ``noise`` (default 2%); then "yes", or "mixed" when the mean TPOT (each request's
decode time per token: the speed a user sees) is worse by more than ``noise`` -- more throughput,
slower streams, as in the H200's workload D (+3.2% throughput, +14% TPOT). Every row lists the
throughput, TTFT, TPOT and ITL deltas (mean and P99), so tail regressions are visible too. One run per
arm is not a confidence interval: the 2% band is a stated threshold, use ``repeats`` (arms
alternated, requests pooled) on noisy machines.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import ProfileError
from ...fmt import num, pct, rel_change, signed_pct
from .stream import RequestRecord, ServingMetrics

__all__ = ["DEFAULT_NOISE", "Workload", "WORKLOADS", "get_workload", "ProfileSpec", "ArmSettings", "ProfileResult", "MtpHelps",
           "DecisionRow", "decision_table", "format_profiles", "format_decision_table"]

DEFAULT_NOISE = 0.02
MIN_INPUT, MIN_OUTPUT = 16, 8


@dataclass(frozen=True)
class Workload:
    name: str
    title: str
    input_tokens: int
    output_tokens: int
    concurrency: int
    num_requests: int

    @property
    def shape(self) -> str:
        return f"{self.input_tokens} in, {self.output_tokens} out, {self.concurrency} concurrent"

    def scaled(self, scale: float = 1.0, num_requests: int | None = None) -> Workload:
        if scale <= 0:
            raise ProfileError(f"scale {scale}: must be > 0")
        n = self.num_requests if num_requests is None else int(num_requests)
        if n < 1:
            raise ProfileError(f"num_requests {n}: must be at least 1")
        return dataclasses.replace(self, input_tokens=max(MIN_INPUT, round(self.input_tokens * scale)),
                                   output_tokens=max(MIN_OUTPUT, round(self.output_tokens * scale)), num_requests=n)


WORKLOADS: dict[str, Workload] = {
    "A": Workload("A", "single decode", 512, 512, 1, 16),
    "B": Workload("B", "prefill-bound", 8192, 256, 4, 16),
    "C": Workload("C", "contention", 2048, 512, 16, 64),
    "D": Workload("D", "chat", 2048, 256, 2, 16),
}


def get_workload(w: str | Workload) -> Workload:
    if isinstance(w, Workload):
        return w
    key = str(w).strip().upper()
    if key not in WORKLOADS:
        raise ProfileError(f"workload {w!r}: one of {', '.join(WORKLOADS)}")
    return WORKLOADS[key]



# ----------------------------------------------------------------------------- one arm's result


@dataclass(frozen=True)
class ProfileSpec:
    """The MTP arm's speculative counters over a run (``/metrics`` deltas); ``per_position`` (accepted
    per draft round at each position) is None when runs were pooled or nothing was drafted."""

    draft_tokens: int
    accepted: int
    n_drafts: int
    per_position: list[float] | None = None

    @property
    def tokens_per_step(self) -> float | None:
        return 1 + self.accepted / self.n_drafts if self.n_drafts else None

    def to_dict(self) -> dict[str, Any]:
        return {"draft_tokens": self.draft_tokens, "accepted": self.accepted, "n_drafts": self.n_drafts,
                "tokens_per_step": self.tokens_per_step, "per_position": self.per_position}


@dataclass(frozen=True)
class ArmSettings:
    """How one arm of one workload ran (the ``settings`` object of its JSON)."""

    mode: str
    seed: int
    prompt_tokens_target: int
    prompt_tokens_built: list[int | None]
    ignore_eos: bool
    temperature: float
    cache_prompt: bool
    warmup_requests: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class ProfileResult:
    """One arm ("vanilla" or "mtp") of one workload: its serving metrics (:func:`aggregate`'s
    object), requests, command line and settings."""

    workload: Workload
    arm: str  # "vanilla" | "mtp"
    metrics: ServingMetrics
    requests: list[RequestRecord]
    command: str
    settings: ArmSettings
    spec: ProfileSpec | None = None  # /metrics deltas (MTP arm)
    notes: list[str] = field(default_factory=list)

    def to_dict(self, requests: bool = False) -> dict[str, Any]:
        d = {"workload": dataclasses.asdict(self.workload), "arm": self.arm, "metrics": self.metrics.to_dict(),
             "command": self.command, "settings": self.settings.to_dict(), "spec": self.spec.to_dict() if self.spec else None,
             "notes": list(self.notes)}
        if requests:
            d["requests"] = [r.to_dict() for r in self.requests]
        return d


# ----------------------------------------------------------------------------- decision table


class MtpHelps(enum.StrEnum):
    """Whether MTP helps a workload (see :func:`decision_table`)."""

    YES = "yes"
    MIXED = "mixed"  # more throughput, but each request decodes slower
    NO = "no"


@dataclass
class DecisionRow:
    """One workload of the decision table; ``deltas`` are MTP relative to vanilla (``throughput``,
    ``ttft_mean``, ``ttft_p99``, ``tpot_mean``, ``tpot_p99``, ``itl_mean``, ``itl_p99``)."""

    workload: str
    title: str
    shape: str
    input_tokens: int
    output_tokens: int
    concurrency: int
    num_requests: int
    vanilla_tokens_per_second: float | None
    mtp_tokens_per_second: float | None
    acceptance: float | None
    deltas: dict[str, float | None]
    mtp_helps: MtpHelps
    within_noise: bool
    reasoning: str
    identical_output_fraction: float | None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["mtp_helps"] = self.mtp_helps.value
        return d


def _by_workload(results: Sequence[ProfileResult]) -> dict[str, dict[str, ProfileResult]]:
    by: dict[str, dict[str, ProfileResult]] = {}
    for r in results:
        by.setdefault(r.workload.name, {})[r.arm] = r
    return by


def decision_table(results: Sequence[ProfileResult], noise: float = DEFAULT_NOISE) -> list[DecisionRow]:
    """One row per workload that has both arms: whether MTP helps and why, with the deltas (MTP
    relative to vanilla) of output tok/s and of mean/P99 TTFT, TPOT, ITL.

    Rule: "no" unless output tok/s improves by more than ``noise``; then "mixed" if the mean TPOT
    is worse by more than ``noise`` (throughput bought with slower per-request decoding), else
    "yes". ``within_noise`` marks |throughput delta| <= ``noise``. P99 regressions over 10% are
    listed in the reasoning either way."""
    return [_decision_row(arms["vanilla"], arms["mtp"], noise) for arms in _by_workload(results).values()
            if "vanilla" in arms and "mtp" in arms]


def _decision_row(van: ProfileResult, mtp: ProfileResult, noise: float) -> DecisionRow:
    v, m, w = van.metrics, mtp.metrics, mtp.workload
    d = {"throughput": rel_change(m.output_tokens_per_second, v.output_tokens_per_second)}
    for met in ("ttft_ms", "tpot_ms", "itl_ms"):
        for stat in ("mean", "p99"):
            d[f"{met[:-3]}_{stat}"] = rel_change(m.value(met, stat), v.value(met, stat))
    tp, tpot = d["throughput"], d["tpot_mean"]
    helps = tp is not None and tp > noise
    slower_streams = helps and tpot is not None and tpot > noise
    within = tp is not None and abs(tp) <= noise
    why = [f"{signed_pct(tp)} throughput"]
    for key, label in (("ttft_mean", "TTFT"), ("tpot_mean", "TPOT"), ("itl_mean", "ITL")):
        why.append(f"{signed_pct(d[key])} {label} (P99 {signed_pct(d[key.replace('mean', 'p99')])})")
    regress = [lab for key, lab in (("tpot_p99", "P99 TPOT"), ("itl_p99", "P99 ITL"), ("ttft_p99", "P99 TTFT"))
               if d[key] is not None and d[key] > 0.10]
    reasoning = ", ".join(why)
    if within:
        reasoning += f"; throughput within the ±{noise:.0%} noise band"
    if slower_streams:
        reasoning += f"; mixed: more throughput but each request decodes slower (TPOT {signed_pct(tpot)})"
    if regress:
        reasoning += f"; tail regression: {', '.join(regress)}"
    same = [a.text == b.text for a, b in zip(van.requests, mtp.requests) if a.error is None and b.error is None]
    return DecisionRow(
        workload=w.name, title=w.title, shape=w.shape, input_tokens=w.input_tokens, output_tokens=w.output_tokens,
        concurrency=w.concurrency, num_requests=w.num_requests,
        vanilla_tokens_per_second=v.output_tokens_per_second, mtp_tokens_per_second=m.output_tokens_per_second,
        acceptance=m.acceptance, deltas=d,
        mtp_helps=MtpHelps.MIXED if slower_streams else MtpHelps.YES if helps else MtpHelps.NO,
        within_noise=within, reasoning=reasoning, identical_output_fraction=(sum(same) / len(same)) if same else None)


# ----------------------------------------------------------------------------- text


_METRIC_ROWS = ([("output tok/s", "output_tokens_per_second", None), ("request/s", "request_throughput", None),
                 ("prompt tokens (mean)", "mean_prompt_tokens", None)]
                + [(f"{lab} {stat} (ms)", met, stat)
                   for met, lab in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2e_ms", "E2E"))
                   for stat in ("mean", "median", "p99")])


def _metric(res: ProfileResult | None, key: str, stat: str | None) -> float | None:
    if res is None:
        return None
    return res.metrics.value(key, stat)


def format_profiles(results: Sequence[ProfileResult], table: Sequence[DecisionRow] | None = None,
                    scale: float = 1.0) -> str:
    """Per workload, both arms' metrics side by side with the delta; then the decision table."""
    L: list[str] = []
    for name, arms in _by_workload(results).items():
        w = next(iter(arms.values())).workload
        L.append(f"workload {name}: {w.title} ({w.shape}; {w.num_requests} requests"
                 + (f"; scale {scale:g}" if scale != 1.0 else "") + ")")
        L.append(f"  {'metric':<22} {'vanilla':>12} {'MTP':>12} {'delta':>9}")
        v, m = arms.get("vanilla"), arms.get("mtp")
        for lab, key, stat in _METRIC_ROWS:
            a, b = _metric(v, key, stat), _metric(m, key, stat)
            L.append(f"  {lab:<22} {num(a):>12} {num(b):>12} {signed_pct(rel_change(b, a)):>9}")
        if m is not None:
            tps = m.spec.tokens_per_step if m.spec else None
            L.append(f"  {'acceptance':<22} {'':>12} {pct(m.metrics.acceptance, space=False):>12}"
                     + (f"   ({tps:.2f} tokens per step)" if tps else ""))
        for res in arms.values():
            L += [f"  note ({res.arm}): {n}" for n in res.notes]
        L.append("")
    if table:
        L.append(format_decision_table(table))
    return "\n".join(L)


def format_decision_table(table: Sequence[DecisionRow]) -> str:
    """The decision table: workload, whether MTP helps, and the reasoning."""
    L = [f"{'workload':<28} {'MTP?':<5} reasoning"]
    for r in table:
        L.append(f"{r.workload + ' ' + r.title + ' (' + str(r.concurrency) + ')':<28} "
                 f"{r.mtp_helps.value:<5} {r.reasoning}")
    return "\n".join(L)
