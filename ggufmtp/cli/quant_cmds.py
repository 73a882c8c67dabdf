"""ggufmtp recipe list/show/from-flags, plan and quantize."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from .app import emit_json, handle_errors, imatrix_option, json_option, main, recipe_option, resolve_model_arg
from .options import SharedOption, output_option, quantize_threads_option, refuse_empty_model, split_max_size_option
from .provenance_cmds import signing_key_option

if TYPE_CHECKING:
    from ..quant.flags import QuantizeFlags
    from ..quant.plan import Plan
    from ..quant.recipe import Recipe
    from ..quant.split import SplitSize


def llama_quantize_flag_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """llama-quantize's per-tensor flags, with its names and meaning (:mod:`ggufmtp.quant.flags`)."""
    for opt in reversed([
        click.option("--tensor-type", "tensor_types", multiple=True, metavar="PATTERN=TYPE",
                     help="As llama-quantize: tensors whose name matches PATTERN (regex, unanchored; the first "
                          "match wins) get TYPE. Repeatable; ahead of the recipe's rules."),
        click.option("--output-tensor-type", metavar="TYPE", default=None, help="As llama-quantize: output.weight's type."),
        click.option("--token-embedding-type", metavar="TYPE", default=None,
                     help="As llama-quantize: token_embd.weight's type."),
        click.option("--pure", is_flag=True, help="As llama-quantize: no k-quant mix; the type's default type "
                                                  "wherever no rule applies."),
        click.option("--leave-output-tensor", is_flag=True, help="As llama-quantize: leave output.weight unquantized."),
        click.option("--allow-requantize", is_flag=True,
                     help="As llama-quantize: allow requantizing tensors that are already quantized."),
        click.option("--tensor-type-file", type=click.Path(dir_okay=False), default=None,
                     help="As llama-quantize: --tensor-type items (PATTERN=TYPE) from this file, separated by "
                          "spaces or newlines; after the --tensor-type ones."),
        click.option("--override-kv", "kv_overrides", multiple=True, metavar="KEY=TYPE:VALUE",
                     help="As llama-quantize: set this metadata key in the output (TYPE int, float, bool or str; "
                          "repeatable)."),
        click.option("--include-weights", "include_weights", multiple=True, metavar="NAME",
                     help="As llama-quantize: use only the imatrix entries whose name contains NAME (repeatable)."),
        click.option("--exclude-weights", "exclude_weights", multiple=True, metavar="NAME",
                     help="As llama-quantize: leave out the imatrix entries whose name contains NAME (repeatable; "
                          "not with --include-weights)."),
    ]):
        fn = opt(fn)
    return fn


def quantize_flags(tensor_types: tuple[str, ...], output_tensor_type: str | None, token_embedding_type: str | None,
                   pure: bool, leave_output_tensor: bool, allow_requantize: bool, tensor_type_file: str | None,
                   kv_overrides: tuple[str, ...], include_weights: tuple[str, ...],
                   exclude_weights: tuple[str, ...]) -> QuantizeFlags:
    """The values of :func:`llama_quantize_flag_options`, read (RecipeError naming a malformed one)."""
    from ..quant.flags import QuantizeFlags

    return QuantizeFlags.build(tensor_types, output_tensor_type, token_embedding_type, pure=pure,
                               leave_output_tensor=leave_output_tensor, allow_requantize=allow_requantize,
                               kv_overrides=kv_overrides, include_weights=include_weights,
                               exclude_weights=exclude_weights, tensor_type_file=tensor_type_file)


@main.group()
def recipe() -> None:
    """Quantization recipes (the shipped ones: recipes/*.toml; or your own TOML file)."""


