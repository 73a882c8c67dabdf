"""The ``ggufmtp`` command line: a thin click layer over the Python API.

Every command prints for people by default and JSON with ``--json``; a ``GgufmtpError`` becomes
one ``error: ...`` line on stderr and exit status 1 (2 for usage errors, click's convention).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
from pathlib import Path
from typing import Any, Callable

import click

from .._version import __version__
from ..errors import GgufmtpError


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


# --- inspect -------------------------------------------------------------------------------------
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


def resolve_model_arg(model: str) -> str:
    """``builtin:NAME`` → the synthesized model's path (made once, cached); else the path."""
    if model.startswith("builtin:"):
        from ..synth.factory import builtin_path

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
    from ..quant.recipe import Recipe, shipped_recipes

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
    from ..quant.recipe import Recipe

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
    from ..quant.recipe import Recipe

    text = Recipe.from_flags(list(flags), name=name, mtp_block=mtp_block).to_toml()
    if output:
        from ..gguf.fsutil import atomic_write_text

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
    from ..quant.plan import format_plan, make_plan

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
    from ..quant.quantize import quantize as run

    res = run(resolve_model_arg(model), recipe_name, output, imatrix=imatrix, threads=threads,
              progress=not no_progress and not as_json)
    out: dict[str, Any] = res.to_dict()
    if not no_receipt:
        from ..provenance.receipt import receipt_for_quantize

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
    from ..imatrix import format as imx

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
    from ..imatrix import format as imx

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
    from ..provenance.receipt import format_receipt, load_receipt

    st = load_receipt(receipt_path)
    if as_json:
        emit_json(st)
    else:
        click.echo(format_receipt(st))


@receipt.command("schema")
def receipt_schema() -> None:
    """Print the receipt's JSON Schema."""
    from ..provenance.receipt import SCHEMA_PATH

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
    from ..provenance.audit import audit as run, format_audit

    report = run(artifact, receipt_path, progress=not as_json)
    if as_json:
        emit_json(report.to_dict())
    else:
        click.echo(format_audit(report))
    if not report.ok:
        sys.exit(1)


# --- synth: synthetic MTP test models (ggufmtp/synth.py) -----------------------------------------


def _calibrate_head(spec, target: float, k: int, suite_name: str, max_tokens: int):
    """synth --target-acceptance: the calibrated fraction (ggufmtp.synth.calibrate_wrong_fraction)."""
    from ..measure.suite import load_suite
    from ..synth.factory import calibrate_wrong_fraction, chat_last_tokens

    if spec.wrong_successor_fraction or spec.eh_proj_noise or not spec.mtp or spec.mtp_only:
        raise click.UsageError("--target-acceptance sets the wrong-successor fraction itself: leave out "
                               "--wrong-successor-fraction, --eh-proj-noise, --no-mtp and --mtp-only")
    suite = load_suite(suite_name)
    last = chat_last_tokens([p.chat_messages() for p in suite.prompts])
    return calibrate_wrong_fraction(target, k, last, max_tokens, base=spec)


@main.command()
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--arch", type=click.Choice(["qwen35moe", "qwen35"]), default="qwen35moe", show_default=True)
@click.option("--shape", type=click.Choice(["tiny", "qwen3.6-35b-a3b"]), default="tiny", show_default=True,
              help="tiny (a few MB) or the real Qwen3.6-35B-A3B per-layer dimensions (GBs).")
@click.option("--layers", type=click.IntRange(1, 200), default=4, show_default=True, help="Trunk layers.")
@click.option("--no-mtp", is_flag=True, help="Leave out the MTP block (nextn_predict_layers 0).")
@click.option("--mtp-only", is_flag=True, help="Write an MTP-only sidecar (use with --spec-draft-model).")
@click.option("--seed", type=click.IntRange(0), default=0, show_default=True)
@click.option("--wrong-successor-fraction", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="Fraction of tokens after which the MTP head drafts a wrong token.")
@click.option("--eh-proj-noise", type=click.FloatRange(0), default=0.0, show_default=True,
              help="Relative RMS of gaussian noise added to nextn.eh_proj's output.")
@click.option("--omit-tensor", "omit", multiple=True, metavar="NAME",
              help="Leave this MTP-block tensor out (e.g. nextn.hnorm); repeatable.")
