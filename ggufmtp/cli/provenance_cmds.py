"""ggufmtp receipt show/schema/sign, audit and card."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .app import emit_json, handle_errors, json_option, main
from .options import output_option

signing_key_option = click.option(
    "--signing-key", "signing_key", type=click.Path(), default=None,
    help="EC private key (PEM) to sign with: the receipt as a DSSE envelope, the artifact with OpenSSF "
         "model-signing (ARTIFACT.sig). Default: $GGUFMTP_SIGNING_KEY; neither: unsigned.")
public_key_option = click.option(
    "--public-key", "public_key", type=click.Path(), default=None,
    help="EC public key (PEM) that must have signed the receipt and the artifact. Default: $GGUFMTP_PUBLIC_KEY.")
base_model_option = click.option(
    "--base-model", "base_model", default=None, metavar="OWNER/NAME",
    help="The upstream model's Hub repo (owner/name): the card's base_model, with base_model_relation: quantized "
         "(default: the checkpoint converted, else what the pulled repo's card names, else the repo pulled).")


@main.group()
def receipt() -> None:
    """Provenance receipts (in-toto Statement v1 with the ggufmtp predicate)."""


@receipt.command("show")
@click.argument("receipt_path", type=click.Path(dir_okay=False))
@json_option
@handle_errors
def receipt_show(receipt_path: str, as_json: bool) -> None:
    """Render a receipt for people (or print it as JSON)."""
    from ..provenance.receipt import read_receipt
    from ..provenance.show import format_receipt

    rf = read_receipt(receipt_path)
    if as_json:
        emit_json(rf.statement)
    else:
        click.echo(format_receipt(rf.statement, signed=rf.signed))


@receipt.command("sign")
@click.argument("receipt_path", type=click.Path())
@signing_key_option
@click.option("--artifact", type=click.Path(), default=None,
              help="The artifact the receipt describes (default: its subject's name beside the receipt).")
@handle_errors
def receipt_sign(receipt_path: str, signing_key: str | None, artifact: str | None) -> None:
    """Sign an existing receipt (DSSE envelope) and its artifact (model-signing, ARTIFACT.sig).

    Only a receipt its own audit passes is signed (`ggufmtp audit ARTIFACT --receipt RECEIPT`: its
    checksum, the artifact's sha256, the verdict its figures give, ...). A key file others can
    read is used with a warning."""
    from ..errors import AuditError
    from ..provenance.audit import sign_receipt
    from ..provenance.signing import ENV_SIGNING_KEY, resolve_signing_key

    key = resolve_signing_key(signing_key)
    if key is None:
        raise AuditError(f"no signing key: give --signing-key KEY.pem or set ${ENV_SIGNING_KEY}")
    for sig in sign_receipt(receipt_path, key, artifact):
        click.echo(f"wrote {sig}")
    click.echo(f"signed {receipt_path} (DSSE envelope)")


@receipt.command("add-source")
@click.argument("artifact", type=click.Path(dir_okay=False))
@click.option("--source", "source", required=True, metavar="DIR",
              help="The safetensors checkpoint directory ARTIFACT was converted from.")
@click.option("--receipt", "receipt_path", type=click.Path(dir_okay=False), default=None,
              help="The artifact's receipt (default: ARTIFACT.receipt.json).")
@click.option("--all", "all_tensors", is_flag=True, help="Compare every tensor, not only the MTP block.")
@signing_key_option
@json_option
@handle_errors
def receipt_add_source(artifact: str, source: str, receipt_path: str | None, all_tensors: bool,
                       signing_key: str | None, as_json: bool) -> None:
    """Compare ARTIFACT with its source checkpoint (as `audit --source` does) and record the passing
    comparison in its receipt's source section, bound to the artifact's sha256.

    Refused when the comparison finds a mismatch or the receipt describes other bytes; a signed
    receipt is re-signed (--signing-key or $GGUFMTP_SIGNING_KEY)."""
    from ..hfconvert.audit import audit_source, record_source_audit
    from ..provenance.receipt import default_receipt_path
    from ..provenance.signing import resolve_signing_key

    receipt = Path(receipt_path) if receipt_path else default_receipt_path(Path(artifact))
    key = resolve_signing_key(signing_key)
    res = audit_source(artifact, source, all_tensors=all_tensors, progress=not as_json)
    section = record_source_audit(res, receipt, key)
    if as_json:
        emit_json({**res.to_dict(), "receipt": str(receipt), "artifact_sha256": section["artifact_sha256"]})
    else:
        click.echo(res.summary())
        click.echo(f"  source section written to {receipt} (bound to sha256 {section['artifact_sha256']})")


@receipt.command("schema")
def receipt_schema() -> None:
    """Print the receipt's JSON Schema."""
    from ..files.records import SCHEMA_PATH

    click.echo(SCHEMA_PATH.read_text(), nl=False)


@main.command(short_help="Check an artifact against its receipt: bytes, tensors, MTP block, verdict, signatures.")
@click.argument("artifact", type=click.Path(dir_okay=False))
@click.option("--receipt", "receipt_path", type=click.Path(), default=None,
              help="Receipt to audit against (default: ARTIFACT.receipt.json if it exists).")
@public_key_option
@click.option("--signature", type=click.Path(), default=None,
              help="The artifact's model-signing signature (default: ARTIFACT.sig), checked with --public-key.")
@click.option("--source", "source", default=None, metavar="DIR",
              help="Instead: compare the MTP block with the safetensors checkpoint DIR it was converted from "
                   "(the pinned converter's name map and transforms). Writes nothing: `ggufmtp receipt "
                   "add-source` records a passing comparison in the receipt.")
@click.option("--all", "all_tensors", is_flag=True, help="With --source: every tensor, not only the MTP block.")
@click.option("--sidecar", "sidecar", type=click.Path(dir_okay=False), default=None,
              help="An MTP-only sidecar to serve with ARTIFACT as its trunk (llama-server -md): check that it "
                   "fits ARTIFACT and that its receipt binds it to ARTIFACT or ARTIFACT's source.")
@json_option
@handle_errors
def audit(artifact: str, receipt_path: str | None, public_key: str | None, signature: str | None,
          source: str | None, all_tensors: bool, as_json: bool, sidecar: str | None = None) -> None:
    """Check the signatures (with a public key), then recompute sha256s, re-read tensor types, the
    MTP block and the imatrix metadata, and check the verification is of these bytes.

    Without a public key an unsigned receipt is reported as "unsigned: checksum only, detects
    accidental edits, not forgery". Exits 1 on any mismatch, naming it. Never writes."""
    if source is not None:
        from .convert_cmds import audit_against_source

        return audit_against_source(artifact, source, all_tensors, as_json)
    from ..provenance.audit import audit as run
    from ..provenance.audit import format_audit
    from ..provenance.signing import resolve_public_key

    key = resolve_public_key(public_key)
    if signature is not None and key is None:  # nothing would check it, and the verdict said "unsigned" PASS
        raise click.UsageError(f"--signature {signature}: a signature is checked with a public key: give "
                               "--public-key (or $GGUFMTP_PUBLIC_KEY)")
    report = run(artifact, receipt_path, progress=not as_json, public_key=key, signature=signature, sidecar=sidecar)
    if as_json:
        emit_json(report.to_dict())
    else:
        click.echo(format_audit(report))
    if not report.ok:
        sys.exit(1)


@main.command(short_help="Write the Hugging Face model card of ARTIFACT from its audited receipt.")
@click.argument("artifact", type=click.Path(dir_okay=False))
@click.option("--receipt", "receipt_path", type=click.Path(dir_okay=False), default=None,
              help="The artifact's receipt (default: ARTIFACT.receipt.json).")
@output_option("the card to write (default: README.md beside the artifact).")
@click.option("--quantized-by", default="ggufmtp", show_default=True, help="The card's quantized_by field.")
@click.option("--license", "license_", default=None, help="License (default: inherited from the base model).")
@click.option("--repo", "repo_id", default=None, metavar="OWNER/REPO",
              help="The Hub repo the card's hf download and llama-server -hf lines name (default: OWNER/REPO).")
@click.option("--path-in-repo", default=None, metavar="FOLDER",
              help="The repo folder the files go to (upload --path-in-repo): the card's links and --include lines "
                   "name it.")
@base_model_option
@handle_errors
def card(artifact: str, receipt_path: str | None, output: str | None, quantized_by: str, license_: str | None,
         repo_id: str | None, path_in_repo: str | None, base_model: str | None) -> None:
    """Write a Hugging Face model card for ARTIFACT from its receipt (and its verification): the
    model's page (title, the file's size and GPU memory, download and run lines with the draft the
    -hf tag loads (its own head, or its MTP sidecar), the chat template,
    the imatrix credited; base_model the upstream model as quantized), then the evidence, stating
    only what audit judges."""
    from ..hub.upload import check_folder, check_repo_id
    from ..provenance.card import make_card
    from ..provenance.receipt import default_receipt_path

    if repo_id is not None:  # upload's readings: a card naming a repo or folder upload would refuse is no card
        check_repo_id(repo_id)
    check_folder(path_in_repo)
    path = make_card(artifact, receipt_path or default_receipt_path(Path(artifact)), output, quantized_by=quantized_by,
                     license=license_, repo_id=repo_id, path_in_repo=path_in_repo, base_model=base_model)
    click.echo(str(path))
