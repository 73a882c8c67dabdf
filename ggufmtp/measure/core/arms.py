"""The one paired-arm loop: vanilla and MTP requests alternate in ABBA order.

Every comparison in :mod:`ggufmtp.measure` (verify, tune, curve, profiles) runs the same work on a
*vanilla* server and an *MTP* server and compares the two. The order within a pair alternates:
pair 0 runs vanilla then MTP, pair 1 MTP then vanilla, pair 2 vanilla then MTP, and so on, so slow
drift (thermal, page cache, other tenants) and any "who ran just before" effect cancel between the
arms. That alternation lives here, once:

- :class:`ABBA` is the pair counter. One instance is shared by every loop of one run (verify keeps
  counting across draft windows, tune across candidate configurations), so the alternation never
  restarts in the middle of a run. With more than two arms (verify's third, default-configured
  vanilla arm) the same rule rotates them: round ``i`` runs the arms in their order when ``i`` is
  even and in reverse when odd (V M D, D M V, ...), so each arm's mean position is the same and a
  linear drift still cancels; with two arms that is exactly V M, M V.
- :func:`paired` is the loop: for each item it calls ``vanilla(item)`` and ``mtp(item)`` in the
  pair's order and yields a :class:`Pair` (the item, both results, the pair index and which arm ran
  first). It is a generator: a caller may stop early (tune stops a configuration at its first
  mismatch) and the counter has advanced exactly by the pairs run.

What one arm does for an item is the caller's: one request (verify, curve), a batch of concurrent
requests (tune with ``concurrency`` > 1: :func:`send_concurrently`), or a whole workload (profiles).

The request helpers send what every comparison sends -- temperature 0, ``cache_prompt: false``
(every request independent of the ones before it), the thinking mode's request fields -- and parse
the answer into a :class:`~ggufmtp.runtime.replies.Reply`: :func:`send` (``/v1/chat/completions``
or, endpoint ``"raw"``, ``/completion`` without the template) and :func:`warm_up` (the unrecorded
short request each server answers before it is measured).

Example (verify's loop, one draft window)::

    order = ABBA()
    for pair in paired(items, lambda it: measure(van, it), lambda it: measure(mtp, it), order):
        ...  # pair.vanilla, pair.mtp
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ...runtime.memory import Role
from ...runtime.replies import Reply
from ...runtime.server import LlamaServer
from .suite import Prompt, mode_request_fields

__all__ = ["ABBA", "Pair", "paired", "send", "warm_up", "send_concurrently", "WARMUP_TOKENS", "VANILLA", "MTP",
           "DEFAULT_VANILLA", "REFERENCE"]

# the arms' names are the memory plan's server roles (one list of them: runtime.memory.Role)
VANILLA = Role.VANILLA.value
MTP = Role.MTP.value
DEFAULT_VANILLA = Role.DEFAULT_VANILLA.value  # verify's third arm: vanilla with llama-server's defaults
REFERENCE = Role.REFERENCE.value  # verify --reference: the reference head on the artifact's trunk
WARMUP_TOKENS = 24  # tokens of the unrecorded warm-up reply each server answers first

T = TypeVar("T")
V = TypeVar("V")
M = TypeVar("M")


class ABBA:
    """The pair counter of one run: pair ``i`` runs vanilla first when ``i`` is even."""

    def __init__(self, start: int = 0):
        self.index = start

    @property
    def vanilla_first(self) -> bool:
        """Whether the next pair runs vanilla first."""
        return self.index % 2 == 0

    def order(self) -> tuple[str, str]:
        """The arms of the next pair in their order (``("vanilla", "mtp")`` or the reverse)."""
        return (VANILLA, MTP) if self.vanilla_first else (MTP, VANILLA)

    def sequence(self, n: int) -> list[int]:
        """The order in which the next round runs ``n`` arms (their indices): forward in even
        rounds, reversed in odd ones."""
        forward = list(range(n))
        return forward if self.vanilla_first else forward[::-1]

    def run_all(self, arms: Sequence[Callable[[], Any]]) -> list[Any]:
        """Run one round of every arm in this round's order and advance the counter; the results
        in the arms' order."""
        out: list[Any] = [None] * len(arms)
        for i in self.sequence(len(arms)):
            out[i] = arms[i]()
        self.index += 1
        return out

    def run(self, vanilla: Callable[[], V], mtp: Callable[[], M]) -> tuple[V, M]:
        """Run one pair in this pair's order and advance the counter; (vanilla result, MTP result)."""
        v, m = self.run_all([vanilla, mtp])
        return v, m


