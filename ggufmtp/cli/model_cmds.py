"""ggufmtp inspect and synth."""

from __future__ import annotations

import dataclasses

import click

from ..synth.archs.registry import arch_for, arch_names
from ..synth.layout import PUBLISHED, SHAPE_TINY, SHAPES
from .app import emit_json, handle_errors, json_option, main, resolve_model_arg
from .options import FiniteFloatRange


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@json_option
@handle_errors
def inspect(model: str, as_json: bool) -> None:
    """Report MODEL's architecture, MTP block and completeness, tensor types and size.

    MODEL may be any shard of a split GGUF, or builtin:NAME for a synthesized model."""
    from ..gguf.model import format_report, inspect_model

    report = inspect_model(resolve_model_arg(model))
    if as_json:
        emit_json(report.to_dict())
    else:
        click.echo(format_report(report))


def _calibrate_head(spec, target: float, k: int, suite_name: str, max_tokens: int):
    """synth --target-acceptance: the calibrated fraction (ggufmtp.synth.calibrate.calibrate_wrong_fraction)."""
    from ..measure.core.suite import load_suite
    from ..synth.calibrate import calibrate_wrong_fraction, chat_last_tokens

    if spec.wrong_successor_fraction or spec.eh_proj_noise or not spec.mtp or spec.mtp_only:
        raise click.UsageError("--target-acceptance sets the wrong-successor fraction itself: leave out "
                               "--wrong-successor-fraction, --eh-proj-noise, --no-mtp and --mtp-only")
    suite = load_suite(suite_name)
    last = chat_last_tokens([p.chat_messages() for p in suite.prompts])
    return calibrate_wrong_fraction(target, k, last, max_tokens, base=spec)


@main.command()
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--arch", type=click.Choice(list(arch_names())), default=None,
              help="Architecture, laid out as the pinned converter writes it (see README: architectures). "
                   "Default: the real shape's own (qwen35moe for qwen3.6-35b-a3b, qwen35 for qwen3.6-27b), "
                   "else qwen35moe.")
@click.option("--shape", type=click.Choice(list(SHAPES)), default=SHAPE_TINY, show_default=True,
              help="tiny (a few MB), or the per-layer dimensions of a released model (GBs): qwen3.6-35b-a3b "
                   "(MoE, 40 layers), qwen3.6-27b (dense, 64 layers: ~57 GB at --layers 64).")
@click.option("--layers", type=click.IntRange(1, 200), default=4, show_default=True,
              help="Trunk layers (the released models have the number in --shape's help).")
@click.option("--mtp-layers", type=click.IntRange(1, 8), default=1, show_default=True,
              help="MTP blocks (nextn_predict_layers), for an architecture that chains heads (step35).")
@click.option("--no-mtp", is_flag=True, help="Leave out the MTP block (nextn_predict_layers 0).")
@click.option("--mtp-only", is_flag=True, help="Write an MTP-only sidecar (use with --spec-draft-model).")
@click.option("--seed", type=click.IntRange(0), default=0, show_default=True)
@click.option("--wrong-successor-fraction", type=FiniteFloatRange(0, 1), default=0.0, show_default=True,
              help="Fraction of tokens after which the MTP head drafts a wrong token.")
@click.option("--eh-proj-noise", type=FiniteFloatRange(0), default=0.0, show_default=True,
              help="Relative RMS of gaussian noise added to nextn.eh_proj's output.")
@click.option("--head-margin", type=FiniteFloatRange(0, 20), default=0.0, show_default=True,
              help="Make the MTP head's drafts win by only this many logits (e.g. 2): each "
                   "nextn.embed_tokens row mixes in a competitor token, so quantizing the head flips "
                   "drafts (acceptance falls from Q8_0 to Q6_K to Q4_K) while BF16/Q8_0 keep the designed "
                   "acceptance. 0 = off.")
@click.option("--logit-scale", type=FiniteFloatRange(1, 64), default=24.0, show_default=True,
              help="The successor token's logit: lower gives softer distributions (e.g. 4), so a quantized "
                   "trunk shows a KL-divergence > 0 in `ggufmtp eval`; greedy output is unchanged.")
@click.option("--omit-tensor", "omit", multiple=True, metavar="NAME",
              help="Leave this MTP-block tensor out (e.g. nextn.hnorm); repeatable.")
@click.option("--target-acceptance", type=FiniteFloatRange(0, 1, min_open=True, max_open=True), default=None,
              help="Instead of --wrong-successor-fraction: the fraction whose exact acceptance on --suite "
                   "(chat replies of --max-tokens, temperature 0, draft-n-max --target-k) is nearest this. "
                   "Starts a CPU llama-server on the built-in tiny model to tokenize the prompts.")
