"""The relative verdict (issue #40, item 1): verify judges the artifact's head against a reference
served in the same rotation, paired by prompt x seed, and audit re-derives the judgment from the
recorded pairs. The cases are designed heads of the synthesized model, so every acceptance is known
in advance on any machine: the default head drafts the true successor (100 %), ``-f20`` drafts a
wrong one for a fifth of the tokens, and Q8_0 keeps the default head's drafts."""

from __future__ import annotations

import copy
import dataclasses
import shutil

import pytest

from ggufmtp.measure.core.options import JudgeOptions, VerifyOptions
from ggufmtp.measure.verify.run import verify
from ggufmtp.provenance.head import HeadComparison
from ggufmtp.provenance.verdict import Thresholds, judge_record

# a model whose head accepts 45 % fails this minimum whatever its quantization (the case)
STRICT = Thresholds(min_acceptance=0.95, min_speedup=1.1, source="test")


def _options(reference, **judge) -> VerifyOptions:
    return VerifyOptions(seeds=(42,), limit=8, max_tokens=64, draft_n_max=3, reference=reference,
                         judge=JudgeOptions(thresholds=STRICT, **judge))


@pytest.fixture(scope="module")
def q8(synth_model, tmp_path_factory, llama_runtime):
    """The default synthetic model at Q8_0 with its quantize receipt."""
    from ggufmtp.provenance.receipt import receipt_for_quantize
    from ggufmtp.quant.quantize import quantize
    from ggufmtp.quant.recipe import Recipe

    d = tmp_path_factory.mktemp("head")
    q = quantize(synth_model("tiny-qwen35moe"), Recipe.from_dict({"name": "q8-test", "ftype": "Q8_0", "imatrix": "none"}),
                 d / "tiny-Q8_0.gguf", progress=False)
    return q.output, receipt_for_quantize(q)


@pytest.fixture(scope="module")
def preserved(q8, synth_model, llama_server_bin):
    return verify(q8[0], _options(synth_model("tiny-qwen35moe")), progress=False)


def test_a_near_lossless_quant_is_preserved_against_its_reference(preserved):
    """Before #40 the verdict judged the model: any head below the fixed minimum failed. With a
    reference the head finding is the paired non-inferiority, and the minimum is off."""
    d = preserved.to_dict()
    assert d["verdict"] == "pass", d["reasons"]
    assert d["findings"] == {"head": "pass", "head_basis": "reference", "lossless": "pass", "speed": "not verified"}
    f = d["head"]["findings"]["default"]
    assert f["decision"] == "preserved" and f["difference"] == 0.0 and f["difference_ci"] == [0.0, 0.0], f
    assert len(d["head"]["pairs"]) == 8 and d["head"]["reference"]["name"].endswith(".gguf")
    assert any("absolute minimum 95.0 %" in n and "not applied" in n for n in d["notes"]), d["notes"]
    text = preserved.table()
    assert "verdict: PASS -- head preserved (vs reference); lossless; speed not verified" in text
    assert "reference arm: the MTP arm's flags and trunk, drafting with the MTP head of " in text and "own phase" in text
    assert "-md mtp-reference.gguf" in text and "on the same text" in text


def test_a_worse_head_is_flagged_by_the_paired_ci(synth_model, llama_server_bin):
    """A head that drafts a wrong successor for a fifth of the tokens, against the true head."""
    res = verify(synth_model("tiny-qwen35moe-f20"), _options(synth_model("tiny-qwen35moe")), progress=False)
    d = res.to_dict()
    assert d["verdict"] == "fail" and d["findings"]["head"] == "fail" and d["findings"]["lossless"] == "pass"
    f = d["head"]["findings"]["default"]
    assert f["difference_ci"][1] < -0.03 and f["decision"] == "degraded", f
    assert any(r.startswith("head degraded") and "below -3.0 points" in r for r in d["reasons"]), d["reasons"]
    # the same figures with the absolute minimum asked for too: both bases named
    assert judge_record(d).findings.head_basis.value == "reference"


