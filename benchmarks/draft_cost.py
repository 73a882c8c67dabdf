#!/usr/bin/env python3
"""Where an MTP decode step's time goes, in ms, and what removing each part would give (issue #52).

    .venv/bin/python benchmarks/draft_cost.py MODEL [--tuned-from TUNE.json] [--draft-model MTP.gguf]
        [--k 4 | --k 3,4,5,6,7] [--limit 8] [--seeds 42] [--max-tokens 128] [--gpu-layers 999] [--threads N]
        [--server-arg=-bs ...] [--target 1.5] [--json OUT.json] [--md OUT.md]

Servers of MODEL, one after the other, each warmed up and then asked the same suite prompts x seeds
at temperature 0: vanilla (the configuration's non-speculative settings: the fair baseline), vanilla
with llama-server's trace log (``--trace-level``: ``-lv 4`` by default; ``-lv 5`` adds the CUDA graph
lines), and per window k an MTP server with the trace log and one without it (what the log costs):
2 + 2 x windows server starts. From each traced MTP server:

- ``/metrics``: verification steps (draft rounds), drafted and accepted tokens;
- the log's ``statistics draft-mtp`` line (common/speculative.cpp; cumulative, so the reading after
  the warm-up is subtracted): draft calls and the time spent generating drafts and accepting them;
- the replies' ``timings.predicted_ms``: the decode time, drafting included (the draft runs inside
  the server's generation loop);
- graph use (benchmarks/draft_cost_log.py): the target graphs llama.cpp reused instead of
  rebuilding (``graphs reused``, any backend) and the CUDA backend's graph lines (reused, warm-up
  complete, warm-up reset, disabled), per MTP step; the traced vanilla server's per token beside it.

A step's time is then draft + accept + the rest ("verify": the target's batch of b = 1 + drafted
tokens, sampling and the loop's overhead), and the speedup is tokens per step x vanilla's ms per
token / the step's ms. The counterfactuals: the speedup if drafting cost nothing; if the target's
batch cost what one vanilla token costs; and the draft time per step that ``--target`` needs. The
model is an identity on the measured numbers (no fit): each counterfactual changes one term. With
two windows or more, a least-squares line of the verify ms against b (measured per window) states
what a batch of b tokens costs.

Not interleaved and not a headline: ``ggufmtp verify`` gives the fair speedup with CIs; this says
where a step's milliseconds go.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ggufmtp.cli.options import GpuLayers
from ggufmtp.measure.core.arms import send, warm_up
from ggufmtp.measure.core.suite import Prompt, load_suite, modes_for_template
from ggufmtp.measure.core.tuned import ArmArgs, TuneConfig
from ggufmtp.measure.tune.run import load_tuned_config
from ggufmtp.refs import local_model_arg
from ggufmtp.runtime.replies import SpecCounters
from ggufmtp.runtime.server import LlamaServer, ServerConfig

# the sibling module: PYTHONSAFEPATH (run_h200.sh with GGUFMTP_SRC) leaves this script's folder off sys.path
if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)
from draft_cost_log import DraftStats, GraphRates, GraphUse, graph_table, request_ends  # noqa: E402

# the traced servers' log level: 4 (the default) writes the speculative trace line the breakdown reads,
# as the earlier figures were measured; 5 adds ggml's debug lines, where the CUDA graph lines are
# (GGML_LOG_DEBUG, which common/log.cpp drops below 5) -- ~15 more lines a step, which slow the traced arms
TRACE_LEVELS = (4, 5)
GRAPH_LEVEL = 5


@dataclasses.dataclass(frozen=True)
class Breakdown:
    """A step's time by part, from one vanilla and one traced MTP measurement of the same requests."""

    vanilla_tokens: int
    vanilla_ms: float
    mtp_tokens: int
    mtp_ms: float
    steps: int  # verification steps with a draft (``/metrics`` draft rounds)
    draft: DraftStats

    @property
    def vanilla_ms_per_token(self) -> float:
        return self.vanilla_ms / self.vanilla_tokens

    @property
    def tokens_per_step(self) -> float:
        return self.mtp_tokens / self.steps

    @property
    def step_ms(self) -> float:
        return self.mtp_ms / self.steps

    @property
    def draft_ms_per_step(self) -> float:
        return self.draft.draft_ms / self.steps

    @property
    def accept_ms_per_step(self) -> float:
        return (self.draft.accept_ms + self.draft.begin_ms) / self.steps

    @property
    def verify_ms_per_step(self) -> float:
        return self.step_ms - self.draft_ms_per_step - self.accept_ms_per_step

    def speedup(self, step_ms: float | None = None) -> float:
        """Tokens per step x vanilla's ms per token / the step's ms (the measured one by default)."""
        return self.tokens_per_step * self.vanilla_ms_per_token / (self.step_ms if step_ms is None else step_ms)

    def draft_ms_per_step_for(self, target: float) -> float:
        """The draft time per step at which the speedup would be ``target`` (the rest unchanged;
        negative: not reachable even with free drafting)."""
        return self.tokens_per_step * self.vanilla_ms_per_token / target - self.verify_ms_per_step \
            - self.accept_ms_per_step

    def to_dict(self, target: float) -> dict[str, Any]:
        r = {"tokens_per_step": self.tokens_per_step, "vanilla_ms_per_token": self.vanilla_ms_per_token,
             "step_ms": self.step_ms, "draft_ms_per_step": self.draft_ms_per_step,
             "draft_ms_per_drafted_token": self.draft.draft_ms / max(self.draft.drafted, 1),
             "accept_ms_per_step": self.accept_ms_per_step, "verify_ms_per_step": self.verify_ms_per_step,
             "verify_cost_in_vanilla_tokens": self.verify_ms_per_step / self.vanilla_ms_per_token,
             "speedup": self.speedup(),
             "speedup_if_drafting_were_free": self.speedup(self.step_ms - self.draft_ms_per_step),
             "speedup_if_the_batch_cost_one_token": self.speedup(
                 self.vanilla_ms_per_token + self.draft_ms_per_step + self.accept_ms_per_step),
             "target": target, "draft_ms_per_step_for_target": self.draft_ms_per_step_for(target)}
        return {k: round(v, 4) for k, v in r.items()} | {
            "counts": {"vanilla_tokens": self.vanilla_tokens, "vanilla_ms": round(self.vanilla_ms, 2),
                       "mtp_tokens": self.mtp_tokens, "mtp_ms": round(self.mtp_ms, 2), "steps": self.steps,
                       **dataclasses.asdict(self.draft)}}

    def markdown(self, target: float) -> str:
        d = self.to_dict(target)
        rows = [("vanilla, ms per token", d["vanilla_ms_per_token"]), ("MTP step, ms", d["step_ms"]),
                ("  draft (k tokens of the head), ms", d["draft_ms_per_step"]),
                ("  accept + begin, ms", d["accept_ms_per_step"]),
                ("  verify (target batch, sampling, loop), ms", d["verify_ms_per_step"]),
                ("tokens per step", d["tokens_per_step"]),
                ("verify step in vanilla tokens", d["verify_cost_in_vanilla_tokens"]),
                ("draft, ms per drafted token", d["draft_ms_per_drafted_token"]),
                ("speedup (this model of the measured numbers)", d["speedup"]),
                ("speedup if drafting were free", d["speedup_if_drafting_were_free"]),
                ("speedup if the target's batch cost one token", d["speedup_if_the_batch_cost_one_token"]),
                (f"draft ms per step for {target:g}x", d["draft_ms_per_step_for_target"])]
        return "| part | value |\n| --- | ---: |\n" + "\n".join(f"| {a} | {b:.3f} |" for a, b in rows)


