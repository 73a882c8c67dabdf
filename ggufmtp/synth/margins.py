"""The ``head_margin`` knob: an MTP head whose drafts win by a set, small number of logits.

Each text token ``x``'s row of ``nextn.embed_tokens`` becomes ``a + beta_x * e_c``: its usual
draft embedding ``a`` plus a share of a random competitor token ``c`` (one whose successor is not
the draft's). The head's logits are ``output . rmsnorm(row)`` (``eh_proj`` passes the embedding
half through, the block adds ~nothing, the norms are 1), so the draft ``t`` beats the competitor's
successor ``u`` by ``(output[t] - output[u]) . row / rms(row)``; ``beta_x`` is solved (bisection)
so that this margin is ``head_margin`` logits for every token. At BF16 (and Q8_0) the quantization
error of a row moves that difference by far less than the margin, so the drafts are unchanged and
the designed acceptance holds; 6, 5 and 4 bits move it by a sizeable fraction of it, so some drafts
flip to ``u`` and acceptance falls with the precision of the head.
"""

from __future__ import annotations

import numpy as np

from .chain import Chain


def _margin(rows: np.ndarray, d: np.ndarray) -> np.ndarray:
    rms = np.sqrt(np.mean(rows * rows, axis=1)) + 1e-12
    return np.einsum("ij,ij->i", rows, d) / rms


def with_competitors(rows: np.ndarray, embd: np.ndarray, output: np.ndarray, chain: Chain, margin: float,
                     rng: np.random.Generator) -> np.ndarray:
    """``rows`` (the text rows of ``nextn.embed_tokens``) with each text token's competitor mixed in."""
    text = chain.text_ids
    rows = rows.astype(np.float32).copy()
    target = chain.draft_successor[text]
    comp = rng.choice(text, size=len(text))
    clash = chain.successor[comp] == target  # the competitor must lead elsewhere
    while clash.any():
        comp[clash] = rng.choice(text, size=int(clash.sum()))
        clash = chain.successor[comp] == target
    d = output[target] - output[chain.successor[comp]]
    a, c = rows[text], embd[comp]
    lo, hi = np.zeros(len(text), np.float32), np.full(len(text), 4.0, np.float32)
    for _ in range(40):  # margin(beta) falls with beta: bisect to margin(beta) = head_margin
        mid = (lo + hi) / 2
        above = _margin(a + mid[:, None] * c, d) > margin
        lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
    beta = np.where(_margin(a, d) > margin, lo, 0.0).astype(np.float32)
    rows[text] = a + beta[:, None] * c
    return rows
