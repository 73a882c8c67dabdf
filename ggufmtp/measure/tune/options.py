"""The options of :func:`ggufmtp.measure.tune.run.tune`: :class:`TuneOptions` (what the search
measures with) and :class:`SearchOptions` (the space and the successive halving's schedule), each
checked once, when built (TuneError naming the first bad setting)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ...errors import TuneError
from ...stats import DEFAULT_RESAMPLES
from ..core.options import DEFAULT_MAX_TOKENS, ServerOptions, TuneConfig
from ..core.suite import DEFAULT_SUITE, Suite
from .bench import DEFAULT_CTX_PER_SLOT, check_seeds
from .search import DEFAULT_ETA, DEFAULT_FINAL_SIZE, DEFAULT_UNITS0, N_MAX_VALUES, N_MIN_VALUES, P_MIN_VALUES

__all__ = ["DEFAULT_BUDGET", "SearchOptions", "TuneOptions"]

DEFAULT_BUDGET = 240


@dataclass(frozen=True)
class SearchOptions:
    """The candidates and the schedule of the successive halving (:mod:`ggufmtp.measure.tune.search`).

    ``candidates``: search these configurations instead of the built-in space (their order is
    kept); else the built-in space over ``n_max_values`` x ``n_min_values`` x ``p_min_values`` (and
    the switches the hardware allows), in an order seeded by ``order_seed``. ``units0``, ``eta``,
    ``final_size``: the first rung's units, the halving factor and the finalists.
    ``final_on_suite``: the final rung measures its configurations on the whole suite when that
    costs at most half the budget (else a note says so), so the recommendation rests on the
    prompts verify uses."""

    candidates: Sequence[TuneConfig] | None = None
    n_max_values: Sequence[int] = N_MAX_VALUES
    n_min_values: Sequence[int] = N_MIN_VALUES
    p_min_values: Sequence[float] = P_MIN_VALUES
    order_seed: int = 0
    units0: int = DEFAULT_UNITS0
    eta: int = DEFAULT_ETA
    final_size: int = DEFAULT_FINAL_SIZE
    final_on_suite: bool = True


@dataclass(frozen=True)
class TuneOptions:
    """What ``tune`` measures with (the defaults are ``ggufmtp tune``'s).

    ``concurrency``: concurrent clients to tune for (slots are searched for > 1). ``budget``:
    evaluations (MTP requests; each paired with a vanilla request) the search may spend.
    ``seeds``, ``suite``, ``limit`` (its first N prompts), ``max_tokens``: the requests;
    ``ctx_per_slot``: the context of each slot. ``mode``: thinking mode for templates with a
    thinking switch (default: the first, "thinking"). ``bootstrap_resamples``: of the ranking's
    CIs. ``heads``: head type -> an MTP-only sidecar of the model's head re-typed (the joint search's,
    :mod:`ggufmtp.search.joint`), which a configuration's ``head`` drafts with. ``search``: the space
    and the schedule (:class:`SearchOptions`); ``server``: the servers'
    settings (:class:`~ggufmtp.measure.core.options.ServerOptions`; fair baseline: each
    configuration's vanilla arm has its non-speculative settings)."""

    concurrency: int = 1
    budget: int = DEFAULT_BUDGET
    seeds: Sequence[int] = (42,)
    suite: str | os.PathLike | Suite = DEFAULT_SUITE
    max_tokens: int = DEFAULT_MAX_TOKENS
    limit: int | None = None
    ctx_per_slot: int = DEFAULT_CTX_PER_SLOT
    mode: str | None = None
    bootstrap_resamples: int = DEFAULT_RESAMPLES
    search: SearchOptions = field(default_factory=SearchOptions)
    server: ServerOptions = field(default_factory=ServerOptions)
    heads: Mapping[str, str | os.PathLike] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise TuneError(f"concurrency {self.concurrency}: must be at least 1")
        object.__setattr__(self, "seeds", tuple(check_seeds(self.seeds)))
        if self.max_tokens < 2:
            raise TuneError(f"max_tokens {self.max_tokens}: must be at least 2")
        self.server.arm_args()  # TuneError on a speculative flag for the vanilla arm
