"""ggufmtp convert (safetensors -> GGUF keeping the MTP block), and the --source audit and --check-mtp
helpers the audit and pull commands call."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .app import emit_json, handle_errors, json_option, main
from .options import output_option, refuse_empty_model, revision_option, token_option


@main.command("convert")
@click.argument("source")
@output_option("the GGUF to write (e.g. model-bf16.gguf); written only once it checks out.", required=True)
@click.option("--outtype", type=click.Choice(["bf16", "f16", "q8_0"]), default="bf16", show_default=True,
              help="Type of the converted weights (the converter's --outtype).")
@revision_option("Of a Hub SOURCE (pinned to a commit).")
@token_option()
@json_option
@handle_errors
def convert_cmd(source: str, output: str, outtype: str, revision: str | None, token: str | None, as_json: bool) -> None:
    """Convert a safetensors checkpoint to GGUF with the pinned llama.cpp converter, keeping the MTP block.

    SOURCE is a local Hugging Face checkpoint directory or a Hub repo id (its safetensors headers
    are checked for mtp.* tensors first, then it is pulled pinned and checksummed). The result is
    checked (MTP status complete, block count and nextn layers as the source implies) before it is
    renamed into place; OUTPUT.source.json records the checkpoint's files and sha256s."""
    from ..hfconvert.convert import convert

    res = convert(refuse_empty_model(source, "SOURCE"), Path(output), outtype=outtype, revision=revision, progress=not as_json, token=token)
    if as_json:
        emit_json(res.to_dict())
        return
    click.echo(f"wrote {res.output} ({res.architecture}, {res.outtype}): block_count {res.block_count}, "
               f"nextn_predict_layers {res.nextn_predict_layers}, MTP {res.mtp_status}")
    inferred = "" if res.mtp_layers_in_config else " (config omits mtp_num_hidden_layers: inferred)"
    click.echo(f"  from {res.repo_id or res.source_dir}{' @ ' + res.commit if res.commit else ''}: "
               f"{len(res.source_files)} files{inferred}")
    click.echo(f"  source record: {res.output}.source.json; {res.seconds.get('total', 0):.1f} s")


def audit_against_source(artifact: str, source: str, all_tensors: bool, as_json: bool) -> None:
    """``audit ARTIFACT --source SRC``: compare with the safetensors, exit 1 on any mismatch. An
    audit never writes: ``ggufmtp receipt add-source`` records a passing comparison."""
    from ..hfconvert.audit import audit_source

    res = audit_source(artifact, source, all_tensors=all_tensors, progress=not as_json)
    if as_json:
        emit_json(res.to_dict())
    else:
        click.echo(res.summary())
    if not res.ok:
        sys.exit(1)


def check_mtp(repo_id: str, revision: str | None, as_json: bool, token: str | None = None) -> None:
    """``pull REPO --check-mtp``: the MTP head from the safetensors headers, nothing downloaded."""
    from ..hfconvert.remote import check_remote_mtp

    res = check_remote_mtp(repo_id, revision=revision, token=token)
    if as_json:
        emit_json(res.to_dict())
    else:
        click.echo(res.summary())
