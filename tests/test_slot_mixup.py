"""Identity per request under several slots (issue #52 item 4; upstream ggml-org/llama.cpp#28286:
``draft-mtp`` with ``--parallel`` > 1 mixing one request's content into another's).

The runtime test runs the real slot study (:func:`~ggufmtp.measure.verify.slots.measure_slots`) on
real llama-servers serving a synthetic model, with a man-in-the-middle HTTP proxy on 127.0.0.1 in
front of the MTP server only: in the first concurrent batch it swaps the two replies' contents, in
the second it splices one reply's text into the other's. Both mix-ups leave five of eight replies
identical, so under ``min_identical`` 0.6 the count-only gate of main 8641bee passed the study; the
per-request gate fails it and names the requests. The unit tests re-judge designed recorded
sections, as the audit does."""

from __future__ import annotations

import http.client
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from receipt_kit import slot_replies

import ggufmtp.measure.verify.slots as slots_mod
from ggufmtp.measure.core.suite import load_suite
from ggufmtp.measure.verify.slots import measure_slots
from ggufmtp.provenance.slot_identity import compare_batch
from ggufmtp.provenance.verdict import Thresholds, slot_failures
from ggufmtp.runtime.server import LlamaServer, ServerConfig
from ggufmtp.synth.spec import SynthSpec

N_PROMPTS, MAX_TOKENS, SEED, LOOSE = 8, 48, 42, Thresholds(min_identical=0.6)


class _Mixer:
    """Holds the measured chat replies (``max_tokens`` == MAX_TOKENS; the warm-up passes untouched)
    two at a time -- one concurrent batch of two slots -- and mixes batch 0 (swap) and batch 2
    (splice the second job's text into the first's from a third of the way in). Batch 1 is left
    alone: on the synthetic model its two prompts have the same reply, so a mix-up there is none."""

    def __init__(self, victims: dict[int, list[str]]):
        self.victims, self.cond, self.held, self.batch = victims, threading.Condition(), {}, 0

    def mix(self, body: dict, resp: dict) -> dict:
        with self.cond:
            batch = self.batch
            self.held[json.dumps(body.get("messages"), sort_keys=True)] = resp
            if len(self.held) == 2:  # the batch's second reply: mix both (in place), release the first
                self._apply(batch)
                self.held, self.batch = {}, batch + 1
                self.cond.notify_all()
            else:
                assert self.cond.wait_for(lambda: self.batch > batch, timeout=300), "the batch's other reply never came"
        return resp

    def _apply(self, batch: int) -> None:
        if batch not in self.victims:
            return
        a, b = (self.held[k]["choices"][0]["message"] for k in self.victims[batch])
        if batch == 0:
            a["content"], b["content"] = b["content"], a["content"]
        else:
            n = len(a["content"]) // 3
            a["content"] = a["content"][:n] + b["content"][n:]


