"""verify tells a numerics divergence from a real one (ggufmtp.measure.verify.divergence).

The real cases run the pinned llama-server: the CPU-trained model (``builtin:tiny-qwen35moe-trained``,
cached) quantized to Q2_K, whose greedy reply to chat-v1's math-03 diverges between the MTP arm and
vanilla at character 277 at k=3 over 384 tokens, where vanilla's top-2 margin is a near-tie (about
5e-4 nats) and vanilla's OWN one-batch evaluation of that prefix picks the other token (found by a
search: Q4_K_M, Q3_K_M, IQ4_XS, Q2_K x k=3/4 x 12 held-out prompts x 160 tokens diverged nowhere;
Q2_K, k=3, chat-v1 at 384 tokens diverged on math-03, the search stopped there);
and a real divergence (``--spec-synth-len``: wrong drafts accepted) that must stay unexplained. The
judging itself is tested on recorded data, as ``audit`` re-judges a receipt.
"""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from ggufmtp.measure.core.options import VerifyOptions
from ggufmtp.measure.core.suite import load_suite
from ggufmtp.measure.verify.run import verify
from ggufmtp.provenance.verdict import Thresholds, Verdict, explained_by_numerics, judge_recorded
from ggufmtp.synth.spec import SynthSpec

TH = Thresholds(min_acceptance=0.3, min_speedup=1.1, source="test")


# ----------------------------------------------------------------------------- real servers


@pytest.fixture(scope="module")
def near_tie(llama_server_bin, tmp_path_factory):
    """The trained model at Q2_K (with its quantize receipt) and verify's result on math-03."""
    from ggufmtp.provenance.receipt import receipt_for_quantize
    from ggufmtp.quant.quantize import quantize
    from ggufmtp.quant.recipe import Recipe
    from ggufmtp.refs import builtin_model_path

    d = tmp_path_factory.mktemp("numerics")
    q = quantize(builtin_model_path("tiny-qwen35moe-trained"),
                 Recipe.from_dict({"name": "q2_k-numerics", "ftype": "Q2_K", "imatrix": "none"}), d / "q2k.gguf",
                 progress=False)
    suite = load_suite("chat-v1")
    suite = dataclasses.replace(suite, prompts=tuple(p for p in suite.prompts if p.id == "math-03"))
    res = verify(q.output, VerifyOptions.from_dict(dict(suite=suite, seeds=(42,), max_tokens=384, threads=2,
                                                        draft_n_max=3, thresholds=TH)), progress=False)
    return {"out": q.output, "receipt": receipt_for_quantize(q), "result": res}


def test_a_near_tie_divergence_is_explained_by_numerics_and_passes(near_tie):
    """Fails on the code before the analysis: the one differing reply failed the verdict."""
    res = near_tie["result"]
    d = res.to_dict()
    assert d["verdict"] == "pass", d["reasons"]
    assert d["mismatch_count"] == 1, d["mismatches"]
    m = d["mismatches"][0]
    assert (m["prompt_id"], m["k"], m["endpoint"]) == ("math-03", 3, "chat")
    assert m["explained"] is True and m["batched_flip"] is True and m["token_index"] > 0
    assert 0 <= m["margin_nats"] <= d["numerics_drift_nats"] < 0.2
    assert d["numerics_positions"] >= 2 and d["numerics_flips"] >= 1
    assert any(n.startswith("identical output: 0/1 (0.0 %); the difference is numerics (vanilla's margin")
               and "measured on" in n for n in d["notes"]), d["notes"]
    assert "explained by numerics" in res.table()
    # the audit's re-judgement of the recorded figures agrees
    assert judge_recorded(res.to_receipt()) == (Verdict.PASS, [])


def test_audit_recomputes_explained_from_the_margin_not_the_flag(near_tie, tmp_path):
    """A receipt whose margin was edited above the drift (``explained`` left true) no longer follows
    from its figures; an older receipt without the fields counts the difference as unexplained."""
    import shutil

    from ggufmtp.provenance.audit import audit
    from ggufmtp.provenance.receipt import set_verification

    out, rc = tmp_path / near_tie["out"].name, tmp_path / "r.json"
    shutil.copy(near_tie["out"], out)
    shutil.copy(near_tie["receipt"], rc)
    set_verification(rc, near_tie["result"].to_receipt())
    assert audit(out, rc).ok, [c.detail for c in audit(out, rc).checks if not c.ok]
    st = json.loads(rc.read_text())
    v = st["predicate"]["verification"]
    v["mismatches"][0]["margin_nats"] = v["numerics_drift_nats"] + 0.5  # explained stays true
    rc.write_text(json.dumps(st))
    check = next(c for c in audit(out, rc).checks if c.name == "verdict follows from the figures")
    assert not check.ok and "give 'fail'" in check.detail and "unexplained" in check.detail