@recipe.command("list")
@json_option
@handle_errors
def recipe_list(as_json: bool) -> None:
    """List the shipped recipes (and the llama-quantize types, which are recipes too)."""
    from ..quant.recipe import Recipe, shipped_recipes

    recipes = [Recipe.load(n) for n in shipped_recipes()]
    if as_json:
        emit_json([r.to_dict() for r in recipes])
        return
    for r in recipes:
        click.echo(f"{r.name:<18} {r.ftype:<8} {r.description}")
    from ..quant.qtypes import valid_quant_types

    click.echo(f"\nAny llama-quantize type is a recipe too: -r Q4_K_M is that type with ggufmtp's head defaults "
               f"(MTP block required, nextn.eh_proj Q8_0, the rest at least Q4_K), -r Q4_K_M-plain llama-quantize's "
               f"own. Types: {', '.join(valid_quant_types())}")


@recipe.command("show")
@click.argument("recipe_name")
@json_option
@handle_errors
def recipe_show(recipe_name: str, as_json: bool) -> None:
    """Show a recipe (a shipped name, a .toml path or a llama-quantize type) with its rules in the order they apply."""
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
    if r.mtp_floor:
        click.echo(f"  then every other MTP tensor planned below {r.mtp_floor} is raised to {r.mtp_floor} (mtp.floor)")
    switches = [k for k in ("pure", "leave_output_tensor", "allow_requantize") if getattr(r, k)]
    if switches:
        click.echo(f"llama-quantize switches: {', '.join(switches)}")
    click.echo(f"verify: acceptance >= {pct(th.min_acceptance)}, speedup >= {times(th.min_speedup)} (judged with GPU "
               f"offload), identical output >= {pct(th.min_identical)}, draft window k={r.verify.draft_n_max}"
               f"{'' if th.source == f'recipe {r.name}' else f' (thresholds from {th.source})'}")


@recipe.command("from-flags", context_settings={"ignore_unknown_options": True})
@click.argument("flags", nargs=-1, type=click.UNPROCESSED, required=True)
@click.option("--name", default="from-flags", show_default=True, help="Recipe name.")
@click.option("--mtp-block", "mtp_blocks", type=click.IntRange(min=0), multiple=True,
              help="Turn blk.N. in patterns into the {mtp} placeholder (repeat for every MTP block: "
                   "blk.N. alone becomes {mtpI}, the I-th). Default: the MTP blocks of the line's input "
                   "model, read from it when it is here.")
@output_option("the recipe TOML to write (default: standard output).")
@handle_errors
def recipe_from_flags(flags: tuple[str, ...], name: str, mtp_blocks: tuple[int, ...], output: str | None) -> None:
    """Make a recipe from a llama-quantize command line, e.g.

    ggufmtp recipe from-flags -- --tensor-type 'blk\\.40\\.nextn\\.eh_proj=q8_0' in.gguf out.gguf Q4_K_M

    The MTP blocks come from the line's input model when it is here (else --mtp-block): their
    indices in patterns become {mtp} and the recipe requires the block ([mtp] required = true);
    with neither, patterns stay as written and the block is optional. --tensor-type-file,
    --override-kv and --include-weights/--exclude-weights mean what they mean to quantize;
    --dry-run, --keep-split, --prune-layers and --max-buffer-size are refused with the reason."""
    from ..quant.flags import LlamaQuantizeLine, mtp_blocks_of, recipe_from_flags

    blocks: list[int] | None = list(mtp_blocks) or None
    if blocks is None:
        pos = LlamaQuantizeLine.parse(list(flags)).positional
        found = mtp_blocks_of(pos[0]) if len(pos) > 1 else None
        if found is None:
            click.echo("note: no input model here to read the MTP block from; patterns kept as written, "
                       "[mtp] required = false (--mtp-block N sets it)", err=True)
        blocks = found or None
    text = recipe_from_flags(list(flags), name=name, mtp_block=blocks).to_toml()
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
@click.option("--emit-output", "--out", "out_name", cls=SharedOption, hidden=("--out",), default="OUT.gguf",
              show_default=True, help="With --emit llama-quantize: the OUT of the printed command line.")