@click.option("--target-acceptance", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=None,
              help="Instead of --wrong-successor-fraction: the fraction whose exact acceptance on --suite "
                   "(chat replies of --max-tokens, temperature 0, draft-n-max --target-k) is nearest this. "
                   "Starts a CPU llama-server on the built-in tiny model to tokenize the prompts.")
@click.option("--target-k", type=click.IntRange(1, 16), default=3, show_default=True,
              help="draft-n-max at which --target-acceptance is measured.")
@click.option("--suite", "suite_name", default="chat-v1", show_default=True, metavar="NAME|PATH",
              help="Prompt suite for --target-acceptance.")
@click.option("--max-tokens", type=click.IntRange(2), default=128, show_default=True,
              help="Reply length for --target-acceptance (verify's --max-tokens).")
@json_option
@handle_errors
def synth(out: str, arch: str, shape: str, layers: int, no_mtp: bool, mtp_only: bool, seed: int,
          wrong_successor_fraction: float, eh_proj_noise: float, omit: tuple[str, ...],
          target_acceptance: float | None, target_k: int, suite_name: str, max_tokens: int, as_json: bool) -> None:
    """Write a synthetic BF16 GGUF with an MTP head whose behaviour is known exactly."""
    from ..synth.factory import SynthSpec, synthesize

    spec = SynthSpec(arch=arch, shape=shape, layers=layers, mtp=not no_mtp, seed=seed,
                     wrong_successor_fraction=wrong_successor_fraction, eh_proj_noise=eh_proj_noise,
                     omit_tensors=tuple(omit), mtp_only=mtp_only)
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
        emit_json({**res.to_json(), **({"calibration": calibration.to_json()} if calibration else {})})
        return
    click.echo(f"wrote {res.path} ({res.size_bytes / 2**20:.1f} MiB, {res.n_tensors} tensors)")
    click.echo(f"  arch {arch}, shape {shape}, {layers} trunk layers, "
               + (f"MTP block blk.{res.mtp_block}" if res.mtp_block is not None else "no MTP block")
               + (" (MTP-only sidecar)" if mtp_only else ""))
    if res.mtp_block is not None:
        acc = ", ".join(f"k={k}: {res.expected_acceptance(k):.3f}" for k in range(1, 5))
        click.echo(f"  expected draft acceptance (temperature 0, draft-n-max k): {acc}"
                   + (" (upper bound: eh_proj_noise has no closed form)" if eh_proj_noise else ""))
    if not res.servable:
        click.echo("  note: llama-server cannot run this file on its own "
                   + ("(use it with --spec-draft-model next to a --no-mtp model)" if mtp_only
                      else "(llama.cpp 0c1e570 needs >= 2 trunk layers for this hybrid architecture)"), err=True)


# --- hub: pull & upload (ggufmtp/hub.py) ---------------------------------------------------------
def _receipt_statement(path: Path) -> dict | None:
    """The in-toto statement in a receipt file (plain JSON or a DSSE envelope), or None."""
    import base64

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if isinstance(data, dict) and isinstance(data.get("payload"), str) and "payloadType" in data:
        try:
            data = json.loads(base64.b64decode(data["payload"]))
        except ValueError:
            return None
    return data if isinstance(data, dict) else None


def _receipt_commit_facts(receipts: list[Path], artifacts: list[Path]) -> tuple[str | None, str | None]:
    """(recipe name, artifact sha256) for the commit message, read from the receipts when they have
    ``predicate.recipe.name`` and ``subject[i].digest.sha256``; (None, None) parts otherwise."""
    names = [a.name for a in artifacts]
    recipe, digests = None, []  # digests: (rank, sha256); lower rank = better match to the artifacts
    for r in receipts:
        stmt = _receipt_statement(r)
        if stmt is None:
            click.echo(f"note: {r} is not a JSON receipt; the commit message will not name its recipe", err=True)
            continue
        pred = stmt.get("predicate")
        rec = pred.get("recipe") if isinstance(pred, dict) else None
        if recipe is None and isinstance(rec, dict) and isinstance(rec.get("name"), str):
            recipe = rec["name"]
        subjects = stmt.get("subject")
        for s in subjects if isinstance(subjects, list) else []:
            dig = s.get("digest") if isinstance(s, dict) else None
            sha = dig.get("sha256") if isinstance(dig, dict) else None
            if not isinstance(sha, str):
                continue
            name = Path(str(s.get("name", ""))).name
            digests.append((names.index(name) if name in names else len(names), sha.lower()))
    digests.sort(key=lambda t: t[0])
    return recipe, (digests[0][1] if digests else None)