def test_a_real_divergence_stays_unexplained_and_fails(llama_server_bin, synth_model):
    """Accepting wrong drafts (--spec-synth-len k+1, the MTP arm's own flag) changes the replies at
    tokens vanilla is sure of: margins of many nats against a drift of ~0 on the synthetic trunk."""
    model = synth_model(SynthSpec(wrong_successor_fraction=0.3))
    res = verify(model, VerifyOptions.from_dict(dict(seeds=(42,), limit=3, max_tokens=32, threads=2, thresholds=TH,
                                                     mtp_server_args=("--spec-synth-len", "5"))), progress=False)
    d = res.to_dict()
    assert d["verdict"] == "fail" and d["mismatch_count"] > 0
    assert all(m["explained"] is False and m["margin_nats"] > 1.0 for m in d["mismatches"]), d["mismatches"]
    assert d["numerics_drift_nats"] is not None and d["numerics_drift_nats"] < 1.0
    reason = next(r for r in d["reasons"] if r.startswith("identical output"))
    assert "unexplained" in reason and "first: prompt" in reason and "margin there" in reason
    assert judge_recorded(res.to_receipt())[0] == Verdict.FAIL


# ----------------------------------------------------------------------------- the judging, on recorded data


def _recorded(margins: list[float | None], drift: float | None, pairs: int = 4) -> dict:
    """A receipt's verification with ``len(margins)`` differing replies of ``pairs`` (one mode)."""
    same = pairs - len(margins)
    mism = [{"prompt_id": f"p{i}", "seed": 42, "mode": "default", "endpoint": "chat", "k": 3,
             "first_difference_at": 10 + i, "vanilla": "a", "mtp": "b", "vanilla_tokens": 5, "mtp_tokens": 5}
            | ({} if mg is None else {"margin_nats": mg, "batched_flip": False, "explained": True, "token_index": 2})
            for i, mg in enumerate(margins)]
    v = {"verdict": "pass", "mtp": {"acceptance": 0.8}, "speedup": 1.0, "identical_output_fraction": same / pairs,
         "identical_outputs": {"identical": same, "pairs": pairs}, "mismatch_count": len(margins),
         "mismatches": mism, "modes": {"default": {"mtp": {"acceptance": 0.8}, "speedup": 1.0,
                                                   "identical_output_fraction": same / pairs}},
         "settings": {"n_prompts": pairs, "seeds": [42], "draft_n_max": 3, "max_tokens": 64},
         "thresholds": TH.to_dict(), "hardware": {"offloaded": False}}
    if drift is not None:
        v |= {"numerics_drift_nats": drift, "numerics_positions": 32}
    return v


def test_explained_by_numerics_rule():
    assert explained_by_numerics(0.05, 0.21) and explained_by_numerics(0.21, 0.21)
    assert not explained_by_numerics(0.3, 0.21)
    assert not explained_by_numerics(None, 0.21) and not explained_by_numerics(0.0, None)


def test_recorded_differences_within_the_drift_pass():
    assert judge_recorded(_recorded([0.046, 0.12], 0.21)) == (Verdict.PASS, [])


def test_one_unexplained_difference_still_fails_naming_it():
    verdict, reasons = judge_recorded(_recorded([0.046, 2.5], 0.21))
    assert verdict == Verdict.FAIL
    assert any("1 more explained by numerics" in r and "1 unexplained" in r and "'p1'" in r and "2.5 nats" in r
               for r in reasons), reasons


def test_edited_explained_flag_is_not_trusted():
    v = _recorded([0.5], 0.21)
    assert v["mismatches"][0]["explained"] is True  # claimed, but 0.5 > 0.21
    assert judge_recorded(v)[0] == Verdict.FAIL


def test_an_older_receipt_without_the_fields_counts_every_difference():
    old = _recorded([None, None], None)
    assert "numerics_drift_nats" not in old and "margin_nats" not in old["mismatches"][0]
    assert judge_recorded(old)[0] == Verdict.FAIL
    # the margins without a drift (or a drift without margins) explain nothing either
    assert judge_recorded(_recorded([0.01], None))[0] == Verdict.FAIL
    assert judge_recorded(_recorded([None], 0.21))[0] == Verdict.FAIL


def test_min_identical_applies_to_unexplained_differences_only():
    v = _recorded([0.01, 3.0], 0.21, pairs=4)
    v["thresholds"] = dict(v["thresholds"], min_identical=0.75)  # one unexplained of 4 is within it
    assert judge_recorded(v) == (Verdict.PASS, [])
    v2 = copy.deepcopy(v)
    v2["mismatches"][0]["margin_nats"] = 3.0  # two unexplained of 4: 50 % < 75 %
    assert judge_recorded(v2)[0] == Verdict.FAIL


