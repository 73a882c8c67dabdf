"""``ggufmtp curve``: the hardware's speedup-versus-acceptance curve (synthetic acceptance).

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
import os
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ... import stats
from ...errors import ServerError, TuneError
from ...fmt import ci_text, num, pct, times
from ...fmt import finite_or_none as _num
from ...progress import bar as progress_bar
from ...runtime.hardware import HardwareInfo, probe_hardware
from ...runtime.server import LlamaServer, ServerConfig
from ..core.arms import ABBA, WARMUP_TOKENS
from ..core.options import ArmArgs, ServerOptions
from ..core.records import CURVE_MODEL_KEYS, CURVE_SERVER_KEYS, ModelInfo, ServerInfo
from ..core.suite import DEFAULT_SUITE, Prompt, Suite, modes_for_template
from ..tune.bench import DEFAULT_CTX_PER_SLOT, DEFAULT_MAX_TOKENS, Bench, check_seeds, prepare
from ..verify.summary import PairStats

__all__ = ["DEFAULT_CURVE_RATES", "CurveOptions", "CurvePoint", "CurveResult", "acceptance_curve", "format_curve",
           "geometric_rates", "synth_len_for_acceptance"]

DEFAULT_CURVE_RATES = (0.0, 0.25, 0.5, 0.75, 0.9, 1.0)
_NO_CI: list[float | None] = [None, None]


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


@dataclass(frozen=True)
class CurvePoint(PairStats):
    """One point of the curve: a set acceptance (or the real head) and what it measured (its
    :class:`~ggufmtp.measure.verify.summary.PairStats`, draft rounds, the MTP server's command line)."""

    acceptance_set: float | None  # the real head: its measured acceptance
    flag_value: str | None  # e.g. "synth-len 2.5"; None for the real head
    expected_tokens_per_step: float | None
    rates: list[float] | None
    n_drafts: int
    tokens_per_step: float | None
    per_position: list[float | None] | None
    command: str
    identical_output_fraction: float | None = None  # the real head only (synthetic output is not the model's)
    real: bool = False

    def to_dict(self) -> dict[str, Any]:
        d = {"acceptance_set": self.acceptance_set, "flag_value": self.flag_value,
             "expected_tokens_per_step": self.expected_tokens_per_step, "rates": self.rates,
             "acceptance": self.acceptance, "acceptance_ci95": list(self.acceptance_ci95), "draft_n": self.draft_n,
             "draft_n_accepted": self.draft_n_accepted, "n_drafts": self.n_drafts,
             "tokens_per_step": self.tokens_per_step, "per_position": self.per_position,
             "mean_acceptance_length": self.tokens_per_step, "acceptance_by_position": self.per_position,
             "mtp_tokens_per_second": self.mtp_tokens_per_second,
             "vanilla_tokens_per_second": self.vanilla_tokens_per_second, "speedup": self.speedup,
             "speedup_ci95": list(self.speedup_ci95), "n_prompts": self.n_prompts, "n_pairs": self.n_pairs,
             "command": self.command}
        if self.real:
            d["identical_output_fraction"] = self.identical_output_fraction
        return d


@dataclass(frozen=True)
class CurveSettings:
    """What every point of a curve shared (the ``settings`` object of its JSON)."""

    flag: str  # "synth-len" | "synth-rates"
    seeds: list[int]
    max_tokens: int
    n_prompts: int
    suite: str
    mode: str
    batch_size: int
    request_seed: str
    gpu_layers: int | str | None
    threads: int | None
    speedup: str
    acceptance_set: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class CurveResult:
    """:func:`acceptance_curve`'s points; :meth:`to_dict` is the receipt's ``verification.acceptance_curve``."""

    model: ModelInfo
    draft_n_max: int
    points: list[CurvePoint]
    real: CurvePoint | None
    breakeven_acceptance: float | None
    settings: CurveSettings
    hardware: HardwareInfo
    server: ServerInfo
    notes: list[str]
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "ggufmtp curve", "model": self.model.to_dict(CURVE_MODEL_KEYS),
                "draft_n_max": self.draft_n_max, "points": [p.to_dict() for p in self.points],
                "real": self.real.to_dict() if self.real else None,
                "breakeven_acceptance": self.breakeven_acceptance, "settings": self.settings.to_dict(),
                "hardware": self.hardware.to_dict(), "server": self.server.to_dict(CURVE_SERVER_KEYS),
                "notes": list(self.notes), "seconds": round(self.seconds, 2)}

    def table(self) -> str:
        return format_curve(self)


