"""ggufmtp.server against the real llama-server of the pinned runtime, on synthetic models.

Also the behavioural contract of ggufmtp.synth: measured MTP acceptance vs the knob, prompt
dependence, losslessness of speculative decoding at temperature 0.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import pytest

from ggufmtp.errors import ServerError
from ggufmtp.runtime.server import LlamaServer, ServerConfig, parse_prometheus, require_drafting
from ggufmtp.synth.builtin import BUILTIN_MODELS
from ggufmtp.synth.chain import predict_tokens, simulate_acceptance
from ggufmtp.synth.spec import SynthSpec, expected_acceptance
from ggufmtp.synth.tokenizer import build_vocab

PROMPTS = [
    "Tell me about the sea.",
    "Explain gravity to a child.",
    "How do I bake bread?",
    "Write a poem about the city walls",
    "What is a computer program?",
]
N_TOKENS = 96


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0): look at its state
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def _cfg(model, **kw) -> ServerConfig:
    kw.setdefault("threads", 2)
    kw.setdefault("ctx_size", 4096)
    return ServerConfig(model=model, **kw)


def _last_prompt_token(srv: LlamaServer, prompt: str) -> int:
    return srv.chat_prompt_tokens([{"role": "user", "content": prompt}])[-1]


def _run_prompts(srv: LlamaServer, spec: SynthSpec | None, k: int):
    """(texts, drafted, accepted, simulated drafted, simulated accepted) over PROMPTS."""
    texts, d, a, sd, sa = [], 0, 0, 0, 0
    for p in PROMPTS:
        r = srv.chat([{"role": "user", "content": p}], max_tokens=N_TOKENS)
        texts.append(r["choices"][0]["message"]["content"])
        assert r["timings"]["predicted_n"] == N_TOKENS  # never stops early (no EOS in the chain)
        if spec is not None:
            dd, aa = require_drafting(r)
            assert dd > 0
            d, a = d + dd, a + aa
            last = _last_prompt_token(srv, p)
            # the reply is exactly the bigram chain from the prompt's last token ...
            assert texts[-1] == build_vocab().decode(predict_tokens(spec, last, N_TOKENS))
            # ... and the server's draft accounting is exactly the simulated one
            s_d, s_a = simulate_acceptance(spec, last, N_TOKENS, k)
            sd, sa = sd + s_d, sa + s_a
    return texts, d, a, sd, sa


# ----------------------------------------------------------------------------- MTP behaviour


@pytest.mark.parametrize("name,k", [("tiny-qwen35moe", 3), ("tiny-qwen35moe-f50", 3), ("tiny-qwen35moe-f20", 2)])
def test_acceptance_matches_the_knob(llama_server_bin, synth_model, name, k):
    spec = BUILTIN_MODELS[name]
    f = spec.wrong_successor_fraction
    with LlamaServer(_cfg(synth_model(name), draft_mtp=True, draft_n_max=k)) as srv:
        texts, d, a, sd, sa = _run_prompts(srv, spec, k)
        m = srv.metrics()
    measured = a / d
    expected = expected_acceptance(f, k)
    print(f"{name} k={k}: measured {a}/{d} = {measured:.3f}, formula {expected:.3f}, simulated {sa}/{sd}")
    assert (d, a) == (sd, sa)
    if f == 0:
        assert measured == 1.0
    else:
        assert abs(measured - expected) < 0.08
        assert measured < 0.9
    assert m["llamacpp:spec_decode_num_draft_tokens_total"] == d
    assert m["llamacpp:spec_decode_num_accepted_tokens_total"] == a
    assert len(set(texts)) == len(texts)  # every prompt gives its own text


def test_prompt_dependence_determinism_and_losslessness(llama_server_bin, synth_model):
    """Vanilla and draft-mtp give identical texts at temperature 0, even when the MTP head is wrong
    half of the time; different prompts differ; the same prompt is deterministic."""
    model = synth_model("tiny-qwen35moe-f50")
    msgs = [[{"role": "user", "content": p}] for p in PROMPTS[:3]]
    with LlamaServer(_cfg(model)) as vanilla:
        plain = [vanilla.chat(m, max_tokens=64) for m in msgs]
        again = vanilla.chat(msgs[0], max_tokens=64)
    with LlamaServer(_cfg(model, draft_mtp=True)) as spec:
        drafted = [spec.chat(m, max_tokens=64) for m in msgs]
    text = lambda r: r["choices"][0]["message"]["content"]  # noqa: E731
    assert [text(r) for r in plain] == [text(r) for r in drafted]
    assert len({text(r) for r in plain}) == 3
    assert text(again) == text(plain[0])
    assert all("draft_n" not in r["timings"] for r in plain)
    assert all(r["timings"]["draft_n"] > 0 for r in drafted)


def test_dense_qwen35_and_mtp_only_sidecar(llama_server_bin, synth_model):
    with LlamaServer(_cfg(synth_model("tiny-qwen35"), draft_mtp=True)) as srv:
        d, a = require_drafting(srv.chat([{"role": "user", "content": PROMPTS[0]}], max_tokens=64))
        assert d > 0 and a == d
    # an MTP-only sidecar is refused as the main model (llama-server would SIGSEGV) ...
    with pytest.raises(ServerError, match="MTP-only sidecar"):
        LlamaServer(_cfg(synth_model("tiny-qwen35moe-mtp-only"), draft_mtp=True)).start()
    # ... and works as --spec-draft-model next to the target without MTP
    with LlamaServer(_cfg(synth_model("tiny-qwen35moe-nomtp"), draft_mtp=True,
                          draft_model=synth_model("tiny-qwen35moe-mtp-only"))) as srv:
        d, a = require_drafting(srv.chat([{"role": "user", "content": PROMPTS[1]}], max_tokens=64))
        assert d > 0 and a == d


def test_tokenizer_round_trip(llama_server_bin, tiny_mtp_model):
    with LlamaServer(_cfg(tiny_mtp_model)) as srv:
        text = "Hello world, the sea was calm. Ünïcode ✓ 123"
        ids = srv.tokenize(text)
        assert len(ids) < len(text.encode())  # merges apply
        assert srv.post_json("/detokenize", {"tokens": ids})["content"] == text
        special = srv.tokenize("<|im_start|>user")
        assert special[0] == build_vocab().im_start


# ----------------------------------------------------------------------------- no MTP


def test_no_mtp_model_with_draft_mtp(llama_server_bin, synth_model):
    model = synth_model("tiny-qwen35moe-nomtp")
    # ggufmtp refuses up front ...
    with pytest.raises(ServerError, match="has no MTP block"):
        LlamaServer(_cfg(model, draft_mtp=True)).start()
    # ... and llama-server itself exits at startup ("failed to create MTP context")
    with pytest.raises(ServerError, match="no MTP layers"):
        LlamaServer(_cfg(model, draft_mtp=True, check_mtp=False)).start()
    # without speculation the model serves, and responses say that nothing was drafted
    with LlamaServer(_cfg(model)) as srv:
        r = srv.chat([{"role": "user", "content": "hi"}], max_tokens=8)
        with pytest.raises(ServerError, match="did not run"):
            require_drafting(r)


def test_incomplete_mtp_block_fails_to_load_with_log_tail(llama_server_bin, synth_model):
    model = synth_model("tiny-qwen35moe-no-hnorm")
    with pytest.raises(ServerError) as ei:
        LlamaServer(_cfg(model, draft_mtp=True)).start()
    msg = str(ei.value)
    assert "failed to load model" in msg and "blk.4.nextn.hnorm.weight" in msg


# ----------------------------------------------------------------------------- lifecycle & errors


def test_kill_mid_run_is_reported_as_crash_and_leaves_nothing(llama_server_bin, tiny_mtp_model):
    srv = LlamaServer(_cfg(tiny_mtp_model, draft_mtp=True))
    srv.start()
    pid = srv.pid
    assert pid and _alive(pid)
    killer = threading.Timer(0.5, os.kill, (pid, signal.SIGKILL))
    killer.start()
    try:
        with pytest.raises(ServerError, match="crashed") as ei:
            for _ in range(50):  # each reply takes ~1.5 s; the kill lands during one of them
                srv.chat([{"role": "user", "content": PROMPTS[0]}], max_tokens=3500)
        assert "SIGKILL" in str(ei.value)
        with pytest.raises(ServerError, match="crashed"):
            srv.props()
    finally:
        killer.cancel()
        srv.stop()
    assert not _alive(pid) and not _group_alive(pid)


def test_context_manager_stops_on_exception(llama_server_bin, tiny_mtp_model):
    with pytest.raises(KeyboardInterrupt):
        with LlamaServer(_cfg(tiny_mtp_model)) as srv:
            pid = srv.pid
            assert srv.get_json("/health")["status"] == "ok"
            raise KeyboardInterrupt
    assert not _alive(pid) and not _group_alive(pid)
    assert srv.log_path is not None and srv.log_path.is_file()


def test_props_metrics_build_info(llama_server_bin, tiny_mtp_model):
    with LlamaServer(_cfg(tiny_mtp_model, draft_mtp=True, draft_n_max=2, draft_n_min=1, draft_p_min=0.5)) as srv:
        assert "0c1e570" in (srv.build_info or "")
        assert srv.props()["model_path"] == str(tiny_mtp_model)
        assert "--spec-draft-n-max" in srv.command and "--no-repack" in srv.command
        srv.complete("The sea was", n_predict=16)
        m = srv.metrics()
        assert m["llamacpp:spec_decode_num_drafts_total"] > 0
        assert any(k.startswith('llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"}') for k in m)


def test_parse_prometheus():
    text = '# HELP x y\n# TYPE a counter\na_total 3\nb{position="1"} 2.5\nbad line\nc NaN\n'
    m = parse_prometheus(text)
    assert m["a_total"] == 3.0 and m['b{position="1"}'] == 2.5 and m["c"] != m["c"]


def test_missing_binary(tmp_path, tiny_mtp_model):
    with pytest.raises(ServerError, match="not found"):
        LlamaServer(_cfg(tiny_mtp_model, llama_cpp_bin=tmp_path / "nowhere")).start()


def test_bad_model_paths(llama_server_bin, tmp_path):
    with pytest.raises(ServerError, match="no such file"):
        LlamaServer(_cfg(tmp_path / "missing.gguf")).start()
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(ServerError, match="failed to load model") as ei:
        LlamaServer(_cfg(junk)).start()
    assert "log" in str(ei.value)


def test_unknown_flag_is_caught_before_starting(llama_server_bin, tiny_mtp_model):
    with pytest.raises(ServerError, match="--definitely-not-a-flag"):
        LlamaServer(_cfg(tiny_mtp_model, extra_args=["--definitely-not-a-flag", "1"])).start()


def test_port_in_use(llama_server_bin, tiny_mtp_model):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        with pytest.raises(ServerError, match="in use"):
            LlamaServer(_cfg(tiny_mtp_model, port=port)).start()


def test_health_timeout_kills_the_server(llama_server_bin, tiny_mtp_model):
    srv = LlamaServer(_cfg(tiny_mtp_model, startup_timeout=0.0))
    t0 = time.monotonic()
    with pytest.raises(ServerError, match="did not become healthy"):
        srv.start()
    assert time.monotonic() - t0 < 30
    assert srv.pid is not None and not _alive(srv.pid) and not _group_alive(srv.pid)


def test_port_race_is_not_fooled_by_another_server(llama_server_bin, tiny_mtp_model, monkeypatch):
    """If another process grabs the free port first (here: a fake server that answers /health 200),
    the manager must notice that the listener is not its llama-server and retry on another port."""
    import http.server

    from ggufmtp.runtime import server as server_mod
    class Healthy(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"status":"ok"}')

        def log_message(self, *a):
            pass

    fake = http.server.HTTPServer(("127.0.0.1", 0), Healthy)
    threading.Thread(target=fake.serve_forever, daemon=True).start()
    taken = fake.server_address[1]
    real_free = server_mod._free_port
    ports = iter([taken])
    monkeypatch.setattr(server_mod, "_free_port", lambda: next(ports, None) or real_free())
    try:
        with LlamaServer(_cfg(tiny_mtp_model)) as srv:
            assert srv.port != taken
            assert srv.props()["model_path"] == str(tiny_mtp_model)
    finally:
        fake.shutdown()


def test_one_command_builder_and_its_display_forms():
    """build_command writes the command line; the display form and the flag lists derive from it."""
    from ggufmtp.runtime.server import build_command, display_command, flags_without, pick_flags

    cfg = ServerConfig(model="m.gguf", draft_mtp=True, draft_n_max=3, threads=2, env={"B": "2", "A": "1"},
                       extra_args=["-bs"])
    cmd = build_command(cfg, "/opt/llama-server", 8080)
    assert cmd[:7] == ["/opt/llama-server", "--model", "m.gguf", "--host", "127.0.0.1", "--port", "8080"]
    assert cmd[-3:] == ["--spec-draft-n-max", "3", "-bs"]
    assert LlamaServer(cfg).build_command("/opt/llama-server", 8080) == cmd
    assert flags_without(cmd) == cmd[7:]
    assert display_command(cfg, "/opt/llama-server") == "A=1 B=2 llama-server --model m.gguf " + " ".join(cmd[7:])
    assert display_command(cfg, "/opt/llama-server", None).startswith("A=1 B=2 /opt/llama-server --model m.gguf ")
    assert pick_flags(cmd, ["--spec-draft-n-max", "--spec-draft-p-min", "--threads"]) == [
        "--spec-draft-n-max", "3", "--threads", "2"]
    with pytest.raises(ServerError, match="need draft_mtp=True"):
        build_command(ServerConfig(model="m.gguf", draft_n_max=3), "llama-server", 0)


def test_spec_counters_and_replies():
    from ggufmtp.runtime.replies import Reply, SpecCounters

    pos = 'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="%d"}'
    before = SpecCounters.from_metrics({"llamacpp:spec_decode_num_drafts_total": 2,
                                        "llamacpp:spec_decode_num_draft_tokens_total": 6,
                                        "llamacpp:spec_decode_num_accepted_tokens_total": 3, pos % 0: 2})
    after = SpecCounters.from_metrics({"llamacpp:spec_decode_num_drafts_total": 5,
                                       "llamacpp:spec_decode_num_draft_tokens_total": 15,
                                       "llamacpp:spec_decode_num_accepted_tokens_total": 9, pos % 0: 4, pos % 1: 3})
    d = after.since(before)
    assert (d.draft_tokens, d.accepted, d.n_drafts, d.per_position) == (9, 6, 3, (2, 3)) and d.available
    assert d.matches(9, 6) and not d.matches(9, 5) and d.tokens_per_step == 3.0
    assert d.acceptance_by_position == [2 / 3, 1.0]
    assert not SpecCounters.from_metrics({}).available and SpecCounters().tokens_per_step is None
    r = Reply.parse({"timings": {"predicted_n": 5, "predicted_ms": 2.5, "draft_n": 4, "draft_n_accepted": 2},
                     "choices": [{"message": {"content": "hi", "reasoning_content": "hm"}, "finish_reason": "stop"}]})
    assert (r.text, r.finish_reason, r.predicted_n, r.drafted) == ("<think>hm</think>hi", "stop", 5, True)
    assert Reply.parse({"timings": {"predicted_n": 1, "predicted_ms": 1}, "content": "x", "stop_type": "eos"},
                       "raw").text == "x"
    with pytest.raises(ServerError, match="no timings.predicted_n"):
        Reply.parse({"timings": {}})
