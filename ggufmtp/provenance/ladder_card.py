"""The card of a ladder (``ggufmtp ladder``): every variant of one model on one model page.

Published quant ladders compare variants side by side (size, the memory each needs, PPL, KLD); for
MTP GGUFs what decides whether a variant is worth downloading is also its acceptance and its fair
speedup, so the page has a Files table (which file, by memory), a Quality and an MTP head table
(:mod:`.page_tables`), each file's findings in words, its download and run lines, the prompt
template, the importance matrix credited and the provenance (:mod:`.page_text`). Every row is
read from that variant's receipt, and only after :func:`~.audit.audit` has checked the artifact's
bytes against it (a receipt that does not audit clean is refused, naming the file and the failed
checks): the card states nothing a receipt does not. A variant whose verification is missing or
failed is listed under :data:`~.card.UNVERIFIED_HEADING`, so the upload gate's
``--allow-unverified`` finds it said, and its row reads "not verified". The parts of the page are
shared with the single-variant card (:mod:`.card_page`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .._version import __version__
from ..constants import LLAMA_CPP_COMMIT
from ..errors import AuditError
from .audit import AuditReport, audit
from .card import UNVERIFIED_HEADING
from .card_page import (
    CardMeta,
    FileRow,
    PageOptions,
    card_title,
    page_meta,
    prompt_format_lines,
    read_chat_template,
    run_lines,
)
from .page_tables import files_tables, with_gpu_memory
from .page_text import findings_lines, imatrix_lines, provenance_summary
from .pair_card import SIDECAR_HEADING, SidecarFile, draft_lines, pair_lines, served_with
from .receipt import read_receipt
from .search_card import search_lines
from .vacuous import VACUOUS_HEADING, vacuous_thresholds

__all__ = ["LadderRow", "ladder_rows", "ladder_card_text", "make_ladder_card"]

LadderRow = FileRow  # one variant as its (audited) receipt describes it


def _audit_all(files: Sequence[tuple[Path, Path | None]], public_key: str | Path | None) -> list[AuditReport]:
    """Every ``(artifact, receipt)`` audited at once, reports in input order: each audit is a
    sha256 of a whole file, which hashlib computes without the GIL, so a ladder's audits take the
    longest file's time instead of their sum (the 4-GPU rehearsal spent 28 s auditing 4 variants
    one by one after the last variant was done)."""
    if len(files) < 2:
        return [audit(a, r, progress=False, public_key=public_key) for a, r in files]
    with ThreadPoolExecutor(max_workers=min(len(files), os.cpu_count() or 1)) as pool:
        return list(pool.map(lambda f: audit(f[0], f[1], progress=False, public_key=public_key), files))


def ladder_rows(variants: Sequence[tuple[Path, Path]], public_key: str | Path | None = None,
                sidecars: Sequence[Path] = ()) -> list[LadderRow]:
    """Each ``(artifact, receipt)`` audited, then read, with the GPU memory it needs to draft (a
    trunk: with the one of ``sidecars`` it is served with); AuditError naming the first that fails."""
    rows = []
    by_name = {Path(s).name: Path(s) for s in sidecars}
    for (artifact, receipt), rep in zip(variants, _audit_all(variants, public_key)):
        if not rep.ok:
            raise AuditError(f"{artifact}: audit failed against {receipt}, so it has no row in the ladder's card: "
                             + "; ".join(f"{c.name}: {c.detail}" for c in rep.failures))
        rc = read_receipt(receipt)
        row = FileRow.of(rc.statement, Path(artifact).name, Path(receipt).name, read_chat_template(artifact))
        row = dataclasses.replace(row, signed=rc.signed)
        side = by_name[served_with(row, [SidecarFile(n) for n in by_name])] if by_name else None
        rows.append(with_gpu_memory(row, artifact, side))
    return sorted(rows, key=lambda r: -r.size_bytes)


def ladder_card_text(rows: Sequence[LadderRow], title: str | None = None, options: PageOptions | None = None,
                     sidecars: Sequence[SidecarFile] = ()) -> tuple[CardMeta, str]:
    """(YAML metadata, markdown body) of the ladder's card; ``title`` defaults to the model's
    (``<Model> MTP GGUF``); ``sidecars``: the rows are trunks served with these MTP sidecars
    (:mod:`.pair_card` explains the pair)."""
    o = options or PageOptions()
    model = rows[0].model if rows else "model"
    keeps = ("Each is a trunk without the multi-token-prediction (NextN) head, which is published once, as the MTP "
             f"sidecar{'s' * (len(sidecars) > 1)} {', '.join(f'`{s.name}`' for s in sidecars)} "
             f"(see *{SIDECAR_HEADING.removeprefix('## ')}* below), so" if sidecars else
             "Each keeps the multi-token-prediction (NextN) block so")
    lines = [f"# {title or card_title(model)}\n",
             f"{len(rows)} MTP runtime GGUF variant(s) of {model}, made with ggufmtp {__version__} (llama.cpp "
             f"`{LLAMA_CPP_COMMIT}`). {keeps} `llama-server --spec-type draft-mtp` can draft with it. Every row is "
             "read from the variant's receipt (`FILE.receipt.json` beside it) after its bytes were audited against "
             "it.\n"]
    lines += files_tables(rows, o)
    unverified = [r for r in rows if r.unverified]
    if unverified:
        lines += [UNVERIFIED_HEADING, ""]
        lines += [f"- `{r.artifact}`: {r.unverified}" for r in unverified] + [""]
    vacuous = [(r, found) for r in rows if not r.unverified and (found := vacuous_thresholds(r.verification))]
    if vacuous:
        lines += [VACUOUS_HEADING, "", "These verdicts pass whatever was measured against these thresholds, so they "
                  "claim nothing there:", ""]
        lines += [f"- `{r.artifact}`: {'; '.join(found.values())}" for r, found in vacuous] + [""]
    side = {r.artifact: served_with(r, sidecars) for r in rows} if sidecars else {}
    lines += findings_lines(rows)
    lines += ["## How to run\n", *run_lines(rows, o, side), *draft_lines(rows, sidecars, o)]
    lines += pair_lines(rows, sidecars, o)
    modes = sorted({m for r in rows if isinstance(r.verification.get("modes"), dict) for m in r.verification["modes"]})
    lines += prompt_format_lines(next((r.chat_template for r in rows if r.chat_template), None), modes)
    for r in rows:  # a searched recipe: how it was found (its own section, its file named)
        how = search_lines(r.search, r.recipe)
        lines += [how[0], f"For `{r.artifact}`.", "", *how[1:]] if how else []
    lines += imatrix_lines(rows) + provenance_summary(rows)
    return page_meta(rows, o), "\n".join(lines)


def make_ladder_card(variants: Sequence[tuple[Path, Path]], output: str | Path, title: str | None = None,
                     public_key: str | Path | None = None, options: PageOptions | None = None,
                     sidecars: Sequence[Path] = ()) -> Path:
    """Audit every variant (and each MTP sidecar the variants, trunks, are served with), then write
    the ladder's card to ``output`` (atomically); its path."""
    from huggingface_hub import ModelCard, ModelCardData

    from ..files.fsutil import atomic_write_text

    rows = ladder_rows(variants, public_key, sidecars)
    for s, rep in zip(sidecars, _audit_all([(s, None) for s in sidecars], public_key)):
        if not rep.ok:
            raise AuditError(f"{s}: audit failed, so the ladder's card does not describe it: "
                             + "; ".join(f"{c.name}: {c.detail}" for c in rep.failures))
    meta, body = ladder_card_text(rows, title, options, [SidecarFile.of(Path(s)) for s in sidecars])
    out = Path(output)
    atomic_write_text(out, str(ModelCard(f"---\n{ModelCardData(**meta).to_yaml()}\n---\n\n{body}")))
    return out
