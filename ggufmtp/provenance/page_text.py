"""The words of a model page (``ggufmtp card`` and the ladder's card) around its tables: the
findings of each file in plain words, the importance matrix with its calibration text and the MTP
head's statistics credited, and the provenance in one short section (receipts, signatures, how to
audit).

Every statement is read from an audited receipt; the head and the verdict are re-derived as audit
derives them (:attr:`.card_page.FileRow.head`, :func:`.page_tables.verdict_cell`), never read from
what the receipt recorded. A file without a publishable verification is said to be "not verified",
with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..fmt import ci_phrase, divergence, pct, significant, times
from .card_page import FileRow
from .head import HeadDecision, HeadFinding, level_text
from .page_tables import speed_judged, verdict_cell

__all__ = ["findings_lines", "imatrix_lines", "provenance_summary"]


def _mapping(x: Any) -> Mapping[str, Any]:
    return x if isinstance(x, Mapping) else {}


def _head_words(f: HeadFinding, with_ci: bool) -> str:
    """The head against its reference, as a sentence: the decision, the difference and the margin."""
    ci = (f" ({level_text(f.level)} CI {100 * (f.difference_ci[0] or 0):+.1f} to {100 * (f.difference_ci[1] or 0):+.1f})"
          if with_ci and None not in f.difference_ci else "")
    diff = f.difference or 0.0
    how = (f"as often as the reference's{ci}" if abs(diff) < 0.0005 else
           f"{abs(100 * diff):.1f} points {'less' if diff < 0 else 'more'} often than the reference's{ci}")
    margin = f"{100 * f.margin:.1f}-point margin"
    if f.decision == HeadDecision.PRESERVED:
        return f"the MTP head is **preserved**: its drafts are accepted {how}, within the {margin}"
    if f.decision == HeadDecision.DEGRADED:
        return f"the MTP head is **degraded**: its drafts are accepted {how}, beyond the {margin}"
    return (f"the head finding is **inconclusive**: its drafts are accepted {how}, which neither clears nor "
            f"crosses the {margin}; more prompts would decide it")


def _speed_words(r: FileRow) -> str:
    v = r.verification
    ci = ci_phrase(v.get("speedup_ci95"), 1, 2, "×") if r.shows_ci else ""
    hw = _mapping(v.get("hardware"))
    gpu = hw.get("gpu") or hw.get("gpus")
    gpu = ", ".join(str(g) for g in gpu) if isinstance(gpu, list) else gpu
    if speed_judged(v):
        return (f"decoding ran {times(v.get('speedup'), 2)} as fast as vanilla llama-server with the same settings"
                f"{ci}{f' on {gpu}' if gpu else ''}")
    from .verdict import Placement

    return (f"speed was not verified ({Placement.of_record(v).why_unjudged()}; measured "
            f"{times(v.get('speedup'), 2)}{ci})")


def _quality_words(q: Mapping[str, Any]) -> str:
    if q.get("kld_mean") is None:
        return "quality against the base was not measured (`ggufmtp eval`)"
    return (f"against the base model its mean KLD is {divergence(q.get('kld_mean'))} and its most likely next token is "
            f"the base's {pct(q.get('same_top_p'), 2, space=False)} of the time (PPL {significant(q.get('ppl'))}, base "
            f"{significant(q.get('ppl_base'))})")


def finding_text(r: FileRow) -> str:
    """One file's findings in plain words: the head, acceptance, speed, quality and the verdict."""
    v = r.verification
    if not v:
        return f"not verified ({r.unverified}); {_quality_words(r.quality)}."
    m = _mapping(v.get("mtp"))
    k = _mapping(v.get("settings")).get("draft_n_max")
    f = r.head
    th = _mapping(v.get("thresholds"))
    head = (_head_words(f, r.shows_ci) if f is not None else
            f"no reference was measured, so the head is judged by the recipe's minimum acceptance "
            f"({pct(th.get('min_acceptance'), 1, space=False)})")
    acc_ci = ci_phrase(m.get("acceptance_ci95"), 100, 1, "%") if r.shows_ci else ""
    words = [head, f"llama-server accepted {pct(m.get('acceptance'), 1, space=False)} of its drafts{acc_ci}"
             + (f" at k={k}" if k else ""), _speed_words(r), _quality_words(r.quality)]
    verdict = verdict_cell(r)
    return "; ".join(words) + f". Verdict: **{verdict}**" + (f" ({r.unverified})." if r.unverified else ".")


