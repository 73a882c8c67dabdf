"""The llama-server log lines that benchmarks/draft_cost.py reads (issue #52), as the pinned llama.cpp
(0c1e570) writes them with ``-lv 5``. Parsing only: no server is started here.

- ``statistics draft-mtp`` (common/speculative.cpp, trace level 4): the drafter's cumulative calls,
  tokens and times;
- ``graphs reused = N`` (tools/server/server-context.cpp ``print_timings``, info level 3): written
  once per request on every server, so it marks where each request's lines end, and N counts the
  target context's graphs that llama.cpp reused instead of rebuilding (cumulative since the
  server's start-up warm-up);
- the CUDA backend's graph lines (ggml/src/ggml-cuda/ggml-cuda.cu, ``GGML_LOG_DEBUG``): debug level 5.
  common_log_default_callback (common/log.cpp) drops a ggml debug line below ``-lv 5``, so the
  traced servers run at 5, not at 4.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

# common_speculative_print_stats (common/speculative.cpp at the pin), one line per implementation
STATS_RE = re.compile(
    r"statistics\s+(?P<impl>\S+): #calls\(b,g,a\) =\s*(?P<b>\d+)\s+(?P<g>\d+)\s+(?P<a>\d+), #gen drafts =\s*\d+, "
    r"#acc drafts =\s*\d+, #gen tokens =\s*(?P<gen>\d+), #acc tokens =\s*(?P<acc>\d+).*?"
    r"dur\(b,g,a\) = (?P<tb>[\d.]+), (?P<tg>[\d.]+), (?P<ta>[\d.]+) ms")

# server_slot::print_timings: SLT_INF(*this, "   graphs reused = %10d\n", llama_perf_context(ctx_tgt).n_reused);
REQUEST_END_RE = re.compile(r"\|\s+graphs reused =\s*(?P<n>\d+)[ \t]*$", re.M)

# a CUDA device in use: llama_model_load_from_file_impl's "using device %s (%s) (%s) - %zu MiB free" (src/llama.cpp)
# or ggml_cuda_init's "%s: found %d " GGML_CUDA_NAME " devices" (ggml-cuda.cu)
CUDA_DEVICE_RE = re.compile(r"using device CUDA\d+|found \d+ CUDA devices")

# The graph lines of ggml-cuda.cu at the pin, each quoted; which of them a release build (NDEBUG) prints:
CUDA_GRAPH_RES = {
    # ggml_cuda_graph_update_required, release too: GGML_LOG_DEBUG("CUDA Graph id %zu reused\n", cgraph->uid);
    "reused": re.compile(r"CUDA Graph id (\d+) reused"),
    # ggml_backend_cuda_graph_compute, release too: GGML_LOG_DEBUG("%s: CUDA graph warmup complete\n", __func__);
    "warmup_complete": re.compile(r"CUDA graph warmup complete"),
    # ggml_backend_cuda_graph_compute, release too: GGML_LOG_DEBUG("%s: CUDA graph warmup reset\n", __func__);
    "warmup_reset": re.compile(r"CUDA graph warmup reset"),
    # ggml_cuda_graph_check_compability, under #ifndef NDEBUG (debug builds only):
    #   GGML_LOG_DEBUG("%s: disabling CUDA graphs due to unsupported node type\n", __func__);
    "disabled_unsupported_node": re.compile(r"disabling CUDA graphs due to unsupported node type"),
}

NOT_CUDA = "no CUDA graph lines (not a CUDA backend)"
# A graph that ggml_cuda_graph_check_compability rejects (a MUL_MAT_ID on the sync fallback) runs with no line
# at all in a release build, and so does every graph with graphs off.
NOT_LOGGED = ("CUDA graph lines not logged at this trace level: --trace-level 5 logs them (ggml's debug lines), "
              "at a cost to the traced arms' speed")
NO_GRAPH_LINES = ("a CUDA device but no CUDA graph lines: no graph captured or reused (graphs off: "
                  "GGML_CUDA_DISABLE_GRAPHS or a build without GGML_CUDA_GRAPHS; or every graph rejected, e.g. a "
                  "MUL_MAT_ID on the sync fallback, which a release build disables without a line)")


@dataclasses.dataclass(frozen=True)
class DraftStats:
    """One reading of the speculative implementation's cumulative counters and times (ms)."""

    draft_calls: int = 0
    accept_calls: int = 0
    drafted: int = 0
    accepted: int = 0
    begin_ms: float = 0.0
    draft_ms: float = 0.0
    accept_ms: float = 0.0

    @classmethod
    def readings(cls, log: str, impl: str = "draft-mtp") -> list[DraftStats]:
        return [cls(int(m["g"]), int(m["a"]), int(m["gen"]), int(m["acc"]), float(m["tb"]), float(m["tg"]),
                    float(m["ta"])) for m in STATS_RE.finditer(log) if m["impl"] == impl]

    def since(self, earlier: DraftStats) -> DraftStats:
        return DraftStats(*(getattr(self, f.name) - getattr(earlier, f.name) for f in dataclasses.fields(self)))


