"""What the measuring commands share: running ``tune`` (the ``tune`` command and its alias ``verify
--tune``) and the common tail of tune, curve and profiles (``--out``, ``--receipt``, output)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from .app import _int_list, _ngl, emit_json, resolve_model_arg


def _split(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    from ..measure.options import split_args

    try:
        return tuple(split_args(values))
    except ValueError as e:
        raise click.BadParameter(str(e)) from e


def arm_args_options(f: Callable) -> Callable:
    """``--server-arg`` (both arms), ``--mtp-server-arg`` and ``--vanilla-server-arg`` (one arm), each
    repeatable and shell-split (``--server-arg "-b 256"``); see ggufmtp.measure.options.ArmArgs."""
    f = click.option("--vanilla-server-arg", "vanilla_server_args", multiple=True, metavar="ARGS", callback=_split,
                     help="llama-server flag(s) for the vanilla arm only (repeatable; the arms then differ beyond "
                          "speculation, which the report says).")(f)
    f = click.option("--mtp-server-arg", "mtp_server_args", multiple=True, metavar="ARGS", callback=_split,
                     help="llama-server flag(s) for the MTP arm only (repeatable), e.g. --mtp-server-arg="
                          "'--spec-synth-len 3'; a non-speculative one is reported, not corrected.")(f)
    return click.option("--server-arg", "server_args", multiple=True, metavar="ARGS", callback=_split,
                        help="llama-server flag(s) for both arms (repeatable; shell-split), e.g. --server-arg=-bs: "
                             "every non-speculative setting is the vanilla arm's too (fair baseline).")(f)


def _save_and_show(res: Any, model: str, section: str, receipt_path: str | None, out_path: str | None,
                   as_json: bool, out_data: dict[str, Any], text: str) -> None:
    """The common tail of tune, curve and profiles: the full JSON to --out, ``res.to_dict()`` as
    ``verification.<section>`` of --receipt, then JSON or the human-readable text on stdout."""
    if out_path:
        from ..files.fsutil import atomic_write_json

        atomic_write_json(Path(out_path), out_data)
    if receipt_path:
        from ..measure.tune import store_in_receipt

        store_in_receipt(receipt_path, model=resolve_model_arg(model), **{section: res.to_dict()})
    if as_json:
        emit_json(res.to_dict())
    else:
        click.echo(text)


def _run_tune(model: str, concurrency: int, budget: int, seeds: str, suite: str, max_tokens: int,
              limit: int | None, gpu_layers: str | None, threads: int | None, ctx_per_slot: int,
              receipt_path: str | None, out_path: str | None, llama_cpp_bin: str | None, as_json: bool,
              final_on_suite: bool = True, arm_args: tuple[tuple[str, ...], ...] = ((), (), ())) -> None:
    """``ggufmtp tune`` with parsed options (also ``verify --tune``); ``arm_args``: the
    ``--server-arg``, ``--mtp-server-arg`` and ``--vanilla-server-arg`` values."""
    from ..measure.tune import tune

    both, mtp, van = arm_args
    res = tune(resolve_model_arg(model), concurrency=concurrency, budget=budget, seeds=_int_list(seeds, "--seeds"),
               suite=suite, max_tokens=max_tokens, limit=limit, gpu_layers=_ngl(gpu_layers), threads=threads,
               ctx_per_slot=ctx_per_slot, llama_cpp_bin=llama_cpp_bin, progress=not as_json,
               final_on_suite=final_on_suite, server_args=both, mtp_server_args=mtp, vanilla_server_args=van)
    _save_and_show(res, model, "tuned", receipt_path, out_path, as_json, res.to_dict(), res.table())
    if receipt_path and not as_json:
        click.echo(f"receipt {receipt_path}: verification.tuned written (verify's results kept)")