@main.command("pull")
@click.argument("repo_id")
@click.option("--revision", default=None, help="Branch, tag or commit to pull (default: the default branch). "
              "Resolved to a commit sha once; every file comes from that commit.")
@click.option("--include", "include", multiple=True, metavar="PATTERN",
              help="Only files matching this fnmatch pattern (repeatable), e.g. --include '*Q8_0*.gguf'. "
                   "A split GGUF's shards come together.")
@click.option("--local-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Put the files here (default: the Hugging Face cache).")
@json_option
@handle_errors
def pull_cmd(repo_id: str, revision: str | None, include: tuple[str, ...], local_dir: Path | None,
             as_json: bool) -> None:
    """Download a model repo (or index a local directory), verify every file's checksum, write a manifest.

    REPO_ID is namespace/name on the Hub, or a local directory. Tokens come from HF_TOKEN or
    `hf auth login`; HF_ENDPOINT selects another Hub; HF_HUB_OFFLINE=1 uses the cache only.
    """
    from ..hub import hub

    res = hub.pull(repo_id, revision=revision, include=list(include) or None, local_dir=local_dir)
    if as_json:
        emit_json({**res.to_dict(), "manifest_path": str(res.manifest_path),
                   "model_path": str(res.model_path) if res.model_path else None})
        return
    what = res.repo_id or str(res.local_dir)
    at = f" @ {res.resolved_commit}" if res.resolved_commit else ""
    asked = f" (revision {res.requested_revision})" if res.requested_revision else ""
    click.echo(f"{what}{at}{asked}: {len(res.files)} file(s), {hub._fmt_size(res.total_size)}, from {res.source}")
    unverified = [f.path for f in res.files if not f.verified]
    if not unverified:
        click.echo("  all files match the Hub's checksums")
    else:
        click.echo(f"  {len(unverified)} file(s) have no Hub checksum to compare with (sha256 recorded): "
                   + ", ".join(unverified[:5]) + (" ..." if len(unverified) > 5 else ""))
    for m in res.gguf_models:
        shards = f" ({len(m.shards)} shards)" if len(m.shards) > 1 else ""
        click.echo(f"  model: {res.local_dir / m.entry}{shards}")
    if len(res.gguf_models) > 1:
        click.echo("  several GGUF models: pick one with --include", err=True)
    click.echo(f"  manifest: {res.manifest_path}")


