"""The ``ggufmtp`` command line: a thin click layer over the Python API.

Every command prints for people by default and JSON with ``--json``; a ``GgufmtpError`` becomes
one ``error: ...`` line on stderr and exit status 1 (2 for usage errors, click's convention).
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any, Callable

import click

from ._version import __version__
from .errors import GgufmtpError


def emit_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, default=str))


def handle_errors(fn: Callable) -> Callable:
    """Turn GgufmtpError (and Ctrl-C) into one clear line and a non-zero exit, no traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except GgufmtpError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)

    return wrapper


json_option = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
bin_option = click.option(
    "--llama-cpp-bin", type=click.Path(), default=None,
    help="Directory (or file) of the llama.cpp binaries; overrides $GGUFMTP_LLAMA_CPP_BIN and the cache.",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ggufmtp")
def main() -> None:
    """Produce, audit and verify MTP (NextN) GGUF models for llama.cpp."""


# --- commands are registered below, one section per pipeline noun -------------------------------


# --- runtime & doctor ----------------------------------------------------------------------------
@main.group()
def runtime() -> None:
    """The llama.cpp runtime (llama-server, llama-quantize, llama-imatrix, libllama)."""


@runtime.command("build")
@click.option("--cuda", is_flag=True, help="Build with CUDA (needs nvcc).")
@click.option("--cuda-arch", default="90", show_default=True, help="CUDA architecture, e.g. 90 for H100/H200.")
@click.option("--jobs", "-j", type=int, default=None, help="Parallel build jobs (default: all cores).")
@click.option("--force", is_flag=True, help="Rebuild even if the cache already has this variant.")
@json_option
@handle_errors
def runtime_build(cuda: bool, cuda_arch: str, jobs: int | None, force: bool, as_json: bool) -> None:
    """Build the pinned llama.cpp from the llama-cpp-python sdist into the per-user cache."""
    from . import runtime as rt

    info = rt.build_runtime(cuda, cuda_arch, jobs, force, log=lambda m: click.echo(m, err=True))
    if as_json:
        emit_json({"bin_dir": str(info.bin_dir), "commit": info.commit, "variant": info.variant,
                   "build_flags": info.build_flags})
    else:
        click.echo(str(info.bin_dir))


@runtime.command("path")
@bin_option
@handle_errors
def runtime_path(llama_cpp_bin: str | None) -> None:
    """Print the directory of the llama.cpp binaries ggufmtp would use."""
    from . import runtime as rt

    click.echo(str(rt.find_binary("llama-server", llama_cpp_bin).parent))


@main.command()
@bin_option
@json_option
@handle_errors
def doctor(llama_cpp_bin: str | None, as_json: bool) -> None:
    """Check versions, the llama.cpp commit of libllama and every binary, and draft-mtp support."""
    from .doctor import format_doctor, run_doctor

    report = run_doctor(llama_cpp_bin)
    if as_json:
        emit_json(report.to_dict())
    else:
        click.echo(format_doctor(report))
    if not report.ok:
        sys.exit(1)


# --- inspect -------------------------------------------------------------------------------------
@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@json_option
@handle_errors
def inspect(model: str, as_json: bool) -> None:
    """Report MODEL's architecture, MTP block and completeness, tensor types and size.

    MODEL may be any shard of a split GGUF, or builtin:NAME for a synthesized model."""
    from .model import format_report, inspect_model

    report = inspect_model(resolve_model_arg(model))
    if as_json:
        emit_json(report.to_dict())
    else:
        click.echo(format_report(report))


def resolve_model_arg(model: str) -> str:
    """``builtin:NAME`` → the synthesized model's path (made once, cached); else the path."""
    if model.startswith("builtin:"):
        from .synth import builtin_path

        return str(builtin_path(model))
    return model


# --- recipes, plan, quantize ---------------------------------------------------------------------
@main.group()
def recipe() -> None:
    """Quantization recipes (recipes/*.toml)."""


@recipe.command("list")
@json_option
@handle_errors
def recipe_list(as_json: bool) -> None:
    """List the shipped recipes."""
    from .recipe import Recipe, shipped_recipes

    recipes = [Recipe.load(n) for n in shipped_recipes()]
    if as_json:
        emit_json([r.to_dict() for r in recipes])
        return
    for r in recipes:
        click.echo(f"{r.name:<18} {r.ftype:<8} {r.description}")


@recipe.command("show")
@click.argument("recipe_name")
@json_option
@handle_errors
def recipe_show(recipe_name: str, as_json: bool) -> None:
    """Show a recipe (a shipped name or a .toml path) with its rules in the order they apply."""
    from .recipe import Recipe

    r = Recipe.load(recipe_name)
    if as_json:
        emit_json(r.to_dict())
        return
    click.echo(f"{r.name}: {r.description}\nftype {r.ftype}, imatrix {r.imatrix}, MTP required {r.mtp_required}")
    for i, rule in enumerate(r.all_rules()):
        click.echo(f"  #{i} {rule.source:<20} {rule.pattern:<50} -> {rule.type}")


@recipe.command("from-flags", context_settings={"ignore_unknown_options": True})
@click.argument("flags", nargs=-1, type=click.UNPROCESSED, required=True)
@click.option("--name", default="from-flags", show_default=True, help="Recipe name.")
@click.option("--mtp-block", type=int, default=None, help="Turn blk.N. in patterns into the {mtp} placeholder.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="Write the TOML here.")
@handle_errors
def recipe_from_flags(flags: tuple[str, ...], name: str, mtp_block: int | None, output: str | None) -> None:
    """Make a recipe from llama-quantize flags, e.g.

    ggufmtp recipe from-flags -- --tensor-type 'blk\\.40\\.nextn\\.eh_proj=q8_0' in.gguf out.gguf Q4_K_M
    """
    from .recipe import Recipe

    text = Recipe.from_flags(list(flags), name=name, mtp_block=mtp_block).to_toml()
    if output:
        from .fsutil import atomic_write_text

        atomic_write_text(Path(output), text)
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(text, nl=False)


recipe_option = click.option("--recipe", "-r", "recipe_name", required=True,
                             help="Shipped recipe name (see `ggufmtp recipe list`) or a .toml file.")
imatrix_option = click.option("--imatrix", type=click.Path(dir_okay=False), default=None,
                              help="Importance matrix (.dat or GGUF imatrix).")


@main.command()
@click.argument("model")
@recipe_option
@imatrix_option
@click.option("--emit", type=click.Choice(["table", "llama-quantize"]), default="table", show_default=True,
              help="llama-quantize: print the exact equivalent llama-quantize command line instead.")
@click.option("--out", "out_name", default="OUT.gguf", show_default=True, help="Output name for --emit llama-quantize.")
@click.option("--all", "show_all", is_flag=True, help="Show every tensor (default: the first 40 and the MTP block).")
@json_option
@handle_errors
def plan(model: str, recipe_name: str, imatrix: str | None, emit: str, out_name: str, show_all: bool,
         as_json: bool) -> None:
    """Dry-run RECIPE on MODEL: per-tensor types as llama.cpp will choose them, with reasons.

    Exits 1 when a pre-flight check fails (listed as errors)."""
    from .plan import format_plan, make_plan

    p = make_plan(resolve_model_arg(model), recipe_name, imatrix)
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


@main.command()
@click.argument("model")
@recipe_option
@imatrix_option
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Output GGUF.")
@click.option("--threads", "-t", type=int, default=0, help="Quantization threads (0: all cores).")
@click.option("--receipt", type=click.Path(dir_okay=False), default=None,
              help="Receipt path (default: OUTPUT.receipt.json).")
@click.option("--no-receipt", is_flag=True, help="Do not write a receipt.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@json_option
@handle_errors
def quantize(model: str, recipe_name: str, imatrix: str | None, output: str, threads: int, receipt: str | None,
             no_receipt: bool, no_progress: bool, as_json: bool) -> None:
    """Quantize MODEL with RECIPE into OUTPUT (in-process libllama), audit it, write its receipt."""
    from .quantize import quantize as run

    res = run(resolve_model_arg(model), recipe_name, output, imatrix=imatrix, threads=threads,
              progress=not no_progress and not as_json)
    out: dict[str, Any] = res.to_dict()
    if not no_receipt:
        from .receipt import receipt_for_quantize

        rpath = receipt_for_quantize(res, model_arg=model, imatrix=imatrix, receipt_path=receipt)
        out["receipt"] = str(rpath)
    if as_json:
        emit_json(out)
        return
    for w in res.plan.warnings:
        click.echo(f"warning: {w}", err=True)
    for c in res.checks:
        click.echo(f"{'PASS' if c.ok else 'FAIL'}  {c.name}: {c.detail}")
    m = res.plan.mtp_summary()
    click.echo(f"wrote {res.output} ({res.size_bytes} bytes, {res.plan.bpw:.3f} bpw) in {res.seconds:.1f}s; "
               f"MTP blk.{m['block']} {m['status']}, eh_proj {m['eh_proj']}")
    if "receipt" in out:
        click.echo(f"receipt {out['receipt']}")


# --- imatrix: inspect, check against a model, convert --------------------------------------------
@main.group("imatrix")
def imatrix_group() -> None:
    """Importance matrices (llama-imatrix GGUF or legacy .dat files)."""


@imatrix_group.command("info")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--model", "model_arg", default=None,
              help="Model GGUF (or builtin:NAME) to validate against and to report coverage for.")
@json_option
@handle_errors
def imatrix_info_cmd(file: str, model_arg: str | None, as_json: bool) -> None:
    """Summarize FILE; with --model, check it against the model and list tensors without statistics
    (the MTP block separately: llama-imatrix never collects it). Exits 1 when the check finds errors."""
    from . import imatrix as imx

    im = imx.read_imatrix(file)
    out = imx.ImatrixInfo.from_imatrix(im).to_dict()
    report = cov = None
    if model_arg:
        mt = imx.read_model_tensors(resolve_model_arg(model_arg))
        report = imx.validate(im, mt, strict=False)  # an imatrix for another model raises
        cov = imx.coverage(im, mt)
        out["model"] = mt.path
        out["coverage"] = cov.to_dict()
        out["validation"] = report.to_dict()
    if as_json:
        emit_json(out)
    else:
        click.echo(f"{out['path']}: {out['format']} imatrix, {out['entries']} entries, "
                   f"{out['chunk_count']} chunks" + (f" of {out['chunk_size']}" if out["chunk_size"] else ""))
        click.echo(f"sha256 {out['sha256']}")
        click.echo("datasets: " + (", ".join(out["datasets"]) if out["datasets"] else "(none)"))
        if not out["has_metadata"]:
            click.echo("warning: no imatrix.datasets/chunk_count/chunk_size metadata (llama-quantize refuses it)")
        if cov is not None and report is not None:
            click.echo(f"model {out['model']}: {len(cov.covered)} of {len(cov.quantizable)} quantizable tensors "
                       f"covered, {report.matched} of {report.entries} entries match")
            for label, names in (("missing", cov.missing), ("missing (MTP block)", cov.missing_mtp),
                                 ("missing (token_embd/output, never required)", cov.missing_exempt)):
                if names:
                    click.echo(f"{label}: {len(names)}")
                    for n in names:
                        click.echo(f"  {n}")
            for p in report.problems:
                click.echo(f"{p.severity}: {p.message}")
    if report is not None and not report.ok:
        sys.exit(1)


@imatrix_group.command("convert")
@click.argument("src", type=click.Path(dir_okay=False))
@click.argument("dst", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(["dat", "gguf"]), required=True, help="Output format.")
@click.option("--chunk-size", type=click.IntRange(min=1), default=None,
              help="Tokens per chunk for .dat -> GGUF (llama-imatrix -c; default 512), or for GGUF -> .dat "
                   "when the file has none.")
@json_option
@handle_errors
def imatrix_convert_cmd(src: str, dst: str, fmt: str, chunk_size: int | None, as_json: bool) -> None:
    """Convert SRC to DST in another format (what is lost is printed as notes)."""
    from . import imatrix as imx

    im = imx.read_imatrix(src)
    notes = imx.conversion_losses(im, fmt)  # type: ignore[arg-type]
    conv = imx.convert_imatrix(im, fmt, chunk_size=chunk_size)  # type: ignore[arg-type]
    digest = imx.write_imatrix(conv, dst)
    if as_json:
        emit_json({"src": src, "dst": dst, "from_format": im.format, "format": fmt, "sha256": digest,
                   "entries": len(conv.entries), "notes": notes})
    else:
        click.echo(f"wrote {dst} ({fmt}, {len(conv.entries)} entries) from {src} ({im.format})")
        for n in notes:
            click.echo(f"note: {n}")


# --- receipts & audit ----------------------------------------------------------------------------
@main.group()
def receipt() -> None:
    """Provenance receipts (in-toto Statement v1 with the ggufmtp predicate)."""


@receipt.command("show")
@click.argument("receipt_path", type=click.Path(dir_okay=False))
@json_option
@handle_errors
def receipt_show(receipt_path: str, as_json: bool) -> None:
    """Render a receipt for people (or print it as JSON)."""
    from .receipt import format_receipt, load_receipt

    st = load_receipt(receipt_path)
    if as_json:
        emit_json(st)
    else:
        click.echo(format_receipt(st))


@receipt.command("schema")
def receipt_schema() -> None:
    """Print the receipt's JSON Schema."""
    from .receipt import SCHEMA_PATH

    click.echo(SCHEMA_PATH.read_text(), nl=False)


@main.command()
@click.argument("artifact", type=click.Path(dir_okay=False))
@click.option("--receipt", "receipt_path", type=click.Path(dir_okay=False), default=None,
              help="Receipt to audit against (default: ARTIFACT.receipt.json if it exists).")
@json_option
@handle_errors
def audit(artifact: str, receipt_path: str | None, as_json: bool) -> None:
    """Recompute sha256s, re-read tensor types and check the MTP block against the receipt.

    Exits 1 on any mismatch, naming it."""
    from .audit import audit as run, format_audit

    report = run(artifact, receipt_path, progress=not as_json)
    if as_json:
        emit_json(report.to_dict())
    else:
        click.echo(format_audit(report))
    if not report.ok:
        sys.exit(1)
