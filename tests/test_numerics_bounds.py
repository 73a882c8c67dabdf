"""The numerics rule cannot be stretched (issue #40, item 2): a difference is explained only when
the MTP reply's token is vanilla's runner-up or its batched argmax, the drift is bounded and was
measured on enough positions, numerics explain at most half of the replies, and a mismatch listed
twice counts once; the tokens are judged by id (issue #49, item 5), and a mismatch must be one the
run measured. Every case is designed recorded data, judged as ``audit`` re-judges a receipt
(and through the real audit of a real artifact), so nothing depends on a CPU's rounding."""

from __future__ import annotations

import copy
import json
import math

import pytest

from ggufmtp.provenance.verdict import (
    MAX_DRIFT_NATS,
    MIN_DRIFT_POSITIONS,
    Divergence,
    Thresholds,
    Verdict,
    judge_recorded,
    numerics_failure,
)

TH = Thresholds(min_acceptance=0.3, min_speedup=1.1, source="test")

# vanilla says "12", the MTP reply "13": the divergence is the token "2" (vanilla's) against "3"
VANILLA, MTP, AT = "The sum of 5 and 7 is 12.", "The sum of 5 and 7 is 13.", 23


def _id(text: str) -> int:
    """A designed vocabulary: one id per token text."""
    return 1000 + sum(ord(c) * 31 ** i for i, c in enumerate(text))


def _mismatch(i: int, *, margin: float = 0.05, mtp_token: str = "3", runner_up: str = "3", batched: str = "2",
              mtp_text: str = MTP) -> dict:
    return {"prompt_id": f"p{i}", "seed": 42, "mode": "default", "endpoint": "chat", "k": 3,
            "first_difference_at": AT, "vanilla": VANILLA, "mtp": mtp_text, "vanilla_tokens": 9, "mtp_tokens": 9,
            "token_index": 8, "margin_nats": margin, "batched_flip": False, "vanilla_token": "2",
            "mtp_token": mtp_token, "runner_up_token": runner_up, "batched_token": batched, "explained": True,
            "vanilla_token_id": _id("2"), "mtp_token_id": _id(mtp_token), "runner_up_token_id": _id(runner_up),
            "batched_token_id": _id(batched)}


def _recorded(mismatches: list[dict], pairs: int = 4, drift: float = 0.21, positions: int = 32) -> dict:
    same = pairs - len({m["prompt_id"] for m in mismatches}) if mismatches else pairs
    return {"verdict": "pass", "mtp": {"acceptance": 0.8}, "speedup": 1.0, "identical_output_fraction": same / pairs,
            "identical_outputs": {"identical": same, "pairs": pairs}, "mismatch_count": pairs - same,
            "mismatches": mismatches,
            "modes": {"default": {"mtp": {"acceptance": 0.8}, "speedup": 1.0, "identical_output_fraction": same / pairs}},
            "settings": {"n_prompts": pairs, "seeds": [42], "draft_n_max": 3, "max_tokens": 64,
                         "prompt_ids": [f"p{i}" for i in range(pairs)], "modes": ["default"], "endpoints": ["chat"]},
            "thresholds": TH.to_dict(), "hardware": {"offloaded": False},
            "numerics_drift_nats": drift, "numerics_positions": positions}


def test_a_runner_up_difference_within_a_calibrated_drift_is_explained():
    assert judge_recorded(_recorded([_mismatch(0)])) == (Verdict.PASS, [])
    # vanilla's own one-batch argmax explains it too
    assert judge_recorded(_recorded([_mismatch(0, runner_up="9", batched="3")])) == (Verdict.PASS, [])


def test_a_token_vanilla_ranks_third_is_a_real_divergence():
    """Fails on the rule before #40: margin <= drift alone made it "explained"."""
    verdict, reasons = judge_recorded(_recorded([_mismatch(0, mtp_token="4", mtp_text=MTP.replace("13", "14"))]))
    assert verdict == Verdict.FAIL
    assert any(f"neither vanilla's runner-up (id {_id('3')}, '3') nor vanilla's one-batch argmax (id {_id('2')}, '2')"
               in r for r in reasons), reasons


