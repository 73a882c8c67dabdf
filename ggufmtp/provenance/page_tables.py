"""The tables of a model page (``ggufmtp card`` and the ladder's card), each at most six columns
wide, the way the best GGUF pages split them:

- **Files** (which file to pick): each file's size and the GPU memory llama-server needs to draft
  with it (the MTP head loaded, its draft context and rollback states) at stated contexts, read off
  the verification's memory plan (:mod:`ggufmtp.runtime.memory`, the one estimator), and a
  line saying what the file is for;
- **Quality** against the base model (PPL, KLD, same top p), where a receipt has them;
- **MTP head** (acceptance, the head against its reference, the fair speedup, the verdict).

Every row is read from an audited receipt; the head and the verdict are re-derived as audit
derives them (:class:`~.head.HeadComparison`, :func:`~.verdict.judge_record`). The reference the
rows are measured against has a row of its own, marked "not in this repo".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..fmt import ci_phrase, divergence, human_bytes, pct, points, significant, times
from .card_page import FileRow, PageOptions, picked_row, shard_count
from .head import HeadComparison, level_text

__all__ = ["PAGE_CONTEXT", "files_tables", "gpu_memory", "head_cell", "purpose", "speed_cell", "verdict_cell",
           "with_gpu_memory"]

PAGE_CONTEXT = 8192  # the context the Files table states GPU memory at (and the model's own)
_ON_ONE_GPU = 1 << 60  # free bytes of one GPU large enough to hold anything: every layer offloaded
# What a file is for, by bits per weight (the first bound it reaches): llama.cpp's quant families
_PURPOSES = ((15.0, "unquantized (16- or 32-bit) weights: the reference quality, for checking the others"),
             (7.5, "8-bit, near-lossless: when memory allows"),
             (5.5, "6- or 5-bit, very high quality: most of 8-bit's quality in less memory"),
             (4.5, "4-bit, high quality: the usual choice for its size"),
             (3.5, "3-bit, for tighter memory: some quality lost"),
             (2.5, "2-bit-class, low memory: noticeable quality loss"),
             (0.0, "the smallest: when nothing larger fits; large quality loss"))


def gpu_memory(artifact: str | Path, draft_n_max: int, sidecar: str | Path | None = None,
               contexts: Sequence[int] = (PAGE_CONTEXT,)) -> tuple[tuple[int, int], ...]:
    """((context, bytes), ...): what llama-server drafting with ``artifact`` (a trunk: with its MTP
    ``sidecar``, ``-md``) holds on one GPU with every layer offloaded, f16 KV cache, one slot and a
    draft window of ``draft_n_max``, at each of ``contexts`` and at the model's training context:
    the memory plan's MTP server (:func:`~ggufmtp.runtime.memory.server_memory`)."""
    from ..runtime.memory import ModelFacts, Role, ServerSpec, server_memory

    facts = ModelFacts.read(artifact)
    draft = ModelFacts.read(sidecar) if sidecar is not None else None
    ctxs = sorted({*(min(c, facts.n_ctx_train) for c in contexts), facts.n_ctx_train})
    return tuple((c, server_memory(ServerSpec(Role.MTP, facts, True, ctx_size=c, draft_n_max=draft_n_max),
                                   [_ON_ONE_GPU], draft).gpu_total) for c in ctxs)


def with_gpu_memory(row: FileRow, artifact: str | Path, sidecar: str | Path | None = None) -> FileRow:
    """``row`` with its GPU memory (:func:`gpu_memory`) at the draft window its verification ran;
    ``row`` as it is when ``artifact`` does not read as a GGUF (the card then states no memory)."""
    from ..errors import GgufmtpError

    k = _mapping(row.verification.get("settings")).get("draft_n_max")
    k = k if isinstance(k, int) and k > 0 else 3  # llama.cpp's default window where none was verified
    try:
        return dataclasses.replace(row, gpu_memory=gpu_memory(artifact, k, sidecar))
    except (GgufmtpError, OSError, ValueError):
        return row


def _cell(text: str | None) -> str:
    return "-" if text in (None, "n/a", "") else str(text)


def _mapping(x: Any) -> Mapping[str, Any]:
    return x if isinstance(x, Mapping) else {}


