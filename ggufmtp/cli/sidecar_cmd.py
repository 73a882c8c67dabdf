"""ggufmtp sidecar: an MTP-only GGUF (and optionally the trunk without the head) from a full model."""

from __future__ import annotations

from pathlib import Path

import click

from .app import emit_json, handle_errors, imatrix_option, json_option, main, resolve_model_arg
from .options import output_option, quantize_threads_option
from .provenance_cmds import signing_key_option


@main.command(short_help="Write MODEL's MTP head as an MTP-only GGUF for llama-server -md (and the trunk), "
                         "with receipts.")
@click.argument("model")
@output_option("the sidecar (default: mtp-MODEL-TYPE.gguf in the current folder, quant/naming.py's sidecar name; "
               "TYPE: the recipe's tag, else MODEL's file type).")
@click.option("--recipe", "-r", "recipe_name", default=None,
              help="Quantize MODEL with this recipe (or llama-quantize type, e.g. Q8_0) first, so the head has the "
                   "recipe's types; default: MODEL's tensors as they are (a quantized variant, or the BF16 source).")
@click.option("--type", "type_name", default=None, help="Same as -r TYPE (a llama-quantize type, e.g. Q8_0).")
@imatrix_option
@quantize_threads_option("With -r.", hidden=("-t", "--threads"))
@click.option("--trunk-only", "trunk_out", default=None, type=click.Path(dir_okay=False),
              help="Also write the trunk without the MTP block here (a variant's name, e.g. MODEL-Q8_0.gguf).")
@click.option("--no-receipt", is_flag=True, help="Write no receipts.")
@signing_key_option
@json_option
@handle_errors
def sidecar(model: str, output: str | None, recipe_name: str | None, type_name: str | None, imatrix: str | None,
            quantize_threads: int, trunk_out: str | None, no_receipt: bool, as_json: bool, signing_key: str | None = None
            ) -> None:
    """Write MODEL's MTP head as an MTP-only sidecar GGUF, as `convert_hf_to_gguf.py --mtp` lays it out
    (every key/value, token_embd, output_norm, output and the MTP block), to serve beside a trunk with
    `llama-server -m TRUNK -md SIDECAR --spec-type draft-mtp`. With --trunk-only the trunk is
    written too, without the MTP block (as the converter's --no-mtp).
    Tensors are copied as they are; with -r the model is quantized first (in-process libllama, the
    project's quantize path), so the head has exactly the full variant's types. Each file gets a
    receipt (FILE.receipt.json) binding it to the other and to the source;
    `ggufmtp audit TRUNK --sidecar SIDECAR` checks a pairing and
    `ggufmtp verify TRUNK --sidecar SIDECAR` measures it. MODEL may be builtin:NAME."""
    from ..errors import RecipeError
    from ..gguf.model import GGUFModel
    from ..quant.recipe import Recipe
    from ..quant.sidecar import SidecarOptions, make_sidecar, sidecar_default_name

    if recipe_name and type_name and recipe_name != type_name:
        raise RecipeError(f"the type is given twice (-r {recipe_name} and --type {type_name}); give one")
    recipe = recipe_name or type_name
    from ..provenance.signing import resolve_signing_key

    if signing_key and no_receipt:
        raise click.UsageError("--signing-key signs the receipts and the files: it cannot go with --no-receipt")
    key = None if no_receipt else resolve_signing_key(signing_key)  # a bad key fails before any work
    path = Path(resolve_model_arg(model))
    if output is None:
        tag = Recipe.load(recipe).release_tag if recipe else (GGUFModel(path).file_type or "F16")
        output = sidecar_default_name(model, path, tag)
    from ..provenance.pair import pair_receipt_writer

    res = make_sidecar(path, output, SidecarOptions(recipe=recipe, imatrix=imatrix, threads=quantize_threads,
                                                    trunk_out=Path(trunk_out) if trunk_out else None,
                                                    progress=not as_json),
                       model_arg=model, before_publish=None if no_receipt else pair_receipt_writer(key))
    if as_json:
        emit_json(res.to_dict())
    else:
        click.echo(res.summary())
