"""What the measuring commands share: running ``tune`` (the ``tune`` command and its alias ``verify
--tune``) and the common tail of tune, curve and profiles (``-o/--output``, ``--receipt``, what is printed)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from .app import _int_list, emit_json, resolve_model_arg
from .options import FiniteFloatRange, ctx_size_option, draft_n_max_option, gpu_layers_option, threads_option

if TYPE_CHECKING:
    from ..measure.core.options import ServerOptions
    from ..measure.tune.options import TuneOptions


def _split(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    from ..measure.core.options import split_args

    try:
        return tuple(split_args(values))
    except ValueError as e:
        raise click.BadParameter(str(e)) from e


def arm_args_options(f: Callable) -> Callable:
    """``--server-arg`` (both arms), ``--mtp-server-arg`` and ``--vanilla-server-arg`` (one arm), each
    repeatable and shell-split (``--server-arg "-b 256"``); see ggufmtp.measure.core.options.ArmArgs."""
    f = click.option("--vanilla-server-arg", "vanilla_server_args", multiple=True, metavar="ARGS", callback=_split,
                     help="llama-server flag(s) for the vanilla arm only (repeatable; the arms then differ beyond "
                          "speculation, which the report says).")(f)
    f = click.option("--mtp-server-arg", "mtp_server_args", multiple=True, metavar="ARGS", callback=_split,
                     help="llama-server flag(s) for the MTP arm only (repeatable), e.g. --mtp-server-arg="
                          "'--spec-synth-len 3'; a non-speculative one is reported, not corrected.")(f)
    return click.option("--server-arg", "server_args", multiple=True, metavar="ARGS", callback=_split,
                        help="llama-server flag(s) for both arms (repeatable; shell-split), e.g. --server-arg=-bs: "
                             "every non-speculative setting is the vanilla arm's too (fair baseline).")(f)


HEAD_MARGIN_HELP = ("Non-inferiority margin of the head against the reference, at most 0.10 (default: the recipe's "
                    "[verify] head_margin, else 0.03 = 3 acceptance points); printed with every finding.")


def offload_options(f: Callable) -> Callable:
    """Partial offload, every arm alike (the reference included): ``--n-cpu-moe``, ``--cpu-moe``,
    ``--override-tensor``, as llama-server spells them (see ggufmtp.runtime.offload)."""
    f = click.option("--override-tensor", "-ot", "override_tensor", multiple=True, metavar="PATTERN=BUFT",
                     help="llama-server --override-tensor for every arm (repeatable), e.g. -ot 'exps=CPU'.")(f)
    f = click.option("--cpu-moe", is_flag=True, help="Keep every MoE expert tensor in host memory, every arm.")(f)
    return click.option("--n-cpu-moe", type=click.IntRange(min=0), default=None, metavar="N",
                        help="Keep the MoE experts of the first N layers in host memory, every arm; the memory "
                             "plan (checked before any work) says which N fits.")(f)


def verify_judging_options(f: Callable) -> Callable:
    """The window and the head's judgment of the commands that verify as a stage (``run``,
    ``ladder``): ``--draft-n-max``, ``--reference``/``--no-reference``, ``--head-margin``,
    ``--absolute-acceptance``, as ``verify`` spells them."""
    f = click.option("--absolute-acceptance", is_flag=True,
                     help="Also require the recipe's absolute minimum acceptance when a reference is measured.")(f)
    f = click.option("--head-margin", type=FiniteFloatRange(0, 0.10, min_open=True), default=None,
                     help=HEAD_MARGIN_HELP)(f)
    f = click.option("--no-reference", is_flag=True,
                     help="Judge the head by the recipe's absolute minimum acceptance, not against the source model "
                          "(e.g. when the BF16 source does not fit the GPU beside the variant: or --reference a Q8_0).")(f)
    f = click.option("--reference", default=None, metavar="MODEL",
                     help="Judge the head against this model instead of the source model: a more precise variant of "
                          "the same source whose receipt (MODEL.receipt.json beside it) says so (e.g. a Q8_0); "
                          "anything else is refused before quantizing.")(f)
    return draft_n_max_option("Of the verification; default: the recipe's, else 4.")(f)


def verify_option_dict(judging: Mapping[str, Any]) -> dict[str, object]:
    """The flat :class:`~ggufmtp.measure.core.options.VerifyOptions` keys of :func:`verify_judging_options`'
    and :func:`arm_args_options`' values that were given."""
    out: dict[str, object] = {k: judging[k] for k in ("draft_n_max", "head_margin") if judging.get(k) is not None}
    if judging.get("reference") is not None:  # "" (an unset variable) is refused, not "no reference"
        out["reference"] = resolve_model_arg(judging["reference"], "--reference")
    if judging.get("absolute_acceptance"):
        out["absolute_acceptance"] = True
    for k in ("server_args", "mtp_server_args", "vanilla_server_args", "override_tensor"):
        if judging.get(k):
            out[k] = tuple(judging[k])
    if judging.get("cpu_moe"):
        out["cpu_moe"] = True
    if judging.get("n_cpu_moe") is not None:
        out["n_cpu_moe"] = judging["n_cpu_moe"]
    return out


