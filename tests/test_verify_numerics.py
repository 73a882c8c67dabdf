"""verify tells a numerics divergence from a real one (ggufmtp.measure.verify.divergence).

Whether evaluating a prefix as one batch flips vanilla's argmax is a CPU's rounding, so no real
run can be relied on to diverge at a near-tie. The near-tie is designed instead (tests/numerics_kit.py):
a real verify run on the synthetic model (identical replies in both arms), one MTP reply changed
where the run records it and in the MTP server's replay of it (its token there the designed
runner-up's id), and the vanilla server's answers the analysis reads designed at that divergence
(vanilla's margin 0.01 nats, its own one-batch evaluation of the prefix picking the MTP reply's
token), everything else the real servers'. A real divergence (``--spec-synth-len``: wrong
drafts accepted) must stay unexplained. The judging itself is tested on recorded data, as ``audit``
re-judges a receipt; the llama-server protocol the stand-ins imitate is pinned on the real server.
"""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
from numerics_kit import BATCHED_MARGIN, NEAR_TIE, NearTieMtp, NearTieVanilla, designed_mtp_text

from ggufmtp.measure.core.options import VerifyOptions
from ggufmtp.measure.core.suite import load_suite
from ggufmtp.measure.verify.run import verify
from ggufmtp.provenance.verdict import (
    MIN_DRIFT_POSITIONS,
    Divergence,
    Thresholds,
    Verdict,
    explained_by_numerics,
    judge_recorded,
)
from ggufmtp.synth.spec import SynthSpec

TH = Thresholds(min_acceptance=0.3, min_speedup=1.1, source="test")


# ----------------------------------------------------------------------------- real servers


@pytest.fixture(scope="module")
def designed_near_tie(llama_server_bin, tiny_mtp_model):
    """A real verify run of the synthetic model on two prompts whose second MTP reply departs from
    vanilla's at a designed near-tie: the reply is changed where the run records it (``on_record``),
    its replay on the MTP server reads the real one through :class:`NearTieMtp`, and the analysis
    reads the real vanilla server through :class:`NearTieVanilla`."""
    from ggufmtp.measure.verify import run as verify_run
    from ggufmtp.measure.verify.divergence import analyse_mismatches, replay_mtp

    suite = load_suite().limit(2)
    differs = suite.prompts[1].id
    seen: list[NearTieVanilla] = []
    replayed: list[NearTieMtp] = []

    def on_record(rec):
        if rec.arm == "mtp" and rec.prompt_id == differs:
            rec.text = designed_mtp_text(rec.text)

    def replay(mtp, st, pairs, max_tokens):
        assert [m.prompt_id for _, m in pairs] == [differs], "the synthetic model's replies differ by themselves"
        replayed.append(NearTieMtp(mtp, pairs[0][0].text, pairs[0][1].text))
        return replay_mtp(replayed[-1], st, pairs, max_tokens)

    def analyse(van, st, pairs, max_tokens, mtp_replies):
        assert [m.prompt_id for _, m in pairs] == [differs], "the synthetic model's replies differ by themselves"
        seen.append(NearTieVanilla(van, pairs[0][0].text, pairs[0][1].text))
        return analyse_mismatches(seen[-1], st, pairs, max_tokens, mtp_replies)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(verify_run, "replay_mtp", replay)
        mp.setattr(verify_run, "analyse_mismatches", analyse)
        res = verify(tiny_mtp_model, VerifyOptions.from_dict(dict(suite=suite, seeds=(42,), max_tokens=32, threads=2,
                                                                   draft_n_max=3, thresholds=TH)),
                     progress=False, on_record=on_record)
    return {"model": tiny_mtp_model, "result": res, "prompt_id": differs, "vanilla": seen[0], "mtp": replayed[0]}


