"""ggufmtp tune / curve / profiles: the successive-halving logic on a fake evaluator (pure), then the
real llama-server on tiny synthetic models (a small tune, the synthetic-acceptance curve, profiles
A and D at a tiny scale, the receipt merge and the CLI).

Speed is never asserted (on 2 shared CPU cores it is noise): only what must hold on any machine --
identical output, acceptance following the set rate, well-formed metrics and command lines, and the
budget being respected.
"""

from __future__ import annotations

import dataclasses
import json
import random
import shlex
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggufmtp._api import store_in_receipt
from ggufmtp.cli import main
from ggufmtp.errors import TuneError
from ggufmtp.measure.core.options import ServerOptions, TuneConfig
from ggufmtp.measure.profiles.curve import CurveOptions, acceptance_curve, geometric_rates
from ggufmtp.measure.tune.options import SearchOptions, TuneOptions
from ggufmtp.measure.tune.rank import rank_configs, recommend_config
from ggufmtp.measure.tune.run import tune
from ggufmtp.measure.tune.search import (
    UnitResult,
    candidate_space,
    final_rung_units,
    fit_schedule,
    inert_draft_limits,
    order_candidates,
    plan_rungs,
    schedule_cost,
    search_anchors,
    successive_halving,
)
from ggufmtp.provenance.names import redact_local_paths
from ggufmtp.provenance.verdict import Thresholds
from ggufmtp.runtime.server import ServerConfig, display_command

F20 = "tiny-qwen35moe-f20"


# ----------------------------------------------------------------------------- pure: the search logic


def _truth(c: TuneConfig) -> float:
    """A made-up speedup landscape: best at k=4 with p-min 0.5."""
    return 1.0 + 0.25 * c.draft_n_max - 0.03 * c.draft_n_max ** 2 + (0.06 if c.draft_p_min == 0.5 else 0.0)


class FakeEvaluator:
    """Deterministic fake: speedup = truth x (1 +- 1%); configs in ``poison`` differ from vanilla from
    the given unit on (they are the fastest, so only the identity check can keep them out)."""

    def __init__(self, poison: dict[TuneConfig, int], max_units: int):
        self.poison = poison
        self.max_units = max_units
        self.calls: list[tuple[TuneConfig, list[int]]] = []
        self.spent = 0

    def __call__(self, cfg: TuneConfig, units):
        units = list(units)
        self.calls.append((cfg, units))
        assert all(0 <= u < self.max_units for u in units)
        out = []
        for u in units:
            rng = random.Random(hash((cfg.key, u)))
            sp = (3.0 if cfg in self.poison else _truth(cfg)) * (1 + rng.uniform(-0.01, 0.01))
            ident = not (cfg in self.poison and u >= self.poison[cfg])
            # a p-min that changes the speed cuts drafts, so it drafts differently from p-min 0
            out.append(UnitResult(unit=u, mtp_tokens=100 * sp, mtp_ms=1000.0, van_tokens=100.0, van_ms=1000.0,
                                  identical=ident, draft_n=30 - (3 if cfg.draft_p_min else 0), draft_n_accepted=20,
                                  requests=1))
            self.spent += 1
            if not ident:
                break  # as the real evaluator: stop at the first mismatch
        return out


def test_successive_halving_keeps_the_best_drops_mismatches_and_respects_the_budget():
    configs = [TuneConfig(k) for k in range(1, 9)] + [TuneConfig(k, 1, 0.5) for k in range(2, 9)]
    early, late = TuneConfig(6, 1, 0.5), TuneConfig(5)
    poison = {early: 1, late: 5}  # differs at unit 1 (rung 0) / at unit 5 (rung 2)
    ev = FakeEvaluator(poison, max_units=16)
    sh = successive_halving(configs, ev, budget=100, units0=2, eta=2, final_size=2, max_units=16)
    # the budget: planned schedule fits, every evaluation is counted, none beyond the budget
    assert schedule_cost(sh.plan) <= 100 and ev.spent == sh.evaluations <= 100
    assert [n for n, _ in sh.plan] == [15, 8, 4, 2] and [u for _, u in sh.plan] == [2, 4, 8, 16]
    # later rungs measure only the units a survivor lacks
    seen: dict[str, set[int]] = {}
    for cfg, units in ev.calls:
        assert not seen.setdefault(cfg.key, set()) & set(units)
        seen[cfg.key] |= set(units)
    st = sh.by_key()
    # mismatches are dropped at once, however fast
    assert st[early.key].status == "dropped" and len(st[early.key].results) == 2
    assert sum(1 for c, _ in ev.calls if c == early) == 1
    assert st[late.key].status == "dropped" and len(st[late.key].results) == 6 and st[late.key].rung == 2
    assert "differs" in st[late.key].reason
    # the best identical configuration wins
    best = max((c for c in configs if c not in poison), key=_truth)
    assert best == TuneConfig(4, 1, 0.5)
    assert best.key in {s.config.key for s in sh.final}
    rows = rank_configs(sh, resamples=500)
    assert [r.status for r in rows[:2]] == ["final", "final"] and rows[-1].status == "dropped"
    rec = recommend_config(rows)
    assert rec.recommended == best.key and rec.mtp_beats_vanilla
    assert rec.speedup_ci95[0] > 1.0 and rec.speedup_ci95[0] <= rec.speedup <= rec.speedup_ci95[1]
    fin = [r for r in rows if r.status == "final"]
    assert all(r.units == 16 and r.identical for r in fin)
    # rung bookkeeping
    assert [len(r.configs) for r in sh.rungs] == [15, 8, 4, 2] and sh.rungs[-1].kept == []
    assert early.key in sh.rungs[0].dropped and late.key in sh.rungs[2].dropped


