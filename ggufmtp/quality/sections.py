"""The receipt sections this stage writes: ``quality`` (eval) and ``head_sweep``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..errors import AuditDigestMismatch
from ..jsontypes import JsonObject
from ..provenance.receipt import Receipt, read_receipt, set_section
from ..provenance.statement import Statement
from .eval import QualityResult
from .options import EvalOptions


def _refuse_other_artifact(rf: Receipt, sha256: str | None, what: str) -> None:
    """A receipt stores figures of its own artifact only (AuditError naming both digests)."""
    subject = rf.statement["subject"][0]
    have = str(subject["digest"]["sha256"]).lower()
    if sha256 is not None and sha256.lower() != have:
        raise AuditDigestMismatch(f"{rf.path}: its artifact {subject['name']} has sha256 {have}, the {what} measured "
                                  f"a file with sha256 {sha256}; store it in that file's receipt",
                                  path=rf.path, expected=have, actual=sha256)


def store_quality(receipt: str | Path, result: QualityResult, signing_key: str | Path | None = None) -> Statement:
    """Write ``result`` as the receipt's ``quality`` section (the quant must be the receipt's
    artifact); the receipt is read once, for the check and the rewrite."""
    rf = read_receipt(receipt)
    _refuse_other_artifact(rf, result.quant_sha256, "eval")
    return set_section(rf, "quality", result.to_dict(names=True), signing_key)


def store_head_sweep(receipt: str | Path, section: JsonObject, signing_key: str | Path | None = None
                     ) -> Statement:
    """Write a head sweep's JSON (``HeadSweepResult.to_dict()``) as the receipt's ``head_sweep`` section."""
    return set_section(receipt, "head_sweep", section, signing_key)


def eval_into_receipt(base: str | Path, artifact: str | Path, receipt: str | Path, options: EvalOptions | None = None,
                      signing_key: str | Path | None = None, progress: bool = True,
                      log: Callable[[str], None] = lambda m: None) -> QualityResult:
    """``run --eval``: evaluate the artifact against its base with ``options`` and store the
    result as the receipt's ``quality`` section (its ``to_dict()``); returns the result."""
    from .eval import evaluate

    result = evaluate(base, artifact, options, progress=progress, log=log)
    store_quality(receipt, result, signing_key)
    return result