@dataclass(frozen=True)
class Pair(Generic[T, V, M]):
    """One pair of :func:`paired`: the item, each arm's result, the pair's index in the run and
    whether vanilla ran first."""

    item: T
    vanilla: V
    mtp: M
    index: int
    vanilla_first: bool


def paired(items: Iterable[T], vanilla: Callable[[T], V], mtp: Callable[[T], M],
           order: ABBA | None = None, *others: Callable[[T], Any]) -> Iterator[Pair[T, V, M]]:
    """For each item, ``vanilla(item)`` and ``mtp(item)`` in ABBA order (``order``: the run's
    counter, shared across loops; a fresh one starting with vanilla if None). ``others``: further
    arms rotated with them (after MTP in the forward order); their results are not in the Pair."""
    order = order if order is not None else ABBA()
    for item in items:
        index, first = order.index, order.vanilla_first
        v, m, *_ = order.run_all([lambda: vanilla(item), lambda: mtp(item)]  # noqa: B023 (called within this iteration)
                                 + [lambda f=f: f(item) for f in others])  # noqa: B023 (called within this iteration)
        yield Pair(item, v, m, index, first)


# ----------------------------------------------------------------------------- requests


def request(srv: LlamaServer, prompt: Prompt, endpoint: str, mode: str, seed: int, max_tokens: int) -> dict:
    """The raw JSON answer of one measured request (see :func:`send`)."""
    if endpoint == "chat":
        return srv.chat(prompt.chat_messages(), max_tokens=max_tokens, temperature=0.0, seed=seed,
                        **mode_request_fields(mode), cache_prompt=False)
    return srv.complete(prompt.raw_text(), n_predict=max_tokens, temperature=0.0, seed=seed, cache_prompt=False)


def send(srv: LlamaServer, prompt: Prompt, seed: int, max_tokens: int, mode: str = "default",
         endpoint: str = "chat") -> Reply:
    """One measured request at temperature 0 without prompt caching: ``/v1/chat/completions`` with
    the chat template and the mode's fields (endpoint "chat"), or ``/completion`` on the raw text
    ("raw"). ServerError when it fails or its answer has no decode timings."""
    return Reply.parse(request(srv, prompt, endpoint, mode, seed, max_tokens), endpoint)


def warm_up(srv: LlamaServer, prompt: Prompt, mode: str = "default", max_tokens: int = WARMUP_TOKENS) -> dict:
    """The unrecorded warm-up request a server answers before it is measured (chat, seed 0); its raw
    answer, whose ``timings.draft_n`` tells whether speculation runs."""
    return request(srv, prompt, "chat", mode, 0, max_tokens)


def send_concurrently(srv: LlamaServer, jobs: Sequence[tuple[Prompt, int]], max_tokens: int, mode: str = "default",
                      pool: ThreadPoolExecutor | None = None) -> tuple[list[Reply], float]:
    """Every ``(prompt, seed)`` job as a chat request; with a ``pool`` all are sent at once (a batch of
    concurrent clients), else one after the other. (replies in job order, wall-clock ms)."""
    t0 = time.perf_counter()
    if pool is None:
        out = [send(srv, p, s, max_tokens, mode) for p, s in jobs]
    else:
        futures = [pool.submit(send, srv, p, s, max_tokens, mode) for p, s in jobs]
        out = [f.result() for f in futures]
    return out, (time.perf_counter() - t0) * 1000.0
