"""``ggufmtp verify``: prove that an MTP GGUF drafts, is lossless, and measure what it buys.

Method
------
Two real llama-servers on the same model stay up side by side: *vanilla* (no speculation) and
*MTP* (``--spec-type draft-mtp --spec-draft-n-max k``, ``--metrics``). Fair baseline: every
non-speculative setting of the MTP arm (``--server-arg``, a tuned configuration's ``-bs``, threads
and CUDA graph optimisation, KV cache types, context size, GPU layers) is the vanilla arm's too
(:class:`ggufmtp.measure.core.options.ArmArgs`), so ``speedup`` is what speculation alone buys. When that
makes the vanilla arm differ from the run's base settings, a third, *default* vanilla arm (the base
settings alone: llama-server's defaults for everything else) runs in the same rotation and
``speedup_vs_default_vanilla`` reports MTP against it. Every prompt of the suite,
under every seed (and every thinking mode, see below), goes to both, one request at a time (batch
size 1, never concurrently: on a small machine two busy servers would slow each other down), in
ABBA order: pair 0 is vanilla then MTP, pair 1 MTP then vanilla, and so on, so slow drift (thermal,
page cache, other tenants) and any "who ran just before" effect cancel between the arms (the loop is
:mod:`ggufmtp.measure.core.arms`, shared with tune, curve and profiles). Each server
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

Statistics (:mod:`ggufmtp.measure.verify.summary` on :mod:`ggufmtp.stats`): acceptance =
sum(accepted) / sum(drafted); speedup = MTP decode throughput / vanilla decode throughput (ratio of
summed tokens over summed decode time); 95% percentile-bootstrap CIs resampling *prompts* (a prompt's seeds pooled, arms paired), 2000
resamples, fixed generator seed 0. Per category and per seed the same, on that subset.

Identity: every file of the model (each shard: the head is in the last) is hashed before the servers
start and checked unchanged after the run (:class:`~ggufmtp.measure.core.records.ServedSet`), so
``model.sha256``/``model.shards`` name the bytes served; a receipt refuses other digests, and a
reference not bound to the source (:mod:`ggufmtp.measure.verify.reference`). With a
``sidecar`` (an MTP-only GGUF, ``ggufmtp sidecar``) the model is its trunk: the MTP arm runs
``-m TRUNK --spec-draft-model SIDECAR --spec-type draft-mtp`` (``-md`` is the short form), the
vanilla arm the trunk alone; the pair must fit and be bound by the sidecar's receipt
(:func:`~ggufmtp.provenance.pair.pair_problem`), and ``model.sidecar`` names the sidecar's sha256,
checked unchanged like the trunk's.

Correctness: at temperature 0 speculative decoding is lossless, so every MTP reply must equal the
vanilla reply to the same request, in every comparison verify makes (chat, ``--raw``, every sweep
window, every mode); ``mismatch_count`` and ``identical_output_fraction`` count the same pairs (all
of them), and ``identical_prompts_fraction`` the prompts whose every reply matched (the seeds do not
change greedy text, so prompts are the independent unit). Lossless holds up to numerics: the MTP
arm's target evaluates k+1 tokens as one batch, vanilla one at a time, and on some models (Gated
DeltaNet: chunked vs recurrent; quantized activations) the logits of the same position then differ
by up to ~0.2 nats, so a near-tie can go the other way. Before the servers stop, each differing reply
is analysed on the vanilla server (:mod:`ggufmtp.measure.verify.divergence`): vanilla's top-2 margin
at the divergence (``margin_nats``) against the drift one-batch evaluation causes on the same run
(``numerics_drift_nats``); a difference whose margin is within the drift is *explained* and does not
count against ``min_identical``.

Thinking: when the chat template reads ``enable_thinking`` (Qwen3.x, GLM-4.5), the suite runs
twice, with ``chat_template_kwargs.enable_thinking`` true and false; the two modes are reported
separately (never averaged) and each must pass. The top-level numbers are those of the first mode.

Verdict policy
--------------
- Drafting must happen: an MTP arm without any ``draft_n`` is a hard error (:class:`VerifyError`),
  not a verdict.
- Acceptance (point estimate, chat arm, k = ``draft_n_max``, every mode) >= ``min_acceptance``
  always applies when a threshold is set (recipe ``[verify]`` or ``--min-acceptance``).
- Outputs identical to vanilla, or different only by numerics (margin <= drift), in at least
  ``min_identical`` of the pairs of EVERY comparison (default 1.0: one unexplained differing reply
  anywhere fails the verdict, naming where and vanilla's margin there).
- Speedup (point estimate) >= ``min_speedup`` applies only when the model is offloaded to a GPU
  (``gpu_layers`` > 0 and llama-server lists a GPU device): a small model on CPU is compute-bound,
  not memory-bound, and MTP is slower there, so on CPU the speedup is reported with a note.
  ``enforce_speedup=True`` applies it anyway.

Sweep
-----
``sweep=[2, 3, 4, 6, 8]`` repeats the MTP arm for each window k (``draft_n_max`` is always
included; each k is paired with fresh vanilla requests interleaved with it). The recommended k is
the one with the highest speedup point estimate among the windows without a mismatch (ties: the
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
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import GgufmtpError, ServerError, VerifyError
from ...fmt import times
from ...gguf.model import GGUFModel, inspect_model
from ...progress import bar as progress_bar
from ...provenance.head import DEFAULT_MARGIN
from ...provenance.receipt import Receipt
from ...provenance.tuned import ProfileSource
from ...provenance.verdict import Thresholds, Verdict, evaluate_verdict, judge, slot_failures
from ...runtime.build import binary_is_ggufmtp_build, binary_version
from ...runtime.hardware import (
    PEAK_BANDWIDTH_ENV,
    HardwareInfo,
    bandwidth_report,
    gpu_layers_requested,
    peak_bandwidth,
    probe_hardware,
)
from ...runtime.memory import plan_for_verify
from ...runtime.server import LlamaServer, ServerConfig, build_command, flags_without, pick_flags
from ..core.arms import MTP, VANILLA
from ..core.options import DEFAULT_MAX_TOKENS, DEFAULT_SEEDS, ArmArgs, TuneConfig, VerifyOptions
from ..core.records import ArmFlags, ModelInfo, ServedFile, ServedSet, ServerInfo
from ..core.suite import Suite, as_suite, modes_for_template
from .divergence import Key, Numerics, TokenReply, analyse_mismatches, annotate, mismatched_pairs, replay_mtp
from .kvdepth import ContextFill, KvDepth, check_kv_depth, fill_context
from .reference import ReferenceArm, ReferencePhase, check_reference_matches, head_comparison, head_stop, reference_phase
from .report import VerifyResult, VerifySettings, format_result, undecoded_arms
from .runner import Runner, check_drafting, warm_up_arm
from .slots import SlotStudy, measure_slots, slot_counts
from .summary import Comparison, Record, SweepAdvice, format_step_cost, recommend, step_cost, summarize

__all__ = [
    "Comparison", "Record", "Thresholds", "Verdict", "VerifyResult", "verify", "evaluate_verdict", "recommend",
    "step_cost", "format_step_cost", "summarize", "format_result", "DEFAULT_SEEDS", "DEFAULT_MAX_TOKENS",
    "VerifyOptions",
]



# ----------------------------------------------------------------------------- options


@dataclass(frozen=True)
class _Plan:
    """verify's checked options: what to run, decided before any server starts."""

    thresholds: Thresholds
    tuned: TuneConfig | None
    draft_n_max: int
    draft_n_min: int | None
    seeds: list[int]
    ks: list[int]
    suite: Suite
    endpoints: list[str]
    arms: ArmArgs
    kv: KvDepth | None = None  # KV-cache types and context depth (kvdepth)
    reference: ReferenceArm | None = None  # the model the head is judged against (measure.verify.reference)
    margin: float = DEFAULT_MARGIN  # the head's non-inferiority margin (provenance.head)