def test_budget_limits_the_number_of_configurations_and_failures_drop():
    configs = [TuneConfig(k) for k in range(1, 9)]

    def broken(cfg, units):
        if cfg.draft_n_max == 2:
            raise TuneError("server would not start")
        return FakeEvaluator({}, 64)(cfg, units)

    n0, u0, plan = fit_schedule(len(configs), 20, units0=2)
    assert n0 < len(configs) and schedule_cost(plan) <= 20
    sh = successive_halving(configs, broken, budget=20, units0=2)
    assert len(sh.states) == n0 and sh.evaluations <= 20
    assert sh.by_key()[TuneConfig(2).key].status == "dropped"
    assert "would not start" in sh.by_key()[TuneConfig(2).key].reason
    # a generous budget searches all and doubles the units instead
    n0, u0, plan = fit_schedule(3, 1000, units0=2, max_units=16)
    assert n0 == 3 and u0 > 2 and schedule_cost(plan) <= 1000
    with pytest.raises(TuneError, match="too small"):
        fit_schedule(8, 3, units0=2)
    assert plan_rungs(9, 2, 2, 2, max_units=4) == [(9, 2), (5, 4), (2, 4)]  # capped units: cut to the final size


def test_recommendation_is_mtp_off_when_no_ci_clears_vanilla():
    slow = {TuneConfig(2): 0.9, TuneConfig(3): 0.95}

    def ev(cfg, units):
        return [UnitResult(u, 100 * slow[cfg] * (1 + 0.05 * ((u % 3) - 1)), 1000, 100, 1000) for u in units]

    sh = successive_halving(list(slow), ev, budget=40, units0=4)
    rec = recommend_config(rank_configs(sh, resamples=300))
    assert rec.recommended is None and rec.best == TuneConfig(3).key and not rec.mtp_beats_vanilla
    assert "without MTP" in rec.why


def test_draft_limits_that_never_cut_a_draft_are_reported_as_inert():
    """A p-min that never cuts a draft leaves the same drafts as p-min 0 (as on the H200's confident
    head, where k=4 n-min 2 p-min 0.5 won the final rung by noise): the tuner names the simpler twin."""
    speed = {TuneConfig(4): 1.50, TuneConfig(4, 2, 0.5): 1.51, TuneConfig(3): 1.40, TuneConfig(3, 1, 0.5): 1.41}

    def ev(cfg, units):
        cut = cfg.draft_n_max == 3 and cfg.draft_p_min > 0  # this one's p-min does cut drafts
        return [UnitResult(u, 100 * speed[cfg] * (1 + 0.01 * ((u % 3) - 1)), 1000, 100, 1000,
                           draft_n=10 * cfg.draft_n_max - (3 if cut else 0), draft_n_accepted=7 * cfg.draft_n_max)
                for u in units]

    sh = successive_halving(list(speed), ev, budget=200, units0=4, final_size=4)
    assert {s.status for s in sh.states} == {"final"}
    assert inert_draft_limits(sh) == {TuneConfig(4, 2, 0.5).key: TuneConfig(4).key}
    # a twin that was never measured on the same units proves nothing
    sh.by_key()[TuneConfig(4).key].results = [dataclasses.replace(r, unit=r.unit + 100)
                                              for r in sh.by_key()[TuneConfig(4).key].results]
    assert inert_draft_limits(sh) == {}


def test_a_draft_twin_is_merged_at_promotion_and_its_slot_goes_to_the_next_configuration():
    """k=4 with an inert p-min drafts exactly as k=4 (as on the H200): the pair holds one promotion slot,
    taken by the simpler k=4 at the better rank of the two, and the freed slot goes to k=2."""
    speed = {TuneConfig(4, 2, 0.5): 1.62, TuneConfig(4): 1.60, TuneConfig(2): 1.55, TuneConfig(3): 1.50,
             TuneConfig(3, 1, 0.5): 1.49, TuneConfig(1): 1.20}

    def ev(cfg, units):
        cut = cfg.draft_n_max == 3 and cfg.draft_p_min > 0  # this p-min does cut drafts: no twin
        return [UnitResult(u, 100 * speed[cfg] * (1 + 0.001 * ((u % 3) - 1)), 1000, 100, 1000,
                           draft_n=10 * cfg.draft_n_max - (3 if cut else 0), draft_n_accepted=7 * cfg.draft_n_max)
                for u in units]

    sh = successive_halving(list(speed), ev, budget=30, units0=2, eta=2, final_size=2, max_units=8)
    st = sh.by_key()
    assert [n for n, _ in sh.plan] == [6, 3, 2]
    assert sh.rungs[0].merged == {TuneConfig(4, 2, 0.5).key: TuneConfig(4).key}
    # rung 0 keeps 3: k=4 (in its twin's place), k=2, then k=3 -- not the twin, not k=3's p-min variant
    assert sh.rungs[0].kept == [TuneConfig(4).key, TuneConfig(2).key, TuneConfig(3).key]
    twin = st[TuneConfig(4, 2, 0.5).key]
    assert twin.status == "eliminated" and twin.merged_into == TuneConfig(4).key and "merged at rung 0" in twin.reason
    assert st[TuneConfig(3, 1, 0.5).key].merged_into is None  # it drafted differently: ranked on its own
    assert {s.config for s in sh.final} == {TuneConfig(4), TuneConfig(2)}
    rows = rank_configs(sh, resamples=200)
    row = next(r for r in rows if r.key == TuneConfig(4, 2, 0.5).key)
    assert row.merged_into == TuneConfig(4).key and row.status == "eliminated"


