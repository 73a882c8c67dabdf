#!/usr/bin/env python3
"""How close a concurrent ladder came to the ideal overlap of its work (issue #41 item 7).

    .venv/bin/python benchmarks/ladder_bound.py SEQUENTIAL.json CONCURRENT.json \
        [--job JOB.json ...] [--cores N] [--gpus N] [--wall SECONDS] [--json OUT.json]

SEQUENTIAL.json and CONCURRENT.json are two ``ggufmtp ladder --json`` outputs of the same ladder
(the same model, recipes and settings, each into a fresh folder): one in sequence, one on a Dask
cluster (``--workers N --gpus N``). Every variant's two tasks carry their times
(``variants[].tasks.build`` / ``.measure``: wall ``seconds`` and ``cpu_seconds``, the CPU time of the
task's process and of the children it waited for). A ``--job`` file adds work that ran beside the
ladder (a sidecar: ``{"name": "sidecar", "seconds": S, "cpu_seconds": C}``).

From the sequential run's measured times (no task ran beside another there, so each CPU figure is
the task's own), the ideal overlap bound of the concurrent run is the largest of:

- the CPU work over the cores: every task's and job's CPU seconds / ``--cores`` (default: the
  ladder's ``cpus``);
- the GPU work over the GPUs: every measure task's wall seconds (it holds one GPU from start to end:
  servers started, models loaded, requests answered) / ``--gpus`` (default: the concurrent run's
  engine ``gpus``);
- the longest chain: one variant's build then measure, or one job;
- the builds then a measure: every build's CPU seconds / cores (the last build cannot end before all
  the builds' CPU work is done) plus the shortest measure task (which that last build's measure then
  takes at least).

It prints the concurrent wall (``--wall``, e.g. the ladder and a sidecar beside it; default the
concurrent ladder's ``seconds``), the bound, their ratio (1.15: 15 % over the bound), the same with
the ladder's own serial part added (its phases before and after the variants: the shared imatrix,
the card that audits every variant), per variant how each task's time moved between the runs, and the
concurrent run's timeline (each task's start and end, how long each measure waited after its build).
A file that is not such a ladder JSON is refused by name, with exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

TASKS = ("build", "measure")


class BoundError(Exception):
    """A file this script cannot read as a ladder's or a job's timing (the message names it)."""


@dataclass(frozen=True)
class Task:
    start: float  # Unix time
    seconds: float
    cpu_seconds: float

    @property
    def end(self) -> float:
        return self.start + self.seconds


@dataclass(frozen=True)
class Variant:
    recipe: str
    build: Task
    measure: Task


@dataclass(frozen=True)
class Ladder:
    path: str
    seconds: float
    cpus: int | None
    gpus: int
    serial: float  # the ladder's own phases outside its variants (imatrix, card)
    variants: tuple[Variant, ...]


@dataclass(frozen=True)
class Job:
    name: str
    seconds: float
    cpu_seconds: float


@dataclass(frozen=True)
class Bound:
    cores: int
    gpus: int
    cpu_work: float
    gpu_work: float
    cpu_term: float
    gpu_term: float
    chain: float
    chain_of: str
    after_builds: float
    bound: float
    serial: float
    wall: float
    ratio: float
    ratio_with_serial: float


def _number(d: object, key: str, where: str) -> float:
    v = d.get(key) if isinstance(d, dict) else None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
        raise BoundError(f"{where}: no {key!r} (a number of seconds >= 0)")
    return float(v)


def _read_json(path: str) -> dict:
    try:
        d = json.loads(Path(path).read_text())
    except OSError as e:
        raise BoundError(f"{path}: {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BoundError(f"{path}: not JSON ({e})") from None
    if not isinstance(d, dict):
        raise BoundError(f"{path}: not a JSON object")
    return d


def read_ladder(path: str) -> Ladder:
    """A ``ggufmtp ladder --json`` output with every variant's task times."""
    d = _read_json(path)
    variants = d.get("variants")
    if not isinstance(variants, list) or not variants:
        raise BoundError(f"{path}: no variants (not a `ggufmtp ladder --json` output)")
    out = []
    for v in variants:
        name = str(v.get("recipe", "?")) if isinstance(v, dict) else "?"
        if not isinstance(v, dict) or not v.get("ok"):
            raise BoundError(f"{path}: variant {name} failed; a bound needs every variant made and measured")
        tasks = v.get("tasks")
        if not isinstance(tasks, dict) or any(t not in tasks for t in TASKS):
            raise BoundError(f"{path}: variant {name} has no build and measure times (a ladder from before "
                             "the task times were recorded: run it again)")
        where = f"{path}: variant {name}"
        out.append(Variant(name, *(Task(_number(tasks[t], "start", f"{where} {t}"),
                                        _number(tasks[t], "seconds", f"{where} {t}"),
                                        _number(tasks[t], "cpu_seconds", f"{where} {t}")) for t in TASKS)))
    phases = d.get("phases") if isinstance(d.get("phases"), dict) else {}
    serial = sum(float(s) for k, s in phases.items() if k != "variants" and isinstance(s, (int, float)))
    engine = d.get("engine") if isinstance(d.get("engine"), dict) else {}
    cpus = d.get("cpus")
    return Ladder(path, _number(d, "seconds", path), cpus if isinstance(cpus, int) and cpus > 0 else None,
                  int(engine.get("gpus") or 0), serial, tuple(out))