def _plan(o: VerifyOptions) -> _Plan:
    """What to run, from options checked when they were built; what they cannot check alone fails
    here, before anything starts: a peak bandwidth in the environment, the suite."""
    if o.judge.peak_bandwidth_gbs is None and os.environ.get(PEAK_BANDWIDTH_ENV):
        try:
            peak_bandwidth(None)  # a bad figure fails now, not after the run
        except GgufmtpError as e:
            raise VerifyError(str(e)) from e
    st = as_suite(o.suite)  # a bad suite fails before anything starts
    draft_n_max, draft_n_min = o.window
    return _Plan(o.judge.merged_thresholds(), o.tuned, draft_n_max, draft_n_min, list(o.seeds), o.windows,
                 st.limit(o.limit), ["chat", "raw"] if o.raw else ["chat"], o.arm_args(), margin=o.judge.margin)


def _check_model(path: Path) -> Any:
    """The model's inspection report; VerifyError unless it has a complete MTP block."""
    if not path.is_file():
        raise VerifyError(f"model {path}: no such file")
    rep = inspect_model(path)
    if rep.mtp_status != "complete":
        detail = (f"; missing {', '.join(rep.mtp_missing[:4])}" if rep.mtp_missing else "") + \
                 (f"; {'; '.join(rep.mtp_problems)}" if rep.mtp_problems else "")
        raise VerifyError(
            f"model {path}: its MTP block is {rep.mtp_status}{detail}. verify needs a complete MTP (NextN) block: "
            f"llama-server --spec-type draft-mtp cannot draft without one (see `ggufmtp inspect {path}`)")
    return rep


