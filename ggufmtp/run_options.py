"""The options of :func:`ggufmtp.run` (the whole pipeline, :mod:`ggufmtp.pipeline`): one frozen
record, checked once, when built. A module of its own so that the pipeline stays within its size
and the options need nothing of it (the ladder builds them per variant)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import GgufmtpError, HubRefusedError
from .imatrix.corpus import check_later_inputs
from .measure.core.options import VerifyOptions
from .quality.options import EvalOptions
from .quant.quantize import check_quantize_threads
from .quant.split import DEFAULT_SPLIT_MAX_SIZE, SplitSize

__all__ = ["RunOptions"]


@dataclass(frozen=True)
class RunOptions:
    """What :func:`ggufmtp.run` makes, and how (the defaults are ``ggufmtp run``'s).

    The importance matrix: ``imatrix`` (a file), or ``imatrix_corpus`` (instead: compute one over
    this text, ``builtin:calib-v1`` or a file, at most ``imatrix_chunks`` chunks, with the MTP
    block's statistics when it has one). ``include``: with a Hub repo, pull only the files matching
    these patterns; ``token``: the Hub token. ``quantize_threads``: quantization
    (and imatrix) threads, ``--quantize-threads``; 0: all cores. ``split_max_size``:
    an artifact larger than this is written as shards (:mod:`ggufmtp.quant.split`; None: one file).

    ``verify``: run the verification with ``verify_options`` (a :class:`VerifyOptions`; the
    recipe's ``[verify]`` table gives the thresholds and the window they leave unset).
    ``reference_base``: judge the head against the run's source model (the BF16 checkpoint, served
    as verify's reference arm, :mod:`ggufmtp.provenance.head`) unless ``verify_options`` names
    another reference; off, the head is judged by the recipe's absolute minimum.
    ``eval_options``: add the quality stage (KL-divergence against the source model) with these
    options (an :class:`~ggufmtp.quality.options.EvalOptions`: ``corpus``, ``chunks``, ...).

    ``upload``: publish to this Hub repo (``private``: create it private; ``dry_run_upload``: list
    the operations, send nothing), only an artifact with a passing verification of its bytes,
    unless ``allow_unverified`` (the card then says so; it also accepts pulled files the Hub gave
    no checksum for); ``public_key`` (default ``$GGUFMTP_PUBLIC_KEY``) also requires valid
    signatures. ``signing_key`` (default ``$GGUFMTP_SIGNING_KEY``) signs the receipt and the
    artifact (``ARTIFACT.sig``).

    ``quantized_by`` and ``base_model`` (the upstream model's Hub repo; default: what the receipt
    names): the card's metadata (:class:`~ggufmtp.provenance.card_page.PageOptions`).

    ``force``: ignore cached stage results. ``reuse_failed``: reuse a recorded failing verdict of the
    same bytes and settings too (by default a rerun verifies a failed artifact again; a ladder's
    variants reuse it, so that a rerun, ``--upload`` added, measures nothing again). ``base_dir`` (default the output folder): where a
    pulled model and a converted checkpoint are kept, so that several runs (a ladder's variants)
    share one pull and one conversion. ``until="audit"``: stop after the audit (a ladder builds
    every variant so, then measures it with a second call).

    Raises GgufmtpError for an imatrix given twice or an unknown ``until``, HubRefusedError for an
    upload of an unverified artifact without ``allow_unverified``."""

    imatrix: str | Path | None = None
    imatrix_corpus: str | Path | None = None
    imatrix_chunks: int | None = None
    include: Sequence[str] | None = None
    token: str | None = None
    quantize_threads: int = 0
    split_max_size: SplitSize | None = DEFAULT_SPLIT_MAX_SIZE
    verify: bool = True
    verify_options: VerifyOptions | None = None
    reference_base: bool = True
    eval_options: EvalOptions | None = None
    upload: str | None = None
    private: bool = False
    dry_run_upload: bool = False
    allow_unverified: bool = False
    public_key: str | Path | None = None
    signing_key: str | Path | None = None
    quantized_by: str = "ggufmtp"
    base_model: str | None = None
    force: bool = False
    reuse_failed: bool = False
    base_dir: str | Path | None = None
    until: str | None = None

    def __post_init__(self) -> None:
        check_quantize_threads(self.quantize_threads)
        if self.imatrix and self.imatrix_corpus:
            raise GgufmtpError(f"give --imatrix {self.imatrix} or --imatrix-corpus {self.imatrix_corpus}, not both")
        # a missing imatrix or a bad eval corpus fails now, not at its stage after pull, inspect and quantize
        check_later_inputs(self.imatrix, [self.eval_options.corpus if self.eval_options else None])
        if self.base_model is not None:  # refused before any work, not when the card is written
            from .provenance.card_page import check_base_model

            check_base_model(self.base_model)
        if self.until not in (None, "audit"):
            raise GgufmtpError(f"until={self.until!r}: only 'audit' (or None: every stage)")
        if self.upload:  # refused now, not after the whole run
            from .hub.upload import check_repo_id

            check_repo_id(self.upload)
        if self.upload and not self.verify and not self.allow_unverified:
            raise HubRefusedError(f"--upload {self.upload} with --no-verify: only a verified artifact is published; "
                                  "verify it, or pass --allow-unverified (the card then says so)")
