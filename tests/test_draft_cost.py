"""benchmarks/draft_cost.py (issue #52): the step-time breakdown read from llama-server's own lines
(two consecutive statistics lines as the pinned server wrote them, trace level), the identity
model's arithmetic on designed numbers, the window list and the verify batch's cost line, and the
graph-use lines of benchmarks/draft_cost_log.py; one runtime smoke of ``--k 2,3`` on the tiny model
(CPU: no CUDA graph lines). The GPU numbers are the `draftcost` stage's."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
# as the pinned llama-server (0c1e570, -lv 4) printed them after a warm-up and one request
LOG = """\
0.06.076.303 I spec common_specu: statistics        draft-mtp: #calls(b,g,a) =    1     12     12, #gen drafts =     12, \
#acc drafts =    10, #gen tokens =     45, #acc tokens =    27, #mean acc len = 3.25, #acc rate/pos = (0.833, 0.583, \
0.500, 0.333), dur(b,g,a) = 0.001, 5.771, 0.004 ms
0.07.431.730 I spec common_specu: statistics        draft-mtp: #calls(b,g,a) =    2     21     21, #gen drafts =     21, \
#acc drafts =    19, #gen tokens =     81, #acc tokens =    56, #mean acc len = 3.67, #acc rate/pos = (0.905, 0.714, \
0.571, 0.476), dur(b,g,a) = 0.002, 8.480, 0.006 ms
"""


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # its dataclasses look their module up while the file runs; draft_cost imports draft_cost_log
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def dc():
    _load("draft_cost_log")
    return _load("draft_cost")


@pytest.fixture(scope="module")
def dl(dc):
    return sys.modules["draft_cost_log"]


def test_the_statistics_lines_are_read_and_the_warm_up_subtracted(dc):
    first, second = dc.DraftStats.readings(LOG)
    assert (first.draft_calls, first.drafted, first.accepted, first.draft_ms) == (12, 45, 27, 5.771)
    d = second.since(first)
    assert (d.draft_calls, d.accept_calls, d.drafted, d.accepted) == (9, 9, 36, 29)
    assert d.draft_ms == pytest.approx(2.709) and d.accept_ms == pytest.approx(0.002)
    assert dc.DraftStats.readings(LOG, impl="draft-simple") == []


def _breakdown(dc, verify_ms: float = 650.0, drafted: int = 400):
    # designed: vanilla 5 ms/token; 100 steps of 3.5 tokens at 10 ms (draft 3, accept 0.5, verify 6.5) by default
    stats = dc.DraftStats(draft_calls=100, accept_calls=100, drafted=drafted, accepted=250, draft_ms=300.0,
                          accept_ms=40.0, begin_ms=10.0)
    return dc.Breakdown(vanilla_tokens=1000, vanilla_ms=5000.0, mtp_tokens=350, mtp_ms=350.0 + verify_ms, steps=100,
                        draft=stats)


def test_the_breakdown_is_an_identity_and_each_counterfactual_changes_one_term(dc):
    b = _breakdown(dc)
    d = b.to_dict(target=2.0)  # rounded to 4 decimals for the JSON
    assert d["speedup"] == pytest.approx((350 / 1000) / (1000 / 5000))  # the measured throughput ratio
    assert d["verify_ms_per_step"] == pytest.approx(6.5, abs=1e-3)
    assert d["verify_cost_in_vanilla_tokens"] == pytest.approx(1.3, abs=1e-3)
    assert d["speedup_if_drafting_were_free"] == pytest.approx(3.5 * 5 / 7.0, abs=1e-3)
    assert d["speedup_if_the_batch_cost_one_token"] == pytest.approx(3.5 * 5 / (5 + 3 + 0.5), abs=1e-3)
    assert d["draft_ms_per_step_for_target"] == pytest.approx(3.5 * 5 / 2.0 - 6.5 - 0.5, abs=1e-3)
    assert "| speedup if drafting were free | 2.500 |" in b.markdown(2.0)


# --------------------------------------------------------------------------- windows and the batch line

def test_k_takes_one_window_or_a_list_and_refuses_anything_else(dc):
    assert dc.windows_arg("4") == (4,)
    assert dc.windows_arg("3,4,5,6,7") == (3, 4, 5, 6, 7)
    for bad in ("3,x", "0", "3,3", ","):
        with pytest.raises(argparse.ArgumentTypeError):
            dc.windows_arg(bad)
    assert dc._parser().parse_args(["m.gguf", "--k", "2,3"]).k == (2, 3)


def test_a_k_list_overrides_the_tuned_window_and_keeps_the_rest_of_the_configuration(dc):
    from ggufmtp.measure.core.tuned import ArmArgs, TuneConfig

    arms = ArmArgs.of(tuned=TuneConfig(draft_n_max=4, draft_n_min=4, draft_p_min=0.5))
    base = {"model": "m.gguf", "gpu_layers": None, "threads": None}
    listed = dc._mtp_fields(arms, base, 2, from_list=True)
    assert (listed["draft_n_max"], listed["draft_n_min"], listed["draft_p_min"]) == (2, 2, 0.5)  # n-min kept <= k
    assert dc._mtp_fields(arms, base, 2, from_list=False)["draft_n_max"] == 4  # no list: the tuned window


def test_the_batch_cost_line_is_least_squares_on_the_measured_batch_sizes(dc):
    line = dc.BatchCost.fit([(3.0, 5.0), (4.0, 6.5), (5.0, 8.0)])  # exactly 0.5 + 1.5 b
    assert (line.slope_ms, line.intercept_ms, line.points) == (pytest.approx(1.5), pytest.approx(0.5), 3)
    assert line.at(1) == pytest.approx(2.0)
    off = dc.BatchCost.fit([(2.0, 1.0), (3.0, 3.0), (4.0, 2.0)])  # means (3, 2); Sxy 1, Sxx 2
    assert (off.slope_ms, off.intercept_ms) == (pytest.approx(0.5), pytest.approx(0.5))
    assert dc.BatchCost.fit([(4.0, 6.0)]) is None and dc.BatchCost.fit([(4.0, 6.0), (4.0, 7.0)]) is None
    d = line.to_dict(vanilla_ms_per_token=5.0)
    assert d == {"ms_per_batch_token": 1.5, "intercept_ms": 0.5, "vanilla_tokens_per_batch_token": 0.3,
                 "ms_at_b1": 2.0, "windows": 3}


def _graphs(dl, steps: int = 100):
    return dl.GraphUse(cuda=True, llama_reused=steps // 2, reused=4 * steps, warmup_complete=steps // 4,
                       warmup_reset=steps, reused_ids=2)


def test_a_window_row_states_its_batch_speedup_and_trace_cost(dc, dl):
    # designed: k=4 with 350 drafted in 100 steps (b = 4.5); untraced 350 tokens in 875 ms against vanilla 5 ms/token
    w = dc.Window(4, _breakdown(dc, drafted=350), untraced_tokens=350, untraced_ms=875.0, graphs=_graphs(dl))
    assert w.batch_tokens == pytest.approx(4.5)
    assert w.untraced_speedup == pytest.approx((350 / 875) / (1000 / 5000))  # 2.0
    assert w.trace_cost == pytest.approx((1000 / 350) / (875 / 350) - 1)  # traced 1000 ms against 875
    row = dc.window_table([w]).splitlines()[2]
    assert row == "| 4 | 4.500 | 3.500 | 10.000 | 3.000 | 0.857 | 6.500 | 1.300 | 2.000 |"
    d = w.to_dict(2.0)
    assert d["graphs_per_step"]["cuda_graphs"] == {"reused": 4.0, "warmup_complete": 0.25, "warmup_reset": 1.0,
                                                   "disabled_unsupported_node": 0.0}
    assert d["graphs_per_step"]["llama_graphs_reused"] == 0.5


def test_the_report_keeps_the_single_window_form_and_adds_the_line_for_several(dc, dl):
    vanilla, traced = dc.Run(1000, 5000.0), dc.Run(1000, 5500.0, graphs=_graphs(dl, 1000))
    ws = tuple(dc.Window(k, _breakdown(dc, verify_ms=v, drafted=100 * k), 350, 875.0, _graphs(dl))
               for k, v in ((3, 550.0), (4, 650.0), (5, 750.0)))  # verify 5.5, 6.5, 7.5 ms at b = 4, 5, 6
    one = dc.Report("m.gguf", "k=4", None, 8, (42,), 128, 1.5, vanilla, traced, ws[1:2])
    assert "(vanilla's trace cost +10.0%), traced MTP server (untraced speedup 2.000x" in one.markdown()
    assert "| speedup if drafting were free |" in one.markdown() and "Verify ms =" not in one.markdown()
    assert {"breakdown", "untraced", "windows", "vanilla"} <= set(one.to_dict())
    assert one.to_dict()["verify_batch_cost"] is None
    three = dc.Report("m.gguf", "k=3,4,5", None, 8, (42,), 128, 1.5, vanilla, traced, ws)
    md, d = three.markdown(), three.to_dict()
    assert "Verify ms = 1.500 + 1.000 x b (least squares over 3 windows" in md
    assert "each extra batch token costs 0.200 vanilla tokens" in md
    assert [r.split(" | ")[0] for r in md.splitlines() if r.startswith("| MTP k=")] == ["| MTP k=3", "| MTP k=4",
                                                                                        "| MTP k=5"]
    assert d["verify_batch_cost"]["ms_per_batch_token"] == 1.0 and "breakdown" not in d
    assert [w["k"] for w in d["windows"]] == [3, 4, 5]
    assert d["vanilla"]["graphs_per_token"]["cuda_graphs"]["warmup_reset"] == 1.0


# --------------------------------------------------------------------------- graph lines

# A designed -lv 5 log of a CUDA MTP server: start-up, the warm-up request, two measured requests. The
# lines are the pinned source's formats (common/log.cpp prefix "M.SS.mmm.uuu L "):
#   src/llama.cpp:      LLAMA_LOG_INFO("%s: using device %s (%s) (%s) - %zu MiB free\n", ...)
#   ggml-cuda.cu:       GGML_LOG_DEBUG("CUDA Graph id %zu reused\n", cgraph->uid);
#   ggml-cuda.cu:       GGML_LOG_DEBUG("%s: CUDA graph warmup complete\n", __func__);
#   ggml-cuda.cu:       GGML_LOG_DEBUG("%s: CUDA graph warmup reset\n", __func__);
#   ggml-cuda.cu:       GGML_LOG_DEBUG("%s: disabling CUDA graphs due to unsupported node type\n", __func__);  (#ifndef NDEBUG)
#   server-context.cpp: SLT_INF(*this, "   graphs reused = %10d\n", llama_perf_context(ctx_tgt).n_reused);
REUSED = "0.00.{:03d}.000 D CUDA Graph id {} reused\n"
COMPLETE = "0.00.100.000 D ggml_backend_cuda_graph_compute: CUDA graph warmup complete\n"
RESET = "0.00.100.000 D ggml_backend_cuda_graph_compute: CUDA graph warmup reset\n"
DISABLED = "0.00.100.000 D ggml_cuda_graph_check_compability: disabling CUDA graphs due to unsupported node type\n"


def _end(task: int, reused: int) -> str:
    return f"0.00.146.487 I slot print_timing: id  0 | task {task} |    graphs reused = {reused:10d}\n"


CUDA_LOG = (
    "0.00.010.000 I llama_model_load_from_file_impl: using device CUDA0 (NVIDIA H200) (0000:19:00.0) - 139000 MiB free\n"
    + COMPLETE + RESET  # the server's own warm-up: before any request, not counted
    + REUSED.format(1, 7) * 3 + COMPLETE + _end(0, 4)  # the warm-up request: not counted
    + REUSED.format(2, 7) * 5 + REUSED.format(3, 9) * 2 + COMPLETE + RESET + RESET + _end(9, 10)
    + REUSED.format(4, 9) * 3 + DISABLED + RESET + _end(16, 13)
    + REUSED.format(5, 11) * 40  # after the last request's line: not counted
)


def test_graph_lines_are_counted_between_the_warm_up_and_the_last_request(dl):
    g = dl.GraphUse.between(CUDA_LOG, 1, 3)
    assert g == dl.GraphUse(cuda=True, llama_reused=13 - 4, reused=10, warmup_complete=1, warmup_reset=3,
                            disabled_unsupported_node=1, reused_ids=2)
    r = g.rates(5)  # per MTP step: 5 steps
    assert (r.llama_reused, r.cuda, r.note) == (pytest.approx(1.8), pytest.approx((2.0, 0.2, 0.6, 0.2)), None)
    assert r.text().startswith("reused 2.00, warm-up complete 0.20, warm-up resets 0.60, disabled (unsupported node) 0.20")
    with pytest.raises(ValueError, match="expected 4"):
        dl.GraphUse.between(CUDA_LOG, 1, 4)


def test_a_cpu_log_says_it_has_no_cuda_graph_lines_instead_of_zeros(dl):
    cpu = "0.00.001.842 I cmn  common_param:   - CPU     : AMD EPYC (24105 MiB, 24105 MiB free)\n" + _end(0, 4) + _end(9, 6)
    r = dl.GraphUse.between(cpu, 1, 2).rates(2)
    assert (r.llama_reused, r.cuda, r.note) == (1.0, None, "no CUDA graph lines (not a CUDA backend)")
    assert r.text() == "no CUDA graph lines (not a CUDA backend)"
    assert r.to_dict()["cuda_graphs"] is None
    # a CUDA device whose graphs wrote nothing: graphs off or rejected, which a release build does not log
    silent = CUDA_LOG.splitlines(keepends=True)[0] + _end(0, 4) + _end(9, 6)
    assert dl.GraphUse.between(silent, 1, 2).rates(2).note.startswith("a CUDA device but no CUDA graph lines")


def test_a_log_below_the_debug_level_says_the_graph_lines_were_not_logged(dl):
    """At the default --trace-level 4 ggml's debug lines never reach the log: a CUDA server there has no
    graph lines whatever its graphs did, and the report says the level, not 'graphs off or rejected'."""
    silent = CUDA_LOG.splitlines(keepends=True)[0] + _end(0, 4) + _end(9, 6)
    r = dl.GraphUse.between(silent, 1, 2, debug_logged=False).rates(2)
    assert r.cuda is None and r.note.startswith("CUDA graph lines not logged at this trace level: --trace-level 5")
    assert r.llama_reused == 1.0  # the server's own 'graphs reused' line is at -lv 4 too


# --------------------------------------------------------------------------- the real server


@pytest.mark.runtime
def test_a_window_list_on_the_tiny_model_gives_a_consistent_row_each(dc, tiny_mtp_model, llama_server_bin, tmp_path):
    out = tmp_path / "dc.json"
    assert dc.main([str(tiny_mtp_model), "--k", "2,3", "--limit", "2", "--max-tokens", "32", "--threads", "1",
                    "--json", str(out), "--md", str(tmp_path / "dc.md")]) == 0
    d = json.loads(out.read_text())
    assert [w["k"] for w in d["windows"]] == [2, 3]
    for w in d["windows"]:
        b = w["breakdown"]
        assert b["step_ms"] == pytest.approx(b["draft_ms_per_step"] + b["accept_ms_per_step"]
                                             + b["verify_ms_per_step"], abs=1e-3)
        # b counts drafted tokens only; tokens per step also counts each request's first token (no step)
        assert 1 < w["batch_tokens"] <= 1 + w["k"] and b["tokens_per_step"] >= 1
        assert b["counts"]["steps"] > 0 and w["untraced"]["tokens"] > 0
        g = w["graphs_per_step"]
        assert g["note"] == "no CUDA graph lines (not a CUDA backend)" and g["cuda_graphs"] is None
        assert g["llama_graphs_reused"] >= 0
    assert d["vanilla"]["graphs_per_token"]["note"] == "no CUDA graph lines (not a CUDA backend)"
    assert d["verify_batch_cost"]["windows"] == 2
    md = (tmp_path / "dc.md").read_text()
    assert "| MTP k=2 | step |" in md and "| MTP k=3 | step |" in md and "Verify ms =" in md