def _check_pair(trunk: Path, sidecar: Path, trunk_receipt: Receipt | None = None) -> Any:
    """A trunk served with an MTP-only sidecar: VerifyError unless they pair
    (:func:`~ggufmtp.provenance.pair.pair_problem`; ``trunk_receipt``: the trunk's, as the command
    read it, else read beside it); the trunk's report with the sidecar's MTP blocks."""
    from ...provenance.pair import pair_problem

    problem = pair_problem(trunk, sidecar, trunk_receipt=trunk_receipt)
    if problem:
        raise VerifyError(f"--sidecar: {problem}")
    rep, head = inspect_model(trunk), inspect_model(sidecar)
    return dataclasses.replace(rep, mtp_block=head.mtp_block, mtp_blocks=head.mtp_blocks)


def _check_tuned_head(path: Path, cfg: TuneConfig | None) -> None:
    """A configuration tune-joint found with a re-typed head (``head``) reproduces only on an artifact
    whose head has that type: VerifyError naming the first MTP tensor of another type (F32 norms and
    routers aside, as llama.cpp keeps them)."""
    if cfg is None or cfg.head is None:
        return
    gm = GGUFModel(path)
    prefixes = tuple(f"blk.{b}." for b in gm.mtp_blocks)
    off = [(n, t.type) for n, t in gm.tensors.items() if n.startswith(prefixes) and t.type not in ("F32", cfg.head)]
    if off:
        raise VerifyError(f"{path.name}: the tuned configuration was found with every MTP tensor at {cfg.head} "
                          f"(tune-joint's head), but {off[0][0]} is {off[0][1]}: quantize the source with tune-joint's "
                          "recipe (--recipe-out) and verify that artifact")


def _mtp_server_config(base: dict[str, Any], k: int, draft_n_min: int | None, cfg: TuneConfig | None,
                       arms: ArmArgs | None = None) -> ServerConfig:
    arms = arms if arms is not None else ArmArgs(tuned=cfg)
    return ServerConfig(**arms.mtp_fields(base, k, draft_n_min))


_TUNED_FLAGS = ("--spec-draft-n-max", "--spec-draft-n-min", "--spec-draft-p-min", "--threads")


