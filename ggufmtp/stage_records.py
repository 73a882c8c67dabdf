"""What each stage of :func:`ggufmtp.run` records in ``OUT/.ggufmtp/stages/<stage>.json``
(:mod:`ggufmtp.pipeline`), as types.

A stage's record is JSON (written after the stage ran, read back when a rerun reuses it), so it
keeps a dict's shape: these ``TypedDict`` name its keys for the code that writes and reads it. The
records of quantize, audit and upload are their results' ``to_dict()`` (plus the artifact's
:class:`FileRecord` for quantize); the verify stage's holds the receipt's ``verification`` section.
A module of its own so that the pipeline stays within its size.
"""

from __future__ import annotations

from typing import TypedDict

from .jsontypes import JsonObject

__all__ = ["FileRecord", "PullSource", "PullStage", "InspectStage", "MtpRecord", "PlanStage", "VerifyStage",
           "ReceiptStage", "EvalStage", "CardStage"]


class FileRecord(TypedDict):
    """A file a stage produced: its path and the sha256 of its bytes."""

    path: str
    sha256: str


class PullSource(TypedDict):
    """The model's identity, as the pull stage's key: where it came from and every shard's digest."""

    kind: str
    ident: str
    requested_revision: str | None
    resolved_commit: str | None
    include: list[str] | None
    shards: list[list[str]]  # [file name, sha256]


class PullStage(TypedDict):
    model_path: str
    manifest: JsonObject | None  # the pull's manifest (``PullResult.to_dict()``), for a Hub model
    source: PullSource


class InspectStage(TypedDict, total=False):
    """What the inspect stage keeps of the model report (``mtp_blocks`` is missing from records
    cached before chains were reported)."""

    architecture: str | None
    block_count: int | None
    nextn_predict_layers: int | None
    mtp_block: int | None
    mtp_blocks: list[int]
    mtp_status: str
    mtp_missing: list[str]
    file_type: str | None
    n_params: int
    size_bytes: int
    bpw: float


class MtpRecord(TypedDict, total=False):
    """The ``mtp`` object of the plan and quantize records (``MtpSummary.to_dict()``)."""

    block: int | None
    blocks: list[int]
    status: str
    tensors: int
    bytes: int
    types: dict[str, int]
    eh_proj: str | None


class PlanStage(TypedDict):
    size_bytes: int
    bpw: float
    mtp: MtpRecord
    warnings: list[str]
    llama_quantize_command: str
    tensor_bytes: dict[str, int]  # the planned bytes of every tensor (the memory plan before quantizing)


class VerifyStage(TypedDict):
    verification: JsonObject  # the receipt's section (``VerifyResult.to_receipt()``)


class ReceiptStage(TypedDict):
    """The receipt as the stages after it (eval, card, upload) depend on it."""

    receipt: FileRecord
    artifact_sha256: str


class EvalStage(ReceiptStage):
    quality: JsonObject  # the receipt's ``quality`` section (``QualityResult.to_dict()``)


class CardStage(TypedDict):
    card: FileRecord
