"""ggufmtp eval (KL-divergence against the base) and ggufmtp head-sweep (the MTP head's precision)."""

from __future__ import annotations

import click

from ..measure.core.options import DEFAULT_MAX_TOKENS, DEFAULT_SEEDS
from ..quality.options import MIN_CTX, EvalOptions
from .app import bin_option, emit_json, handle_errors, imatrix_option, json_option, main, recipe_option
from .measure_common import arm_args_options
from .options import ctx_size_option, draft_n_max_option, gpu_layers_option, output_option, quantize_threads_option, threads_option
from .provenance_cmds import signing_key_option

receipt_option = click.option("--receipt", "receipt_path", type=click.Path(dir_okay=False), default=None,
                              help="Store the result in this receipt (re-sealed; re-signed when signed).")


@main.command("eval")
@click.argument("base", metavar="BASE.gguf")
@click.argument("quant", metavar="QUANT.gguf")
@click.option("--corpus", default=EvalOptions.corpus, show_default=True,
              help="Evaluation text: a UTF-8 file or builtin:NAME.")
@ctx_size_option("llama-perplexity's: tokens per chunk, the second half of each scored.",
                 default=EvalOptions.ctx_size, min_ctx=MIN_CTX)
@click.option("--chunks", type=click.IntRange(min=1), default=None, help="Evaluate the first N chunks only.")
@gpu_layers_option("llama-perplexity's (e.g. 999).")
@threads_option("llama-perplexity's.")
@receipt_option
@signing_key_option
@bin_option
@json_option
@handle_errors
def eval_cmd(base: str, quant: str, corpus: str, ctx_size: int, chunks: int | None, gpu_layers: int | str | None,
             threads: int | None, receipt_path: str | None, signing_key: str | None, llama_cpp_bin: str | None,
             as_json: bool) -> None:
    """Perplexity and KL-divergence of QUANT against BASE (its BF16 model) with llama-perplexity.

    The base pass (--kl-divergence-base) runs once per base, corpus, context and chunk count and is
    cached in the ggufmtp cache (its size is said before writing; refused when the disk cannot hold
    it). Prints PPL(Q), PPL(base), ln ratio, mean KLD ± err, KLD percentiles, RMS Δp and Same top p.
    MODEL arguments may be builtin:NAME."""
    from ..quality.eval import evaluate, format_quality
    from .app import resolve_model_arg

    options = EvalOptions(corpus=corpus, ctx_size=ctx_size, chunks=chunks, gpu_layers=gpu_layers,
                          threads=threads, llama_cpp_bin=llama_cpp_bin)
    res = evaluate(resolve_model_arg(base), resolve_model_arg(quant), options, progress=not as_json,
                   log=lambda m: click.echo(m, err=True))
    if receipt_path:
        from ..quality.sections import store_quality

        store_quality(receipt_path, res, signing_key)
    if as_json:
        emit_json(res.to_dict())
    else:
        click.echo(format_quality(res))


@main.command("head-sweep", short_help="Quantize and verify MODEL once per MTP-head type; recommend the smallest.")
@click.argument("model", metavar="MODEL.gguf")
@recipe_option
@click.option("--types", default="Q8_0,Q6_K,Q5_K,Q4_K,IQ4_XS", show_default=True,
              help="MTP-block types to compare (BF16, the unquantized head, is always added).")
@imatrix_option
@output_option("the folder the variants are written to.", directory=True, default="head-sweep", extra=("--out-dir",))
@click.option("--write-recipe", "write_recipe", type=click.Path(dir_okay=False), default=None,
              help="Write the recommended head's recipe (TOML) here.")
@click.option("--seeds", default=",".join(map(str, DEFAULT_SEEDS)), show_default=True, help="Verification seeds (same for every variant).")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Verify on the first N prompts only.")
@click.option("--max-tokens", type=click.IntRange(min=2), default=None, help="Tokens per verification reply.")
@gpu_layers_option("The servers' (e.g. 999).")
@threads_option("llama-server's, every arm.")
@quantize_threads_option()
@draft_n_max_option("Of every variant's verification; default: the recipe's, else 4.")
@arm_args_options
@receipt_option
@signing_key_option
@json_option
@handle_errors
def head_sweep_cmd(model: str, recipe_name: str, types: str, imatrix: str | None, output: str,
                   write_recipe: str | None, seeds: str, limit: int | None, max_tokens: int | None,
                   gpu_layers: int | str | None, threads: int | None, quantize_threads: int,
                   receipt_path: str | None, signing_key: str | None,
                   as_json: bool, draft_n_max: int | None = None, server_args: tuple[str, ...] = (),
                   mtp_server_args: tuple[str, ...] = (), vanilla_server_args: tuple[str, ...] = ()) -> None:
    """Quantize MODEL once per MTP-head type (trunk byte-identical, checked), verify each with the
    same suite, seeds, window (--draft-n-max) and server settings (--server-arg), and recommend the smallest head whose acceptance CI
    overlaps the BF16 head's. IQ types need an imatrix covering the head (the plan refuses otherwise)."""
    from ..measure.core.options import ServerOptions, VerifyOptions
    from ..quality.head_sweep import format_sweep, head_sweep, write_recommended_recipe
    from .app import _int_list, _word_list, resolve_model_arg

    opts = VerifyOptions(seeds=tuple(_int_list(seeds, "--seeds") or ()), limit=limit, draft_n_max=draft_n_max,
                         max_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
                         server=ServerOptions(gpu_layers=gpu_layers, threads=threads, server_args=server_args,
                                              mtp_server_args=mtp_server_args, vanilla_server_args=vanilla_server_args))
    res = head_sweep(resolve_model_arg(model), recipe_name, _word_list(types, "--types"), output,
                     imatrix, quantize_threads, opts, progress=not as_json, log=lambda m: click.echo(m, err=True))
    if write_recipe:
        write_recommended_recipe(res, write_recipe)
    if receipt_path:
        from ..quality.sections import store_head_sweep

        store_head_sweep(receipt_path, res.to_dict(names=True), signing_key)
    if as_json:
        emit_json(res.to_dict())
    else:
        click.echo(format_sweep(res))