def _mtp_only_flags(cfg: TuneConfig | None) -> list[str]:
    """The MTP arm's flags beyond --spec-type draft-mtp, as a tuned configuration sets them (taken
    from the command line :func:`build_command` writes for it; a p-min of 0 is left out)."""
    if cfg is None:
        return []
    command = build_command(_mtp_server_config({"model": "", "ctx_size": None, "parallel": None}, 0, None, cfg),
                            "llama-server", 0)
    names = _TUNED_FLAGS if cfg.draft_p_min else tuple(f for f in _TUNED_FLAGS if f != "--spec-draft-p-min")
    return pick_flags(command, names) + cfg.extra_args()


# ----------------------------------------------------------------------------- the run


@dataclass
class _Servers:
    """What the two servers told about themselves during the run."""

    props: dict[str, Any] = field(default_factory=dict)
    modes: list[str] = field(default_factory=list)
    mtp_flags: dict[str, list[str]] = field(default_factory=dict)
    mtp_build: str | None = None
    vanilla_flags: list[str] = field(default_factory=list)
    default_flags: list[str] | None = None  # the default vanilla arm's, when there is one
    env: dict[str, dict[str, str]] = field(default_factory=dict)  # arm -> environment it ran with
    binary: Path | None = None
    log: str = ""
    fill: ContextFill | None = None  # the neutral prefix of a context depth
    numerics: Numerics | None = None  # the mismatches seen from the vanilla server (divergence)
    reference: ReferencePhase | None = None  # the reference phase, when there is a reference
    mtp_replies: dict[Key, TokenReply | str] = field(default_factory=dict)  # differing MTP replies' token ids


def _vanilla_servers(stack: contextlib.ExitStack, plan: _Plan, base: dict[str, Any],
                     out: _Servers) -> tuple[LlamaServer, LlamaServer | None]:
    """The resident vanilla server (and the default one when the configurations differ), up."""
    van = stack.enter_context(LlamaServer(ServerConfig(**plan.arms.vanilla_fields(base))))
    try:
        out.props = van.props()
    except ServerError as e:
        raise VerifyError(f"vanilla server: GET /props failed: {e}") from e
    default = None
    if plan.arms.differs_from_default:
        default = stack.enter_context(LlamaServer(ServerConfig(**plan.arms.default_fields(base))))
        out.default_flags = flags_without(default.command)
    out.vanilla_flags, out.binary, out.log = flags_without(van.command), van.binary, str(van.log_path)
    out.env[VANILLA] = dict(van.config.env or {})
    return van, default


def _run(plan: _Plan, base: dict[str, Any], max_tokens: int, progress: bool,
         on_record: Callable[[Record], None] | None) -> tuple[Runner, _Servers]:
    """The reference phase first (its server alone, or its cached records), then the main phase: the
    vanilla servers up for the whole run, MTP per window, the suite through every arm; with a
    reference and one window, in stages that stop at the first look deciding the head."""
    out = _Servers()
    phase = reference_phase(plan.reference, _reference_config(plan, base), plan.suite, plan.seeds, max_tokens,
                            plan.kv.depth if plan.kv else 0, progress) if plan.reference is not None else None
    out.reference = phase
    ref_records, ref_fill = (phase.records, phase.fill) if phase is not None else ([], None)
    with contextlib.ExitStack() as stack:
        van, default = _vanilla_servers(stack, plan, base, out)
        out.modes = modes = modes_for_template(out.props.get("chat_template"))
        suite, out.fill = fill_context(plan.suite, van, plan.kv.depth if plan.kv else 0)
        check_reference_matches(ref_records, ref_fill, out.fill.sha256 if out.fill else None, modes)
        plan = dataclasses.replace(plan, suite=suite)
        total = (len(plan.ks) * len(plan.seeds) * len(modes) * len(plan.suite.prompts) * len(plan.endpoints)
                 * (2 + (default is not None)))
        bar = stack.enter_context(progress_bar(total, "verify", "req", enabled=progress))
        for mode in modes:
            warm_up_arm(van, plan.suite.prompts[0], mode, "vanilla", None)
            if default is not None:
                warm_up_arm(default, plan.suite.prompts[0], mode, "default vanilla", None)
        runner = Runner(plan.suite, plan.seeds, modes, plan.endpoints, max_tokens, bar, on_record)
        stop = head_stop(plan.reference, runner.records, ref_records, plan.draft_n_max, plan.margin,
                         len(plan.suite.prompts)) if plan.reference is not None and len(plan.ks) == 1 else None
        for k in plan.ks:
            with LlamaServer(_mtp_server_config(base, k, plan.draft_n_min, plan.tuned, plan.arms)) as mtp:
                out.mtp_flags[str(k)] = flags_without(mtp.command)
                out.env[MTP] = dict(mtp.config.env or {})
                try:
                    out.mtp_build = mtp.build_info
                except ServerError as e:
                    raise VerifyError(f"MTP server (k={k}): GET /props failed: {e}") from e
                for mode in modes:
                    check_drafting(mtp, warm_up_arm(mtp, plan.suite.prompts[0], mode, "MTP", k), k)
                runner.run_k(k, van, mtp, default, stop=stop)
                # before the MTP server stops: the token ids of its replies that differ (those the result lists)
                listed = mismatched_pairs(runner.records, plan.ks, plan.endpoints, modes)
                out.mtp_replies.update(replay_mtp(mtp, plan.suite, [p for p in listed if p[1].k == k], max_tokens))
        runner.records.extend(ref_records)
        # before the vanilla server stops: is each differing reply a numerics divergence?
        out.numerics = analyse_mismatches(van, plan.suite, mismatched_pairs(runner.records, plan.ks, plan.endpoints,
                                                                            modes), max_tokens, out.mtp_replies)
    return runner, out