def test_a_runner_up_whose_text_begins_the_mtp_token_is_another_token():
    """#49 item 5: the MTP reply took " tree" where vanilla took " the" and vanilla's runner-up was
    " tr". Verify before token ids recorded the runner-up as the MTP token (its text lies in the MTP
    reply over the first differing character), and the rule, comparing texts, explained it; by id
    the MTP token is neither vanilla's runner-up nor its batched argmax: a real divergence. Fails on
    main 480238f (the record as it wrote it passed)."""
    vanilla, mtp = "Look at the green leaves.", "Look at tree bark."
    base = dict(_mismatch(0), first_difference_at=9, vanilla=vanilla, mtp=mtp, vanilla_token=" the",
                runner_up_token=" tr", batched_token=" the", vanilla_token_id=_id(" the"), runner_up_token_id=_id(" tr"),
                batched_token_id=_id(" the"))
    as_main_wrote = {k: v for k, v in dict(base, mtp_token=" tr").items() if not k.endswith("_token_id")}
    by_id = dict(base, mtp_token=" tree", mtp_token_id=_id(" tree"))
    for m in (as_main_wrote, by_id):
        verdict, reasons = judge_recorded(_recorded([m]))
        assert verdict == Verdict.FAIL and any("unexplained" in r for r in reasons), reasons
    assert "no token ids recorded" in judge_recorded(_recorded([as_main_wrote]))[1][0]
    assert f"(id {_id(' tree')}, ' tree') is neither vanilla's runner-up (id {_id(' tr')}, ' tr')" in \
        judge_recorded(_recorded([by_id]))[1][0]
    # the same record with the MTP token the runner-up's id is explained: the id decides, not the text
    assert judge_recorded(_recorded([dict(base, mtp_token=" tr", mtp_token_id=_id(" tr"))])) == (Verdict.PASS, [])


def test_recorded_token_texts_must_agree_with_their_ids():
    """A receipt that names the runner-up's id as the MTP token while giving it another text."""
    verdict, reasons = judge_recorded(_recorded([dict(_mismatch(0), mtp_token="4", mtp_text=MTP.replace("13", "14"))]))
    assert verdict == Verdict.FAIL and any("texts disagree with their ids" in r for r in reasons), reasons


def test_a_mismatch_under_a_seed_prompt_or_mode_the_run_never_used_is_refused():
    """#49 item 5: one reply of four really differs, unexplained (vanilla ranks the MTP token third);
    the receipt lists beside it an explained mismatch under seed 7, which the run never used (its
    seeds: [42]). Main 480238f counted the invented one as the explained difference and passed;
    it is refused as not what verify writes, and so is one under a prompt or mode the run never measured."""
    real = _mismatch(1, mtp_token="4", mtp_text=MTP.replace("13", "14"))
    v = _recorded([real])
    v["mismatches"] = [dict(_mismatch(1), seed=7), real]
    verdict, reasons = judge_recorded(v)
    assert verdict == Verdict.FAIL, reasons
    assert any("seed 7" in r and "not one the run measured" in r for r in reasons), reasons
    assert any("1 unexplained difference" in r for r in reasons), reasons
    for where in (dict(prompt_id="p99"), dict(mode="thinking"), dict(k=5), dict(endpoint="raw")):
        v["mismatches"] = [dict(_mismatch(1), **where), real]
        verdict, reasons = judge_recorded(v)
        assert verdict == Verdict.FAIL and any("not one the run measured" in r for r in reasons), (where, reasons)
    # a receipt with ids but without the run's prompt ids cannot show its mismatches are the run's
    v = _recorded([_mismatch(0)])
    del v["settings"]["prompt_ids"]
    assert any("do not record the run's prompt_ids" in r for r in judge_recorded(v)[1])


def test_a_drift_above_the_ceiling_explains_nothing():
    """The issue's receipt: drift 50 nats, 0/8 identical, passed before #40."""
    verdict, reasons = judge_recorded(_recorded([_mismatch(i, margin=40.0) for i in range(8)], pairs=8, drift=50.0))
    assert verdict == Verdict.FAIL
    assert any("exceeds the 1 nats ceiling" in r for r in reasons) or any("numerics would explain" in r
                                                                          for r in reasons), reasons
    # one difference of 8 at a drift just past the ceiling: the ceiling alone fails it
    v = _recorded([_mismatch(0, margin=0.5)], pairs=8, drift=MAX_DRIFT_NATS * 1.01)
    verdict, reasons = judge_recorded(v)
    assert verdict == Verdict.FAIL and any("ceiling" in r for r in reasons), reasons
    assert judge_recorded(_recorded([_mismatch(0, margin=0.5)], pairs=8, drift=MAX_DRIFT_NATS))[0] == Verdict.PASS