def test_audit_re_derives_the_head_from_the_pairs(preserved, q8, tmp_path):
    from ggufmtp.provenance.audit import audit
    from ggufmtp.provenance.receipt import set_verification

    out, receipt = q8
    rc = tmp_path / "r.json"
    shutil.copy(receipt, rc)
    set_verification(rc, preserved.to_receipt())
    assert audit(out, rc).ok, [c.detail for c in audit(out, rc).checks if not c.ok]

    v = preserved.to_receipt()
    forged = copy.deepcopy(v)  # the finding claimed preserved, the pairs say otherwise: re-derived, not read
    for p in forged["head"]["pairs"]:
        p["reference_drafted"], p["reference_accepted"] = p["drafted"], p["drafted"]
        p["drafted"], p["accepted"] = p["drafted"], p["accepted"] // 2
    forged["mtp"]["draft_n_accepted"] = forged["modes"]["default"]["mtp"]["draft_n_accepted"] = \
        sum(p["accepted"] for p in forged["head"]["pairs"])
    j = judge_record(forged)
    assert forged["head"]["findings"]["default"]["decision"] == "preserved" and j.findings.head.value == "fail", j.reasons

    other = copy.deepcopy(v)  # pairs that are not the mode's draft counts
    other["head"]["pairs"][0]["accepted"] -= 1
    assert any("pairs' totals" in r for r in judge_record(other).reasons)

    broken = copy.deepcopy(v)
    broken["head"]["pairs"][0]["drafted"] = "many"
    assert any("head section is not what verify writes" in r for r in judge_record(broken).reasons)
    set_verification(rc, broken)
    assert not audit(out, rc).ok


def test_the_reference_must_be_another_file_with_a_head(q8, synth_model, tmp_path, llama_server_bin):
    """Each refused before any server starts, the error naming the reference."""
    from ggufmtp.errors import VerifyError

    with pytest.raises(VerifyError, match="reference .*: the artifact itself"):
        verify(q8[0], _options(q8[0]), progress=False)
    with pytest.raises(VerifyError, match="reference .*missing.gguf: no such file"):
        verify(q8[0], _options(tmp_path / "missing.gguf"), progress=False)
    with pytest.raises(VerifyError, match="reference: model .*: its MTP block is absent"):
        verify(q8[0], _options(synth_model("tiny-qwen35moe-nomtp")), progress=False)


def test_head_comparison_parses_strictly():
    good = {"reference": {"name": "m.gguf", "size_bytes": 1, "sha256": "a" * 64}, "k": 3, "margin": 0.03,
            "bootstrap": {"resamples": 2000, "seed": 0},
            "pairs": [{"prompt_id": f"p{i}", "seed": 42, "mode": "default", "drafted": 10, "accepted": 9,
                       "reference_drafted": 10, "reference_accepted": 9} for i in range(4)]}
    hc = HeadComparison.of_dict(good)
    assert hc.findings()["default"].preserved
    for path, bad in ((("margin",), 5), (("margin",), True), (("reference", "sha256"), "x"),
                      (("reference", "name"), "/abs/m.gguf"), (("k",), 0), (("pairs",), []),
                      (("bootstrap", "resamples"), 200), (("budget",), 2)):
        d = copy.deepcopy(good)
        tgt = d
        for key in path[:-1]:
            tgt = tgt[key]
        tgt[path[-1]] = bad
        with pytest.raises(ValueError):
            HeadComparison.of_dict(d)
    d = copy.deepcopy(good)
    d["pairs"][0]["accepted"] = 11  # more accepted than drafted
    with pytest.raises(ValueError, match="more tokens than it drafted"):
        HeadComparison.of_dict(d)


def test_a_wide_interval_is_inconclusive_and_says_so():
    """The finding tells "degraded" (the whole interval below -margin) from "inconclusive" (too little
    evidence to exclude a loss of the margin): only the first fails the head, the second asks for more."""
    from ggufmtp.provenance.head import HeadDecision, HeadPair, judge_head

    def pairs(acc, ref):
        return [HeadPair(f"p{i}", 42, "default", 10, a, 10, r) for i, (a, r) in enumerate(zip(acc, ref, strict=True))]

    wide = judge_head(pairs([9, 5, 9, 5, 7, 7], [9, 9, 5, 5, 7, 7]), "default", 0.03)
    assert wide.difference == 0.0 and wide.difference_ci[0] < -0.03 < wide.difference_ci[1]
    assert wide.decision == HeadDecision.INCONCLUSIVE and wide.reason().startswith("head inconclusive")
    assert "prompts" in wide.reason()
    worse = judge_head(pairs([5, 4, 5, 4, 5, 4], [9, 9, 9, 9, 9, 9]), "default", 0.03)
    assert worse.difference_ci[1] < -0.03 and worse.reason().startswith("head degraded")
    same = judge_head(pairs([9, 8, 9, 8, 9, 8], [9, 8, 9, 8, 9, 8]), "default", 0.03)
    assert same.preserved and same.reason() is None and same.difference_ci == (0.0, 0.0)


