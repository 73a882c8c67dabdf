"""ggufmtp pull and upload."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..fmt import decimal_bytes
from .app import emit_json, handle_errors, json_option, main
from .options import exclude_option, include_option, revision_option, token_option, with_revision
from .provenance_cmds import public_key_option

if TYPE_CHECKING:
    from ..hub.upload import UploadOptions
    from ..ladder.publish import LadderUpload

allow_unverified_option = click.option(
    "--allow-unverified", is_flag=True,
    help="Publish even without a publishable verification of the artifact (the card then says so); an "
         "artifact that fails `ggufmtp audit` is never published.")


class CommitSizeParam(click.ParamType):
    """``--commit-max-size``: decimal bytes (``50G``, ``500M``, ``2000K``), or ``none`` for one commit."""

    name = "size"
    _UNITS = {"K": 10**3, "M": 10**6, "G": 10**9}

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int | None:
        text = str(value).strip().upper()
        if text == "NONE":
            return None
        if text[-1:] in self._UNITS and text[:-1].isdigit() and int(text[:-1]) > 0:
            return int(text[:-1]) * self._UNITS[text[-1]]
        self.fail(f"{value!r}: give a whole number of decimal kilo-, mega- or gigabytes (e.g. 50G, 500M), or none "
                  "for one commit", param, ctx)


commit_max_size_option = click.option(
    "--commit-max-size", "commit_max_bytes", type=CommitSizeParam(), default="50G", show_default=True,
    help="A release larger than this goes up in several commits (its model files whole, each with its shards and "
         "receipt; sidecars first, the card last; '(part N)' on the later ones), each on the last; a rerun "
         "resumes. none: one commit.")

passing_only_option = click.option(
    "--passing-only", is_flag=True,
    help="A ladder: publish the variants the publish gate passes and leave out the refused ones (each named "
         "with its reason; the card then shows the published ones). Default: all or nothing.")


def print_reviews(published: LadderUpload) -> None:
    """Each variant's line before the publish gate (``Q8_0: ok``, ``IQ2_XXS: refused — <reason>``)."""
    for review in published.reviews:
        click.echo(f"  {review.line()}", err=not review.ok)


@main.command("pull")
@click.argument("repo_id")
@revision_option("To pull (default: the default branch; REPO_ID@REVISION says the same). Resolved to a commit "
                 "sha once; every file comes from that commit.")
@include_option("E.g. --include '*Q8_0*.gguf'; a split GGUF's shards come together.")
@exclude_option("E.g. --exclude '*.safetensors'; applied after --include.")
@token_option()
@click.option("--local-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Put the files here (default: the Hugging Face cache).")
@click.option("--check-mtp", is_flag=True,
              help="Download nothing: read the safetensors headers and config.json over HTTP and say whether the "
                   "checkpoint has MTP tensors, how many layers, their names and dtypes.")
@json_option
@handle_errors
def pull_cmd(repo_id: str, revision: str | None, include: tuple[str, ...], exclude: tuple[str, ...],
             token: str | None, local_dir: Path | None, check_mtp: bool, as_json: bool) -> None:
    """Download a model repo (or index a local directory), verify every file's checksum, write a manifest.

    REPO_ID is namespace/name[@REVISION] on the Hub, or a local directory. Tokens come from --token,
    HF_TOKEN or `hf auth login`; HF_ENDPOINT selects another Hub; HF_HUB_OFFLINE=1 uses the cache only.
    """
    repo_id, revision = with_revision(repo_id, revision)
    if check_mtp:
        from .convert_cmds import check_mtp as run_check

        return run_check(repo_id, revision, as_json, token)
    from ..hub.pull import pull

    res = pull(repo_id, revision=revision, include=list(include) or None, exclude=list(exclude) or None,
               local_dir=local_dir, token=token)
    if as_json:
        emit_json({**res.to_dict(), "manifest_path": str(res.manifest_path),
                   "model_path": str(res.model_path) if res.model_path else None})
        return
    what = res.repo_id or str(res.local_dir)
    at = f" @ {res.resolved_commit}" if res.resolved_commit else ""
    asked = f" (revision {res.requested_revision})" if res.requested_revision else ""
    click.echo(f"{what}{at}{asked}: {len(res.files)} file(s), {decimal_bytes(res.total_size)}, from {res.source}")
    unverified = [f.path for f in res.files if not f.verified]
    if not unverified:
        click.echo("  all files match the Hub's checksums")
    else:
        click.echo(f"  {len(unverified)} file(s) have no Hub checksum to compare with (sha256 recorded): "
                   + ", ".join(unverified[:5]) + (" ..." if len(unverified) > 5 else ""))
    for m in res.gguf_models:
        shards = f" ({len(m.shards)} shards)" if len(m.shards) > 1 else ""
        click.echo(f"  model: {res.local_dir / m.entry}{shards}")
    if len(res.gguf_models) > 1:
        click.echo("  several GGUF models: pick one with --include", err=True)
    click.echo(f"  manifest: {res.manifest_path}")


