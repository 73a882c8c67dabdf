"""``ggufmtp verify`` options for KV-cache types and context depth (``--cache-type-k``,
``--cache-type-v``, ``--context-fill``) and ``verify --matrix``: one verification per cell of KV
type x depth, one table (see :mod:`ggufmtp.measure.verify.matrix`)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..errors import VerifyError
from ..fmt import pct, times
from .app import emit_json

if TYPE_CHECKING:
    from ..measure.core.options import VerifyOptions
    from ..provenance.receipt import Receipt


def kv_depth_options(f: Callable) -> Callable:
    """``--cache-type-k/-ctk``, ``--cache-type-v/-ctv`` (both arms), ``--context-fill N`` and ``--matrix SPEC``."""
    f = click.option("--matrix", "matrix", default=None, metavar="SPEC",
                     help='Verify once per cell of KV-cache type x the draft\'s KV-cache type x context depth and '
                          'print one table, e.g. --matrix "kv=f16,q8_0,q4_0 draft-kv=f16,q8_0 depth=0,8192" '
                          '(draft-kv: -ctkd/-ctvd of the MTP arm; same suite, seeds and settings in every cell; '
                          '--receipt stores it as verification.matrix of an existing verification).')(f)
    f = click.option("--context-fill", "context_fill", type=click.IntRange(min=0), default=0, show_default=True,
                     metavar="N", help="Put every request N tokens deep behind a neutral prefix (both arms; "
                     "cache_prompt stays false, so decode is measured at depth N).")(f)
    f = click.option("--cache-type-v", "-ctv", "cache_type_v", default=None, metavar="TYPE",
                     help="llama-server --cache-type-v for both arms (f16, q8_0, q4_0, ...; a quantized V cache "
                          "runs with --flash-attn on).")(f)
    return click.option("--cache-type-k", "-ctk", "cache_type_k", default=None, metavar="TYPE",
                        help="llama-server --cache-type-k for both arms (f16, q8_0, q4_0, ...).")(f)


def _receipt_verification(rf: Receipt) -> dict[str, Any]:
    """The receipt's verification section; VerifyError when it has none yet (checked before the run)."""
    v = rf.predicate.get("verification")
    if not v:
        raise VerifyError(f"{rf.path}: the receipt has no verification section yet; run `ggufmtp verify MODEL "
                          f"--receipt {rf.path}` first (--matrix adds verification.matrix to it)")
    return dict(v)


def _store(rf: Receipt, section: dict[str, Any], signing_key: Any) -> None:
    """``section`` as the receipt's ``verification.matrix``, when both measured the same bytes (the
    receipt as the command read it, unless it changed on disk during the run)."""
    from ..provenance.receipt import set_verification

    rf = rf.fresh()
    v = _receipt_verification(rf)
    want, got = (v.get("model") or {}).get("sha256"), section["model"]["sha256"]
    if want and got != want:
        raise VerifyError(f"{rf.path}: its verification is of the model with sha256 {want}, the matrix measured "
                          f"{got}; not stored")
    set_verification(rf, {**v, "matrix": section}, signing_key=signing_key)


def _progress(total: int, out_path: str | None, quiet: bool) -> Callable:
    """After each cell: a progress line (unless ``quiet``) and, with -o/--output, the cells so far written
    there (``"partial": true``), so a long run that is stopped still leaves every finished cell."""
    done: list[dict[str, Any]] = []

    def on_cell(cell) -> None:
        done.append(cell.to_dict())
        if out_path:
            from ..files.fsutil import atomic_write_json

            atomic_write_json(Path(out_path), {"partial": True, "cells_total": total, "cells": done})
        if not quiet:
            click.echo(f"cell {len(done)}/{total} {cell.label}: acceptance {pct(cell.acceptance)}, speedup "
                       f"{times(cell.speedup)} ({cell.verdict.value})", err=True)
    return on_cell


def run_matrix(model: Path, spec_text: str, options: VerifyOptions, single: dict[str, Any],
               out_path: str | None, receipt: Receipt | None, as_json: bool, signing_key: Any = None) -> None:
    """``verify --matrix``: every cell, then -o/--output (every cell's full JSON), --receipt
    (``verification.matrix``), the JSON or the table; exit 1 unless every cell passes. ``single``:
    the one-run KV/depth options, which the matrix's cells replace (an error when set)."""
    from ..measure.verify.matrix import parse_matrix, verify_matrix

    spec = parse_matrix(spec_text)
    given = [f"--{k.replace('_', '-')}" for k, v in single.items() if v]
    if given:
        raise VerifyError(f"{', '.join(given)} and --matrix: the matrix's cells set the KV types and depth "
                          f"(give them in the spec: kv=..., depth=...)")
    if receipt is not None:
        _receipt_verification(receipt)  # fails now, not after the run
    res = verify_matrix(model, spec.kv_types, spec.depths, options, draft_kv_types=spec.draft_kv_types,
                        on_cell=_progress(len(spec.cells), out_path, as_json), progress=not as_json)
    if out_path:
        from ..files.fsutil import atomic_write_json

        atomic_write_json(Path(out_path), res.to_dict(full=True))
    if receipt is not None:
        _store(receipt, res.to_receipt(), signing_key)
    if as_json:
        emit_json(res.to_dict())
    else:
        click.echo(res.table())
        if receipt is not None:
            click.echo(f"receipt {receipt.path}: verification.matrix written (matrix verdict {res.verdict})")
    if not res.ok:
        sys.exit(1)
