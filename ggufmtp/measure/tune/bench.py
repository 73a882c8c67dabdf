"""The real evaluator of ``ggufmtp tune`` and ``ggufmtp curve``: what a run needs (suite, model,
llama-server binary), and the requests sent to the vanilla and MTP servers.

Measurement: the vanilla server (``-np`` = concurrency) stays up for the whole search; one MTP
server at a time is started per (configuration, rung), warmed up (its warm-up reply must draft),
and paired with a vanilla server of the same non-speculative settings (fair baseline: a
configuration's ``-bs``, threads, graph optimisation and slots are the vanilla arm's too; the
resident one when they match the run's, else one more vanilla server, kept while consecutive
configurations share those settings),
then every unit is sent to both in ABBA order (unit 0 vanilla first, unit 1 MTP first, ...), as
:mod:`ggufmtp.measure.verify.run` does, at temperature 0 with ``cache_prompt: false``. Speedup of a unit
set = (sum MTP tokens / sum MTP time) / (sum vanilla tokens / sum vanilla time): time = the decode
time of ``timings.predicted_ms`` at concurrency 1 (as verify), the wall time of the batch (first
send to last answer) at concurrency > 1 (aggregate output tok/s, prefill included, as a serving
benchmark).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

from ... import stats
from ...errors import FatalTuneError, GgufmtpError, LossyOptionError, TuneError
from ...gguf.model import inspect_model
from ...runtime import build as runtime
from ...runtime.replies import Reply
from ...runtime.server import LlamaServer, ServerConfig, binary_flags, build_command, flags_without
from ..core.arms import ABBA, MTP, VANILLA, WARMUP_TOKENS, send, send_concurrently
from ..core.options import DEFAULT_MAX_TOKENS, ArmArgs, TuneConfig
from ..core.suite import Prompt, Suite, as_suite
from ..verify.divergence import analyse_mismatches, replay_mtp
from ..verify.summary import Record
from .search import Mismatch, UnitResult

__all__ = ["WARMUP_TOKENS", "DEFAULT_MAX_TOKENS", "DEFAULT_CTX_PER_SLOT", "TuneSetup", "prepare", "check_seeds", "Bench", "ServerEvaluator"]

DEFAULT_CTX_PER_SLOT = 4096


class TuneSetup(NamedTuple):
    """What a tune or curve run measures with: the suite (limited), the model and its inspection,
    the llama-server binary and the flags it lists in ``--help``."""

    suite: Suite
    path: Path
    report: Any  # ggufmtp.gguf.model's inspection report
    binary: Path
    flags: frozenset[str]


def _inspect_complete(path: Path) -> Any:
    if not path.is_file():
        raise TuneError(f"model {path}: no such file")
    rep = inspect_model(path)
    if rep.mtp_status != "complete":
        raise TuneError(f"model {path}: its MTP block is {rep.mtp_status}; tuning needs a complete MTP (NextN) block "
                        f"(see `ggufmtp inspect {path}`)")
    return rep


def prepare(model: str | os.PathLike, suite: str | os.PathLike | Suite, limit: int | None,
            llama_cpp_bin: str | os.PathLike | None) -> TuneSetup:
    """The :class:`TuneSetup` of a run on ``model`` (a path): TuneError when the model has no
    complete MTP block or no llama-server is found."""
    st = as_suite(suite)
    st = st.limit(limit)
    path = Path(model)
    rep = _inspect_complete(path)
    try:
        binary = runtime.find_binary("llama-server", llama_cpp_bin)
        flags = binary_flags(binary)
    except GgufmtpError as e:
        raise TuneError(str(e)) from e
    return TuneSetup(st, path, rep, binary, flags)


def check_seeds(seeds: Sequence[int]) -> list[int]:
    """The request seeds as a list of ints; TuneError when empty or repeated."""
    out = [int(s) for s in seeds]
    if not out or len(set(out)) != len(out):
        raise TuneError(f"seeds {out}: need at least one, no duplicates")
    return out


class Bench:
    """Sends units of prompts to a server: one request per (prompt, seed), ``concurrency`` at a time."""

    def __init__(self, prompts: Sequence[Prompt], seeds: Sequence[int], mode: str, max_tokens: int,
                 concurrency: int):
        self.prompts, self.seeds, self.mode = list(prompts), list(seeds), mode
        self.max_tokens, self.concurrency = max_tokens, concurrency
        self.pool = ThreadPoolExecutor(max_workers=concurrency) if concurrency > 1 else None

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)

    def unit_prompts(self, unit: int) -> list[Prompt]:
        n, c = len(self.prompts), self.concurrency
        return [self.prompts[(unit * c + j) % n] for j in range(c)]

    def one(self, srv: LlamaServer, p: Prompt, seed: int, max_tokens: int | None = None) -> Reply:
        """One chat request at temperature 0, without prompt caching."""
        return send(srv, p, seed, max_tokens or self.max_tokens, self.mode)

    def run(self, srv: LlamaServer, unit: int) -> tuple[list[tuple[Prompt, int, Reply]], float]:
        """All requests of one unit; (results, wall ms). Concurrency 1: sequential; else one batch
        of ``concurrency`` prompts per seed, sent at once."""
        t0 = time.perf_counter()
        out: list[tuple[Prompt, int, Reply]] = []
        for s in self.seeds:
            batch = [(p, s) for p in self.unit_prompts(unit)]
            replies, _ = send_concurrently(srv, batch, self.max_tokens, self.mode, self.pool)
            out.extend((p, s_, r) for (p, s_), r in zip(batch, replies))
        return out, (time.perf_counter() - t0) * 1000.0


class ServerEvaluator:
    """The evaluator of :func:`ggufmtp.measure.tune.run.tune`: vanilla server resident, one MTP server per
    (config, rung)."""

    def __init__(self, base: dict[str, Any], van: LlamaServer, bench: Bench, ctx_per_slot: int,
                 warm_prompt: Prompt, bar=None, arms: ArmArgs | None = None, suite: Suite | None = None,
                 heads: Mapping[str, str | os.PathLike] | None = None):
        self.base, self.van, self.bench = base, van, bench
        self.heads = dict(heads or {})  # head type -> the MTP-only sidecar a configuration's ``head`` drafts with
        self.default_replies: dict[int, list[Reply]] = {}  # unit -> the resident (default) vanilla's replies
        self.suite = suite  # given: a differing reply gets verify's numerics analysis (else it drops the config)
        self.ctx_per_slot = ctx_per_slot
        self.warm_prompt = warm_prompt
        self.bar = bar
        self.arms = arms if arms is not None else ArmArgs()
        self.order = ABBA()  # one alternation across every configuration of the search
        self.commands: dict[str, str] = {}
        self.vanilla_commands: dict[str, str] = {}  # config key -> the vanilla command it was paired with
        self.logs: dict[str, str] = {}
        self.server_starts = 0
        self._other: tuple[tuple, LlamaServer] | None = None  # a vanilla server of other settings than ``van``'s

    def _vanilla(self, srv: LlamaServer, unit: int) -> tuple[list[tuple[Prompt, int, Reply]], float]:
        try:
            return self.bench.run(srv, unit)
        except GgufmtpError as e:
            raise FatalTuneError(f"vanilla server: {e}") from e

    def _fields(self, cfg: TuneConfig) -> tuple[ArmArgs, dict[str, Any]]:
        base = {**self.base, "parallel": cfg.parallel, "ctx_size": self.ctx_per_slot * cfg.parallel}
        arms = dataclasses.replace(self.arms, tuned=cfg)
        if cfg.head is not None:
            if cfg.head not in self.heads:
                raise TuneError(f"{cfg.key}: no head of type {cfg.head} was made for this search")
            arms = dataclasses.replace(arms, draft_model=str(self.heads[cfg.head]))
        return arms, base

    def server_config(self, cfg: TuneConfig) -> ServerConfig:
        """The MTP server of ``cfg``: the shared settings, its slots and their context."""
        arms, base = self._fields(cfg)
        return ServerConfig(**arms.mtp_fields(base, cfg.draft_n_max))

    def vanilla_config(self, cfg: TuneConfig) -> ServerConfig:
        """The vanilla server ``cfg`` is compared with: the same non-speculative settings and slots."""
        arms, base = self._fields(cfg)
        return ServerConfig(**arms.vanilla_fields(base))

    def vanilla_for(self, cfg: TuneConfig) -> LlamaServer:
        """The vanilla server of ``cfg``'s settings: the resident one when they match, else the other
        one (started and warmed up when its settings change; the previous other one is stopped)."""
        want = self.vanilla_config(cfg)
        key = _settings_key(want)
        if key == _settings_key(self.van.config):
            return self.van
        if self._other is None or self._other[0] != key:
            self.close()
            self.server_starts += 1
            srv = LlamaServer(want).start()
            self._other = (key, srv)
            self.bench.one(srv, self.warm_prompt, 0, WARMUP_TOKENS)
        return self._other[1]

    def close(self) -> None:
        """Stop the other vanilla server, if any (the resident one is the caller's)."""
        if self._other is not None:
            self._other[1].stop()
            self._other = None

    def __call__(self, cfg: TuneConfig, units: Sequence[int]) -> list[UnitResult]:
        out: list[UnitResult] = []
        van = self.vanilla_for(cfg)
        self.vanilla_commands[cfg.key] = shlex.join(van.command)
        self.server_starts += 1
        with LlamaServer(self.server_config(cfg)) as mtp:
            self.commands[cfg.key] = shlex.join(mtp.command)
            self.logs[cfg.key] = str(mtp.log_path)
            if not self.bench.one(mtp, self.warm_prompt, 0, WARMUP_TOKENS).draft_n:
                raise TuneError(f"{cfg.key}: speculation did not run (the warm-up reply has no timings.draft_n); "
                                f"log {mtp.log_path}")
            for u in units:
                out.append(self._pair(van, mtp, u, cfg.sets_server_options))
                if not out[-1].lossless:
                    break
        return out

    def _pair(self, vsrv: LlamaServer, mtp: LlamaServer, u: int, check_default: bool = False) -> UnitResult:
        """Unit ``u`` on vanilla and on ``mtp``, in ABBA order (``check_default``: and the vanilla's
        replies against the default vanilla's, :meth:`_check_default_output`)."""
        (van, van_ms), (mt, mt_ms) = self.order.run(lambda: self._vanilla(vsrv, u), lambda: self.bench.run(mtp, u))
        if check_default:
            self._check_default_output(vsrv, u, van)
        if self.bar is not None:
            self.bar.update(len(mt))
        mism, explained = self._mismatch(vsrv, mtp, [(p, s, a, b) for (p, s, a), (_, _, b) in zip(van, mt) if a.text != b.text])
        if self.bench.concurrency > 1:  # aggregate output tok/s over the batch's wall time
            (m_n, m_ms), (v_n, v_ms) = (sum(r.predicted_n for *_, r in mt), mt_ms), (sum(r.predicted_n for *_, r in van), van_ms)
        else:  # decode throughput, as verify (a reply that ended at once decoded nothing)
            (m_n, m_ms), (v_n, v_ms) = stats.decoded_sums(r for *_, r in mt), stats.decoded_sums(r for *_, r in van)
        return UnitResult(
            unit=u, mtp_tokens=m_n, mtp_ms=m_ms, van_tokens=v_n, van_ms=v_ms, identical=mism is None, explained=explained,
            draft_n=sum(r.draft_n or 0 for _, _, r in mt),
            draft_n_accepted=sum(r.draft_n_accepted or 0 for _, _, r in mt), requests=len(mt), mismatch=mism,
            prompt_ids=tuple(dict.fromkeys(p.id for p, _, _ in mt)))


    def _check_default_output(self, vsrv: LlamaServer, u: int, van: Sequence[tuple[Prompt, int, Reply]]) -> None:
        """A configuration's non-speculative settings (KV types, flash attention, batch, an option set)
        go to its fair vanilla too, so MTP against that vanilla cannot see what they do to the output:
        its vanilla's replies must equal the resident (default) vanilla's, or differ only where
        verify's numerics analysis explains it; else :class:`~ggufmtp.errors.LossyOptionError`."""
        if vsrv is self.van:  # the run's own settings already hold the options
            return
        if u not in self.default_replies:  # measured once per unit, not counted as evaluations
            self.default_replies[u] = [r for *_, r in self._vanilla(self.van, u)[0]]
        differing = [(p, s, d, r) for (p, s, r), d in zip(van, self.default_replies[u]) if r.text != d.text]
        if not differing:
            return
        first, explained = self._mismatch(self.van, vsrv, differing)
        if not explained:
            assert first is not None
            raise LossyOptionError(
                f"its server options change the output: the vanilla server given them writes another reply than the "
                f"default vanilla's to prompt {first.prompt_id!r} (seed {first.seed}) from character "
                f"{first.first_difference_at} ({first.vanilla!r} -> {first.mtp!r})")

    def _mismatch(self, vsrv: LlamaServer, mtp: LlamaServer,
                  differing: Sequence[tuple[Prompt, int, Reply, Reply]]) -> tuple[Mismatch | None, bool]:
        """The unit's first differing reply and whether every difference is explained by numerics:
        verify's analysis (:func:`~ggufmtp.measure.verify.divergence.analyse_mismatches`) on the
        vanilla server against the MTP replies' token ids (replayed on ``mtp``), judged by the same
        rule, when the evaluator has the suite."""
        if not differing:
            return None, False
        p, s, a, b = differing[0]
        first = Mismatch.of(a.text, b.text, p.id, s)
        if self.suite is None:
            return first, False
        mode = self.bench.mode
        pairs = [(_record(VANILLA, p_, s_, a_, mode), _record(MTP, p_, s_, b_, mode)) for p_, s_, a_, b_ in differing]
        numerics = analyse_mismatches(vsrv, self.suite, pairs, self.bench.max_tokens,
                                      replay_mtp(mtp, self.suite, pairs, self.bench.max_tokens))
        assert numerics is not None
        fields = [numerics.fields((0, "chat", mode, p_.id, s_)) for p_, s_, _, _ in differing]
        first = dataclasses.replace(first, margin_nats=fields[0].get("margin_nats"), drift_nats=numerics.drift.drift_nats,
                                    explained=fields[0]["explained"], why=fields[0].get("unexplained_why"))
        return first, all(f["explained"] for f in fields)


def _record(arm: str, p: Prompt, seed: int, r: Reply, mode: str) -> Record:
    """A tune reply as a verify record (k 0, endpoint chat): what the numerics analysis reads."""
    return Record.of(r, arm=arm, k=0, endpoint="chat", mode=mode, prompt=p, seed=seed, order=0)


def _settings_key(cfg: ServerConfig) -> tuple:
    """What makes two vanilla servers interchangeable: their flags (model and address aside) and environment."""
    return tuple(flags_without(build_command(cfg, "llama-server", 0))), tuple(sorted((cfg.env or {}).items()))