def _reference_config(plan: _Plan, base: dict[str, Any]) -> ServerConfig | None:
    """The reference arm's server: the MTP arm's configuration at the shipped window (the artifact's
    trunk), drafting with the reference's head (``-md``, :func:`~.reference.reference_head`)."""
    if plan.reference is None:
        return None
    arms = dataclasses.replace(plan.arms, draft_model=str(plan.reference.head.path))
    return _mtp_server_config(base, plan.draft_n_max, plan.draft_n_min, plan.tuned, arms)




def _parse_build_commit(build_info: str | None) -> str | None:
    if not build_info:
        return None
    m = re.match(r"^b\d+-([0-9a-fA-F]+|unknown)$", build_info.strip())
    return m.group(1) if m else None


def _server_info(srv: _Servers) -> ServerInfo:
    build_info = srv.props.get("build_info")
    template = srv.props.get("chat_template")
    version: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        version = binary_version(srv.binary)
        info = binary_is_ggufmtp_build(srv.binary)
        if info is not None:
            version["variant"] = info.variant
            version["build_flags"] = info.build_flags
    return ServerInfo(
        build_info=build_info, binary=str(srv.binary),
        commit=_parse_build_commit(build_info) or version.get("commit"), version=version.get("version"),
        variant=version.get("variant"), flags=ArmFlags(srv.vanilla_flags, srv.mtp_flags),
        mtp_build_info=srv.mtp_build,
        chat_template_sha256=hashlib.sha256((template or "").encode()).hexdigest() if template else None,
        thinking_modes=srv.modes, log=srv.log)