@click.option("--target-k", type=click.IntRange(1, 16), default=3, show_default=True,
              help="draft-n-max at which --target-acceptance is measured.")
@click.option("--suite", "suite_name", default="chat-v1", show_default=True, metavar="NAME|PATH",
              help="Prompt suite for --target-acceptance.")
@click.option("--max-tokens", type=click.IntRange(2), default=128, show_default=True,
              help="Reply length for --target-acceptance (verify's --max-tokens).")
@click.option("--format", "fmt", type=click.Choice(["gguf", "hf"]), default="gguf", show_default=True,
              help="hf: OUT is a directory that gets the same weights as a Hugging Face safetensors checkpoint "
                   "(Qwen3_5MoeForCausalLM with mtp.* tensors, or with --arch glm4moe Glm4MoeForCausalLM with its "
                   "NextN layer after the trunk; tokenizer, sharded with an index) for `ggufmtp convert`.")
@json_option
@handle_errors
def synth(out: str, arch: str | None, shape: str, layers: int, mtp_layers: int, no_mtp: bool, mtp_only: bool, seed: int,
          wrong_successor_fraction: float, eh_proj_noise: float, head_margin: float, logit_scale: float,
          omit: tuple[str, ...],
          target_acceptance: float | None, target_k: int, suite_name: str, max_tokens: int, fmt: str,
          as_json: bool) -> None:
    """Write a synthetic BF16 GGUF with an MTP head whose behaviour is known exactly."""
    from ..synth.spec import SynthSpec
    from ..synth.writer import synthesize

    if arch is None:  # a real shape is one architecture's (the dense 27B is qwen35 only)
        arch = PUBLISHED[shape].arch if shape in PUBLISHED else SynthSpec.arch
    spec = SynthSpec(arch=arch, shape=shape, layers=layers, mtp=not no_mtp, mtp_layers=mtp_layers, seed=seed,
                     wrong_successor_fraction=wrong_successor_fraction, eh_proj_noise=eh_proj_noise,
                     omit_tensors=tuple(omit), mtp_only=mtp_only, head_margin=head_margin, logit_scale=logit_scale)
    if fmt == "hf":
        from ..synth.hf import synthesize_hf

        ck = synthesize_hf(out, spec)
        return emit_json(ck.to_dict()) if as_json else click.echo(
            f"wrote {ck.directory}: {len(ck.shards)} safetensors shard(s), {ck.n_tensors} tensors "
            f"({len(ck.mtp_tensors)} MTP head tensors)")
    calibration = None
    if target_acceptance is not None:
        calibration = _calibrate_head(spec, target_acceptance, target_k, suite_name, max_tokens)
        spec = dataclasses.replace(spec, wrong_successor_fraction=calibration.wrong_successor_fraction)
        if not as_json:
            click.echo(f"calibrated: wrong-successor fraction {calibration.wrong_successor_fraction:g} gives "
                       f"{calibration.acceptance:.2%} on {suite_name} at k={target_k} (target "
                       f"{target_acceptance:.2%}; the iid formula's fraction: {calibration.formula_fraction:.4f})")
    res = synthesize(out, spec, progress=not as_json)
    if as_json:
        emit_json({**res.to_dict(), **({"calibration": calibration.to_dict()} if calibration else {})})
        return
    click.echo(f"wrote {res.path} ({res.size_bytes / 2**20:.1f} MiB, {res.n_tensors} tensors)")
    click.echo(f"  arch {arch}, shape {shape}, {layers} trunk layers, "
               + (f"MTP block{'s' if len(res.mtp_blocks) > 1 else ''} "
                  + ", ".join(f"blk.{b}" for b in res.mtp_blocks) if res.mtp_blocks else "no MTP block")
               + (" (MTP-only sidecar)" if mtp_only else ""))
    if res.mtp_block is not None:
        acc = ", ".join(f"k={k}: {res.expected_acceptance(k):.3f}" for k in range(1, 5))
        click.echo(f"  expected draft acceptance (temperature 0, draft-n-max k): {acc}"
                   + (" (upper bound: eh_proj_noise has no closed form)" if eh_proj_noise else ""))
    if not res.servable:
        click.echo("  note: llama-server cannot run this file on its own "
                   + ("(use it with --spec-draft-model next to a --no-mtp model)" if mtp_only
                      else f"({arch_for(arch).unservable_reason(spec)})"), err=True)
