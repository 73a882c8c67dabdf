"""ggufmtp receipt show/schema, audit and card."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .app import emit_json, handle_errors, json_option, main


@main.group()
def receipt() -> None:
    """Provenance receipts (in-toto Statement v1 with the ggufmtp predicate)."""


@receipt.command("show")
@click.argument("receipt_path", type=click.Path(dir_okay=False))
@json_option
@handle_errors
def receipt_show(receipt_path: str, as_json: bool) -> None:
    """Render a receipt for people (or print it as JSON)."""
    from ..provenance.receipt import format_receipt, load_receipt

    st = load_receipt(receipt_path)
    if as_json:
        emit_json(st)
    else:
        click.echo(format_receipt(st))


@receipt.command("schema")
def receipt_schema() -> None:
    """Print the receipt's JSON Schema."""
    from ..provenance.receipt import SCHEMA_PATH

    click.echo(SCHEMA_PATH.read_text(), nl=False)


@main.command()
@click.argument("artifact", type=click.Path(dir_okay=False))
@click.option("--receipt", "receipt_path", type=click.Path(dir_okay=False), default=None,
              help="Receipt to audit against (default: ARTIFACT.receipt.json if it exists).")
@json_option
@handle_errors
def audit(artifact: str, receipt_path: str | None, as_json: bool) -> None:
    """Recompute sha256s, re-read tensor types and check the MTP block against the receipt.

    Exits 1 on any mismatch, naming it."""
    from ..provenance.audit import audit as run, format_audit

    report = run(artifact, receipt_path, progress=not as_json)
    if as_json:
        emit_json(report.to_dict())
    else:
        click.echo(format_audit(report))
    if not report.ok:
        sys.exit(1)
@main.command()
@click.argument("artifact", type=click.Path(dir_okay=False))
@click.option("--receipt", "receipt_path", type=click.Path(dir_okay=False), default=None,
              help="The artifact's receipt (default: ARTIFACT.receipt.json).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Where to write the card (default: README.md beside the artifact).")
@click.option("--quantized-by", default="ggufmtp", show_default=True, help="The card's quantized_by field.")
@click.option("--license", "license_", default=None, help="License (default: inherited from the base model).")
@handle_errors
def card(artifact: str, receipt_path: str | None, output: str | None, quantized_by: str, license_: str | None) -> None:
    """Write a Hugging Face model card for ARTIFACT from its receipt (and its verification)."""
    from ..provenance.card import make_card
    from ..provenance.receipt import default_receipt_path

    path = make_card(artifact, receipt_path or default_receipt_path(Path(artifact)), output, quantized_by, license_)
    click.echo(str(path))