@dataclasses.dataclass(frozen=True)
class Window:
    """One window k: the breakdown (its traced MTP server against the untraced vanilla one), the untraced
    MTP server's tokens and ms, and the traced server's graph use."""

    k: int
    breakdown: Breakdown
    untraced_tokens: int
    untraced_ms: float
    graphs: GraphUse

    @property
    def batch_tokens(self) -> float:
        """b: the target's verification batch, 1 + drafted tokens per step (k unless drafts were cut short)."""
        return 1 + self.breakdown.draft.drafted / self.breakdown.steps

    @property
    def untraced_speedup(self) -> float:
        b = self.breakdown
        return (self.untraced_tokens / self.untraced_ms) / (b.vanilla_tokens / b.vanilla_ms)

    @property
    def trace_cost(self) -> float:
        """How much slower per token the traced MTP server decoded than the untraced one."""
        return (self.breakdown.mtp_ms / self.breakdown.mtp_tokens) / (self.untraced_ms / self.untraced_tokens) - 1

    def graph_rates(self) -> GraphRates:
        return self.graphs.rates(self.breakdown.steps)

    def to_dict(self, target: float) -> dict[str, Any]:
        return {"k": self.k, "batch_tokens": round(self.batch_tokens, 4), "breakdown": self.breakdown.to_dict(target),
                "untraced": {"tokens": self.untraced_tokens, "ms": round(self.untraced_ms, 2),
                             "speedup": round(self.untraced_speedup, 4), "trace_cost": round(self.trace_cost, 4)},
                "graphs_per_step": self.graph_rates().to_dict()}