@click.option("--all", "show_all", is_flag=True, help="Show every tensor (default: the first 40 and the MTP block).")
@llama_quantize_flag_options
@json_option
@handle_errors
def plan(model: str, recipe_name: str, imatrix: str | None, emit: str, out_name: str, show_all: bool,
         as_json: bool, **flag_values: Any) -> None:
    """Dry-run RECIPE on MODEL: per-tensor types as llama.cpp will choose them, with reasons.

    RECIPE may be a llama-quantize type (-r Q4_K_M: with ggufmtp's head defaults; Q4_K_M-plain:
    llama-quantize's own); llama-quantize's flags apply as in `quantize`.
    Exits 1 when a pre-flight check fails (listed as errors)."""
    from ..quant.plan import make_plan
    from ..quant.recipe import Recipe

    rec = Recipe.load(recipe_name).with_flags(quantize_flags(**flag_values))
    _show_plan(make_plan(resolve_model_arg(model), rec, imatrix), as_json, emit, out_name, show_all)


def _show_plan(p: Plan, as_json: bool, emit: str = "table", out_name: str = "OUT.gguf", show_all: bool = False) -> None:
    """Print a plan as ``plan`` does (``quantize --dry-run`` too); exit 1 when a pre-flight check failed."""
    from ..quant.plan import format_plan

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


@main.command(short_help="Quantize MODEL with a recipe or a llama-quantize type (in-process libllama), audit it "
                         "and write its receipt.")
@click.argument("model")
@click.argument("positional", nargs=-1, metavar="[OUT] [TYPE] [NTHREADS]")
@click.option("--recipe", "-r", "recipe_name", default=None,
              help="Shipped recipe name (see `ggufmtp recipe list`), a .toml file, or a llama-quantize type "
                   "(Q4_K_M, IQ4_XS, ...): with ggufmtp's head defaults.")
@imatrix_option
@output_option("the GGUF to write (or the positional OUT).")
@quantize_threads_option("Or the positional NTHREADS; default 0.", hidden=("-t", "--threads"), default=None)
@split_max_size_option("One receipt covers every shard (and is named for the first).")
@click.option("--receipt", type=click.Path(dir_okay=False), default=None,
              help="Receipt path (default: OUT.receipt.json; for a split OUT, its first shard's).")
@click.option("--no-receipt", is_flag=True, help="Do not write a receipt.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option("--dry-run", is_flag=True,
              help="As llama-quantize: write nothing; print the plan (`ggufmtp plan`): every tensor's type and "
                   "the size. Exit 1 when a pre-flight check fails.")
