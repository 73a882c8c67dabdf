"""ggufmtp search: the recipe of least KLD within a size budget, measured per tensor group (#43)."""

from __future__ import annotations

from pathlib import Path

import click

from ..quality.options import MIN_CTX, EvalOptions
from .app import _int_list, _word_list, bin_option, emit_json, handle_errors, imatrix_option, json_option, main
from .options import FiniteFloatRange, ctx_size_option, gpu_layers_option, output_option, refuse_empty_model, threads_option


@main.command("search", short_help="Search MODEL for the recipe of least KLD within a size budget.")
@click.argument("model", metavar="MODEL.gguf")
@click.option("--budget", required=True, metavar="SIZE|BPW|RECIPE",
              help="The size to fit, over the quantized tensors: 12MB, 11.5MiB, 4.5bpw, or a recipe "
                   "(hifi-q4_k_m-mtp: that recipe's size on this model).")
@click.option("--types", default="Q8_0,Q6_K,Q5_K,Q4_K,IQ4_XS,Q3_K,Q2_K", show_default=True,
              help="Candidate types for every group (a type that needs statistics only where --imatrix has them for the group's tensors).")
@imatrix_option
@click.option("--corpus", default=EvalOptions.corpus, show_default=True,
              help="Held-out text the KLD is measured on: a UTF-8 file or builtin:NAME.")
@click.option("--chunks", type=click.IntRange(min=2), default=None, help="Measure on the first N chunks only.")
@ctx_size_option("llama-perplexity's: tokens per chunk, the second half of each scored.",
                 default=EvalOptions.ctx_size, min_ctx=MIN_CTX)
@click.option("--baseline", default="Q8_0", show_default=True,
              help="The recipe every other tensor follows while one group is measured.")
@click.option("--acceptance/--no-acceptance", default=False, show_default=True,
              help="Also measure the head's groups' acceptance against the source (starts llama-servers); "
                   "without it each head group keeps at least the loosest type a shipped recipe gives it.")
@click.option("--acceptance-group", "acceptance_groups", multiple=True, metavar="GROUP",
              help="With --acceptance: also measure this trunk group's acceptance, e.g. the last layers' "
                   "routed_experts.2-3 (repeatable; a trunk's KLD does not show what it costs the head).")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Verify acceptance on the first N prompts only.")
@click.option("--seeds", default=None, help="Verification seeds, e.g. 42,1337,2024 (default: verify's).")
@click.option("--suite", default="chat-v1", show_default=True,
              help="Verification prompt suite: a shipped name or a JSONL file (more prompts narrow the head's CI).")
@click.option("--max-tokens", type=click.IntRange(min=2), default=None,
              help="Tokens per verification reply (default: verify's; longer replies narrow the head's CI).")
@click.option("--margin", type=FiniteFloatRange(0, 0.5), default=0.03, show_default=True,
              help="The head's non-inferiority margin (a fraction: 0.03 is 3 points).")
@click.option("--max-kld", type=FiniteFloatRange(min=0), default=None, help="Refuse an allocation predicted above this KLD.")
@click.option("--layers-per-group", type=click.IntRange(min=1), default=4, show_default=True,
              help="Trunk layers per group (fewer: finer allocation, more measurements).")
@output_option("the recipe found (TOML, with its [search] table; a copy is kept by its sha256 for verify --receipt).")
@click.option("--name", default="searched-mtp", show_default=True, help="The recipe's name.")
@click.option("--prove", is_flag=True, help="Quantize the found recipe and the recipe to beat (--against, else the "
                                            "budget's recipe, else the shipped recipe of the nearest size), "
                                            "measure both, and judge (beats / matches smaller / does not beat).")
@click.option("--against", default=None, help="The recipe to beat: the proof's other arm; its own types are admitted "
                                              "for the tensors the head reads.")
@click.option("--prove-head/--no-prove-head", default=True, show_default=True,
              help="With --prove: judge the found file's head against the shipped file's, paired in one interleaved "
                   "verify run (starts llama-servers; --limit and --margin apply).")