def read_job(path: str) -> Job:
    d = _read_json(path)
    return Job(str(d.get("name") or Path(path).stem), _number(d, "seconds", path), _number(d, "cpu_seconds", path))


def bound(seq: Ladder, conc: Ladder, jobs: tuple[Job, ...] = (), cores: int | None = None, gpus: int | None = None,
          wall: float | None = None) -> Bound:
    """The ideal overlap bound of ``conc`` from ``seq``'s measured times (see the module docstring)."""
    if [v.recipe for v in seq.variants] != [v.recipe for v in conc.variants]:
        raise BoundError(f"{seq.path} and {conc.path}: not the same ladder (their recipes differ)")
    n_cores, n_gpus = cores or seq.cpus, gpus or conc.gpus
    if not n_cores:
        raise BoundError(f"{seq.path}: no 'cpus'; give --cores")
    if not n_gpus:
        raise BoundError(f"{conc.path}: its engine used no GPUs; give --gpus")
    cpu_work = sum(v.build.cpu_seconds + v.measure.cpu_seconds for v in seq.variants) + sum(j.cpu_seconds for j in jobs)
    gpu_work = sum(v.measure.seconds for v in seq.variants)
    chains = [(v.build.seconds + v.measure.seconds, v.recipe) for v in seq.variants] + [(j.seconds, j.name) for j in jobs]
    chain, chain_of = max(chains)
    after_builds = sum(v.build.cpu_seconds for v in seq.variants) / n_cores + min(v.measure.seconds for v in seq.variants)
    b = max(cpu_work / n_cores, gpu_work / n_gpus, chain, after_builds)
    w = conc.seconds if wall is None else wall
    return Bound(n_cores, n_gpus, cpu_work, gpu_work, cpu_work / n_cores, gpu_work / n_gpus, chain, chain_of,
                 after_builds, b,
                 seq.serial, w, w / b, w / (b + seq.serial))


def report(seq: Ladder, conc: Ladder, b: Bound) -> str:
    lines = [f"wall (concurrent)      {b.wall:9.2f} s   (in sequence: {seq.seconds:.2f} s ladder)",
             f"CPU work / cores       {b.cpu_term:9.2f} s   ({b.cpu_work:.1f} CPU s / {b.cores})",
             f"GPU work / GPUs        {b.gpu_term:9.2f} s   ({b.gpu_work:.1f} s of measure tasks / {b.gpus})",
             f"longest chain          {b.chain:9.2f} s   ({b.chain_of})",
             f"builds, then a measure {b.after_builds:9.2f} s   (builds' CPU s / {b.cores} + the shortest measure)",
             f"bound                  {b.bound:9.2f} s",
             f"wall / bound           {b.ratio:9.3f}",
             f"serial (ladder phases) {b.serial:9.2f} s   (imatrix, card: after every variant)",
             f"wall / (bound+serial)  {b.ratio_with_serial:9.3f}",
             "",
             "variant                build s seq -> conc (CPU s)      measure s seq -> conc"]
    for s, c in zip(seq.variants, conc.variants, strict=True):
        lines.append(f"{s.recipe:<22} {s.build.seconds:7.1f} -> {c.build.seconds:7.1f} ({s.build.cpu_seconds:7.1f})"
                     f"    {s.measure.seconds:7.1f} -> {c.measure.seconds:7.1f}")
    return "\n".join(lines)


def timeline(lad: Ladder) -> str:
    """When each task of ``lad`` ran, in seconds from the first task's start, and how long each
    measure task waited after its build (for a GPU, or for a worker); the time outside the tasks."""
    t0 = min(v.build.start for v in lad.variants)
    span = max(v.measure.end for v in lad.variants) - t0
    lines = [f"timeline of {Path(lad.path).name} (s from the first task's start; tasks span {span:.1f} s of the "
             f"ladder's {lad.seconds:.1f} s)", "variant                build          measure        waited"]
    for v in lad.variants:
        lines.append(f"{v.recipe:<22} {v.build.start - t0:6.1f}-{v.build.end - t0:6.1f}  "
                     f"{v.measure.start - t0:6.1f}-{v.measure.end - t0:6.1f}  {v.measure.start - v.build.end:6.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sequential")
    ap.add_argument("concurrent")
    ap.add_argument("--job", action="append", default=[], help="a job beside the ladder: JSON name, seconds, cpu_seconds")
    ap.add_argument("--cores", type=int, default=None)
    ap.add_argument("--gpus", type=int, default=None)
    ap.add_argument("--wall", type=float, default=None, help="the concurrent wall (default: the ladder's seconds)")
    ap.add_argument("--json", default=None, help="also write the figures here")
    a = ap.parse_args(argv)
    try:
        seq, conc = read_ladder(a.sequential), read_ladder(a.concurrent)
        b = bound(seq, conc, tuple(read_job(j) for j in a.job), a.cores, a.gpus, a.wall)
    except BoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(report(seq, conc, b))
    print()
    print(timeline(conc))
    if a.json:
        Path(a.json).write_text(json.dumps(asdict(b), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