def _breakeven(points: Sequence[CurvePoint]) -> float | None:
    """Acceptance where the speedup crosses 1.0 (linear interpolation between measured points)."""
    pts = sorted((p.acceptance_set, p.speedup) for p in points if p.speedup is not None)
    if not pts:
        return None
    if pts[0][1] >= 1.0:
        return pts[0][0]
    for (a0, s0), (a1, s1) in zip(pts, pts[1:]):
        if s0 < 1.0 <= s1:
            return a0 + (1.0 - s0) * (a1 - a0) / (s1 - s0) if s1 != s0 else a1
    return None


def format_curve(res: CurveResult) -> str:
    """The human-readable table of a curve."""
    st = res.settings
    L = [f"ggufmtp curve {Path(res.model.path).name}  (k = {res.draft_n_max}; synthetic acceptance via "
         f"--spec-{st.flag}; {st.n_prompts} prompts x seeds {','.join(map(str, st.seeds))}, max_tokens {st.max_tokens})",
         "",
         f"{'set acceptance':>14} {'synth flag':<26} {'measured acceptance (95% CI)':<30} {'tokens/step':>11} "
         f"{'mtp tok/s':>10} {'vanilla tok/s':>13}  speedup (95% CI)"]
    for p in res.points + ([res.real] if res.real else []):
        name = "real head" if p is res.real else f"{p.acceptance_set * 100:.0f}%"
        acc = pct(p.acceptance, space=False) + " " + ci_text(p.acceptance_ci95, scale=100, digits=1, sep="-")
        L.append(f"{name:>14} {p.flag_value or '-':<26} {acc:<30} "
                 f"{num(p.tokens_per_step):>11} {num(p.mtp_tokens_per_second):>10} "
                 f"{num(p.vanilla_tokens_per_second):>13}  {times(p.speedup, sign='x')} "
                 f"{ci_text(p.speedup_ci95, sep='-')}")
    L.append("")
    be = res.breakeven_acceptance
    L.append("break-even acceptance (speedup 1.0): " + ("not reached in the measured range" if be is None
                                                       else f"{be * 100:.1f}%"))
    L += [f"note: {n}" for n in res.notes]
    return "\n".join(L)


# ----------------------------------------------------------------------------- measuring


class _PointSpec(NamedTuple):
    """What one point passes to its MTP server: the set acceptance (None: the real head), the extra
    flags and their label."""

    acceptance: float | None
    args: list[str]
    label: str | None


class _Arms(NamedTuple):
    """What every point of a run shares: the resident vanilla server, the request sender, the prompts
    and seeds, the pair alternation and the progress bar."""

    van: LlamaServer
    bench: Bench
    prompts: list[Prompt]
    seeds: list[int]
    order: ABBA
    bar: Any


@dataclass(frozen=True)
class CurveOptions:
    """What :func:`acceptance_curve` measures, checked once, when built (TuneError naming the first
    bad setting). The defaults are ``ggufmtp curve``'s.

    ``rates``: target acceptances (accepted / drafted at window ``draft_n_max``), each one point.
    ``synth_len``: instead, explicit ``--spec-synth-len`` values (mean accepted length incl. the
    target token, in [1, k+1]). ``flag``: "synth-len" (default) or "synth-rates" (the same geometric
    rates passed explicitly). ``include_real``: also measure the real head at the same k (identical
    output checked). ``seeds``, ``suite``, ``limit`` (prompts per point), ``max_tokens``: the
    requests; ``ctx_size``: both arms'; ``bootstrap_resamples``: of the CIs. ``server``: the
    servers' settings (:class:`~ggufmtp.measure.core.options.ServerOptions`: ``server_args`` go to
    both arms, fair baseline; ``mtp_server_args`` / ``vanilla_server_args`` to one)."""

    rates: Sequence[float] = DEFAULT_CURVE_RATES
    draft_n_max: int = 3
    synth_len: Sequence[float] | None = None
    flag: str = "synth-len"
    include_real: bool = True
    seeds: Sequence[int] = (42, 1337)
    suite: str | os.PathLike | Suite = DEFAULT_SUITE
    limit: int | None = 8
    max_tokens: int = DEFAULT_MAX_TOKENS
    ctx_size: int = DEFAULT_CTX_PER_SLOT
    bootstrap_resamples: int = stats.DEFAULT_RESAMPLES
    server: ServerOptions = field(default_factory=ServerOptions)

    def __post_init__(self) -> None:
        self.server.arm_args()  # TuneError on a speculative flag for the vanilla arm
        k = int(self.draft_n_max)
        if k < 1:
            raise TuneError("draft_n_max must be at least 1")
        if self.flag not in ("synth-len", "synth-rates"):
            raise TuneError(f"flag {self.flag!r}: 'synth-len' or 'synth-rates'")
        object.__setattr__(self, "seeds", tuple(check_seeds(self.seeds)))
        self.targets()  # TuneError on a rate or a length out of range, or none

    def targets(self) -> list[float]:
        """The set acceptances of the points: ``rates``, or those ``synth_len`` values give at window k."""
        return _targets(self.rates, self.synth_len, int(self.draft_n_max))


