"""The result of ``ggufmtp verify`` (:class:`VerifyResult` and the typed sections it is made of),
its JSON form (:meth:`VerifyResult.to_dict`, the receipt's ``verification`` section) and its text
table (:func:`format_result`)."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from ...fmt import ci_text, num, pct, times
from ...provenance.head import HeadComparison
from ...provenance.statement import Verification
from ...provenance.tuned import ProfileSource, verified_tuned
from ...provenance.verdict import Evidence, Findings, Placement, Thresholds, Verdict, speed_checked
from ...runtime.hardware import HardwareInfo, format_bandwidth
from ...runtime.memory import MemoryPlan
from ...runtime.offload import Offload
from ..core.options import TuneConfig
from ..core.records import VERIFY_BOOTSTRAP_KEYS, VERIFY_SERVER_KEYS, BootstrapInfo, ModelInfo, ServerInfo
from ..core.suite import SuiteInfo
from .divergence import NumericsDrift
from .kvdepth import ContextFill, kv_depth_text
from .reference import ReferencePhase
from .slots import SlotStudy
from .summary import (
    MAX_LISTED_MISMATCHES,
    Comparison,
    PairStats,
    Record,
    SweepAdvice,
    SweepRecommendation,
    format_step_cost,
)

__all__ = ["ModelInfo", "ServerInfo", "VerifySettings", "VerifyResult", "format_result", "undecoded_arms"]


INTERLEAVE = "both servers resident; requests alternate vanilla/MTP per prompt in ABBA order"


@dataclass(frozen=True)
class VerifySettings:
    """How the verification ran (the ``settings`` section)."""

    draft_n_max: int
    draft_n_min: int | None
    sweep: list[int] | None
    seeds: list[int]
    max_tokens: int
    temperature: float
    ctx_size: int | None
    threads: int | None
    gpu_layers: int | str | None
    parallel: int | None
    limit: int | None
    n_prompts: int
    endpoints: list[str]
    modes: list[str]
    cache_prompt: bool
    batch_size: int
    interleave: str
    bootstrap: BootstrapInfo
    metrics_mismatches: int
    mtp_config: TuneConfig | None
    mtp_flags: list[str]
    mtp_env: dict[str, str] | None
    cache_type_k: str | None = None  # both arms' KV-cache types (None: llama-server's default, f16)
    cache_type_v: str | None = None
    context_fill: ContextFill | None = None  # the neutral prefix every request sat behind
    server_args: dict[str, list[str]] | None = None  # ArmArgs.to_dict(): --server-arg / --mtp- / --vanilla-
    prompt_budget: int | None = None  # the prompts planned; n_prompts is fewer when a look decided the head early
    reference_phase: ReferencePhase | None = None  # its cache key, cached or measured, wall time
    prompt_ids: list[str] | None = None  # the suite's prompts the run measured (a listed mismatch must be of one)
    offload: Offload | None = None  # --n-cpu-moe / --cpu-moe / -ot, every arm alike
    memory: MemoryPlan | None = None  # the GPU memory plan checked before any server started

    @staticmethod
    def bootstrap_of(resamples: int, seed: int) -> BootstrapInfo:
        """The ``bootstrap`` description of a run with these resampling settings."""
        return BootstrapInfo(unit="prompt (seeds pooled; arms paired)", resamples=resamples,
                             rng=f"numpy PCG64 seed {seed}", acceptance="sum(accepted)/sum(drafted)",
                             speedup="(sum mtp tokens/sum mtp decode ms)/(sum vanilla tokens/sum vanilla decode ms)")

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d.update(bootstrap=self.bootstrap.to_dict(VERIFY_BOOTSTRAP_KEYS),
                 mtp_config=self.mtp_config.to_dict() if self.mtp_config is not None else None,
                 context_fill=self.context_fill.to_dict() if self.context_fill is not None else None,
                 reference_phase=self.reference_phase.to_dict() if self.reference_phase is not None else None,
                 memory=self.memory.to_dict() if self.memory is not None else None,
                 offload=self.offload.to_dict() if self.offload is not None else None)
        return copy.deepcopy(d)


@dataclass
class VerifyResult:
    """Everything a verification found. ``comparisons``: :func:`~ggufmtp.measure.verify.summary.summarize`
    of every (k, endpoint, mode); ``tuned``: the sweep's recommendation (only with a sweep);
    ``bandwidth``: :func:`ggufmtp.runtime.hardware.bandwidth_report` of the main comparison."""

    model: ModelInfo
    suite: SuiteInfo
    settings: VerifySettings
    server: ServerInfo
    hardware: HardwareInfo
    thresholds: Thresholds
    modes: list[str]
    draft_n_max: int
    comparisons: list[Comparison]
    verdict: Verdict
    reasons: list[str]
    notes: list[str]
    records: list[Record] = field(default_factory=list)
    tuned: SweepAdvice | None = None
    seconds: float = 0.0
    bandwidth: dict[str, Any] | None = None
    arm_env: dict[str, dict[str, str]] = field(default_factory=dict)  # arm -> the environment it ran with
    default_vanilla_args: list[str] | None = None  # the default vanilla arm's flags, when it ran
    slots: SlotStudy | None = None  # verify --parallel N: acceptance at each slot count (measure.verify.slots)
    numerics: NumericsDrift | None = None  # the drift batching causes, measured when replies differed (divergence)
    head: HeadComparison | None = None  # the head against the reference (verify --reference)
    findings: Findings | None = None  # the verdict's three findings (head, lossless, speed)
    profile: ProfileSource | None = None  # verify --tuned-from: the file the tuned configuration came from

    @property
    def ok(self) -> bool:
        return self.verdict == Verdict.PASS

    def comparison(self, k: int | None = None, endpoint: str = "chat", mode: str | None = None) -> Comparison | None:
        """The comparison of window ``k`` (default: the shipped one), ``endpoint`` and ``mode`` (default: the first)."""
        k = self.draft_n_max if k is None else k
        mode = mode or self.modes[0]
        for c in self.comparisons:
            if c.k == k and c.endpoint == endpoint and c.mode == mode:
                return c
        return None

    @property
    def evidence(self) -> Evidence:
        """How much this run measured, against the minimum a published verdict needs."""
        return Evidence.of_settings(self.settings.to_dict())

    @property
    def placement(self) -> Placement:
        """Where the weights lived: on the GPU, and which partial offload kept some in host memory."""
        return Placement.of(self.hardware.offloaded, self.settings.offload)

    @property
    def speed_checked(self) -> bool:
        """Whether the verdict judged the speedup (weights on the GPU, or --enforce-speedup)."""
        return speed_checked(self.thresholds, self.placement)

    @property
    def main(self) -> Comparison:
        """The headline comparison: chat arm, shipped window, first mode."""
        c = self.comparison()
        assert c is not None
        return c

    @property
    def sweep_ks(self) -> list[int]:
        return sorted({c.k for c in self.comparisons})

    def sweep_rows(self, mode: str | None = None, endpoint: str = "chat") -> list[Comparison]:
        mode = mode or self.modes[0]
        return [c for c in sorted(self.comparisons, key=lambda c: c.k) if c.mode == mode and c.endpoint == endpoint]

    def to_dict(self, requests: bool = False) -> dict[str, Any]:
        """The JSON form (with every request's record when ``requests``)."""
        c = self.main
        d: dict[str, Any] = {
            "verdict": self.verdict.value, "reasons": list(self.reasons), "notes": list(self.notes),
            "model": self.model.to_dict(), "mode": self.modes[0],
            **_mode_numbers(c), **self._identity_numbers(), **self._default_vanilla(c),
            "mismatches": [m.to_dict() for x in self.comparisons for m in x.mismatches][:MAX_LISTED_MISMATCHES],
            **(self.numerics.to_dict() if self.numerics is not None else {}),
            "per_category": _rows(c.per_category), "per_seed": _rows(c.per_seed),
            "modes": {m: self._mode_dict(m) for m in self.modes},
            "raw": ({m: self._mode_dict(m, "raw") for m in self.modes}
                    if self.comparison(endpoint="raw") is not None else None),
            "sweep": self._sweep_dicts() if len(self.sweep_ks) > 1 else None,
            "tuned": self.tuned.to_dict() if self.tuned is not None else None, "bandwidth": self.bandwidth,
            "suite": self.suite.to_dict(), "server": self.server.to_dict(VERIFY_SERVER_KEYS),
            "hardware": self.hardware.to_dict(), "settings": self.settings.to_dict(),
            "thresholds": self.thresholds.to_dict(), "evidence": self.evidence.to_dict(),
            "speed_checked": self.speed_checked, "slots": self.slots.to_dict() if self.slots else None,
            "head": self.head.to_dict() if self.head is not None else None,
            "findings": self.findings.to_dict() if self.findings is not None else None,
            "seconds": round(self.seconds, 2),
        }
        self._add_server_args(d)
        if self.profile is not None:  # the profile as served for this file, with this run's figures
            d["tuned"] = verified_tuned(cast(Verification, d), self.profile)
        if requests:
            d["requests"] = [r.to_dict() for r in self.records]
        return d

    def _add_server_args(self, d: dict[str, Any]) -> None:
        """Each arm's exact llama-server arguments (model and address left out) and environment."""
        flags = self.server.flags
        if flags is None:
            return
        d["mtp"]["server_args"] = list(flags.mtp.get(str(self.draft_n_max)) or [])
        d["mtp"]["server_env"] = dict(self.arm_env.get("mtp") or {})
        d["vanilla"]["server_args"] = list(flags.vanilla)
        d["vanilla"]["server_env"] = dict(self.arm_env.get("vanilla") or {})

    def _identity_numbers(self) -> dict[str, Any]:
        """Identical output over EVERY comparison of the run (each mode, ``--raw``, every sweep
        window): the pairs (requests), and the distinct prompts all of whose replies matched."""
        pairs = sum(x.n_pairs for x in self.comparisons)
        same = sum(x.identical for x in self.comparisons)
        ok_prompts, n_prompts = _prompt_identity(self.records) if self.records else (
            self.main.identical_prompts, self.main.n_prompts)
        return {"identical_output_fraction": same / pairs if pairs else None,
                "identical_outputs": {"identical": same, "pairs": pairs},
                "mismatch_count": pairs - same,
                "identical_prompts": {"identical": ok_prompts, "prompts": n_prompts},
                "identical_prompts_fraction": ok_prompts / n_prompts if n_prompts else None}

    def _default_vanilla(self, c: Comparison) -> dict[str, Any]:
        """The default vanilla arm's figures (absent when it did not run)."""
        if not c.has_default_vanilla:
            return {}
        return {**c.default_vanilla_dict(),
                "default_vanilla": {"tokens_per_second": c.default_vanilla_tokens_per_second,
                                    "server_args": list(self.default_vanilla_args or []),
                                    "label": DEFAULT_VANILLA_LABEL}}

    def _sweep_dicts(self) -> list[dict[str, Any]]:
        return [{**PairStats.to_dict(r), "k": r.k, "mode": r.mode, "identical_output_fraction": r.identical_output_fraction,
                 "mean_accepted_per_draft": r.mean_accepted_per_draft, "n_drafts": r.n_drafts,
                 "tokens_per_step": r.tokens_per_step, "per_position": r.per_position,
                 "mean_acceptance_length": r.mean_acceptance_length, "acceptance_by_position": r.acceptance_by_position,
                 "mismatch_count": r.mismatch_count, **r.default_vanilla_dict()}
                for m in self.modes for r in self.sweep_rows(m)]

    def _mode_dict(self, mode: str, endpoint: str = "chat") -> dict[str, Any] | None:
        c = self.comparison(mode=mode, endpoint=endpoint)
        if c is None:
            return None
        return {**_mode_numbers(c), **c.default_vanilla_dict(), "identical_prompts_fraction": c.identical_prompts_fraction,
                "per_category": _rows(c.per_category), "per_seed": _rows(c.per_seed)}

    def to_receipt(self) -> dict[str, Any]:
        """The receipt's ``predicate.verification`` section (schema ``$defs.verification``)."""
        d = self.to_dict(requests=False)
        d.pop("seconds", None)
        # a receipt names files, never local paths: the model and suite by name, the server's binary
        # by name and without its log
        model = {k: v for k, v in d["model"].items() if k != "path"}
        d["model"] = {**model, "name": Path(self.model.path).name}
        suite = d["suite"]
        if suite.get("path"):
            suite["file"] = Path(suite.pop("path")).name
        suite.pop("path", None)
        server = d["server"]
        server.pop("log", None)
        if server.get("binary"):
            server["binary"] = Path(str(server["binary"])).name
        return d

    def table(self) -> str:
        return format_result(self)


DEFAULT_VANILLA_LABEL = ("vanilla with llama-server's defaults (the run's context size, GPU layers, threads and slots; "
                         "no --server-arg, no tuned -bs/threads/graph optimisation)")


def _prompt_identity(records: Sequence[Record]) -> tuple[int, int]:
    """(prompts all of whose MTP replies equal vanilla's in every comparison, prompts)."""
    van = {(r.k, r.endpoint, r.mode, r.prompt_id, r.seed): r.text for r in records if r.arm == "vanilla"}
    ok: dict[str, bool] = {}
    for r in records:
        key = (r.k, r.endpoint, r.mode, r.prompt_id, r.seed)
        if r.arm == "mtp" and key in van:
            ok[r.prompt_id] = ok.get(r.prompt_id, True) and van[key] == r.text
    return sum(ok.values()), len(ok)


def _arm(c: Comparison) -> dict[str, Any]:
    """The MTP arm's numbers of a comparison."""
    return {
        "acceptance": c.acceptance, "acceptance_ci95": list(c.acceptance_ci95),
        "draft_n": c.draft_n, "draft_n_accepted": c.draft_n_accepted,
        "tokens_per_second": c.mtp_tokens_per_second, "draft_n_max": c.k,
        "n_drafts": c.n_drafts, "mean_accepted_per_draft": c.mean_accepted_per_draft,
        "tokens_per_step": c.tokens_per_step, "per_position": c.per_position,
        "requests_without_drafts": c.requests_without_drafts,
        "mean_acceptance_length": c.mean_acceptance_length, "acceptance_by_position": c.acceptance_by_position,
    }


def _mode_numbers(c: Comparison) -> dict[str, Any]:
    """The headline numbers of a comparison: both arms, speedup (against the equally configured
    vanilla arm), identical output."""
    return {"mtp": _arm(c), "vanilla": {"tokens_per_second": c.vanilla_tokens_per_second},
            "speedup": c.speedup, "speedup_ci95": list(c.speedup_ci95),
            "identical_output_fraction": c.identical_output_fraction}


def _rows(rows: dict[str, PairStats]) -> dict[str, dict[str, Any]]:
    return {k: r.to_dict() for k, r in rows.items()}


# ----------------------------------------------------------------------------- the text table


def _ci_pct(ci: Sequence[float | None] | None) -> str:
    return ci_text(ci, scale=100, digits=2)


def format_result(res: VerifyResult) -> str:
    """verify's human-readable report."""
    lines = _header_lines(res)
    for mode in res.modes:
        if res.comparison(mode=mode) is not None:
            lines += _mode_lines(res, mode)
    if res.slots is not None:
        lines += _slot_lines(res.slots)
    bw = format_bandwidth(res.bandwidth)
    if bw:
        lines.append(bw)
    if res.settings.memory is not None:
        lines.append(res.settings.memory.format())
    lines.append("")
    t = res.thresholds
    head_rule = (f"head non-inferior to {res.head.reference.name} within {res.head.margin * 100:.1f} points"
                 + (f" and acceptance >= {pct(t.min_acceptance)}" if t.absolute_acceptance else "")
                 if res.head is not None else f"min acceptance {pct(t.min_acceptance)}")
    lines.append(f"verdict: {res.verdict.value.upper()}"
                 + (f" -- {res.findings.text()}" if res.findings is not None else "")
                 + f"  (thresholds from {t.source}: {head_rule}, min speedup {times(t.min_speedup)}, identical "
                 f"output >= {pct(t.min_identical)})")
    c = res.main
    lines.append("  verified: " + (f"acceptance {pct(c.acceptance)} and speed {times(c.speedup)} vanilla" if res.speed_checked
                                   else f"MTP head: acceptance {pct(c.acceptance)}; speed not verified on this "
                                        f"hardware: {times(c.speedup)} vanilla"))
    if res.head is not None:
        lines += [f"  head{'' if len(res.modes) == 1 else f' [{m}]'}: {f.text()} against {res.head.reference.name}"
                  for m, f in res.head.findings().items()]
    if res.profile is not None:
        lines.append(f"  recommended ({res.profile.name}'s profile on these bytes): {res.to_dict()['tuned']['why']}")
    lines.append(f"  evidence: {res.evidence.text()}")
    lines += [f"  {'UNDECIDED' if r.startswith('head') and 'inconclusive' in r.split(':')[0] else 'FAIL'} {r}"
              for r in res.reasons]
    lines += [f"  note: {n}" for n in res.notes]
    return "\n".join(lines)


def _slot_lines(study: SlotStudy) -> list[str]:
    """Acceptance per slot count against one slot (verify --parallel N)."""
    out = ["", "slots (s concurrent clients on a server with --parallel s; each arm at the same s)",
           f"{'slots':<14} {'acceptance (95% CI)':<26} {'mtp tok/s':>10} {'vanilla tok/s':>14}  {'speedup':<9} identical"]
    out.append(f"{'1 (reference)':<14} {pct(study.reference_acceptance, 2) + ' ' + _ci_pct(study.reference_ci95):<26}")
    for r in study.rows:
        out.append(f"{r.slots:<14} {pct(r.acceptance, 2) + ' ' + _ci_pct(r.acceptance_ci95):<26} "
                   f"{num(r.mtp_tokens_per_second):>10} {num(r.vanilla_tokens_per_second):>14}  "
                   f"{times(r.speedup):<9} {r.identical}/{r.pairs}")
    return out


def _header_lines(res: VerifyResult) -> list[str]:
    s, hw, srv, st = res.suite, res.hardware, res.server, res.settings
    out = [f"ggufmtp verify {Path(res.model.path).name}  (MTP {res.model.mtp_where}, "
           f"k={res.draft_n_max}" + (f", draft-n-min {st.draft_n_min}" if st.draft_n_min else "") + ")"]
    if st.mtp_config:
        env = " ".join(f"{k}={v}" for k, v in sorted((st.mtp_env or {}).items()))
        out.append(f"MTP arm flags (tuned): {' '.join(st.mtp_flags)}" + (f" (environment {env})" if env else "")
                   + "; the vanilla arm runs with their non-speculative part too (fair baseline)")
    out.append(f"suite {s.name} ({s.n_prompts} prompts: "
               + ", ".join(f"{k} {v}" for k, v in s.categories.items())
               + f"; sha256 {s.sha256[:16]}…)  seeds {', '.join(map(str, st.seeds))}  "
               f"max_tokens {st.max_tokens}  temperature 0, /v1/chat/completions")
    if st.prompt_budget is not None and st.n_prompts < st.prompt_budget:
        out.append(f"measured {st.n_prompts} of the {st.prompt_budget} prompts: a look decided the head there and the "
                   "run stopped (the sequential design, docs/concepts/verification.md)")
    gpu = (f"GPU {hw.gpu}, gpu_layers {hw.gpu_layers} (offloaded)" if hw.offloaded
           else f"no GPU offload (gpu_layers {hw.gpu_layers}" + (f"; GPU present: {hw.gpu}" if hw.gpu else "") + ")")
    out.append(f"server {srv.build_info} (commit {srv.commit}) {srv.binary}")
    out.append(f"hardware {hw.cpu}, {hw.cpu_cores} cores; {gpu}")
    kv = kv_depth_text(st.cache_type_k, st.cache_type_v, st.context_fill)
    return out + ([kv] if kv else []) + _arm_lines(res)


def _arm_lines(res: VerifyResult) -> list[str]:
    """Each arm's exact llama-server arguments, and what the default vanilla arm is."""
    flags = res.server.flags
    if flags is None:
        return []
    env = {a: " ".join(f"{k}={v}" for k, v in sorted(e.items())) for a, e in res.arm_env.items()}
    out = [f"vanilla arm: {' '.join(flags.vanilla)}" + (f" (environment {env['vanilla']})" if env.get("vanilla") else ""),
           f"MTP arm:     {' '.join(flags.mtp.get(str(res.draft_n_max)) or [])}"
           + (f" (environment {env['mtp']})" if env.get("mtp") else "")]
    if res.default_vanilla_args is not None:
        out.append(f"default vanilla arm (for speedup_vs_default_vanilla only): {' '.join(res.default_vanilla_args)}")
    if res.head is not None:
        ref = res.head.reference
        head = f" (-md {ref.head['name']}, sha256 {ref.head['sha256'][:16]}…)" if ref.head is not None else ""
        out.append(f"reference arm: the MTP arm's flags and trunk, drafting with the MTP head of {ref.name} (sha256 "
                   f"{ref.sha256[:16]}…){head}, in its own phase (measured alone first, cached by content); its drafts "
                   "paired with the MTP arm's by prompt and seed, on the same text")
        if ref.bound is not None:
            out.append(f"reference bound to: {ref.bound.text()}")
    return out


def _default_line(c: Comparison) -> list[str]:
    """The speedup against the default vanilla arm, labelled (nothing when it did not run)."""
    if not c.has_default_vanilla:
        return []
    return [f"{'vs default vanilla':<18} {'':<26} {num(c.mtp_tokens_per_second):>10} "
            f"{num(c.default_vanilla_tokens_per_second):>14}  {times(c.speedup_vs_default_vanilla)} "
            f"{ci_text(c.speedup_vs_default_vanilla_ci95)}  (vanilla with llama-server's defaults; the fair figure is "
            "the overall row)"]


def _row_line(name: str, r: PairStats) -> str:
    idle = undecoded_arms(r)
    return (f"{name:<18} {pct(r.acceptance, 2) + ' ' + _ci_pct(r.acceptance_ci95):<26} "
            f"{num(r.mtp_tokens_per_second):>10} {num(r.vanilla_tokens_per_second):>14}  "
            f"{times(r.speedup)} {ci_text(r.speedup_ci95)}"
            + (f"  (nothing decoded on the {idle}: every reply ended at its first token)" if idle else ""))


def undecoded_arms(r: PairStats) -> str:
    """``"MTP arm"``, ``"vanilla arm"`` or ``"MTP and vanilla arms"``: the arms of ``r`` where no
    request decoded (no throughput, so no speedup); ``""`` when both did."""
    arms = [a for a, tps in (("MTP", r.mtp_tokens_per_second), ("vanilla", r.vanilla_tokens_per_second)) if tps is None]
    return f"{' and '.join(arms)} arm{'s' if len(arms) > 1 else ''}" if arms else ""


def _mode_lines(res: VerifyResult, mode: str) -> list[str]:
    c = res.comparison(mode=mode)
    assert c is not None
    out = [""]
    if len(res.modes) > 1:
        out.append(f"mode: {mode} (chat_template_kwargs.enable_thinking={'true' if mode == 'thinking' else 'false'}; "
                   "reported separately, never averaged)")
    out.append(f"{'arm':<18} {'acceptance (95% CI)':<26} {'mtp tok/s':>10} {'vanilla tok/s':>14}  {'speedup (95% CI)'}")
    out.append(_row_line("overall", c))
    out += _default_line(c)
    out += [_row_line(cat, r) for cat, r in c.per_category.items()]
    raw = res.comparison(mode=mode, endpoint="raw")
    if raw is not None:
        out.append(_row_line("raw /completion", raw))
    out.append("per-seed: " + " · ".join(f"seed {sd} → {pct(r.acceptance, 2)}/{times(r.speedup)}"
                                         for sd, r in c.per_seed.items()))
    out += _draft_lines(c, raw)
    rows = res.sweep_rows(mode)
    if len(rows) > 1:
        out += _sweep_lines(res, mode, rows)
    return out


def _draft_lines(c: Comparison, raw: Comparison | None) -> list[str]:
    out = []
    if c.n_drafts:
        pp = c.acceptance_by_position
        out.append(f"drafts: {c.draft_n_accepted}/{c.draft_n} tokens accepted in {c.n_drafts} draft rounds "
                   f"(verification steps); mean acceptance length {num(c.mean_acceptance_length)} "
                   f"(1 + accepted / steps, as llama.cpp and vLLM report it; {num(c.mean_accepted_per_draft)} of "
                   f"{c.k} drafted accepted per step)"
                   + ("; acceptance by position (accepted at i / steps) "
                      + " · ".join(f"{i + 1}: {pct(p)}" for i, p in enumerate(pp)) if pp else ""))
    else:
        out.append("drafts: mean acceptance length n/a (no /metrics draft counts)")
    first = c.mismatches[0] if c.mismatch_count else None
    out.append(f"identical output vs vanilla: {c.identical}/{c.n_pairs} requests ({pct(c.identical_output_fraction)}), "
               f"{c.identical_prompts}/{c.n_prompts} prompts ({pct(c.identical_prompts_fraction)})"
               + (f"; {c.mismatch_count} mismatches, first: {first.prompt_id} seed "
                  f"{first.seed} at char {first.first_difference_at}" if first else "")
               + (f" ({n} explained by numerics: vanilla's margin <= the batching drift)"
                  if (n := sum(bool(x.explained) for x in c.mismatches)) else ""))
    if raw is not None and raw.mismatch_count:
        out.append(f"raw arm identical output: {raw.identical}/{raw.n_pairs}")
    return out


def _sweep_lines(res: VerifyResult, mode: str, rows: list[Comparison]) -> list[str]:
    out = ["", "draft-window sweep (chat arm; each k paired with its own interleaved vanilla requests)",
           f"{'k':<12} {'acceptance (95% CI)':<26} {'mtp tok/s':>10} {'vanilla tok/s':>14}  "
           f"{'speedup (95% CI)':<24} identical"]
    for r in rows:
        name = f"{r.k}" + (" (shipped)" if r.k == res.draft_n_max else "")
        out.append(f"{name:<12} {pct(r.acceptance, 2) + ' ' + _ci_pct(r.acceptance_ci95):<26} "
                   f"{num(r.mtp_tokens_per_second):>10} {num(r.vanilla_tokens_per_second):>14}  "
                   f"{times(r.speedup) + ' ' + ci_text(r.speedup_ci95):<24} "
                   f"{pct(r.identical_output_fraction)}")
    tuned = res.tuned.by_mode.get(mode) if res.tuned is not None else None
    if tuned:
        out += _recommendation_lines(tuned)
    return out


def _recommendation_lines(tuned: SweepRecommendation) -> list[str]:
    out = []
    if tuned.mtp_beats_vanilla:
        near = tuned.within_noise_of
        out.append(f"recommended k = {tuned.recommended_k} ("
                   + ("clearly best: its speedup CI lies above every other window's" if tuned.clear
                      else f"best point estimate; within noise of k = {', '.join(map(str, near))}"
                      if near else "best point estimate") + ")")
    else:
        out.append(f"recommended: MTP off — no window's speedup CI lower bound exceeds 1.0 "
                   f"(best k = {tuned.best_k} at {times(tuned.best_speedup)} {ci_text(tuned.best_speedup_ci95)})")
    sc = format_step_cost(tuned.step_cost)
    if sc:
        out.append(sc)
    out += ["", f"{'profile':<13} {'k':<4} {'acceptance':>10} {'speedup':>9}  {'flags':<44} use"]
    for p in tuned.profiles:
        mark = "" if p.recommended else " (not advised on this hardware)"
        out.append(f"{p.profile:<13} {str(p.k or '—'):<4} {pct(p.acceptance):>10} "
                   f"{times(p.speedup, 2):>9}  {p.flags:<44} {p.use}{mark}")
    return out
