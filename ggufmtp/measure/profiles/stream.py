"""The streaming client of ``ggufmtp profiles``: ``concurrency`` client threads stream
``/v1/chat/completions`` (Server-Sent Events) with a timestamp per chunk (:class:`RequestRecord`),
and :func:`aggregate` turns the records into serving metrics (output tok/s; mean, median and P99 of
TTFT, TPOT, ITL and e2e). See :mod:`ggufmtp.measure.profiles.run` for the method.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import ProfileError
from ...runtime.process import HOST

__all__ = ["RequestRecord", "Distribution", "ServingMetrics", "stream_chat", "run_clients", "aggregate"]


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


def run_clients(port: int, bodies: Sequence[dict[str, Any]], concurrency: int) -> list[RequestRecord]:
    """``bodies`` streamed by ``concurrency`` client threads pulling from one queue (like ``vllm bench
    serve --max-concurrency``); the records in request order."""
    q: queue.Queue[tuple[int, dict]] = queue.Queue()
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


@dataclass(frozen=True)
class Distribution:
    """Mean, median and P99 (numpy linear interpolation) of one latency, over ``n`` values."""

    mean: float | None
    median: float | None
    p99: float | None
    n: int


@dataclass(frozen=True)
class ServingMetrics:
    """Serving metrics of a set of requests (:func:`aggregate`); ``runs``: how many runs were pooled
    (only when more than one)."""

    requests: int
    failed: int
    duration_s: float
    output_tokens: int
    output_tokens_per_second: float | None
    request_throughput: float | None
    mean_prompt_tokens: float | None
    ttft_ms: Distribution
    tpot_ms: Distribution
    itl_ms: Distribution
    e2e_ms: Distribution
    draft_n: int
    draft_n_accepted: int
    acceptance: float | None
    runs: int | None = None

    def value(self, key: str, stat: str | None = None) -> float | None:
        """The metric ``key`` (with ``stat``, that statistic of a distribution)."""
        x = getattr(self, key)
        return getattr(x, stat) if stat else x

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if self.runs is None:
            del d["runs"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ServingMetrics:
        """The metrics of a :meth:`to_dict` object (e.g. a saved ``profiles`` JSON)."""
        dists = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
        return cls(**{k: Distribution(**v) if k in dists else v for k, v in d.items()})


def _dist(xs: Sequence[float]) -> Distribution:
    a = np.asarray([x for x in xs if x is not None], dtype=float)
    if a.size == 0:
        return Distribution(None, None, None, 0)
    return Distribution(float(a.mean()), float(np.median(a)), float(np.percentile(a, 99)), int(a.size))


def aggregate(records: Sequence[RequestRecord], duration_s: float, runs: int | None = None) -> ServingMetrics:
    """Serving metrics of a set of requests run over ``duration_s`` seconds of wall time (``runs``:
    the number of runs pooled into them, when more than one)."""
    ok = [r for r in records if r.error is None]
    n_out = sum(r.n_out for r in ok)
    dn = sum(r.draft_n or 0 for r in ok)
    da = sum(r.draft_n_accepted or 0 for r in ok)
    return ServingMetrics(
        requests=len(records), failed=len(records) - len(ok), duration_s=duration_s, output_tokens=n_out,
        output_tokens_per_second=n_out / duration_s if duration_s > 0 else None,
        request_throughput=len(ok) / duration_s if duration_s > 0 else None,
        mean_prompt_tokens=float(np.mean([r.prompt_n for r in ok if r.prompt_n is not None]))
        if any(r.prompt_n is not None for r in ok) else None,
        ttft_ms=_dist([r.ttft_ms for r in ok]), tpot_ms=_dist([r.tpot_ms for r in ok]),
        itl_ms=_dist([x for r in ok for x in r.itl_ms]), e2e_ms=_dist([r.e2e_ms for r in ok]),
        draft_n=dn, draft_n_accepted=da, acceptance=da / dn if dn else None, runs=runs)
