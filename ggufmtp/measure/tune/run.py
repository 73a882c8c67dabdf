"""``ggufmtp tune``: search the llama-server settings that matter for MTP on this hardware.

:func:`tune` measures candidate :class:`~ggufmtp.measure.core.options.TuneConfig` configurations
(with :class:`~ggufmtp.measure.tune.options.TuneOptions`: the budget, the requests, the servers) by
successive halving (the search space and schedule: :mod:`ggufmtp.measure.tune.search`; the
requests: :mod:`ggufmtp.measure.tune.bench`), ranks the final ones and recommends one
(:mod:`ggufmtp.measure.tune.rank`). ``command`` is the exact llama-server command line that was
measured (the binary named ``llama-server``, the model's path, every flag except
``--host``/``--port``); when no configuration beats vanilla with confidence it is the vanilla
command, and ``mtp_command`` still gives the best MTP configuration found.
:func:`load_tuned_config` reads a tuned configuration back (:func:`ggufmtp._api.store_in_receipt`
adds tune's, curve's and profiles' results to a receipt: the measurement layer writes none).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import shlex
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from ...errors import AuditError, FatalTuneError, ServerError, TuneError
from ...files.hashing import sha256_file
from ...files.jsonfile import read_json_file
from ...fmt import ci_text, pct, times
from ...progress import bar as progress_bar
from ...provenance.receipt import read_receipt
from ...provenance.signing import is_envelope
from ...provenance.tuned import TUNE_JOINT_KIND, TUNE_KIND, ProfileSource
from ...runtime.hardware import HardwareInfo, probe_hardware
from ...runtime.server import LlamaServer, ServerConfig, display_command
from ..core.options import ArmArgs, TuneConfig
from ..core.records import TUNE_BOOTSTRAP_KEYS, TUNE_MODEL_KEYS, TUNE_SERVER_KEYS, BootstrapInfo, ModelInfo, ServerInfo
from ..core.suite import modes_for_template
from .bench import (
    DEFAULT_CTX_PER_SLOT,
    DEFAULT_MAX_TOKENS,
    WARMUP_TOKENS,
    Bench,
    ServerEvaluator,
    TuneSetup,
    prepare,
)
from .options import DEFAULT_BUDGET, SearchOptions, TuneOptions
from .rank import ConfigRow, Recommendation, rank_configs, recommend_config
from .search import (
    ConfigStatus,
    Rung,
    SearchSpace,
    SHResult,
    candidate_space,
    final_rung_units,
    fit_schedule,
    inert_draft_limits,
    order_candidates,
    schedule_cost,
    search_anchors,
    successive_halving,
)

__all__ = ["TuneError", "FatalTuneError", "TuneConfig", "TuneOptions", "SearchOptions", "TuneResult", "tune",
           "format_tune", "load_tuned_config", "load_tuned_profile", "TunedProfile", "DEFAULT_BUDGET",
           "DEFAULT_MAX_TOKENS", "DEFAULT_CTX_PER_SLOT"]


# ----------------------------------------------------------------------------- result


@dataclass(frozen=True)
class RungPlan:
    """One planned rung: how many configurations, each measured on how many units."""

    configs: int
    units: int


@dataclass(frozen=True)
class TuneSchedule:
    """How the successive halving ran (the ``schedule`` object of tune's JSON)."""

    method: str
    eta: int
    units0: int
    final_size: int
    final_units: int | None
    final_on_suite: bool
    n_candidates: int
    n_searched: int
    budget: int
    evaluations: int
    planned_evaluations: int
    unit_cost: int
    unit: str
    plan: list[RungPlan]
    rungs: list[Rung]
    server_starts: int
    order: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class TuneSettings:
    """What every measurement of a tune run shared (the ``settings`` object of tune's JSON)."""

    suite: str
    suite_sha256: str
    n_prompts: int
    seeds: list[int]
    max_tokens: int
    temperature: float
    mode: str
    ctx_per_slot: int
    threads: int | None
    gpu_layers: int | str | None
    cache_prompt: bool
    speedup: str
    interleave: str
    bootstrap: BootstrapInfo

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["bootstrap"] = self.bootstrap.to_dict(TUNE_BOOTSTRAP_KEYS)
        return d


@dataclass
class TuneResult:
    """What :func:`tune` measured and recommends; :meth:`to_dict` is the receipt's ``verification.tuned``."""

    model: ModelInfo
    concurrency: int
    space: SearchSpace
    schedule: TuneSchedule
    rows: list[ConfigRow]
    recommendation: Recommendation
    command: str
    mtp_command: str | None
    vanilla_command: str
    settings: TuneSettings
    hardware: HardwareInfo
    server: ServerInfo
    notes: list[str]
    seconds: float = 0.0
    vanilla_commands: dict[str, str] = dataclasses.field(default_factory=dict)  # final config -> its fair vanilla
    kind: str = TUNE_KIND  # the search that ran: tune, or tune-joint's joint stage (TUNE_JOINT_KIND)

    @property
    def final_rows(self) -> list[ConfigRow]:
        return [r for r in self.rows if r.status == ConfigStatus.FINAL]

    def to_dict(self) -> dict[str, Any]:
        """The receipt's ``verification.tuned`` object (``command`` is what the model card shows)."""
        rec = self.recommendation.to_dict()
        return {
            "kind": self.kind,
            "command": self.command,
            "mtp_command": self.mtp_command,
            "vanilla_command": self.vanilla_command,
            "vanilla_commands": dict(self.vanilla_commands),
            **{k: rec.get(k) for k in ("recommended", "recommended_config", "best", "best_config", "speedup",
                                       "speedup_ci95", "acceptance", "mtp_beats_vanilla", "clear",
                                       "within_noise_of", "why", "rule")},
            "concurrency": self.concurrency,
            "model": self.model.to_dict(TUNE_MODEL_KEYS),
            "space": self.space.to_dict(),
            "schedule": self.schedule.to_dict(),
            "ranking": [r.to_dict() for r in self.rows],
            "settings": self.settings.to_dict(),
            "hardware": self.hardware.to_dict(),
            "server": self.server.to_dict(TUNE_SERVER_KEYS),
            "notes": list(self.notes),
            "seconds": round(self.seconds, 2),
        }

    def table(self, head: str | None = None) -> str:
        return format_tune(self, head)


def format_tune(res: TuneResult, head: str | None = None) -> str:
    """The human-readable report of a tune run, headed by the search that ran (``res.kind``) and,
    for the joint search, the ``head`` chosen."""
    sch, st, hw = res.schedule, res.settings, res.hardware
    L = [f"{res.kind} {Path(res.model.path).name}  ({f'head {head}; ' if head else ''}concurrency {res.concurrency}; "
         f"{'GPU ' + str(hw.gpu) + ', gpu_layers ' + str(hw.gpu_layers) if hw.offloaded else 'CPU, no GPU offload'})",
         f"search: {res.space.n_candidates} candidates, {sch.n_searched} searched by successive halving "
         f"(eta {sch.eta}, {len(sch.rungs)} rungs, units {' -> '.join(str(r.units) for r in sch.rungs)}"
         f"{', the last = the whole suite' if sch.final_on_suite else ''}); "
         f"{sch.evaluations}/{sch.budget} evaluations; suite {st.suite} x seeds "
         f"{','.join(map(str, st.seeds))}, max_tokens {st.max_tokens}"]
    L += [f"  note: {n}" for n in res.space.notes if n not in res.notes]
    L += ["", f"{'configuration':<40} {'status':<12} {'units':>5} {'acceptance':>10} {'median':>8}  "
              f"{'speedup (95% CI)':<26}"]
    shown = 0
    for r in res.rows:
        if r.status == ConfigStatus.ELIMINATED and shown >= 12:
            continue
        L.append(_row_line(r))
        shown += 1
    if len(res.rows) > shown:
        L.append(f"... {len(res.rows) - shown} more configurations eliminated at rung 0 (see --json)")
    rec = res.recommendation
    L += ["", f"recommended: {rec.recommended} ({rec.why})" if rec.recommended else f"recommended: MTP off -- {rec.why}",
          f"rule: {rec.rule}", "", "command:", f"  {res.command}"]
    if res.mtp_command and res.mtp_command != res.command:
        L += ["best MTP configuration (not recommended here):", f"  {res.mtp_command}"]
    L += [f"note: {n}" for n in res.notes]
    return "\n".join(L)


def _row_line(r: ConfigRow) -> str:
    """One configuration's line of the tune table."""
    status = str(r.status) if r.status != ConfigStatus.ELIMINATED else f"out@rung{r.rung}"
    if r.status == ConfigStatus.DROPPED:
        status = "DROPPED"
    elif r.merged_into:
        status = f"same@rung{r.rung}"
    return (f"{r.key:<40} {status:<12} {r.units:>5} {pct(r.acceptance, space=False):>10} "
            f"{times(r.median_speedup, sign='x'):>8}  "
            f"{times(r.speedup, sign='x') + ' ' + ci_text(r.speedup_ci95, sep='-'):<26}"
            + (f"  {r.reason}" if r.status == ConfigStatus.DROPPED else "")
            + (f"  drafted as {r.merged_into}" if r.merged_into else ""))


# ----------------------------------------------------------------------------- tune()


class _Schedule(NamedTuple):
    """The successive-halving settings of one run."""

    budget: int
    units0: int
    eta: int
    final_size: int
    max_units: int
    unit_cost: int
    final_units: int | None

    def fit(self, n_candidates: int) -> tuple[int, int, list[tuple[int, int]]]:
        return fit_schedule(n_candidates, self.budget, self.units0, self.eta, self.final_size, self.max_units,
                            self.unit_cost, self.final_units)


class _Search(NamedTuple):
    """What the servers' part of a run produced."""

    sh: SHResult
    evaluator: ServerEvaluator
    vanilla_measured: str  # the vanilla server's command line as run
    build_info: str | None
    mode: str


def tune(model: str | os.PathLike, options: TuneOptions | None = None, *, progress: bool = True,
         log: Callable[[str], None] | None = None) -> TuneResult:
    """Search MTP server settings for ``model`` (a GGUF path) with ``options`` (:class:`TuneOptions`:
    the concurrency, the budget, the requests, the space and schedule, the servers' settings).
    ``log``: the search's progress lines (default: stderr when ``progress``)."""
    o = options if options is not None else TuneOptions()
    t0 = time.monotonic()
    seeds, concurrency, gpu_layers = list(o.seeds), o.concurrency, o.server.gpu_layers
    arms = o.server.arm_args()
    setup = prepare(model, o.suite, o.limit, o.server.llama_cpp_bin)
    hw = probe_hardware(setup.binary, gpu_layers)
    ordered, space = _candidates(o.search, concurrency, hw, setup.flags)
    notes = _setup_notes(space, gpu_layers, hw, concurrency, len(setup.suite.prompts)) + arms.notes()
    n_prompts = len(setup.suite.prompts)
    unit_cost = len(seeds) * concurrency
    s = o.search
    final_units = final_rung_units(s.final_on_suite, len(ordered), o.budget, s.units0, s.eta, s.final_size, n_prompts,
                                   unit_cost, math.ceil(n_prompts / concurrency), notes)
    sched = _Schedule(o.budget, s.units0, s.eta, s.final_size, n_prompts, unit_cost, final_units)
    base = o.server.base_fields(model=setup.path)
    van_cfg = ServerConfig(**arms.vanilla_fields({**base, "parallel": concurrency,
                                                  "ctx_size": o.ctx_per_slot * concurrency}))
    log = log or ((lambda m: print(m, file=sys.stderr)) if progress else None)
    run = _serve_and_search(setup, base, van_cfg, ordered, sched, seeds, o.mode, o.max_tokens, concurrency,
                            o.ctx_per_slot, progress, log, notes, arms, o.heads)
    rows = rank_configs(run.sh, o.bootstrap_resamples)
    rec = recommend_config(rows)
    if all(r.status == ConfigStatus.DROPPED for r in rows):
        raise TuneError("every configuration was dropped: "
                        + "; ".join(f"{r.key}: {r.reason}" for r in rows[:4]))
    vanilla_command = display_command(van_cfg, setup.binary)
    mtp_command = (display_command(run.evaluator.server_config(rec.best_config), setup.binary)
                   if rec.best_config else None)
    _outcome_notes(rows, rec, run.sh, notes)
    return TuneResult(
        model=ModelInfo(str(setup.path), setup.path.stat().st_size, setup.report.architecture,
                        setup.report.mtp_block, mtp_blocks=setup.report.mtp_blocks),
        concurrency=concurrency, space=space,
        schedule=_schedule_record(run, sched, len(ordered), concurrency, s.order_seed), rows=rows,
        recommendation=rec, command=mtp_command if rec.recommended else vanilla_command, mtp_command=mtp_command,
        vanilla_command=vanilla_command,
        settings=_settings_record(setup, o, seeds, run.mode),
        hardware=hw, server=_server_record(setup, run, rows), notes=notes, seconds=time.monotonic() - t0,
        vanilla_commands=_vanilla_commands(run, rows))


def _candidates(s: SearchOptions, concurrency: int, hw: HardwareInfo,
                flags: frozenset[str]) -> tuple[list[TuneConfig], SearchSpace]:
    """The candidates in search order and the space's description: the given list, else the built-in space."""
    if s.candidates is None:
        return _builtin_order(concurrency, hw, flags, s.n_max_values, s.n_min_values, s.p_min_values, s.order_seed)
    ordered = list(dict.fromkeys(s.candidates))
    if not ordered:
        raise TuneError("candidates: empty")
    return ordered, SearchSpace(n_candidates=len(ordered), notes=["custom candidate list"], custom=True)


def _vanilla_commands(run: _Search, rows: Sequence[ConfigRow]) -> dict[str, str]:
    """Each final configuration's fair vanilla command line (display form)."""
    known = run.evaluator.vanilla_commands
    return {r.key: _display(known[r.key]) for r in rows if r.status == ConfigStatus.FINAL and r.key in known}


def _display(command: str) -> str:
    """A command line as run, in the display form: ``llama-server`` for the binary, no host/port."""
    argv = shlex.split(command)
    out, skip = ["llama-server"], False
    for a in argv[1:]:
        if skip:
            skip = False
        elif a in ("--host", "--port"):
            skip = True
        else:
            out.append(a)
    return shlex.join(out)


def _server_record(setup: TuneSetup, run: _Search, rows: Sequence[ConfigRow]) -> ServerInfo:
    """The ``server`` object of tune's JSON: the binary, its build, and the command lines as run."""
    final = {r.key for r in rows if r.status == ConfigStatus.FINAL}
    return ServerInfo(binary=str(setup.binary), build_info=run.build_info, vanilla=run.vanilla_measured,
                      measured_commands={k: v for k, v in run.evaluator.commands.items() if k in final})


def _builtin_order(concurrency: int, hw: HardwareInfo, flags: frozenset[str], n_max_values: Sequence[int],
                   n_min_values: Sequence[int], p_min_values: Sequence[float],
                   order_seed: int) -> tuple[list[TuneConfig], SearchSpace]:
    """The built-in candidate space in search order (anchors first), and its description."""
    cuda = any(d.upper().startswith("CUDA") for d in hw.server_devices)
    space_all, space = candidate_space(concurrency, hw.offloaded, flags, n_max_values, n_min_values, p_min_values,
                                       cuda)
    return order_candidates(space_all, order_seed, search_anchors(space_all)), space


def _setup_notes(space: SearchSpace, gpu_layers: int | str | None, hw: HardwareInfo, concurrency: int,
                 n_prompts: int) -> list[str]:
    """The notes known before the search: skipped dimensions, CPU runs, a suite shorter than a batch."""
    notes = [n for n in space.notes if "not searched" in n]
    if gpu_layers is not None and not hw.offloaded:
        notes.append(f"gpu_layers {gpu_layers} requested but this llama-server lists no GPU device: it ran on CPU")
    if not hw.offloaded:
        notes.append("CPU run: a small model is compute-bound on CPU, so speedups here say little about a GPU")
    if concurrency > 1 and n_prompts < concurrency:
        notes.append(f"the suite has {n_prompts} prompts < concurrency {concurrency}: prompts repeat within a batch")
    return notes


def _serve_and_search(setup: TuneSetup, base: dict[str, Any], van_cfg: ServerConfig, ordered: Sequence[TuneConfig],
                      sched: _Schedule, seeds: list[int], mode: str | None, max_tokens: int, concurrency: int,
                      ctx_per_slot: int, progress: bool, log: Callable[[str], None] | None,
                      notes: list[str], arms: ArmArgs | None = None,
                      heads: Mapping[str, str | os.PathLike] | None = None) -> _Search:
    """Start the resident vanilla server, warm it up and run the successive halving against it."""
    total = schedule_cost(sched.fit(len(ordered))[2], sched.unit_cost)
    with contextlib.ExitStack() as stack:
        try:
            van = stack.enter_context(LlamaServer(van_cfg))
            props = van.props()
        except ServerError as e:
            raise TuneError(f"vanilla server: {e}") from e
        use_mode = _pick_mode(props, mode, notes)
        bench = Bench(setup.suite.prompts, seeds, use_mode, max_tokens, concurrency)
        stack.callback(bench.close)
        bench.one(van, setup.suite.prompts[0], 0, WARMUP_TOKENS)  # warm-up
        bar = stack.enter_context(progress_bar(total, "tune", "req", enabled=progress))
        ev = ServerEvaluator(base, van, bench, ctx_per_slot, setup.suite.prompts[0], bar, arms, setup.suite, heads)
        stack.callback(ev.close)
        sh = successive_halving(ordered, ev, sched.budget, sched.units0, sched.eta, sched.final_size,
                                sched.max_units, sched.unit_cost, log=log, final_units=sched.final_units)
        return _Search(sh, ev, shlex.join(van.command), props.get("build_info"), use_mode)


def _pick_mode(props: dict[str, Any], mode: str | None, notes: list[str]) -> str:
    """The thinking mode to tune in: ``mode``, else the template's first."""
    modes = modes_for_template(props.get("chat_template"))
    use_mode = mode or modes[0]
    if use_mode not in modes:
        raise TuneError(f"mode {use_mode!r}: this chat template supports {modes}")
    if len(modes) > 1:
        notes.append(f"chat template has a thinking switch: tuned in mode {use_mode!r} only")
    return use_mode


def _outcome_notes(rows: Sequence[ConfigRow], rec: Recommendation, sh: SHResult, notes: list[str]) -> None:
    """Notes on the outcome: dropped configurations, finalists within noise, draft limits that did nothing."""
    dropped = [r for r in rows if r.status == ConfigStatus.DROPPED]
    if dropped:
        notes.append(f"{len(dropped)} configuration(s) dropped: "
                     + "; ".join(f"{r.key} ({r.reason})" for r in dropped[:5]))
    if rec.within_noise_of and rec.recommended:
        notes.append("the final configurations are within noise of each other; any of them is a fine choice")
    for key, twin in inert_draft_limits(sh).items():
        notes.append(f"{key} drafted exactly the tokens {twin} drafted on every prompt both were measured on: "
                     "its draft-p-min/n-min never cut a draft short here, so the simpler flags are equivalent")
        if key == rec.best:
            rec.equivalent_simpler = twin


def _schedule_record(run: _Search, sched: _Schedule, n_candidates: int, concurrency: int,
                     order_seed: int) -> TuneSchedule:
    """The ``schedule`` object of tune's JSON."""
    sh = run.sh
    return TuneSchedule(
        method="successive halving", eta=sched.eta, units0=sh.units0, final_size=sched.final_size,
        final_units=sched.final_units, final_on_suite=sched.final_units is not None,
        n_candidates=n_candidates, n_searched=len(sh.states), budget=sched.budget,
        evaluations=sh.evaluations, planned_evaluations=schedule_cost(sched.fit(n_candidates)[2], sched.unit_cost),
        unit_cost=sched.unit_cost,
        unit=("one prompt under every seed" if concurrency == 1
              else f"a batch of {concurrency} prompts sent at once, under every seed"),
        plan=[RungPlan(n, u) for n, u in sh.plan],
        rungs=list(sh.rungs), server_starts=run.evaluator.server_starts + 1,
        order="anchors first (llama-server defaults; on a GPU the defaults with -bs, and with -bs and CUDA graph "
              "optimisation; then every other draft-n-max with the best-guess flags, nearest the default first), "
              "then a seeded shuffle round-robin over draft-n-max "
              f"(seed {order_seed})")


def _settings_record(setup: TuneSetup, o: TuneOptions, seeds: list[int], mode: str) -> TuneSettings:
    """The ``settings`` object of tune's JSON."""
    return TuneSettings(
        suite=setup.suite.name, suite_sha256=setup.suite.sha256, n_prompts=len(setup.suite.prompts),
        seeds=seeds, max_tokens=o.max_tokens, temperature=0.0, mode=mode, ctx_per_slot=o.ctx_per_slot,
        threads=o.server.threads, gpu_layers=o.server.gpu_layers, cache_prompt=False,
        speedup=("decode throughput: (sum MTP tokens / sum MTP predicted_ms) / (same for vanilla)"
                 if o.concurrency == 1 else
                 "aggregate output tok/s: (sum MTP tokens / sum MTP batch wall time) / (same for vanilla)"),
        interleave="vanilla resident (another vanilla server for a configuration whose non-speculative settings "
                   "differ: fair baseline); per unit ABBA order vanilla/MTP",
        bootstrap=BootstrapInfo(unit="prompt (seeds pooled; units sharing a prompt, e.g. batches at concurrency > 1, "
                                     "pooled into one)", resamples=o.bootstrap_resamples))


class TunedProfile(NamedTuple):
    """A tuned configuration and the file it came from (what ``verify --tuned-from`` records)."""

    config: TuneConfig
    source: ProfileSource


def load_tuned_config(path: str | os.PathLike) -> TuneConfig:
    """The recommended configuration in a receipt's ``verification.tuned`` or a ``tune --out`` JSON
    (the best measured one when tune recommended vanilla). Raises :class:`TuneError` naming the file."""
    return load_tuned_profile(path).config


def load_tuned_profile(path: str | os.PathLike) -> TunedProfile:
    """:func:`load_tuned_config` with the file's name, sha256 (of the bytes read), the search that
    wrote it (``kind``: ``ggufmtp tune`` or ``ggufmtp tune-joint``; None for a hand-written one)
    and whether that search recommended MTP."""
    p = Path(path)
    try:
        data = read_json_file(p, "receipt or tune --out JSON")
        if is_envelope(data) or (isinstance(data, dict) and "predicate" in data):
            # a receipt, plain or signed: read by the one receipt reader
            data = read_receipt(p).statement
    except AuditError as e:
        raise TuneError(str(e)) from None
    if not isinstance(data, dict):
        raise TuneError(f"{p}: expected a JSON object (a receipt or `ggufmtp tune --out` output)")
    t = ((data.get("predicate") or {}).get("verification") or {}).get("tuned") if "predicate" in data else data
    t = t if isinstance(t, dict) else {}
    cfg = t.get("recommended_config") or t.get("best_config")
    if not isinstance(cfg, dict):
        raise TuneError(f"{p}: no tuned configuration (run `ggufmtp tune MODEL --receipt/--out {p.name}` first)")
    try:
        config = TuneConfig.coerce(cfg)
    except TuneError as e:
        raise TuneError(f"{p}: {e}") from e
    kind = t.get("kind") if isinstance(t.get("kind"), str) else None
    if "joint" in t:  # tune-joint's JSON (before 2026-11-30 it said "ggufmtp tune": its joint stage is tune's)
        kind = TUNE_JOINT_KIND
    said = "recommended" in t or "recommended_config" in t
    return TunedProfile(config, ProfileSource(p.name, sha256_file(p), kind,
                                              bool(t.get("recommended_config")) if said else None))
