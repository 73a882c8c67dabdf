"""ggufmtp imatrix info and convert."""

from __future__ import annotations

import sys

import click

from .app import emit_json, handle_errors, json_option, main, resolve_model_arg


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