def findings_lines(rows: Sequence[FileRow]) -> list[str]:
    """``## Findings``: each file's findings in plain words, largest first."""
    if not rows:
        return []
    out = ["## Findings\n"]
    out += [f"- `{r.artifact}`{f' ({r.tag})' if r.tag else ''}: {finding_text(r)}"
            for r in sorted(rows, key=lambda r: -r.size_bytes)]
    return out + [""]


def _corpus_credit(name: str) -> str:
    """Where a calibration text comes from (ggufmtp's own, or the publisher's)."""
    if name.startswith("builtin:"):
        return f"`{name}`, ggufmtp's own calibration text (essays, code, math and chat written for it)"
    return f"`{name}`"


def imatrix_lines(rows: Sequence[FileRow]) -> list[str]:
    """``## Importance matrix``: each imatrix the files were made with, its calibration text and
    chunks, the MTP head's statistics (``imatrix compute`` collects them; llama-imatrix alone never
    does) or the tensors quantized without statistics, and the files made with it."""
    by_sha: dict[str, tuple[Mapping[str, Any], list[str]]] = {}
    for r in rows:
        im = r.imatrix
        if im:
            by_sha.setdefault(str(im.get("sha256")), (im, []))[1].append(r.artifact)
    if not by_sha:
        return []
    out = ["## Importance matrix\n"]
    for sha, (im, files) in by_sha.items():
        c = _mapping(im.get("computed"))
        corpus = _mapping(c.get("corpus"))
        if corpus:
            text = (f"computed by `ggufmtp imatrix compute` over {_corpus_credit(str(corpus.get('name')))} (sha256 "
                    f"`{str(corpus.get('sha256'))[:16]}`), {c.get('chunks')} chunks of {c.get('ctx_size')} tokens, "
                    f"llama.cpp `{c.get('runtime_commit')}`")
        else:
            names = ", ".join(_corpus_credit(str(d)) for d in im.get("datasets") or []) or "calibration text not recorded"
            text = f"from {names}, {im.get('chunk_count') or '?'} chunks"
        if c.get("mtp"):
            head = (f"; it holds the MTP head's own statistics ({c.get('mtp_entries')} entries of the MTP block, "
                    "collected by ggufmtp's `ggufmtp-mtp-imatrix` on the pinned llama.cpp, the head fed as "
                    "llama-server's draft-mtp feeds it; llama-imatrix alone never collects them)")
        elif im.get("missing"):
            head = (f"; {len(im['missing'])} tensor(s), the MTP block's among them, have no statistics in it (llama-imatrix "
                    "never collects the MTP block) and were quantized without")
        else:
            head = ""
        out.append(f"- `{im.get('file')}` (sha256 `{sha[:16]}`, {im.get('entries')} entries): {text}{head}. "
                   f"Used by {', '.join(f'`{a}`' for a in files)}.")
    return out + [""]


def provenance_summary(rows: Sequence[FileRow]) -> list[str]:
    """``## Provenance``: where the files come from, their receipts and signatures, how to audit."""
    if not rows:
        return []
    src = rows[0].source
    base = src.get("repo_id") or src.get("name") or "the base model"
    at = f" at commit `{src['commit']}`" if src.get("commit") else ""
    signed = sum(r.signed for r in rows)
    sig = (f"all {len(rows)} are signed (DSSE envelopes)" if signed == len(rows) else
           f"{signed} of {len(rows)} are signed (DSSE envelopes)" if signed else "they are not signed")
    return ["## Provenance\n",
            f"- Made from `{base}`{at}" + (f" (upstream: `{rows[0].original}`)" if rows[0].original not in (None, base)
                                            else "") + ": every input's sha256 is in each file's receipt.",
            f"- Receipts: `FILE.gguf.receipt.json` beside each file, an in-toto statement of its inputs, recipe, "
            f"toolchain, verification and quality; {sig}.",
            "- Audit any file: `ggufmtp audit FILE.gguf` re-hashes it, checks the receipt's integrity and re-derives "
            "the verdict from the recorded measurements; `--public-key KEY.pem` also checks the signatures (the "
            "receipt's and, where published, the file's `FILE.gguf.sig`).", ""]
