"""``ggufmtp profiles``: serving profiles, MTP against vanilla, as the vLLM write-up's benchmark suite.

Workloads (input tokens, output tokens, concurrent clients):

- **A** single decode: 512 in, 512 out, 1 concurrent;
- **B** prefill-bound: 8192 in, 256 out, 4 concurrent;
- **C** contention: 2048 in, 512 out, 16 concurrent;
- **D** chat: 2048 in, 256 out, 2 concurrent.

``scale`` multiplies both token counts (concurrency and the number of requests are kept), for quick
runs and CPU tests: ``scale=1/16`` makes A 32 in / 32 out and D 128 in / 16 out (inputs at least 16
tokens, outputs at least 8).

Method
------
One llama-server per arm (vanilla, or ``--spec-type draft-mtp`` with the given/tuned flags), with
``-np`` = the workload's concurrency and ``-c`` = slots x (input + output + 64) rounded up to 256 (each
slot gets its share of the context). Prompts are built against the server's own tokenizer: random
words drawn (seeded) from the shipped suite's vocabulary, cut to the number of content tokens whose
chat-templated prompt (``/apply-template`` then ``/tokenize``) has exactly the requested input length
(``prompt_n`` of the answers reports what was processed). Both arms get the same prompts.

``concurrency`` client threads each pull the next request from a shared queue (like ``vllm bench
serve --max-concurrency``) and stream ``/v1/chat/completions`` (``stream: true``, Server-Sent Events)
at temperature 0 with ``max_tokens`` = the output length, ``ignore_eos: true`` (every reply has the
full length) and ``cache_prompt: false``. Before measuring, ``concurrency`` warm-up requests of the
same shape (8 output tokens) run unrecorded. Per request, timestamps of every SSE chunk:

- **TTFT**: send -> first chunk carrying content (or reasoning content);
- **ITL**: every gap between consecutive content chunks (llama-server streams one chunk per token,
  also for the tokens a speculative step accepts at once, so ITL shows the bursts: many gaps near 0
  and longer pauses);
- **TPOT**: (e2e - TTFT) / (n_out - 1), with n_out = ``timings.predicted_n`` of the last chunk (the
  steady per-token cost; smoother than ITL under speculation);
- **e2e**: send -> end of stream.

Aggregates: output tok/s = sum of n_out / (first send -> last end); mean, median and P99 (numpy
linear interpolation) of TTFT, TPOT, ITL (all gaps pooled), e2e. Acceptance = sum of
``draft_n_accepted`` / sum of ``draft_n`` from the last chunks' ``timings``; the ``/metrics`` deltas give
draft rounds, tokens per step and per-position acceptance. Replies of the two arms are compared
per request (identical at temperature 0 unless batching changes the numerics).

The decision table (whether MTP helps each workload, and why): :mod:`ggufmtp.measure.profiles.workloads`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import random
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import ProfileError, ServerError, TuneError
from ...runtime.build import find_binary
from ...runtime.hardware import HardwareInfo, probe_hardware
from ...runtime.server import LlamaServer, ServerConfig, display_command, gguf_has_mtp
from ..core.arms import ABBA, MTP, VANILLA
from ..core.options import ArmArgs, ServerOptions, TuneConfig
from ..core.records import PROFILES_MODEL_KEYS, ModelInfo
from ..core.suite import DEFAULT_SUITE, load_suite, mode_request_fields, modes_for_template
from .stream import RequestRecord, aggregate, run_clients
from .workloads import (
    DEFAULT_NOISE,
    ArmSettings,
    DecisionRow,
    ProfileResult,
    ProfileSpec,
    Workload,
    decision_table,
    format_profiles,
    get_workload,
)

__all__ = ["ProfilesOptions", "ProfilesResult", "build_prompts", "profile_server_config", "run_profile",
           "run_profiles"]

CTX_MARGIN = 64
WARMUP_OUTPUT = 8


# ----------------------------------------------------------------------------- prompts


_WORD_RE = re.compile(r"[A-Za-z]{2,}")


def _vocabulary() -> list[str]:
    st = load_suite(DEFAULT_SUITE)
    words: dict[str, None] = {}
    for p in st.prompts:
        for m in p.messages:
            for w in _WORD_RE.findall(m["content"]):
                words.setdefault(w.lower(), None)
    return sorted(words)


def _prompt_tokens(srv: LlamaServer, content: str) -> int:
    templ = srv.post_json("/apply-template", {"messages": [{"role": "user", "content": content}]})["prompt"]
    return len(srv.tokenize(templ, add_special=True, parse_special=True))


def build_prompts(srv: LlamaServer, n: int, input_tokens: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` distinct user messages whose chat-templated prompt has ``input_tokens`` tokens on ``srv``'s
    tokenizer (the largest length <= the target when an exact fit does not exist). Returns
    ``[{"content", "prompt_tokens"}]``."""
    vocab = _vocabulary()
    overhead = _prompt_tokens(srv, "")
    if overhead >= input_tokens:
        raise ProfileError(f"input length {input_tokens}: the chat template alone takes {overhead} tokens")
    out = []
    for i in range(n):
        rng = random.Random(seed * 1_000_003 + i)
        words: list[str] = [f"Request {i}."]
        text = " ".join(words)
        # grow the word list until the templated prompt is long enough, then cut tokens exactly
        while _prompt_tokens(srv, text) < input_tokens:
            words.extend(rng.choice(vocab) for _ in range(max(8, (input_tokens - overhead) // 2)))
            text = " ".join(words)
        toks = srv.tokenize(text, add_special=False, parse_special=False)

        def detok(m: int) -> str:
            return srv.post_json("/detokenize", {"tokens": toks[:m]})["content"]  # noqa: B023 (called within this iteration)

        lo, hi, best = 1, len(toks), (None, -1)
        while lo <= hi:  # largest m whose templated prompt fits
            mid = (lo + hi) // 2
            c = detok(mid)
            k = _prompt_tokens(srv, c)
            if k <= input_tokens:
                if k > best[1]:
                    best = (c, k)
                if k == input_tokens:
                    break
                lo = mid + 1
            else:
                hi = mid - 1
        if best[0] is None:
            raise ProfileError(f"could not build a prompt of {input_tokens} tokens")
        out.append({"content": best[0], "prompt_tokens": best[1]})
    return out



# ----------------------------------------------------------------------------- one profile



@dataclass(frozen=True)
class ProfilesOptions:
    """What the profiles measure, checked once, when built (ProfileError naming the first bad
    setting). The defaults are ``ggufmtp profiles``'.

    ``workloads``: names (A-D) or :class:`Workload` objects; ``scale`` multiplies their token
    counts, ``num_requests`` replaces their number of requests. The MTP arm's flags: ``tuned`` (a
    :class:`~ggufmtp.measure.core.options.TuneConfig` or its dict), else ``--spec-draft-n-max
    draft_n_max``. ``seed``: of the prompts and the requests; ``repeats``: runs per arm (alternated,
    requests pooled); ``noise``: the throughput band within which MTP is not counted as helping.
    ``ctx_size``: instead of the workload's (slots x (input + output + 64), rounded up to 256).
    ``server``: the servers' settings (:class:`~ggufmtp.measure.core.options.ServerOptions`; fair
    baseline: ``server_args`` and a tuned configuration's non-speculative part go to both arms,
    ``mtp_server_args`` / ``vanilla_server_args`` to one)."""

    workloads: Sequence[str | Workload] = ("A", "B", "C", "D")
    scale: float = 1.0
    num_requests: int | None = None
    draft_n_max: int | None = 3
    tuned: TuneConfig | None = None  # or its dict
    seed: int = 0
    repeats: int = 1
    noise: float = DEFAULT_NOISE
    ctx_size: int | None = None
    server: ServerOptions = field(default_factory=ServerOptions)

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ProfileError("repeats must be at least 1")
        try:
            object.__setattr__(self, "tuned", None if self.tuned is None else TuneConfig.coerce(self.tuned))
            self.arm_args()
        except TuneError as e:
            raise ProfileError(str(e)) from e
        object.__setattr__(self, "workloads", tuple(self.workloads))
        if not self.scaled_workloads():
            raise ProfileError("no workloads")

    def scaled_workloads(self) -> list[Workload]:
        """The workloads to run, scaled."""
        return [get_workload(w).scaled(self.scale, self.num_requests) for w in self.workloads]

    def arm_args(self) -> ArmArgs:
        """The flags by arm, the tuned configuration's included."""
        return self.server.arm_args(self.tuned)


def profile_server_config(model: Path, w: Workload, mtp: bool, options: ProfilesOptions | None = None) -> ServerConfig:
    """One arm's server for workload ``w`` (see :class:`ProfilesOptions` for the fair baseline)."""
    o = options if options is not None else ProfilesOptions()
    per_slot = w.input_tokens + w.output_tokens + CTX_MARGIN
    ctx = o.ctx_size or int(math.ceil(per_slot * w.concurrency / 256) * 256)
    base = o.server.base_fields(model=model, ctx_size=ctx, parallel=w.concurrency)
    arms = o.arm_args()
    if not mtp:
        return ServerConfig(**arms.vanilla_fields(base))
    return ServerConfig(**arms.mtp_fields(base, o.draft_n_max))


def _bodies(prompts: Sequence[dict[str, Any]], max_tokens: int, mode: str, seed: int) -> list[dict[str, Any]]:
    return [{"messages": [{"role": "user", "content": p["content"]}], "max_tokens": max_tokens, "temperature": 0.0,
             "seed": seed + i, "ignore_eos": True, "cache_prompt": False, **mode_request_fields(mode)}
            for i, p in enumerate(prompts)]


def _measure(srv: LlamaServer, w: Workload, prompts: Sequence[dict[str, Any]], mode: str, seed: int,
             warmup: bool) -> tuple[list[RequestRecord], float, ProfileSpec | None]:
    """Warm up, then run the workload's requests; (records, wall seconds, the MTP arm's counters)."""
    if warmup:
        wb = _bodies(prompts[:w.concurrency], WARMUP_OUTPUT, mode, seed + 10_000)
        recs = run_clients(srv.port, wb, w.concurrency)  # type: ignore[arg-type]
        bad = [r for r in recs if r.error]
        if bad:
            raise ProfileError(f"warm-up request failed: {bad[0].error}; log {srv.log_path}")
    snap = srv.spec_counters()
    t0 = time.perf_counter()
    recs = run_clients(srv.port, _bodies(prompts, w.output_tokens, mode, seed), w.concurrency)  # type: ignore[arg-type]
    t1 = time.perf_counter()
    spec = None
    if snap.available and srv.config.draft_mtp:
        time.sleep(0.05)
        d = srv.spec_counters().since(snap)
        spec = ProfileSpec(d.draft_tokens, d.accepted, d.n_drafts, d.acceptance_by_position)
    if not srv.is_running():
        raise ProfileError(f"llama-server died during the run; log {srv.log_path}:\n{srv.log_tail()}")
    return recs, t1 - t0, spec


def run_profile(model: str | os.PathLike, workload: str | Workload, mtp: bool, options: ProfilesOptions | None = None,
                *, warmup: bool = True, prompts: Sequence[dict[str, Any]] | None = None,
                server: LlamaServer | None = None, mode: str | None = None) -> ProfileResult:
    """One arm of one workload (see the module docstring) with ``options`` (its scale, the MTP arm's
    flags, the servers' settings, the seed). ``server``: reuse a running server (its flags must fit
    the workload); ``prompts``: reuse prompts from :func:`build_prompts`."""
    o = options if options is not None else ProfilesOptions()
    w = get_workload(workload).scaled(o.scale, o.num_requests)
    path = Path(model)
    if not path.is_file():
        raise ProfileError(f"model {path}: no such file")
    cfg = profile_server_config(path, w, mtp, o)
    with contextlib.ExitStack() as stack:
        if server is None:
            try:
                srv = stack.enter_context(LlamaServer(cfg))
            except ServerError as e:
                raise ProfileError(f"{'MTP' if mtp else 'vanilla'} server for workload {w.name}: {e}") from e
        else:
            srv = server
        return _profile_on(srv, w, "mtp" if mtp else "vanilla", prompts, o.seed, warmup, mode)


def _profile_on(srv: LlamaServer, w: Workload, arm: str, prompts: Sequence[dict[str, Any]] | None, seed: int,
                warmup: bool, mode: str | None) -> ProfileResult:
    try:
        props = srv.props()
        mode = mode or modes_for_template(props.get("chat_template"))[0]
        if prompts is None:
            prompts = build_prompts(srv, w.num_requests, w.input_tokens, seed)
        if len(prompts) < w.num_requests:
            raise ProfileError(f"{len(prompts)} prompts for {w.num_requests} requests")
        recs, dur, spec = _measure(srv, w, prompts[:w.num_requests], mode, seed, warmup)
    except ServerError as e:
        raise ProfileError(f"{arm} arm, workload {w.name}: {e}") from e
    m = aggregate(recs, dur)
    notes = []
    if m.failed:
        notes.append(f"{m.failed} request(s) failed: {next(r.error for r in recs if r.error)}")
    if arm == "mtp" and not m.draft_n:
        notes.append("the MTP arm never drafted (no timings.draft_n)")
    return ProfileResult(workload=w, arm=arm, metrics=m, requests=recs, command=display_command(srv.config, srv.binary),
                         settings=ArmSettings(
                             mode=mode, seed=seed, prompt_tokens_target=w.input_tokens,
                             prompt_tokens_built=[p.get("prompt_tokens") for p in prompts[:w.num_requests]],
                             ignore_eos=True, temperature=0.0, cache_prompt=False,
                             warmup_requests=w.concurrency if warmup else 0),
                         spec=spec, notes=notes)


def _pool(results: Sequence[ProfileResult]) -> ProfileResult:
    """Several runs of one arm -> one result (requests pooled, durations summed)."""
    if len(results) == 1:
        return results[0]
    recs = [r for res in results for r in res.requests]
    m = aggregate(recs, sum(res.metrics.duration_s for res in results), runs=len(results))
    specs = [res.spec for res in results if res.spec]
    spec = None
    if len(specs) == len(results):
        spec = ProfileSpec(sum(s.draft_tokens for s in specs), sum(s.accepted for s in specs),
                           sum(s.n_drafts for s in specs))
    r0 = results[0]
    return ProfileResult(r0.workload, r0.arm, m, recs, r0.command, r0.settings, spec,
                         [n for res in results for n in res.notes])


# ----------------------------------------------------------------------------- all profiles


@dataclass(frozen=True)
class ProfilesSettings:
    """What every workload of a profiles run shared (the ``settings`` object of its JSON)."""

    repeats: int
    noise: float
    seed: int
    draft_n_max: int | None
    tuned: dict[str, Any] | None  # the MTP arm's tuned configuration (JSON form), if any
    extra_args: list[str]
    workloads: dict[str, Workload]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class ProfilesResult:
    """Both arms of every workload and the decision table; :meth:`to_dict` is the receipt's
    ``verification.profiles``."""

    model: ModelInfo
    scale: float
    results: list[ProfileResult]
    table: list[DecisionRow]
    hardware: HardwareInfo
    settings: ProfilesSettings
    notes: list[str]
    seconds: float = 0.0

    def to_dict(self, requests: bool = False) -> dict[str, Any]:
        """The receipt's ``verification.profiles`` object."""
        return {"kind": "ggufmtp profiles", "model": self.model.to_dict(PROFILES_MODEL_KEYS), "scale": self.scale,
                "workloads": {w: {r.arm: r.to_dict(requests) for r in self.results if r.workload.name == w}
                              for w in dict.fromkeys(r.workload.name for r in self.results)},
                "decision_table": [r.to_dict() for r in self.table], "hardware": self.hardware.to_dict(),
                "settings": self.settings.to_dict(),
                "notes": list(self.notes), "seconds": round(self.seconds, 2)}

    def text(self) -> str:
        return format_profiles(self.results, self.table, self.scale)


def run_profiles(model: str | os.PathLike, options: ProfilesOptions | None = None, *,
                 progress: bool = True) -> ProfilesResult:
    """Both arms of every workload of ``options`` (:class:`ProfilesOptions`), then
    :func:`decision_table`. Per workload both servers are up (only one is busy at a time); prompts
    are built once on the vanilla server; with ``repeats`` > 1 the arms alternate (V M, M V, ...)
    and each arm's requests are pooled. ``model``: a GGUF path."""
    o = options if options is not None else ProfilesOptions()
    t0 = time.monotonic()
    path = Path(model)
    if not path.is_file():
        raise ProfileError(f"model {path}: no such file")
    if gguf_has_mtp(path) is False:
        raise ProfileError(f"model {path}: has no MTP block; profiles compare MTP against vanilla")
    ws = o.scaled_workloads()
    log = (lambda m: print(m, file=sys.stderr)) if progress else (lambda m: None)
    results = [res for w in ws for res in _both_arms(path, w, o, log)]
    table = decision_table(results, o.noise)
    hw = probe_hardware(find_binary("llama-server", o.server.llama_cpp_bin), o.server.gpu_layers)
    notes = o.arm_args().notes()
    if not hw.offloaded:
        notes.append("CPU run: a small model is compute-bound on CPU; these numbers describe this machine only")
    if o.scale != 1.0:
        notes.append(f"token counts scaled by {o.scale:g} (the write-up's workloads are scale 1)")
    return ProfilesResult(
        model=ModelInfo(str(path), path.stat().st_size), scale=o.scale, results=results, table=table,
        hardware=hw, settings=ProfilesSettings(repeats=o.repeats, noise=o.noise, seed=o.seed, draft_n_max=o.draft_n_max,
                                               tuned=o.tuned.to_dict() if o.tuned is not None else None,
                                               extra_args=[*o.server.extra_args, *o.server.server_args],
                                               workloads={w.name: w for w in ws}),
        notes=notes, seconds=time.monotonic() - t0)


def _both_arms(path: Path, w: Workload, o: ProfilesOptions, log: Callable[[str], None]) -> list[ProfileResult]:
    """Workload ``w`` on a vanilla and an MTP server, both up; prompts built once on vanilla; with
    ``repeats`` > 1 the arms alternate (ABBA) and each arm's runs are pooled. [vanilla, mtp]."""
    with contextlib.ExitStack() as stack:
        try:
            van = stack.enter_context(LlamaServer(profile_server_config(path, w, False, o)))
            mtp = stack.enter_context(LlamaServer(profile_server_config(path, w, True, o)))
        except ServerError as e:
            raise ProfileError(f"workload {w.name}: {e}") from e
        try:
            prompts = build_prompts(van, w.num_requests, w.input_tokens, o.seed)
        except ServerError as e:
            raise ProfileError(f"workload {w.name}: building prompts: {e}") from e

        def run(arm: str, srv: LlamaServer, i: int) -> ProfileResult:
            log(f"workload {w.name} ({w.shape}, {w.num_requests} requests): {arm}"
                + (f" run {i + 1}/{o.repeats}" if o.repeats > 1 else ""))
            return _profile_on(srv, w, arm, prompts, o.seed, True, None)

        order = ABBA()
        runs = [order.run(lambda: run(VANILLA, van, i), lambda: run(MTP, mtp, i)) for i in range(o.repeats)]  # noqa: B023 (called within this iteration)
    return [_pool([v for v, _ in runs]), _pool([m for _, m in runs])]
