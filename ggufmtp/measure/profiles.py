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

import contextlib
import dataclasses
import http.client
import json
import math
import os
import queue
import random
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from ..errors import ProfileError, ServerError, VerifyError
from ..runtime.server import HOST, LlamaServer, ServerConfig
from ..measure.suite import DEFAULT_SUITE, load_suite, mode_request_fields, modes_for_template
from ..synth.factory import resolve_model

__all__ = [
    "ProfileError", "Workload", "WORKLOADS", "get_workload", "RequestRecord", "ProfileResult", "ProfilesResult",
    "build_prompts", "stream_chat", "aggregate", "run_profile", "run_profiles", "decision_table",
    "format_profiles", "format_decision_table", "DEFAULT_NOISE",
]

DEFAULT_NOISE = 0.02
CTX_MARGIN = 64
WARMUP_OUTPUT = 8
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

    def scaled(self, scale: float = 1.0, num_requests: int | None = None) -> "Workload":
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
            return srv.post_json("/detokenize", {"tokens": toks[:m]})["content"]

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


# ----------------------------------------------------------------------------- streaming client


@dataclass
class RequestRecord:
    index: int
    t_send: float  # perf_counter seconds
    ttft_ms: float | None
    e2e_ms: float
    n_out: int
    n_chunks: int
    itl_ms: list[float]
    prompt_n: int | None
    draft_n: int | None
    draft_n_accepted: int | None
    text: str
    error: str | None = None

    @property
    def tpot_ms(self) -> float | None:
        if self.ttft_ms is None or self.n_out < 2:
            return None
        return (self.e2e_ms - self.ttft_ms) / (self.n_out - 1)

    @property
    def t_end(self) -> float:
        return self.t_send + self.e2e_ms / 1000.0

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["tpot_ms"] = self.tpot_ms
        d.pop("itl_ms")
        d["n_itl"] = len(self.itl_ms)
        return d


def stream_chat(port: int, body: dict[str, Any], index: int = 0, timeout: float = 600.0) -> RequestRecord:
    """One streamed ``/v1/chat/completions`` request with per-chunk timestamps."""
    body = {**body, "stream": True}
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    t_send = time.perf_counter()
    first: float | None = None
    last: float | None = None
    itl: list[float] = []
    parts: list[str] = []
    n_chunks = 0
    timings: dict[str, Any] = {}
    err = None
    try:
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
                     headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
        resp = conn.getresponse()
        if resp.status >= 400:
            raise ProfileError(f"HTTP {resp.status}: {resp.read()[:500].decode(errors='replace')}")
        while True:
            line = resp.readline()
            if not line:
                break
            now = time.perf_counter()
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            obj = json.loads(data)
            if "error" in obj:
                raise ProfileError(f"stream error: {str(obj['error'])[:300]}")
            if isinstance(obj.get("timings"), dict):
                timings = obj["timings"]
            for ch in obj.get("choices") or []:
                delta = ch.get("delta") or {}
                piece = (delta.get("content") or "") + (delta.get("reasoning_content") or "")
                if piece:
                    n_chunks += 1
                    parts.append(piece)
                    if first is None:
                        first = now
                    else:
                        itl.append((now - last) * 1000.0)  # type: ignore[operator]
                    last = now
    except (OSError, http.client.HTTPException, json.JSONDecodeError, ProfileError) as e:
        err = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
    t_end = time.perf_counter()
    return RequestRecord(
        index=index, t_send=t_send, ttft_ms=(first - t_send) * 1000.0 if first is not None else None,
        e2e_ms=(t_end - t_send) * 1000.0, n_out=int(timings.get("predicted_n") or n_chunks), n_chunks=n_chunks,
        itl_ms=itl, prompt_n=timings.get("prompt_n"), draft_n=timings.get("draft_n"),
        draft_n_accepted=timings.get("draft_n_accepted"), text="".join(parts), error=err)