def test_a_near_tie_divergence_is_explained_by_numerics_and_passes(designed_near_tie):
    """Fails on the code before the analysis: the one differing reply failed the verdict."""
    res, stand_in = designed_near_tie["result"], designed_near_tie["vanilla"]
    d = res.to_dict()
    assert d["verdict"] == "pass", d["reasons"]
    assert d["mismatch_count"] == 1 and d["identical_outputs"] == {"identical": 1, "pairs": 2}, d["mismatches"]
    m = d["mismatches"][0]
    assert (m["prompt_id"], m["k"], m["endpoint"]) == (designed_near_tie["prompt_id"], 3, "chat")
    # the analysis found the designed token, read its margin and saw the batched flip there
    assert m["token_index"] == stand_in.j > 0 and stand_in.requests["designed_batched"] == 1
    assert m["explained"] is True and m["batched_flip"] is True and m.get("unexplained_why") is None, m
    assert m["margin_nats"] == pytest.approx(NEAR_TIE, abs=1e-6)
    assert m["mtp_token"] == m["runner_up_token"] == m["batched_token"] == stand_in.tokens[1]["token"]
    assert m["vanilla_token"] == stand_in.tokens[0]["token"] != m["mtp_token"]
    # judged by id: the MTP server's replay says it generated the designed runner-up's id there
    assert designed_near_tie["mtp"].replays == 1
    assert m["mtp_token_id"] == m["runner_up_token_id"] == m["batched_token_id"] == stand_in.tokens[1]["id"]
    assert m["vanilla_token_id"] == stand_in.tokens[0]["id"] != m["mtp_token_id"]
    # the drift: the designed flip's (NEAR_TIE + BATCHED_MARGIN) at least, the real positions' changes beside it
    assert NEAR_TIE + BATCHED_MARGIN - 1e-6 <= d["numerics_drift_nats"] < 1.0
    assert d["numerics_positions"] >= MIN_DRIFT_POSITIONS and d["numerics_flips"] >= 1
    assert any("numerics" in n and "measured on" in n for n in d["notes"]), d["notes"]
    assert "explained by numerics" in res.table()
    # the audit's re-judgement of the recorded figures agrees
    assert judge_recorded(res.to_receipt()) == (Verdict.PASS, [])


def test_audit_recomputes_explained_from_the_margin_not_the_flag(designed_near_tie, tmp_path):
    """A receipt whose margin was edited above the drift (``explained`` left true) no longer follows
    from its figures; an older receipt without the fields counts the difference as unexplained."""
    import shutil

    from receipt_kit import honest_statement

    from ggufmtp.provenance.audit import audit

    model = designed_near_tie["model"]
    out, rc = tmp_path / model.name, tmp_path / "r.json"
    shutil.copy(model, out)
    rc.write_text(json.dumps(honest_statement(out, verification=designed_near_tie["result"].to_receipt())))
    assert audit(out, rc).ok, [c.detail for c in audit(out, rc).checks if not c.ok]
    st = json.loads(rc.read_text())
    v = st["predicate"]["verification"]
    assert v["mismatches"][0]["explained"] is True
    v["mismatches"][0]["margin_nats"] = v["numerics_drift_nats"] + 0.5  # explained stays true
    rc.write_text(json.dumps(st))
    check = next(c for c in audit(out, rc).checks if c.name == "verdict follows from the figures")
    assert not check.ok and "give 'fail'" in check.detail and "unexplained" in check.detail
    for key in ("margin_nats", "mtp_token", "runner_up_token", "batched_token", "vanilla_token_id", "mtp_token_id",
                "runner_up_token_id", "batched_token_id"):  # an older receipt's mismatch
        v["mismatches"][0].pop(key)
    rc.write_text(json.dumps(st))
    check = next(c for c in audit(out, rc).checks if c.name == "verdict follows from the figures")
    assert not check.ok and "unexplained" in check.detail


def test_a_real_divergence_stays_unexplained_and_fails(llama_server_bin, synth_model):
    """Accepting wrong drafts (--spec-synth-len k+1, the MTP arm's own flag) changes the replies at
    tokens vanilla is sure of: margins of many nats against a drift of ~0 on the synthetic trunk."""
    model = synth_model(SynthSpec(wrong_successor_fraction=0.3))
    res = verify(model, VerifyOptions.from_dict(dict(seeds=(42,), limit=3, max_tokens=32, threads=2, thresholds=TH,
                                                     mtp_server_args=("--spec-synth-len", "5"))), progress=False)
    d = res.to_dict()
    assert d["verdict"] == "fail" and d["mismatch_count"] > 0
    assert all(m["explained"] is False and m["margin_nats"] > 1.0 for m in d["mismatches"]), d["mismatches"]
    # the token ids as the servers generated them (#49 item 5): the MTP server's replay reproduced each
    # reply, and the first id that differs is the divergence, where vanilla's own token is top-1
    for m in d["mismatches"]:
        ids = [m[f] for f in ("vanilla_token_id", "mtp_token_id", "runner_up_token_id", "batched_token_id")]
        assert all(isinstance(i, int) for i in ids) and ids[0] != ids[1], m
        assert "neither vanilla's runner-up" in m["unexplained_why"] or "margin there" in m["unexplained_why"], m
    assert d["settings"]["prompt_ids"] == [p.id for p in load_suite().limit(3).prompts]
    assert d["numerics_drift_nats"] is not None and d["numerics_drift_nats"] < 1.0
    reason = next(r for r in d["reasons"] if r.startswith("identical output"))
    assert "unexplained" in reason and "first: prompt" in reason and "margin there" in reason
    assert judge_recorded(res.to_receipt())[0] == Verdict.FAIL


# ----------------------------------------------------------------------------- the judging, on recorded data