def _context_name(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def purpose(r: FileRow, pick: FileRow | None = None) -> str:
    """What the file is for, in words: its quant family's use (by bits per weight), the measured
    KLD against the base where known, "recommended" for ``pick`` and "not verified" when it is not."""
    bpw = r.bpw if isinstance(r.bpw, (int, float)) and math.isfinite(r.bpw) else None
    text = next(t for bound, t in _PURPOSES if bpw is not None and bpw >= bound) if bpw is not None else "-"
    kld = r.quality.get("kld_mean")
    if isinstance(kld, (int, float)):
        text += f" (mean KLD {divergence(kld)} against the base)"
    if r is pick:
        text = "**Recommended** (the largest verified file): " + text
    return text + ("; not verified" if r.unverified else "")


def _which_file(rows: Sequence[FileRow], options: PageOptions) -> list[str]:
    ctxs = next((tuple(c for c, _ in r.gpu_memory) for r in rows if r.gpu_memory), ())
    memory_cols = [f"GPU memory at {_context_name(c)} context" for c in ctxs[:2]]
    pick = picked_row(rows) if len(rows) > 1 else None
    out = ["## Files\n",
           "Pick the largest file that fits: its GPU memory is what llama-server holds on one GPU to draft with it "
           "(`--spec-type draft-mtp`: the weights with the MTP head, the f16 KV cache of the stated context and the "
           "MTP draft context, compute buffers, 1 GiB for the CUDA context), from the memory plan `ggufmtp verify` "
           "checks before serving. With partial offload (`-ngl`, `--n-cpu-moe`) GPU and system memory together "
           "need about as much.\n" if ctxs else
           "Pick the largest file that fits in your memory, with room for the KV cache and compute buffers.\n",
           "| " + " | ".join(["file", "quant", "size", *memory_cols, "what it is for"]) + " |",
           "|" + "---|" * (4 + len(memory_cols))]
    for r in sorted(rows, key=lambda r: -r.size_bytes):
        n = shard_count(r.artifact)
        need = dict(r.gpu_memory)
        mem = [human_bytes(need[c]) if c in need else "-" for c in ctxs[:2]]
        out.append(f"| [{r.artifact}]({options.at(r.artifact)}){f' ({n} shards)' if n > 1 else ''} | {_cell(r.tag)} | "
                   f"{human_bytes(r.size_bytes)} | " + "".join(f"{m} | " for m in mem) + f"{purpose(r, pick)} |")
    return out + [""]


def _reference(rows: Sequence[FileRow]) -> tuple[str, int, float | None] | None:
    """The reference the rows are measured against (name, size, its acceptance): the head's
    reference where one was measured, else the base model; None: nothing known."""
    for r in rows:
        if (f := r.head) is not None:
            hc = HeadComparison.of_dict(r.verification.get("head"))
            return hc.reference.name, hc.reference.size_bytes, f.reference_acceptance
    if rows and rows[0].base_files:
        return rows[0].base_files[0][0], sum(s for _, s in rows[0].base_files), None
    return None


def _quality_table(rows: Sequence[FileRow]) -> list[str]:
    if not any(r.quality for r in rows):
        return []
    out = ["## Quality\n", "Against the base model (`llama-perplexity --kl-divergence`): KLD and the share of tokens "
           "whose most likely next token is the base's (same top p).\n",
           "| file | size | PPL | KLD vs base | same top p |", "|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: -r.size_bytes):
        q = r.quality
        out.append(f"| `{r.artifact}` | {human_bytes(r.size_bytes)} | {_cell(significant(q.get('ppl')))} | "
                   f"{_cell(divergence(q.get('kld_mean')))} | {_cell(pct(q.get('same_top_p'), 2, space=False))} |")
    ref, ppl = _reference(rows), next((r.quality["ppl_base"] for r in rows if r.quality.get("ppl_base") is not None),
                                      None)
    if ref is not None:
        out.append(f"| `{ref[0]}` (reference, not in this repo) | {human_bytes(ref[1])} | {_cell(significant(ppl))} "
                   "| 0 | 100% |")
    return out + [""]


def head_cell(r: FileRow) -> str:
    """The head against its reference (difference in points, its CI where the evidence allows, the finding)."""
    f = r.head
    if f is None:
        return "-"
    lo, hi = f.difference_ci
    ci = f" ({level_text(f.level)} CI {points(lo, '')} to {points(hi, '')})" if r.shows_ci else ""
    return f"{points(f.difference, '')} pts{ci}, margin {f.margin * 100:.1f}: {f.decision.value}"


def speed_judged(v: Mapping[str, Any]) -> bool:
    """Whether the verdict judged the speedup (GPU offload, or a recipe that enforces it)."""
    from .verdict import speed_judged_record

    return speed_judged_record(v, malformed=False)


def speed_cell(r: FileRow) -> str:
    v = r.verification
    if not v:
        return "-"
    if not speed_judged(v):
        from .verdict import Placement

        return f"not verified ({Placement.of_record(v).short})"
    ci = ci_phrase(v.get("speedup_ci95"), 1, 2, "×") if r.shows_ci else ""
    return _cell(times(v.get("speedup"), 2) + ci)


def verdict_cell(r: FileRow) -> str:
    """The verdict with its findings as audit re-derives them: "fail (...)" where they fail it,
    "inconclusive (...)" where the head is undecided, "not verified" for any other file without a
    publishable verification (never "pass")."""
    from .verdict import Verdict, judge_record

    if not r.verification:
        return "not verified"
    j = judge_record(r.verification)
    if r.unverified and j.verdict == Verdict.PASS:
        return "not verified"
    return f"{j.verdict.value} ({j.findings.text()})"


def acceptance_cell(r: FileRow) -> str:
    m = _mapping(r.verification.get("mtp"))
    ci = ci_phrase(m.get("acceptance_ci95"), 100, 1, "%") if r.shows_ci else ""
    return _cell(pct(m.get("acceptance"), 1, space=False) + ci) if r.verification else "-"


def _mtp_table(rows: Sequence[FileRow]) -> list[str]:
    out = ["## MTP head\n",
           "Acceptance is the MTP head's draft acceptance in llama-server; the head is judged against the "
           "reference's acceptance, paired by prompt (points of difference, within a margin); speed is the decode "
           "speedup against vanilla llama-server with the same settings, judged only with the weights on the GPU.\n",
           "| file | acceptance | head vs reference | speed | verdict |", "|---|---|---|---|---|"]
    out += [f"| `{r.artifact}` | {acceptance_cell(r)} | {head_cell(r)} | {speed_cell(r)} | {verdict_cell(r)} |"
            for r in sorted(rows, key=lambda r: -r.size_bytes)]
    ref = _reference(rows)
    if ref is not None:
        out.append(f"| `{ref[0]}` (reference, not in this repo) | {_cell(pct(ref[2], 1, space=False))} | - | - | "
                   "reference |")
    return out + [""]


def files_tables(rows: Sequence[FileRow], options: PageOptions | None = None, quality: bool = True) -> list[str]:
    """The page's tables: Files (which file, by memory), Quality (where measured; ``quality=False``:
    the single-variant card's own, :mod:`.quality_card`) and MTP head."""
    o = options or PageOptions()
    return _which_file(rows, o) + (_quality_table(rows) if quality else []) + _mtp_table(rows)
