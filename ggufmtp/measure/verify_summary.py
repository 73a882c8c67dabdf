"""The numbers of one verification: a request's measurements (:class:`Record`), the report of one
comparison (:func:`summarize`: acceptance and speedup with bootstrap CIs, per category, per seed,
per draft position, identical output), and what a draft-window sweep recommends
(:func:`recommend`, :func:`step_cost`).

Statistics (:mod:`ggufmtp.measure.stats`): acceptance = sum(accepted) / sum(drafted); speedup = MTP
decode throughput / vanilla decode throughput; 95% percentile-bootstrap CIs resampling *prompts*
(a prompt's seeds pooled, arms paired).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..errors import VerifyError
from ..fmt import finite_or_none as _num
from ..measure import stats

__all__ = ["Record", "summarize", "recommend", "step_cost", "format_step_cost", "BALANCED_TOLERANCE",
           "MAX_LISTED_MISMATCHES"]

BALANCED_TOLERANCE = 0.05
MAX_LISTED_MISMATCHES = 20



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
        return self.predicted_n / self.predicted_ms * 1000.0 if self.predicted_ms > 0 else float("nan")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["tokens_per_second"] = _num(self.tokens_per_second)
        return d




def _pairs(records: Sequence[Record]) -> list[tuple[Record, Record]]:
    """(vanilla, mtp) pairs of one comparison, keyed by (prompt, seed)."""
    van = {(r.prompt_id, r.seed): r for r in records if r.arm == "vanilla"}
    out = []
    for r in records:
        if r.arm == "mtp" and (r.prompt_id, r.seed) in van:
            out.append((van[(r.prompt_id, r.seed)], r))
    return out


def _row(pairs: Sequence[tuple[Record, Record]], boot: dict[str, Any]) -> dict[str, Any]:
    """Acceptance and speedup with bootstrap CIs over prompts (seeds pooled per prompt)."""
    units: dict[str, list[float]] = {}
    for v, m in pairs:
        u = units.setdefault(m.prompt_id, [0.0] * 6)
        u[0] += m.draft_n_accepted or 0
        u[1] += m.draft_n or 0
        u[2] += m.predicted_n
        u[3] += m.predicted_ms
        u[4] += v.predicted_n
        u[5] += v.predicted_ms
    if not units:
        return {"n_prompts": 0, "n_pairs": 0}
    x = np.array(list(units.values()))
    acc = stats.ratio_of_sums(x[:, 0], x[:, 1], **boot)
    sp = stats.throughput_ratio(x[:, 2], x[:, 3], x[:, 4], x[:, 5], **boot)
    tot = x.sum(axis=0)
    return {
        "acceptance": _num(acc.value),
        "acceptance_ci95": [_num(acc.lo), _num(acc.hi)],
        "draft_n": int(tot[1]),
        "draft_n_accepted": int(tot[0]),
        "mtp_tokens_per_second": _num(tot[2] / tot[3] * 1000) if tot[3] > 0 else None,
        "tokens_per_second": _num(tot[2] / tot[3] * 1000) if tot[3] > 0 else None,  # alias: the MTP arm's
        "vanilla_tokens_per_second": _num(tot[4] / tot[5] * 1000) if tot[5] > 0 else None,
        "speedup": _num(sp.value),
        "speedup_ci95": [_num(sp.lo), _num(sp.hi)],
        "n_prompts": len(units),
        "n_pairs": len(pairs),
    }


def _mismatch(v: Record, m: Record) -> dict[str, Any]:
    a, b = v.text, m.text
    i = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))
    lo = max(0, i - 30)
    return {"prompt_id": m.prompt_id, "seed": m.seed, "mode": m.mode, "endpoint": m.endpoint, "k": m.k,
            "first_difference_at": i, "vanilla": a[lo:i + 50], "mtp": b[lo:i + 50],
            "vanilla_tokens": v.predicted_n, "mtp_tokens": m.predicted_n}


def summarize(records: Sequence[Record], categories: Sequence[str] | None = None,
              resamples: int = stats.DEFAULT_RESAMPLES, boot_seed: int = stats.DEFAULT_SEED) -> dict[str, Any]:
    """The report of ONE comparison (one k, endpoint and mode): overall, per category, per seed,
    draft statistics, per-position acceptance, identical output."""
    boot = {"resamples": resamples, "seed": boot_seed}
    pairs = _pairs(records)
    if not pairs:
        raise VerifyError("no vanilla/MTP request pairs to summarize")
    m0 = pairs[0][1]
    out: dict[str, Any] = {"k": m0.k, "endpoint": m0.endpoint, "mode": m0.mode}
    out.update(_row(pairs, boot))
    cats = list(categories) if categories else sorted({m.category for _, m in pairs})
    out["per_category"] = {c: _row([p for p in pairs if p[1].category == c], boot)
                           for c in cats if any(p[1].category == c for p in pairs)}
    seeds = sorted({m.seed for _, m in pairs})
    out["per_seed"] = {str(s): _row([p for p in pairs if p[1].seed == s], boot) for s in seeds}
    mtp = [m for _, m in pairs]
    out["requests_without_drafts"] = sum(1 for m in mtp if not m.draft_n)
    # draft rounds and per-position acceptance (from /metrics deltas)
    if all(m.n_drafts is not None for m in mtp):
        n_drafts = sum(m.n_drafts or 0 for m in mtp)
        out["n_drafts"] = n_drafts
        out["mean_accepted_per_draft"] = _num(out["draft_n_accepted"] / n_drafts) if n_drafts else None
        out["tokens_per_step"] = _num(1 + out["draft_n_accepted"] / n_drafts) if n_drafts else None
        if all(m.accepted_per_pos is not None for m in mtp) and n_drafts:
            width = max(len(m.accepted_per_pos or []) for m in mtp)
            acc = np.zeros(width)
            for m in mtp:
                acc[: len(m.accepted_per_pos or [])] += np.array(m.accepted_per_pos or [], dtype=float)
            out["per_position"] = [_num(a / n_drafts) for a in acc]
        else:
            out["per_position"] = None
    else:
        out["n_drafts"] = out["mean_accepted_per_draft"] = out["tokens_per_step"] = out["per_position"] = None
    same = [v.text == m.text for v, m in pairs]
    out["identical_output_fraction"] = _num(sum(same) / len(same))
    out["identical_outputs"] = {"identical": int(sum(same)), "pairs": len(same)}
    mism = [_mismatch(v, m) for (v, m), s in zip(pairs, same) if not s]
    out["mismatch_count"] = len(mism)
    out["mismatches"] = mism[:MAX_LISTED_MISMATCHES]
    return out


def recommend(rows: Sequence[dict[str, Any]], min_identical: float = 1.0,
              tolerance: float = BALANCED_TOLERANCE) -> dict[str, Any]:
    """Recommended draft window and profiles from a sweep's rows (one mode, chat arm).

    Each row needs ``k``, ``speedup``, ``speedup_ci95``, ``acceptance`` and
    ``identical_output_fraction``. See the module docstring for the rules."""
    if not rows:
        raise ValueError("no sweep rows")
    eligible = [r for r in rows if (r.get("identical_output_fraction") or 0) >= min_identical]
    notes = []
    if not eligible:
        eligible = list(rows)
        notes.append("no window gave identical output in every pair; ranking all windows anyway")
    ranked = sorted(eligible, key=lambda r: (-(r.get("speedup") or 0.0), r["k"]))
    best = ranked[0]
    others = [r for r in eligible if r is not best]
    lo = (best.get("speedup_ci95") or [None, None])[0]
    clear = bool(others) and lo is not None and all(
        (r.get("speedup_ci95") or [None, None])[1] is not None and lo > r["speedup_ci95"][1] for r in others)
    beats_vanilla = lo is not None and lo > 1.0
    within = [r for r in eligible if (r.get("speedup") or 0) >= (1 - tolerance) * (best.get("speedup") or 0)]
    balanced = min(within, key=lambda r: r["k"])

    def prof(name: str, r: dict | None, use: str, recommended: bool) -> dict[str, Any]:
        d: dict[str, Any] = {"profile": name, "k": r["k"] if r else None, "recommended": recommended, "use": use}
        if r:
            d.update(acceptance=r.get("acceptance"), speedup=r.get("speedup"), speedup_ci95=r.get("speedup_ci95"),
                     flags=f"--spec-type draft-mtp --spec-draft-n-max {r['k']}")
        else:
            d.update(acceptance=None, speedup=1.0, speedup_ci95=None, flags="(no --spec-type)")
        return d

    near = [r["k"] for r in others if (r.get("speedup_ci95") or [None, None])[1] is not None and lo is not None
            and r["speedup_ci95"][1] >= lo]
    profiles = [
        prof("low latency", best, "batch size 1: single-user chat, coding agents (the highest measured speedup)",
             beats_vanilla),
        prof("balanced", balanced, f"a few concurrent requests: the smallest window within {tolerance:.0%} of the "
             "best speedup, so fewer rejected draft tokens are verified per step", beats_vanilla),
        prof("MTP off", None,
             "no window beats vanilla here (every speedup CI lower bound <= 1.0): run without speculation"
             if not beats_vanilla else
             "saturated servers where verification cost dominates (not measured: verify runs batch size 1)",
             not beats_vanilla),
    ]
    return {
        "recommended_k": best["k"] if beats_vanilla else None,
        "best_k": best["k"],
        "best_speedup": best.get("speedup"),
        "best_speedup_ci95": best.get("speedup_ci95"),
        "clear": clear,
        "within_noise_of": near,
        "mtp_beats_vanilla": beats_vanilla,
        "balanced_k": balanced["k"],
        "rule": ("best k = highest speedup point estimate among windows with identical output (ties: smaller k); "
                 "'clear' when its CI lower bound exceeds every other window's CI upper bound; balanced = smallest k "
                 f"within {tolerance:.0%} of the best speedup; MTP off when no window's speedup CI lower bound > 1.0"),
        "profiles": profiles,
        "notes": notes,
    }


def step_cost(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """What a speculative step costs on this machine, from a sweep's rows (one mode): ms per
    verification step (tokens per step / MTP tok/s) fitted by least squares as ``fixed_ms +
    per_position_ms * k``, beside vanilla's ms per token. ``per_position_ms`` is what one more draft
    position costs (its draft pass plus one more token to verify): the figure a faster drafter or
    runtime has to cut. None unless at least two windows drafted."""
    pts = [(int(r["k"]), 1000.0 * r["tokens_per_step"] / r["mtp_tokens_per_second"]) for r in rows
           if r.get("tokens_per_step") and r.get("mtp_tokens_per_second")]
    if len({k for k, _ in pts}) < 2:
        return None
    per_position, fixed = np.polyfit([k for k, _ in pts], [m for _, m in pts], 1)
    van = [1000.0 / r["vanilla_tokens_per_second"] for r in rows if r.get("vanilla_tokens_per_second")]
    van_ms = float(np.mean(van)) if van else None
    return {
        "fixed_ms": _num(fixed), "per_position_ms": _num(per_position), "vanilla_ms_per_token": _num(van_ms),
        "per_position_in_vanilla_tokens": _num(per_position / van_ms) if van_ms else None,
        "points": [{"k": k, "ms_per_step": _num(m)} for k, m in pts],
        "model": "ms per verification step = fixed_ms + per_position_ms * k (least squares over the windows)",
    }


def format_step_cost(sc: dict[str, Any] | None) -> str | None:
    if not sc or sc.get("fixed_ms") is None or sc.get("per_position_ms") is None:
        return None
    steps = ", ".join("k=%d %.2f ms" % (p["k"], p["ms_per_step"]) for p in sc["points"])
    line = (f"step cost: {sc['fixed_ms']:.2f} ms + {sc['per_position_ms']:.2f} ms per draft position "
            f"({steps} per verification step)")
    if sc.get("vanilla_ms_per_token"):
        line += (f"; a vanilla token {sc['vanilla_ms_per_token']:.2f} ms, so a draft position costs "
                 f"{sc['per_position_in_vanilla_tokens']:.2f} of one")
    return line
