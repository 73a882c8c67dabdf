"""``ggufmtp verify``: prove that an MTP GGUF drafts, is lossless, and measure what it buys.

Method
------
Two real llama-servers on the same model stay up side by side: *vanilla* (no speculation) and
*MTP* (``--spec-type draft-mtp --spec-draft-n-max k``, ``--metrics``). Every prompt of the suite,
under every seed (and every thinking mode, see below), goes to both, one request at a time (batch
size 1, never concurrently: on a small machine two busy servers would slow each other down), in
ABBA order: pair 0 is vanilla then MTP, pair 1 MTP then vanilla, and so on, so slow drift (thermal,
page cache, other tenants) and any "who ran just before" effect cancel between the arms. Each server
answers one unrecorded warm-up request first. Requests go to ``/v1/chat/completions`` (the chat
template applied, as the model is used) at temperature 0 with ``max_tokens`` and ``seed``, and
``cache_prompt: false`` so every request is independent of the ones before it. With ``raw=True``
the same prompts also go to ``/completion`` without a template, reported as their own arm.

Per request the ``timings`` give ``predicted_n`` and ``predicted_ms`` (decode tok/s =
``predicted_n / predicted_ms * 1000``, prompt processing excluded), ``draft_n`` and
``draft_n_accepted``; after each MTP request ``/metrics`` is read and the deltas of
``llamacpp:spec_decode_num_drafts_total`` and ``..._num_accepted_tokens_per_pos_total{position=i}``
give the number of draft rounds and the per-position acceptance (cross-checked against the
response's own ``draft_n``/``draft_n_accepted``).

Statistics (see :mod:`ggufmtp.stats`): acceptance = sum(accepted) / sum(drafted); speedup = MTP
decode throughput / vanilla decode throughput (ratio of summed tokens over summed decode time);
95% percentile-bootstrap CIs resampling *prompts* (a prompt's seeds pooled, arms paired), 2000
resamples, fixed generator seed 0. Per category and per seed the same, on that subset.

Correctness: at temperature 0 speculative decoding is lossless, so every MTP reply must equal the
vanilla reply to the same request; ``identical_output_fraction`` and the list of mismatches report it.

Thinking: when the chat template reads ``enable_thinking`` (Qwen3.x, GLM-4.5), the suite runs
twice, with ``chat_template_kwargs.enable_thinking`` true and false; the two modes are reported
separately (never averaged) and each must pass. The top-level numbers are those of the first mode.

Verdict policy
--------------
- Drafting must happen: an MTP arm without any ``draft_n`` is a hard error (:class:`VerifyError`),
  not a verdict.
- Acceptance (point estimate, chat arm, k = ``draft_n_max``, every mode) >= ``min_acceptance``
  always applies when a threshold is set (recipe ``[verify]`` or ``--min-acceptance``).
- Outputs identical to vanilla in at least ``min_identical`` of the pairs (default 1.0: all).
- Speedup (point estimate) >= ``min_speedup`` applies only when the model is offloaded to a GPU
  (``gpu_layers`` > 0 and llama-server lists a GPU device): a small model on CPU is compute-bound,
  not memory-bound, and MTP is slower there, so on CPU the speedup is reported with a note.
  ``enforce_speedup=True`` applies it anyway.

Sweep
-----
``sweep=[2, 3, 4, 6, 8]`` repeats the MTP arm for each window k (``draft_n_max`` is always
included; each k is paired with fresh vanilla requests interleaved with it). The recommended k is
the one with the highest speedup point estimate among the windows with identical output (ties: the
smaller k); it is called *clear* when its CI lower bound is above every other window's CI upper
bound. Profiles (after the SGLang tuning guide's low latency / balanced / off): low latency = the
recommended k; balanced = the smallest k whose speedup is within 5% of the best (fewer rejected
draft tokens to verify per step, which matters once several requests share a batch); MTP off is
advised when no k's speedup CI lower bound exceeds 1.0. The sweep also gives the step cost
(:func:`step_cost`): ms per verification step fitted as ``fixed_ms + per_position_ms * k``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ..measure import stats
from ..runtime.hardware import PEAK_BANDWIDTH_ENV, bandwidth_report, format_bandwidth, peak_bandwidth
from ..errors import GgufmtpError, ServerError, VerifyError
from ..fmt import ci_text, finite_or_none as _num
from ..runtime.server import LlamaServer, ServerConfig
from ..measure.suite import DEFAULT_SUITE, Prompt, Suite, load_suite, mode_request_fields, modes_for_template
from ..synth.factory import resolve_model

__all__ = [
    "Record", "Thresholds", "VerifyResult", "verify", "evaluate_verdict", "recommend", "step_cost", "summarize",
    "format_result", "hardware_info", "DEFAULT_SEEDS", "DEFAULT_MAX_TOKENS",
]

DEFAULT_SEEDS = (42, 1337, 2024)
DEFAULT_MAX_TOKENS = 128
DEFAULT_DRAFT_N_MAX = 4
BALANCED_TOLERANCE = 0.05
WARMUP_TOKENS = 24
MAX_LISTED_MISMATCHES = 20
PER_POS_RE = re.compile(r'^llamacpp:spec_decode_num_accepted_tokens_per_pos_total\{position="(\d+)"\}$')


# ----------------------------------------------------------------------------- records


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


# ----------------------------------------------------------------------------- thresholds / verdict


@dataclass(frozen=True)
class Thresholds:
    min_acceptance: float | None = None
    min_speedup: float | None = None
    min_identical: float = 1.0
    enforce_speedup: bool = False
    source: str = "none"

    @classmethod
    def coerce(cls, t: Any) -> "Thresholds":
        if t is None:
            return cls()
        if isinstance(t, Thresholds):
            return t
        if isinstance(t, dict):
            return cls(**{k: v for k, v in t.items() if k in {f.name for f in dataclasses.fields(cls)}})
        # recipe.VerifyThresholds (min_acceptance, min_speedup, draft_n_max)
        return cls(min_acceptance=getattr(t, "min_acceptance", None), min_speedup=getattr(t, "min_speedup", None),
                   source="recipe")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def evaluate_verdict(per_mode: dict[str, dict[str, Any]], thresholds: Thresholds, offloaded: bool
                     ) -> tuple[str, list[str], list[str]]:
    """``(verdict, reasons, notes)`` from each mode's main numbers.

    ``per_mode[mode]`` holds ``acceptance``, ``speedup``, ``speedup_ci95`` and
    ``identical_output_fraction`` of the chat arm at k = draft_n_max. ``reasons`` are the failures
    (verdict "fail" iff non-empty); ``notes`` explain what was not checked and why.
    """
    reasons: list[str] = []
    notes: list[str] = []
    t = thresholds
    speed_applies = offloaded or t.enforce_speedup
    for mode, m in per_mode.items():
        tag = "" if len(per_mode) == 1 else f" [{mode}]"
        acc = m.get("acceptance")
        if t.min_acceptance is not None:
            if acc is None or acc < t.min_acceptance:
                reasons.append(f"acceptance{tag} {_pct(acc)} is below the minimum {_pct(t.min_acceptance)}")
        ident = m.get("identical_output_fraction")
        if ident is None or ident < t.min_identical:
            reasons.append(f"identical output{tag}: {_pct(ident)} of MTP replies equal the vanilla replies "
                           f"(required {_pct(t.min_identical)}); speculative decoding at temperature 0 must be lossless")
        sp = m.get("speedup")
        if t.min_speedup is not None and speed_applies:
            if sp is None or sp < t.min_speedup:
                reasons.append(f"speedup{tag} {_x(sp)} is below the minimum {_x(t.min_speedup)}")
    if t.min_acceptance is None:
        notes.append("no acceptance threshold set (use --recipe or --min-acceptance): acceptance not checked")
    if t.min_speedup is None:
        notes.append("no speedup threshold set (use --recipe or --min-speedup): speedup not checked")
    elif not speed_applies:
        notes.append(f"speedup threshold {_x(t.min_speedup)} not applied: the model ran on CPU without GPU offload, "
                     "where a small model is compute-bound and MTP is expected to be slower; the speedup is "
                     "reported for information (--enforce-speedup checks it anyway)")
    elif not offloaded:
        notes.append("speedup threshold enforced on a CPU run (--enforce-speedup)")
    return ("fail" if reasons else "pass"), reasons, notes


def _pct(x: float | None, nd: int = 1) -> str:
    return "n/a" if x is None else f"{x * 100:.{nd}f} %"


def _x(x: float | None, nd: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{nd}f}×"


# ----------------------------------------------------------------------------- summaries


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


# ----------------------------------------------------------------------------- environment


def _read_cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _nvidia_gpus() -> list[dict[str, Any]]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        p = subprocess.run([exe, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    out = []
    for line in p.stdout.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if parts and parts[0]:
            out.append({"name": parts[0], "memory": parts[1] if len(parts) > 1 else None,
                        "driver": parts[2] if len(parts) > 2 else None})
    return out


def server_devices(binary: Path) -> list[str]:
    """GPU devices llama-server can use (``--list-devices``); empty for a CPU-only build."""
    try:
        p = subprocess.run([str(binary), "--list-devices"], capture_output=True, text=True, timeout=60,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return []
    devs = []
    seen = False
    for line in (p.stdout + p.stderr).splitlines():
        if line.strip().startswith("Available devices"):
            seen = True
            continue
        if seen and line.startswith((" ", "\t")) and line.strip() and line.strip() != "(none)":
            devs.append(line.strip())
    return devs


def _gpu_layers_requested(gpu_layers: int | str | None) -> bool:
    if gpu_layers is None:
        return False
    if isinstance(gpu_layers, str):
        s = gpu_layers.strip().lower()
        if s in ("all", "auto"):
            return True
        try:
            return int(s) > 0
        except ValueError:
            return False
    return int(gpu_layers) > 0


def hardware_info(binary: Path | None, gpu_layers: int | str | None) -> dict[str, Any]:
    devices = server_devices(binary) if binary else []
    gpus = _nvidia_gpus()
    offloaded = _gpu_layers_requested(gpu_layers) and bool(devices)
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    return {
        "cpu": _read_cpu_model(),
        "cpu_cores": os.cpu_count(),
        "cores": os.cpu_count(),  # alias read by ggufmtp.card
        "cpu_cores_usable": affinity,
        "gpus": gpus,
        "gpu": gpus[0]["name"] if gpus else (devices[0] if devices else None),
        "server_devices": devices,
        "gpu_layers": gpu_layers,
        "offloaded": offloaded,
        "backend": "gpu" if offloaded else "cpu",
        "os": f"{platform.system()} {platform.release()} {platform.machine()}",
    }


def _flags_of(command: list[str]) -> list[str]:
    out, skip = [], False
    for i, a in enumerate(command[1:]):
        if skip:
            skip = False
            continue
        if a in ("--model", "-m", "--host", "--port"):
            skip = True
            continue
        out.append(a)
    return out


# ----------------------------------------------------------------------------- result


@dataclass
class VerifyResult:
    model: dict[str, Any]
    suite: dict[str, Any]
    settings: dict[str, Any]
    server: dict[str, Any]
    hardware: dict[str, Any]
    thresholds: Thresholds
    modes: list[str]
    draft_n_max: int
    comparisons: list[dict[str, Any]]  # summarize() of every (k, endpoint, mode)
    verdict: str
    reasons: list[str]
    notes: list[str]
    records: list[Record] = field(default_factory=list)
    tuned: dict[str, Any] | None = None  # per mode: recommend() (only with a sweep)
    seconds: float = 0.0
    bandwidth: dict[str, Any] | None = None  # ggufmtp.bandwidth.bandwidth_report() of the main comparison

    @property
    def ok(self) -> bool:
        return self.verdict == "pass"

    def comparison(self, k: int | None = None, endpoint: str = "chat", mode: str | None = None) -> dict[str, Any] | None:
        k = self.draft_n_max if k is None else k
        mode = mode or self.modes[0]
        for c in self.comparisons:
            if c["k"] == k and c["endpoint"] == endpoint and c["mode"] == mode:
                return c
        return None

    @property
    def main(self) -> dict[str, Any]:
        c = self.comparison()
        assert c is not None
        return c

    @property
    def sweep_ks(self) -> list[int]:
        return sorted({c["k"] for c in self.comparisons})

    def sweep_rows(self, mode: str | None = None, endpoint: str = "chat") -> list[dict[str, Any]]:
        mode = mode or self.modes[0]
        return [c for c in sorted(self.comparisons, key=lambda c: c["k"])
                if c["mode"] == mode and c["endpoint"] == endpoint]

    def _arm(self, c: dict[str, Any]) -> dict[str, Any]:
        return {
            "acceptance": c["acceptance"], "acceptance_ci95": c["acceptance_ci95"],
            "draft_n": c["draft_n"], "draft_n_accepted": c["draft_n_accepted"],
            "tokens_per_second": c["mtp_tokens_per_second"], "draft_n_max": c["k"],
            "n_drafts": c.get("n_drafts"), "mean_accepted_per_draft": c.get("mean_accepted_per_draft"),
            "tokens_per_step": c.get("tokens_per_step"), "per_position": c.get("per_position"),
            "requests_without_drafts": c.get("requests_without_drafts"),
        }

    def _flat(self, c: dict[str, Any]) -> dict[str, Any]:
        keys = ("acceptance", "acceptance_ci95", "draft_n", "draft_n_accepted", "mtp_tokens_per_second",
                "tokens_per_second", "vanilla_tokens_per_second", "speedup", "speedup_ci95", "n_prompts", "n_pairs")
        return {k: c.get(k) for k in keys}

    def to_dict(self, requests: bool = False) -> dict[str, Any]:
        c = self.main
        d: dict[str, Any] = {
            "verdict": self.verdict,
            "reasons": list(self.reasons),
            "notes": list(self.notes),
            "model": self.model,
            "mode": self.modes[0],
            "mtp": self._arm(c),
            "vanilla": {"tokens_per_second": c["vanilla_tokens_per_second"]},
            "speedup": c["speedup"],
            "speedup_ci95": c["speedup_ci95"],
            "identical_output_fraction": c["identical_output_fraction"],
            "identical_outputs": c["identical_outputs"],
            "mismatch_count": sum(x["mismatch_count"] for x in self.comparisons),
            "mismatches": [m for x in self.comparisons for m in x["mismatches"]][:MAX_LISTED_MISMATCHES],
            "per_category": c["per_category"],
            "per_seed": c["per_seed"],
            "modes": {m: self._mode_dict(m) for m in self.modes},
            "raw": ({m: self._mode_dict(m, "raw") for m in self.modes}
                    if self.comparison(endpoint="raw") is not None else None),
            "sweep": ([{**self._flat(r), "k": r["k"], "mode": r["mode"],
                        "identical_output_fraction": r["identical_output_fraction"],
                        "mean_accepted_per_draft": r.get("mean_accepted_per_draft"),
                        "n_drafts": r.get("n_drafts"), "tokens_per_step": r.get("tokens_per_step"),
                        "per_position": r.get("per_position")}
                       for m in self.modes for r in self.sweep_rows(m)]
                      if len(self.sweep_ks) > 1 else None),
            "tuned": self.tuned,
            "bandwidth": self.bandwidth,
            "suite": self.suite,
            "server": self.server,
            "hardware": self.hardware,
            "settings": self.settings,
            "thresholds": self.thresholds.to_dict(),
            "seconds": round(self.seconds, 2),
        }
        if requests:
            d["requests"] = [r.to_dict() for r in self.records]
        return d

    def _mode_dict(self, mode: str, endpoint: str = "chat") -> dict[str, Any] | None:
        c = self.comparison(mode=mode, endpoint=endpoint)
        if c is None:
            return None
        return {"mtp": self._arm(c), "vanilla": {"tokens_per_second": c["vanilla_tokens_per_second"]},
                "speedup": c["speedup"], "speedup_ci95": c["speedup_ci95"],
                "identical_output_fraction": c["identical_output_fraction"],
                "per_category": {k: self._flat(v) for k, v in c["per_category"].items()},
                "per_seed": {k: self._flat(v) for k, v in c["per_seed"].items()}}

    def to_receipt(self) -> dict[str, Any]:
        """The receipt's ``predicate.verification`` section (schema ``$defs.verification``)."""
        d = self.to_dict(requests=False)
        d.pop("seconds", None)
        return d

    def table(self) -> str:
        return format_result(self)


