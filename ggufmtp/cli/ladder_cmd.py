"""ggufmtp ladder: every variant of a model in one command, one comparison card."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..run_summary import verdict_text
from .app import emit_json, handle_errors, json_option, main
from .hub_cmds import allow_unverified_option, commit_max_size_option, passing_only_option, print_reviews
from .measure_common import (
    arm_args_options,
    offload_options,
    stage_verify_flags,
    stage_verify_options,
    verify_judging_options,
)
from .options import (
    model_at_revision,
    output_option,
    quantize_threads_option,
    revision_option,
    split_max_size_option,
    token_option,
)
from .provenance_cmds import base_model_option, public_key_option, signing_key_option

if TYPE_CHECKING:
    from ..ladder.spec import LadderSpec


def _spec(ladder_file: str | None, given: dict[str, Any], vopts: Mapping[str, object], eval_corpus: str | None
          ) -> LadderSpec:
    """The ladder's spec: the ladder file's settings, overridden by what the command line gives
    (``given``: :class:`LadderSpec` fields; ``vopts``: verify options, as flat keys)."""
    from ..errors import LadderError
    from ..ladder.spec import LadderSpec, load_ladder_file
    from ..measure.core.options import VerifyOptions
    from ..provenance.signing import resolve_signing_key
    from ..quality.options import EvalOptions

    fields: dict[str, Any] = dict(load_ladder_file(ladder_file)) if ladder_file else {}
    fields.update({k: v for k, v in given.items() if v not in (None, ())})
    if not fields.get("model"):
        raise LadderError("no model: give -m MODEL or model = \"...\" in the ladder file")
    fields.setdefault("recipes", ())  # none at all: LadderSpec.check says so
    if vopts:
        fields["verify_options"] = VerifyOptions.from_dict({**fields.get("verify_options", VerifyOptions()).to_dict(),
                                                            **vopts})
    ev = fields.pop("eval_options", None)
    if eval_corpus:
        ev = dataclasses.replace(ev or EvalOptions(), corpus=eval_corpus)
    for k in ("gpu_layers", "threads"):  # -ngl and -t are the servers' and llama-perplexity's
        if ev is not None and getattr(ev, k) is None and vopts.get(k) is not None:
            ev = dataclasses.replace(ev, **{k: vopts[k]})
    key = resolve_signing_key(fields.pop("signing_key", None))
    return LadderSpec(**fields, eval_options=ev, signing_key=key).check()


@main.command("ladder", short_help="Every variant of a model (one per recipe) with one comparison card.")
@click.option("--model", "-m", default=None, help="REPO_ID[@REVISION], a local GGUF or safetensors folder, builtin:NAME.")
@revision_option("Of a Hub --model (the same as REPO_ID@REVISION).")
@token_option()
@click.option("--recipe", "-r", "recipes", multiple=True, help="A recipe name or TOML file (repeatable: one variant each).")
@click.option("--ladder", "ladder_file", default=None, type=click.Path(dir_okay=False),
              help="A ladder file (TOML: model, recipes, imatrix, [verify], [eval]); options given here override it.")
@output_option("the output folder: DIR/<TAG>/ per variant (the recipe's release tag), DIR/README.md the ladder's "
               "card.", directory=True, default="ggufmtp-ladder", extra=("--out-dir",))
@click.option("--imatrix", type=click.Path(dir_okay=False), default=None, help="An imatrix for every variant.")
@click.option("--imatrix-corpus", default=None,
              help="Instead of --imatrix: compute one, once, over this text (with the MTP head's statistics).")
@click.option("--imatrix-chunks", type=click.IntRange(min=1), default=None, help="With --imatrix-corpus: at most N chunks.")
@click.option("--eval", "eval_corpus", is_flag=False, flag_value="builtin:calib-v1", default=None,
              help="KL-divergence of every variant against the base model on this corpus (default builtin:calib-v1).")
@click.option("--no-verify", is_flag=True, help="Skip runtime verification.")
@stage_verify_flags
@quantize_threads_option("Per variant; default: the ladder file's threads, else 0.", default=None)
@split_max_size_option("Per variant (with --layout sidecar: per trunk; the sidecar stays one file); default: the "
                       "ladder file's split_max_size, else 48G.", from_file=True)
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Run the variants on a local Dask cluster of N worker processes (pip install 'ggufmtp[ladder]').")
@click.option("--gpus", type=click.IntRange(min=0), default=0, show_default=True,
              help="With --workers: GPUs on this host; worker i measures on GPU i mod N, one at a time each.")
@click.option("--scheduler", default=None, metavar="ADDRESS",
              help="Run the variants on this Dask cluster's scheduler (e.g. tcp://host:8786, a dask-jobqueue cluster).")
@click.option("--upload", "upload_repo", default=None,
              help="Publish every variant, its receipt and the card in one commit (several above --commit-max-size), "
                   "through the publish gate: each "
                   "variant's reason when it refuses one, and then nothing is sent (see --passing-only).")
@passing_only_option
@commit_max_size_option
@click.option("--private", is_flag=True, help="Create the Hub repo private.")
@click.option("--dry-run-upload", is_flag=True, help="List the upload's operations without sending anything.")
@click.option("--upload-revision", default=None, metavar="BRANCH",
              help="With --upload: the branch to commit to (created if missing; default main), as upload's --revision "
                   "(--revision is the source model's). llama-server -hf serves main.")
@click.option("--create-pr", is_flag=True, help="With --upload: open a pull request with the commit instead.")
@click.option("--commit-message", default=None, metavar="TEXT",
              help="With --upload: the commit's message (default: what goes up, e.g. 'ggufmtp ladder: 4 MTP GGUF variants').")
@click.option("--path-in-repo", default=None, metavar="FOLDER",
              help="With --upload: the repo folder the variants go into (default the top; the card is README.md, "
              "its links and download lines name the folder); refused before any work when the folder makes "
              "a variant's Hub label load another file (Q8_0-old), or -hf would serve a variant with another "
              "draft than it is verified with (an mtp- sidecar already in the repo at or above the folder).")
@click.option("--quantized-by", default=None,
              help="The cards' quantized_by, the ladder's and each variant's (default: the ladder file's "
                   "quantized_by, else ggufmtp).")
@base_model_option
@click.option("--layout", type=click.Choice(["full", "sidecar"]), default=None,
              help="full (default): every variant with its MTP head; sidecar: trunk-only variants and MTP sidecars "
                   "(DIR/mtp-<Model>-<TYPE>.gguf), each pair verified (-m TRUNK -md SIDECAR).")
@click.option("--sidecar-type", "sidecars", multiple=True, metavar="TYPE",
              help="With --layout sidecar: a sidecar at this recipe's or llama-quantize type's types (repeatable; "
                   "default: the ladder file's sidecars, else Q8_0).")
@verify_judging_options
@arm_args_options
@offload_options
@signing_key_option
@public_key_option
@allow_unverified_option
@json_option
@handle_errors
def ladder_cmd(model: str | None, revision: str | None, token: str | None, recipes: tuple[str, ...],
               ladder_file: str | None, output: str,
               imatrix: str | None, imatrix_corpus: str | None, imatrix_chunks: int | None, eval_corpus: str | None,
               no_verify: bool, seeds: str | None, limit: int | None, max_tokens: int | None,
               gpu_layers: int | str | None, threads: int | None, ctx_size: int | None, quantize_threads: int | None,
               split_max_size: str | None, workers: int | None,
               gpus: int, scheduler: str | None,
               upload_repo: str | None, passing_only: bool, commit_max_bytes: int | None, private: bool,
               dry_run_upload: bool, upload_revision: str | None,
               create_pr: bool, commit_message: str | None, path_in_repo: str | None, quantized_by: str | None,
               base_model: str | None, layout: str | None, sidecars: tuple[str, ...],
               signing_key: str | None, public_key: str | None, allow_unverified: bool, as_json: bool, **judging: Any) -> None:
    """Make every variant of a model, one per recipe: the shared stages once (the model pulled or
    converted, the imatrix with the MTP head, the base model's logits), then per variant quantize,
    audit, verify, receipt and (with --eval) KLD, each in DIR/<TAG>/ as <Model>-<TAG>.gguf (TAG: the
    recipe's release tag; the names llama.cpp's -hf REPO:TAG resolves) and resumable; then
    DIR/README.md, the model's page from the variants' audited receipts: which file by size and GPU
    memory, PPL, KLD, acceptance and speedup, each variant's findings in words, the download and run
    lines of every variant (naming the --upload repo), the chat template, the imatrix credited, the
    provenance, base_model the upstream model (--base-model) as quantized. With --layout sidecar
    each variant is published trunk-only, with MTP sidecars made once from the source beside them
    (DIR/mtp-<Model>-<TYPE>.gguf), each pair verified. Exit 1 when a
    variant failed or a verdict is not pass (fail, or inconclusive: the head undecided, with the
    prompts that would decide it). Each verdict judges the quantization: the head against the source
    model (or --reference: preserved, degraded or inconclusive), lossless output, speed."""
    from ..hub.upload import UploadOptions
    from ..ladder.engine import DaskEngine
    from ..ladder.publish import publish_ladder
    from ..ladder.run import run_ladder

    vopts = stage_verify_options(seeds, limit, max_tokens, gpu_layers, threads, ctx_size, judging)
    if revision and not model:
        raise click.UsageError("--revision goes with -m MODEL (a ladder file's model names its own: REPO@REVISION)")
    spec = _spec(ladder_file, {"model": model and model_at_revision(model, revision), "recipes": recipes,
                               "out_dir": Path(output), "imatrix": imatrix, "token": token,
                               "imatrix_corpus": imatrix_corpus, "imatrix_chunks": imatrix_chunks,
                               "threads": quantize_threads, "split_max_size": split_max_size,
                               "verify": False if no_verify else None, "signing_key": signing_key,
                               "reference_base": False if judging.get("no_reference") else None,
                               "quantized_by": quantized_by, "base_model": base_model, "repo_id": upload_repo, "layout": layout,
                               "path_in_repo": path_in_repo if upload_repo else None,
                               "sidecars": sidecars}, vopts, eval_corpus)
    up = None
    if upload_repo:  # the repo id, folder, branch and message: refused now, not after every variant is made
        from ..hub.upload import check_repo_id

        check_repo_id(upload_repo)
        up = UploadOptions(private=private, revision=upload_revision, create_pr=create_pr, token=token,
                           dry_run=dry_run_upload, commit_message=commit_message, path_in_repo=path_in_repo,
                           allow_unverified=allow_unverified, public_key=public_key, commit_max_bytes=commit_max_bytes)
    if upload_repo and not dry_run_upload:  # the repo's final listing is checked before any work, too
        from ..hub.release import list_repo

        spec = dataclasses.replace(spec, repo_files=tuple(list_repo(upload_repo, upload_revision, token)))
    log = (lambda m: None) if as_json else (lambda m: click.echo(m, err=True))
    engine = DaskEngine(workers or 1, gpus, scheduler, on_start=log) if (workers or scheduler) else None
    res = run_ladder(spec, engine, progress=not as_json, log=log)
    out, refused = res.to_dict(), None
    if upload_repo and up is not None:
        published = publish_ladder(res, upload_repo, up, passing_only=passing_only, progress=not as_json)
        sent = published.to_dict()
        if not as_json:
            print_reviews(published)
        if published.upload is None:  # refused: each variant's reason above; nothing is sent
            refused = sent["error"] = f"not uploaded to {upload_repo}: {published.refusal()}"
        out["upload"] = sent
    if as_json:
        emit_json(out)
    else:
        click.echo(_format(res) + (f"\nuploaded: {out['upload'].get('commit_url')}"
                                   if upload_repo and refused is None else ""))
    if refused is not None:
        click.echo(f"error: {refused}", err=True)
    if not res.ok or refused is not None or any(o.summary.get("verdict") in ("fail", "inconclusive") for o in res.outcomes):
        sys.exit(1)


def _format(res: Any) -> str:
    lines = [f"ladder {res.spec.out_dir}  ({len(res.outcomes)} variants, {res.engine['engine']}, {res.seconds:.0f} s)"]
    for o in res.outcomes:
        s = o.summary
        lines.append(f"  {o.variant:<22} " + (f"{s.get('artifact')}  {verdict_text(s)}"
                                              if o.ok else f"FAILED        {o.error}"))
    lines += [f"  sidecar                {p}" for p in res.sidecars]
    lines += [f"  {u.text()}" for u in res.references()]
    lines.append(f"card: {res.card}" if res.card else "card: not written (no variant was made)")
    return "\n".join(lines)