def _run_clients(port: int, bodies: Sequence[dict[str, Any]], concurrency: int) -> list[RequestRecord]:
    q: "queue.Queue[tuple[int, dict]]" = queue.Queue()
    for i, b in enumerate(bodies):
        q.put((i, b))
    out: list[RequestRecord] = []
    lock = threading.Lock()

    def worker() -> None:
        while True:
            try:
                i, b = q.get_nowait()
            except queue.Empty:
                return
            r = stream_chat(port, b, i)
            with lock:
                out.append(r)

    ts = [threading.Thread(target=worker, daemon=True) for _ in range(min(concurrency, len(bodies)))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sorted(out, key=lambda r: r.index)


# ----------------------------------------------------------------------------- aggregation


def _dist(xs: Sequence[float]) -> dict[str, float | None]:
    a = np.asarray([x for x in xs if x is not None], dtype=float)
    if a.size == 0:
        return {"mean": None, "median": None, "p99": None, "n": 0}
    return {"mean": float(a.mean()), "median": float(np.median(a)), "p99": float(np.percentile(a, 99)),
            "n": int(a.size)}


def aggregate(records: Sequence[RequestRecord], duration_s: float) -> dict[str, Any]:
    """Serving metrics of a set of requests run over ``duration_s`` seconds of wall time."""
    ok = [r for r in records if r.error is None]
    n_out = sum(r.n_out for r in ok)
    dn = sum(r.draft_n or 0 for r in ok)
    da = sum(r.draft_n_accepted or 0 for r in ok)
    return {
        "requests": len(records), "failed": len(records) - len(ok), "duration_s": duration_s,
        "output_tokens": n_out,
        "output_tokens_per_second": n_out / duration_s if duration_s > 0 else None,
        "request_throughput": len(ok) / duration_s if duration_s > 0 else None,
        "mean_prompt_tokens": float(np.mean([r.prompt_n for r in ok if r.prompt_n is not None]))
        if any(r.prompt_n is not None for r in ok) else None,
        "ttft_ms": _dist([r.ttft_ms for r in ok]),
        "tpot_ms": _dist([r.tpot_ms for r in ok]),
        "itl_ms": _dist([x for r in ok for x in r.itl_ms]),
        "e2e_ms": _dist([r.e2e_ms for r in ok]),
        "draft_n": dn, "draft_n_accepted": da, "acceptance": da / dn if dn else None,
    }


# ----------------------------------------------------------------------------- one profile


@dataclass
class ProfileResult:
    workload: Workload
    arm: str  # "vanilla" | "mtp"
    metrics: dict[str, Any]
    requests: list[RequestRecord]
    command: str
    settings: dict[str, Any]
    spec: dict[str, Any] | None = None  # /metrics deltas (MTP arm)
    notes: list[str] = field(default_factory=list)

    def to_dict(self, requests: bool = False) -> dict[str, Any]:
        d = {"workload": dataclasses.asdict(self.workload), "arm": self.arm, "metrics": self.metrics,
             "command": self.command, "settings": self.settings, "spec": self.spec, "notes": list(self.notes)}
        if requests:
            d["requests"] = [r.to_dict() for r in self.requests]
        return d


def profile_server_config(model: Path, w: Workload, mtp: bool, *, draft_n_max: int | None = 3, tuned: Any = None,
                          gpu_layers: int | str | None = None, threads: int | None = None,
                          llama_cpp_bin: str | os.PathLike | None = None, extra_args: Sequence[str] = (),
                          ctx_size: int | None = None) -> ServerConfig:
    per_slot = w.input_tokens + w.output_tokens + CTX_MARGIN
    ctx = ctx_size or int(math.ceil(per_slot * w.concurrency / 256) * 256)
    base = dict(model=model, ctx_size=ctx, threads=threads, gpu_layers=gpu_layers, parallel=w.concurrency,
                llama_cpp_bin=llama_cpp_bin, metrics=True)
    base["extra_args"] = list(extra_args)
    if not mtp:
        return ServerConfig(**base)
    if tuned is None:
        return ServerConfig(**base, draft_mtp=True, draft_n_max=draft_n_max)
    from ..measure.tune import TuneConfig

    return ServerConfig(**TuneConfig.coerce(tuned).server_fields(base))


def _bodies(prompts: Sequence[dict[str, Any]], max_tokens: int, mode: str, seed: int) -> list[dict[str, Any]]:
    return [{"messages": [{"role": "user", "content": p["content"]}], "max_tokens": max_tokens, "temperature": 0.0,
             "seed": seed + i, "ignore_eos": True, "cache_prompt": False, **mode_request_fields(mode)}
            for i, p in enumerate(prompts)]


def _measure(srv: LlamaServer, w: Workload, prompts: Sequence[dict[str, Any]], mode: str, seed: int,
             warmup: bool) -> tuple[list[RequestRecord], float, dict[str, Any] | None]:
    from ..measure.verify import _delta, _metrics_snapshot

    if warmup:
        wb = _bodies(prompts[:w.concurrency], WARMUP_OUTPUT, mode, seed + 10_000)
        recs = _run_clients(srv.port, wb, w.concurrency)  # type: ignore[arg-type]
        bad = [r for r in recs if r.error]
        if bad:
            raise ProfileError(f"warm-up request failed: {bad[0].error}; log {srv.log_path}")
    snap = _metrics_snapshot(srv)
    t0 = time.perf_counter()
    recs = _run_clients(srv.port, _bodies(prompts, w.output_tokens, mode, seed), w.concurrency)  # type: ignore[arg-type]
    t1 = time.perf_counter()
    spec = None
    if snap["has_spec"] and srv.config.draft_mtp:
        time.sleep(0.05)
        d = _delta(snap, _metrics_snapshot(srv))
        spec = {"draft_tokens": d["draft_tokens"], "accepted": d["accepted"], "n_drafts": d["drafts"],
                "tokens_per_step": 1 + d["accepted"] / d["drafts"] if d["drafts"] else None,
                "per_position": [c / d["drafts"] for c in d["per_pos"]] if d["drafts"] else None}
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
    path = resolve_model(model)
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
    if m["failed"]:
        notes.append(f"{m['failed']} request(s) failed: {next(r.error for r in recs if r.error)}")
    if arm == "mtp" and not m["draft_n"]:
        notes.append("the MTP arm never drafted (no timings.draft_n)")
    from ..measure.tune import server_command

    return ProfileResult(workload=w, arm=arm, metrics=m, requests=recs, command=server_command(srv.config, srv.binary),
                         settings={"mode": mode, "seed": seed, "prompt_tokens_target": w.input_tokens,
                                   "prompt_tokens_built": [p.get("prompt_tokens") for p in prompts[:w.num_requests]],
                                   "ignore_eos": True, "temperature": 0.0, "cache_prompt": False,
                                   "warmup_requests": w.concurrency if warmup else 0},
                         spec=spec, notes=notes)


def _pool(results: Sequence[ProfileResult]) -> ProfileResult:
    """Several runs of one arm -> one result (requests pooled, durations summed)."""
    if len(results) == 1:
        return results[0]
    recs = [r for res in results for r in res.requests]
    m = aggregate(recs, sum(res.metrics["duration_s"] for res in results))
    m["runs"] = len(results)
    spec = None
    if all(res.spec for res in results):
        dt = sum(res.spec["draft_tokens"] for res in results)  # type: ignore[index]
        ac = sum(res.spec["accepted"] for res in results)  # type: ignore[index]
        nd = sum(res.spec["n_drafts"] for res in results)  # type: ignore[index]
        spec = {"draft_tokens": dt, "accepted": ac, "n_drafts": nd, "tokens_per_step": 1 + ac / nd if nd else None,
                "per_position": None}
    r0 = results[0]
    return ProfileResult(r0.workload, r0.arm, m, recs, r0.command, r0.settings, spec,
                         [n for res in results for n in res.notes])


# ----------------------------------------------------------------------------- all profiles


@dataclass
class ProfilesResult:
    model: dict[str, Any]
    scale: float
    results: list[ProfileResult]
    table: list[dict[str, Any]]
    hardware: dict[str, Any]
    settings: dict[str, Any]
    notes: list[str]
    seconds: float = 0.0

    def to_dict(self, requests: bool = False) -> dict[str, Any]:
        """The receipt's ``verification.profiles`` object."""
        return {"kind": "ggufmtp profiles", "model": self.model, "scale": self.scale,
                "workloads": {w: {r.arm: r.to_dict(requests) for r in self.results if r.workload.name == w}
                              for w in dict.fromkeys(r.workload.name for r in self.results)},
                "decision_table": self.table, "hardware": self.hardware, "settings": self.settings,
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
) -> ProfilesResult:
    """Both arms of every workload, then :func:`decision_table`. Per workload both servers are up (only
    one is busy at a time); prompts are built once on the vanilla server; with ``repeats`` > 1 the arms
    alternate (V M, M V, ...) and each arm's requests are pooled."""
    from ..measure.verify import hardware_info

    t0 = time.monotonic()
    if repeats < 1:
        raise ProfileError("repeats must be at least 1")
    path = resolve_model(model)
    if not path.is_file():
        raise ProfileError(f"model {path}: no such file")
    from ..runtime.server import gguf_has_mtp

    if gguf_has_mtp(path) is False:
        raise ProfileError(f"model {path}: has no MTP block; profiles compare MTP against vanilla")
    ws = [get_workload(w).scaled(scale, num_requests) for w in workloads]
    if not ws:
        raise ProfileError("no workloads")
    log = (lambda m: print(m, file=sys.stderr)) if progress else (lambda m: None)
    results: list[ProfileResult] = []
    for w in ws:
        kw = dict(draft_n_max=draft_n_max, tuned=tuned, gpu_layers=gpu_layers, threads=threads,
                  llama_cpp_bin=llama_cpp_bin, extra_args=extra_args)
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
            runs: dict[str, list[ProfileResult]] = {"vanilla": [], "mtp": []}
            for i in range(repeats):
                order = [("vanilla", van), ("mtp", mtp)] if i % 2 == 0 else [("mtp", mtp), ("vanilla", van)]
                for arm, srv in order:
                    log(f"workload {w.name} ({w.shape}, {w.num_requests} requests): {arm}"
                        + (f" run {i + 1}/{repeats}" if repeats > 1 else ""))
                    runs[arm].append(_profile_on(srv, w, arm, prompts, seed, True, None))
            for arm in ("vanilla", "mtp"):
                results.append(_pool(runs[arm]))
    table = decision_table(results, noise)
    from ..runtime.build import find_binary

    hw = hardware_info(find_binary("llama-server", llama_cpp_bin), gpu_layers)
    notes = []
    if not hw["offloaded"]:
        notes.append("CPU run: a small model is compute-bound on CPU; these numbers describe this machine only")
    if scale != 1.0:
        notes.append(f"token counts scaled by {scale:g} (the write-up's workloads are scale 1)")
    return ProfilesResult(
        model={"path": str(path), "size_bytes": path.stat().st_size}, scale=scale, results=results, table=table,
        hardware=hw, settings={"repeats": repeats, "noise": noise, "seed": seed, "draft_n_max": draft_n_max,
                               "tuned": (tuned.to_dict() if hasattr(tuned, "to_dict") else tuned),
                               "extra_args": list(extra_args),
                               "workloads": {w.name: dataclasses.asdict(w) for w in ws}},
        notes=notes, seconds=time.monotonic() - t0)


# ----------------------------------------------------------------------------- decision table


def _rel(new: float | None, old: float | None) -> float | None:
    if new is None or old is None or old == 0:
        return None
    return new / old - 1.0


def _pm(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:+.1f}%"


def decision_table(results: Sequence[ProfileResult], noise: float = DEFAULT_NOISE) -> list[dict[str, Any]]:
    """One row per workload that has both arms: MTP helps ("yes"/"no") and why, with the deltas
    (MTP relative to vanilla) of output tok/s and of mean/P99 TTFT, TPOT, ITL.

    Rule: "no" unless output tok/s improves by more than ``noise``; then "mixed" if the mean TPOT
    is worse by more than ``noise`` (throughput bought with slower per-request decoding), else
    "yes". ``within_noise`` marks |throughput delta| <= ``noise``. P99 regressions over 10% are
    listed in the reasoning either way."""
    by: dict[str, dict[str, ProfileResult]] = {}
    for r in results:
        by.setdefault(r.workload.name, {})[r.arm] = r
    rows = []
    for name, arms in by.items():
        if "vanilla" not in arms or "mtp" not in arms:
            continue
        v, m = arms["vanilla"].metrics, arms["mtp"].metrics
        w = arms["mtp"].workload
        d = {"throughput": _rel(m["output_tokens_per_second"], v["output_tokens_per_second"])}
        for met in ("ttft_ms", "tpot_ms", "itl_ms"):
            for stat in ("mean", "p99"):
                d[f"{met[:-3]}_{stat}"] = _rel(m[met][stat], v[met][stat])
        tp, tpot = d["throughput"], d["tpot_mean"]
        helps = tp is not None and tp > noise
        slower_streams = helps and tpot is not None and tpot > noise
        within = tp is not None and abs(tp) <= noise
        why = [f"{_pm(tp)} throughput"]
        for key, label in (("ttft_mean", "TTFT"), ("tpot_mean", "TPOT"), ("itl_mean", "ITL")):
            p99 = d[key.replace("mean", "p99")]
            why.append(f"{_pm(d[key])} {label} (P99 {_pm(p99)})")
        regress = [lab for key, lab in (("tpot_p99", "P99 TPOT"), ("itl_p99", "P99 ITL"), ("ttft_p99", "P99 TTFT"))
                   if d[key] is not None and d[key] > 0.10]
        reasoning = ", ".join(why)
        if within:
            reasoning += f"; throughput within the ±{noise:.0%} noise band"
        if slower_streams:
            reasoning += f"; mixed: more throughput but each request decodes slower (TPOT {_pm(tpot)})"
        if regress:
            reasoning += f"; tail regression: {', '.join(regress)}"
        va = arms["vanilla"].requests
        ma = arms["mtp"].requests
        same = [a.text == b.text for a, b in zip(va, ma) if a.error is None and b.error is None]
        rows.append({
            "workload": name, "title": w.title, "shape": w.shape,
            "input_tokens": w.input_tokens, "output_tokens": w.output_tokens, "concurrency": w.concurrency,
            "num_requests": w.num_requests,
            "vanilla_tokens_per_second": v["output_tokens_per_second"], "mtp_tokens_per_second": m["output_tokens_per_second"],
            "acceptance": m["acceptance"], "deltas": d,
            "mtp_helps": "mixed" if slower_streams else "yes" if helps else "no", "within_noise": within,
            "reasoning": reasoning,
            "identical_output_fraction": (sum(same) / len(same)) if same else None,
        })
    return rows


def _f(x: float | None, nd: int = 1) -> str:
    return "n/a" if x is None else f"{x:.{nd}f}"


def format_profiles(results: Sequence[ProfileResult], table: Sequence[dict[str, Any]] | None = None,
                    scale: float = 1.0) -> str:
    L: list[str] = []
    by: dict[str, dict[str, ProfileResult]] = {}
    for r in results:
        by.setdefault(r.workload.name, {})[r.arm] = r
    for name, arms in by.items():
        w = next(iter(arms.values())).workload
        L.append(f"workload {name}: {w.title} ({w.shape}; {w.num_requests} requests"
                 + (f"; scale {scale:g}" if scale != 1.0 else "") + ")")
        L.append(f"  {'metric':<22} {'vanilla':>12} {'MTP':>12} {'delta':>9}")
        rows = [("output tok/s", "output_tokens_per_second", None), ("request/s", "request_throughput", None),
                ("prompt tokens (mean)", "mean_prompt_tokens", None)]
        for met, lab in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2e_ms", "E2E")):
            for stat in ("mean", "median", "p99"):
                rows.append((f"{lab} {stat} (ms)", met, stat))
        v, m = arms.get("vanilla"), arms.get("mtp")
        for lab, key, stat in rows:
            def get(res: ProfileResult | None) -> float | None:
                if res is None:
                    return None
                x = res.metrics[key]
                return x[stat] if stat else x
            a, b = get(v), get(m)
            L.append(f"  {lab:<22} {_f(a, 2):>12} {_f(b, 2):>12} {_pm(_rel(b, a)):>9}")
        if m is not None:
            acc = m.metrics.get("acceptance")
            tps = (m.spec or {}).get("tokens_per_step")
            L.append(f"  {'acceptance':<22} {'':>12} {('n/a' if acc is None else f'{acc * 100:.1f}%'):>12}"
                     + (f"   ({tps:.2f} tokens per step)" if tps else ""))
        for res in arms.values():
            for n in res.notes:
                L.append(f"  note ({res.arm}): {n}")
        L.append("")
    if table:
        L.append(format_decision_table(table))
    return "\n".join(L)


def format_decision_table(table: Sequence[dict[str, Any]]) -> str:
    L = [f"{'workload':<28} {'MTP?':<5} reasoning"]
    for r in table:
        L.append(f"{r['workload'] + ' ' + r['title'] + ' (' + str(r['concurrency']) + ')':<28} "
                 f"{r['mtp_helps']:<5} {r['reasoning']}")
    return "\n".join(L)
