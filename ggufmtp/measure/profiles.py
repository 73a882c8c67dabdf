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

The decision table (whether MTP helps each workload, and why): :mod:`ggufmtp.measure.workloads`.
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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ProfileError, ServerError, TuneError
from ..measure.arms import ABBA, MTP, VANILLA
from ..measure.options import ArmArgs, TuneConfig
from ..measure.profiles_stream import RequestRecord, aggregate, run_clients
from ..measure.records import PROFILES_MODEL_KEYS, ModelInfo
from ..measure.suite import DEFAULT_SUITE, load_suite, mode_request_fields, modes_for_template
from ..measure.workloads import (
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
from ..runtime.build import find_binary
from ..runtime.hardware import HardwareInfo, probe_hardware
from ..runtime.server import LlamaServer, ServerConfig, display_command, gguf_has_mtp

__all__ = ["ProfilesResult", "build_prompts", "profile_server_config", "run_profile", "run_profiles"]

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



def profile_server_config(model: Path, w: Workload, mtp: bool, *, draft_n_max: int | None = 3, tuned: Any = None,
                          gpu_layers: int | str | None = None, threads: int | None = None,
                          llama_cpp_bin: str | os.PathLike | None = None, extra_args: Sequence[str] = (),
                          ctx_size: int | None = None, mtp_server_args: Sequence[str] = (),
                          vanilla_server_args: Sequence[str] = ()) -> ServerConfig:
    """One arm's server for workload ``w``. Fair baseline: ``extra_args`` (``--server-arg``) and a
    tuned configuration's non-speculative part (``-bs``, threads, graph optimisation) go to both
    arms; ``mtp_server_args`` / ``vanilla_server_args`` to one (see :class:`ArmArgs`)."""
    per_slot = w.input_tokens + w.output_tokens + CTX_MARGIN
    ctx = ctx_size or int(math.ceil(per_slot * w.concurrency / 256) * 256)
    base = dict(model=model, ctx_size=ctx, threads=threads, gpu_layers=gpu_layers, parallel=w.concurrency,
                llama_cpp_bin=llama_cpp_bin, metrics=True, extra_args=[])
    try:
        arms = ArmArgs.of(extra_args, mtp_server_args, vanilla_server_args,
                          TuneConfig.coerce(tuned) if tuned is not None else None)
    except TuneError as e:
        raise ProfileError(str(e)) from e
    if not mtp:
        return ServerConfig(**arms.vanilla_fields(base))
    return ServerConfig(**arms.mtp_fields(base, draft_n_max))


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


def run_profile(
    model: str | os.PathLike,
    workload: str | Workload,
    mtp: bool,
    scale: float = 1.0,
    num_requests: int | None = None,
    draft_n_max: int | None = 3,
    tuned: Any = None,
    gpu_layers: int | str | None = None,
    threads: int | None = None,
    llama_cpp_bin: str | os.PathLike | None = None,
    seed: int = 0,
    warmup: bool = True,
    prompts: Sequence[dict[str, Any]] | None = None,
    server: LlamaServer | None = None,
    extra_args: Sequence[str] = (),
    ctx_size: int | None = None,
    mode: str | None = None,
) -> ProfileResult:
    """One arm of one workload (see the module docstring). ``tuned``: a :class:`ggufmtp.tune.TuneConfig`
    (or its dict) for the MTP arm's flags, else ``--spec-draft-n-max draft_n_max``. ``server``: reuse a
    running server (its flags must fit the workload); ``prompts``: reuse prompts from :func:`build_prompts`."""
    w = get_workload(workload).scaled(scale, num_requests)
    path = Path(model)
    if not path.is_file():
        raise ProfileError(f"model {path}: no such file")
    cfg = profile_server_config(path, w, mtp, draft_n_max=draft_n_max, tuned=tuned, gpu_layers=gpu_layers,
                                threads=threads, llama_cpp_bin=llama_cpp_bin, extra_args=extra_args, ctx_size=ctx_size)
    with contextlib.ExitStack() as stack:
        if server is None:
            try:
                srv = stack.enter_context(LlamaServer(cfg))
            except ServerError as e:
                raise ProfileError(f"{'MTP' if mtp else 'vanilla'} server for workload {w.name}: {e}") from e
        else:
            srv = server
        return _profile_on(srv, w, "mtp" if mtp else "vanilla", prompts, seed, warmup, mode)


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


def run_profiles(
    model: str | os.PathLike,
    workloads: Iterable[str | Workload] = ("A", "B", "C", "D"),
    scale: float = 1.0,
    num_requests: int | None = None,
    draft_n_max: int | None = 3,
    tuned: Any = None,
    gpu_layers: int | str | None = None,
    threads: int | None = None,
    llama_cpp_bin: str | os.PathLike | None = None,
    seed: int = 0,
    repeats: int = 1,
    noise: float = DEFAULT_NOISE,
    extra_args: Sequence[str] = (),
    progress: bool = True,
    mtp_server_args: Sequence[str] = (),
    vanilla_server_args: Sequence[str] = (),
) -> ProfilesResult:
    """Both arms of every workload, then :func:`decision_table`. Per workload both servers are up (only
    one is busy at a time); prompts are built once on the vanilla server; with ``repeats`` > 1 the arms
    alternate (V M, M V, ...) and each arm's requests are pooled. ``model``: a GGUF path."""
    t0 = time.monotonic()
    if repeats < 1:
        raise ProfileError("repeats must be at least 1")
    path = Path(model)
    if not path.is_file():
        raise ProfileError(f"model {path}: no such file")
    if gguf_has_mtp(path) is False:
        raise ProfileError(f"model {path}: has no MTP block; profiles compare MTP against vanilla")
    ws = [get_workload(w).scaled(scale, num_requests) for w in workloads]
    if not ws:
        raise ProfileError("no workloads")
    log = (lambda m: print(m, file=sys.stderr)) if progress else (lambda m: None)
    kw = dict(draft_n_max=draft_n_max, tuned=tuned, gpu_layers=gpu_layers, threads=threads,
              llama_cpp_bin=llama_cpp_bin, extra_args=extra_args, mtp_server_args=mtp_server_args,
              vanilla_server_args=vanilla_server_args)
    results = [res for w in ws for res in _both_arms(path, w, kw, seed, repeats, log)]
    table = decision_table(results, noise)
    hw = probe_hardware(find_binary("llama-server", llama_cpp_bin), gpu_layers)
    notes = ArmArgs(tuple(extra_args), tuple(mtp_server_args), tuple(vanilla_server_args)).notes()
    if not hw.offloaded:
        notes.append("CPU run: a small model is compute-bound on CPU; these numbers describe this machine only")
    if scale != 1.0:
        notes.append(f"token counts scaled by {scale:g} (the write-up's workloads are scale 1)")
    return ProfilesResult(
        model=ModelInfo(str(path), path.stat().st_size), scale=scale, results=results, table=table,
        hardware=hw, settings=ProfilesSettings(repeats=repeats, noise=noise, seed=seed, draft_n_max=draft_n_max,
                                               tuned=(tuned.to_dict() if hasattr(tuned, "to_dict") else tuned),
                                               extra_args=list(extra_args), workloads={w.name: w for w in ws}),
        notes=notes, seconds=time.monotonic() - t0)



def _both_arms(path: Path, w: Workload, kw: dict[str, Any], seed: int, repeats: int,
               log: Callable[[str], None]) -> list[ProfileResult]:
    """Workload ``w`` on a vanilla and an MTP server, both up; prompts built once on vanilla; with
    ``repeats`` > 1 the arms alternate (ABBA) and each arm's runs are pooled. [vanilla, mtp]."""
    with contextlib.ExitStack() as stack:
        try:
            van = stack.enter_context(LlamaServer(profile_server_config(path, w, False, **kw)))
            mtp = stack.enter_context(LlamaServer(profile_server_config(path, w, True, **kw)))
        except ServerError as e:
            raise ProfileError(f"workload {w.name}: {e}") from e
        try:
            prompts = build_prompts(van, w.num_requests, w.input_tokens, seed)
        except ServerError as e:
            raise ProfileError(f"workload {w.name}: building prompts: {e}") from e

        def run(arm: str, srv: LlamaServer, i: int) -> ProfileResult:
            log(f"workload {w.name} ({w.shape}, {w.num_requests} requests): {arm}"
                + (f" run {i + 1}/{repeats}" if repeats > 1 else ""))
            return _profile_on(srv, w, arm, prompts, seed, True, None)

        order = ABBA()
        runs = [order.run(lambda: run(VANILLA, van, i), lambda: run(MTP, mtp, i)) for i in range(repeats)]  # noqa: B023 (called within this iteration)
    return [_pool([v for v, _ in runs]), _pool([m for _, m in runs])]
