"""``ggufmtp ladder``: every variant of one model in one command, and one comparison card.

The shared stages run once, here, before any variant: the model made local (a Hub pull or a
safetensors conversion, kept in ``DIR`` for every variant), and the imatrix with the MTP head's
statistics (``--imatrix-corpus``; cached by content in ``DIR``). The base model's logits for KLD are
computed by the first variant's eval and reused by the others (``llama-perplexity``'s logits file is
cached by the base model's digest and the corpus). Then each variant runs as ``ggufmtp run`` does
into ``DIR/<recipe>/`` (quantize, audit, verify, receipt, eval, card) on an engine
(:mod:`.engine`): in sequence, or concurrently on Dask. A variant that fails is reported and the
others go on; rerunning the ladder resumes each variant from its stage cache. Last, ``DIR/README.md``
is written from the variants' receipts, each audited first (:mod:`ggufmtp.provenance.ladder_card`),
and ``--upload`` publishes every variant, its receipt and that card in one commit through the same
gate as ``ggufmtp upload``. The result's JSON times the ladder's own phases (``phases``: imatrix, variants,
card) beside each variant's tasks (:class:`.engine.TaskTime`) and stages (``summary.stage_seconds``).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import LadderError
from ..jsontypes import JsonObject
from ..progress import bar as progress_bar
from ..provenance.card_page import PageOptions
from ..provenance.ladder_card import make_ladder_card
from ..provenance.receipt import default_receipt_path
from ..quant.naming import model_name
from ..refs import is_builtin, parse_model_ref, resolve
from ..run_summary import verdict_text
from .engine import Engine, EngineInfo, Sequential, VariantOutcome
from .spec import LadderSpec, Layout, VariantJob

if TYPE_CHECKING:
    from ..hub.upload import UploadOptions

__all__ = ["LadderResult", "run_ladder", "upload_ladder"]

LADDER_IMATRIX = "ladder-imatrix.gguf"


@dataclass
class LadderResult:
    """Every variant's outcome (in recipe order), the card, and how the ladder ran."""

    spec: LadderSpec
    outcomes: list[VariantOutcome]
    card: Path | None
    imatrix: str | None
    engine: EngineInfo
    seconds: float
    finished_order: list[str] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)  # the ladder's own stages' wall seconds, in order
    sidecars: list[Path] = field(default_factory=list)  # layout sidecar: DIR/mtp-<Model>-<TYPE>.gguf (receipts beside)

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outcomes)

    def variants(self) -> list[tuple[Path, Path]]:
        """(artifact, receipt) of every variant that was made."""
        return [(Path(o.summary["artifact"]), Path(o.summary["receipt"])) for o in self.outcomes if o.ok]

    def to_dict(self) -> JsonObject:
        return {"out_dir": str(self.spec.out_dir), "model": self.spec.model, "recipes": list(self.spec.recipes),
                "imatrix": self.imatrix, "card": str(self.card) if self.card else None, "engine": self.engine,
                "seconds": round(self.seconds, 2), "phases": {k: round(v, 3) for k, v in self.phases.items()},
                "threads": self.spec.threads, "cpus": os.cpu_count(), "finished_order": self.finished_order,
                "layout": str(self.spec.layout), "sidecars": [str(p) for p in self.sidecars],
                "ok": self.ok, "variants": [o.to_dict() for o in self.outcomes]}


def _local_model(spec: LadderSpec, progress: bool) -> Path:
    """The model as a local GGUF, made so once for every variant (kept under ``spec.out_dir``)."""
    return _local_source(spec, progress)[0]


def _local_source(spec: LadderSpec, progress: bool) -> tuple[Path, str]:
    """The local GGUF and the model's release name (:func:`~ggufmtp.quant.naming.model_name`, as
    ``ggufmtp run`` names the variants)."""
    if is_builtin(spec.model):
        path = resolve(parse_model_ref(spec.model)).path
        return path, model_name(spec.model, path)
    from ..hfconvert.convert import converted_for_run

    converted = converted_for_run(spec.model, spec.out_dir, progress, spec.token)
    if converted is not None:
        return converted, model_name(spec.model, converted, converted=True)
    path = resolve(parse_model_ref(spec.model), local_dir=spec.out_dir / "base", token=spec.token,
                   progress=progress).path
    return path, model_name(spec.model, path)


def _jobs(spec: LadderSpec, imatrix: str | None, progress: bool) -> tuple[list[VariantJob], list[Path]]:
    """The variants' jobs; in the sidecar layout the sidecars are made first (:mod:`.pairs`)."""
    if spec.layout != Layout.SIDECAR:
        return [VariantJob.of(spec, r, imatrix) for r in spec.recipes], []
    from .pairs import make_sidecars, pair_jobs

    source, name = _local_source(spec, progress)
    sidecars = make_sidecars(spec, source, name, imatrix, progress)
    return pair_jobs(spec, imatrix, sidecars, source), sidecars


