"""ggufmtp run: the whole pipeline."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click

from .app import emit_json, handle_errors, imatrix_option, json_option, main, recipe_option
from .hub_cmds import allow_unverified_option
from .measure_common import (
    arm_args_options,
    offload_options,
    stage_verify_flags,
    stage_verify_options,
    verify_judging_options,
)
from .options import (
    include_option,
    model_at_revision,
    output_option,
    quantize_threads_option,
    revision_option,
    split_max_size_option,
    token_option,
)
from .provenance_cmds import base_model_option, public_key_option, signing_key_option

if TYPE_CHECKING:
    from ..quant.split import SplitSize


@main.command("run", short_help="The whole pipeline: checkpoint to a verified, receipted (and uploaded) artifact.")
@recipe_option
@click.option("--model", "-m", required=True, help="REPO_ID[@REVISION], a local GGUF, or builtin:NAME.")
@revision_option("Of a Hub --model (the same as REPO_ID@REVISION).")
@token_option()
@imatrix_option
@click.option("--imatrix-corpus", default=None,
              help="Instead of --imatrix: compute one over this text (a file or builtin:calib-v1), with the MTP "
                   "block's statistics when the model has one; cached by content.")
@click.option("--imatrix-chunks", type=click.IntRange(min=1), default=None,
              help="With --imatrix-corpus: at most N chunks of 512 tokens (default: the whole corpus).")
@output_option("the output folder; also holds the per-stage cache that makes reruns resume.", directory=True,
               default="ggufmtp-out", extra=("--out-dir",))
@include_option("Of a Hub --model.")
@click.option("--no-verify", is_flag=True, help="Skip runtime verification with llama-server.")
@click.option("--eval", "eval_corpus", is_flag=False, flag_value="builtin:calib-v1", default=None,
              help="Add the quality stage: KL-divergence against the source model (llama-perplexity) on this "
                   "corpus (default builtin:calib-v1), stored in the receipt and shown in the card.")
@click.option("--upload", "upload_repo", default=None, help="Publish artifact, receipt and card to this Hub repo.")
@click.option("--private", is_flag=True, help="Create the Hub repo private.")
@click.option("--dry-run-upload", is_flag=True, help="List the upload's operations without sending anything.")
@stage_verify_flags
@quantize_threads_option()
@split_max_size_option()
@click.option("--quantized-by", default="ggufmtp", show_default=True, help="The card's quantized_by field.")
@base_model_option
@click.option("--force", is_flag=True, help="Ignore cached stage results and rerun everything.")
@verify_judging_options
@arm_args_options
@offload_options
@signing_key_option
@public_key_option
@allow_unverified_option
@json_option
@handle_errors
def run_cmd(recipe_name: str, model: str, revision: str | None, token: str | None, imatrix: str | None,
            imatrix_corpus: str | None, imatrix_chunks: int | None, output: str, include: tuple[str, ...],
            no_verify: bool, upload_repo: str | None, private: bool, dry_run_upload: bool, seeds: str | None,
            limit: int | None, max_tokens: int | None, gpu_layers: int | str | None, threads: int | None,
            ctx_size: int | None, quantize_threads: int, split_max_size: SplitSize | None, quantized_by: str,
            base_model: str | None, force: bool, eval_corpus: str | None,
            signing_key: str | None, public_key: str | None, allow_unverified: bool, as_json: bool,
            **judging: Any) -> None:
    """Checkpoint to verified, receipted artifact: pull, inspect, plan, quantize, audit, verify,
    receipt, card, upload. Reruns resume from the first stage whose inputs changed or that failed.

    --upload publishes only an artifact whose verification passed (else it stops before any
    request, exit 1); --allow-unverified publishes anyway, with the card saying so, and also
    accepts pulled files the Hub gave no checksum for.

    The verdict judges the quantization: the head against the source model (served as verify's
    reference arm with the same settings; --reference another model, --no-reference for the
    recipe's absolute minimum instead: preserved, degraded, or inconclusive with the prompts that
    would decide it), lossless output, and speed where it is verified. Exit 1 unless it passes."""
    from ..measure.core.options import VerifyOptions
    from ..pipeline import run
    from ..quality.options import EvalOptions
    from ..run_options import RunOptions

    vopts = stage_verify_options(seeds, limit, max_tokens, gpu_layers, threads, ctx_size, judging)
    options = RunOptions(
        imatrix=imatrix, imatrix_corpus=imatrix_corpus, imatrix_chunks=imatrix_chunks, include=list(include) or None,
        token=token, quantize_threads=quantize_threads, split_max_size=split_max_size, verify=not no_verify,
        verify_options=VerifyOptions.from_dict(vopts),
        reference_base=not judging.get("no_reference"),
        eval_options=None if eval_corpus is None else EvalOptions(corpus=eval_corpus, gpu_layers=gpu_layers,
                                                                  threads=threads),
        upload=upload_repo, private=private, dry_run_upload=dry_run_upload, allow_unverified=allow_unverified,
        public_key=public_key, signing_key=signing_key, force=force, quantized_by=quantized_by, base_model=base_model)
    res = run(model_at_revision(model, revision), recipe_name, options, out_dir=output, progress=not as_json,
              log=lambda m: click.echo(m, err=True))
    summary = res.summary_record()
    if as_json:
        emit_json(summary.to_dict())
    else:
        click.echo(summary.format())
    if summary.verdict in ("fail", "inconclusive"):
        sys.exit(1)