def _settings(plan: _Plan, o: VerifyOptions, base: dict[str, Any], modes: list[str], runner: Runner,
              fill: ContextFill | None = None, reference: ReferencePhase | None = None) -> VerifySettings:
    cfg = plan.tuned
    return VerifySettings(
        draft_n_max=plan.draft_n_max, draft_n_min=plan.draft_n_min, sweep=plan.ks if len(plan.ks) > 1 else None,
        seeds=plan.seeds, max_tokens=o.max_tokens, temperature=0.0, ctx_size=base["ctx_size"],
        threads=base["threads"], gpu_layers=base["gpu_layers"], parallel=base["parallel"], limit=o.limit,
        n_prompts=runner.stopped_at or len(plan.suite.prompts), prompt_budget=len(plan.suite.prompts),
        endpoints=["/v1/chat/completions"] + (["/completion"] if o.raw else []),
        modes=modes,
        cache_prompt=False, batch_size=1,
        interleave=("the reference alone first (its own phase, cached by content); then " if plan.reference else "")
                   + "both servers resident; requests alternate vanilla/MTP per prompt in ABBA order"
                   + ("; the default vanilla arm rotates with them (V M D, D M V, ...)"
                      if plan.arms.differs_from_default else ""),
        bootstrap=VerifySettings.bootstrap_of(o.judge.bootstrap_resamples, o.judge.bootstrap_seed),
        metrics_mismatches=runner.metrics_mismatches,
        mtp_config=cfg, mtp_flags=_mtp_only_flags(cfg),
        mtp_env=cfg.env() if cfg is not None else None, server_args=plan.arms.to_dict(),
        cache_type_k=plan.kv.cache_type_k if plan.kv else None, cache_type_v=plan.kv.cache_type_v if plan.kv else None,
        context_fill=fill, reference_phase=reference,
        prompt_ids=[p.id for p in plan.suite.prompts[:runner.stopped_at or len(plan.suite.prompts)]])


def _notes(runner: Runner, comparisons: Sequence[Comparison], gpu_layers: int | str | None,
           hw: HardwareInfo, binary: Path | None, arms: ArmArgs, c0: Comparison) -> list[str]:
    """What the reader of a verdict should know beyond the thresholds (``c0``: the main comparison)."""
    notes = arms.notes()
    if c0.has_default_vanilla:
        notes.append(f"speedup {times(c0.speedup)} is against vanilla with the same non-speculative settings "
                     f"(fair); against vanilla with llama-server's defaults it is {times(c0.speedup_vs_default_vanilla)} "
                     "(speedup_vs_default_vanilla: that figure includes what the settings give plain decoding too)")
    if runner.metrics_mismatches:
        notes.append(f"{runner.metrics_mismatches} MTP request(s) whose /metrics deltas disagreed with their "
                     "timings: per-position acceptance left out for them")
    nodraft = sum(c.requests_without_drafts for c in comparisons)
    if nodraft:
        notes.append(f"{nodraft} MTP request(s) drafted nothing (e.g. replies of one or two tokens)")
    for c in comparisons:
        if idle := undecoded_arms(c):
            where = ", ".join([f"k={c.k}", "raw /completion" if c.endpoint == "raw" else "chat"]
                              + ([c.mode] if c.mode != "default" else []))
            notes.append(f"{where}: nothing was decoded on the {idle} (every reply ended at its first token): "
                         "no decode throughput and no speedup there (n/a): not measured")
    if gpu_layers_requested(gpu_layers) and not hw.offloaded:
        notes.append(f"gpu_layers {gpu_layers} requested but this llama-server lists no GPU device "
                     f"({binary}): it ran on CPU; build one with `ggufmtp runtime build --cuda`")
    return notes


def _sweep_recommendation(res: VerifyResult, path: Path, gpu_layers: int | str | None,
                          ctx_size: int | None) -> SweepAdvice:
    """The sweep's recommendation per mode, the first mode's on top with its command line (in
    llama-server's short flag spelling, to paste)."""
    th = res.thresholds
    by_mode = {mode: dataclasses.replace(recommend(res.sweep_rows(mode), th.min_identical),
                                         step_cost=step_cost(res.sweep_rows(mode))) for mode in res.modes}
    k = by_mode[res.modes[0]].recommended_k
    ngl = f" -ngl {gpu_layers}" if gpu_layers is not None else ""
    plain = f"llama-server -m {path.name}{ngl} -c {ctx_size or 4096}"
    command = (f"{plain} --spec-type draft-mtp --spec-draft-n-max {k}"
               if k is not None else f"{plain}  # MTP off: no window beat vanilla here")
    return SweepAdvice(mode=res.modes[0], command=command, by_mode=by_mode)