def _shared_imatrix(spec: LadderSpec, progress: bool) -> str | None:
    """The ladder's one imatrix: given, or computed once over ``imatrix_corpus`` (with the MTP head's
    statistics when the model has the block), reused while the model, corpus and settings are the same."""
    if spec.imatrix or not spec.imatrix_corpus:
        return spec.imatrix
    import json

    from ..files.fsutil import atomic_write_json
    from ..files.hashing import sha256_file
    from ..imatrix.compute import imatrix_for_run

    model = _local_model(spec, progress)
    job = imatrix_for_run(model, spec.imatrix_corpus, spec.out_dir, chunks=spec.imatrix_chunks)
    key = {"model_sha256": sha256_file(model), **job.key()}
    record = spec.out_dir / (LADDER_IMATRIX + ".json")
    if record.is_file() and json.loads(record.read_text()).get("key") == key:
        done = json.loads(record.read_text())["imatrix"]
        if Path(done["path"]).is_file() and sha256_file(done["path"]) == done["sha256"]:
            return str(done["path"])
    done = job.compute(model, threads=spec.threads or None, gpu_layers=None, progress=progress)["imatrix"]
    atomic_write_json(record, {"key": key, "imatrix": done})
    return str(done["path"])


def run_ladder(spec: LadderSpec, engine: Engine | None = None, *, progress: bool = True,
               log: Callable[[str], None] = lambda m: None) -> LadderResult:
    """Make every variant of ``spec`` on ``engine`` (default: in sequence), then the card from their
    audited receipts. A failed variant is in the result (``ok`` False, its error), not raised."""
    t0 = lap = time.monotonic()
    phases: dict[str, float] = {}

    def phase(name: str) -> None:  # the time since the last phase ended, under this phase's name
        nonlocal lap
        phases[name], lap = time.monotonic() - lap, time.monotonic()

    spec = spec.check()
    spec.out_dir.mkdir(parents=True, exist_ok=True)
    if is_builtin(spec.model) or Path(spec.model).is_file():  # its name known without a pull (upload checks later)
        spec.check_names(_local_source(spec, progress)[1])  # before the imatrix and any variant
    if spec.verify and spec.verify_options.reference is not None:  # another model: refused before any variant
        from ..measure.verify.reference import check_reference

        check_reference(spec.verify_options, _local_model(spec, progress))
    engine = engine or Sequential()
    imatrix = _shared_imatrix(spec, progress)
    phase("imatrix")
    jobs, sidecars = _jobs(spec, imatrix, progress)
    if sidecars:
        phase("sidecars")
    done: dict[str, VariantOutcome] = {}
    with progress_bar(len(jobs), "ladder", "variant", enabled=progress) as bar:
        for outcome in engine.run(jobs):
            done[outcome.recipe] = outcome
            log(f"{outcome.variant}: " + ((verdict_text(outcome.summary) if outcome.summary.get("verdict") else "made")
                                          if outcome.ok
                                         else f"FAILED: {outcome.error}"))
            bar.update(1)
    phase("variants")
    outcomes = [done[r] for r in spec.recipes]
    made = [(Path(o.summary["artifact"]), Path(o.summary["receipt"])) for o in outcomes if o.ok]
    options = PageOptions(repo_id=spec.repo_id, quantized_by=spec.quantized_by, path_in_repo=spec.path_in_repo,
                          base_model=spec.base_model)
    card = make_ladder_card(made, spec.out_dir / "README.md", options=options, sidecars=sidecars) if made else None
    phase("card")
    return LadderResult(spec, outcomes, card, imatrix, engine.describe(), time.monotonic() - t0, list(done), phases,
                        sidecars)


def upload_ladder(result: LadderResult, repo_id: str, options: UploadOptions | None = None, *,
                  progress: bool = True) -> Any:
    """Every made variant, its receipt and the ladder's card in ONE commit, through the publish gate
    (:func:`ggufmtp.hub.upload.upload`), with ``options`` as ``ggufmtp upload``'s (branch,
    ``create_pr``, ``path_in_repo``, ``commit_message``: default one naming what goes up);
    LadderError when a variant failed or nothing was made."""
    from ..hub.upload import UploadOptions, upload

    opts = options if options is not None else UploadOptions()
    failed = [f"{o.recipe} in {o.variant or '?'}/: {o.error}" for o in result.outcomes if not o.ok]
    if failed or result.card is None:
        raise LadderError(f"the ladder has variants that failed ({'; '.join(failed) or 'all'}); "
                          "fix them and rerun the ladder before publishing it")
    arts: Sequence[tuple[Path, Path]] = result.variants()
    sidecars = [(p, default_receipt_path(p)) for p in result.sidecars]
    # the card's download and run lines name the repo it goes to, and its folder
    if (result.spec.repo_id, result.spec.path_in_repo) != (repo_id, opts.path_in_repo):
        make_ladder_card(arts, result.card, public_key=None if opts.public_key is None else Path(opts.public_key),
                         options=PageOptions(repo_id=repo_id, quantized_by=result.spec.quantized_by,
                                             path_in_repo=opts.path_in_repo, base_model=result.spec.base_model),
                         sidecars=result.sidecars)
    if opts.commit_message is None:
        opts = dataclasses.replace(opts, commit_message=_commit_message(len(arts), len(sidecars)))
    files = [*arts, *sidecars]  # a sidecar passes the gate through its trunks' receipts (hub/gate.py)
    return upload(repo_id, [a for a, _ in files], [r for _, r in files], result.card, opts, progress=progress)


def _commit_message(variants: int, sidecars: int) -> str:
    if not sidecars:
        return f"ggufmtp ladder: {variants} MTP GGUF variants"
    return f"ggufmtp ladder: {variants} trunk-only GGUF variants and {sidecars} MTP sidecar{'s' * (sidecars > 1)}"
