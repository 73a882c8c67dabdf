"""verify's request loop: the suite through the vanilla and MTP servers (and the default vanilla
one), prompt by prompt in ABBA order, each request a :class:`~.summary.Record`; the warm-up and the
check that speculation runs (:mod:`ggufmtp.measure.verify.run` drives it)."""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Iterator, Sequence

from ...errors import GgufmtpError, ServerError, VerifyError
from ...runtime.replies import SpecCounters
from ...runtime.server import LlamaServer
from ..core.arms import ABBA, DEFAULT_VANILLA, MTP, VANILLA, paired, send, warm_up
from ..core.suite import Prompt, Suite
from .summary import Record

__all__ = ["Runner", "check_drafting", "warm_up_arm"]


class Runner:
    """Sends the suite to both servers, pair by pair in ABBA order (:mod:`ggufmtp.measure.core.arms`),
    and keeps every request's :class:`Record`. One runner serves every draft window of a run, so
    the alternation and the request order continue across windows."""

    def __init__(self, suite: Suite, seeds: Sequence[int], modes: list[str], endpoints: list[str], max_tokens: int,
                 bar, on_record: Callable[[Record], None] | None):
        self.suite, self.seeds, self.modes, self.endpoints = suite, list(seeds), modes, endpoints
        self.max_tokens = max_tokens
        self.bar = bar
        self.on_record = on_record
        self.records: list[Record] = []
        self.metrics_mismatches = 0
        self.abba = ABBA()
        self._seq = 0  # position in the overall request sequence
        self._counters: SpecCounters | None = None  # the MTP server's speculative counters after its last request
        self.stopped_at: int | None = None  # prompts measured when a look decided the head early

    def run_k(self, k: int, van: LlamaServer, mtp: LlamaServer, default: LlamaServer | None = None,
              stop: Callable[[int], bool] | None = None) -> None:
        """Every (prompt, seed, mode, endpoint) of the suite on both servers (and the default vanilla
        server, when there is one, in the same rotation), MTP window ``k``, prompt by prompt;
        ``stop(n)``, asked after each prompt's requests (``n`` prompts done), ends the window early."""
        counters = mtp.spec_counters()
        self._counters = counters if counters.available else None
        others = [lambda it, arm=arm, srv=srv: self.one(arm, srv, k, *it)
                  for arm, srv in ((DEFAULT_VANILLA, default),) if srv is not None]
        for n, p in enumerate(self.suite.prompts, 1):
            for _ in paired(self._items(k, p), lambda it: self.one(VANILLA, van, k, *it),
                            lambda it: self.one(MTP, mtp, k, *it), self.abba, *others):
                pass
            if stop is not None and stop(n):
                self.stopped_at = n
                return

    def _items(self, k: int, p: Prompt) -> Iterator[tuple[Prompt, str, str, int]]:
        for seed, mode, endpoint in itertools.product(self.seeds, self.modes, self.endpoints):
            if self.bar is not None:
                self.bar.set_postfix_str(f"k={k} seed={seed} {p.id}", refresh=False)
            yield p, endpoint, mode, seed

    def one(self, arm: str, srv: LlamaServer, k: int, p: Prompt, endpoint: str, mode: str, seed: int) -> Record:
        """One measured request (and, on the MTP arm, its /metrics deltas)."""
        where = f"{arm} arm (k={k}) on prompt {p.id!r}, seed {seed}, {endpoint}" + (f", {mode}" if mode != "default" else "")
        try:
            reply = send(srv, p, seed, self.max_tokens, mode, endpoint)
        except ServerError as e:
            raise VerifyError(f"{where}: {e}") from e
        rec = Record.of(reply, arm=arm, k=k, endpoint=endpoint, mode=mode, prompt=p, seed=seed, order=self._seq)
        self._seq += 1
        if arm == MTP and self._counters is not None:
            try:
                self._count_drafts(srv, rec)
            except ServerError as e:
                raise VerifyError(f"{where}: reading /metrics: {e}") from e
        self.records.append(rec)
        if self.bar is not None:
            self.bar.update(1)
        if self.on_record is not None:
            self.on_record(rec)
        return rec

    def _count_drafts(self, srv: LlamaServer, rec: Record) -> None:
        """Draft rounds and per-position acceptance of ``rec`` from the /metrics deltas, when they
        agree with the reply's own draft counts."""
        before = self._counters
        assert before is not None
        now = srv.spec_counters()
        if not now.since(before).matches(rec.draft_n, rec.draft_n_accepted):
            time.sleep(0.05)  # counters are flushed when the slot is released; read once more
            now = srv.spec_counters()
        d = now.since(before)
        if d.matches(rec.draft_n, rec.draft_n_accepted):
            rec.n_drafts, rec.accepted_per_pos = d.n_drafts, list(d.per_position)
        else:
            self.metrics_mismatches += 1
        self._counters = now


def warm_up_arm(srv: LlamaServer, p: Prompt, mode: str, arm: str, k: int | None) -> dict:
    try:
        return warm_up(srv, p, mode)
    except ServerError as e:
        raise VerifyError(f"{arm} server{f' (k={k})' if k else ''}: warm-up request failed: {e}") from e


def check_drafting(mtp: LlamaServer, warm: dict, k: int, arm: str = "MTP") -> None:
    """VerifyError unless the MTP server's warm-up reply drafted (the MTP block loaded and runs)."""
    if (warm.get("timings") or {}).get("draft_n"):
        return
    slots = None
    with contextlib.suppress(GgufmtpError):
        slots = [s.get("speculative") for s in mtp.slots()]
    raise VerifyError(
        f"{arm} server (k={k}): speculation did not run: the warm-up reply of "
        f"{(warm.get('timings') or {}).get('predicted_n')} tokens has no timings.draft_n "
        f"(/slots speculative: {slots}). Is the MTP block loaded? log {mtp.log_path}")