@main.command("upload")
@click.argument("repo_id")
@click.argument("artifacts", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--receipt", "receipts", multiple=True, required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Receipt of the artifact(s) (repeatable); uploaded next to them.")
@click.option("--card", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Model card, uploaded as README.md.")
@click.option("--private", is_flag=True, help="Create the repo private (no effect on an existing repo).")
@click.option("--revision", default=None, metavar="BRANCH", help="Branch to commit to (created if missing; "
              "default main).")
@click.option("--dry-run", is_flag=True, help="List what would be uploaded, touch no network.")
@json_option
@handle_errors
def upload_cmd(repo_id: str, artifacts: tuple[Path, ...], receipts: tuple[Path, ...], card: Path | None, private: bool,
           revision: str | None, dry_run: bool, as_json: bool) -> None:
    """Publish ARTIFACT(s) with their receipt(s) and model card to REPO_ID, in one commit.

    The commit message names the recipe and the artifact's sha256 (from the receipt).
    Tokens come from HF_TOKEN or `hf auth login`, never from the command line.
    """
    from ..hub import hub

    recipe, sha = _receipt_commit_facts(list(receipts), list(artifacts))
    res = hub.upload(repo_id, list(artifacts), list(receipts), card=card, private=private, revision=revision,
                     dry_run=dry_run, recipe_name=recipe, artifact_sha256=sha)
    if as_json:
        emit_json(res.to_dict())
        return
    head = "dry run, nothing sent: would commit" if res.dry_run else "committed"
    click.echo(f"{head} {len(res.operations)} file(s), {hub._fmt_size(res.total_size)}, to "
               f"{res.repo_id} @ {res.revision} on {res.endpoint_host}")
    for op in res.operations:
        digest = f"  sha256 {op.sha256}" if op.sha256 else ""
        click.echo(f"  {op.path_in_repo:<40} {hub._fmt_size(op.size):>10}  {op.kind}{digest}")
    click.echo(f"  message: {res.commit_message}")
    if res.commit_sha:
        click.echo(f"  commit: {res.commit_sha}  {res.commit_url or ''}".rstrip())


# --- card & the whole pipeline -------------------------------------------------------------------
@main.command()
@click.argument("artifact", type=click.Path(dir_okay=False))
@click.option("--receipt", "receipt_path", type=click.Path(dir_okay=False), default=None,
              help="The artifact's receipt (default: ARTIFACT.receipt.json).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Where to write the card (default: README.md beside the artifact).")
@click.option("--quantized-by", default="ggufmtp", show_default=True, help="The card's quantized_by field.")
@click.option("--license", "license_", default=None, help="License (default: inherited from the base model).")
@handle_errors
def card(artifact: str, receipt_path: str | None, output: str | None, quantized_by: str, license_: str | None) -> None:
    """Write a Hugging Face model card for ARTIFACT from its receipt (and its verification)."""
    from ..provenance.card import make_card
    from ..provenance.receipt import default_receipt_path

    path = make_card(artifact, receipt_path or default_receipt_path(Path(artifact)), output, quantized_by, license_)
    click.echo(str(path))


@main.command("run")
@recipe_option
@click.option("--model", "-m", required=True, help="REPO_ID[@REVISION], a local GGUF, or builtin:NAME.")
@imatrix_option
@click.option("-o", "--out-dir", default="ggufmtp-out", show_default=True, type=click.Path(file_okay=False),
              help="Output directory; also holds the per-stage cache that makes reruns resume.")
@click.option("--include", multiple=True, help="With a Hub repo: only pull files matching this pattern (repeatable).")
@click.option("--no-verify", is_flag=True, help="Skip runtime verification with llama-server.")
@click.option("--upload", "upload_repo", default=None, help="Publish artifact, receipt and card to this Hub repo.")
@click.option("--private", is_flag=True, help="Create the Hub repo private.")
@click.option("--dry-run-upload", is_flag=True, help="List the upload's operations without sending anything.")
@click.option("--seeds", default=None, help="Verification seeds, e.g. 42,1337,2024.")
@click.option("--limit", type=int, default=None, help="Verify on the first N prompts of the suite only.")
@click.option("--max-tokens", type=int, default=None, help="Tokens generated per verification request.")
@click.option("--gpu-layers", type=int, default=None, help="Layers offloaded to the GPU during verification.")
@click.option("--threads", "-t", type=int, default=0, help="Threads for quantization.")
@click.option("--force", is_flag=True, help="Ignore cached stage results and rerun everything.")
@json_option
@handle_errors
def run_cmd(recipe_name: str, model: str, imatrix: str | None, out_dir: str, include: tuple[str, ...],
            no_verify: bool, upload_repo: str | None, private: bool, dry_run_upload: bool, seeds: str | None,
            limit: int | None, max_tokens: int | None, gpu_layers: int | None, threads: int, force: bool,
            as_json: bool) -> None:
    """Checkpoint to verified, receipted artifact: pull, inspect, plan, quantize, audit, verify,
    receipt, card, upload. Reruns resume from the first stage whose inputs changed or that failed."""
    from ..pipeline import format_summary, run

    vopts: dict[str, Any] = {}
    if seeds:
        vopts["seeds"] = tuple(int(s) for s in seeds.split(",") if s.strip())
    if limit is not None:
        vopts["limit"] = limit
    if max_tokens is not None:
        vopts["max_tokens"] = max_tokens
    if gpu_layers is not None:
        vopts["gpu_layers"] = gpu_layers
    res = run(recipe_name, model, imatrix, out_dir, verify=not no_verify, upload=upload_repo,
              include=list(include) or None, verify_options=vopts, threads=threads, private=private,
              dry_run_upload=dry_run_upload, force=force, progress=not as_json,
              log=lambda m: click.echo(m, err=True))
    s = res.summary()
    if as_json:
        emit_json(s)
    else:
        click.echo(format_summary(s))
    if s.get("verdict") == "fail":
        sys.exit(1)


# --- verify: runtime verification with llama-server (ggufmtp/verify.py) -------------------------
def _number_list(value: str | None, what: str, cast: Callable[[str], Any], kind: str) -> list | None:
    if value is None:
        return None
    try:
        out = [cast(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected comma-separated {kind}", param_hint=what) from None
    if not out:
        raise click.BadParameter(f"{value!r}: no values", param_hint=what)
    return out


def _int_list(value: str | None, what: str) -> list[int] | None:
    return _number_list(value, what, int, "integers")


@main.command("verify")
@click.argument("model")
@click.option("--draft-n-max", type=click.IntRange(min=1), default=None,
              help="Draft window k (--spec-draft-n-max). Default: the recipe's, else 4.")
@click.option("--draft-n-min", type=click.IntRange(min=0), default=None, help="--spec-draft-n-min for the MTP arm.")
@click.option("--seeds", default="42,1337,2024", show_default=True, help="Comma-separated request seeds.")
@click.option("--suite", default="chat-v1", show_default=True, help="Prompt suite: a shipped name or a JSONL file.")
@click.option("--max-tokens", type=click.IntRange(min=2), default=128, show_default=True, help="Tokens per reply.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Use only the first N prompts (quick runs).")
@click.option("--raw", is_flag=True, help="Also send the prompts to /completion without the chat template (own arm).")
@click.option("--sweep", default=None, help="Draft windows to compare, e.g. 2,3,4,6,8 (the shipped k is always included).")
@click.option("--recipe", "-r", "recipe_name", default=None,
              help="Take min_acceptance/min_speedup/draft_n_max from this recipe's [verify] table.")
@click.option("--min-acceptance", type=click.FloatRange(0, 1), default=None, help="Minimum acceptance (0-1).")
@click.option("--min-speedup", type=click.FloatRange(min=0), default=None, help="Minimum decode speedup.")
@click.option("--min-identical", type=click.FloatRange(0, 1), default=1.0, show_default=True,
              help="Minimum fraction of MTP replies identical to vanilla.")
@click.option("--enforce-speedup", is_flag=True, help="Check the speedup threshold on CPU runs too.")
@click.option("--gpu-layers", "-ngl", default=None, help="--n-gpu-layers for both servers (e.g. 999).")
@click.option("--threads", "-t", type=click.IntRange(min=1), default=None, help="llama-server --threads.")
@click.option("--ctx-size", "-c", type=click.IntRange(min=256), default=4096, show_default=True, help="--ctx-size.")
@click.option("--parallel", type=click.IntRange(min=1), default=1, show_default=True,
              help="llama-server --parallel (requests are still sent one at a time).")
@click.option("--tuned-from", "tuned_from", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Run the MTP arm with the configuration `ggufmtp tune` recommended (a receipt or a tune "
                   "--out JSON) against default vanilla: confirms the tuned speedup on the full suite.")
@click.option("--peak-bandwidth", "peak_bandwidth_gbs", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Peak memory bandwidth in GB/s for the bandwidth fraction (default: known GPUs by name).")
@click.option("--receipt", "receipt_path", type=click.Path(dir_okay=False), default=None,
              help="Write the results into this receipt's verification section.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None,
              help="Write the full JSON (with every request) here, atomically.")
@bin_option
@json_option
@handle_errors
def verify_cmd(model: str, draft_n_max: int | None, draft_n_min: int | None, seeds: str, suite: str, max_tokens: int,
               limit: int | None, raw: bool, sweep: str | None, recipe_name: str | None, min_acceptance: float | None,
               min_speedup: float | None, min_identical: float, enforce_speedup: bool, gpu_layers: str | None,
               threads: int | None, ctx_size: int, parallel: int, tuned_from: str | None,
               peak_bandwidth_gbs: float | None, receipt_path: str | None, out_path: str | None,
               llama_cpp_bin: str | None, as_json: bool) -> None:
    """Verify MODEL's MTP head with a real llama-server: vanilla vs --spec-type draft-mtp, interleaved.

    Reports draft acceptance and decode speedup with 95% bootstrap CIs (overall, per category, per
    seed), per-position acceptance, and whether MTP output equals vanilla output at temperature 0.
    Exits 1 when the verdict fails. The speedup threshold applies only with GPU offload (or
    --enforce-speedup). With --tuned-from, the MTP arm uses a tuned configuration. Also reports the
    fraction of the memory-bandwidth limit each arm reached. MODEL may be builtin:NAME."""
    from ..measure.tune import load_tuned_config
    from ..measure.verify import Thresholds, verify

    seed_list = _int_list(seeds, "--seeds")
    sweep_list = _int_list(sweep, "--sweep")
    ngl = _ngl(gpu_layers)
    src, acc, spd = [], None, None
    if recipe_name:
        from ..quant.recipe import Recipe

        rec = Recipe.load(recipe_name)
        acc, spd = rec.verify.min_acceptance, rec.verify.min_speedup
        if draft_n_max is None and not tuned_from:
            draft_n_max = rec.verify.draft_n_max
        src.append(f"recipe {rec.name}")
    if min_acceptance is not None or min_speedup is not None:
        acc = min_acceptance if min_acceptance is not None else acc
        spd = min_speedup if min_speedup is not None else spd
        src.append("flags")
    th = Thresholds(min_acceptance=acc, min_speedup=spd, min_identical=min_identical,
                    enforce_speedup=enforce_speedup, source=" + ".join(src) or "none")
    res = verify(resolve_model_arg(model), draft_n_max=draft_n_max, draft_n_min=draft_n_min, seeds=seed_list,
                 suite=suite, max_tokens=max_tokens, raw=raw, ctx_size=ctx_size, threads=threads, gpu_layers=ngl,
                 parallel=parallel, llama_cpp_bin=llama_cpp_bin, progress=not as_json, thresholds=th, limit=limit,
                 sweep=sweep_list, tuned=load_tuned_config(tuned_from) if tuned_from else None,
                 peak_bandwidth_gbs=peak_bandwidth_gbs)
    if out_path:
        from ..gguf.fsutil import atomic_write_json

        atomic_write_json(Path(out_path), res.to_dict(requests=True))
    if receipt_path:
        from ..provenance.receipt import set_verification

        set_verification(receipt_path, res.to_receipt(), keep_added=True)
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
    if not res.ok:
        sys.exit(1)


# --- tune, curve, profiles: server settings search and serving profiles (ggufmtp/tune.py, profiles.py)
def _float_list(value: str | None, what: str) -> list[float] | None:
    return _number_list(value, what, float, "numbers")


def _ngl(gpu_layers: str | None) -> int | str | None:
    if gpu_layers is None:
        return None
    return int(gpu_layers) if gpu_layers.lstrip("-").isdigit() else gpu_layers


def _save_and_show(res: Any, model: str, section: str, receipt_path: str | None, out_path: str | None,
                   as_json: bool, out_data: dict[str, Any], text: str) -> None:
    """The common tail of tune, curve and profiles: the full JSON to --out, ``res.to_dict()`` as
    ``verification.<section>`` of --receipt, then JSON or the human-readable text on stdout."""
    if out_path:
        from ..gguf.fsutil import atomic_write_json

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
              final_on_suite: bool = True) -> None:
    from ..measure.tune import tune

    res = tune(resolve_model_arg(model), concurrency=concurrency, budget=budget, seeds=_int_list(seeds, "--seeds"),
               suite=suite, max_tokens=max_tokens, limit=limit, gpu_layers=_ngl(gpu_layers), threads=threads,
               ctx_per_slot=ctx_per_slot, llama_cpp_bin=llama_cpp_bin, progress=not as_json,
               final_on_suite=final_on_suite)
    _save_and_show(res, model, "tuned", receipt_path, out_path, as_json, res.to_dict(), res.table())
    if receipt_path and not as_json:
        click.echo(f"receipt {receipt_path}: verification.tuned written (verify's results kept)")


@main.command("tune")
@click.argument("model")
@click.option("--concurrency", "-C", type=click.IntRange(min=1), default=1, show_default=True,
              help="Concurrent clients to tune for (slots are searched for > 1).")
@click.option("--budget", type=click.IntRange(min=1), default=240, show_default=True,
              help="Evaluations (MTP requests, each paired with a vanilla request) the search may spend.")
@click.option("--seeds", default="42", show_default=True, help="Comma-separated request seeds.")
@click.option("--suite", default="chat-v1", show_default=True, help="Prompt suite: a shipped name or a JSONL file.")
@click.option("--max-tokens", type=click.IntRange(min=2), default=128, show_default=True, help="Tokens per reply.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Use only the first N prompts.")
@click.option("--gpu-layers", "-ngl", default=None, help="--n-gpu-layers (e.g. 999); enables the backend-sampling dimensions.")
@click.option("--threads", "-t", type=click.IntRange(min=1), default=None, help="llama-server --threads.")
@click.option("--ctx-per-slot", type=click.IntRange(min=256), default=4096, show_default=True,
              help="Context per slot (-c = slots x this).")
@click.option("--final-on-suite/--no-final-on-suite", default=True, show_default=True,
              help="Rank the finalists on the whole suite (when the budget allows), not on its first prompts.")
@click.option("--receipt", "receipt_path", type=click.Path(dir_okay=False), default=None,
              help="Store the result as verification.tuned in this receipt (verify's results are kept).")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None, help="Write the full JSON here.")
@bin_option
@json_option
@handle_errors
def tune_cmd(model: str, concurrency: int, budget: int, seeds: str, suite: str, max_tokens: int, limit: int | None,
             gpu_layers: str | None, threads: int | None, ctx_per_slot: int, final_on_suite: bool,
             receipt_path: str | None, out_path: str | None, llama_cpp_bin: str | None, as_json: bool) -> None:
    """Search MTP server settings for MODEL on this hardware (successive halving).

    Searches --spec-draft-n-max 1-8, --spec-draft-n-min, --spec-draft-p-min, backend sampling of the
    target (-bs) and drafter (GPU only), GGML_CUDA_GRAPH_OPT=1 (CUDA only) and --parallel slots
    (concurrency > 1); keeps only settings whose output equals vanilla, ranks them by speedup with
    95% CIs, recommends one and prints the exact llama-server command line. MODEL may be builtin:NAME."""
    _run_tune(model, concurrency, budget, seeds, suite, max_tokens, limit, gpu_layers, threads, ctx_per_slot,
              receipt_path, out_path, llama_cpp_bin, as_json, final_on_suite)


def _wire_verify_tune() -> None:
    """``ggufmtp verify MODEL --tune`` = ``ggufmtp tune MODEL`` with verify's options (an alias; the
    verify command itself is untouched)."""
    cmd = main.commands.get("verify")
    if cmd is None or any(p.name == "tune" for p in cmd.params):
        return
    cmd.params.extend([
        click.Option(["--tune"], is_flag=True, help="Run `ggufmtp tune` instead (alias): search server settings; "
                     "--seeds/--suite/--max-tokens/--limit/--gpu-layers/--threads/--receipt/--out/--json apply."),
        click.Option(["--budget"], type=click.IntRange(min=1), default=240, show_default=True,
                     help="With --tune: evaluations the search may spend."),
        click.Option(["--concurrency"], type=click.IntRange(min=1), default=1, show_default=True,
                     help="With --tune: concurrent clients to tune for."),
    ])
    orig = cmd.callback

    @functools.wraps(orig)
    def callback(*args, tune: bool = False, budget: int = 240, concurrency: int = 1, **kw):
        if not tune:
            return orig(*args, **kw)
        ctx = click.get_current_context()
        default = click.core.ParameterSource.DEFAULT
        seeds = "42" if ctx.get_parameter_source("seeds") == default else kw["seeds"]
        return handle_errors(_run_tune)(
            kw["model"], concurrency, budget, seeds, kw["suite"], kw["max_tokens"], kw["limit"], kw["gpu_layers"],
            kw["threads"], kw["ctx_size"], kw["receipt_path"], kw["out_path"], kw["llama_cpp_bin"], kw["as_json"])

    cmd.callback = callback


_wire_verify_tune()


@main.command("curve")
@click.argument("model")
@click.option("--rates", default="0,0.25,0.5,0.75,0.9,1", show_default=True,
              help="Synthetic acceptances (accepted/drafted at --draft-n-max), one point each.")
@click.option("--synth-len", "synth_len", default=None,
              help="Instead of --rates: --spec-synth-len values (mean accepted length incl. the target token).")
@click.option("--flag", type=click.Choice(["synth-len", "synth-rates"]), default="synth-len", show_default=True,
              help="Pass each point as --spec-synth-len or as explicit geometric --spec-synth-rates.")
@click.option("--draft-n-max", type=click.IntRange(min=1), default=3, show_default=True, help="Draft window k.")
@click.option("--seeds", default="42,1337", show_default=True, help="Comma-separated request seeds.")
@click.option("--suite", default="chat-v1", show_default=True, help="Prompt suite.")
@click.option("--limit", type=click.IntRange(min=1), default=8, show_default=True, help="Prompts per point.")
@click.option("--max-tokens", type=click.IntRange(min=2), default=128, show_default=True, help="Tokens per reply.")
@click.option("--no-real", is_flag=True, help="Skip the point of the real MTP head.")
@click.option("--gpu-layers", "-ngl", default=None, help="--n-gpu-layers (e.g. 999).")
@click.option("--threads", "-t", type=click.IntRange(min=1), default=None, help="llama-server --threads.")
@click.option("--receipt", "receipt_path", type=click.Path(dir_okay=False), default=None,
              help="Store the curve as verification.acceptance_curve in this receipt.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None, help="Write the JSON here.")
@bin_option
@json_option
@handle_errors
def curve_cmd(model: str, rates: str, synth_len: str | None, flag: str, draft_n_max: int, seeds: str, suite: str,
              limit: int, max_tokens: int, no_real: bool, gpu_layers: str | None, threads: int | None,
              receipt_path: str | None, out_path: str | None, llama_cpp_bin: str | None, as_json: bool) -> None:
    """Speedup versus acceptance on this hardware, with llama-server's synthetic acceptance
    (--spec-synth-len / --spec-synth-rates; benchmarking only): what a head of any acceptance would gain
    here, separated from the head's quality. MODEL needs an MTP block (its drafter's cost is measured)."""
    from ..measure.tune import acceptance_curve

    res = acceptance_curve(resolve_model_arg(model), rates=_float_list(rates, "--rates") or (), draft_n_max=draft_n_max,
                           synth_len=_float_list(synth_len, "--synth-len"), flag=flag, seeds=_int_list(seeds, "--seeds"),
                           suite=suite, limit=limit, max_tokens=max_tokens, gpu_layers=_ngl(gpu_layers),
                           threads=threads, llama_cpp_bin=llama_cpp_bin, include_real=not no_real,
                           progress=not as_json)
    _save_and_show(res, model, "acceptance_curve", receipt_path, out_path, as_json, res.to_dict(), res.table())


@main.command("profiles")
@click.argument("model")
@click.option("--workloads", default="A,B,C,D", show_default=True,
              help="A single decode, B prefill-bound, C contention, D chat (comma-separated).")
@click.option("--scale", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="Multiply input/output token counts (e.g. 0.0625: 512 -> 32).")
@click.option("--num-requests", type=click.IntRange(min=1), default=None, help="Requests per arm (default: per workload).")
@click.option("--draft-n-max", type=click.IntRange(min=1), default=3, show_default=True, help="MTP arm's draft window.")
@click.option("--tuned-from", "tuned_from", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Take the MTP arm's flags from this receipt's verification.tuned (or a tune --out JSON).")
@click.option("--repeats", type=click.IntRange(min=1), default=1, show_default=True,
              help="Runs per arm (alternated, requests pooled).")
@click.option("--server-arg", "server_args", multiple=True,
              help="Extra llama-server flag for both arms (repeatable), e.g. --server-arg=-bs.")
@click.option("--noise", type=click.FloatRange(0, 1), default=0.02, show_default=True,
              help="Throughput band within which MTP is not counted as helping.")
@click.option("--gpu-layers", "-ngl", default=None, help="--n-gpu-layers (e.g. 999).")
@click.option("--threads", "-t", type=click.IntRange(min=1), default=None, help="llama-server --threads.")
@click.option("--receipt", "receipt_path", type=click.Path(dir_okay=False), default=None,
              help="Store the profiles as verification.profiles in this receipt.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None,
              help="Write the full JSON (with every request) here.")
@bin_option
@json_option
@handle_errors
def profiles_cmd(model: str, workloads: str, scale: float, num_requests: int | None, draft_n_max: int,
                 tuned_from: str | None, repeats: int, server_args: tuple[str, ...], noise: float,
                 gpu_layers: str | None, threads: int | None,
                 receipt_path: str | None, out_path: str | None, llama_cpp_bin: str | None, as_json: bool) -> None:
    """Serving profiles A-D (the vLLM write-up's workloads), MTP against vanilla: output tok/s, TTFT,
    TPOT, ITL (mean, median, P99), acceptance, and a decision table per workload."""
    from ..measure.profiles import run_profiles
    from ..measure.tune import load_tuned_config

    tuned = load_tuned_config(tuned_from).to_dict() if tuned_from else None
    res = run_profiles(resolve_model_arg(model), workloads=[w for w in workloads.split(",") if w.strip()],
                       scale=scale, num_requests=num_requests, draft_n_max=draft_n_max, tuned=tuned,
                       gpu_layers=_ngl(gpu_layers), threads=threads, llama_cpp_bin=llama_cpp_bin, repeats=repeats,
                       noise=noise, extra_args=list(server_args), progress=not as_json)
    _save_and_show(res, model, "profiles", receipt_path, out_path, as_json, res.to_dict(requests=True), res.text())
