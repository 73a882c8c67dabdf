"""``ggufmtp ladder``: every variant of one model in one command, and one comparison card.

The shared stages run once, here, before any variant: the model made local (a Hub pull or a
safetensors conversion, kept in ``DIR`` for every variant), and the imatrix with the MTP head's
statistics (``--imatrix-corpus``; cached by content in ``DIR``). The base model's logits for KLD are
computed by the first variant's eval and reused by the others (``llama-perplexity``'s logits file is
cached by the base model's digest and the corpus). Then each variant runs as ``ggufmtp run`` does
into ``DIR/<recipe>/`` (quantize, audit, verify, receipt, eval, card) on an engine
(:mod:`.engine`): in sequence, or concurrently on Dask. A variant that fails is reported and the
others go on; rerunning the ladder resumes each variant from its stage cache, and reuses its
verdict, failing ones too, while its bytes and settings are the same (the log names why a variant
was made again: which input changed). Last, ``DIR/README.md`` is written from the variants'
receipts, each audited first (:mod:`ggufmtp.provenance.ladder_card`), the ladder's record
``DIR/.ggufmtp/ladder.json`` (what ``ggufmtp upload DIR REPO`` publishes later), and ``--upload``
publishes every variant, its receipt and that card in one commit through the same gate as
``ggufmtp upload`` (:mod:`.publish`: each variant's reason when the gate refuses it). The result's
JSON times the ladder's own phases (``phases``: imatrix, variants, card) beside each variant's tasks
(:class:`.engine.TaskTime`) and stages (``summary.stage_seconds``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from ..errors import LadderError
from ..files.fsutil import atomic_write_json
from ..jsontypes import JsonObject
from ..progress import bar as progress_bar
from ..provenance.card_page import PageOptions
from ..provenance.ladder_card import make_ladder_card
from ..quant.naming import model_name
from ..refs import is_builtin, parse_model_ref, resolve
from ..run_summary import verdict_text
from .engine import Engine, EngineInfo, Sequential, VariantOutcome
from .spec import LadderSpec, Layout, VariantJob

__all__ = ["LADDER_RECORD", "LadderResult", "ReferenceUse", "load_ladder", "reference_uses", "run_ladder"]

LADDER_IMATRIX = "ladder-imatrix.gguf"
LADDER_RECORD = ".ggufmtp/ladder.json"  # under the ladder's folder: its last run (LadderResult.to_dict)
MEASURING = ("imatrix", "quantize", "verify", "eval", "trunk")  # the stages whose rerun costs a measurement


@dataclass(frozen=True)
class ReferenceUse:
    """One reference measurement and the variants that used it: the reference arm (the source's head
    drafting on a variant's trunk) is cached by the trunk's content, so variants that differ only in
    their MTP head share it; a variant with another trunk measures its own."""

    key: str  # the reference phase's cache key (its first 16 hex digits)
    trunk: str  # the trunk's digest (first 16 hex digits)
    measured_by: tuple[str, ...]  # the variants whose verify measured it (one, unless run apart)
    reused_by: tuple[str, ...]  # the variants that read it from the cache

    def to_dict(self) -> JsonObject:
        return {"key": self.key, "trunk": self.trunk, "measured_by": list(self.measured_by),
                "reused_by": list(self.reused_by)}

    def text(self) -> str:
        """``reference (trunk 0123…): measured once (Q4_K_M_A), reused by 2 variants (Q4_K_M_B, Q4_K_M_C)``."""
        n = len(self.measured_by)
        measured = "measured before this run" if n == 0 else \
            f"measured {'once' if n == 1 else f'{n} times'} ({', '.join(self.measured_by)})"
        reused = f", reused by {len(self.reused_by)} variant{'s' if len(self.reused_by) != 1 else ''} " \
                 f"({', '.join(self.reused_by)}): the same trunk" if self.reused_by else ""
        return f"reference (trunk {self.trunk}): {measured}{reused}"


def reference_uses(outcomes: list[VariantOutcome]) -> list[ReferenceUse]:
    """The ladder's reference measurements, in the order of the variants that first used each."""
    uses: dict[str, tuple[str, list[str], list[str]]] = {}
    for o in outcomes:
        r = cast(Mapping[str, object], o.summary.get("reference") or {}) if o.ok else {}
        if not r.get("key"):
            continue
        _, measured, reused = uses.setdefault(str(r["key"]), (str(r.get("trunk") or ""), [], []))
        (reused if r.get("cached") else measured).append(o.variant)
    return [ReferenceUse(k, t, tuple(m), tuple(u)) for k, (t, m, u) in uses.items()]


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

    def references(self) -> list[ReferenceUse]:
        """Each reference measurement and the variants that shared it (:func:`reference_uses`)."""
        return reference_uses(self.outcomes)

    def to_dict(self) -> JsonObject:
        return {"out_dir": str(self.spec.out_dir), "model": self.spec.model, "recipes": list(self.spec.recipes),
                "imatrix": self.imatrix, "card": str(self.card) if self.card else None, "engine": self.engine,
                "seconds": round(self.seconds, 2), "phases": {k: round(v, 3) for k, v in self.phases.items()},
                "threads": self.spec.threads, "cpus": os.cpu_count(), "finished_order": self.finished_order,
                "layout": str(self.spec.layout), "sidecars": [str(p) for p in self.sidecars],
                "quantized_by": self.spec.quantized_by, "repo_id": self.spec.repo_id,
                "path_in_repo": self.spec.path_in_repo, "ok": self.ok,
                "references": [u.to_dict() for u in self.references()], "variants": [o.to_dict() for o in self.outcomes]}


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
            log(f"{outcome.variant}: {outcome_text(outcome)}")
            bar.update(1)
    phase("variants")
    outcomes = [done[r] for r in spec.recipes]
    made = [(Path(o.summary["artifact"]), Path(o.summary["receipt"])) for o in outcomes if o.ok]
    options = PageOptions(repo_id=spec.repo_id, quantized_by=spec.quantized_by, path_in_repo=spec.path_in_repo,
                          base_model=spec.base_model)
    card = make_ladder_card(made, spec.out_dir / "README.md", options=options, sidecars=sidecars) if made else None
    phase("card")
    result = LadderResult(spec, outcomes, card, imatrix, engine.describe(), time.monotonic() - t0, list(done), phases,
                          sidecars)
    atomic_write_json(spec.out_dir / LADDER_RECORD, result.to_dict())
    return result


def outcome_text(o: VariantOutcome) -> str:
    """A variant's line: ``reused — pass``, ``made (verify: verify settings changed) — fail — ...``,
    ``FAILED: ...``; made again: the first measuring stage that ran and why."""
    if not o.ok:
        return f"FAILED: {o.error}"
    verdict = verdict_text(o.summary) if o.summary.get("verdict") else "not verified"
    why = cast(Mapping[str, str], o.summary.get("ran_because") or {})
    ran = next((f"{s}: {why[s]}" for s in MEASURING if s in why), None)
    return f"{'reused' if ran is None else f'made ({ran})'} — {verdict}"


def load_ladder(out_dir: Path) -> LadderResult:
    """The ladder last run into ``out_dir``, from its record (``DIR/.ggufmtp/ladder.json``); a folder
    moved since is followed (its files are taken under ``out_dir``). LadderError when there is none.
    The record lists what was made; the publish gate checks the bytes themselves."""
    import json

    path = out_dir / LADDER_RECORD
    try:
        d = json.loads(path.read_text())
        was = Path(d["out_dir"])

        def here(p: str) -> Path:  # a recorded path, under out_dir when the folder moved
            return out_dir / Path(p).relative_to(was) if Path(p).is_relative_to(was) else Path(p)

        spec = LadderSpec(model=d["model"], recipes=tuple(d["recipes"]), out_dir=out_dir, layout=Layout(d["layout"]),
                          quantized_by=d.get("quantized_by") or "ggufmtp", repo_id=d.get("repo_id"),
                          path_in_repo=d.get("path_in_repo"))
        outcomes = [VariantOutcome(v["recipe"], bool(v["ok"]), {**v["summary"], **{
            k: str(here(v["summary"][k])) for k in ("artifact", "receipt", "sidecar") if v["summary"].get(k)}},
            v.get("error"), variant=v.get("variant") or "") for v in d["variants"]]
        card = here(d["card"]) if d.get("card") else None
        return LadderResult(spec, outcomes, card, d.get("imatrix"), d["engine"], float(d.get("seconds") or 0),
                            sidecars=[here(p) for p in d.get("sidecars") or []])
    except FileNotFoundError:
        raise LadderError(f"{out_dir} is not a ladder's folder: it has no {LADDER_RECORD} (made by "
                          f"`ggufmtp ladder -o {out_dir}`)") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise LadderError(f"{path}: not a ladder record ggufmtp can read ({type(e).__name__}: {e}); rerun "
                          "the ladder to write it again") from None
