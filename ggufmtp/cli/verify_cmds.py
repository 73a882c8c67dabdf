"""ggufmtp verify (and ``verify --tune``, an alias of ``ggufmtp tune``)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..measure.core.options import DEFAULT_MAX_TOKENS, DEFAULT_SEEDS
from .app import _int_list, bin_option, emit_json, handle_errors, json_option, main, resolve_model_arg
from .matrix_cmd import kv_depth_options, run_matrix
from .measure_common import HEAD_MARGIN_HELP, _run_tune, arm_args_options, offload_options, server_options
from .options import (
    FiniteFloatRange,
    ctx_size_option,
    draft_n_max_option,
    gpu_layers_option,
    output_option,
    threads_option,
)
from .provenance_cmds import signing_key_option

if TYPE_CHECKING:
    from ..provenance.receipt import Receipt


@main.command("verify")
@click.argument("model")
@draft_n_max_option("Default: the recipe's, else 4.")
@click.option("--draft-n-min", type=click.IntRange(min=0), default=None, help="--spec-draft-n-min for the MTP arm.")
@click.option("--seeds", default=",".join(map(str, DEFAULT_SEEDS)), show_default=True, help="Comma-separated request seeds.")
@click.option("--suite", default="chat-v1", show_default=True, help="Prompt suite: a shipped name or a JSONL file.")
@click.option("--max-tokens", type=click.IntRange(min=2), default=DEFAULT_MAX_TOKENS, show_default=True, help="Tokens per reply.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Use only the first N prompts (quick runs).")
@click.option("--raw", is_flag=True, help="Also send the prompts to /completion without the chat template (own arm).")
@click.option("--sweep", default=None, help="Draft windows to compare, e.g. 2,3,4,6,8 (the shipped k is always included).")
@click.option("--recipe", "-r", "recipe_name", default=None,
              help="Take min_acceptance/min_speedup/draft_n_max from this recipe's [verify] table. Default: the "
                   "recipe --receipt names (found by its recorded sha256: by name, beside the receipt, or in the search's "
                   "store), else ggufmtp's defaults (acceptance >= 50%, speedup >= 1.10x).")
@click.option("--min-acceptance", type=FiniteFloatRange(0, 1), default=None, help="Minimum acceptance (0-1).")
@click.option("--min-speedup", type=FiniteFloatRange(min=0), default=None, help="Minimum decode speedup.")
@click.option("--min-identical", type=FiniteFloatRange(0, 1), default=1.0, show_default=True,
              help="Minimum fraction of MTP replies identical to vanilla, in every comparison (chat, --raw, each "
                   "sweep window); the default 1 fails the verdict on any differing reply.")
@click.option("--enforce-speedup", is_flag=True, help="Check the speedup threshold on CPU runs too.")
@click.option("--reference", default=None, metavar="MODEL",
              help="Judge the head against this model (the BF16 base, or a Q8_0 variant where BF16 does not fit): "
                   "measured alone first (cached by content) with the MTP arm's settings; the head is preserved, "
                   "degraded or inconclusive as the paired acceptance difference's interval lies above, below or "
                   "across -(--head-margin), looked at after 8, 16, 32, ... prompts (the run stops when decided). "
                   "The absolute --min-acceptance is then off unless --absolute-acceptance. It must be the source MODEL's "
                   "receipt names (by sha256), or a more precise variant whose own receipt (beside it) names that source; "
                   "never MODEL's bytes. Without a receipt the head finding is unbound (not publishable).")
@click.option("--head-margin", type=FiniteFloatRange(0, 0.10, min_open=True), default=None, help=HEAD_MARGIN_HELP)
@click.option("--absolute-acceptance", is_flag=True,
              help="With --reference, also require the minimum acceptance (--min-acceptance or the recipe's).")
@click.option("--sidecar", default=None, metavar="SIDECAR",
              help="MODEL is a trunk and SIDECAR its MTP-only GGUF (`ggufmtp sidecar`): the MTP arm drafts with "
                   "--spec-draft-model (-md) SIDECAR, the vanilla arm serves MODEL alone; they must pair.")
@gpu_layers_option("Both servers' (e.g. 999).")
@threads_option("llama-server's, every arm.")
@ctx_size_option("llama-server's, shared by the --parallel slots.", default=4096)
@click.option("--parallel", type=click.IntRange(min=1), default=1, show_default=True,
              help="N > 1: also measure acceptance with s concurrent clients on servers with --parallel s "
                   "(s = 2, 4, ... N), against the single-slot run; the verdict fails when it leaves the "
                   "single-slot 95% CI, a reply carries another concurrent request's text, or a request's "
                   "reply differs from vanilla's reply to the same request (named in the reason).")
@click.option("--tuned-from", "tuned_from", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Run the MTP arm with the configuration `ggufmtp tune` or `tune-joint` found (a receipt or "
                   "their --output JSON) against default vanilla: confirms the tuned speedup on the full suite. "
                   "The result's `tuned` (with --receipt, the card's Recommended server settings) is that profile "
                   "as served for MODEL, with this run's figures.")
@click.option("--peak-bandwidth", "peak_bandwidth_gbs", type=FiniteFloatRange(min=0, min_open=True), default=None,
              help="Peak memory bandwidth in GB/s for the bandwidth fraction (default: known GPUs by name).")
@click.option("--receipt", "receipt_path", type=click.Path(dir_okay=False), default=None,
              help="Write the results into this receipt's verification section; its source binds --reference "
                   "(default for that: MODEL.receipt.json beside MODEL).")
@output_option("the full results as JSON (with every request), written atomically.", hidden=("--out",))
@arm_args_options
@offload_options
@kv_depth_options
@signing_key_option
@bin_option
@json_option
@click.option("--tune", is_flag=True, help="Run `ggufmtp tune` instead (alias): search server settings; "
              "--seeds/--suite/--max-tokens/--limit/--gpu-layers/--threads/--receipt/--output/--json apply.")
@click.option("--budget", type=click.IntRange(min=1), default=240, show_default=True,
              help="With --tune: evaluations the search may spend.")
@click.option("--concurrency", type=click.IntRange(min=1), default=1, show_default=True,
              help="With --tune: concurrent clients to tune for.")
@handle_errors
def verify_cmd(model: str, draft_n_max: int | None, draft_n_min: int | None, seeds: str, suite: str, max_tokens: int,
               limit: int | None, raw: bool, sweep: str | None, recipe_name: str | None, min_acceptance: float | None,
               min_speedup: float | None, min_identical: float, enforce_speedup: bool, gpu_layers: int | str | None,
               threads: int | None, ctx_size: int, parallel: int, tuned_from: str | None,
               peak_bandwidth_gbs: float | None, receipt_path: str | None, output: str | None,
               llama_cpp_bin: str | None, as_json: bool, tune: bool = False, budget: int = 240,
               concurrency: int = 1, signing_key: str | None = None, server_args: tuple[str, ...] = (),
               mtp_server_args: tuple[str, ...] = (), vanilla_server_args: tuple[str, ...] = (),
               cache_type_k: str | None = None, cache_type_v: str | None = None, context_fill: int = 0,
               matrix: str | None = None, reference: str | None = None, head_margin: float | None = None,
               absolute_acceptance: bool = False, sidecar: str | None = None, n_cpu_moe: int | None = None,
               cpu_moe: bool = False, override_tensor: tuple[str, ...] = ()) -> None:
    """Verify MODEL's MTP head with a real llama-server: vanilla vs --spec-type draft-mtp, interleaved.

    Reports draft acceptance and decode speedup with 95% bootstrap CIs (overall, per category, per
    seed), per-position acceptance, and whether MTP output equals vanilla output at temperature 0.
    Exits 1 when the verdict fails. The verdict names three findings: the head (preserved against
    --reference, or meeting the minimum acceptance without one), lossless output, and speed. The
    speedup threshold applies only with the weights on the GPU (GPU offload, no
    partial offload to host memory), or with --enforce-speedup. With --tuned-from, the MTP arm uses a tuned configuration. Also reports the
    fraction of the memory-bandwidth limit each arm reached. Fair baseline: every non-speculative
    setting (--server-arg, a tuned -bs/threads) goes to the vanilla arm too; when that differs from
    llama-server's defaults a default vanilla arm also runs and speedup_vs_default_vanilla is reported
    beside the fair speedup. An MTP reply that differs from vanilla fails the verdict unless sound
    numerics explain it (vanilla's runner-up at a near-tie within the batching drift). MODEL may be
    builtin:NAME."""
    if tune:
        default = click.core.ParameterSource.DEFAULT
        tune_seeds = "42" if click.get_current_context().get_parameter_source("seeds") == default else seeds
        from ..measure.tune.options import TuneOptions

        options = TuneOptions(concurrency=concurrency, budget=budget, seeds=_int_list(tune_seeds, "--seeds") or (),
                              suite=suite, max_tokens=max_tokens, limit=limit, ctx_per_slot=ctx_size,
                              server=server_options(gpu_layers, threads, llama_cpp_bin, server_args, mtp_server_args,
                                                    vanilla_server_args))
        return _run_tune(model, options, receipt_path, output, as_json)
    from ..measure.core.options import JudgeOptions, VerifyOptions
    from ..measure.tune.run import load_tuned_profile
    from ..measure.verify.run import Thresholds, verify

    seed_list, sweep_list = _int_list(seeds, "--seeds"), _int_list(sweep, "--sweep", low=1)
    th = Thresholds()  # the project's defaults: there is always a threshold
    from .._api import verify_recipe
    from ..provenance.receipt import read_receipt, refuse_other_file

    rf = read_receipt(receipt_path) if receipt_path else None  # read once: every reader below takes this object
    rec = verify_recipe(recipe_name, rf)
    if rec is not None:
        th = Thresholds.from_recipe(rec.verify, rec.name)
        if draft_n_max is None and not tuned_from:
            draft_n_max = rec.verify.draft_n_max
    th = th.merged(min_acceptance=min_acceptance, min_speedup=min_speedup, min_identical=min_identical,
                   enforce_speedup=enforce_speedup)
    from ..provenance.signing import resolve_signing_key

    key = resolve_signing_key(signing_key) if receipt_path else None  # a bad key fails before the run
    from ..gguf.model import refuse_later_shard

    refuse_later_shard(resolve_model_arg(model))  # llama-server loads a split model from its first shard only
    if rf is not None:
        refuse_other_file(rf, resolve_model_arg(model))  # another file's receipt fails before the run
    profile = load_tuned_profile(tuned_from) if tuned_from else None
    options = VerifyOptions(
        draft_n_max=draft_n_max, draft_n_min=draft_n_min, sweep=sweep_list or (),
        tuned=profile.config if profile else None, seeds=seed_list or (),
        suite=suite, max_tokens=max_tokens, limit=limit, raw=raw, ctx_size=ctx_size, parallel=parallel,
        reference=resolve_model_arg(reference, "--reference") if reference is not None else None,  # "": an error, not none
        sidecar=resolve_model_arg(sidecar, "--sidecar") if sidecar is not None else None,
        server=server_options(gpu_layers, threads, llama_cpp_bin, server_args, mtp_server_args, vanilla_server_args,
                              n_cpu_moe, cpu_moe, override_tensor),
        judge=JudgeOptions(thresholds=th, peak_bandwidth_gbs=peak_bandwidth_gbs, head_margin=head_margin,
                           absolute_acceptance=absolute_acceptance))
    kv_depth = dict(cache_type_k=cache_type_k, cache_type_v=cache_type_v, context_fill=context_fill)
    if matrix:
        return run_matrix(resolve_model_arg(model), matrix, options, kv_depth, output, rf, as_json, key)
    res = verify(resolve_model_arg(model), dataclasses.replace(options, **kv_depth), progress=not as_json,
                 receipt=rf, profile=profile.source if profile else None)
    _write_and_show(res, output, receipt_path, as_json, key, rf)
    if not res.ok:
        sys.exit(1)


def _write_and_show(res, out_path: str | None, receipt_path: str | None, as_json: bool, signing_key=None,
                    read: Receipt | None = None) -> None:
    """-o/--output (the full JSON), --receipt (its verification section), then JSON or the table."""
    if out_path:
        from ..files.fsutil import atomic_write_json

        atomic_write_json(Path(out_path), res.to_dict(requests=True))
    if receipt_path:
        from ..provenance.receipt import set_verification

        set_verification(read or receipt_path, res.to_receipt(), keep_added=True, signing_key=signing_key)
    if as_json:
        emit_json(res.to_dict())
        for r in res.reasons:
            click.echo(f"FAIL {r}", err=True)
    else:
        click.echo(res.table())
        if out_path:
            click.echo(f"wrote {out_path}")
        if receipt_path:
            click.echo(f"receipt {receipt_path}: verification section written (verdict {res.verdict})")
