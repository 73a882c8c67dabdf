"""ggufmtp recipe list/show/from-flags, plan and quantize."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from .app import emit_json, handle_errors, imatrix_option, json_option, main, recipe_option, resolve_model_arg
from .provenance_cmds import signing_key_option


@main.group()
def recipe() -> None:
    """Quantization recipes (ggufmtp/data/recipes/*.toml)."""


@recipe.command("list")
@json_option
@handle_errors
def recipe_list(as_json: bool) -> None:
    """List the shipped recipes."""
    from ..quant.recipe import Recipe, shipped_recipes

    recipes = [Recipe.load(n) for n in shipped_recipes()]
    if as_json:
        emit_json([r.to_dict() for r in recipes])
        return
    for r in recipes:
        click.echo(f"{r.name:<18} {r.ftype:<8} {r.description}")


@recipe.command("show")
@click.argument("recipe_name")
@json_option
@handle_errors
def recipe_show(recipe_name: str, as_json: bool) -> None:
    """Show a recipe (a shipped name or a .toml path) with its rules in the order they apply."""
    from ..quant.recipe import Recipe

    r = Recipe.load(recipe_name)
    if as_json:
        emit_json(r.to_dict())
        return
    from ..fmt import pct, times
    from ..provenance.verdict import Thresholds

    th = Thresholds.from_recipe(r.verify, r.name)
    click.echo(f"{r.name}: {r.description}\nftype {r.ftype}, imatrix {r.imatrix}, "
               f"MTP block {'required' if r.mtp_required else 'optional'}")
    for i, rule in enumerate(r.all_rules()):
        click.echo(f"  #{i} {rule.source:<20} {rule.pattern:<50} -> {rule.type}")
    click.echo(f"verify: acceptance >= {pct(th.min_acceptance)}, speedup >= {times(th.min_speedup)} (judged with GPU "
               f"offload), identical output >= {pct(th.min_identical)}, draft window k={r.verify.draft_n_max}"
               f"{'' if th.source == f'recipe {r.name}' else f' (thresholds from {th.source})'}")


@recipe.command("from-flags", context_settings={"ignore_unknown_options": True})
@click.argument("flags", nargs=-1, type=click.UNPROCESSED, required=True)
@click.option("--name", default="from-flags", show_default=True, help="Recipe name.")
@click.option("--mtp-block", "mtp_blocks", type=int, multiple=True,
              help="Turn blk.N. in patterns into the {mtp} placeholder (repeat for every MTP block: "
                   "blk.N. alone becomes {mtpI}, the I-th).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="Write the TOML here.")
@handle_errors
def recipe_from_flags(flags: tuple[str, ...], name: str, mtp_blocks: tuple[int, ...], output: str | None) -> None:
    """Make a recipe from llama-quantize flags, e.g.

    ggufmtp recipe from-flags -- --tensor-type 'blk\\.40\\.nextn\\.eh_proj=q8_0' in.gguf out.gguf Q4_K_M
    """
    from ..quant.recipe import Recipe

    text = Recipe.from_flags(list(flags), name=name, mtp_block=list(mtp_blocks) or None).to_toml()
    if output:
        from ..files.fsutil import atomic_write_text

        atomic_write_text(Path(output), text)
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(text, nl=False)
@main.command()
@click.argument("model")
@recipe_option
@imatrix_option
@click.option("--emit", type=click.Choice(["table", "llama-quantize"]), default="table", show_default=True,
              help="llama-quantize: print the exact equivalent llama-quantize command line instead.")
@click.option("--out", "out_name", default="OUT.gguf", show_default=True, help="Output name for --emit llama-quantize.")
@click.option("--all", "show_all", is_flag=True, help="Show every tensor (default: the first 40 and the MTP block).")
@json_option
@handle_errors
def plan(model: str, recipe_name: str, imatrix: str | None, emit: str, out_name: str, show_all: bool,
         as_json: bool) -> None:
    """Dry-run RECIPE on MODEL: per-tensor types as llama.cpp will choose them, with reasons.

    Exits 1 when a pre-flight check fails (listed as errors)."""
    from ..quant.plan import format_plan, make_plan

    p = make_plan(resolve_model_arg(model), recipe_name, imatrix)
    if as_json:
        emit_json(p.to_dict())
    elif emit == "llama-quantize":
        click.echo(p.llama_quantize_command(out_name))
    else:
        rows = None
        if not show_all and len(p.tensors) > 40:
            rows = [t for t in p.tensors if not t.mtp][:40] + [t for t in p.tensors if t.mtp]
        click.echo(format_plan(p, rows))
    if p.errors:
        sys.exit(1)


@main.command(short_help="Quantize MODEL with RECIPE (in-process libllama), audit it and write its receipt.")
@click.argument("model")
@recipe_option
@imatrix_option
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Output GGUF.")
@click.option("--threads", "-t", type=int, default=0, help="Quantization threads (0: all cores).")
@click.option("--receipt", type=click.Path(dir_okay=False), default=None,
              help="Receipt path (default: OUTPUT.receipt.json).")
@click.option("--no-receipt", is_flag=True, help="Do not write a receipt.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@signing_key_option
@json_option
@handle_errors
def quantize(model: str, recipe_name: str, imatrix: str | None, output: str, threads: int, receipt: str | None,
             no_receipt: bool, no_progress: bool, signing_key: str | None, as_json: bool) -> None:
    """Quantize MODEL with RECIPE into OUTPUT (in-process libllama), audit it, write its receipt
    (with a signing key: a signed receipt and OUTPUT.sig)."""
    from ..provenance.receipt import default_receipt_path, receipt_for_quantize
    from ..provenance.signing import resolve_signing_key, sign_artifact, signature_path
    from ..quant.quantize import quantize as run

    key = resolve_signing_key(signing_key)  # a bad key fails before any work

    rpath = None if no_receipt else Path(receipt) if receipt else default_receipt_path(Path(output))
    if rpath is not None and rpath.resolve() == Path(output).resolve():
        from ..errors import QuantizeError

        raise QuantizeError(f"{receipt}: the receipt path is the output path (--receipt would overwrite it)")

    def write_receipt(staged) -> None:
        # the artifact is renamed into place only after its receipt (and signature) are written
        if key is not None:
            sign_artifact(staged.output, key, signature=signature_path(Path(output)))
        if rpath is not None:
            receipt_for_quantize(staged, model_arg=model, imatrix=imatrix, receipt_path=rpath, signing_key=key)

    res = run(resolve_model_arg(model), recipe_name, output, imatrix=imatrix, threads=threads,
              progress=not no_progress and not as_json,
              before_publish=write_receipt if rpath or key else None)
    out: dict[str, Any] = res.to_dict()
    if rpath is not None:
        out["receipt"] = str(rpath)
    if key is not None:
        out["signature"] = str(signature_path(Path(output)))
    if as_json:
        emit_json(out)
        return
    for w in res.plan.warnings:
        click.echo(f"warning: {w}", err=True)
    for c in res.checks:
        click.echo(f"{'PASS' if c.ok else 'FAIL'}  {c.name}: {c.detail}")
    click.echo(res.summary())
    if "receipt" in out:
        click.echo(f"receipt {out['receipt']}" + (" (signed)" if key else ""))
    if "signature" in out:
        click.echo(f"signature {out['signature']}")
