"""ggufmtp tune, curve and profiles (``verify --tune``, an alias of tune, is declared in verify_cmds)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import click

from ..measure.core.options import DEFAULT_MAX_TOKENS
from .app import (
    _float_list,
    _int_list,
    _word_list,
    bin_option,
    emit_json,
    handle_errors,
    json_option,
    main,
    recipe_option,
    resolve_model_arg,
)
from .measure_common import _run_tune, _save_and_show, arm_args_options, check_receipt, server_options
from .options import FiniteFloatRange, draft_n_max_option, gpu_layers_option, output_option, threads_option


@main.command("tune")
@click.argument("model")
@click.option("--concurrency", "-C", type=click.IntRange(min=1), default=1, show_default=True,
              help="Concurrent clients to tune for (slots are searched for > 1).")
@click.option("--budget", type=click.IntRange(min=1), default=240, show_default=True,
              help="Evaluations (MTP requests, each paired with a vanilla request) the search may spend "
                   "(the numerics analysis of differing replies is not counted).")
@click.option("--seeds", default="42", show_default=True, help="Comma-separated request seeds.")
@click.option("--suite", default="chat-v1", show_default=True, help="Prompt suite: a shipped name or a JSONL file.")
@click.option("--max-tokens", type=click.IntRange(min=2), default=DEFAULT_MAX_TOKENS, show_default=True, help="Tokens per reply.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Use only the first N prompts.")
@gpu_layers_option("Every server's (e.g. 999); enables the backend-sampling dimensions.")
@threads_option("llama-server's, every arm.")
@click.option("--ctx-per-slot", type=click.IntRange(min=256), default=4096, show_default=True,
              help="Context per slot (-c = slots x this).")
@click.option("--final-on-suite/--no-final-on-suite", default=True, show_default=True,
              help="Rank the finalists on the whole suite (when the budget allows), not on its first prompts.")
@click.option("--receipt", "receipt_path", type=click.Path(dir_okay=False), default=None,
              help="Store the result as verification.tuned in this receipt (verify's results are kept).")
@output_option("the full results as JSON.", hidden=("--out",))
@arm_args_options
@bin_option
@json_option
@handle_errors
def tune_cmd(model: str, concurrency: int, budget: int, seeds: str, suite: str, max_tokens: int, limit: int | None,
             gpu_layers: int | str | None, threads: int | None, ctx_per_slot: int, final_on_suite: bool,
             receipt_path: str | None, output: str | None, llama_cpp_bin: str | None, as_json: bool,
             server_args: tuple[str, ...] = (), mtp_server_args: tuple[str, ...] = (),
             vanilla_server_args: tuple[str, ...] = ()) -> None:
    """Search MTP server settings for MODEL on this hardware (successive halving).

    Searches --spec-draft-n-max 1-8, --spec-draft-n-min, --spec-draft-p-min, backend sampling of the
    target (-bs) and drafter (GPU only), GGML_CUDA_GRAPH_OPT=1 (CUDA only) and --parallel slots
    (concurrency > 1); keeps only settings whose output equals vanilla's, or differs only where
    verify's numerics analysis explains it (a near-tie within the batching drift), ranks them by speedup with
    95% CIs, recommends one and prints the exact llama-server command line. Each configuration is
    compared with a vanilla server given its non-speculative settings (fair baseline). MODEL may be
    builtin:NAME."""
    from ..measure.tune.options import SearchOptions, TuneOptions

    options = TuneOptions(concurrency=concurrency, budget=budget, seeds=_int_list(seeds, "--seeds") or (), suite=suite,
                          max_tokens=max_tokens, limit=limit, ctx_per_slot=ctx_per_slot,
                          search=SearchOptions(final_on_suite=final_on_suite),
                          server=server_options(gpu_layers, threads, llama_cpp_bin, server_args, mtp_server_args,
                                                vanilla_server_args))
    _run_tune(model, options, receipt_path, output, as_json)


@main.command("curve", short_help="Speedup against acceptance on this hardware, for a head of any acceptance.")
@click.argument("model")
@click.option("--rates", default="0,0.25,0.5,0.75,0.9,1", show_default=True,
              help="Synthetic acceptances (accepted/drafted at --draft-n-max), one point each.")
@click.option("--synth-len", "synth_len", default=None,
              help="Instead of --rates: --spec-synth-len values (mean accepted length incl. the target token).")
@click.option("--flag", type=click.Choice(["synth-len", "synth-rates"]), default="synth-len", show_default=True,
              help="Pass each point as --spec-synth-len or as explicit geometric --spec-synth-rates.")
@draft_n_max_option(default=3)
@click.option("--seeds", default="42,1337", show_default=True, help="Comma-separated request seeds.")
@click.option("--suite", default="chat-v1", show_default=True, help="Prompt suite.")
@click.option("--limit", type=click.IntRange(min=1), default=8, show_default=True, help="Prompts per point.")
@click.option("--max-tokens", type=click.IntRange(min=2), default=DEFAULT_MAX_TOKENS, show_default=True, help="Tokens per reply.")
@click.option("--no-real", is_flag=True, help="Skip the point of the real MTP head.")
@gpu_layers_option("Every server's (e.g. 999).")
@threads_option("llama-server's, every arm.")
@click.option("--receipt", "receipt_path", type=click.Path(dir_okay=False), default=None,
              help="Store the curve as verification.acceptance_curve in this receipt.")
@output_option("the curve as JSON.", hidden=("--out",))
@arm_args_options
@bin_option
@json_option
@handle_errors
def curve_cmd(model: str, rates: str, synth_len: str | None, flag: str, draft_n_max: int, seeds: str, suite: str,
              limit: int, max_tokens: int, no_real: bool, gpu_layers: int | str | None, threads: int | None,
              receipt_path: str | None, output: str | None, llama_cpp_bin: str | None, as_json: bool,
              server_args: tuple[str, ...] = (), mtp_server_args: tuple[str, ...] = (),
              vanilla_server_args: tuple[str, ...] = ()) -> None:
    """Speedup versus acceptance on this hardware, with llama-server's synthetic acceptance
    (--spec-synth-len / --spec-synth-rates; benchmarking only): what a head of any acceptance would gain
    here, separated from the head's quality. MODEL needs an MTP block (its drafter's cost is measured)."""
    from ..measure.profiles.curve import CurveOptions, acceptance_curve

    options = CurveOptions(rates=_float_list(rates, "--rates") or (), draft_n_max=draft_n_max,
                           synth_len=_float_list(synth_len, "--synth-len"), flag=flag,
                           seeds=_int_list(seeds, "--seeds") or (), suite=suite, limit=limit, max_tokens=max_tokens,
                           include_real=not no_real,
                           server=server_options(gpu_layers, threads, llama_cpp_bin, server_args, mtp_server_args,
                                                 vanilla_server_args))
    check_receipt(receipt_path, model)
    res = acceptance_curve(resolve_model_arg(model), options, progress=not as_json)
    _save_and_show(res, model, "acceptance_curve", receipt_path, output, as_json, res.to_dict(), res.table())


@main.command("profiles", short_help="Serving profiles A-D: MTP against vanilla, with a decision table per workload.")
@click.argument("model")
@click.option("--workloads", default="A,B,C,D", show_default=True,
              help="A single decode, B prefill-bound, C contention, D chat (comma-separated).")
@click.option("--scale", type=FiniteFloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="Multiply input/output token counts (e.g. 0.0625: 512 -> 32).")
@click.option("--num-requests", type=click.IntRange(min=1), default=None, help="Requests per arm (default: per workload).")
@draft_n_max_option("The MTP arm's.", default=3)
@click.option("--tuned-from", "tuned_from", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Take the MTP arm's flags from this receipt's verification.tuned (or a tune --output JSON).")
@click.option("--repeats", type=click.IntRange(min=1), default=1, show_default=True,
              help="Runs per arm (alternated, requests pooled).")
@click.option("--noise", type=FiniteFloatRange(0, 1), default=0.02, show_default=True,
              help="Throughput band within which MTP is not counted as helping.")
@gpu_layers_option("Every server's (e.g. 999).")
@threads_option("llama-server's, every arm.")
@click.option("--receipt", "receipt_path", type=click.Path(dir_okay=False), default=None,
              help="Store the profiles as verification.profiles in this receipt.")
@output_option("the full results as JSON (with every request).", hidden=("--out",))
@arm_args_options
@bin_option
@json_option
@handle_errors
def profiles_cmd(model: str, workloads: str, scale: float, num_requests: int | None, draft_n_max: int,
                 tuned_from: str | None, repeats: int, noise: float,
                 gpu_layers: int | str | None, threads: int | None,
                 receipt_path: str | None, output: str | None, llama_cpp_bin: str | None, as_json: bool,
                 server_args: tuple[str, ...] = (), mtp_server_args: tuple[str, ...] = (),
                 vanilla_server_args: tuple[str, ...] = ()) -> None:
    """Serving profiles A-D (the vLLM write-up's workloads), MTP against vanilla: output tok/s, TTFT,
    TPOT, ITL (mean, median, P99), acceptance, and a decision table per workload."""
    from ..measure.profiles.run import ProfilesOptions, run_profiles
    from ..measure.tune.run import load_tuned_config

    options = ProfilesOptions(workloads=_word_list(workloads, "--workloads"), scale=scale,
                              num_requests=num_requests, draft_n_max=draft_n_max,
                              tuned=load_tuned_config(tuned_from) if tuned_from else None, repeats=repeats,
                              noise=noise,
                              server=server_options(gpu_layers, threads, llama_cpp_bin, server_args, mtp_server_args,
                                                    vanilla_server_args))
    check_receipt(receipt_path, model)
    res = run_profiles(resolve_model_arg(model), options, progress=not as_json)
    _save_and_show(res, model, "profiles", receipt_path, output, as_json, res.to_dict(requests=True), res.text())


def _option_space(fa: str, kv: str, batch: str, threads_values: str | None, option_sets: tuple[str, ...]) -> Any:
    """tune-joint's server options from their comma-separated values (each list read by
    :func:`_word_list`/:func:`_int_list`: a value given twice is refused, not searched twice)."""
    from ..errors import TuneError
    from ..search.joint import OptionSpace

    fa_of = {"auto": None, "on": True, "off": False}
    kv_of = (lambda v: None if v == "default" else v)  # noqa: E731 (a local one-liner)
    fas = _word_list(fa, "--flash-attn-values")
    bad = [v for v in fas if v not in fa_of]
    if bad:
        raise TuneError(f"--flash-attn-values {','.join(bad)}: each of auto, on, off")

    def pair(v: str) -> tuple[int, int] | None:
        if v == "default":
            return None
        b, _, ub = v.partition(":")
        if not (b.strip().isdigit() and ub.strip().isdigit()):
            raise TuneError(f"--batch-values {v!r}: B:UB (e.g. 2048:512) or default")
        return int(b), int(ub)
    return OptionSpace(flash_attn=tuple(fa_of[v] for v in fas),
                       cache_types=tuple(kv_of(v) for v in _word_list(kv, "--kv-values")),
                       batches=tuple(pair(v) for v in _word_list(batch, "--batch-values")),
                       threads=tuple(_int_list(threads_values, "--threads-values", low=1) or [None]),
                       option_sets=tuple(_flag_set(s) for s in option_sets))


def _flag_set(text: str) -> tuple[str, ...]:
    """One ``--option`` value, shell-split as ``--server-arg``'s (an unclosed quote: a usage error)."""
    from ..measure.core.options import split_args

    try:
        return tuple(split_args([text]))
    except ValueError as e:
        raise click.BadParameter(f"{text!r}: {e}", param_hint="--option") from None


