"""Acceptance under several slots: ``verify --parallel N``.

verify's main run sends one request at a time to servers with one slot. A server that serves
several clients at once runs the MTP head for several sequences in one batch, and upstream reports
acceptance collapsing there (ggml-org/llama.cpp#27572: an asynchronous copy race on the head's
hidden state under ``-np > 1``; open at 0c1e570). So with ``parallel`` N > 1 verify also measures,
for each slot count ``s`` of :func:`slot_counts` (2, 4, ... up to N): a vanilla and an MTP server
with ``--parallel s`` (and ``s`` times the context, so every slot has the main run's), the suite's
(prompt, seed) requests sent ``s`` at a time by ``s`` concurrent clients, batch by batch, the two
arms alternating in ABBA order (:class:`~ggufmtp.measure.core.arms.ABBA`).

Per slot count: acceptance (sum accepted / sum drafted over the replies' own ``draft_n``, with a
95% bootstrap CI over prompts), aggregate decode throughput of each arm (tokens over the batches'
wall time: what the clients got, prompt processing included) and their ratio, and identity per
request: each request's MTP reply against vanilla's reply to the same (prompt, seed) at the same slot
count (both arms batched alike: lossless means equal to vanilla *at the same settings*), one record
per request (its batch, both hashes, the first differing character, and the concurrent request whose
text MTP's reply carries, if any: upstream ggml-org/llama.cpp#28286 reports ``draft-mtp`` mixing
requests under ``--parallel`` > 1; :mod:`ggufmtp.provenance.slot_identity`). The verdict
(:func:`ggufmtp.provenance.verdict.slot_failures`) fails when a slot count's acceptance lies outside
the single-slot acceptance CI, a reply carries another request's text, or too few replies equal
vanilla's; the figures and records are the receipt's ``verification.slots``, so an audit re-derives
the same verdict and names the same requests.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ... import stats
from ...errors import ServerError, VerifyError
from ...progress import bar as progress_bar
from ...provenance.slot_identity import ReplyRecord, compare_batch
from ...runtime.replies import Reply
from ...runtime.server import LlamaServer, ServerConfig
from ..core.arms import ABBA, send_concurrently, warm_up
from ..core.suite import Prompt

__all__ = ["SlotRow", "SlotStudy", "slot_counts", "measure_slots"]


def slot_counts(parallel: int) -> list[int]:
    """The slot counts a ``--parallel N`` run measures besides one: 2, 4, 8, ... below N, and N."""
    counts, s = [], 2
    while s < parallel:
        counts.append(s)
        s *= 2
    return counts + [parallel] if parallel > 1 else []


@dataclass(frozen=True)
class SlotRow:
    """One slot count's figures."""

    slots: int
    requests: int
    draft_n: int
    draft_n_accepted: int
    acceptance: float | None
    acceptance_ci95: tuple[float | None, float | None]
    mtp_tokens_per_second: float | None
    vanilla_tokens_per_second: float | None
    identical: int
    pairs: int
    replies: tuple[ReplyRecord, ...] = ()  # one per request: identity per request (provenance.slot_identity)

    @property
    def speedup(self) -> float | None:
        m, v = self.mtp_tokens_per_second, self.vanilla_tokens_per_second
        return m / v if m and v else None

    def to_dict(self) -> dict:
        return {"slots": self.slots, "requests": self.requests, "draft_n": self.draft_n,
                "draft_n_accepted": self.draft_n_accepted, "acceptance": self.acceptance,
                "acceptance_ci95": list(self.acceptance_ci95), "mtp_tokens_per_second": self.mtp_tokens_per_second,
                "vanilla_tokens_per_second": self.vanilla_tokens_per_second, "speedup": self.speedup,
                "identical": self.identical, "pairs": self.pairs, "replies": [r.to_dict() for r in self.replies]}


@dataclass(frozen=True)
class SlotStudy:
    """The single-slot reference (verify's main comparison) and each slot count measured against it."""

    reference_acceptance: float | None
    reference_ci95: tuple[float | None, float | None]
    rows: tuple[SlotRow, ...]

    def to_dict(self) -> dict:
        """The receipt's ``verification.slots`` (what :func:`~ggufmtp.provenance.verdict.slot_failures` reads)."""
        return {"reference": {"slots": 1, "acceptance": self.reference_acceptance,
                              "acceptance_ci95": list(self.reference_ci95)},
                "rows": [r.to_dict() for r in self.rows],
                "method": "s concurrent clients per batch, s slots, ABBA batches; acceptance from the replies' "
                          "timings; throughput = tokens / batch wall time"}


@dataclass
class _Arm:
    replies: list[tuple[Prompt, int, Reply]]
    wall_ms: float = 0.0
    batches: list[int] = field(default_factory=list)  # each reply's batch index, in the replies' order


def _batches(jobs: Sequence[tuple[Prompt, int]], size: int) -> list[list[tuple[Prompt, int]]]:
    return [list(jobs[i:i + size]) for i in range(0, len(jobs), size)]


