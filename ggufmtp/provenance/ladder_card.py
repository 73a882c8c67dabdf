"""The card of a ladder (``ggufmtp ladder``): every variant of one model in one comparison table.

Published quant ladders compare variants in one table (size, bits per weight, PPL, KLD); for MTP
GGUFs what decides whether a variant is worth downloading is also its acceptance and its fair
speedup. Every row is read from that variant's receipt, and only after :func:`~.audit.audit` has
checked the artifact's bytes against it (a receipt that does not audit clean is refused, naming the
file and the failed checks): the card states nothing a receipt does not. A variant whose
verification is missing or failed is listed under :data:`~.card.UNVERIFIED_HEADING`, so the upload
gate's ``--allow-unverified`` finds it said.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .._version import __version__
from ..constants import LLAMA_CPP_COMMIT
from ..errors import AuditError
from ..fmt import ci_phrase, human_bytes, pct, times
from .audit import audit
from .card import TAGS, UNVERIFIED_HEADING, CardMeta, unverified_reason
from .head import HeadComparison
from .receipt import read_receipt
from .statement import QualitySection, Source, Verification
from .verdict import judge_record

__all__ = ["LadderRow", "ladder_rows", "ladder_card_text", "make_ladder_card"]


@dataclass(frozen=True)
class LadderRow:
    """One variant as its (audited) receipt describes it."""

    artifact: str  # file name
    receipt: str  # file name
    recipe: str
    size_bytes: int
    bpw: float | None
    quality: QualitySection  # the receipt's ``quality`` section ({} without eval)
    verification: Verification  # the receipt's ``verification`` ({} without one)
    unverified: str | None  # why the variant is not verified (None when it is)
    source: Source

    @property
    def verdict(self) -> str:
        return str(self.verification.get("verdict") or "not verified")


def ladder_rows(variants: Sequence[tuple[Path, Path]], public_key: str | Path | None = None) -> list[LadderRow]:
    """Each ``(artifact, receipt)`` audited, then read; AuditError naming the first that fails."""
    rows = []
    for artifact, receipt in variants:
        rep = audit(artifact, receipt, public_key=public_key)
        if not rep.ok:
            raise AuditError(f"{artifact}: audit failed against {receipt}, so it has no row in the ladder's card: "
                             + "; ".join(f"{c.name}: {c.detail}" for c in rep.failures))
        st = read_receipt(receipt).statement
        p = st["predicate"]
        rows.append(LadderRow(artifact=Path(artifact).name, receipt=Path(receipt).name, recipe=p["recipe"]["name"],
                              size_bytes=int(p["result"]["size_bytes"]), bpw=p["result"].get("bpw"),
                              quality=QualitySection(**(p.get("quality") or {})),
                              verification=Verification(**(p.get("verification") or {})),
                              unverified=unverified_reason(st), source=Source(**p["base_model"]["source"])))
    return sorted(rows, key=lambda r: -r.size_bytes)


def _cell(x: float | None, nd: int) -> str:
    return "n/a" if x is None else f"{x:.{nd}f}"


def _row(r: LadderRow) -> str:
    q, v = r.quality, r.verification
    m = v.get("mtp") or {}
    acc = pct(m.get("acceptance"), 1, space=False) + ci_phrase(m.get("acceptance_ci95"), 100, 1, "%")
    speed = times(v.get("speedup"), 2) + ci_phrase(v.get("speedup_ci95"), 1, 2, "×")
    if v and v.get("speed_checked") is False:
        speed += " (CPU: not judged)"
    return (f"| `{r.recipe}` | [{r.artifact}]({r.artifact}) | {human_bytes(r.size_bytes)} | {_cell(r.bpw, 3)} | "
            f"{_cell(q.get('ppl'), 4)} | {_cell(q.get('kld_mean'), 6)} | {pct(q.get('same_top_p'), 2, space=False)} | "
            f"{acc if v else 'n/a'} | {_head_cell(v)} | {speed if v else 'n/a'} | {_verdict_cell(r)} | "
            f"[receipt]({r.receipt}) |")


def _head_cell(v: Verification) -> str:
    """The head against its reference as audit re-derives it from the pairs (n/a: none measured)."""
    if not v or v.get("head") is None:
        return "n/a"
    try:
        f = next(iter(HeadComparison.of_dict(v.get("head")).findings().values()))
    except ValueError:
        return "n/a"
    lo, hi = f.difference_ci95
    pts = lambda x: "n/a" if x is None else f"{x * 100:+.1f}"  # noqa: E731
    return f"{pts(f.difference)} pts ({pts(lo)} to {pts(hi)}): {'preserved' if f.preserved else 'NOT preserved'}"


def _verdict_cell(r: LadderRow) -> str:
    """The verdict with its findings as audit re-derives them; "not verified" for an unverified row."""
    if r.unverified or not r.verification:
        return "not verified"
    j = judge_record(r.verification)
    return f"{j.verdict.value} ({j.findings.text()})"


def ladder_card_text(rows: Sequence[LadderRow], title: str) -> tuple[CardMeta, str]:
    """(YAML metadata, markdown body) of the ladder's card."""
    meta: CardMeta = {"tags": list(TAGS), "quantized_by": "ggufmtp", "pipeline_tag": "text-generation",
                      "library_name": "gguf"}
    repo = next((r.source.get("repo_id") for r in rows if r.source.get("type") == "hub"), None)
    if repo:
        meta["base_model"] = repo
    lines = [f"# {title}\n",
             f"{len(rows)} MTP runtime GGUF variants of one model, made with ggufmtp {__version__} (llama.cpp "
             f"`{LLAMA_CPP_COMMIT}`). Each keeps the multi-token-prediction (NextN) block so "
             "`llama-server --spec-type draft-mtp` can draft with it. Every row is read from the variant's "
             "receipt after its bytes were audited against it; PPL and KLD are against the base model "
             "(`llama-perplexity --kl-divergence`), acceptance and speedup against vanilla llama-server "
             "given the same settings, with 95% confidence intervals.\n",
             "| variant | file | size | bpw | PPL | mean KLD | Same top p | acceptance | head vs reference (95% CI) | "
             "speedup | verdict | receipt |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [_row(r) for r in rows]
    unverified = [r for r in rows if r.unverified]
    if unverified:
        lines += ["", UNVERIFIED_HEADING, ""]
        lines += [f"- `{r.artifact}`: {r.unverified}" for r in unverified]
    lines += ["", "Audit any file: `ggufmtp audit FILE.gguf` (the receipt beside it is read).", ""]
    return meta, "\n".join(lines)


def make_ladder_card(variants: Sequence[tuple[Path, Path]], output: str | Path, title: str,
                     public_key: str | Path | None = None) -> Path:
    """Audit every variant, then write the ladder's card to ``output`` (atomically); its path."""
    from huggingface_hub import ModelCard, ModelCardData

    from ..files.fsutil import atomic_write_text

    meta, body = ladder_card_text(ladder_rows(variants, public_key), title)
    out = Path(output)
    atomic_write_text(out, str(ModelCard(f"---\n{ModelCardData(**meta).to_yaml()}\n---\n\n{body}")))
    return out