def test_candidate_space_dimensions():
    cpu, dims = candidate_space(1, gpu=False, flags={"-bs", "--spec-draft-backend-sampling",
                                                     "--no-spec-draft-backend-sampling"})
    assert {c.backend_sampling for c in cpu} == {None} and {c.draft_backend_sampling for c in cpu} == {None}
    assert sum("not searched" in n and "no GPU" in n for n in dims.notes) == 2
    assert all(c.draft_n_min == 0 for c in cpu if c.draft_p_min == 0)  # n-min is inert without p-min
    assert all(c.draft_n_min <= c.draft_n_max for c in cpu)
    assert {c.draft_n_max for c in cpu} == set(range(1, 9)) and len(cpu) == len(set(cpu)) == 77
    gpu, gd = candidate_space(1, gpu=True, flags={"-bs", "--spec-draft-backend-sampling",
                                                   "--no-spec-draft-backend-sampling"})
    assert len(gpu) == 4 * len(cpu) and gd.backend_sampling == [False, True]
    nob, nd = candidate_space(1, gpu=True, flags={"--spec-draft-backend-sampling", "--no-spec-draft-backend-sampling"})
    assert len(nob) == 2 * len(cpu) and any("no -bs flag" in n for n in nd.notes)
    c4, d4 = candidate_space(4, gpu=False)
    assert {c.parallel for c in c4} == {4, 2} and d4.parallel == [4, 2]
    assert TuneConfig(3, 0, 0.0, True, False, 2).extra_args() == ["-bs", "--no-spec-draft-backend-sampling"]
    # CUDA: ggml-cuda's graph optimisation is a dimension too, set through the environment
    cu, cd = candidate_space(1, gpu=True, cuda=True, flags={"-bs", "--spec-draft-backend-sampling",
                                                            "--no-spec-draft-backend-sampling"})
    assert len(cu) == 2 * len(gpu) and cd.cuda_graph_opt == [False, True] and gd.cuda_graph_opt is None
    assert any("GGML_CUDA_GRAPH_OPT not searched: not a CUDA device" in n for n in gd.notes)
    g = TuneConfig(3, backend_sampling=True, cuda_graph_opt=True)
    assert g.env() == {"GGML_CUDA_GRAPH_OPT": "1"} and TuneConfig(3, cuda_graph_opt=False).env() == {}
    assert g.key.endswith(" gopt=on") and TuneConfig.from_dict(g.to_dict()) == g
    assert display_command(ServerConfig(model="m.gguf", draft_mtp=True, env=g.env())).startswith(
        "GGML_CUDA_GRAPH_OPT=1 llama-server --model m.gguf")
    from ggufmtp.measure.profiles.run import ProfilesOptions, profile_server_config
    from ggufmtp.measure.profiles.workloads import WORKLOADS
    from ggufmtp.measure.verify.run import _mtp_server_config

    assert _mtp_server_config({"model": "m.gguf", "extra_args": []}, 3, None, g).env == g.env()
    pc = profile_server_config(Path("m.gguf"), WORKLOADS["A"], True,
                               ProfilesOptions(tuned=g.to_dict(), server=ServerOptions(server_args=["-bs"])))
    assert pc.env == g.env() and pc.extra_args.count("-bs") == 1
    # fair baseline: the vanilla arm gets the configuration's non-speculative settings too (-bs, graph
    # optimisation), never its speculative ones
    van = profile_server_config(Path("m.gguf"), WORKLOADS["A"], False, ProfilesOptions(tuned=g.to_dict()))
    # (every arm starts with --fit off: the pinned server would otherwise size each arm to what is free)
    assert van.env == g.env() and van.extra_args == ["--fit", "off", "-bs"] and not van.draft_mtp
    assert TuneConfig(3, backend_sampling=True, draft_backend_sampling=False).vanilla_fields({"model": "m"})["extra_args"] == ["-bs"]
    # tune: each candidate's vanilla arm has its non-speculative settings and slots
    from ggufmtp.measure.tune.bench import ServerEvaluator

    ev = ServerEvaluator({"model": "m.gguf", "threads": 8, "extra_args": []}, None, None, 1024, None)
    vc = ev.vanilla_config(TuneConfig(3, backend_sampling=True, draft_backend_sampling=False, parallel=2, threads=1))
    assert (vc.extra_args, vc.threads, vc.parallel, vc.ctx_size, vc.draft_mtp) == (["-bs"], 1, 2, 2048, False)
    mc = ev.server_config(TuneConfig(3, backend_sampling=True, draft_backend_sampling=False, parallel=2, threads=1))
    assert mc.extra_args == ["-bs", "--no-spec-draft-backend-sampling"] and mc.threads == 1 and mc.draft_n_max == 3
    # a configuration's thread count is the MTP server's, over the run's; None leaves the run's
    t1 = TuneConfig(4, backend_sampling=True, threads=1)
    assert t1.key.endswith(" t=1") and TuneConfig.from_dict(t1.to_dict()) == t1
    kw = t1.server_fields({"model": "m.gguf", "threads": 8, "extra_args": ["-bs"], "env": {"A": "1"}})
    assert kw["threads"] == 1 and kw["extra_args"] == ["-bs"] and kw["env"] == {"A": "1"}
    assert (kw["draft_mtp"], kw["draft_n_max"]) == (True, 4)
    assert TuneConfig(4).server_fields({"model": "m.gguf", "threads": 8})["threads"] == 8
    t1_8 = ProfilesOptions(tuned=t1, server=ServerOptions(threads=8))
    assert profile_server_config(Path("m.gguf"), WORKLOADS["A"], True, t1_8).threads == 1
    assert profile_server_config(Path("m.gguf"), WORKLOADS["A"], False, t1_8).threads == 1
    with pytest.raises(TuneError, match="threads 0"):
        TuneConfig(3, threads=0)
    with pytest.raises(TuneError, match="threads 'x': must be an integer"):
        TuneConfig.coerce({"draft_n_max": 3, "threads": "x"})
    with pytest.raises(TuneError, match="draft_p_min '0.5': must be a number"):
        TuneConfig.coerce({"draft_n_max": 3, "draft_p_min": "0.5"})
    order = order_candidates(cpu, seed=0, anchors=[TuneConfig(3)])
    assert order[0] == TuneConfig(3) and sorted(order, key=lambda c: c.key) == sorted(cpu, key=lambda c: c.key)
    assert {c.draft_n_max for c in order[1:9]} == set(range(1, 9))  # every prefix covers the windows
    # the final rung on the whole suite: raised to the suite, capped, and only when it costs at
    # most half the budget
    assert plan_rungs(24, 2, 2, 2, 54, final_units=54) == [(24, 2), (12, 4), (6, 8), (3, 16), (2, 54)]
    assert plan_rungs(24, 2, 2, 2, 40, final_units=54)[-1] == (2, 40)
    assert plan_rungs(1, 2, 2, 2, 54, final_units=54) == [(1, 54)]
    notes: list[str] = []
    assert final_rung_units(True, 616, 240, 2, 2, 2, 54, 1, 54, notes) == 54 and not notes
    assert fit_schedule(616, 240, max_units=54, final_units=54)[0] == 32
    assert final_rung_units(True, 616, 160, 2, 2, 2, 54, 1, 54, notes) is None
    assert "92 of the 160 evaluations" in notes[-1]
    assert final_rung_units(True, 616, 20, 2, 2, 2, 54, 1, 54, notes) is None and "does not fit" in notes[-1]
    assert final_rung_units(False, 616, 240, 2, 2, 2, 54, 1, 54, notes) is None
    # anchors: defaults first, then on a CUDA GPU -bs and -bs with graph opt, then one
    # best-guess configuration per other window, nearest k=3 first
    gpu_space, _ = candidate_space(gpu=True, cuda=True)
    anc = search_anchors(gpu_space)
    assert anc[:3] == [TuneConfig(3, backend_sampling=False, draft_backend_sampling=True, cuda_graph_opt=False),
                       TuneConfig(3, backend_sampling=True, draft_backend_sampling=True, cuda_graph_opt=False),
                       TuneConfig(3, backend_sampling=True, draft_backend_sampling=True, cuda_graph_opt=True)]
    assert [c.draft_n_max for c in anc[3:]] == [4, 2, 5, 1, 6, 7, 8]
    assert all(c == TuneConfig(c.draft_n_max, backend_sampling=True, draft_backend_sampling=True,
                               cuda_graph_opt=False) for c in anc[3:])
    assert all(c in gpu_space for c in anc)
    assert order_candidates(gpu_space, seed=0, anchors=anc)[:len(anc)] == anc
    cpu_anc = search_anchors(cpu)
    assert cpu_anc == [TuneConfig(k) for k in (3, 4, 2, 5, 1, 6, 7, 8)]
    for a in (0.0, 0.3, 0.65, 1.0):
        r = geometric_rates(a, 3)
        assert abs(sum(r) / 3 - a) < 1e-9 and all(x >= y for x, y in zip(r, r[1:]))