def _row(slots: int, van: _Arm, mtp: _Arm, resamples: int, boot_seed: int) -> SlotRow:
    by_prompt: dict[str, list[int]] = {}
    for p, _, r in mtp.replies:
        acc = by_prompt.setdefault(p.id, [0, 0])
        acc[0] += r.draft_n_accepted or 0
        acc[1] += r.draft_n or 0
    est = stats.ratio_of_sums([a for a, _ in by_prompt.values()], [d for _, d in by_prompt.values()],
                              resamples=resamples, seed=boot_seed)
    records = _records(van, mtp)
    same = sum(r.first_difference is None for r in records)
    tps = lambda arm: sum(r.predicted_n for *_, r in arm.replies) / arm.wall_ms * 1000 if arm.wall_ms else None  # noqa: E731
    return SlotRow(slots=slots, requests=len(mtp.replies), draft_n=sum(d for _, d in by_prompt.values()),
                   draft_n_accepted=sum(a for a, _ in by_prompt.values()), acceptance=est.value,
                   acceptance_ci95=(est.lo, est.hi), mtp_tokens_per_second=tps(mtp), vanilla_tokens_per_second=tps(van),
                   identical=same, pairs=len(mtp.replies), replies=tuple(records))


def _records(van: _Arm, mtp: _Arm) -> list[ReplyRecord]:
    """Each request's MTP reply against vanilla's reply to the SAME (prompt, seed), batch by batch (the
    replies are kept in job order per arm, so index i is one request in both)."""
    out: list[ReplyRecord] = []
    for b in dict.fromkeys(mtp.batches):
        idx = [i for i, x in enumerate(mtp.batches) if x == b]
        keys = [(mtp.replies[i][0].id, mtp.replies[i][1]) for i in idx]
        assert keys == [(van.replies[i][0].id, van.replies[i][1]) for i in idx], "the arms' requests differ"
        out += compare_batch(b, keys, [van.replies[i][2].text for i in idx], [mtp.replies[i][2].text for i in idx])
    return out


def _measure_one(slots: int, servers: tuple[ServerConfig, ServerConfig], jobs: Sequence[tuple[Prompt, int]],
                 mode: str, max_tokens: int, order: ABBA, bar: Any) -> tuple[_Arm, _Arm]:
    arms = (_Arm([]), _Arm([]))
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(max_workers=slots) as pool:
        up = [stack.enter_context(LlamaServer(cfg)) for cfg in servers]
        for srv, name in zip(up, ("vanilla", "MTP"), strict=True):
            try:
                warm_up(srv, jobs[0][0], mode)
            except ServerError as e:
                raise VerifyError(f"{name} server with {slots} slots: warm-up request failed: {e}") from e

        def batch_on(i: int, b: int, batch: list[tuple[Prompt, int]]) -> Callable[[], None]:
            def go() -> None:
                try:
                    replies, ms = send_concurrently(up[i], batch, max_tokens, mode, pool)
                except ServerError as e:
                    raise VerifyError(f"{('vanilla', 'MTP')[i]} server with {slots} slots: {e}") from e
                arms[i].replies.extend((p, s, r) for (p, s), r in zip(batch, replies, strict=True))
                arms[i].wall_ms += ms
                arms[i].batches.extend([b] * len(batch))
                bar.update(len(batch))
            return go

        for b, batch in enumerate(_batches(jobs, slots)):
            order.run(batch_on(0, b, batch), batch_on(1, b, batch))
    return arms


def measure_slots(counts: Sequence[int], vanilla: Callable[[int], ServerConfig], mtp: Callable[[int], ServerConfig],
                  jobs: Sequence[tuple[Prompt, int]], mode: str, max_tokens: int,
                  reference: tuple[float | None, Sequence[float | None]], progress: bool = True,
                  resamples: int = stats.DEFAULT_RESAMPLES, boot_seed: int = stats.DEFAULT_SEED) -> SlotStudy:
    """Each slot count of ``counts`` measured as the module docstring says. ``vanilla(s)`` /
    ``mtp(s)``: the server configurations at ``s`` slots; ``reference``: the single-slot acceptance
    and its CI. VerifyError when a server fails or the MTP arm never drafts."""
    order, rows = ABBA(), []
    with progress_bar(2 * len(jobs) * len(counts), "verify slots", "req", enabled=progress) as bar:
        for s in counts:
            van, m = _measure_one(s, (vanilla(s), mtp(s)), jobs, mode, max_tokens, order, bar)
            row = _row(s, van, m, resamples, boot_seed)
            if not row.draft_n:
                raise VerifyError(f"MTP server with {s} slots: speculation did not run (no reply drafted)")
            rows.append(row)
    lo, hi = (list(reference[1]) + [None, None])[:2]
    return SlotStudy(reference[0], (lo, hi), tuple(rows))