def acceptance_curve(model: str | os.PathLike, options: CurveOptions | None = None, *,
                     progress: bool = True) -> CurveResult:
    """Speedup versus synthetic acceptance of ``model`` (a GGUF path) on this hardware, with
    ``options`` (:class:`CurveOptions`; see the module docstring). Each point: one MTP server;
    vanilla stays up; requests ABBA-interleaved, batch size 1."""
    o = options if options is not None else CurveOptions()
    arms = o.server.arm_args()
    t0 = time.monotonic()
    k = int(o.draft_n_max)
    seeds = list(o.seeds)
    specs = _point_specs(o.targets(), k, o.flag)
    if o.include_real:
        specs.append(_PointSpec(None, [], None))
    setup = prepare(model, o.suite, o.limit, o.server.llama_cpp_bin)
    if "--spec-synth-len" not in setup.flags or "--spec-synth-rates" not in setup.flags:
        raise TuneError(f"{setup.binary}: this llama-server has no --spec-synth-len/--spec-synth-rates flags; use "
                        "the knob models (ggufmtp.synth, wrong_successor_fraction) for a curve instead")
    gpu_layers, threads = o.server.gpu_layers, o.server.threads
    hw = probe_hardware(setup.binary, gpu_layers)
    base = o.server.base_fields(model=setup.path, ctx_size=o.ctx_size, parallel=1)
    notes = ["synthetic acceptance: draft tokens are accepted at random (RNG seeded by the request seed), so the "
             "output is not the model's and is not compared with vanilla; the drafting and verification cost is real"]
    notes += arms.notes()
    if not hw.offloaded:
        notes.append("CPU run: a small model is compute-bound on CPU; the curve describes this machine only")
    measured, mode, build_info = _measure_curve(base, specs, k, setup.suite.prompts, seeds, o.max_tokens, progress,
                                                o.bootstrap_resamples, arms)
    points = [p for p in measured if not p.real]
    real = next((p for p in measured if p.real), None)
    if real is not None and real.identical_output_fraction not in (None, 1.0):
        notes.append(f"real head: only {real.identical_output_fraction * 100:.1f}% of replies identical to vanilla")
    return CurveResult(
        model=ModelInfo(str(setup.path), architecture=setup.report.architecture, mtp_block=setup.report.mtp_block,
                        mtp_blocks=setup.report.mtp_blocks),
        draft_n_max=k, points=points, real=real, breakeven_acceptance=_breakeven(points),
        settings=_curve_settings(o.flag, seeds, o.max_tokens, setup.suite, mode, gpu_layers, threads),
        hardware=hw, server=ServerInfo(build_info=build_info, binary=str(setup.binary)), notes=notes,
        seconds=time.monotonic() - t0)


def _targets(rates: Sequence[float], synth_len: Sequence[float] | None, k: int) -> list[float]:
    """The set acceptances of the points: ``rates``, or those ``synth_len`` values give at window k."""
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
    return targets


def _point_specs(targets: Sequence[float], k: int, flag: str) -> list[_PointSpec]:
    """The server flag of each set acceptance: ``--spec-synth-len`` or the geometric ``--spec-synth-rates``."""
    out = []
    for a in targets:
        if flag == "synth-len":
            val = f"{synth_len_for_acceptance(a, k):.6g}"
        else:
            val = ",".join(f"{x:.6g}" for x in geometric_rates(a, k))
        out.append(_PointSpec(a, [f"--spec-{flag}", val], f"{flag} {val}"))
    return out


def _measure_curve(base: dict[str, Any], specs: Sequence[_PointSpec], k: int, prompts: Sequence[Prompt],
                   seeds: list[int], max_tokens: int, progress: bool,
                   resamples: int, arms: ArmArgs) -> tuple[list[CurvePoint], str, str | None]:
    """Every point against one resident vanilla server; (points in ``specs`` order, mode, build info)."""
    with contextlib.ExitStack() as stack:
        try:
            van = stack.enter_context(LlamaServer(ServerConfig(**arms.vanilla_fields(base))))
            props = van.props()
        except ServerError as e:
            raise TuneError(f"vanilla server: {e}") from e
        mode = modes_for_template(props.get("chat_template"))[0]
        bench = Bench(prompts, seeds, mode, max_tokens, 1)
        bench.one(van, prompts[0], 0, WARMUP_TOKENS)
        bar = stack.enter_context(progress_bar(len(specs) * len(prompts) * len(seeds) * 2, "curve", "req",
                                               enabled=progress))
        pair = _Arms(van, bench, list(prompts), seeds, ABBA(), bar)
        points = [_measure_point(pair, arms.mtp_fields(base, k), spec, k, resamples) for spec in specs]
        return points, mode, props.get("build_info")