def _summaries(records: Sequence[Record], plan: _Plan, modes: list[str], resamples: int,
               boot_seed: int) -> list[Comparison]:
    """:func:`summarize` of every (k, endpoint, mode), in that order."""
    if not any(r.draft_n for r in records if r.arm == MTP):
        raise VerifyError("speculation did not run: no MTP-arm response reported timings.draft_n > 0")
    return [summarize([r for r in records if r.k == k and r.endpoint == endpoint and r.mode == mode],
                      plan.suite.categories, resamples, boot_seed)
            for k in plan.ks for endpoint in plan.endpoints for mode in modes]


def _judge(res: VerifyResult, notes: list[str]) -> None:
    """Set the verdict, its reasons and notes (``notes`` after the policy's own)."""
    per_mode = {mode: res.comparison(mode=mode) for mode in res.modes}
    assert all(c is not None for c in per_mode.values())
    drift = res.numerics
    j = judge(per_mode, res.thresholds, res.placement, res.comparisons,  # type: ignore[arg-type]
              drift.drift_nats if drift else None, drift.positions if drift else 0,
              res.head.findings() if res.head is not None else None)
    j.lossless.extend(slot_failures(res.slots.to_dict() if res.slots else None, res.thresholds))
    res.verdict, res.reasons, res.notes, res.findings = j.verdict, j.reasons, j.notes + notes, j.findings


def _slots(plan: _Plan, base: dict[str, Any], parallel: int | None, mode: str, max_tokens: int,
           comparisons: Sequence[Comparison], progress: bool, boot: tuple[int, int]) -> SlotStudy | None:
    """The slot study of ``verify --parallel N`` (:mod:`ggufmtp.measure.verify.slots`) against the main
    comparison (chat, the shipped window, the first mode); None for one slot."""
    if not parallel or parallel < 2:
        return None
    c0 = next(c for c in comparisons if (c.k, c.endpoint, c.mode) == (plan.draft_n_max, "chat", mode))
    at = lambda s: {**base, "parallel": s, "ctx_size": base["ctx_size"] and base["ctx_size"] * s}  # noqa: E731
    jobs = [(p, seed) for seed in plan.seeds for p in plan.suite.prompts]
    return measure_slots(slot_counts(parallel), lambda s: ServerConfig(**plan.arms.vanilla_fields(at(s))),
                         lambda s: _mtp_server_config(at(s), plan.draft_n_max, plan.draft_n_min, plan.tuned, plan.arms),
                         jobs, mode, max_tokens, (c0.acceptance, c0.acceptance_ci95), progress, *boot)


def _with_kv_depth(plan: _Plan, base: dict[str, Any], cache_type_k: str | None, cache_type_v: str | None,
                   depth: int, max_tokens: int) -> tuple[_Plan, dict[str, Any]]:
    """The KV-cache types and context depth checked before any server starts
    (:func:`~ggufmtp.measure.verify.kvdepth.check_kv_depth`), in the plan and in every arm's base settings."""
    a = plan.arms
    kv = check_kv_depth(cache_type_k, cache_type_v, depth, base["model"], base["ctx_size"], base["parallel"], max_tokens,
                        plan.suite, base["llama_cpp_bin"], [*base["extra_args"], *a.both, *a.mtp, *a.vanilla])
    return dataclasses.replace(plan, kv=kv), {**base, **kv.server_fields(base["extra_args"])}


