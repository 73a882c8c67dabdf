"""ggufmtp runtime build/path and doctor."""

from __future__ import annotations

import sys

import click

from .app import bin_option, emit_json, handle_errors, json_option, main


@main.group()
def runtime() -> None:
    """The pinned llama.cpp runtime: its binaries and libllama.

    The binaries: llama-server, llama-quantize, llama-imatrix, llama-perplexity, llama-gguf-split and
    llama-fit-params."""


@runtime.command("build")
@click.option("--cuda", is_flag=True, help="Build with CUDA (needs nvcc).")
@click.option("--cuda-arch", default="90", show_default=True, help="CUDA architecture, e.g. 90 for H100/H200.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None, help="Parallel build jobs (default: all cores).")
@click.option("--force", is_flag=True, help="Rebuild even if the cache already has this variant.")
@json_option
@handle_errors
def runtime_build(cuda: bool, cuda_arch: str, jobs: int | None, force: bool, as_json: bool) -> None:
    """Build the pinned llama.cpp from the llama-cpp-python sdist into the per-user cache (a runtime
    already there gets the binaries it lacks, e.g. llama-fit-params, without a rebuild)."""
    from ..runtime import build as rt

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
    from ..runtime import build as rt

    click.echo(str(rt.find_binary("llama-server", llama_cpp_bin).parent))


@main.command()
@bin_option
@json_option
@handle_errors
def doctor(llama_cpp_bin: str | None, as_json: bool) -> None:
    """Check versions, the llama.cpp commit of libllama and every binary, and draft-mtp support."""
    from ..runtime.doctor import format_doctor, run_doctor

    report = run_doctor(llama_cpp_bin)
    if as_json:
        emit_json(report.to_dict())
    else:
        click.echo(format_doctor(report))
    if not report.ok:
        sys.exit(1)
