"""ggufmtp tune, curve and profiles (``verify --tune``, an alias of tune, is declared in verify_cmds)."""

from __future__ import annotations

import click

from ..measure.core.options import DEFAULT_MAX_TOKENS
from .app import _float_list, _int_list, bin_option, handle_errors, json_option, main, resolve_model_arg
from .measure_common import _run_tune, _save_and_show, arm_args_options, server_options
from .options import draft_n_max_option, gpu_layers_option, output_option, threads_option


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
    res = acceptance_curve(resolve_model_arg(model), options, progress=not as_json)
    _save_and_show(res, model, "acceptance_curve", receipt_path, output, as_json, res.to_dict(), res.table())


@main.command("profiles", short_help="Serving profiles A-D: MTP against vanilla, with a decision table per workload.")
@click.argument("model")
@click.option("--workloads", default="A,B,C,D", show_default=True,
              help="A single decode, B prefill-bound, C contention, D chat (comma-separated).")
@click.option("--scale", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="Multiply input/output token counts (e.g. 0.0625: 512 -> 32).")
@click.option("--num-requests", type=click.IntRange(min=1), default=None, help="Requests per arm (default: per workload).")
@draft_n_max_option("The MTP arm's.", default=3)
@click.option("--tuned-from", "tuned_from", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Take the MTP arm's flags from this receipt's verification.tuned (or a tune --output JSON).")
@click.option("--repeats", type=click.IntRange(min=1), default=1, show_default=True,
              help="Runs per arm (alternated, requests pooled).")
@click.option("--noise", type=click.FloatRange(0, 1), default=0.02, show_default=True,
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

    options = ProfilesOptions(workloads=[w for w in workloads.split(",") if w.strip()], scale=scale,
                              num_requests=num_requests, draft_n_max=draft_n_max,
                              tuned=load_tuned_config(tuned_from) if tuned_from else None, repeats=repeats,
                              noise=noise,
                              server=server_options(gpu_layers, threads, llama_cpp_bin, server_args, mtp_server_args,
                                                    vanilla_server_args))
    res = run_profiles(resolve_model_arg(model), options, progress=not as_json)
    _save_and_show(res, model, "profiles", receipt_path, output, as_json, res.to_dict(requests=True), res.text())