@main.command("upload")
@click.argument("repo_id")
@click.argument("artifacts", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--receipt", "receipts", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Receipt of the artifact(s) (repeatable; required with artifacts); uploaded next to them.")
@click.option("--card", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Model card, uploaded as README.md.")
@click.option("--private", is_flag=True, help="Create the repo private (no effect on an existing repo).")
@revision_option("The branch to commit to (created if missing; default main); with --create-pr, the existing "
                 "branch the pull request targets.")
@token_option()
@click.option("--commit-message", default=None, metavar="TEXT",
              help="The commit's summary (default: names the artifact, its recipe and sha256).")
@click.option("--create-pr", is_flag=True, help="Open a pull request with the commit instead of committing to the branch.")
@click.option("--path-in-repo", default=None, metavar="FOLDER",
              help="Folder of the repo for the artifacts, their signatures and receipts (default the top); "
              "the card stays the repo's README.md.")
@click.option("--dry-run", is_flag=True, help="Run every check and list what would be uploaded; touch no network.")
@commit_max_size_option
@passing_only_option
@public_key_option
@allow_unverified_option
@json_option
@handle_errors
def upload_cmd(repo_id: str, artifacts: tuple[Path, ...], receipts: tuple[Path, ...], card: Path | None, private: bool,
               revision: str | None, token: str | None, commit_message: str | None, create_pr: bool,
               path_in_repo: str | None, dry_run: bool, commit_max_bytes: int | None, passing_only: bool,
               public_key: str | None, allow_unverified: bool, as_json: bool) -> None:
    """Publish ARTIFACT(s) with their receipt(s) and model card to REPO_ID, in one commit.

    Every artifact must pass `ggufmtp audit ARTIFACT --receipt R` (with the public key, when one is
    set: valid signatures; ARTIFACT.sig is uploaded alongside) and have a publishable verification
    bound to its bytes (else --allow-unverified, and the card must say so). The bytes sent are the
    bytes gated. The commit message names the recipe and the artifact's
    sha256 (from the receipt) unless --commit-message gives one. As `hf upload`: --revision commits to
    a branch (created when missing), --create-pr opens a pull request instead (against --revision,
    default main), --path-in-repo puts the files in a folder of the repo. A release larger than
    --commit-max-size goes up in several commits (as huggingface_hub's multi-commit upload, over
    git-LFS with the gated digests; a rerun resumes). The token comes from
    --token, HF_TOKEN or `hf auth login` (HF_TOKEN keeps it off the command line).

    `ggufmtp upload LADDER_DIR REPO_ID` publishes a ladder's folder (`ggufmtp ladder -o LADDER_DIR`)
    as `ladder --upload` sends it: each variant before the gate, printed as
    `Q8_0: ok` or `IQ2_XXS: refused — <reason>` (a failing verdict, too little evidence, an audit
    failure, a variant the ladder did not make); all or nothing (exit 1, nothing sent, when one is
    refused) unless --passing-only; nothing is measured again. Its card is the ladder's README.md.
    """
    from ..hub.upload import UploadOptions, receipt_commit_facts, upload

    if repo_id and Path(repo_id).is_dir():  # `upload LADDER_DIR REPO_ID`
        if len(artifacts) != 1 or receipts or card:
            raise click.UsageError("a ladder's folder goes up as `ggufmtp upload LADDER_DIR REPO_ID` (its receipts "
                                   "and card are the ladder's: no --receipt or --card)")
        options = UploadOptions(private=private, revision=revision, dry_run=dry_run, allow_unverified=allow_unverified,
                                public_key=public_key, commit_message=commit_message, create_pr=create_pr,
                                path_in_repo=path_in_repo, token=token, commit_max_bytes=commit_max_bytes)
        return _upload_ladder(Path(repo_id), str(artifacts[0]), options, passing_only, as_json)
    if not receipts:
        raise click.UsageError("Missing option '--receipt': every artifact goes up with its receipt")
    if passing_only:
        raise click.UsageError("--passing-only goes with a ladder's folder (`ggufmtp upload LADDER_DIR REPO_ID`): "
                               "the artifacts given here go up together or not at all")

    # Facts for the commit message only; the upload itself refuses receipts it cannot parse.
    facts = receipt_commit_facts(receipts, artifacts)
    options = UploadOptions(private=private, revision=revision, dry_run=dry_run, recipe_name=facts.recipe_name,
                            artifact_sha256=facts.artifact_sha256, allow_unverified=allow_unverified,
                            public_key=public_key, commit_message=commit_message, create_pr=create_pr,
                            path_in_repo=path_in_repo, token=token, commit_max_bytes=commit_max_bytes)
    res = upload(repo_id, list(artifacts), list(receipts), card, options)
    for note in res.notes:
        click.echo(f"note: {note}", err=True)
    if as_json:
        emit_json(res.to_dict())
        return
    head = ("dry run, nothing sent: would " + ("open a pull request of" if create_pr else "commit") if res.dry_run
            else "opened a pull request of" if create_pr else "committed")
    click.echo(f"{head} {len(res.operations)} file(s), {decimal_bytes(res.total_size)}, to "
               f"{res.repo_id} @ {res.revision} on {res.endpoint_host}")
    for op in res.operations:
        digest = f"  sha256 {op.sha256}" if op.sha256 else ""
        click.echo(f"  {op.path_in_repo:<40} {decimal_bytes(op.size):>10}  {op.kind}{digest}")
    for check in res.checks.unverified if res.checks else []:
        click.echo(f"  NOT VERIFIED {check.artifact.name}: {check.problem} (published with --allow-unverified)")
    click.echo(f"  message: {res.commit_message}")
    if len(res.parts) > 1:
        click.echo(f"  in {len(res.parts)} commits: " + "; ".join(f"part {i + 1}: {len(p)} file(s)"
                                                          + (f" {res.commits[i]}" if i < len(res.commits) else "")
                                                          for i, p in enumerate(res.parts)))
    if res.commit_sha:
        click.echo(f"  commit: {res.commit_sha}  {res.commit_url or ''}".rstrip())
    if res.pr_url:
        click.echo(f"  pull request: {res.pr_url}")


def _upload_ladder(ladder_dir: Path, repo_id: str, options: UploadOptions, passing_only: bool, as_json: bool) -> None:
    """``ggufmtp upload LADDER_DIR REPO_ID``: the ladder's record read, every variant before the gate."""
    import sys

    from ..ladder.publish import publish_ladder
    from ..ladder.run import load_ladder

    published = publish_ladder(load_ladder(ladder_dir), repo_id, options, passing_only=passing_only,
                               progress=not as_json)
    refusal = published.refusal()
    if as_json:
        emit_json({**published.to_dict(), "error": str(refusal) if refusal else None})
    else:
        click.echo(f"ladder {ladder_dir} -> {repo_id}")
        print_reviews(published)
        if published.upload is not None:
            up = published.upload
            click.echo(("dry run, nothing sent: would commit" if up.dry_run else "committed")
                       + f" {len(up.operations)} file(s), {decimal_bytes(up.total_size)}"
                       + (f": {up.commit_sha}  {up.commit_url or ''}".rstrip() if up.commit_sha else ""))
    if refusal is not None:
        click.echo(f"error: nothing uploaded: {refusal}", err=True)
        sys.exit(1)
