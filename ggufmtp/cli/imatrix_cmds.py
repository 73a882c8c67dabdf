"""ggufmtp imatrix info, convert and compute."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from .app import emit_json, handle_errors, json_option, main, resolve_model_arg
from .options import ctx_size_option, gpu_layers_option, output_option, threads_option

if TYPE_CHECKING:
    from ..imatrix.check import Coverage


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
    from ..imatrix.check import coverage, read_model_tensors, validate
    from ..imatrix.compute import ImatrixProvenance
    from ..imatrix.format import ImatrixInfo, read_imatrix

    im = read_imatrix(file)
    out = ImatrixInfo.from_imatrix(im).to_dict()
    report = cov = None
    if model_arg:
        mt = read_model_tensors(resolve_model_arg(model_arg))
        report = validate(im, mt, strict=False)  # an imatrix for another model raises
        cov = coverage(im, mt)
        out["model"] = mt.path
        out["coverage"] = cov.to_dict()
        out["validation"] = report.to_dict()
        out["mtp_coverage"] = _mtp_coverage(cov)
    prov = ImatrixProvenance.from_imatrix(im)
    out["computed"] = prov.to_dict() if prov is not None else None
    if as_json:
        emit_json(out)
    else:
        click.echo(f"{out['path']}: {out['format']} imatrix, {out['entries']} entries, "
                   f"{out['chunk_count']} chunks" + (f" of {out['chunk_size']}" if out["chunk_size"] else ""))
        click.echo(f"sha256 {out['sha256']}")
        click.echo("datasets: " + (", ".join(out["datasets"]) if out["datasets"] else "(none)"))
        if not out["has_metadata"]:
            click.echo("warning: no imatrix.datasets/chunk_count/chunk_size metadata (llama-quantize refuses it)")
        if out.get("computed"):
            c = out["computed"]
            click.echo(f"computed by ggufmtp: corpus {c['corpus']['name']} (sha256 {c['corpus']['sha256']}), "
                       f"{c['chunks']} chunks of {c['ctx_size']}, llama.cpp {c['runtime_commit']}, "
                       + (f"MTP statistics: {c['mtp_entries']} entries" if c["mtp"] else "no MTP statistics"))
        if cov is not None and report is not None:
            click.echo(f"model {out['model']}: {len(cov.covered)} of {len(cov.quantizable)} quantizable tensors "
                       f"covered, {report.matched} of {report.entries} entries match")
            mtp = out["mtp_coverage"]
            if mtp["tensors"]:
                click.echo(f"MTP block: {mtp['covered']} of {mtp['tensors']} quantizable tensors covered")
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
    from ..imatrix.check import refuse_unusable_values
    from ..imatrix.entries import conversion_losses, convert_imatrix
    from ..imatrix.format import read_imatrix, write_imatrix

    im = read_imatrix(src)
    refuse_unusable_values(im)  # NaN or negative values would be carried into the new file
    notes = conversion_losses(im, fmt)
    conv = convert_imatrix(im, fmt, chunk_size=chunk_size)
    digest = write_imatrix(conv, dst)
    if as_json:
        emit_json({"src": src, "dst": dst, "from_format": im.format, "format": fmt, "sha256": digest,
                   "entries": len(conv.entries), "notes": notes})
    else:
        click.echo(f"wrote {dst} ({fmt}, {len(conv.entries)} entries) from {src} ({im.format})")
        for n in notes:
            click.echo(f"note: {n}")


def _mtp_coverage(cov: Coverage) -> dict[str, int]:
    """How many quantizable tensors of the MTP block(s) have statistics (llama-imatrix collects none)."""
    covered = sum(1 for n in cov.covered if any(n.startswith(f"blk.{b}.") for b in cov.mtp_blocks))
    return {"tensors": covered + len(cov.missing_mtp), "covered": covered}


@imatrix_group.command("compute")
@click.argument("model")
@click.option("--corpus", "corpus_ref", default="builtin:calib-v1", show_default=True,
              help="Calibration text: a UTF-8 file or builtin:calib-v1 (code, math, prose and chat).")
@output_option("the GGUF imatrix to write (atomically; nothing is left on failure).", required=True)
@click.option("--chunks", type=click.IntRange(min=1), default=None, help="At most N chunks of --ctx-size tokens (default: all).")
@ctx_size_option("llama-imatrix's: tokens per chunk.", default=512, min_ctx=1)
@gpu_layers_option("llama-imatrix's.")
@threads_option("llama-imatrix's; default: llama.cpp's.")
@click.option("--mtp", is_flag=True,
              help="Also collect statistics for the MTP (NextN) block and merge them into the same file.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@json_option
@handle_errors
def imatrix_compute_cmd(model: str, corpus_ref: str, output: str, chunks: int | None, ctx_size: int,
                        gpu_layers: int | str | None, threads: int | None, mtp: bool, no_progress: bool,
                        as_json: bool) -> None:
    """Compute the importance matrix of MODEL (a GGUF or builtin:NAME) with the pinned llama-imatrix
    over a text corpus; records the corpus sha256, chunks, context size and runtime commit in the file."""
    from ..imatrix.compute import compute_imatrix

    res = compute_imatrix(resolve_model_arg(model), corpus_ref, output, chunks=chunks, ctx_size=ctx_size,
                          gpu_layers=gpu_layers, threads=threads, mtp=mtp, progress=not no_progress and not as_json)
    if as_json:
        emit_json(res.to_dict())
        return
    p = res.provenance
    click.echo(f"wrote {res.path} ({res.entries} entries, {p.chunks} chunks of {p.ctx_size} tokens"
               + (f", {p.mtp_entries} MTP entries" if p.mtp else "") + ")")
    click.echo(f"sha256 {res.sha256}")
    click.echo(f"corpus {p.corpus_name} sha256 {p.corpus_sha256}; llama.cpp {p.runtime_commit}; "
               + (f"one pass over the trunk and the MTP block {res.mtp_s:.1f} s" if p.mtp
                  else f"llama-imatrix {res.llama_imatrix_s:.1f} s"))
    for n in res.notes:
        click.echo(f"note: {n}")