def _measure_point(arms: _Arms, base: dict[str, Any], spec: _PointSpec, k: int, resamples: int) -> CurvePoint:
    """One point: its MTP server, warmed up, every (prompt, seed) pair against vanilla."""
    cfg = ServerConfig(**{**base, "extra_args": list(base["extra_args"]) + spec.args})
    try:
        mtp = LlamaServer(cfg).start()
    except ServerError as e:
        raise TuneError(f"MTP server for {spec.label or 'the real head'}: {e}") from e
    try:
        arms.bench.one(mtp, arms.prompts[0], 0, WARMUP_TOKENS)
        before = mtp.spec_counters()
        units, identical = _run_pairs(arms, mtp)
        counters = mtp.spec_counters().since(before)
        command = shlex.join(mtp.command)
    finally:
        mtp.stop()
    x = np.array(units)
    sp = stats.throughput_ratio(x[:, 0], x[:, 1], x[:, 2], x[:, 3], resamples=resamples)
    acc = stats.ratio_of_sums(x[:, 4], x[:, 5], resamples=resamples)
    tot = x.sum(axis=0)
    a = spec.acceptance
    n_pairs = len(units) * len(arms.seeds)
    return CurvePoint(
        acceptance_set=a if a is not None else _num(acc.value), flag_value=spec.label,
        expected_tokens_per_step=(1.0 + k * a) if a is not None else None,
        rates=geometric_rates(a, k) if a is not None else None,
        acceptance=_num(acc.value), acceptance_ci95=[_num(acc.lo), _num(acc.hi)],
        draft_n=int(tot[5]), draft_n_accepted=int(tot[4]), n_drafts=counters.n_drafts,
        tokens_per_step=_num(counters.tokens_per_step),
        per_position=[_num(c) for c in counters.acceptance_by_position] if counters.n_drafts else None,
        mtp_tokens_per_second=_num(tot[0] / tot[1] * 1000) if tot[1] > 0 else None,
        vanilla_tokens_per_second=_num(tot[2] / tot[3] * 1000) if tot[3] > 0 else None,
        speedup=_num(sp.value), speedup_ci95=[_num(sp.lo), _num(sp.hi)], n_prompts=len(units), n_pairs=n_pairs,
        command=command, identical_output_fraction=(identical / n_pairs if n_pairs else None) if a is None else None,
        real=a is None)


def _run_pairs(arms: _Arms, mtp: LlamaServer) -> tuple[list[list[float]], int]:
    """Every prompt under every seed on vanilla and ``mtp`` (ABBA); per prompt [MTP tokens, MTP ms,
    vanilla tokens, vanilla ms, accepted, drafted], and how many replies were identical."""
    units: list[list[float]] = []
    identical = 0
    for pi, p in enumerate(arms.prompts):
        u = [0.0] * 6
        for s0 in arms.seeds:
            # a distinct seed per request: the synthetic-acceptance RNG is seeded with it, so
            # requests sharing a seed would accept at exactly the same steps
            s = s0 * 1000 + pi
            v, m = arms.order.run(lambda: arms.bench.one(arms.van, p, s), lambda: arms.bench.one(mtp, p, s))  # noqa: B023 (called within this iteration)
            arms.bar.update(2)
            (mn, mms), (vn, vms) = stats.decoded(m.predicted_n, m.predicted_ms), stats.decoded(v.predicted_n, v.predicted_ms)
            u[0] += mn; u[1] += mms; u[2] += vn; u[3] += vms  # noqa: E702
            u[4] += m.draft_n_accepted or 0; u[5] += m.draft_n or 0  # noqa: E702
            identical += int(m.text == v.text)
        units.append(u)
    return units, identical


def _curve_settings(flag: str, seeds: list[int], max_tokens: int, suite: Suite, mode: str,
                    gpu_layers: int | str | None, threads: int | None) -> CurveSettings:
    """The ``settings`` object of the curve's JSON."""
    return CurveSettings(
        flag=flag, seeds=seeds, max_tokens=max_tokens, n_prompts=len(suite.prompts), suite=suite.name, mode=mode,
        batch_size=1, request_seed="seed * 1000 + prompt index (distinct synthetic-acceptance RNG streams)",
        gpu_layers=gpu_layers, threads=threads,
        speedup="decode throughput ratio (timings.predicted_ms), ABBA-interleaved with vanilla",
        acceptance_set="target accepted/drafted at window k; --spec-synth-len = 1 + k * acceptance "
                       "(geometric per-position rates p^i)")
