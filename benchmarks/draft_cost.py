#!/usr/bin/env python3
"""Where an MTP decode step's time goes, in ms, and what removing each part would give (issue #52).

    .venv/bin/python benchmarks/draft_cost.py MODEL [--tuned-from TUNE.json] [--draft-model MTP.gguf]
        [--k 4] [--limit 8] [--seeds 42] [--max-tokens 128] [--gpu-layers 999] [--threads N]
        [--server-arg=-bs ...] [--target 1.5] [--json OUT.json] [--md OUT.md]

Three servers of MODEL, one after the other, each warmed up and then asked the same suite prompts x
seeds at temperature 0: vanilla (the configuration's non-speculative settings: the fair baseline),
MTP with llama-server's trace log (``-lv 4``), and MTP without it (what the trace costs). From the
traced MTP server:

- ``/metrics``: verification steps (draft rounds), drafted and accepted tokens;
- the log's ``statistics draft-mtp`` line (common/speculative.cpp; cumulative, so the reading after
  the warm-up is subtracted): draft calls and the time spent generating drafts and accepting them;
- the replies' ``timings.predicted_ms``: the decode time, drafting included (the draft runs inside
  the server's generation loop).

A step's time is then draft + accept + the rest ("verify": the target's batch of 1 + drafted tokens,
sampling and the loop's overhead), and the speedup is tokens per step x vanilla's ms per token /
the step's ms. The counterfactuals: the speedup if drafting cost nothing; if the target's batch
cost what one vanilla token costs; and the draft time per step that ``--target`` needs. The model
is an identity on the measured numbers (no fit): each counterfactual changes one term.

Not interleaved and not a headline: ``ggufmtp verify`` gives the fair speedup with CIs; this says
where a step's milliseconds go.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
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

# common_speculative_print_stats (common/speculative.cpp at the pin), one line per implementation
STATS_RE = re.compile(
    r"statistics\s+(?P<impl>\S+): #calls\(b,g,a\) =\s*(?P<b>\d+)\s+(?P<g>\d+)\s+(?P<a>\d+), #gen drafts =\s*\d+, "
    r"#acc drafts =\s*\d+, #gen tokens =\s*(?P<gen>\d+), #acc tokens =\s*(?P<acc>\d+).*?"
    r"dur\(b,g,a\) = (?P<tb>[\d.]+), (?P<tg>[\d.]+), (?P<ta>[\d.]+) ms")


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


def _measure(cfg: ServerConfig, prompts: Sequence[Prompt], seeds: Sequence[int], max_tokens: int,
             traced: bool) -> tuple[int, float, SpecCounters | None, DraftStats | None]:
    """(tokens, decode ms, speculative counters and draft stats since the warm-up when ``traced``)."""
    with LlamaServer(cfg) as srv:
        mode = modes_for_template(srv.props().get("chat_template"))[0]
        warm_up(srv, prompts[0], mode)
        before = _stats_after(srv, 1) if traced else None
        counters = srv.spec_counters() if traced else None
        tokens, ms = 0, 0.0
        for p in prompts:
            for s in seeds:
                r = send(srv, p, s, max_tokens, mode)
                tokens, ms = tokens + r.predicted_n, ms + r.predicted_ms
        if not traced:
            return tokens, ms, None, None
        after = _stats_after(srv, 1 + len(prompts) * len(seeds))
        assert before is not None and counters is not None
        return tokens, ms, srv.spec_counters().since(counters), after.since(before)


def _stats_after(srv: LlamaServer, n: int, timeout: float = 10.0) -> DraftStats:
    """The ``n``-th statistics reading of the server's log (written as each request's slot is released)."""
    end = time.monotonic() + timeout
    while True:
        got = DraftStats.readings(Path(srv.log_path or "").read_text(errors="replace"))
        if len(got) >= n:
            return got[n - 1]
        if time.monotonic() > end:
            raise SystemExit(f"draft_cost: the server's log has {len(got)} draft-mtp statistics lines, expected {n} "
                             "(a llama-server without common_speculative_print_stats' trace line?)")
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--tuned-from", default=None, help="a tune/tune-joint --out JSON: its configuration")
    ap.add_argument("--draft-model", default=None, help="an MTP-only sidecar to draft with (-md)")
    ap.add_argument("--k", type=int, default=4, help="window without --tuned-from")
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
    a = ap.parse_args(argv)
    tuned: TuneConfig | None = load_tuned_config(a.tuned_from) if a.tuned_from else None
    arms = dataclasses.replace(ArmArgs.of(both=[x for s in a.server_arg for x in s.split()], tuned=tuned),
                               draft_model=a.draft_model)
    gl = GpuLayers().convert(a.gpu_layers, None, None) if a.gpu_layers else None  # -ngl: N, auto or all
    base: dict[str, Any] = {"model": str(local_model_arg(a.model)), "gpu_layers": gl, "threads": a.threads}
    prompts = load_suite(a.suite).prompts[:a.limit]
    seeds = [int(s) for s in a.seeds.split(",")]
    v_tokens, v_ms, _, _ = _measure(ServerConfig(**arms.vanilla_fields(base)), prompts, seeds, a.max_tokens, False)
    mtp = arms.mtp_fields(base, a.k)
    traced = {**mtp, "extra_args": [*mtp["extra_args"], "-lv", "4"]}
    m_tokens, m_ms, counters, stats = _measure(ServerConfig(**traced), prompts, seeds, a.max_tokens, True)
    u_tokens, u_ms, _, _ = _measure(ServerConfig(**mtp), prompts, seeds, a.max_tokens, False)
    assert counters is not None and stats is not None
    if not counters.n_drafts:
        raise SystemExit("draft_cost: the MTP server drafted nothing")
    b = Breakdown(v_tokens, v_ms, m_tokens, m_ms, counters.n_drafts, stats)
    out = {"model": Path(a.model).name, "config": tuned.key if tuned else f"k={a.k}",
           "draft_model": Path(a.draft_model).name if a.draft_model else None, "prompts": len(prompts),
           "seeds": seeds, "max_tokens": a.max_tokens, "breakdown": b.to_dict(a.target),
           "untraced": {"tokens": u_tokens, "ms": round(u_ms, 2),
                        "speedup": round((u_tokens / u_ms) / (v_tokens / v_ms), 4),
                        "trace_cost": round((m_ms / m_tokens) / (u_ms / u_tokens) - 1, 4)}}
    md = (f"Draft cost of {out['model']} ({out['config']}{', -md ' + str(out['draft_model']) if a.draft_model else ''}):"
          f" {len(prompts)} prompts x seeds {a.seeds} x {a.max_tokens} tokens, traced MTP server "
          f"(untraced speedup {out['untraced']['speedup']:.3f}x, trace cost {out['untraced']['trace_cost']:+.1%}).\n\n"
          + b.markdown(a.target))
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(out, indent=1))
    if a.md_out:
        Path(a.md_out).write_text(md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