def request_ends(log: str) -> list[tuple[int, int]]:
    """(offset just past the line, the cumulative ``graphs reused``) of each request's timing line, in order."""
    return [(m.end(), int(m["n"])) for m in REQUEST_END_RE.finditer(log)]


@dataclasses.dataclass(frozen=True)
class GraphUse:
    """What the log says about graph reuse over a stretch of requests: counts, not rates.

    ``llama_reused``: target graphs llama.cpp reused instead of rebuilding (any backend). The CUDA
    counts: graph launches that skipped the property check because the graph id was unchanged
    (``reused``), captures after a stable warm-up call (``warmup_complete``), graphs whose node
    properties changed after warm-up, so that call ran without a CUDA graph (``warmup_reset``),
    and compatibility rejections (debug builds only). A launch of a graph that was rebuilt but
    compared equal writes no line, so ``reused`` is a floor on graph launches, not their count. The
    lines do not say which context wrote them (the MTP draft runs in a context of its own), and each
    request's prompt pass is counted with its decode steps (a few graphs per request)."""

    cuda: bool
    llama_reused: int
    reused: int = 0
    warmup_complete: int = 0
    warmup_reset: int = 0
    disabled_unsupported_node: int = 0
    reused_ids: int = 0  # distinct graph ids among the ``reused`` lines
    debug_logged: bool = True  # the server logged ggml's debug lines (-lv 5): without them no CUDA line can appear

    @classmethod
    def between(cls, log: str, first: int, last: int, debug_logged: bool = True) -> GraphUse:
        """The lines after request ``first``'s timing line up to request ``last``'s (1-based: request 1 is
        the warm-up, so ``between(log, 1, n)`` is the measured requests)."""
        ends = request_ends(log)
        if len(ends) < last:
            raise ValueError(f"the log has {len(ends)} request timing lines ('graphs reused'), expected {last}")
        (start, reused0), (end, reused1) = ends[first - 1], ends[last - 1]
        part = log[start:end]
        counts = {name: len(rx.findall(part)) for name, rx in CUDA_GRAPH_RES.items()}
        return cls(cuda=bool(CUDA_DEVICE_RE.search(log)), llama_reused=reused1 - reused0, **counts,
                   reused_ids=len(set(CUDA_GRAPH_RES["reused"].findall(part))), debug_logged=debug_logged)

    @property
    def cuda_lines(self) -> int:
        return self.reused + self.warmup_complete + self.warmup_reset + self.disabled_unsupported_node

    def note(self) -> str | None:
        """Why there are no CUDA graph counts to show, or None when there are."""
        if self.cuda_lines:
            return None
        if not self.cuda:
            return NOT_CUDA
        return NO_GRAPH_LINES if self.debug_logged else NOT_LOGGED

    def rates(self, units: int) -> GraphRates:
        """The counts per unit (an MTP step, a vanilla token)."""
        n = max(units, 1)
        cuda = None if self.note() else (self.reused / n, self.warmup_complete / n, self.warmup_reset / n,
                                         self.disabled_unsupported_node / n)
        return GraphRates(self.llama_reused / n, cuda, self.note(), self.reused_ids)


@dataclasses.dataclass(frozen=True)
class GraphRates:
    """Graph use per unit. ``cuda``: (reused, warm-up complete, warm-up reset, disabled) per unit, or None
    with ``note`` saying why."""

    llama_reused: float
    cuda: tuple[float, float, float, float] | None
    note: str | None
    reused_ids: int

    def text(self) -> str:
        """The CUDA part in words (the table cell)."""
        if self.cuda is None:
            return self.note or ""
        r, c, s, d = self.cuda
        return (f"reused {r:.2f}, warm-up complete {c:.2f}, warm-up resets {s:.2f}, disabled (unsupported node) "
                f"{d:.2f} [debug builds only]; {self.reused_ids} graph ids reused")

    def to_dict(self) -> dict[str, object]:
        cuda = None if self.cuda is None else dict(zip(
            ("reused", "warmup_complete", "warmup_reset", "disabled_unsupported_node"),
            (round(v, 4) for v in self.cuda)))
        return {"llama_graphs_reused": round(self.llama_reused, 4), "cuda_graphs": cuda,
                "cuda_graph_ids_reused": self.reused_ids, "note": self.note}


def graph_table(rows: Sequence[tuple[str, str, GraphRates]]) -> str:
    """Markdown: one row per (arm, unit, rates)."""
    head = "| arm | per | target graphs reused (llama.cpp) | CUDA graphs |\n| --- | --- | ---: | --- |\n"
    return head + "\n".join(f"| {arm} | {unit} | {g.llama_reused:.3f} | {g.text()} |" for arm, unit, g in rows)