@main.command("tune-joint", short_help="One search of the fastest verified configuration: head type x k x server options.")
@click.argument("model")
@click.option("--source", required=True, type=click.Path(dir_okay=False),
              help="The model MODEL was quantized from (BF16): the head types are its head re-typed, and each is "
                   "judged against its head (verify's head finding must say preserved).")
@recipe_option
@click.option("--head-types", default=",".join(("F16", "BF16", "Q8_0", "Q6_K", "Q4_K")), show_default=True,
              help="Head tensor types to search (every MTP role at the type), besides MODEL's own head.")
@click.option("--no-own-head", is_flag=True, help="Leave MODEL's own head out of the search.")
@click.option("--head-k", type=click.IntRange(min=1), default=None,
              help="Draft window of the heads stage (default: the recipe's draft_n_max, else 4).")
@click.option("--head-limit", type=click.IntRange(min=1), default=16, show_default=True,
              help="Prompts of the heads stage (the head finding's budget).")
@click.option("--head-seeds", default="42", show_default=True, help="Seeds of the heads stage.")
@click.option("--heads-from", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Take the heads stage from this JSON (benchmarks/head_type_speed.py's or an earlier tune-joint "
                   "output) instead of measuring it; it must be this MODEL's, SOURCE's and recipe's.")
@click.option("--joint-heads", type=click.IntRange(min=1), default=2, show_default=True,
              help="Kept heads (the fastest at the heads stage's window) searched jointly with k and the options.")
@click.option("--flash-attn-values", "fa", default="auto", show_default=True,
              help="-fa values to search (auto,on,off), both arms.")
@click.option("--kv-values", "kv", default="default", show_default=True,
              help="-ctk/-ctv types to search (default,q8_0,...), both arms; a quantized one needs -fa not off.")
@click.option("--batch-values", "batch", default="default", show_default=True,
              help="-b:-ub pairs to search (default,2048:512,...), both arms.")
@click.option("--threads-values", default=None, help="--threads values to search, both arms.")
@click.option("--option", "option_sets", multiple=True,
              help="A non-speculative flag set searched as one more option (both arms), e.g. \"-ctk q4_0 -ctv q4_0\".")
@click.option("--gpu-options", is_flag=True,
              help="Search what matters on a GPU: -fa auto/off, KV f16/q8_0, batch default/2048:2048 (over "
                   "--flash-attn-values, --kv-values and --batch-values).")
@click.option("--n-max-values", default="1,2,3,4,5,6,7,8", show_default=True, help="--spec-draft-n-max values to search.")
@click.option("--p-min-values", default="0,0.5,0.75,0.9", show_default=True, help="--spec-draft-p-min values to search.")
@click.option("--n-min-values", default="0,1,2", show_default=True, help="--spec-draft-n-min values to search.")
@click.option("--budget", type=click.IntRange(min=1), default=240, show_default=True,
              help="Evaluations (MTP requests) of the joint stage's successive halving.")
@click.option("--seeds", default="42", show_default=True, help="Comma-separated request seeds of the joint stage.")
@click.option("--suite", default="chat-v1", show_default=True, help="Prompt suite: a shipped name or a JSONL file.")
@click.option("--max-tokens", type=click.IntRange(min=2), default=DEFAULT_MAX_TOKENS, show_default=True,
              help="Tokens per reply.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Use only the first N prompts (joint stage).")
@gpu_layers_option("Every server's (e.g. 999); enables the GPU dimensions.")
@threads_option("llama-server's, every arm (unless --threads-values searches it).")
@click.option("--dry-run", is_flag=True, help="List the heads, the candidates in search order as far as the budget reaches (every one with "
                   "--json) and the evaluations the search would spend; run nothing.")
@click.option("--recipe-out", type=click.Path(dir_okay=False), default=None,
              help="Write the recipe of the chosen head (the recipe with its [mtp] roles at that type) here.")
@click.option("--receipt", "receipt_path", type=click.Path(dir_okay=False), default=None,
              help="Store the result as verification.tuned in this receipt (only when MODEL's own head won: a "
                   "re-typed head's profile belongs to the artifact its recipe makes).")
@output_option("the full results as JSON (what verify/profiles --tuned-from read).")
@arm_args_options
@bin_option
@json_option
@handle_errors
def tune_joint_cmd(model: str, source: str, recipe_name: str, head_types: str, no_own_head: bool, head_k: int | None,
                   head_limit: int, head_seeds: str, heads_from: str | None, joint_heads: int, fa: str, kv: str,
                   batch: str, threads_values: str | None, option_sets: tuple[str, ...], gpu_options: bool,
                   n_max_values: str, p_min_values: str, n_min_values: str, budget: int, seeds: str, suite: str,
                   max_tokens: int, limit: int | None, gpu_layers: int | str | None, threads: int | None,
                   dry_run: bool, recipe_out: str | None, receipt_path: str | None, output: str | None,
                   llama_cpp_bin: str | None, as_json: bool, server_args: tuple[str, ...] = (),
                   mtp_server_args: tuple[str, ...] = (), vanilla_server_args: tuple[str, ...] = ()) -> None:
    """Search MODEL's fastest verified configuration: the MTP head's tensor type (SOURCE's head
    re-typed, each kept only while verify's head finding against SOURCE says preserved and the output
    is lossless, measured at a fixed window), then tune's successive halving over the kept heads x
    the draft window and limits x the server options (flash attention, KV types, batch, threads,
    option sets; both arms get them, and an option whose vanilla writes other text than the default
    vanilla is dropped). The result is tune's JSON (verify --tuned-from reads it) plus the recipe
    with the chosen head type (--recipe-out): quantize SOURCE with it and verify with --tuned-from."""
    from ..errors import TuneError
    from ..measure.tune.options import SearchOptions, TuneOptions
    from ..search.joint import JointOptions, OptionSpace, joint_plan, joint_search
    from ..search.joint_heads import HeadStage

    space = _option_space(fa, kv, batch, threads_values, option_sets)
    if gpu_options:  # its three dimensions over the --*-values ones
        g = OptionSpace.gpu()
        space = dataclasses.replace(space, flash_attn=g.flash_attn, cache_types=g.cache_types, batches=g.batches)
    search = SearchOptions(n_max_values=_int_list(n_max_values, "--n-max-values", low=1) or (),
                           p_min_values=_float_list(p_min_values, "--p-min-values") or (),
                           n_min_values=_int_list(n_min_values, "--n-min-values", low=0) or ())
    tune_o = TuneOptions(budget=budget, seeds=_int_list(seeds, "--seeds") or (), suite=suite, max_tokens=max_tokens,
                         limit=limit, search=search, server=server_options(gpu_layers, threads, llama_cpp_bin, server_args,
                                                            mtp_server_args, vanilla_server_args))
    o = JointOptions(head_types=tuple(_word_list(head_types, "--head-types", empty_ok=True)), own_head=not no_own_head,
                     head_k=head_k, head_limit=head_limit, head_seeds=tuple(_int_list(head_seeds, "--head-seeds") or ()),
                     joint_heads=joint_heads, options=space, tune=tune_o)
    path = resolve_model_arg(model)
    if dry_run:
        plan = joint_plan(path, o)
        emit_json(plan.to_dict()) if as_json else click.echo(plan.text())
        return
    check_receipt(receipt_path, model)
    res = joint_search(path, resolve_model_arg(source), recipe_name, o,
                       HeadStage.load(heads_from) if heads_from else None, progress=not as_json)
    if recipe_out:
        from ..files.fsutil import atomic_write_text

        atomic_write_text(Path(recipe_out), res.recipe.to_toml())
    head = res.config.head if res.config is not None else None
    # a re-typed head's profile belongs to SOURCE quantized with the joint recipe, not to MODEL's receipt
    _save_and_show(res, model, "tuned", None if head else receipt_path, output, as_json, res.to_dict(), res.text())
    if head and receipt_path:
        raise TuneError(f"--receipt {receipt_path}: not written: the configuration found drafts with a {head} "
                        f"head, which {Path(path).name} does not have; quantize the source with the joint recipe "
                        "(--recipe-out) and store it with `verify NEW.gguf --tuned-from JSON --receipt NEW's receipt`")