WINDOW_COLUMNS = ("k", "batch b", "tokens per step", "step, ms", "draft, ms per step", "draft, ms per drafted token",
                  "verify, ms", "verify in vanilla tokens", "speedup (untraced, measured)")


def window_table(windows: Sequence[Window]) -> str:
    """Markdown: one row per window."""
    rows = []
    for w in windows:
        b = w.breakdown
        vals = (w.batch_tokens, b.tokens_per_step, b.step_ms, b.draft_ms_per_step,
                b.draft.draft_ms / max(b.draft.drafted, 1), b.verify_ms_per_step,
                b.verify_ms_per_step / b.vanilla_ms_per_token, w.untraced_speedup)
        rows.append(f"| {w.k} | " + " | ".join(f"{v:.3f}" for v in vals) + " |")
    return ("| " + " | ".join(WINDOW_COLUMNS) + " |\n|" + " ---: |" * len(WINDOW_COLUMNS) + "\n" + "\n".join(rows))


@dataclasses.dataclass(frozen=True)
class BatchCost:
    """The verify step's ms against its batch size b: the least-squares line ms = intercept + slope x b
    over the windows' measured (b, verify ms)."""

    slope_ms: float  # ms per extra token in the target's batch
    intercept_ms: float
    points: int

    @classmethod
    def fit(cls, points: Sequence[tuple[float, float]]) -> BatchCost | None:
        """None with fewer than two distinct batch sizes (no line to draw)."""
        if len({x for x, _ in points}) < 2:
            return None
        n = len(points)
        mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
        slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
        return cls(slope, my - slope * mx, n)

    @classmethod
    def of(cls, windows: Sequence[Window]) -> BatchCost | None:
        return cls.fit([(w.batch_tokens, w.breakdown.verify_ms_per_step) for w in windows])

    def at(self, b: float) -> float:
        """What a verification batch of b tokens costs on the line, ms."""
        return self.intercept_ms + self.slope_ms * b

    def text(self, vanilla_ms_per_token: float) -> str:
        sign = "-" if self.slope_ms < 0 else "+"
        return (f"Verify ms = {self.intercept_ms:.3f} {sign} {abs(self.slope_ms):.3f} x b (least squares over {self.points} "
                f"windows; b = tokens in the target's batch): each extra batch token costs "
                f"{self.slope_ms / vanilla_ms_per_token:.3f} vanilla tokens; at b = 1 the line gives "
                f"{self.at(1):.3f} ms against a vanilla token's {vanilla_ms_per_token:.3f} ms.")

    def to_dict(self, vanilla_ms_per_token: float) -> dict[str, float | int]:
        return {"ms_per_batch_token": round(self.slope_ms, 4), "intercept_ms": round(self.intercept_ms, 4),
                "vanilla_tokens_per_batch_token": round(self.slope_ms / vanilla_ms_per_token, 4),
                "ms_at_b1": round(self.at(1), 4), "windows": self.points}


class Trace(enum.Enum):
    """What a measurement reads besides the replies."""

    OFF = "off"  # nothing: the speed as served
    LOG = "log"  # the debug log's graph lines (vanilla)
    SPEC = "spec"  # the debug log, /metrics and the draft statistics (MTP)


@dataclasses.dataclass(frozen=True)
class Run:
    """One server's measured requests (the warm-up left out): tokens and decode ms, and when traced
    its graph use, speculative counters and draft statistics."""

    tokens: int
    ms: float
    graphs: GraphUse | None = None
    counters: SpecCounters | None = None
    draft: DraftStats | None = None


def _measure(cfg: ServerConfig, prompts: Sequence[Prompt], seeds: Sequence[int], max_tokens: int,
             trace: Trace, level: int = 4) -> Run:
    with LlamaServer(cfg) as srv:
        mode = modes_for_template(srv.props().get("chat_template"))[0]
        warm_up(srv, prompts[0], mode)
        if trace is Trace.SPEC:
            _log_after(srv, 1, trace)  # the warm-up's counters are in /metrics once its lines are written
        counters = srv.spec_counters() if trace is Trace.SPEC else None
        tokens, ms = 0, 0.0
        for p in prompts:
            for s in seeds:
                r = send(srv, p, s, max_tokens, mode)
                tokens, ms = tokens + r.predicted_n, ms + r.predicted_ms
        if trace is Trace.OFF:
            return Run(tokens, ms)
        n = 1 + len(prompts) * len(seeds)  # request 1 is the warm-up
        log = _log_after(srv, n, trace)
        graphs = GraphUse.between(log, 1, n, debug_logged=level >= GRAPH_LEVEL)
        if counters is None:
            return Run(tokens, ms, graphs)
        stats = DraftStats.readings(log)
        return Run(tokens, ms, graphs, srv.spec_counters().since(counters), stats[n - 1].since(stats[0]))


