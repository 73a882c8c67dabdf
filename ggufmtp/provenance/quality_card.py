"""The single-variant card's quality sections: the figures against the base model (PPL, KLD, Same
top p, with their errors) and the head-precision sweep."""

from __future__ import annotations

from ..fmt import ci_phrase, divergence, human_bytes, num, pct, significant, times
from .statement import HeadSweepSection, Predicate


def _pm(x: float | None, err: float | None) -> str:
    """A perplexity for people (3 significant digits, ``2.31e10`` when huge) and its error."""
    if x is None:
        return "n/a"
    return significant(x) + (f" ± {significant(err, 2)}" if err is not None else "")


def _kld(x: float | None, err: float | None) -> str:
    """A KL divergence (a tiny negative from numerical error reads 0) and its error."""
    return divergence(x) + (f" ± {divergence(err)}" if x is not None and err is not None else "")


def quality_lines(p: Predicate) -> list[str]:
    """``## Quality`` (from ``predicate.quality``) and ``## MTP head precision`` (``head_sweep``)."""
    return _ladder(p) + _head_sweep(p.get("head_sweep"))


def _ladder(p: Predicate) -> list[str]:
    """The quality figures against the base, five columns (size, acceptance and speed are in the
    page's Files and MTP head tables)."""
    q = p.get("quality")
    if not q:
        return []
    corpus = (q.get("corpus") or {}).get("name", "?")
    return ["## Quality\n",
            f"Against the base model on `{corpus}` ({q.get('chunks')} chunks of {q.get('ctx_size')} tokens, "
            f"`llama-perplexity --kl-divergence`, llama.cpp `{q.get('commit')}`).\n",
            "| PPL | PPL(base) | mean KLD | KLD 99.9% | Same top p |", "|---|---|---|---|---|",
            f"| {_pm(q.get('ppl'), q.get('ppl_err'))} | {_pm(q.get('ppl_base'), q.get('ppl_base_err'))} | "
            f"{_kld(q.get('kld_mean'), q.get('kld_mean_err'))} | {divergence(q.get('kld_p99_9'), 4)} | "
            f"{pct(q.get('same_top_p'), 2, space=False)} |", ""]


def _head_sweep(hs: HeadSweepSection | None) -> list[str]:
    rows = (hs or {}).get("variants") or []
    if not rows:
        return []
    out = ["## MTP head precision\n",
           "Same trunk (byte-identical), only the MTP block's types changed; same suite, seeds and server settings.\n",
           "| head type | head bytes | artifact | acceptance | speedup | mean acceptance length |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r.get('head_type')} | {r.get('head_bytes', 0):,} | {human_bytes(r.get('size_bytes', 0))} | "
                   f"{pct(r.get('acceptance'), 1, space=False)}{ci_phrase(r.get('acceptance_ci95'), 100, 1, '%')} | "
                   f"{times(r.get('speedup'), 2)}{ci_phrase(r.get('speedup_ci95'), 1, 2, '×')} | "
                   f"{num(r.get('mean_acceptance_length'))} |")
    if hs.get("recommended"):
        out.append(f"\nRecommended head type: **{hs['recommended']}** (the smallest whose acceptance CI overlaps "
                   "the unquantized head's).\n")
    return out + [""]