def test_the_schema_takes_the_new_fields_and_older_receipts():
    import jsonschema

    from ggufmtp.provenance.receipt import schema as load_schema

    mism = {"$ref": "#/$defs/mismatch"}
    schema = load_schema()
    item = {"$defs": schema["$defs"], **mism}
    base = _recorded([0.01], 0.21)["mismatches"][0]
    jsonschema.validate(base, item)
    jsonschema.validate({k: v for k, v in base.items() if k not in ("margin_nats", "explained")}, item)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(dict(base, margin_nats="small"), item)


# ----------------------------------------------------------------------------- vanilla ends, MTP goes on


class _EndsServer:
    """A vanilla server whose greedy reply is "abc" and then its end-of-generation token (listed by
    llama-server's ``completion_probabilities`` with token text ""), nearly tied with " d"."""

    ENTRIES = [("a", -0.1, "x", -3.0), ("b", -0.1, "x", -3.0), ("c", -0.1, "x", -3.0), ("", -0.70, " d", -0.71)]

    def __init__(self, batched_eos_margin: float):
        self.batched_eos_margin = batched_eos_margin

    def post_json(self, path, body):
        return {"prompt": "q"}

    def tokenize(self, text, add_special=True, parse_special=True):
        return [1]

    def complete(self, ids, n_predict, **kw):
        entries = [{"id": i, "token": t, "top_logprobs": [{"id": i, "token": t, "logprob": lp},
                                                          {"id": 99, "token": alt, "logprob": alt_lp}]}
                   for i, (t, lp, alt, alt_lp) in enumerate(self.ENTRIES)]
        if n_predict != 1:
            return {"completion_probabilities": entries}
        e = dict(entries[len(ids) - 1])  # the one-batch evaluation of the prefix
        if e["token"] == "":
            e["top_logprobs"] = [dict(e["top_logprobs"][0], logprob=-0.70),
                                 dict(e["top_logprobs"][1], logprob=-0.70 - self.batched_eos_margin)]
        return {"completion_probabilities": [e]}


def test_vanilla_ending_at_a_near_tie_where_mtp_goes_on_is_analysed():
    """Vanilla's reply ends (its end-of-generation token won by 0.01 nats) where the MTP reply goes
    on: the divergence is that token, its margin is measured like any other, and it is explained
    when the batching drift covers it; before, it was left unexplained whatever its margin."""
    from ggufmtp.measure.core.suite import Prompt, Suite
    from ggufmtp.measure.verify.divergence import analyse_mismatches
    from ggufmtp.measure.verify.summary import Record

    suite = dataclasses.replace(load_suite("chat-v1"), prompts=(Prompt("p", "general", ({"role": "user", "content": "q"},)),))
    assert isinstance(suite, Suite)

    def rec(arm, text):
        return Record(arm=arm, k=3, endpoint="chat", mode="default", prompt_id="p", category="general", seed=42, order=0,
                      predicted_n=len(text), predicted_ms=1.0, prompt_n=1, draft_n=None, draft_n_accepted=None, text=text)

    key = (3, "chat", "default", "p", 42)
    for batched_margin, explained in ((0.05, True), (0.012, False)):
        numerics = analyse_mismatches(_EndsServer(batched_margin), suite, [(rec("vanilla", "abc"), rec("mtp", "abc d"))], 64)
        a = numerics.by_key[key]
        assert a.reproduced and a.token_index == 3 and a.margin_nats == pytest.approx(0.01), a
        assert numerics.fields(key)["explained"] is explained, (numerics.drift, a)


def test_llama_server_lists_the_end_of_generation_token_with_empty_text(llama_server_bin):
    """What the analysis of a reply where vanilla ends relies on (and _EndsServer imitates): the
    pinned llama-server's ``completion_probabilities`` include the end-of-generation token as the
    last entry, with the text "" and its top-2 alternatives."""
    from ggufmtp.refs import builtin_model_path
    from ggufmtp.runtime.server import LlamaServer, ServerConfig

    with LlamaServer(ServerConfig(model=builtin_model_path("tiny-qwen35moe-trained"), threads=2, ctx_size=2048)) as s:
        t = s.post_json("/apply-template", {"messages": [{"role": "user", "content": "Say hi."}]})["prompt"]
        r = s.complete(s.tokenize(t, add_special=True, parse_special=True), n_predict=200, temperature=0.0, seed=1,
                       cache_prompt=False, n_probs=2)
    probs = r["completion_probabilities"]
    assert r["stop_type"] == "eos" and len(probs) == r["tokens_predicted"] < 200
    assert probs[-1]["token"] == "" and len(probs[-1]["top_logprobs"]) == 2
    assert "".join(e["token"] for e in probs) == r["content"]