def _recorded(margins: list[float | None], drift: float | None, pairs: int = 4) -> dict:
    """A receipt's verification with ``len(margins)`` differing replies of ``pairs`` (one mode)."""
    same = pairs - len(margins)
    # vanilla says "12", the MTP reply vanilla's runner-up "13" (the tokens the analysis records)
    mism = [{"prompt_id": f"p{i}", "seed": 42, "mode": "default", "endpoint": "chat", "k": 3,
             "first_difference_at": 23, "vanilla": "The sum of 5 and 7 is 12.", "mtp": "The sum of 5 and 7 is 13.",
             "vanilla_tokens": 9, "mtp_tokens": 9}
            | ({} if mg is None else {"margin_nats": mg, "batched_flip": False, "explained": True, "token_index": 8,
                                      "vanilla_token": "2", "mtp_token": "3", "runner_up_token": "3",
                                      "batched_token": "2", "vanilla_token_id": 17, "mtp_token_id": 18,
                                      "runner_up_token_id": 18, "batched_token_id": 17})
            for i, mg in enumerate(margins)]
    v = {"verdict": "pass", "mtp": {"acceptance": 0.8}, "speedup": 1.0, "identical_output_fraction": same / pairs,
         "identical_outputs": {"identical": same, "pairs": pairs}, "mismatch_count": len(margins),
         "mismatches": mism, "modes": {"default": {"mtp": {"acceptance": 0.8}, "speedup": 1.0,
                                                   "identical_output_fraction": same / pairs}},
         "settings": {"n_prompts": pairs, "seeds": [42], "draft_n_max": 3, "max_tokens": 64,
                      "prompt_ids": [f"p{i}" for i in range(pairs)]},
         "thresholds": TH.to_dict(), "hardware": {"offloaded": False}}
    if drift is not None:
        v |= {"numerics_drift_nats": drift, "numerics_positions": 32}
    return v


def test_explained_by_numerics_rule():
    def d(margin):
        return Divergence(23, "The sum of 5 and 7 is 12.", "The sum of 5 and 7 is 13.", margin, vanilla_token="2",
                          mtp_token="3", runner_up_token="3", vanilla_token_id=17, mtp_token_id=18, runner_up_token_id=18)

    assert explained_by_numerics(d(0.05), 0.21, 32) and explained_by_numerics(d(0.21), 0.21, 32)
    assert not explained_by_numerics(d(0.3), 0.21, 32)
    assert not explained_by_numerics(d(None), 0.21, 32) and not explained_by_numerics(d(0.0), None, 32)


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
    """A vanilla server whose greedy reply is "abcdefghij" (ten tokens: enough positions for a drift
    calibration) and then its end-of-generation token (listed by llama-server's
    ``completion_probabilities`` with token text ""), nearly tied with " d"."""

    ENTRIES = [(ch, -0.1, "x", -3.0) for ch in "abcdefghij"] + [("", -0.70, " d", -0.71)]
    TIE = 10  # the near-tie's entry, whose one-batch evaluation moves its margin

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
        if len(ids) - 1 == self.TIE:
            e["top_logprobs"] = [dict(e["top_logprobs"][0], logprob=-0.70),
                                 dict(e["top_logprobs"][1], logprob=-0.70 - self.batched_eos_margin)]
        return {"completion_probabilities": [e]}


def test_vanilla_ending_at_a_near_tie_where_mtp_goes_on_is_analysed():
    """Vanilla's reply ends (its end-of-generation token won by 0.01 nats) where the MTP reply goes
    on: the divergence is that token, its margin is measured like any other, and it is explained
    when the batching drift covers it; before, it was left unexplained whatever its margin."""
    from ggufmtp.measure.core.suite import Prompt, Suite
    from ggufmtp.measure.verify.divergence import TokenReply, analyse_mismatches
    from ggufmtp.measure.verify.summary import Record

    suite = dataclasses.replace(load_suite("chat-v1"), prompts=(Prompt("p", "general", ({"role": "user", "content": "q"},)),))
    assert isinstance(suite, Suite)

    def rec(arm, text):
        return Record(arm=arm, k=3, endpoint="chat", mode="default", prompt_id="p", category="general", seed=42, order=0,
                      predicted_n=len(text), predicted_ms=1.0, prompt_n=1, draft_n=None, draft_n_accepted=None, text=text)

    key = (3, "chat", "default", "p", 42)
    mtp = {key: TokenReply((*range(10), 99, 11), "abcdefghij d")}  # the MTP server's: " d" (id 99) where vanilla ends
    for batched_margin, explained in ((0.05, True), (0.012, False)):
        pair = (rec("vanilla", "abcdefghij"), rec("mtp", "abcdefghij d"))
        numerics = analyse_mismatches(_EndsServer(batched_margin), suite, [pair], 64, mtp)
        a = numerics.by_key[key]
        assert a.reproduced and a.token_index == 10 and a.margin_nats == pytest.approx(0.01), a
        assert numerics.fields(key)["explained"] is explained, (numerics.drift, a)


