"""``verify --parallel N`` (issue #30): acceptance per slot count against one slot, concurrent
clients on real llama-servers; the verdict (and the audit's re-derived verdict) fails when a slot
count's acceptance leaves the single-slot CI (upstream ggml-org/llama.cpp#27572) or its replies
differ from vanilla's."""

from __future__ import annotations

import copy
import json

import pytest
from click.testing import CliRunner
from receipt_kit import honest_statement, slot_replies, synth_artifact, verification_record

from ggufmtp.cli import main
from ggufmtp.measure.core.suite import load_suite
from ggufmtp.measure.verify.slots import slot_counts
from ggufmtp.provenance.audit import audit, format_audit
from ggufmtp.provenance.receipt import seal
from ggufmtp.provenance.verdict import Thresholds, Verdict, judge_recorded, slot_failures
from ggufmtp.synth.calibrate import chat_last_tokens
from ggufmtp.synth.chain import suite_acceptance
from ggufmtp.synth.spec import SynthSpec

N_PROMPTS, MAX_TOKENS = 8, 64


def _slots(reference: float, ci: tuple[float, float], *rows: tuple[int, float, int, int]) -> dict:
    return {"reference": {"slots": 1, "acceptance": reference, "acceptance_ci95": list(ci)},
            "rows": [{"slots": s, "acceptance": a, "identical": same, "pairs": pairs,
                      "replies": slot_replies(pairs, pairs - same)} for s, a, same, pairs in rows]}


def test_slot_counts_double_up_to_n():
    assert slot_counts(1) == [] and slot_counts(2) == [2]
    assert slot_counts(4) == [2, 4] and slot_counts(6) == [2, 4, 6]


@pytest.fixture(scope="module")
def measured(synth_model):
    spec = SynthSpec(wrong_successor_fraction=0.2)
    model = synth_model(spec)
    r = CliRunner().invoke(main, ["verify", str(model), "--parallel", "4", "--limit", str(N_PROMPTS), "--seeds", "42",
                                  "--max-tokens", str(MAX_TOKENS), "--threads", "1", "--json"])
    assert r.exit_code == 0, r.output
    return spec, json.loads(r.output[r.output.index("{"):])


def test_verify_parallel_reports_acceptance_per_slot_count_against_one_slot(measured):
    """On the CPU the pinned server drafts as well under 2 and 4 concurrent slots as under one: the
    same drafted and accepted tokens as the single-slot run, every reply equal to vanilla's."""
    spec, d = measured
    slots = d["slots"]
    assert [r["slots"] for r in slots["rows"]] == [2, 4]
    ref = slots["reference"]
    assert ref["acceptance"] == d["mtp"]["acceptance"] and ref["acceptance_ci95"] == d["mtp"]["acceptance_ci95"]
    for row in slots["rows"]:
        assert (row["draft_n"], row["draft_n_accepted"]) == (d["mtp"]["draft_n"], d["mtp"]["draft_n_accepted"])
        assert row["identical"] == row["pairs"] == N_PROMPTS and row["requests"] == N_PROMPTS
        assert row["mtp_tokens_per_second"] > 0 and row["vanilla_tokens_per_second"] > 0
    assert d["verdict"] == "pass" and slot_failures(slots, Thresholds()) == []
    assert judge_recorded(d)[0] == Verdict.PASS, judge_recorded(d)[1]  # the recorded per-request evidence re-judges
    for row in slots["rows"]:
        assert sorted((r["prompt"], r["seed"]) for r in row["replies"]) == sorted((p.id, 42) for p in load_suite().limit(N_PROMPTS).prompts)
        assert all(r["first_difference"] is None and r["text_of"] is None for r in row["replies"])
    assert 0.5 < ref["acceptance"] < 0.9, "the knob's model must draft and also miss"


def test_acceptance_outside_the_single_slot_ci_fails_the_verdict():
    th = Thresholds()
    assert slot_failures(None, th) == []
    assert slot_failures(_slots(0.66, (0.62, 0.69), (2, 0.65, 8, 8), (4, 0.68, 8, 8)), th) == []
    (reason,) = slot_failures(_slots(0.66, (0.62, 0.69), (2, 0.65, 8, 8), (4, 0.12, 8, 8)), th)
    assert "acceptance at 4 slots 12.0 %" in reason and "#27572" in reason
    (reason,) = slot_failures(_slots(0.66, (0.62, 0.69), (2, 0.65, 7, 8)), th)
    assert "identical output at 2 slots: 7/8" in reason
    # no CI (one prompt): the single-slot point itself is the bound
    assert slot_failures(_slots(0.5, (None, None), (2, 0.5, 1, 1)), th) == []  # type: ignore[arg-type]
    assert slot_failures(_slots(0.5, (None, None), (2, 0.4, 1, 1)), th)  # type: ignore[arg-type]
    assert slot_failures({"rows": "x"}, th) == ["the slots section is not what verify --parallel writes"]


def test_the_audit_rederives_a_slot_failure(tmp_path):
    """A receipt whose verification passes at one slot but collapses at four, recorded as a pass,
    fails the audit; recorded honestly as a fail, it audits clean (a failing verdict is not a lie)."""
    art = synth_artifact(tmp_path)
    collapsed = _slots(0.9, (0.88, 0.92), (2, 0.9, 162, 162), (4, 0.05, 162, 162))
    passing = copy.deepcopy(verification_record("00" * 32, 1))  # the figures; model binding comes from honest_statement
    passing["slots"] = collapsed
    assert judge_recorded(passing)[0] == Verdict.FAIL
    for recorded in ("pass", "fail"):
        st = honest_statement(art, "pass")
        v = st["predicate"]["verification"]
        v["slots"], v["verdict"] = collapsed, recorded
        rc = art.with_name(art.name + ".receipt.json")
        rc.write_text(json.dumps(seal(st)))
        rep = audit(art, rc)
        failed = {c.name: c.detail for c in rep.failures}
        if recorded == "pass":
            assert "verdict follows from the figures" in failed, format_audit(rep)
            assert "4 slots" in failed["verdict follows from the figures"]
        else:
            assert "verdict follows from the figures" not in failed, format_audit(rep)


def test_the_knob_predicts_every_slot_counts_drafts(measured):
    """The per-slot figures are the model's, not noise: at every slot count the drafted and accepted
    tokens are exactly the replay of the server's draft loop on the suite's prompts."""
    spec, d = measured
    prompts = load_suite().limit(N_PROMPTS).prompts
    want = suite_acceptance(spec, chat_last_tokens([p.chat_messages() for p in prompts], threads=1), MAX_TOKENS, 4)
    for row in d["slots"]["rows"]:
        assert (row["draft_n"], row["draft_n_accepted"]) == (want.drafted, want.accepted), row