@click.option("--plot", type=click.Path(dir_okay=False), default=None, help="Write the Pareto plot (SVG) here.")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Measure on a local Dask cluster of N processes.")
@click.option("--scheduler", default=None, metavar="ADDRESS", help="Measure on this Dask cluster (tcp://host:8786).")
@gpu_layers_option("llama-perplexity's and the servers'.")
@threads_option("llama-perplexity's and the servers'.")
@bin_option
@json_option
@handle_errors
def search_cmd(model: str, budget: str, types: str, imatrix: str | None, corpus: str, chunks: int | None, ctx_size: int,
               baseline: str, acceptance: bool, acceptance_groups: tuple[str, ...], limit: int | None, seeds: str | None, suite: str,
               max_tokens: int | None, margin: float, max_kld: float | None,
               layers_per_group: int, output: str | None, name: str, prove: bool, against: str | None, prove_head: bool,
               plot: str | None, workers: int | None, scheduler: str | None, gpu_layers: int | str | None,
               threads: int | None, llama_cpp_bin: str | None, as_json: bool) -> None:
    """Search MODEL (the BF16 source, or builtin:NAME) for the recipe of least KLD within a size budget.

    Each tensor group (a role over a range of layers, and the MTP head's parts) is measured at each
    candidate type with every other tensor at the baseline (cached: a rerun resumes); the types are
    then allocated under --budget by an exact knapsack on the predicted KLD (the baseline's plus each
    group's measured delta), keeping the head non-inferior to the reference. The recipe is an
    ordinary one: plan, quantize, ladder and the card take it. --prove measures the real file."""
    from ..measure.core.options import DEFAULT_MAX_TOKENS, DEFAULT_SEEDS, ServerOptions, VerifyOptions
    from ..search.allocate import Floors
    from ..search.measure import MeasureOptions
    from ..search.run import SearchOptions, search_recipe

    ev = EvalOptions(corpus=corpus, ctx_size=ctx_size, chunks=chunks, gpu_layers=gpu_layers, threads=threads,
                     llama_cpp_bin=llama_cpp_bin)
    verify = VerifyOptions(limit=limit, suite=suite, seeds=tuple(_int_list(seeds, "--seeds") or DEFAULT_SEEDS),
                           max_tokens=max_tokens or DEFAULT_MAX_TOKENS, server=ServerOptions(gpu_layers=gpu_layers, threads=threads,
                                                             llama_cpp_bin=llama_cpp_bin))
    measure = MeasureOptions(eval=ev, baseline=baseline, imatrix=imatrix, acceptance=acceptance, verify=verify,
                             acceptance_groups=acceptance_groups,
                             progress=not as_json)
    options = SearchOptions(types=tuple(_word_list(types, "--types")), measure=measure,
                            floors=Floors(acceptance_margin=margin, max_kld=max_kld), layers_per_group=layers_per_group,
                            prove=prove, prove_head=prove_head, shipped=against, workers=workers, scheduler=scheduler,
                            name=name)
    res = search_recipe(refuse_empty_model(model), budget, options, out=output, log=lambda m: click.echo(m, err=True))
    if plot:
        from ..files.fsutil import atomic_write_text
        from ..search.report import svg

        atomic_write_text(plot, svg(res.points(), f"{name}: KLD against size"))
    if as_json:
        emit_json(res.to_dict())
        return
    click.echo(_text(res, output, plot))


def _text(res: object, output: str | None, plot: str | None) -> str:
    from ..fmt import human_bytes
    from ..search.prove import head_text
    from ..search.report import format_table
    from ..search.run import SearchResult

    assert isinstance(res, SearchResult)
    a, t = res.allocation, res.table
    lines = [f"{'group':<24} {'type':<8} {'size':>10} {'KLD delta':>11}"]
    for group, qtype in a.types:
        c = t.cost(group, qtype)
        assert c is not None
        lines.append(f"{group:<24} {qtype:<8} {human_bytes(c.candidate.n_bytes):>10} {c.kld - t.baseline_kld:>+11.6f}")
    acc = "" if a.predicted_acceptance_diff is None else f", head acceptance {a.predicted_acceptance_diff * 100:+.1f} pt"
    lines += ["", f"allocated: {human_bytes(a.n_bytes)} ({a.bpw:.3f} bpw) of a {human_bytes(a.budget_bytes)} budget, "
                  f"predicted KLD {a.predicted_kld:.6f} (baseline {t.baseline_recipe} {t.baseline_kld:.6f} + the "
                  f"groups' deltas){acc}; method {a.method}"]
    lines += [f"  excluded {g} at {q}: {why}" for g, q, why in a.excluded]
    if res.proof is not None:
        p = res.proof
        lo, hi = p.kld_diff_ci
        ci = "no CI" if lo is None or hi is None else f"CI [{lo:+.6f}, {hi:+.6f}]"
        lines += ["", f"proof against {p.shipped.recipe}: {p.verdict.value}: {p.reason}",
                  f"  KLD {p.found.kld:.6f} vs {p.shipped.kld:.6f} (paired difference {p.kld_diff:+.6f}, {ci}); "
                  f"size {human_bytes(p.found.n_bytes)} vs {human_bytes(p.shipped.n_bytes)}"]
        if p.head is not None:
            lines.append(f"  head against {p.shipped.recipe}'s: {head_text(p.head)}")
    lines += ["", format_table(res.points(), front_only=True)]
    if output:
        lines.append(f"\nrecipe: {Path(output)}")
    if plot:
        lines.append(f"plot: {Path(plot)}")
    return "\n".join(lines)