def _proxy(upstream: int, mixer: _Mixer) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def _forward(self, method: str) -> None:
            data = self.rfile.read(int(self.headers.get("Content-Length") or 0)) or None
            conn = http.client.HTTPConnection("127.0.0.1", upstream, timeout=600)
            conn.request(method, self.path, body=data, headers={"Content-Type": "application/json"} if data else {})
            r = conn.getresponse()
            payload, status = r.read(), r.status
            conn.close()
            body = json.loads(data) if data else {}
            if status == 200 and self.path.startswith("/v1/chat") and body.get("max_tokens") == MAX_TOKENS:
                payload = json.dumps(mixer.mix(body, json.loads(payload))).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self._forward("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._forward("POST")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def mixed_study(synth_model):
    model = synth_model(SynthSpec(wrong_successor_fraction=0.2))
    prompts = load_suite().limit(N_PROMPTS).prompts
    jobs = [(p, SEED) for p in prompts]
    key = {p.id: json.dumps(p.chat_messages(), sort_keys=True) for p in prompts}
    mixer = _Mixer({0: [key[prompts[0].id], key[prompts[1].id]], 2: [key[prompts[4].id], key[prompts[5].id]]})

    class Proxied(LlamaServer):
        """The real server; the MTP one answered through the mixing proxy (the client's port is the proxy's)."""

        def __enter__(self) -> LlamaServer:
            super().__enter__()
            self.proxy = _proxy(self.port, mixer) if self.config.draft_mtp else None  # type: ignore[arg-type]
            if self.proxy is not None:
                self.port = self.proxy.server_address[1]
            return self

        def __exit__(self, *exc: Any) -> None:
            if self.proxy is not None:
                self.proxy.shutdown()
                self.proxy.server_close()
            super().__exit__(*exc)

    cfg = lambda s, **kw: ServerConfig(model=model, threads=1, ctx_size=1024 * s, parallel=s, **kw)  # noqa: E731
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(slots_mod, "LlamaServer", Proxied)
        study = measure_slots([2], cfg, lambda s: cfg(s, draft_mtp=True, draft_n_max=4), jobs, "default", MAX_TOKENS,
                              (0.5, (0.0, 1.0)), progress=False)
    return prompts, mixer, study.to_dict()


def test_a_designed_mix_up_between_concurrent_requests_fails_the_gate(mixed_study):
    """Swap and splice leave 5/8 replies identical (>= 0.6): the count passed on main 8641bee; the
    per-request gate fails and names each request that got another's text."""
    prompts, mixer, section = mixed_study
    assert mixer.batch == 4, "the proxy saw the four measured batches"
    (row,) = section["rows"]
    assert (row["identical"], row["pairs"]) == (5, 8) and row["identical"] / row["pairs"] >= LOOSE.min_identical
    reasons = slot_failures(section, LOOSE)
    p = [x.id for x in prompts]
    for victim, source in ((p[0], p[1]), (p[1], p[0]), (p[4], p[5])):
        assert any(f"request {victim}/seed {SEED} got text of another request ({source}/seed {SEED})" in r
                   for r in reasons), reasons
    assert all("at 2 slots" in r for r in reasons) and len(reasons) == 3, reasons
    # at the default min_identical 1.0 the count fails too (main failed there, without naming anyone)
    assert any("identical output at 2 slots: 5/8" in r for r in slot_failures(section, Thresholds()))
    # the same section, every record honest about identity, passes: the failure is the mix-up's
    by_req = {r["prompt"]: r for r in row["replies"]}
    assert by_req[p[0]]["vanilla_sha256"] != by_req[p[1]]["vanilla_sha256"], "the swapped replies differ"
    assert by_req[p[4]]["vanilla_sha256"] != by_req[p[5]]["vanilla_sha256"], "the spliced replies differ"
    assert by_req[p[4]]["first_difference"] > 0 and by_req[p[5]]["first_difference"] is None


def test_an_unmixed_study_on_the_same_servers_passes(mixed_study):
    """The records of the batches the proxy left alone: every reply identical to vanilla's reply to
    the same request, so the gate's failure above is the mix-up's, not the model's."""
    prompts, _, section = mixed_study
    rest = [r for r in section["rows"][0]["replies"] if r["batch"] in (1, 3)]
    assert len(rest) == 4 and all(r["first_difference"] is None and r["text_of"] is None for r in rest)


def _section(records: list[dict], identical: int | None = None) -> dict:
    same = sum(r["first_difference"] is None for r in records) if identical is None else identical
    return {"reference": {"slots": 1, "acceptance": 0.7, "acceptance_ci95": [0.6, 0.8]},
            "rows": [{"slots": 4, "acceptance": 0.7, "identical": same, "pairs": len(records), "replies": records}]}


def test_compare_batch_keys_each_reply_by_its_own_request():
    van = ["alpha " * 10, "bravo " * 10, "charlie " * 10, "delta " * 10]
    keys = [("p0", 7), ("p1", 7), ("p2", 7), ("p3", 7)]
    spliced = van[2][:12] + van[3][12:]
    mtp = [van[1], van[0], spliced, van[3][:30] + "x" * 30]  # swap, splice, an ordinary divergence
    recs = compare_batch(3, keys, van, mtp)
    assert [(r.first_difference, r.text_of) for r in recs] == [(0, "p1/seed 7"), (0, "p0/seed 7"),
                                                              (12, "p3/seed 7"), (30, None)]
    assert all(r.batch == 3 for r in recs)
    # a divergence into text the request's own vanilla reply also has is not another request's
    own = compare_batch(0, keys[:2], [van[0] + van[1], van[1]], [van[1] + van[1], van[1]])
    assert (own[0].first_difference, own[0].text_of) == (0, None)
    same = compare_batch(0, keys[:2], ["same"] * 2, ["same"] * 2)  # equal replies: nothing to mix up
    assert [(r.first_difference, r.text_of) for r in same] == [(None, None)] * 2


def test_the_rejudgment_finds_a_swap_from_the_recorded_hashes():
    """A swap recorded without ``text_of``: the audit re-derives it from the hashes (MTP's reply to
    p5 has p4's vanilla hash), whatever min_identical allows; on main the 6/8 count passed at 0.6."""
    recs = slot_replies(8, batch_size=4)
    recs[4]["mtp_sha256"], recs[5]["mtp_sha256"] = recs[5]["vanilla_sha256"], recs[4]["vanilla_sha256"]
    recs[4]["first_difference"] = recs[5]["first_difference"] = 0
    reasons = slot_failures(_section(recs), LOOSE)
    assert any("request p4/seed 42 got text of another request (p5/seed 42) from character 0" in r for r in reasons)
    assert any("request p5/seed 42 got text of another request (p4/seed 42)" in r for r in reasons)
    assert all("at 4 slots" in r for r in reasons), reasons
    # the recorded text_of of a splice is the measurement's finding: it fails as recorded
    spliced = slot_replies(8, differing=1, batch_size=4)
    spliced[7]["text_of"] = "p6/seed 42"
    (reason,) = slot_failures(_section(spliced), LOOSE)
    assert "request p7/seed 42 got text of another request (p6/seed 42) from character 3" in reason


def test_the_rejudgment_refuses_identity_claimed_without_evidence():
    th = Thresholds()
    assert slot_failures(_section(slot_replies(8)), th) == []
    bare = _section(slot_replies(8))
    del bare["rows"][0]["replies"]
    (reason,) = slot_failures(bare, th)
    assert "at 4 slots records no per-request evidence" in reason
    reasons = slot_failures(_section(slot_replies(8, differing=1), identical=8), th)
    assert any("records 8/8 identical, its 8 per-request records show 7" in r for r in reasons), reasons
    twice = slot_replies(8)
    twice[1]["prompt"] = "p0"
    assert "records a request twice" in slot_failures(_section(twice), th)[0]
    lying = slot_replies(8)
    lying[2]["first_difference"] = 5  # a difference between equal hashes
    assert "whose difference is not its hashes'" in slot_failures(_section(lying), th)[0]
    elsewhere = slot_replies(8, differing=1, batch_size=4)
    elsewhere[7]["text_of"] = "p0/seed 42"  # p0 was sent in batch 0, p7 in batch 1
    assert any("not a request of its batch" in r for r in slot_failures(_section(elsewhere), LOOSE))


def test_an_ordinary_difference_counts_against_min_identical_and_is_named():
    recs = slot_replies(8, differing=1)
    assert slot_failures(_section(recs), Thresholds(min_identical=0.8)) == []
    (reason,) = slot_failures(_section(recs), Thresholds())
    assert "identical output at 4 slots: 7/8" in reason and "differing: p7/seed 42 from character 3" in reason