def test_a_clear_case_stops_at_the_first_look_and_the_reference_is_measured_once(q8, synth_model, llama_server_bin):
    """The budget is 24 prompts (looks at 8, 16 and 24). The Q8_0 head drafts exactly as the source's
    (0.0 points, no variance): preserved at 8 prompts, and the run stops there. A designed loss
    (the -f20 head drafts a wrong successor for a fifth of the tokens) is degraded at the same first
    look. The reference arm is the source's head drafting on each artifact's own trunk, so its cache
    key names the trunk: the -f20 model's differs, and a rerun of the Q8_0 reads the first run's."""
    o = dataclasses.replace(_options(synth_model("tiny-qwen35moe")), limit=24)
    first = verify(q8[0], o, progress=False).to_dict()
    h = first["head"]
    assert h["decision"] == "preserved" and h["prompts"] == 8 and h["budget"] == 24 and h["looks"] == [8, 16, 24], h
    assert first["settings"]["n_prompts"] == 8 and first["settings"]["prompt_budget"] == 24
    assert first["verdict"] == "pass", first["reasons"]
    worse = verify(synth_model("tiny-qwen35moe-f20"), o, progress=False).to_dict()
    f = worse["head"]["findings"]["default"]
    assert f["decision"] == "degraded" and f["look"] == 1 and f["prompts"] == 8, f
    assert worse["settings"]["n_prompts"] == 8 and worse["verdict"] == "fail"
    again = verify(q8[0], o, progress=False).to_dict()
    assert again["settings"]["reference_phase"]["cached"] is True
    assert again["settings"]["reference_phase"]["key"] == first["settings"]["reference_phase"]["key"]
    assert worse["settings"]["reference_phase"]["key"] != first["settings"]["reference_phase"]["key"]
    assert again["head"]["pairs"] == h["pairs"]


def test_an_undersized_run_is_inconclusive_not_a_failure(synth_model, llama_server_bin):
    """One prompt has no variance to judge by, whatever its difference (here the -f20 head's loss):
    the verdict is 'inconclusive', the head finding asks for at least 8 prompts, nothing says 'fail'
    or 'degraded' (on main 480238f: "head NOT preserved", verdict fail)."""
    o = VerifyOptions(seeds=(42,), limit=1, max_tokens=32, draft_n_max=3, reference=synth_model("tiny-qwen35moe"),
                      judge=JudgeOptions(thresholds=STRICT))
    d = verify(synth_model("tiny-qwen35moe-f20"), o, progress=False).to_dict()
    assert d["head"]["findings"]["default"]["decision"] == "inconclusive", d["head"]["findings"]
    assert d["verdict"] == "inconclusive" and d["findings"]["head"] == "inconclusive", d["reasons"]
    assert d["reasons"] and all("degraded" not in r and "fail" not in r for r in d["reasons"]), d["reasons"]
    assert any("inconclusive" in r and "8 prompts" in r for r in d["reasons"]), d["reasons"]


def test_the_python_api_takes_a_builtin_reference_as_the_cli_does(q8, llama_server_bin):
    """#51 item 3: ``VerifyOptions(reference="builtin:...")`` said "no such file" through
    ``ggufmtp.verify`` (main 480238f) while the CLI accepted the name."""
    import ggufmtp

    o = dataclasses.replace(_options("builtin:tiny-qwen35moe"), limit=8)
    res = ggufmtp.verify(q8[0], o, progress=False)
    assert res.head is not None and res.head.reference.name.startswith("tiny-qwen35moe"), res.head
