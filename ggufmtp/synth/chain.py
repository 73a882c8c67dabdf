"""The bigram chain a synthetic model follows, and the exact replay of llama-server's MTP draft loop.

Greedy decoding after token ``x`` yields ``s(x), s(s(x)), ...``; the MTP head drafts ``s(c(x))``
where ``c`` swaps the embedding of a few corrupted tokens (the ``wrong_successor_fraction`` knob).
Nothing here runs a model: the tests check these predictions against llama-server.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .archs.registry import arch_for
from .spec import SynthSpec, spec_rng
from .tokenizer import build_vocab


@dataclass(frozen=True)
class Chain:
    """The successor function of a spec's model, and the MTP head's version of it."""

    successor: np.ndarray  # [n_text_vocab] -> token id (trunk), defined for every input token
    draft_successor: np.ndarray  # [n_text_vocab] -> what the MTP head drafts after each token
    embed_source: np.ndarray  # [n_text_vocab] row of token_embd written as nextn.embed_tokens[x]
    corrupted: np.ndarray  # bool [n_text_vocab]
    text_ids: np.ndarray


class DraftCounts(NamedTuple):
    """llama-server's ``draft_n`` and ``draft_n_accepted`` for a reply (or summed over several)."""

    drafted: int
    accepted: int


_chain_cache: dict[tuple, Chain] = {}


def _successors(rng: np.random.Generator, text: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """One random cycle through the text tokens; every other token maps onto some text token."""
    cycle = rng.permutation(text)
    succ = np.empty(n, dtype=np.int64)
    succ[cycle] = np.roll(cycle, -1)
    others = np.setdiff1d(np.arange(n), text)
    succ[others] = cycle[rng.permutation(len(cycle))[: len(others)] % len(cycle)] if len(others) <= len(cycle) \
        else cycle[rng.integers(0, len(cycle), len(others))]
    return cycle, succ


def _corrupt(rng: np.random.Generator, text: np.ndarray, cycle: np.ndarray, n: int,
             fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Pick ``round(fraction * n_text)`` text tokens; each borrows another text token's embedding."""
    n_bad = int(round(fraction * len(text)))
    corrupted = np.zeros(n, dtype=bool)
    source = np.arange(n)
    if n_bad:
        bad = rng.choice(text, size=n_bad, replace=False)
        corrupted[bad] = True
        pos = {int(t): i for i, t in enumerate(cycle)}
        for t in bad:
            off = int(rng.integers(1, len(cycle)))  # never itself
            source[t] = cycle[(pos[int(t)] + off) % len(cycle)]
    return corrupted, source


def chain_for(spec: SynthSpec) -> Chain:
    """The successor function s (and the MTP head's draft successor) of a spec."""
    key = (spec.shape, spec.seed, spec.wrong_successor_fraction)
    if key in _chain_cache:
        return _chain_cache[key]
    vocab = build_vocab(spec.shape)
    n = vocab.n_text_vocab
    text = vocab.text_token_ids()
    rng = spec_rng(spec, "chain")
    cycle, succ = _successors(rng, text, n)
    corrupted, source = _corrupt(rng, text, cycle, n, spec.wrong_successor_fraction)
    ch = Chain(succ, succ[source], source, corrupted, text)
    _chain_cache[key] = ch
    return ch


def realized_fraction(spec: SynthSpec) -> float:
    """The exact fraction of text tokens whose draft successor is wrong (``round(f*n)/n``)."""
    if not spec.wrong_successor_fraction:
        return 0.0
    ch = chain_for(spec)
    return float(ch.corrupted[ch.text_ids].mean())


def predict_tokens(spec: SynthSpec, last_token: int, n: int) -> list[int]:
    """The tokens greedy decoding produces after a prompt ending in ``last_token``."""
    succ = chain_for(spec).successor
    out, t = [], int(last_token)
    for _ in range(n):
        t = int(succ[t])
        out.append(t)
    return out


def effective_draft_n_max(spec: SynthSpec, draft_n_max: int) -> int:
    """The draft length llama-server uses: with several MTP heads (``nextn_predict_layers`` > 1,
    ``chain_heads`` in ``common/speculative.cpp``) draft step ``i`` runs head ``i``, so a draft is
    capped at the number of heads; one head drafts ``draft_n_max`` tokens."""
    heads = spec.n_mtp_blocks
    return min(draft_n_max, heads) if heads > 1 else draft_n_max


def simulate_acceptance(spec: SynthSpec, last_token: int, n_predict: int, draft_n_max: int,
                        draft_n_min: int = 0, head_successors: Sequence[np.ndarray] | None = None) -> DraftCounts:
    """(drafted, accepted) that llama-server's draft-mtp loop should report for one reply of
    ``n_predict`` tokens after a prompt ending in ``last_token`` (temperature 0, one slot): each
    draft is capped at ``n_remaining - 1`` tokens, discarded below ``draft_n_min``.

    On an architecture without partial rollback (qwen3next: ``SynthArch.partial_rollback`` False;
    ``tools/server/server-context.cpp``, ``spec_is_replay``) a draft with a rejection is replayed from
    a checkpoint: the accepted tokens plus the correction are decoded again as an uncounted draft
    whose verification also samples the next token, so that step emits ``a + 2`` tokens, not ``a + 1``.

    Several heads: drafts are :func:`effective_draft_n_max` long and draft step ``i`` uses
    ``head_successors[i]`` (default: every head drafts the spec's ``draft_successor``; a test that
    patches one head passes each head's table)."""
    replay = not arch_for(spec.arch).partial_rollback
    ch = chain_for(spec)
    heads = list(head_successors) if head_successors is not None else [ch.draft_successor]
    draft_n_max = effective_draft_n_max(spec, draft_n_max)
    seq = predict_tokens(spec, last_token, n_predict)
    drafted = accepted = 0
    n_gen = 1  # the first token comes from the prompt pass
    last = seq[0]
    while n_gen < n_predict:
        n_max = min(draft_n_max, n_predict - n_gen - 1)
        if n_max <= 0 or n_max < max(draft_n_min, 1):
            n_gen += 1
            last = seq[n_gen - 1]
            continue
        d, t = [], last
        for i in range(n_max):
            t = int(heads[min(i, len(heads) - 1)][t])
            d.append(t)
        a = 0
        while a < len(d) and d[a] == seq[n_gen + a]:
            a += 1
        drafted += len(d)
        accepted += a
        n_gen += a + 1 + (replay and a < len(d))
        last = seq[min(n_gen, n_predict) - 1]
    return DraftCounts(drafted, accepted)


def suite_acceptance(spec: SynthSpec, last_tokens: Iterable[int], n_predict: int, draft_n_max: int,
                     draft_n_min: int = 0) -> DraftCounts:
    """(drafted, accepted) summed over replies of ``n_predict`` tokens to prompts ending in each of
    ``last_tokens``: what a verify run of those prompts at temperature 0 reports, exactly (seeds do
    not change it)."""
    drafted = accepted = 0
    for t in last_tokens:
        d, a = simulate_acceptance(spec, int(t), n_predict, draft_n_max, draft_n_min)
        drafted, accepted = drafted + d, accepted + a
    return DraftCounts(drafted, accepted)