@llama_quantize_flag_options
@signing_key_option
@json_option
@handle_errors
def quantize(model: str, positional: tuple[str, ...], recipe_name: str | None, imatrix: str | None,
             output: str | None, quantize_threads: int | None, split_max_size: SplitSize | None, receipt: str | None,
             no_receipt: bool, no_progress: bool, dry_run: bool, signing_key: str | None, as_json: bool,
             **flag_values: Any) -> None:
    """Quantize MODEL into OUT (in-process libllama), audit it and write its receipt (with a signing
    key: a signed receipt and OUT.sig). What to make, two ways:

    \b
    -r RECIPE  a shipped recipe, a .toml file or any llama-quantize type (-r Q4_K_M,
               -r IQ4_XS): ggufmtp's head defaults apply (the MTP block required and
               kept, nextn.eh_proj at Q8_0, the rest of the block at least Q4_K; a
               recipe's own [mtp] table) and the recipe's [verify] thresholds.
    IN OUT TYPE [NTHREADS]
               llama-quantize's own command line: llama-quantize's bytes (its
               per-tensor types, no head defaults, the MTP block optional), plus the
               audit and the receipt.

    llama-quantize's flags (--tensor-type, --tensor-type-file, --output-tensor-type,
    --token-embedding-type, --pure, --leave-output-tensor, --allow-requantize, --imatrix,
    --include-weights, --exclude-weights, --override-kv, --dry-run) mean what they mean there, with
    either form; with -r they override the recipe's rules. --keep-split, --prune-layers and
    --max-buffer-size are refused (docs/reference/flags.md says why). For example:

    \b
    ggufmtp quantize in.gguf -r Q4_K_M -o out.gguf
    ggufmtp quantize --tensor-type 'attn_v=q6_k' --pure in.gguf out.gguf Q4_K_M 8

    An OUT larger than --split-max-size (default 48G, under the Hub's 50 GB file limit) is written
    as shards by llama-gguf-split: OUT less .gguf, then -00001-of-0000N.gguf; give llama-server,
    verify, audit and upload the first.
    """
    from .._api import quantize as run

    refuse_empty_model(model)  # the API reads MODEL itself: "" would be the current folder
    rec, output, threads = _quantize_inputs(model, positional, recipe_name, output, quantize_threads,
                                            quantize_flags(**flag_values), dry_run=dry_run)
    if dry_run:  # llama-quantize --dry-run: the types and the size, nothing written (its OUT is optional)
        from ..quant.plan import make_plan

        _show_plan(make_plan(resolve_model_arg(model), rec, imatrix, threads=threads), as_json)
        return
    # the command is the API's function: the same receipt, signatures and atomic publish
    res = run(model, rec, output, imatrix, quantize_threads=threads, split_max_size=split_max_size, receipt=receipt,
              no_receipt=no_receipt, signing_key=signing_key, progress=not no_progress and not as_json)
    if as_json:
        emit_json(res.to_dict())
        return
    for w in res.plan.warnings:
        click.echo(f"warning: {w}", err=True)
    for c in res.checks:
        click.echo(f"{'PASS' if c.ok else 'FAIL'}  {c.name}: {c.detail}")
    click.echo(res.summary())
    if res.receipt is not None:
        click.echo(f"receipt {res.receipt}" + (" (signed)" if res.signature is not None else ""))
    if res.signature is not None:
        click.echo(f"signature {res.signature}")


def _quantize_inputs(model: str, positional: tuple[str, ...], recipe_name: str | None, output: str | None,
                     threads: int | None, flags: QuantizeFlags, *, dry_run: bool = False) -> tuple[Recipe, str, int]:
    """The recipe (with the flags applied), output and thread count of a ``quantize`` line: ``-r``
    or llama-quantize's ``IN [OUT] TYPE [NTHREADS]``, each said once."""
    from ..errors import RecipeError
    from ..quant.flags import Positional
    from ..quant.recipe import Recipe

    pos = Positional.parse([model, *positional])
    if recipe_name and pos.type:
        raise RecipeError(f"the type is given twice (-r {recipe_name} and {pos.type}): -r applies ggufmtp's head "
                          f"defaults, the positional TYPE is llama-quantize's own; give one")
    if not recipe_name and not pos.type:
        raise RecipeError("nothing to make: give -r RECIPE (or -r TYPE), or llama-quantize's IN OUT TYPE")
    if output and pos.out and output != pos.out:
        raise RecipeError(f"two outputs: -o {output} and {pos.out}; give one")
    out = output or pos.out
    if out is None and pos.type:  # llama-quantize IN TYPE: ggml-model-<TYPE>.gguf beside the input
        out = str((Path(model).parent if Path(model).exists() else Path(".")) / f"ggml-model-{pos.type}.gguf")
    if out is None and not dry_run:
        raise RecipeError("no output: give -o OUT (or the positional OUT)")
    if pos.threads is not None and pos.threads < 0:  # llama-quantize reads -1 as 0, every core: say 0
        raise click.BadParameter(f"{pos.threads} is not in the range x>=0 (as --quantize-threads; 0: every core).",
                                 param_hint="NTHREADS")
    if threads is not None and pos.threads is not None and threads != pos.threads:
        raise RecipeError(f"two thread counts: --quantize-threads {threads} and {pos.threads}; give one")
    rec = Recipe.load(recipe_name) if recipe_name else Recipe.for_type(pos.type or "", head_defaults=False)
    return rec.with_flags(flags), out or "", threads if threads is not None else pos.threads or 0
