"""benchmarks/ladder_bound.py (issue #41 item 7): the ideal overlap bound of a concurrent ladder from a
sequential one's task times, on designed ladder JSONs where each of the three terms wins in turn."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "ladder_bound.py"
RECIPES = ("q8_0-mtp", "q4_k_m-mtp-q8", "hifi-q4_k_m-mtp", "iq4_xs-mtp")


@pytest.fixture(scope="module")
def lb():
    spec = importlib.util.spec_from_file_location("ladder_bound", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["ladder_bound"] = mod  # its dataclasses look their module up while the file runs
    spec.loader.exec_module(mod)
    return mod


def _ladder(path: Path, *, seconds: float, gpus: int, build: float, measure: float, cpus: int = 8) -> str:
    """A ladder JSON as `ggufmtp ladder --json` writes it: each variant's build uses 80 CPU s, its
    measure 10; the ladder's own phases 3 s (imatrix) and 7 s (card) outside the variants."""
    d = {"seconds": seconds, "cpus": cpus, "threads": cpus, "engine": {"engine": "dask", "workers": gpus, "gpus": gpus},
         "phases": {"imatrix": 3.0, "variants": seconds - 10.0, "card": 7.0}, "ok": True,
         "variants": [{"recipe": r, "ok": True, "summary": {}, "tasks": {
             "build": {"start": 0.0, "seconds": build, "cpu_seconds": 80.0, "pid": 1},
             "measure": {"start": build, "seconds": measure, "cpu_seconds": 10.0, "pid": 1}}} for r in RECIPES]}
    path.write_text(json.dumps(d))
    return str(path)


@pytest.fixture
def runs(tmp_path):
    seq = _ladder(tmp_path / "seq.json", seconds=180.0, gpus=0, build=12.0, measure=30.0)
    conc = _ladder(tmp_path / "conc.json", seconds=69.0, gpus=2, build=20.0, measure=33.0)
    job = tmp_path / "sidecar.json"
    job.write_text(json.dumps({"name": "sidecar", "seconds": 45.0, "cpu_seconds": 40.0}))
    return seq, conc, str(job)


def test_each_term_of_the_bound_wins_where_it_is_the_largest(lb, runs, tmp_path):
    seq, conc, job = (lb.read_ladder(runs[0]), lb.read_ladder(runs[1]), lb.read_job(runs[2]))
    # CPU (4 x 80 + 4 x 10 + 40) / 8 = 50, GPU 4 x 30 / 2 = 60, chain max(12 + 30, sidecar 45) = 45,
    # builds then a measure 4 x 80 / 8 + 30 = 70
    b = lb.bound(seq, conc, (job,))
    assert (b.cpu_term, b.gpu_term, b.chain, b.chain_of, b.after_builds) == (50.0, 60.0, 45.0, "sidecar", 70.0)
    assert b.bound == 70.0 and b.wall == 69.0 and b.ratio == pytest.approx(69.0 / 70.0)
    assert b.serial == 10.0 and b.ratio_with_serial == pytest.approx(69.0 / 80.0)
    b = lb.bound(seq, conc, (job,), gpus=1)  # GPU 120
    assert b.bound == 120.0 and b.gpu_term == 120.0
    b = lb.bound(seq, conc, (job,), cores=16, gpus=4, wall=100.0)  # CPU 25, GPU 30, chain 45: 20 + 30
    assert b.bound == 50.0 and b.after_builds == 50.0 and b.ratio == 2.0
    b = lb.bound(seq, conc, (job,), cores=64, gpus=4)  # CPU 6.25, GPU 30, after the builds 35: the sidecar's chain
    assert b.bound == 45.0 and b.chain_of == "sidecar"
    assert lb.bound(seq, conc, cores=64, gpus=4).chain_of == "q8_0-mtp"  # without the job: a variant's chain, 42
    heavy = tmp_path / "heavy.json"  # a job beside the ladder with 400 CPU s: CPU (360 + 440) / 8 = 100
    heavy.write_text(json.dumps({"name": "heavy", "seconds": 50.0, "cpu_seconds": 400.0}))
    b = lb.bound(seq, conc, (job, lb.read_job(str(heavy))))
    assert b.bound == 100.0 and b.cpu_term == 100.0


def test_the_cli_prints_wall_bound_and_ratio_and_writes_json(lb, runs, tmp_path, capsys):
    out = tmp_path / "bound.json"
    assert lb.main([runs[0], runs[1], "--job", runs[2], "--gpus", "1", "--json", str(out)]) == 0
    text = capsys.readouterr().out  # GPU 4 x 30 / 1 = 120 bounds (the builds then a measure: 70)
    assert "bound                     120.00 s" in text and "wall / bound               0.575" in text
    assert "builds, then a measure     70.00 s" in text
    assert "q4_k_m-mtp-q8             12.0 ->    20.0 (   80.0)       30.0 ->    33.0" in text
    assert json.loads(out.read_text())["ratio"] == pytest.approx(69.0 / 120.0)
    assert "tasks span 53.0 s of the ladder's 69.0 s" in text  # every task started at 0: build 20, measure 33
    assert "iq4_xs-mtp                0.0-  20.0    20.0-  53.0     0.0" in text


def test_files_it_cannot_use_are_refused_by_name(lb, runs, tmp_path, capsys):
    old = json.loads(Path(runs[0]).read_text())
    for v in old["variants"]:
        del v["tasks"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    other = json.loads(Path(runs[1]).read_text())
    other["variants"][0]["recipe"] = "q6_k-mtp"
    (tmp_path / "other.json").write_text(json.dumps(other))
    (tmp_path / "text.json").write_text("not json")
    for args, said in (([str(tmp_path / "old.json"), runs[1]], "old.json: variant q8_0-mtp has no build and measure"),
                       ([runs[0], str(tmp_path / "other.json")], "not the same ladder"),
                       ([str(tmp_path / "text.json"), runs[1]], "text.json: not JSON"),
                       ([runs[0], runs[1], "--job", str(tmp_path / "none.json")], "none.json: No such file"),
                       ([runs[0], runs[0]], "seq.json: its engine used no GPUs; give --gpus")):
        assert lb.main(args) == 2
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err, err