# ----------------------------------------------------------------------------- formatting


def _ci_pct(ci: Sequence[float | None] | None) -> str:
    return ci_text(ci, scale=100, digits=2)


def _ci_x(ci: Sequence[float | None] | None) -> str:
    return ci_text(ci)


def _tps(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def format_result(res: VerifyResult) -> str:
    L: list[str] = []
    s, hw, srv, st = res.suite, res.hardware, res.server, res.settings
    L.append(f"ggufmtp verify {Path(res.model['path']).name}  (MTP blk.{res.model.get('mtp_block')}, "
             f"k={res.draft_n_max}" + (f", draft-n-min {st['draft_n_min']}" if st.get("draft_n_min") else "") + ")")
    if st.get("mtp_config"):
        env = " ".join(f"{k}={v}" for k, v in sorted((st.get("mtp_env") or {}).items()))
        L.append(f"MTP arm flags (tuned): {' '.join(st['mtp_flags'])}" + (f" (environment {env})" if env else "")
                 + "; vanilla arm: llama-server defaults")
    L.append(f"suite {s['name']} ({s['n_prompts']} prompts: "
             + ", ".join(f"{k} {v}" for k, v in s["categories"].items())
             + f"; sha256 {s['sha256'][:16]}…)  seeds {', '.join(map(str, st['seeds']))}  "
             f"max_tokens {st['max_tokens']}  temperature 0, /v1/chat/completions")
    gpu = (f"GPU {hw.get('gpu')}, gpu_layers {hw.get('gpu_layers')} (offloaded)" if hw.get("offloaded")
           else f"no GPU offload (gpu_layers {hw.get('gpu_layers')}" + (f"; GPU present: {hw.get('gpu')}" if hw.get("gpu") else "")
           + ")")
    L.append(f"server {srv.get('build_info')} (commit {srv.get('commit')}) {srv.get('binary')}")
    L.append(f"hardware {hw.get('cpu')}, {hw.get('cpu_cores')} cores; {gpu}")
    for mode in res.modes:
        c = res.comparison(mode=mode)
        if c is None:
            continue
        L.append("")
        if len(res.modes) > 1:
            L.append(f"mode: {mode} (chat_template_kwargs.enable_thinking={'true' if mode == 'thinking' else 'false'}; "
                     "reported separately, never averaged)")
        L.append(f"{'arm':<18} {'acceptance (95% CI)':<26} {'mtp tok/s':>10} {'vanilla tok/s':>14}  "
                 f"{'speedup (95% CI)'}")

        def row(name: str, r: dict[str, Any]) -> str:
            return (f"{name:<18} {_pct(r.get('acceptance'), 2) + ' ' + _ci_pct(r.get('acceptance_ci95')):<26} "
                    f"{_tps(r.get('mtp_tokens_per_second')):>10} {_tps(r.get('vanilla_tokens_per_second')):>14}  "
                    f"{_x(r.get('speedup'))} {_ci_x(r.get('speedup_ci95'))}")

        L.append(row("overall", c))
        for cat, r in c["per_category"].items():
            L.append(row(cat, r))
        raw = res.comparison(mode=mode, endpoint="raw")
        if raw is not None:
            L.append(row("raw /completion", raw))
        L.append("per-seed: " + " · ".join(
            f"seed {sd} → {_pct(r.get('acceptance'), 2)}/{_x(r.get('speedup'))}" for sd, r in c["per_seed"].items()))
        if c.get("n_drafts"):
            pp = c.get("per_position")
            L.append(f"drafts: {c['draft_n_accepted']}/{c['draft_n']} tokens accepted in {c['n_drafts']} draft rounds; "
                     f"mean accepted length per draft {c['mean_accepted_per_draft']:.2f} of {c['k']} "
                     f"({c['tokens_per_step']:.2f} tokens per verification step)"
                     + ("; acceptance by position " + " · ".join(f"{i + 1}: {_pct(p)}" for i, p in enumerate(pp))
                        if pp else ""))
        io = c["identical_outputs"]
        L.append(f"identical output vs vanilla: {io['identical']}/{io['pairs']} ({_pct(c['identical_output_fraction'])})"
                 + (f"; {c['mismatch_count']} mismatches, first: {c['mismatches'][0]['prompt_id']} seed "
                    f"{c['mismatches'][0]['seed']} at char {c['mismatches'][0]['first_difference_at']}"
                    if c["mismatch_count"] else ""))
        if raw is not None and raw["mismatch_count"]:
            L.append(f"raw arm identical output: {raw['identical_outputs']['identical']}/{raw['identical_outputs']['pairs']}")
        rows = res.sweep_rows(mode)
        if len(rows) > 1:
            L.append("")
            L.append("draft-window sweep (chat arm; each k paired with its own interleaved vanilla requests)")
            L.append(f"{'k':<12} {'acceptance (95% CI)':<26} {'mtp tok/s':>10} {'vanilla tok/s':>14}  "
                     f"{'speedup (95% CI)':<24} identical")
            for r in rows:
                name = f"{r['k']}" + (" (shipped)" if r["k"] == res.draft_n_max else "")
                L.append(f"{name:<12} {_pct(r['acceptance'], 2) + ' ' + _ci_pct(r['acceptance_ci95']):<26} "
                         f"{_tps(r['mtp_tokens_per_second']):>10} {_tps(r['vanilla_tokens_per_second']):>14}  "
                         f"{_x(r['speedup']) + ' ' + _ci_x(r['speedup_ci95']):<24} "
                         f"{_pct(r['identical_output_fraction'])}")
            tuned = ((res.tuned or {}).get("by_mode") or {}).get(mode)
            if tuned:
                if tuned["mtp_beats_vanilla"]:
                    L.append(f"recommended k = {tuned['recommended_k']} ("
                             + ("clearly best: its speedup CI lies above every other window's" if tuned["clear"]
                                else f"best point estimate; within noise of k = {', '.join(map(str, tuned['within_noise_of']))}"
                                if tuned["within_noise_of"] else "best point estimate") + ")")
                else:
                    L.append(f"recommended: MTP off — no window's speedup CI lower bound exceeds 1.0 "
                             f"(best k = {tuned['best_k']} at {_x(tuned['best_speedup'])} {_ci_x(tuned['best_speedup_ci95'])})")
                sc = format_step_cost(tuned.get("step_cost"))
                if sc:
                    L.append(sc)
                L.append("")
                L.append(f"{'profile':<13} {'k':<4} {'acceptance':>10} {'speedup':>9}  {'flags':<44} use")
                for p in tuned["profiles"]:
                    mark = "" if p["recommended"] else " (not advised on this hardware)"
                    L.append(f"{p['profile']:<13} {str(p['k'] or '—'):<4} {_pct(p['acceptance']):>10} "
                             f"{_x(p['speedup'], 2):>9}  {p['flags']:<44} {p['use']}{mark}")
    bw = format_bandwidth(res.bandwidth)
    if bw:
        L.append(bw)
    L.append("")
    t = res.thresholds
    L.append(f"verdict: {res.verdict.upper()}  (thresholds from {t.source}: min acceptance {_pct(t.min_acceptance)}, "
             f"min speedup {_x(t.min_speedup)}, identical output >= {_pct(t.min_identical)})")
    for r in res.reasons:
        L.append(f"  FAIL {r}")
    for n in res.notes:
        L.append(f"  note: {n}")
    return "\n".join(L)


# ----------------------------------------------------------------------------- running


def _metrics_snapshot(srv: LlamaServer) -> dict[str, Any]:
    m = srv.metrics()
    pos = {}
    for key, v in m.items():
        mm = PER_POS_RE.match(key)
        if mm:
            pos[int(mm.group(1))] = int(v)
    return {
        "draft_tokens": int(m.get("llamacpp:spec_decode_num_draft_tokens_total", 0)),
        "accepted": int(m.get("llamacpp:spec_decode_num_accepted_tokens_total", 0)),
        "drafts": int(m.get("llamacpp:spec_decode_num_drafts_total", 0)),
        "per_pos": [pos[i] for i in sorted(pos)],
        "has_spec": "llamacpp:spec_decode_num_drafts_total" in m,
    }


def _delta(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    n = max(len(a["per_pos"]), len(b["per_pos"]))
    pa = a["per_pos"] + [0] * (n - len(a["per_pos"]))
    pb = b["per_pos"] + [0] * (n - len(b["per_pos"]))
    return {"draft_tokens": b["draft_tokens"] - a["draft_tokens"], "accepted": b["accepted"] - a["accepted"],
            "drafts": b["drafts"] - a["drafts"], "per_pos": [y - x for x, y in zip(pa, pb)]}


def _text_of(resp: dict[str, Any], endpoint: str) -> tuple[str, str | None]:
    if endpoint == "raw":
        return str(resp.get("content", "")), resp.get("stop_type")
    ch = (resp.get("choices") or [{}])[0]
    msg = ch.get("message") or {}
    text = msg.get("content") or ""
    if msg.get("reasoning_content"):
        text = f"<think>{msg['reasoning_content']}</think>{text}"
    return text, ch.get("finish_reason")


class _Runner:
    def __init__(self, suite: Suite, seeds: Sequence[int], modes: list[str], endpoints: list[str], max_tokens: int,
                 bar, on_record: Callable[[Record], None] | None):
        self.suite, self.seeds, self.modes, self.endpoints = suite, list(seeds), modes, endpoints
        self.max_tokens = max_tokens
        self.bar = bar
        self.on_record = on_record
        self.records: list[Record] = []
        self.order = 0
        self.metrics_mismatches = 0

    def send(self, srv: LlamaServer, p: Prompt, endpoint: str, mode: str, seed: int, max_tokens: int) -> dict:
        extra = {"cache_prompt": False}
        if endpoint == "chat":
            return srv.chat(p.chat_messages(), max_tokens=max_tokens, temperature=0.0, seed=seed,
                            **mode_request_fields(mode), **extra)
        return srv.complete(p.raw_text(), n_predict=max_tokens, temperature=0.0, seed=seed, **extra)

    def one(self, arm: str, srv: LlamaServer, k: int, p: Prompt, endpoint: str, mode: str, seed: int,
            snap: dict[str, Any] | None) -> tuple[Record, dict[str, Any] | None]:
        where = f"{arm} arm (k={k}) on prompt {p.id!r}, seed {seed}, {endpoint}" + (f", {mode}" if mode != "default" else "")
        try:
            resp = self.send(srv, p, endpoint, mode, seed, self.max_tokens)
        except ServerError as e:
            raise VerifyError(f"{where}: {e}") from e
        t = resp.get("timings")
        if not isinstance(t, dict) or "predicted_n" not in t or "predicted_ms" not in t:
            raise VerifyError(f"{where}: llama-server's answer has no timings.predicted_n/predicted_ms: "
                              f"{str(resp)[:300]}")
        text, finish = _text_of(resp, endpoint)
        rec = Record(arm=arm, k=k, endpoint=endpoint, mode=mode, prompt_id=p.id, category=p.category, seed=seed,
                     order=self.order, predicted_n=int(t["predicted_n"]), predicted_ms=float(t["predicted_ms"]),
                     prompt_n=t.get("prompt_n"), draft_n=t.get("draft_n"), draft_n_accepted=t.get("draft_n_accepted"),
                     text=text, finish_reason=finish)
        self.order += 1
        new_snap = None
        if arm == "mtp" and snap is not None:
            try:
                new_snap = _metrics_snapshot(srv)
                d = _delta(snap, new_snap)
                if (d["draft_tokens"], d["accepted"]) != ((rec.draft_n or 0), (rec.draft_n_accepted or 0)):
                    time.sleep(0.05)  # counters are flushed when the slot is released; read once more
                    new_snap = _metrics_snapshot(srv)
                    d = _delta(snap, new_snap)
                if (d["draft_tokens"], d["accepted"]) == ((rec.draft_n or 0), (rec.draft_n_accepted or 0)):
                    rec.n_drafts, rec.accepted_per_pos = d["drafts"], d["per_pos"]
                else:
                    self.metrics_mismatches += 1
            except ServerError as e:
                raise VerifyError(f"{where}: reading /metrics: {e}") from e
        self.records.append(rec)
        if self.bar is not None:
            self.bar.update(1)
        if self.on_record is not None:
            self.on_record(rec)
        return rec, new_snap

    def run_k(self, k: int, van: LlamaServer, mtp: LlamaServer, pair_index: int) -> int:
        snap = _metrics_snapshot(mtp)
        if not snap["has_spec"]:
            snap = None
        for seed in self.seeds:
            for mode in self.modes:
                for p in self.suite.prompts:
                    for endpoint in self.endpoints:
                        if self.bar is not None:
                            self.bar.set_postfix_str(f"k={k} seed={seed} {p.id}", refresh=False)
                        first_vanilla = pair_index % 2 == 0  # ABBA: V M, M V, V M, ...
                        if first_vanilla:
                            self.one("vanilla", van, k, p, endpoint, mode, seed, None)
                            _, s2 = self.one("mtp", mtp, k, p, endpoint, mode, seed, snap)
                        else:
                            _, s2 = self.one("mtp", mtp, k, p, endpoint, mode, seed, snap)
                            self.one("vanilla", van, k, p, endpoint, mode, seed, None)
                        if s2 is not None:
                            snap = s2
                        pair_index += 1
        return pair_index


def _warmup(srv: LlamaServer, p: Prompt, mode: str, arm: str, k: int | None) -> dict:
    try:
        resp = srv.chat(p.chat_messages(), max_tokens=WARMUP_TOKENS, temperature=0.0, seed=0, cache_prompt=False,
                        **mode_request_fields(mode))
    except ServerError as e:
        raise VerifyError(f"{arm} server{f' (k={k})' if k else ''}: warm-up request failed: {e}") from e
    return resp


def _parse_build_commit(build_info: str | None) -> str | None:
    if not build_info:
        return None
    m = re.match(r"^b\d+-([0-9a-fA-F]+|unknown)$", build_info.strip())
    return m.group(1) if m else None


def verify(
    model: str | os.PathLike,
    draft_n_max: int | None = None,
    draft_n_min: int | None = None,
    seeds: Sequence[int] = DEFAULT_SEEDS,
    suite: str | os.PathLike | Suite = DEFAULT_SUITE,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    raw: bool = False,
    ctx_size: int | None = 4096,
    threads: int | None = None,
    gpu_layers: int | str | None = None,
    parallel: int | None = 1,
    llama_cpp_bin: str | os.PathLike | None = None,
    progress: bool = True,
    thresholds: Any = None,
    limit: int | None = None,
    sweep: Iterable[int] | None = None,
    enforce_speedup: bool = False,
    min_identical: float | None = None,
    bootstrap_resamples: int = stats.DEFAULT_RESAMPLES,
    bootstrap_seed: int = stats.DEFAULT_SEED,
    extra_args: Sequence[str] = (),
    on_record: Callable[[Record], None] | None = None,
    tuned: Any = None,
    peak_bandwidth_gbs: float | None = None,
) -> VerifyResult:
    """Run the vanilla and MTP arms on ``model`` and judge the result (see the module docstring).

    ``thresholds``: a :class:`Thresholds`, a recipe's ``VerifyThresholds``, a dict, or None.
    ``draft_n_max`` defaults to the thresholds' (a recipe's) ``draft_n_max``, else 4.
    ``sweep``: windows to measure besides ``draft_n_max``. ``on_record`` is called after each request.
    ``tuned``: a :class:`ggufmtp.tune.TuneConfig` (or its dict, e.g. ``tune``'s recommendation): the
    MTP arm runs with its flags (window, n-min, p-min, backend sampling) against a vanilla arm with
    llama-server's defaults, which is how a tuned configuration's speedup is confirmed on the full
    suite. ``peak_bandwidth_gbs``: the memory's peak in GB/s for the bandwidth fraction (default: a
    table of GPUs; see :mod:`ggufmtp.bandwidth`).
    Raises :class:`VerifyError` when the model has no complete MTP block, a server fails or dies, or
    the MTP arm never drafts; servers are stopped on every path.
    """
    from ..gguf.model import inspect_model

    t0 = time.monotonic()
    th = Thresholds.coerce(thresholds)
    mtp_cfg = _coerce_tuned(tuned)
    if mtp_cfg is not None:
        if sweep:
            raise VerifyError("a tuned configuration and a draft-window sweep cannot be combined: "
                              "the configuration fixes the window")
        if draft_n_max is not None and int(draft_n_max) != mtp_cfg.draft_n_max:
            raise VerifyError(f"draft_n_max {draft_n_max} disagrees with the tuned configuration's "
                              f"{mtp_cfg.draft_n_max}: give one or the other")
        draft_n_max, draft_n_min = mtp_cfg.draft_n_max, mtp_cfg.draft_n_min
    if peak_bandwidth_gbs is not None or os.environ.get(PEAK_BANDWIDTH_ENV):
        try:
            peak_bandwidth(None, peak_bandwidth_gbs)  # a bad figure fails now, not after the run
        except GgufmtpError as e:
            raise VerifyError(str(e)) from e
    if draft_n_max is None:
        draft_n_max = int(getattr(thresholds, "draft_n_max", None) or DEFAULT_DRAFT_N_MAX)
    th = dataclasses.replace(th, enforce_speedup=enforce_speedup or th.enforce_speedup,
                             min_identical=th.min_identical if min_identical is None else float(min_identical))
    if not 0.0 <= th.min_identical <= 1.0:
        raise VerifyError(f"min_identical {th.min_identical}: must be between 0 and 1")
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise VerifyError("at least one seed is needed")
    if len(set(seeds)) != len(seeds):
        raise VerifyError(f"seeds {seeds}: duplicates")
    if max_tokens < 2:
        raise VerifyError(f"max_tokens {max_tokens}: must be at least 2 (a reply of one token has nothing to draft)")
    ks = sorted({int(draft_n_max), *(int(k) for k in (sweep or ()))})
    if ks[0] < 1:
        raise VerifyError(f"draft window {ks[0]}: --spec-draft-n-max must be at least 1")
    if draft_n_min is not None and draft_n_min > ks[0]:
        raise VerifyError(f"draft_n_min {draft_n_min} exceeds the smallest draft window {ks[0]}")

    st = suite if isinstance(suite, Suite) else load_suite(suite)  # a bad suite fails before anything starts
    st = st.limit(limit)
    endpoints = ["chat", "raw"] if raw else ["chat"]

    path = resolve_model(model)
    if not path.is_file():
        raise VerifyError(f"model {path}: no such file")
    rep = inspect_model(path)
    if rep.mtp_status != "complete":
        detail = (f"; missing {', '.join(rep.mtp_missing[:4])}" if rep.mtp_missing else "") + \
                 (f"; {'; '.join(rep.mtp_problems)}" if rep.mtp_problems else "")
        raise VerifyError(
            f"model {path}: its MTP block is {rep.mtp_status}{detail}. verify needs a complete MTP (NextN) block: "
            f"llama-server --spec-type draft-mtp cannot draft without one (see `ggufmtp inspect {path}`)")

    base = dict(model=path, ctx_size=ctx_size, threads=threads, gpu_layers=gpu_layers, parallel=parallel,
                llama_cpp_bin=llama_cpp_bin, metrics=True, extra_args=list(extra_args))
    from tqdm import tqdm

    with contextlib.ExitStack() as stack:
        van = stack.enter_context(LlamaServer(ServerConfig(**base)))
        try:
            props = van.props()
        except ServerError as e:
            raise VerifyError(f"vanilla server: GET /props failed: {e}") from e
        template = props.get("chat_template")
        modes = modes_for_template(template)
        total = len(ks) * len(seeds) * len(modes) * len(st.prompts) * len(endpoints) * 2
        bar = stack.enter_context(tqdm(total=total, desc="verify", unit="req", file=sys.stderr,
                                       disable=None if progress else True, leave=False, dynamic_ncols=True))
        for mode in modes:
            _warmup(van, st.prompts[0], mode, "vanilla", None)
        runner = _Runner(st, seeds, modes, endpoints, max_tokens, bar, on_record)
        mtp_commands: dict[str, list[str]] = {}
        mtp_build = None
        pair_index = 0
        for k in ks:
            with LlamaServer(_mtp_server_config(base, k, draft_n_min, mtp_cfg)) as mtp:
                mtp_commands[str(k)] = _flags_of(mtp.command)
                try:
                    mtp_build = mtp.build_info
                except ServerError as e:
                    raise VerifyError(f"MTP server (k={k}): GET /props failed: {e}") from e
                for mode in modes:
                    w = _warmup(mtp, st.prompts[0], mode, "MTP", k)
                    if not (w.get("timings") or {}).get("draft_n"):
                        slots = None
                        with contextlib.suppress(GgufmtpError):
                            slots = [s.get("speculative") for s in mtp.slots()]
                        raise VerifyError(
                            f"MTP server (k={k}): speculation did not run: the warm-up reply of "
                            f"{(w.get('timings') or {}).get('predicted_n')} tokens has no timings.draft_n "
                            f"(/slots speculative: {slots}). Is the MTP block loaded? log {mtp.log_path}")
                pair_index = runner.run_k(k, van, mtp, pair_index)
        vanilla_flags = _flags_of(van.command)
        binary = van.binary
        van_log = str(van.log_path)

    records = runner.records
    mtp_recs = [r for r in records if r.arm == "mtp"]
    if not any(r.draft_n for r in mtp_recs):
        raise VerifyError("speculation did not run: no MTP-arm response reported timings.draft_n > 0")

    comparisons = []
    for k in ks:
        for endpoint in endpoints:
            for mode in modes:
                sub = [r for r in records if r.k == k and r.endpoint == endpoint and r.mode == mode]
                comparisons.append(summarize(sub, st.categories, bootstrap_resamples, bootstrap_seed))

    build_info = props.get("build_info")
    version = {}
    with contextlib.suppress(Exception):
        from ..runtime.build import binary_is_ggufmtp_build, binary_version

        version = binary_version(binary)
        info = binary_is_ggufmtp_build(binary)
        if info is not None:
            version["variant"] = info.variant
            version["build_flags"] = info.build_flags
    server = {
        "build_info": build_info,
        "binary": str(binary),
        "commit": _parse_build_commit(build_info) or version.get("commit"),
        "version": version.get("version"),
        "variant": version.get("variant"),
        "flags": {"vanilla": vanilla_flags, "mtp": mtp_commands},
        "mtp_build_info": mtp_build,
        "chat_template_sha256": hashlib.sha256((template or "").encode()).hexdigest() if template else None,
        "thinking_modes": modes,
        "log": van_log,
    }
    hw = hardware_info(binary, gpu_layers)
    settings = {
        "draft_n_max": draft_n_max, "draft_n_min": draft_n_min, "sweep": ks if len(ks) > 1 else None,
        "seeds": seeds, "max_tokens": max_tokens, "temperature": 0.0, "ctx_size": ctx_size, "threads": threads,
        "gpu_layers": gpu_layers, "parallel": parallel, "limit": limit, "n_prompts": len(st.prompts),
        "endpoints": ["/v1/chat/completions"] + (["/completion"] if raw else []), "modes": modes,
        "cache_prompt": False, "batch_size": 1,
        "interleave": "both servers resident; requests alternate vanilla/MTP per prompt in ABBA order",
        "bootstrap": {"unit": "prompt (seeds pooled; arms paired)", "method": "percentile", "level": 0.95,
                      "resamples": bootstrap_resamples, "rng": f"numpy PCG64 seed {bootstrap_seed}",
                      "acceptance": "sum(accepted)/sum(drafted)",
                      "speedup": "(sum mtp tokens/sum mtp decode ms)/(sum vanilla tokens/sum vanilla decode ms)"},
        "metrics_mismatches": runner.metrics_mismatches,
        "mtp_config": mtp_cfg.to_dict() if mtp_cfg is not None else None,
        "mtp_flags": _mtp_only_flags(mtp_cfg),
        "mtp_env": mtp_cfg.env() if mtp_cfg is not None else None,
    }
    res = VerifyResult(
        model={"path": str(path), "size_bytes": path.stat().st_size, "architecture": rep.architecture,
               "mtp_block": rep.mtp_block, "file_type": rep.file_type},
        suite=st.to_dict(), settings=settings, server=server, hardware=hw, thresholds=th, modes=modes,
        draft_n_max=int(draft_n_max), comparisons=comparisons, verdict="pass", reasons=[], notes=[],
        records=records,
    )
    per_mode = {}
    for mode in modes:
        c = res.comparison(mode=mode)
        assert c is not None
        per_mode[mode] = c
    verdict, reasons, notes = evaluate_verdict(per_mode, th, hw["offloaded"])
    if runner.metrics_mismatches:
        notes.append(f"{runner.metrics_mismatches} MTP request(s) whose /metrics deltas disagreed with their "
                     "timings: per-position acceptance left out for them")
    nodraft = sum(c["requests_without_drafts"] for c in comparisons)
    if nodraft:
        notes.append(f"{nodraft} MTP request(s) drafted nothing (e.g. replies of one or two tokens)")
    if _gpu_layers_requested(gpu_layers) and not hw["offloaded"]:
        notes.append(f"gpu_layers {gpu_layers} requested but this llama-server lists no GPU device "
                     f"({binary}): it ran on CPU; build one with `ggufmtp runtime build --cuda`")
    if len(ks) > 1:
        by_mode = {mode: {**recommend(res.sweep_rows(mode), th.min_identical),
                          "step_cost": step_cost(res.sweep_rows(mode))} for mode in modes}
        top = dict(by_mode[modes[0]])
        ngl = f" -ngl {gpu_layers}" if gpu_layers is not None else ""
        top["command"] = (f"llama-server -m {path.name}{ngl} -c {ctx_size or 4096} --spec-type draft-mtp "
                          f"--spec-draft-n-max {top['recommended_k']}" if top["recommended_k"] is not None
                          else f"llama-server -m {path.name}{ngl} -c {ctx_size or 4096}  # MTP off: no window beat vanilla here")
        top["mode"] = modes[0]
        top["by_mode"] = by_mode
        res.tuned = top
    c0 = res.main
    try:
        res.bandwidth = bandwidth_report(path, hw, {"vanilla": c0["vanilla_tokens_per_second"],
                                                    "mtp": c0["mtp_tokens_per_second"]}, peak_bandwidth_gbs)
    except GgufmtpError as e:  # a measured run is worth more than its bandwidth line
        notes.append(f"bandwidth fraction not computed: {e}")
    res.verdict, res.reasons, res.notes = verdict, reasons, notes
    res.seconds = time.monotonic() - t0
    return res


def _coerce_tuned(tuned: Any):
    if tuned is None:
        return None
    from ..measure.tune import TuneConfig

    return TuneConfig.coerce(tuned)


def _mtp_only_flags(cfg: Any) -> list[str]:
    """The MTP arm's flags beyond --spec-type draft-mtp, as a tuned configuration sets them."""
    if cfg is None:
        return []
    out = ["--spec-draft-n-max", str(cfg.draft_n_max), "--spec-draft-n-min", str(cfg.draft_n_min)]
    if cfg.draft_p_min:
        out += ["--spec-draft-p-min", f"{cfg.draft_p_min:g}"]
    if cfg.threads is not None:
        out += ["--threads", str(cfg.threads)]
    return out + cfg.extra_args()


def _mtp_server_config(base: dict[str, Any], k: int, draft_n_min: int | None, cfg: Any) -> ServerConfig:
    if cfg is None:
        return ServerConfig(**base, draft_mtp=True, draft_n_max=k, draft_n_min=draft_n_min)
    return ServerConfig(**cfg.server_fields(base))