def verify(model: str | os.PathLike, options: VerifyOptions | None = None, *,
           receipt: str | os.PathLike | Receipt | None = None,
           progress: bool = True, on_record: Callable[[Record], None] | None = None,
           profile: ProfileSource | None = None) -> VerifyResult:
    """Run the vanilla and MTP arms on the GGUF at ``model`` (a path) with ``options`` (default:
    :class:`VerifyOptions`'s, the command line's) and judge the result (see the module docstring).
    ``on_record`` is called after each request; ``receipt`` (read only, a path or the receipt the
    command read; default: beside it) names its source. ``profile``: the file ``options.tuned`` was
    read from (``verify --tuned-from``, :func:`~ggufmtp.measure.tune.run.load_tuned_profile`): the
    result then records the profile as served for this file, with this run's figures (``tuned``).

    Raises :class:`VerifyError` when the model has no complete MTP block, a server fails or dies, or
    the MTP arm never drafts; servers are stopped on every path.
    """
    o = options if options is not None else VerifyOptions()
    if profile is not None and o.tuned is None:
        raise VerifyError(f"{profile.name}: a tuned profile's source without its configuration (options.tuned)")
    t0 = time.monotonic()
    plan = _plan(o)
    path = Path(model)
    rep = (_check_model(path) if o.sidecar is None
           else _check_pair(path, Path(o.sidecar), receipt if isinstance(receipt, Receipt) else None))
    if o.sidecar is None:
        _check_tuned_head(path, o.tuned)
    base = o.server.base_fields(model=path, ctx_size=o.ctx_size, parallel=1)
    plan, base = _with_kv_depth(plan, base, o.cache_type_k, o.cache_type_v, o.context_fill, o.max_tokens)
    served = ServedSet.of(path)  # the bytes llama-server is about to serve: every shard of a split model
    side = ServedFile.of(o.sidecar) if o.sidecar is not None else None
    if o.reference is not None:
        plan = dataclasses.replace(plan, reference=ReferenceArm.of(o.reference, served, receipt, _check_model))
    memory = plan_for_verify(path, o)  # every phase against the GPUs' free memory, before any server starts
    memory.refuse_unless_fits("serving")
    runner, srv = _run(plan, base, o.max_tokens, progress, on_record)
    boot = (o.judge.bootstrap_resamples, o.judge.bootstrap_seed)
    comparisons = _summaries(runner.records, plan, srv.modes, *boot)
    annotate(comparisons, srv.numerics)
    slots = _slots(plan, base, o.parallel, srv.modes[0], o.max_tokens, comparisons, progress, boot)
    served.check_unchanged()
    if side is not None:
        side.check_unchanged()
    head = None
    if plan.reference is not None:
        plan.reference.check_unchanged()
        head = head_comparison(runner.records, plan.reference, plan.draft_n_max, plan.margin, len(plan.suite.prompts),
                               o.max_tokens)
    gpu_layers = o.server.gpu_layers
    hw = probe_hardware(srv.binary, gpu_layers)
    res = VerifyResult(
        model=ModelInfo(str(path), served.first.size, rep.architecture, rep.mtp_block, rep.file_type, served.first.sha256,
                        rep.mtp_blocks, {"name": side.path.name, "sha256": side.sha256} if side else None,
                        served.shards()),
        suite=plan.suite.info(),
        settings=dataclasses.replace(_settings(plan, o, base, srv.modes, runner, srv.fill, srv.reference),
                                     offload=o.server.offload, memory=memory),
        server=_server_info(srv), hardware=hw, thresholds=plan.thresholds, modes=srv.modes,
        arm_env=srv.env, default_vanilla_args=srv.default_flags,
        draft_n_max=int(plan.draft_n_max), comparisons=comparisons, verdict=Verdict.PASS, reasons=[], notes=[],
        records=runner.records, slots=slots, numerics=srv.numerics.drift if srv.numerics else None, head=head,
        profile=profile)
    notes = _notes(runner, comparisons, gpu_layers, hw, srv.binary, plan.arms, res.main)
    notes += plan.reference.notes() if plan.reference is not None else []
    if len(plan.ks) > 1:
        res.tuned = _sweep_recommendation(res, path, gpu_layers, o.ctx_size)
    try:
        res.bandwidth = bandwidth_report(path, hw.to_dict(), {"vanilla": res.main.vanilla_tokens_per_second,
                                                              "mtp": res.main.mtp_tokens_per_second},
                                         o.judge.peak_bandwidth_gbs)
    except GgufmtpError as e:  # a measured run is worth more than its bandwidth line
        notes.append(f"bandwidth fraction not computed: {e}")
    _judge(res, notes)
    res.seconds = time.monotonic() - t0
    return res