def _log_after(srv: LlamaServer, n: int, trace: Trace, timeout: float = 10.0) -> str:
    """The server's log once it holds the lines of ``n`` requests (written as each request's slot is released)."""
    end = time.monotonic() + timeout
    while True:
        log = Path(srv.log_path or "").read_text(errors="replace")
        ends, stats = len(request_ends(log)), len(DraftStats.readings(log)) if trace is Trace.SPEC else n
        if ends >= n and stats >= n:
            return log
        if time.monotonic() > end:
            raise SystemExit(f"draft_cost: the server's log has {ends} request timing lines and {stats} draft-mtp "
                             f"statistics lines, expected {n} (a llama-server without print_timings' 'graphs reused' "
                             "or common_speculative_print_stats' trace line?)")
        time.sleep(0.05)


def windows_arg(text: str) -> tuple[int, ...]:
    """``4`` or ``3,4,5``: distinct windows of at least 1, in the order given."""
    try:
        ks = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: windows are integers, e.g. 4 or 3,4,5") from None
    if not ks or min(ks) < 1 or len(set(ks)) != len(ks):
        raise argparse.ArgumentTypeError(f"{text!r}: give distinct windows of at least 1, e.g. 4 or 3,4,5")
    return ks


def _mtp_fields(arms: ArmArgs, base: dict[str, Any], k: int, from_list: bool) -> dict[str, Any]:
    """The traced-or-not MTP server's fields at window k; a --k list overrides the tuned configuration's window."""
    if from_list and arms.tuned is not None:
        t = arms.tuned
        arms = dataclasses.replace(arms, tuned=dataclasses.replace(t, draft_n_max=k, draft_n_min=min(t.draft_n_min, k)))
    return arms.mtp_fields(base, k)


def _traced(fields: dict[str, Any], level: int) -> ServerConfig:
    return ServerConfig(**{**fields, "extra_args": [*fields["extra_args"], "-lv", str(level)]})


