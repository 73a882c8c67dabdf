"""A head with a given acceptance on a given prompt set (``ggufmtp synth --target-acceptance``), and
the real shapes' designed heads (:func:`design_fraction`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import SynthError
from ..runtime.server import LlamaServer, ServerConfig
from .builtin import builtin_path
from .chain import suite_acceptance
from .layout import PUBLISHED
from .spec import SynthSpec, expected_acceptance
from .tokenizer import build_vocab


@dataclass(frozen=True)
class Calibration:
    """The wrong-successor fraction whose *realized* acceptance on a prompt set is nearest a target."""

    wrong_successor_fraction: float
    draft_n_max: int
    target: float
    acceptance: float  # exact, on the prompt set, at draft_n_max
    formula_fraction: float  # the fraction the iid formula gives for the target
    candidates: int

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _formula_fraction(target: float, draft_n_max: int) -> float:
    """The inverse of :func:`expected_acceptance` in ``f`` (bisection; it falls monotonically in f)."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_acceptance(mid, draft_n_max) > target else (lo, mid)
    return (lo + hi) / 2


def calibrate_wrong_fraction(target: float, draft_n_max: int, last_tokens: Sequence[int], n_predict: int,
                             base: SynthSpec = SynthSpec(), spread: float = 0.25) -> Calibration:
    """The fraction (a whole number of corrupted text tokens) within ``spread`` (relative) of the
    formula's inverse whose exact acceptance on the prompts is nearest ``target``; ties go to the one
    nearer the formula.

    Why: a 128-token reply visits a small part of the successor cycle, so which tokens are corrupted
    moves a prompt set's acceptance by a few points around :func:`expected_acceptance` (f=0.136, 75.2%
    by the formula, gave 74.0% on chat-v1 at k=3). Benchmarks that quote "at 75% acceptance" pick
    the head by the acceptance it actually has on their prompts."""
    if not 0.0 < target < 1.0:
        raise SynthError(f"target acceptance {target}: must be in (0, 1)")
    if not last_tokens:
        raise SynthError("calibration needs at least one prompt")
    f0 = _formula_fraction(target, draft_n_max)
    n_text = len(build_vocab(base.shape).text_token_ids())
    first = max(1, int(math.floor(f0 * (1 - spread) * n_text)))
    last = min(n_text, int(math.ceil(f0 * (1 + spread) * n_text)))
    acceptance: dict[float, float] = {}
    for n_bad in range(first, last + 1):
        f = n_bad / n_text
        d, a = suite_acceptance(dataclasses.replace(base, wrong_successor_fraction=f), last_tokens, n_predict, draft_n_max)
        acceptance[f] = a / d if d else 0.0
    f = min(acceptance, key=lambda x: (abs(acceptance[x] - target), abs(x - f0)))
    return Calibration(round(f, 6), draft_n_max, target, acceptance[f], f0, len(acceptance))


def chat_last_tokens(messages: Sequence[list[dict[str, str]]], threads: int | None = None) -> list[int]:
    """The last token of each chat's generation prompt, as llama-server renders and tokenizes it for
    a synthetic model: a CPU llama-server on the built-in tiny model does it (every synthetic model,
    tiny or real-shaped, has the same tokenizer and chat template)."""
    with LlamaServer(ServerConfig(model=builtin_path("tiny-qwen35moe"), threads=threads, metrics=False,
                                  gpu_layers=0)) as srv:
        return [srv.chat_prompt_tokens(m)[-1] for m in messages]


def design_fraction(shape: str, prompts: Sequence[Sequence[Mapping[str, str]]], threads: int | None = None) -> Calibration:
    """The wrong-successor fraction of real shape ``shape``'s designed head
    (:class:`~ggufmtp.synth.layout.HeadDesign`), computed again from ``prompts`` (the chat messages of
    its design's suite, ``HeadDesign.suite`` limited to ``HeadDesign.limit``: the caller loads them, so
    the factory does not depend on measuring) tokenized by a CPU llama-server (:func:`chat_last_tokens`),
    then :func:`calibrate_wrong_fraction` at its window."""
    if shape not in PUBLISHED:
        raise SynthError(f"shape {shape!r} has no designed head (real shapes: {', '.join(PUBLISHED)})")
    pub = PUBLISHED[shape]
    d = pub.head
    last = chat_last_tokens([[dict(x) for x in m] for m in prompts], threads=threads)
    return calibrate_wrong_fraction(d.acceptance, d.draft_n_max, last, d.max_tokens,
                                    base=SynthSpec(arch=pub.arch, shape=shape))