@pytest.mark.parametrize("positions", [0, MIN_DRIFT_POSITIONS - 1])
def test_a_drift_measured_on_too_few_positions_explains_nothing(positions):
    verdict, reasons = judge_recorded(_recorded([_mismatch(0)], positions=positions))
    assert verdict == Verdict.FAIL and any(f"measured on {positions} position(s)" in r for r in reasons), reasons
    assert judge_recorded(_recorded([_mismatch(0)], positions=MIN_DRIFT_POSITIONS))[0] == Verdict.PASS


def test_numerics_explain_at_most_half_of_the_replies():
    v = _recorded([_mismatch(i) for i in range(3)], pairs=4)
    verdict, reasons = judge_recorded(v)
    assert verdict == Verdict.FAIL and any("numerics would explain 3 of 4 replies" in r for r in reasons), reasons
    assert judge_recorded(_recorded([_mismatch(i) for i in range(2)], pairs=4))[0] == Verdict.PASS


def test_one_mismatch_listed_twice_covers_no_other():
    """Two replies differ, one is listed twice: the unlisted one stays unexplained."""
    v = _recorded([_mismatch(0), _mismatch(1)], pairs=4)
    v["mismatches"] = [_mismatch(0), copy.deepcopy(_mismatch(0))]
    verdict, reasons = judge_recorded(v)
    assert verdict == Verdict.FAIL and any("1 unexplained difference" in r for r in reasons), reasons


def test_non_finite_or_negative_figures_explain_nothing():
    for v in (_recorded([_mismatch(0)], drift=math.nan), _recorded([_mismatch(0)], drift=math.inf),
              _recorded([_mismatch(0, margin=-1.0)]), _recorded([_mismatch(0, margin=math.nan)])):
        # through JSON as a receipt would carry it (Python's json writes NaN/Infinity)
        assert judge_recorded(json.loads(json.dumps(v)))[0] == Verdict.FAIL


def test_the_rule_reads_ids():
    d = Divergence(AT, VANILLA, MTP, 0.05, vanilla_token="2", mtp_token="3", runner_up_token="3",
                   vanilla_token_id=_id("2"), mtp_token_id=_id("3"), runner_up_token_id=_id("3"))
    assert numerics_failure(d, 0.21, 32) is None
    assert "vanilla's margin there" in numerics_failure(d, 0.01, 32)
    import dataclasses
    assert "is vanilla's own" in numerics_failure(dataclasses.replace(d, mtp_token_id=_id("2")), 0.21, 32)


def test_audit_fails_the_stretched_receipt_of_a_real_artifact(tmp_path):
    """The real audit of a real GGUF whose receipt records 0/8 identical replies "explained" by a
    50-nat drift: it passed audit (and the card said "Verdict: pass") before #40."""
    from receipt_kit import honest_statement, synth_artifact

    from ggufmtp.provenance.audit import audit
    from ggufmtp.provenance.receipt import seal

    art = synth_artifact(tmp_path)
    st = honest_statement(art, acceptance=0.9, n_prompts=8, seeds=(42,), max_tokens=64)
    v = st["predicate"]["verification"]
    stretched = _recorded([_mismatch(i, margin=40.0) for i in range(8)], pairs=8, drift=50.0)
    for key in ("identical_output_fraction", "identical_outputs", "mismatch_count", "mismatches",
                "numerics_drift_nats", "numerics_positions"):
        v[key] = stretched[key]
    for m in v["modes"].values():
        m["identical_output_fraction"] = 0.0
    v["settings"]["draft_n_max"] = 3
    v["settings"]["prompt_ids"] = stretched["settings"]["prompt_ids"]  # as verify records them
    rc = tmp_path / "model-mtp.gguf.receipt.json"
    rc.write_text(json.dumps(seal(st)))
    report = audit(art, rc)
    assert not report.ok
    assert any("ceiling" in c.detail or "numerics would explain" in c.detail for c in report.checks if not c.ok), \
        [c.detail for c in report.checks if not c.ok]
