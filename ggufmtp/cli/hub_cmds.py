"""ggufmtp pull and upload."""

from __future__ import annotations

import json
from pathlib import Path

import click

from .app import emit_json, handle_errors, json_option, main


def _receipt_statement(path: Path) -> dict | None:
    """The in-toto statement in a receipt file (plain JSON or a DSSE envelope), or None."""
    import base64

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if isinstance(data, dict) and isinstance(data.get("payload"), str) and "payloadType" in data:
        try:
            data = json.loads(base64.b64decode(data["payload"]))
        except ValueError:
            return None
    return data if isinstance(data, dict) else None


def _receipt_commit_facts(receipts: list[Path], artifacts: list[Path]) -> tuple[str | None, str | None]:
    """(recipe name, artifact sha256) for the commit message, read from the receipts when they have
    ``predicate.recipe.name`` and ``subject[i].digest.sha256``; (None, None) parts otherwise."""
    names = [a.name for a in artifacts]
    recipe, digests = None, []  # digests: (rank, sha256); lower rank = better match to the artifacts
    for r in receipts:
        stmt = _receipt_statement(r)
        if stmt is None:
            click.echo(f"note: {r} is not a JSON receipt; the commit message will not name its recipe", err=True)
            continue
        pred = stmt.get("predicate")
        rec = pred.get("recipe") if isinstance(pred, dict) else None
        if recipe is None and isinstance(rec, dict) and isinstance(rec.get("name"), str):
            recipe = rec["name"]
        subjects = stmt.get("subject")
        for s in subjects if isinstance(subjects, list) else []:
            dig = s.get("digest") if isinstance(s, dict) else None
            sha = dig.get("sha256") if isinstance(dig, dict) else None
            if not isinstance(sha, str):
                continue
            name = Path(str(s.get("name", ""))).name
            digests.append((names.index(name) if name in names else len(names), sha.lower()))
    digests.sort(key=lambda t: t[0])
    return recipe, (digests[0][1] if digests else None)


@main.command("pull")
@click.argument("repo_id")
@click.option("--revision", default=None, help="Branch, tag or commit to pull (default: the default branch). "
              "Resolved to a commit sha once; every file comes from that commit.")
@click.option("--include", "include", multiple=True, metavar="PATTERN",
              help="Only files matching this fnmatch pattern (repeatable), e.g. --include '*Q8_0*.gguf'. "
                   "A split GGUF's shards come together.")
@click.option("--local-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Put the files here (default: the Hugging Face cache).")
@json_option
@handle_errors
def pull_cmd(repo_id: str, revision: str | None, include: tuple[str, ...], local_dir: Path | None,
             as_json: bool) -> None:
    """Download a model repo (or index a local directory), verify every file's checksum, write a manifest.

    REPO_ID is namespace/name on the Hub, or a local directory. Tokens come from HF_TOKEN or
    `hf auth login`; HF_ENDPOINT selects another Hub; HF_HUB_OFFLINE=1 uses the cache only.
    """
    from ..hub import hub

    res = hub.pull(repo_id, revision=revision, include=list(include) or None, local_dir=local_dir)
    if as_json:
        emit_json({**res.to_dict(), "manifest_path": str(res.manifest_path),
                   "model_path": str(res.model_path) if res.model_path else None})
        return
    what = res.repo_id or str(res.local_dir)
    at = f" @ {res.resolved_commit}" if res.resolved_commit else ""
    asked = f" (revision {res.requested_revision})" if res.requested_revision else ""
    click.echo(f"{what}{at}{asked}: {len(res.files)} file(s), {hub._fmt_size(res.total_size)}, from {res.source}")
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
@click.option("--receipt", "receipts", multiple=True, required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Receipt of the artifact(s) (repeatable); uploaded next to them.")
@click.option("--card", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Model card, uploaded as README.md.")
@click.option("--private", is_flag=True, help="Create the repo private (no effect on an existing repo).")
@click.option("--revision", default=None, metavar="BRANCH", help="Branch to commit to (created if missing; "
              "default main).")
@click.option("--dry-run", is_flag=True, help="List what would be uploaded, touch no network.")
@json_option
@handle_errors
def upload_cmd(repo_id: str, artifacts: tuple[Path, ...], receipts: tuple[Path, ...], card: Path | None, private: bool,
           revision: str | None, dry_run: bool, as_json: bool) -> None:
    """Publish ARTIFACT(s) with their receipt(s) and model card to REPO_ID, in one commit.

    The commit message names the recipe and the artifact's sha256 (from the receipt).
    Tokens come from HF_TOKEN or `hf auth login`, never from the command line.
    """
    from ..hub import hub

    recipe, sha = _receipt_commit_facts(list(receipts), list(artifacts))
    res = hub.upload(repo_id, list(artifacts), list(receipts), card=card, private=private, revision=revision,
                     dry_run=dry_run, recipe_name=recipe, artifact_sha256=sha)
    if as_json:
        emit_json(res.to_dict())
        return
    head = "dry run, nothing sent: would commit" if res.dry_run else "committed"
    click.echo(f"{head} {len(res.operations)} file(s), {hub._fmt_size(res.total_size)}, to "
               f"{res.repo_id} @ {res.revision} on {res.endpoint_host}")
    for op in res.operations:
        digest = f"  sha256 {op.sha256}" if op.sha256 else ""
        click.echo(f"  {op.path_in_repo:<40} {hub._fmt_size(op.size):>10}  {op.kind}{digest}")
    click.echo(f"  message: {res.commit_message}")
    if res.commit_sha:
        click.echo(f"  commit: {res.commit_sha}  {res.commit_url or ''}".rstrip())