# ----------------------------------------------------------------------------- real llama-server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_command(command: str, binary, model) -> tuple[int, dict, dict]:
    """Run llama-server with exactly the flags of ``command`` (its binary and model swapped for the
    local ones, a free port added); returns /health status, /props and one chat reply."""
    argv = shlex.split(command)
    assert argv[0] == "llama-server" and "--model" in argv
    argv[0] = str(binary)
    argv[argv.index("--model") + 1] = str(model)
    port = _free_port()
    proc = subprocess.Popen(argv + ["--host", "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"llama-server rejected {command}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.1)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/props", timeout=10) as r:
            props = json.loads(r.read())
        body = json.dumps({"messages": [{"role": "user", "content": "Tell me about the sea."}], "max_tokens": 32,
                           "temperature": 0}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            reply = json.loads(r.read())
        return 200, props, reply
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def f20(synth_model):
    return synth_model(F20)


@pytest.fixture(scope="module")
def small_tune(llama_server_bin, f20):
    cands = [TuneConfig(1), TuneConfig(3), TuneConfig(3, 1, 0.5), TuneConfig(5)]
    return tune(f20, TuneOptions(budget=12, limit=6, max_tokens=48, search=SearchOptions(candidates=cands),
                                 server=ServerOptions(threads=2), bootstrap_resamples=500), progress=False)


def test_small_real_tune(small_tune, llama_server_bin, f20):
    res = small_tune
    sch = res.schedule
    assert len(sch.rungs) == 2 and [r.units for r in sch.rungs] == [2, 4]
    assert sch.evaluations <= sch.budget == 12 and sch.n_searched == 4
    assert len(sch.rungs[0].configs) == 4 and len(sch.rungs[1].configs) == 2
    final = res.final_rows
    assert len(final) == 2
    for r in final:
        assert r.identical is True and r.units == 4 and r.evaluations == 4
        assert 0.3 < r.acceptance < 1.0  # f=0.2: drafts are sometimes wrong, yet output identical
        lo, hi = r.speedup_ci95
        assert lo is not None and lo <= r.speedup <= hi
    assert all(r.status != "dropped" for r in res.rows)
    rec = res.recommendation
    assert rec.best in {r.key for r in final}
    best = TuneConfig.from_dict(rec.to_dict()["best_config"])
    assert best == rec.best_config
    # the commands: the measured flags, exactly
    assert res.mtp_command.startswith("llama-server --model ") and str(f20) in res.mtp_command
    assert f"--spec-type draft-mtp --spec-draft-n-max {best.draft_n_max}" in res.mtp_command
    assert "--host" not in res.mtp_command and "--port" not in res.mtp_command
    if rec.recommended:
        assert res.command == res.mtp_command
    else:
        assert res.command == res.vanilla_command and "--spec-type" not in res.command
    measured = shlex.split(res.server.measured_commands[rec.best])
    i = measured.index("--host")
    assert measured[1:i] + measured[i + 4:] == shlex.split(res.mtp_command)[1:]  # printed = run, minus host/port
    # llama-server accepts the printed command lines, and the MTP one drafts
    status, props, reply = _serve_command(res.mtp_command, llama_server_bin, f20)
    assert status == 200 and props["total_slots"] == 1
    assert reply["timings"].get("draft_n", 0) > 0
    status, _, reply = _serve_command(res.command, llama_server_bin, f20)
    assert status == 200 and (("draft_n" in reply["timings"]) == bool(rec.recommended))
    d = res.to_dict()
    assert d["command"] == res.command and d["ranking"] and json.loads(json.dumps(d)) == d
    assert any("not searched" in n for n in d["notes"]) is False  # custom candidates: no dimension skipped
    assert "rung 1" in res.table() or "final" in res.table()


def test_real_evaluator_drops_a_configuration_whose_output_differs(llama_server_bin, f20):
    """Synthetic acceptance of every draft lets the f=0.2 head's wrong tokens through: the tuner's
    identity check must catch it and drop the configuration at its first unit."""
    from ggufmtp.measure.core.suite import load_suite
    from ggufmtp.measure.tune import bench as T
    from ggufmtp.runtime.server import LlamaServer, ServerConfig

    class Synth(T.ServerEvaluator):
        def server_config(self, cfg):
            c = super().server_config(cfg)
            c.extra_args = list(c.extra_args) + ["--spec-synth-len", str(cfg.draft_n_max + 1)]
            return c

    st = load_suite().limit(3)
    base = dict(model=f20, threads=2, metrics=True, extra_args=[])
    with LlamaServer(ServerConfig(**base, parallel=1, ctx_size=2048)) as van:
        bench = T.Bench(st.prompts, [7], "default", 48, 1)
        ev = Synth(base, van, bench, 2048, st.prompts[0], suite=st)  # with the numerics analysis: still real
        sh = successive_halving([TuneConfig(3), TuneConfig(2)], ev, budget=6, units0=3, final_size=2, max_units=3)
    for s in sh.states:
        assert s.status == "dropped" and s.reason.startswith("output differs from vanilla (")  # and says why
        assert "exceeds the batching drift" in s.reason or "neither vanilla's runner-up" in s.reason, s.reason
        r = s.results[0]
        assert len(s.results) == 1 and r.mismatch.first_difference_at >= 0
        assert not r.explained and not r.mismatch.explained and r.mismatch.drift_nats is not None
    assert sh.evaluations == 2 and not sh.final


def test_tune_keeps_a_configuration_whose_only_difference_is_numerics(llama_server_bin, f20):
    """One MTP reply of a unit departs from vanilla's at a near-tie that vanilla's own one-batch
    evaluation flips: verify passes it; tune dropped the configuration as "output differs". With
    verify's analysis, the unit is lossless up to numerics. The near-tie is designed, as in
    tests/test_verify_numerics.py (tests/numerics_kit.py): the MTP reply of seed 42 is changed where
    the unit records it and in its replay on the MTP server, and the analysis reads the real vanilla
    server with the designed answers at that divergence; the search, the analysis and the keep decision are tune's own."""
    from numerics_kit import NEAR_TIE, NearTieMtp, NearTieVanilla, designed_mtp_text

    from ggufmtp.measure.core.suite import load_suite
    from ggufmtp.measure.tune import bench as T
    from ggufmtp.runtime.server import LlamaServer, ServerConfig

    class DesignedMtpReply(T.Bench):
        def run(self, srv, unit):
            out, ms = super().run(srv, unit)
            if "--spec-type" in srv.command:  # the MTP arm: seed 42's reply departs from vanilla's, seed 7's does not
                out = [(p, s, dataclasses.replace(r, text=designed_mtp_text(r.text)) if s == 42 else r) for p, s, r in out]
            return out, ms

    class NearTieEvaluator(T.ServerEvaluator):
        def _mismatch(self, vsrv, mtp, differing):
            assert [s for _, s, _, _ in differing] == [42], "the synthetic model's replies differ by themselves"
            texts = (differing[0][2].text, differing[0][3].text)
            return super()._mismatch(NearTieVanilla(vsrv, *texts), NearTieMtp(mtp, *texts), differing)

    st = load_suite().limit(1)
    base = dict(model=f20, threads=2, metrics=True, extra_args=[])
    with LlamaServer(ServerConfig(**base, parallel=1, ctx_size=2048)) as van:
        bench = DesignedMtpReply(st.prompts, [42, 7], "default", 32, 1)
        ev = NearTieEvaluator(base, van, bench, 2048, st.prompts[0], suite=st)
        sh = successive_halving([TuneConfig(3)], ev, budget=1, units0=1, final_size=1, max_units=1)
    s = sh.states[0]
    r = s.results[0]
    assert not r.identical and r.requests == 2
    assert r.explained and r.lossless and s.status != "dropped", s.reason
    m = r.mismatch
    assert m.prompt_id == st.prompts[0].id and m.seed == 42 and m.explained and m.why is None
    assert m.margin_nats == pytest.approx(NEAR_TIE, abs=1e-6) and m.margin_nats <= m.drift_nats < 1.0
    row = rank_configs(sh, 200)[0]
    assert row.identical is False and row.lossless is True and row.to_dict()["mismatch"]["explained"] is True


def test_acceptance_curve_follows_the_set_rate(llama_server_bin, f20):
    res = acceptance_curve(f20, CurveOptions(rates=(0.0, 0.5, 1.0), draft_n_max=3, seeds=(1, 2), limit=3,
                                             max_tokens=64, server=ServerOptions(threads=2), bootstrap_resamples=300),
                           progress=False)
    pts = res.points
    assert [p.acceptance_set for p in pts] == [0.0, 0.5, 1.0]
    assert [p.flag_value for p in pts] == ["synth-len 1", "synth-len 2.5", "synth-len 4"]
    assert pts[0].acceptance == 0.0 and pts[2].acceptance == 1.0  # exact at the ends
    assert abs(pts[1].acceptance - 0.5) < 0.12
    lo, hi = pts[1].acceptance_ci95
    assert lo < pts[1].acceptance < hi  # each request has its own synthetic RNG stream (seed per request)
    assert pts[0].acceptance < pts[1].acceptance < pts[2].acceptance
    tps = [p.tokens_per_step for p in pts]
    assert tps[0] == pytest.approx(1.0) and tps[2] > 3.5 and tps[0] < tps[1] < tps[2]
    assert all(p.draft_n > 0 and p.speedup > 0 and p.mtp_tokens_per_second > 0 for p in pts)
    # the real head at the same k: identical output, acceptance near (0.8 + 0.64 + 0.512) / 3
    assert res.real.identical_output_fraction == 1.0 and abs(res.real.acceptance - 0.65) < 0.12
    assert "synthetic" in " ".join(res.notes) and "break-even" in res.table()
    # explicit geometric rates: the same acceptance through the other flag
    r2 = acceptance_curve(f20, CurveOptions(rates=(0.5,), draft_n_max=2, flag="synth-rates", seeds=(1, 2), limit=3,
                                            max_tokens=64, server=ServerOptions(threads=2), include_real=False,
                                            bootstrap_resamples=100), progress=False)
    assert r2.points[0].flag_value.startswith("synth-rates 0.6") and abs(r2.points[0].acceptance - 0.5) < 0.12
    with pytest.raises(TuneError, match="within"):
        CurveOptions(synth_len=(5.0,), draft_n_max=3)


@pytest.fixture(scope="module")
def profiles_ad(llama_server_bin, f20):
    from ggufmtp.measure.profiles.run import ProfilesOptions, run_profiles

    return run_profiles(f20, ProfilesOptions(workloads=("A", "D"), scale=1 / 16, num_requests=4,
                                             server=ServerOptions(threads=2)), progress=False)


def test_profiles_a_and_d_both_arms(profiles_ad):
    res = profiles_ad
    assert [(r.workload.name, r.arm) for r in res.results] == [("A", "vanilla"), ("A", "mtp"), ("D", "vanilla"),
                                                              ("D", "mtp")]
    for r in res.results:
        w, m = r.workload, r.metrics
        assert (w.input_tokens, w.output_tokens) == {"A": (32, 32), "D": (128, 16)}[w.name]
        assert m.requests == 4 and m.failed == 0 and m.output_tokens == 4 * w.output_tokens  # ignore_eos
        assert m.output_tokens_per_second > 0 and m.request_throughput > 0
        assert abs(m.mean_prompt_tokens - w.input_tokens) <= 2  # prompts built on the server's tokenizer
        for met in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
            dist = getattr(m, met)
            # p99 >= median always holds; p99 >= mean does not (one stalled gap among 124 lifts the mean
            # above the 99th percentile: seen in CI, ITL mean 0.57 ms, p99 0.40 ms)
            assert dist.mean > 0 and dist.p99 >= dist.median, (met, dist)
        assert m.itl_ms.n == 4 * (w.output_tokens - 1)  # one SSE chunk per token
        for q in r.requests:
            assert 0 < q.ttft_ms < q.e2e_ms and q.tpot_ms > 0 and q.n_out == w.output_tokens
        if r.arm == "mtp":
            assert 0.3 < m.acceptance < 1.0 and r.spec.n_drafts > 0 and r.spec.tokens_per_step > 1
            assert "--spec-type draft-mtp" in r.command
        else:
            assert m.acceptance is None and r.spec is None and "--spec-type" not in r.command
        assert f"--parallel {w.concurrency}" in r.command
    # D ran 2 clients at once: some requests overlap in time
    d = next(r for r in res.results if r.workload.name == "D" and r.arm == "vanilla").requests
    assert any(a.t_send < b.t_end and b.t_send < a.t_end for i, a in enumerate(d) for b in d[i + 1:])


def test_decision_table_shape(profiles_ad):
    from ggufmtp.measure.profiles.workloads import decision_table, format_decision_table

    table = profiles_ad.table
    assert [r.workload for r in table] == ["A", "D"]
    for row in table:
        assert set(row.deltas) == {"throughput", "ttft_mean", "ttft_p99", "tpot_mean", "tpot_p99", "itl_mean",
                                   "itl_p99"}
        tp = row.deltas["throughput"]
        assert tp == pytest.approx(row.mtp_tokens_per_second / row.vanilla_tokens_per_second - 1)
        expect = "no" if tp <= 0.02 else "mixed" if row.deltas["tpot_mean"] > 0.02 else "yes"
        assert row.mtp_helps == expect and row.within_noise == (abs(tp) <= 0.02)
        assert "throughput" in row.reasoning and "TTFT" in row.reasoning and "TPOT" in row.reasoning
        assert row.identical_output_fraction == 1.0 and 0 < row.acceptance < 1
    # the rule on its own: a wider noise band turns every "yes" into "no"
    assert all(r.mtp_helps == "no" for r in decision_table(profiles_ad.results, noise=1e9))
    text = format_decision_table(table)
    assert text.splitlines()[0].split()[:2] == ["workload", "MTP?"] and len(text.splitlines()) == 3
    assert "workload A" in profiles_ad.text() and "P99" not in text.splitlines()[0]


def test_decision_rule_on_the_h200_profiles():
    """The rule applied to the metrics the H200 measured (session 2): A gains throughput and decodes
    each request faster, D gains 3.2% throughput but each request decodes 14% slower, B and C lose."""
    from ggufmtp.measure.profiles.stream import ServingMetrics
    from ggufmtp.measure.profiles.workloads import ArmSettings, ProfileResult, Workload, decision_table

    data = json.loads((Path(__file__).parent.parent / "benchmarks/gpu/results-2026-11-21b-h200/profiles.json").read_text())
    results = [ProfileResult(Workload(**a["workload"]), a["arm"], ServingMetrics.from_dict(a["metrics"]), [],
                             a["command"], ArmSettings(**a["settings"]))
               for arms in data["workloads"].values() for a in arms.values()]
    rows = {r.workload: r for r in decision_table(results)}
    assert {k: r.mtp_helps for k, r in rows.items()} == {"A": "yes", "B": "no", "C": "no", "D": "mixed"}
    assert "TPOT +14.0%" in rows["D"].reasoning and "mixed" not in rows["A"].reasoning
    # the noise band is the one knob: at 3% D's +3.2% still counts (mixed), at 15% it does not (no)
    def verdicts(noise: float) -> dict[str, str]:
        return {r.workload: r.mtp_helps for r in decision_table(results, noise=noise)}

    assert verdicts(0.03)["D"] == "mixed" and verdicts(0.15) == {"A": "yes", "B": "no", "C": "no", "D": "no"}


def test_receipt_merge_keeps_verify_keys(tmp_path, small_tune, profiles_ad, f20):
    from ggufmtp.files.hashing import sha256_file
    from ggufmtp.provenance.audit import audit
    from ggufmtp.provenance.card import card_text
    from ggufmtp.provenance.receipt import load_receipt, receipt_for_quantize, schema_errors, set_verification
    from ggufmtp.quant.quantize import quantize

    q = quantize(f20, "q8_0-mtp", tmp_path / "tiny-q8.gguf", progress=False)
    rc = receipt_for_quantize(q)
    with pytest.raises(TuneError, match="no verification section"):
        store_in_receipt(rc, tuned=small_tune.to_dict())
    v = {"verdict": "pass", "mtp": {"acceptance": 0.65, "acceptance_ci95": [0.6, 0.7], "draft_n": 10,
                                    "draft_n_accepted": 6, "tokens_per_second": 100.0},
         "vanilla": {"tokens_per_second": 80.0}, "speedup": 1.25, "speedup_ci95": [1.2, 1.3],
         "identical_output_fraction": 1.0, "suite": {"name": "chat-v1", "sha256": "0" * 64},
         "server": {"build_info": "b1-0c1e570"}, "hardware": {"cpu": "x"}, "settings": {"draft_n_max": 4},
         "per_category": {"code": {"acceptance": 0.6}}, "model": {"size_bytes": q.output.stat().st_size,
                                                                    "sha256": sha256_file(q.output)},
         "tuned": {"command": "llama-server -m old --spec-draft-n-max 2", "from": "verify --sweep"},
         "thresholds": Thresholds().to_dict()}
    set_verification(rc, v)
    store_in_receipt(rc, model=q.output, tuned=small_tune.to_dict(), profiles=profiles_ad.to_dict())
    st = load_receipt(rc)
    assert schema_errors(st) == []
    got = st["predicate"]["verification"]
    for k in v:
        if k != "tuned":
            assert got[k] == v[k], k  # verify's results kept as they were
    # the receipt names the model file, not its local path (#28)
    assert got["tuned"]["command"] == redact_local_paths(small_tune.command) and got["tuned"]["kind"] == "ggufmtp tune"
    assert got["tuned"]["verify_sweep"] == v["tuned"]  # verify --sweep's recommendation kept beside it
    assert got["profiles"]["decision_table"][0]["workload"] == "A"
    assert audit(q.output, rc).ok
    # a model of the same size but other bytes is not the verified one: refused, naming both digests
    other = tmp_path / "other.gguf"
    data = bytearray(q.output.read_bytes())
    data[-1] ^= 0xFF
    other.write_bytes(bytes(data))
    with pytest.raises(TuneError, match=f"sha256 {sha256_file(q.output)}, not {other} \\(sha256 {sha256_file(other)}\\)"):
        store_in_receipt(rc, model=other, tuned=small_tune.to_dict())
    _, body = card_text(st, q.output.name)
    assert redact_local_paths(small_tune.command) in body
    with pytest.raises(TuneError, match="byte model"):
        store_in_receipt(rc, model=f20, tuned=small_tune.to_dict())


def test_cli_tune_alias_profiles_and_curve(tmp_path, llama_server_bin, f20):
    shutil.copy(f20, tmp_path / "m.gguf")
    m = tmp_path / "m.gguf"
    r = CliRunner().invoke(main, ["verify", str(m), "--tune", "--budget", "4", "--limit", "2", "--max-tokens", "32",
                                  "--threads", "2", "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["kind"] == "ggufmtp tune" and d["schedule"]["evaluations"] <= 4 and d["settings"]["seeds"] == [42]
    assert d["command"].startswith("llama-server --model ")
    assert d["schedule"]["n_candidates"] == 77 and any("-bs" in n for n in d["notes"])  # CPU: dims skipped, said
    r = CliRunner().invoke(main, ["profiles", str(m), "--workloads", "A", "--scale", "0.03", "--num-requests", "2",
                                  "--threads", "2"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "workload A: single decode (16 in, 15 out, 1 concurrent; 2 requests" in r.output and "MTP?" in r.output
    # --server-arg reaches both arms' command lines; --tuned-from sets the MTP arm's window
    (tmp_path / "t.json").write_text(json.dumps({"kind": "ggufmtp tune", "recommended_config": {"draft_n_max": 2}}))
    r = CliRunner().invoke(main, ["profiles", str(m), "--workloads", "A", "--scale", "0.03", "--num-requests", "1",
                                  "--threads", "2", "--server-arg=--no-warmup", "--tuned-from", str(tmp_path / "t.json"),
                                  "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    arms = json.loads(r.output)["workloads"]["A"]
    assert all("--no-warmup" in arms[a]["command"] for a in ("vanilla", "mtp"))
    assert "--spec-draft-n-max 2" in arms["mtp"]["command"] and "draft-mtp" not in arms["vanilla"]["command"]
    r = CliRunner().invoke(main, ["curve", str(m), "--rates", "1", "--limit", "1", "--seeds", "1", "--no-real",
                                  "--max-tokens", "16", "--threads", "2", "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    c = json.loads(r.output)
    assert c["points"][0]["acceptance"] == 1.0 and c["real"] is None and c["draft_n_max"] == 3
    r = CliRunner().invoke(main, ["tune", str(m), "--budget", "1", "--threads", "2"])
    assert r.exit_code == 1 and "too small" in r.output


# ------------------------------------------------------------------------------------------------
# a reply that ends at once decodes nothing: tune and curve as verify (stats.decoded)
# ------------------------------------------------------------------------------------------------


def _reply(n: int, ms: float):
    from types import SimpleNamespace

    return SimpleNamespace(predicted_n=n, predicted_ms=ms, text="x" * n, draft_n=0, draft_n_accepted=0)


# llama-server's timings for a reply that ended at once (its one token from the prompt pass), and one that decoded
ENDS_AT_ONCE, DECODED_VAN, DECODED_MTP = (1, 0.001), (33, 100.0), (33, 50.0)


def test_tune_counts_no_decode_for_a_reply_that_ends_at_once():
    """verify stopped counting a one-token reply's token without time (1,000,000 tok/s on its own,
    048e595); tune's units counted it still: 34 tokens in 50.001 ms where 33 were decoded in 50."""
    from types import SimpleNamespace

    from ggufmtp.measure.tune.bench import ServerEvaluator

    p1, p2 = SimpleNamespace(id="q1"), SimpleNamespace(id="q2")
    van = [(p1, 42, _reply(*ENDS_AT_ONCE)), (p2, 42, _reply(*DECODED_VAN))]
    mtp = [(p1, 42, _reply(*ENDS_AT_ONCE)), (p2, 42, _reply(*DECODED_MTP))]
    evaluator = SimpleNamespace(order=SimpleNamespace(run=lambda a, b: (a(), b())), bar=None,
                                bench=SimpleNamespace(concurrency=1, run=lambda srv, u: (mtp, 1.0)),
                                _vanilla=lambda srv, u: (van, 1.0), suite=None)
    evaluator._mismatch = lambda srv, mtp, differing: ServerEvaluator._mismatch(evaluator, srv, mtp, differing)
    r = ServerEvaluator._pair(evaluator, None, None, 0)
    assert (r.mtp_tokens, r.mtp_ms, r.van_tokens, r.van_ms) == (33, 50.0, 33, 100.0)
    assert r.identical and r.requests == 2


def test_curve_counts_no_decode_for_a_reply_that_ends_at_once():
    """The same in the acceptance curve's per-prompt sums: the prompt whose replies end at once
    adds nothing to either arm's throughput."""
    from types import SimpleNamespace

    from ggufmtp.measure.profiles.curve import _run_pairs

    p1, p2 = SimpleNamespace(id="q1"), SimpleNamespace(id="q2")
    van, mtp = object(), object()
    timings = {(van, "q1"): ENDS_AT_ONCE, (mtp, "q1"): ENDS_AT_ONCE, (van, "q2"): DECODED_VAN, (mtp, "q2"): DECODED_MTP}
    bench = SimpleNamespace(one=lambda srv, p, s: _reply(*timings[srv, p.id]))
    arms = SimpleNamespace(prompts=[p1, p2], seeds=[42], order=SimpleNamespace(run=lambda a, b: (a(), b())),
                           bench=bench, van=van, bar=SimpleNamespace(update=lambda n: None))
    units, identical = _run_pairs(arms, mtp)
    assert units == [[0, 0, 0, 0, 0, 0], [33, 50.0, 33, 100.0, 0, 0]] and identical == 2


def test_a_drop_names_why_the_difference_was_not_analysed():
    """On an H100 with GGML_CUDA_GRAPH_OPT=1, vanilla's own greedy replies vary from request to
    request, so its reply does not reproduce for the numerics analysis: the drop says so."""
    from ggufmtp.measure.tune.search import Mismatch, UnitResult, _drop_reason

    why = "vanilla's reply did not reproduce through /completion"
    m = Mismatch("p", 42, 37, "abc", "abd", why=why)
    assert _drop_reason(None, [UnitResult(0, 1, 1, 1, 1, identical=False, mismatch=m)], [0]) == \
        f"output differs from vanilla ({why})"
    explained = dataclasses.replace(m, why=None, margin_nats=0.01, drift_nats=0.2, explained=True)
    assert _drop_reason(None, [UnitResult(0, 1, 1, 1, 1, identical=False, explained=True, mismatch=explained)], [0]) is None
