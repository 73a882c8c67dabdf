"""benchmarks/draft_cost.py (issue #52): the step-time breakdown read from llama-server's own lines
(two consecutive statistics lines as the pinned server wrote them, trace level) and the identity
model's arithmetic on designed numbers; the real-server run is the `draftcost` GPU stage's."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "draft_cost.py"
# as the pinned llama-server (0c1e570, -lv 4) printed them after a warm-up and one request
LOG = """\
0.06.076.303 I spec common_specu: statistics        draft-mtp: #calls(b,g,a) =    1     12     12, #gen drafts =     12, \
#acc drafts =    10, #gen tokens =     45, #acc tokens =    27, #mean acc len = 3.25, #acc rate/pos = (0.833, 0.583, \
0.500, 0.333), dur(b,g,a) = 0.001, 5.771, 0.004 ms
0.07.431.730 I spec common_specu: statistics        draft-mtp: #calls(b,g,a) =    2     21     21, #gen drafts =     21, \
#acc drafts =    19, #gen tokens =     81, #acc tokens =    56, #mean acc len = 3.67, #acc rate/pos = (0.905, 0.714, \
0.571, 0.476), dur(b,g,a) = 0.002, 8.480, 0.006 ms
"""


@pytest.fixture(scope="module")
def dc():
    spec = importlib.util.spec_from_file_location("draft_cost", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["draft_cost"] = mod  # its dataclasses look their module up while the file runs
    spec.loader.exec_module(mod)
    return mod


def test_the_statistics_lines_are_read_and_the_warm_up_subtracted(dc):
    first, second = dc.DraftStats.readings(LOG)
    assert (first.draft_calls, first.drafted, first.accepted, first.draft_ms) == (12, 45, 27, 5.771)
    d = second.since(first)
    assert (d.draft_calls, d.accept_calls, d.drafted, d.accepted) == (9, 9, 36, 29)
    assert d.draft_ms == pytest.approx(2.709) and d.accept_ms == pytest.approx(0.002)
    assert dc.DraftStats.readings(LOG, impl="draft-simple") == []


def test_the_breakdown_is_an_identity_and_each_counterfactual_changes_one_term(dc):
    # designed: vanilla 5 ms/token; 100 steps of 3.5 tokens at 10 ms (draft 3, accept 0.5, verify 6.5)
    stats = dc.DraftStats(draft_calls=100, accept_calls=100, drafted=400, accepted=250, draft_ms=300.0,
                          accept_ms=40.0, begin_ms=10.0)
    b = dc.Breakdown(vanilla_tokens=1000, vanilla_ms=5000.0, mtp_tokens=350, mtp_ms=1000.0, steps=100, draft=stats)
    d = b.to_dict(target=2.0)  # rounded to 4 decimals for the JSON
    assert d["speedup"] == pytest.approx((350 / 1000) / (1000 / 5000))  # the measured throughput ratio
    assert d["verify_ms_per_step"] == pytest.approx(6.5, abs=1e-3)
    assert d["verify_cost_in_vanilla_tokens"] == pytest.approx(1.3, abs=1e-3)
    assert d["speedup_if_drafting_were_free"] == pytest.approx(3.5 * 5 / 7.0, abs=1e-3)
    assert d["speedup_if_the_batch_cost_one_token"] == pytest.approx(3.5 * 5 / (5 + 3 + 0.5), abs=1e-3)
    assert d["draft_ms_per_step_for_target"] == pytest.approx(3.5 * 5 / 2.0 - 6.5 - 0.5, abs=1e-3)
    assert "| speedup if drafting were free | 2.500 |" in b.markdown(2.0)