class _PrefixServer(_EndsServer):
    """A vanilla server whose greedy reply is "Look at the green leaves. It is a day", its " the"
    nearly tied with the runner-up " tr" (id 99)."""

    ENTRIES = ([(t, -0.1, "x", -3.0) for t in ("Look", " at")] + [(" the", -0.70, " tr", -0.71)]
               + [(t, -0.1, "x", -3.0) for t in (" green", " leaves", ".", " It", " is", " a", " day", "")])
    TIE = 2


def test_the_mtp_token_is_its_id_not_a_text_the_runner_up_begins():
    """#49 item 5: where vanilla took " the" over " tr" by 0.01 nats (a drift of 0.04 measured), an
    MTP reply "Look at tree bark." is explained by numerics only if the MTP server generated the
    runner-up's id there (" tr", then "ee"); generated as " tree" (another id) it is a real
    divergence, though the text is the same. Before, the runner-up's text lying in the MTP reply
    was enough: both were explained."""
    from ggufmtp.measure.core.suite import Prompt, Suite
    from ggufmtp.measure.verify.divergence import TokenReply, analyse_mismatches
    from ggufmtp.measure.verify.summary import Record

    suite = dataclasses.replace(load_suite("chat-v1"), prompts=(Prompt("p", "general", ({"role": "user", "content": "q"},)),))
    assert isinstance(suite, Suite)

    def rec(arm, text):
        return Record(arm=arm, k=3, endpoint="chat", mode="default", prompt_id="p", category="general", seed=42, order=0,
                      predicted_n=9, predicted_ms=1.0, prompt_n=1, draft_n=None, draft_n_accepted=None, text=text)

    key, text = (3, "chat", "default", "p", 42), "Look at tree bark."
    pair = (rec("vanilla", "Look at the green leaves. It is a day"), rec("mtp", text))
    for ids, explained in (((0, 1, 99, 80, 81, 82), True), ((0, 1, 77, 81, 82), False)):
        numerics = analyse_mismatches(_PrefixServer(0.05), suite, [pair], 64, {key: TokenReply(ids, text)})
        f = numerics.fields(key)
        assert (f["token_index"], f["mtp_token_id"], f["runner_up_token_id"]) == (2, ids[2], 99), f
        assert f["explained"] is explained, f
    assert "neither vanilla's runner-up (id 99, ' tr')" in f["unexplained_why"]
    # without the MTP server's ids (a replay that failed) nothing is explained
    f = analyse_mismatches(_PrefixServer(0.05), suite, [pair], 64, {key: "the MTP reply's replay failed: x"}).fields(key)
    assert f["explained"] is False and f["unexplained_why"] == "the MTP reply's replay failed: x"


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


def test_llama_server_answers_as_the_designed_vanilla_imitates(llama_server_bin, tiny_mtp_model):
    """What NearTieVanilla (tests/numerics_kit.py) keeps of the real answers and rewrites: the pinned
    llama-server lists each generated token first in its own ``top_logprobs`` (the greedy argmax,
    log-probabilities descending), its listing spells the chat reply, and the one-token evaluation
    of a prefix (the analysis' batched request) lists one entry with its top-2. On the synthetic
    model every margin is many nats, so the batched argmax is the listed token on any machine."""
    from ggufmtp.measure.core.arms import send
    from ggufmtp.runtime.server import LlamaServer, ServerConfig

    p = load_suite().prompts[0]
    with LlamaServer(ServerConfig(model=tiny_mtp_model, threads=2, ctx_size=2048)) as s:
        chat = send(s, p, 42, 32, "default", "chat").text
        ids = s.tokenize(s.post_json("/apply-template", {"messages": p.chat_messages()})["prompt"],
                         add_special=True, parse_special=True)
        probs = s.complete(ids, n_predict=32, temperature=0.0, seed=42, cache_prompt=False,
                           n_probs=2)["completion_probabilities"]
        j = 5
        batched = s.complete(ids + [e["id"] for e in probs[:j]], n_predict=1, temperature=0.0, cache_prompt=False,
                             n_probs=2)["completion_probabilities"]
    assert "".join(e["token"] for e in probs).startswith(chat) and len(probs) == 32
    for e in probs:
        top = e["top_logprobs"]
        assert len(top) == 2 and (top[0]["id"], top[0]["token"]) == (e["id"], e["token"])
        assert top[0]["logprob"] - top[1]["logprob"] > 1.0
    assert len(batched) == 1 and len(batched[0]["top_logprobs"]) == 2
    assert batched[0]["id"] == batched[0]["top_logprobs"][0]["id"] == probs[j]["id"]