@dataclasses.dataclass(frozen=True)
class Report:
    """Everything one run measured, and its text, markdown and JSON forms."""

    model: str
    config: str
    draft_model: str | None
    prompts: int
    seeds: tuple[int, ...]
    max_tokens: int
    target: float
    vanilla: Run  # untraced: the breakdowns' baseline
    vanilla_traced: Run  # at the trace level: its graph use per token
    windows: tuple[Window, ...]
    trace_level: int = 4

    @property
    def vanilla_trace_cost(self) -> float:
        return (self.vanilla_traced.ms / self.vanilla_traced.tokens) / (self.vanilla.ms / self.vanilla.tokens) - 1

    def vanilla_graph_rates(self) -> GraphRates:
        assert self.vanilla_traced.graphs is not None
        return self.vanilla_traced.graphs.rates(self.vanilla_traced.tokens)

    def to_dict(self) -> dict[str, Any]:
        vt, line = self.vanilla_traced, BatchCost.of(self.windows)
        v_ms = self.windows[0].breakdown.vanilla_ms_per_token
        out: dict[str, Any] = {
            "model": self.model, "config": self.config, "draft_model": self.draft_model, "prompts": self.prompts,
            "seeds": list(self.seeds), "max_tokens": self.max_tokens, "target": self.target,
            "vanilla": {"tokens": self.vanilla.tokens, "ms": round(self.vanilla.ms, 2), "traced_tokens": vt.tokens,
                        "traced_ms": round(vt.ms, 2), "trace_cost": round(self.vanilla_trace_cost, 4),
                        "graphs_per_token": self.vanilla_graph_rates().to_dict()},
            "windows": [w.to_dict(self.target) for w in self.windows],
            "verify_batch_cost": line.to_dict(v_ms) if line else None}
        if len(self.windows) == 1:  # the single-window keys of the earlier output, for its readers
            out |= {k: out["windows"][0][k] for k in ("breakdown", "untraced")}
        return out

    def markdown(self) -> str:
        md = f", -md {self.draft_model}" if self.draft_model else ""
        head = (f"Draft cost of {self.model} ({self.config}{md}): {self.prompts} prompts x seeds "
                f"{','.join(map(str, self.seeds))} x {self.max_tokens} tokens, traced servers at "
                f"-lv {self.trace_level} (vanilla's trace cost {self.vanilla_trace_cost:+.1%})")
        if len(self.windows) == 1:
            w = self.windows[0]
            body = (f"{head}, traced MTP server (untraced speedup {w.untraced_speedup:.3f}x, trace cost "
                    f"{w.trace_cost:+.1%}).\n\n" + w.breakdown.markdown(self.target))
        else:
            line = BatchCost.of(self.windows)
            costs = ", ".join(f"k={w.k} {w.trace_cost:+.1%}" for w in self.windows)
            body = (f"{head}; the traced MTP servers' trace cost {costs}.\n\n{window_table(self.windows)}"
                    + (f"\n\n{line.text(self.windows[0].breakdown.vanilla_ms_per_token)}" if line else ""))
        rows = [("vanilla", "token", self.vanilla_graph_rates())]
        rows += [(f"MTP k={w.k}", "step", w.graph_rates()) for w in self.windows]
        return (f"{body}\n\nGraph use, per vanilla token and per MTP step (the target context's graphs that "
                f"llama.cpp reused instead of rebuilding; the CUDA backend's graph lines):\n\n{graph_table(rows)}")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--tuned-from", default=None, help="a tune/tune-joint --out JSON: its configuration (and window)")
    ap.add_argument("--draft-model", default=None, help="an MTP-only sidecar to draft with (-md)")
    ap.add_argument("--k", type=windows_arg, default=None,
                    help="window, or windows to compare (3,4,5,6,7: a row each and the verify batch's cost line); "
                         "default --tuned-from's window, else 4; given with --tuned-from, this list wins over its window")
    ap.add_argument("--trace-level", type=int, choices=TRACE_LEVELS, default=4,
                    help="the traced servers' -lv: 4 (default) as the earlier figures, the lightest log with the "
                         "speculative trace line; 5 also logs ggml's CUDA graph lines (reused, warm-up, resets), "
                         "slowing the traced arms more (each trace cost is reported)")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--seeds", default="42")
    ap.add_argument("--suite", default="chat-v1")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--gpu-layers", default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--server-arg", action="append", default=[], help="a non-speculative flag for every server")
    ap.add_argument("--target", type=float, default=1.5)
    ap.add_argument("--json", dest="json_out", default=None)
    ap.add_argument("--md", dest="md_out", default=None)
    return ap


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    tuned: TuneConfig | None = load_tuned_config(a.tuned_from) if a.tuned_from else None
    arms = dataclasses.replace(ArmArgs.of(both=[x for s in a.server_arg for x in s.split()], tuned=tuned),
                               draft_model=a.draft_model)
    ks: tuple[int, ...] = a.k or ((tuned.draft_n_max,) if tuned else (4,))
    gl = GpuLayers().convert(a.gpu_layers, None, None) if a.gpu_layers else None  # -ngl: N, auto or all
    base: dict[str, Any] = {"model": str(local_model_arg(a.model)), "gpu_layers": gl, "threads": a.threads}
    prompts = load_suite(a.suite).prompts[:a.limit]
    seeds = tuple(int(s) for s in a.seeds.split(","))

    def measure(cfg: ServerConfig, trace: Trace) -> Run:
        return _measure(cfg, prompts, seeds, a.max_tokens, trace, a.trace_level)

    v_fields = arms.vanilla_fields(base)
    vanilla = measure(ServerConfig(**v_fields), Trace.OFF)
    vanilla_traced = measure(_traced(v_fields, a.trace_level), Trace.LOG)
    windows = []
    for k in ks:
        mtp = _mtp_fields(arms, base, k, a.k is not None)
        t, u = measure(_traced(mtp, a.trace_level), Trace.SPEC), measure(ServerConfig(**mtp), Trace.OFF)
        assert t.counters is not None and t.draft is not None and t.graphs is not None
        if not t.counters.n_drafts:
            raise SystemExit(f"draft_cost: the MTP server drafted nothing at k={k}")
        b = Breakdown(vanilla.tokens, vanilla.ms, t.tokens, t.ms, t.counters.n_drafts, t.draft)
        windows.append(Window(k, b, u.tokens, u.ms, t.graphs))
    label = f"k={','.join(map(str, ks))}"
    config = (f"{tuned.key}; windows {label} from --k" if a.k else tuned.key) if tuned else label
    report = Report(Path(a.model).name, config, Path(a.draft_model).name if a.draft_model else None, len(prompts),
                    seeds, a.max_tokens, a.target, vanilla, vanilla_traced, tuple(windows), a.trace_level)
    md = report.markdown()
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(report.to_dict(), indent=1))
    if a.md_out:
        Path(a.md_out).write_text(md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