def stage_verify_flags(f: Callable) -> Callable:
    """The requests' and servers' flags of the commands that verify as a stage (``run``, ``ladder``),
    which :func:`stage_verify_options` reads: ``--seeds``, ``--limit``, ``--max-tokens``, ``-ngl``,
    ``-t``, ``-c``."""
    f = ctx_size_option("The servers' (verify; default verify's, 4096).", default=None)(f)
    f = threads_option("The servers' and llama-perplexity's (verify, --eval).")(f)
    f = gpu_layers_option("The servers' and llama-perplexity's (verify, --eval).")(f)
    # verify's types: a value verify refuses is refused here in the same words, before any work
    f = click.option("--max-tokens", type=click.IntRange(min=2), default=None,
                     help="Tokens generated per verification request.")(f)
    f = click.option("--limit", type=click.IntRange(min=1), default=None,
                     help="Verify on the first N prompts of the suite only.")(f)
    return click.option("--seeds", default=None, help="Verification seeds, e.g. 42,1337,2024.")(f)


def stage_verify_options(seeds: str | None, limit: int | None, max_tokens: int | None, gpu_layers: int | str | None,
                         threads: int | None, ctx_size: int | None, judging: Mapping[str, Any]) -> dict[str, object]:
    """The flat :class:`~ggufmtp.measure.core.options.VerifyOptions` keys that the commands verifying
    as a stage (``run``, ``ladder``) were given: ``--seeds`` (comma-separated), ``--limit``,
    ``--max-tokens``, ``-ngl``, ``-t``, ``-c``, then :func:`verify_option_dict`'s."""
    parsed = tuple(_int_list(seeds, "--seeds") or ()) or None  # verify's reading: one usage error, no traceback
    out: dict[str, object] = {k: v for k, v in (("seeds", parsed), ("limit", limit), ("max_tokens", max_tokens),
                                                ("gpu_layers", gpu_layers), ("threads", threads),
                                                ("ctx_size", ctx_size)) if v is not None}
    out.update(verify_option_dict(judging))
    return out


def check_receipt(receipt_path: str | None, model: str) -> None:
    """Before a measuring command's run: ``--receipt`` must hold a verification of MODEL (the run's
    result is added to it), else one error now, not after a search of minutes (the model's size is
    compared here; its sha256 when the result is stored)."""
    if receipt_path:
        from .._api import verified_receipt

        verified_receipt(receipt_path, resolve_model_arg(model), digest=False)


def _save_and_show(res: Any, model: str, section: str, receipt_path: str | None, out_path: str | None,
                   as_json: bool, out_data: dict[str, Any], text: str) -> None:
    """The common tail of tune, curve and profiles: the full JSON to -o/--output, ``res.to_dict()`` as
    ``verification.<section>`` of --receipt, then JSON or the human-readable text on stdout."""
    if out_path:
        from ..files.fsutil import atomic_write_json

        atomic_write_json(Path(out_path), out_data)
    if receipt_path:
        from .._api import store_in_receipt

        store_in_receipt(receipt_path, model=resolve_model_arg(model), **{section: res.to_dict()})
    if as_json:
        emit_json(res.to_dict())
    else:
        click.echo(text)
        if receipt_path:
            click.echo(f"receipt {receipt_path}: verification.{section} written (verify's results kept)")


def server_options(gpu_layers: int | str | None, threads: int | None, llama_cpp_bin: str | None,
                   server_args: tuple[str, ...] = (), mtp_server_args: tuple[str, ...] = (),
                   vanilla_server_args: tuple[str, ...] = (), n_cpu_moe: int | None = None, cpu_moe: bool = False,
                   override_tensor: tuple[str, ...] = ()) -> ServerOptions:
    """The servers' settings of a measuring command (``-ngl``, ``-t``, ``--llama-cpp-bin``,
    :func:`arm_args_options`' and :func:`offload_options`' flags)."""
    from ..measure.core.options import ServerOptions

    return ServerOptions(threads=threads, gpu_layers=gpu_layers, llama_cpp_bin=llama_cpp_bin,
                         server_args=server_args, mtp_server_args=mtp_server_args,
                         vanilla_server_args=vanilla_server_args, n_cpu_moe=n_cpu_moe, cpu_moe=cpu_moe,
                         override_tensor=override_tensor)


def _run_tune(model: str, options: TuneOptions, receipt_path: str | None, out_path: str | None,
              as_json: bool) -> None:
    """``ggufmtp tune`` with parsed options (also ``verify --tune``)."""
    from ..measure.tune.run import tune

    check_receipt(receipt_path, model)
    res = tune(resolve_model_arg(model), options, progress=not as_json)
    _save_and_show(res, model, "tuned", receipt_path, out_path, as_json, res.to_dict(), res.table())
