"""ggufmtp verify: the real llama-server on synthetic models, plus the pure parts (suite loader,
bootstrap CIs, verdict policy, sweep recommendation).

Run time is kept small (a few prompts, one or two seeds, 32-64 tokens): on 2 CPU cores each
verify run is 12-24 requests of a tiny model, a few seconds when the machine is quiet.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import signal
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from ggufmtp import stats as stats
from ggufmtp.cli import main
from ggufmtp.errors import VerifyError
from ggufmtp.measure.core.options import ServerOptions, TuneConfig, VerifyOptions
from ggufmtp.measure.core.suite import SUITES_DIR, SuiteError, load_suite, modes_for_template
from ggufmtp.measure.verify.run import Thresholds, evaluate_verdict, recommend, verify
from ggufmtp.measure.verify.summary import Comparison
from ggufmtp.runtime.server import LlamaServer, ServerConfig
from ggufmtp.synth.chain import simulate_acceptance
from ggufmtp.synth.spec import SynthSpec, expected_acceptance

K = 4
FAST = dict(seeds=(42,), limit=6, max_tokens=64, threads=2)  # verify's options, flat (VerifyOptions.from_dict)
KNOBS = (0.0, 0.3, 0.6)


# ----------------------------------------------------------------------------- helpers


def _llama_children() -> dict[int, list[str]]:
    """Live (non-zombie) llama-server processes whose parent is this test process."""
    me = os.getpid()
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as fh:
                stat = fh.read()
            with open(f"/proc/{d}/cmdline", "rb") as fh:
                cmd = [c.decode(errors="replace") for c in fh.read().split(b"\0") if c]
        except OSError:
            continue
        comm = stat[stat.index("(") + 1: stat.rindex(")")]
        state, ppid = stat[stat.rindex(")") + 2:].split()[:2]
        if int(ppid) == me and comm.startswith("llama-server") and state != "Z":
            out[int(d)] = cmd
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def run_cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def knob_models(synth_model):
    return {f: synth_model(SynthSpec(wrong_successor_fraction=f)) for f in KNOBS}


@pytest.fixture(scope="module")
def knob_results(llama_server_bin, knob_models):
    """One verify run per knob (f=0.3 with two seeds, for the per-seed rows)."""
    out = {}
    for f, path in knob_models.items():
        kw = dict(FAST)
        if f == 0.3:
            kw["seeds"] = (42, 7)
        out[f] = verify(path, VerifyOptions.from_dict({**kw, "draft_n_max": K}), progress=False)
    assert not _llama_children(), "verify left llama-server processes behind"
    return out


# ----------------------------------------------------------------------------- real llama-server


def test_acceptance_orders_models_and_matches_the_knob(knob_results):
    acc = {f: r.main.acceptance for f, r in knob_results.items()}
    ci = {f: r.main.acceptance_ci95 for f, r in knob_results.items()}
    # ordering, with separated confidence intervals (not just point estimates)
    assert acc[0.0] > acc[0.3] > acc[0.6], acc
    assert ci[0.3][1] < ci[0.0][0] and ci[0.6][1] < ci[0.3][0], ci
    for f in knob_results:
        exp = expected_acceptance(f, K)
        lo, hi = ci[f]
        if f == 0.0:
            # a head that always agrees: every drafted token is accepted, so the CI is the point 1.0
            assert acc[f] == 1.0 and lo == hi == 1.0
            continue
        assert hi - lo > 0.005, f"degenerate CI at f={f}: {ci[f]}"
        # The formula is exact only for replies much longer than k that visit the whole successor cycle;
        # our 64-token replies (server caps the last drafts at n_remaining - 1) and a percentile bootstrap
        # over only 6 prompts (it under-covers at small n) justify a 2-point widening of the CI.
        slack = 0.02
        assert lo - slack <= exp <= hi + slack, f"f={f}: expected {exp:.4f}, measured {acc[f]:.4f} CI {ci[f]}"


def test_measured_counts_equal_the_bigram_simulation(knob_results, knob_models):
    """Every MTP request's (draft_n, draft_n_accepted) equals what the synthetic model's exact simulation
    of llama-server's draft loop predicts: the numbers verify reports are the server's, not invented."""
    res = knob_results[0.3]
    spec = SynthSpec(wrong_successor_fraction=0.3)
    suite = load_suite("chat-v1").limit(FAST["limit"])
    with LlamaServer(ServerConfig(model=knob_models[0.3], threads=2, metrics=False)) as srv:
        last = {}
        for p in suite.prompts:
            last[p.id] = srv.chat_prompt_tokens(p.chat_messages())[-1]
    mtp = [r for r in res.records if r.arm == "mtp"]
    assert len(mtp) == FAST["limit"] * 2
    for r in mtp:
        assert (r.draft_n, r.draft_n_accepted) == simulate_acceptance(spec, last[r.prompt_id], r.predicted_n, K), r



def test_calibrated_head_measures_the_acceptance_it_was_calibrated_for(llama_server_bin, tmp_path):
    """synth --target-acceptance on a prompt file, then verify on the same prompts: llama-server
    reports exactly the acceptance the calibration promised (not merely near the target)."""
    suite = tmp_path / "cal-v1.jsonl"
    suite.write_text("".join(ln + "\n" for ln in (SUITES_DIR / "chat-v1.jsonl").read_text().splitlines()[:6]))
    out = tmp_path / "cal.gguf"
    r = run_cli("synth", out, "--layers", 2, "--target-acceptance", 0.6, "--target-k", K, "--suite", suite,
                "--max-tokens", 48, "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    cal = rep["calibration"]
    assert rep["spec"]["wrong_successor_fraction"] == cal["wrong_successor_fraction"] > 0
    assert abs(cal["acceptance"] - 0.6) < 0.1
    res = verify(out, VerifyOptions(draft_n_max=K, seeds=(42,), suite=str(suite), max_tokens=48,
                                    server=ServerOptions(threads=2)), progress=False)
    assert res.main.acceptance == pytest.approx(cal["acceptance"], abs=1e-12), (res.main, cal)
    assert 0 < res.main.acceptance < 1
    clash = run_cli("synth", tmp_path / "x.gguf", "--target-acceptance", 0.6, "--wrong-successor-fraction", 0.2)
    assert clash.exit_code == 2 and "--target-acceptance sets the wrong-successor fraction" in clash.output
    assert not (tmp_path / "x.gguf").exists()

def test_identical_output_and_report_shape(knob_results):
    for f, r in knob_results.items():
        d = r.to_dict()
        assert d["identical_output_fraction"] == 1.0 and d["mismatch_count"] == 0
        # no recipe: the project's defaults judge (#28: "none" is not a verdict)
        assert d["thresholds"]["source"] == "ggufmtp defaults"
        low = d["mtp"]["acceptance"] < d["thresholds"]["min_acceptance"]
        assert d["verdict"] == ("fail" if low else "pass") and len(d["reasons"]) == int(low)
        m = d["mtp"]
        assert m["draft_n"] > 0 and 0 <= m["draft_n_accepted"] <= m["draft_n"]
        assert m["acceptance"] == pytest.approx(m["draft_n_accepted"] / m["draft_n"])
        assert m["tokens_per_second"] > 0 and d["vanilla"]["tokens_per_second"] > 0
        assert d["speedup"] == pytest.approx(m["tokens_per_second"] / d["vanilla"]["tokens_per_second"])
        assert d["speedup_ci95"][0] <= d["speedup"] <= d["speedup_ci95"][1]
        assert set(d["per_category"]) == {"code", "math", "general"}
        assert d["suite"]["name"] == "chat-v1" and len(d["suite"]["sha256"]) == 64
        assert d["server"]["build_info"].endswith("-0c1e570") and d["server"]["commit"] == "0c1e570"
        assert Path(d["server"]["binary"]).name == "llama-server"
        assert "--spec-type" in d["server"]["flags"]["mtp"][str(K)] and "--spec-type" not in d["server"]["flags"]["vanilla"]
        assert d["hardware"]["cpu_cores"] and d["hardware"]["offloaded"] is False
        # per-position acceptance from /metrics: non-increasing, position 1 = P(first draft accepted)
        pp = m["per_position"]
        assert len(pp) == K and all(a >= b for a, b in zip(pp, pp[1:]))
        assert m["n_drafts"] > 0 and m["mean_accepted_per_draft"] == pytest.approx(sum(pp))
        assert d["settings"]["metrics_mismatches"] == 0
        if f == 0.0:
            assert pp[0] == 1.0  # later positions: the last drafts of a reply are capped at n_remaining - 1
    # per seed: at temperature 0 the seed does not change the text, so acceptance is the same
    ps = knob_results[0.3].to_dict()["per_seed"]
    assert set(ps) == {"42", "7"} and ps["42"]["acceptance"] == ps["7"]["acceptance"]
    assert ps["42"]["draft_n"] == ps["7"]["draft_n"]


def test_the_served_file_is_named_by_its_digest(knob_results, knob_models, tmp_path):
    """verification.model.sha256 is the digest of the bytes llama-server served; a model file that
    changes while it is served is refused, naming the file (the digest would not name what ran)."""
    from ggufmtp.files.hashing import sha256_file
    from ggufmtp.measure.core.records import ServedFile

    for f, r in knob_results.items():
        digest = sha256_file(knob_models[f])
        assert r.model.sha256 == digest and len(digest) == 64
        d = r.to_dict()
        assert d["model"]["sha256"] == digest and list(d["model"])[-2:] == ["sha256", "mtp_blocks"]
        assert d["model"]["mtp_blocks"] == [d["model"]["mtp_block"]]
        assert r.to_receipt()["model"]["sha256"] == digest
    copy = tmp_path / "served.gguf"
    copy.write_bytes(knob_models[0.3].read_bytes())

    def append_a_byte(rec):
        if rec.order == 1:
            with open(copy, "ab") as fh:
                fh.write(b"\0")

    with pytest.raises(VerifyError, match=rf"model {re.escape(str(copy))}: changed during the run \(file key"):
        verify(copy, VerifyOptions.from_dict({**FAST, "limit": 1}), on_record=append_a_byte, progress=False)
    assert not _llama_children()
    # the check on its own: a touched file (same size, new mtime) is refused too
    served = ServedFile.of(copy)
    served.check_unchanged()
    os.utime(copy, ns=(served.key.mtime_ns + 10**9, served.key.mtime_ns + 10**9))
    with pytest.raises(VerifyError, match=rf"model {re.escape(str(copy))}: changed during the run.*mtime_ns"):
        served.check_unchanged()


def test_no_mtp_model_fails_cleanly(llama_server_bin, synth_model):
    nomtp = synth_model("tiny-qwen35moe-nomtp")
    with pytest.raises(VerifyError, match=r"MTP block is absent.*complete MTP"):
        verify(nomtp, VerifyOptions.from_dict(FAST), progress=False)
    r = run_cli("verify", nomtp, "--limit", 2)
    assert r.exit_code == 1
    assert "error:" in r.output and "MTP block is absent" in r.output and "Traceback" not in r.output
    incomplete = synth_model("tiny-qwen35moe-no-hnorm")
    with pytest.raises(VerifyError, match=r"incomplete.*nextn\.hnorm"):
        verify(incomplete, VerifyOptions.from_dict(FAST), progress=False)
    assert not _llama_children()


def test_server_killed_mid_run(llama_server_bin, knob_models):
    killed: list[int] = []

    def kill_mtp_after_three(rec):
        if len(killed) == 0 and rec.order >= 2:
            kids = _llama_children()
            assert len(kids) == 2, kids  # both arms are up
            pid = next(p for p, cmd in kids.items() if "draft-mtp" in cmd)
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    with pytest.raises(VerifyError) as ei:
        verify(knob_models[0.3], VerifyOptions.from_dict(FAST), on_record=kill_mtp_after_three, progress=False)
    msg = str(ei.value)
    assert killed and "mtp arm" in msg and "crashed" in msg and "SIGKILL" in msg, msg
    assert not _llama_children(), "a llama-server outlived the failed verify"
    assert not _alive(killed[0])


def test_no_drafting_is_a_hard_error(llama_server_bin, knob_models, monkeypatch):
    """An MTP arm whose replies carry no timings.draft_n (speculation not running) is an error, not a verdict."""
    orig = LlamaServer.chat

    def chat_without_drafts(self, *a, **kw):
        resp = orig(self, *a, **kw)
        resp["timings"].pop("draft_n", None)
        resp["timings"].pop("draft_n_accepted", None)
        return resp

    monkeypatch.setattr(LlamaServer, "chat", chat_without_drafts)
    with pytest.raises(VerifyError, match=r"MTP server \(k=4\): speculation did not run.*no timings\.draft_n"):
        verify(knob_models[0.3], VerifyOptions.from_dict(FAST), progress=False)
    assert not _llama_children()


def test_thinking_modes_are_reported_separately(llama_server_bin, knob_models, tmp_path):
    """A chat template with an enable_thinking switch gives two modes, run and reported apart."""
    tpl = tmp_path / "think.jinja"
    tpl.write_text(
        "{%- for message in messages -%}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
        "'<|im_end|>\\n' -}}{%- endfor -%}{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
        "{%- if messages|length > 0 and messages[-1]['role'] == 'user' -%}"
        "{{- messages[-1]['content'].rstrip(' \\t\\r\\n.?!') -}}{%- endif -%}"
        "{%- if enable_thinking is defined and enable_thinking is false -%}{{- ' right now' -}}{%- endif -%}"
        "{%- endif -%}")
    res = verify(knob_models[0.3], VerifyOptions.from_dict(dict(
        seeds=(42,), limit=3, max_tokens=32, threads=2, extra_args=["--chat-template-file", str(tpl)],
        thresholds=Thresholds(min_acceptance=0.99))), progress=False)
    assert res.modes == ["thinking", "no-thinking"]
    d = res.to_dict()
    assert set(d["modes"]) == {"thinking", "no-thinking"} and d["mode"] == "thinking"
    text = {(r.mode, r.prompt_id): r.text for r in res.records if r.arm == "mtp"}
    # the switch reached the template: the no-thinking prompts end differently, so the bigram replies differ
    assert all(text[("thinking", p)] != text[("no-thinking", p)] for _, p in text)
    # each mode judged on its own
    assert sum("[thinking]" in r for r in res.reasons) == 1 and sum("[no-thinking]" in r for r in res.reasons) == 1


def test_sweep_and_cli_receipt(llama_server_bin, knob_models, tmp_path):
    from ggufmtp.provenance.receipt import load_receipt, receipt_for_quantize, schema_errors
    from ggufmtp.quant.quantize import quantize

    q = quantize(knob_models[0.0], "q8_0-mtp", tmp_path / "tiny-q8.gguf", progress=False)
    rpath = receipt_for_quantize(q)
    assert load_receipt(rpath)["predicate"]["verification"] is None
    out = tmp_path / "v.json"
    r = run_cli("verify", q.output, "--recipe", "q8_0-mtp", "--sweep", "2,4", "--seeds", "42", "--limit", 3,
                "--max-tokens", 48, "--threads", 2, "--receipt", rpath, "--out", out, "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["verdict"] == "pass" and d["thresholds"]["source"] == "recipe q8_0-mtp"
    assert d["thresholds"]["min_acceptance"] == 0.6 and d["settings"]["draft_n_max"] == 4
    assert any("speedup threshold" in n and "not applied" in n for n in d["notes"])  # CPU policy
    assert [row["k"] for row in d["sweep"]] == [2, 4] and d["tuned"]["command"].startswith("llama-server")
    assert {p["profile"] for p in d["tuned"]["profiles"]} == {"low latency", "balanced", "MTP off"}
    # the step cost: one point per window, each = tokens per step / MTP tok/s, and a line through them
    sc = d["tuned"]["by_mode"][d["mode"]]["step_cost"]
    for p, row in zip(sc["points"], d["sweep"]):
        assert row["tokens_per_step"] == pytest.approx(1 + row["draft_n_accepted"] / row["n_drafts"])
        assert p["k"] == row["k"] and p["ms_per_step"] == pytest.approx(
            1000 * row["tokens_per_step"] / row["mtp_tokens_per_second"])
    (p2, ms2), (p4, ms4) = [(p["k"], p["ms_per_step"]) for p in sc["points"]]
    assert sc["per_position_ms"] == pytest.approx((ms4 - ms2) / (p4 - p2))
    assert sc["fixed_ms"] == pytest.approx(ms2 - 2 * sc["per_position_ms"])
    full = json.loads(out.read_text())
    assert len(full["requests"]) == 2 * 2 * 3 and "requests" not in d
    st = load_receipt(rpath)
    assert schema_errors(st) == []
    v = st["predicate"]["verification"]
    assert v["verdict"] == "pass" and v["mtp"]["acceptance"] == 1.0 and v["suite"]["sha256"] == d["suite"]["sha256"]
    assert st["predicate"]["toolchain"]["server"]["build_info"] == d["server"]["build_info"]
    assert not _llama_children()


def test_cli_failing_verdict_exits_1_with_reasons(llama_server_bin, knob_models):
    r = run_cli("verify", knob_models[0.3], "--min-acceptance", 0.9, "--min-speedup", 50, "--seeds", "42",
                "--limit", 3, "--max-tokens", 32, "--threads", 2)
    assert r.exit_code == 1, r.output
    assert "verdict: FAIL" in r.output and "FAIL acceptance" in r.output
    assert "FAIL speedup" not in r.output and "not applied" in r.output  # CPU run: speedup reported, not judged
    assert "overall" in r.output and "per-seed: seed 42" in r.output


# ----------------------------------------------------------------------------- suite loader


def _write(tmp_path, name, lines):
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


def test_shipped_suite():
    s = load_suite("chat-v1")
    assert s.name == "chat-v1" and s.version == "1" and len(s.prompts) >= 50
    assert s.sha256 == hashlib.sha256((SUITES_DIR / "chat-v1.jsonl").read_bytes()).hexdigest()
    counts = s.to_dict()["categories"]
    assert set(counts) == {"code", "math", "general"} and max(counts.values()) - min(counts.values()) <= 2
    assert len({p.id for p in s.prompts}) == len(s.prompts)
    assert s.limit(6).to_dict()["categories"] == {"code": 2, "math": 2, "general": 2}
    assert load_suite(SUITES_DIR / "chat-v1.jsonl").sha256 == s.sha256


def test_user_suite_and_errors(tmp_path):
    ok = _write(tmp_path, "mine.jsonl", [
        '{"id": "a", "category": "x", "prompt": "Hello there."}',
        "",
        '{"id": "b", "category": "y", "messages": [{"role": "system", "content": "Be brief."}, '
        '{"role": "user", "content": "Hi"}]}',
    ])
    s = load_suite(ok)
    assert [p.id for p in s.prompts] == ["a", "b"] and s.version is None
    assert s.prompts[0].chat_messages() == [{"role": "user", "content": "Hello there."}]
    assert s.prompts[1].raw_text() == "Be brief.\n\nHi"
    good = '{"id": "a", "category": "x", "prompt": "p"}'
    cases = {
        "badjson": ([good, good.replace('"a"', '"b"'), '{"id": "c", "category": '], r":3: invalid JSON"),
        "noid": ([good, '{"category": "x", "prompt": "p"}'], r':2: missing or empty "id"'),
        "nocat": (['{"id": "a", "prompt": "p"}'], r':1: .*"category"'),
        "both": (['{"id": "a", "category": "x", "prompt": "p", "messages": []}'], r":1: .*exactly one of"),
        "neither": (['{"id": "a", "category": "x"}'], r":1: .*exactly one of"),
        "dup": ([good, good], r":2: duplicate id 'a' \(first on line 1\)"),
        "lastrole": (['{"id": "a", "category": "x", "messages": [{"role": "user", "content": "q"}, '
                      '{"role": "assistant", "content": "r"}]}'], r":1: .*last message"),
        "badrole": (['{"id": "a", "category": "x", "messages": [{"role": "bot", "content": "q"}]}'], r":1: .*messages\[0\]"),
        "array": (["[1, 2]"], r":1: expected a JSON object"),
    }
    for name, (lines, pattern) in cases.items():
        p = _write(tmp_path, f"{name}.jsonl", lines)
        with pytest.raises(SuiteError, match=str(p).replace(".", r"\.") + pattern):
            load_suite(p)
    empty = _write(tmp_path, "empty.jsonl", [""])
    with pytest.raises(SuiteError, match="no prompts"):
        load_suite(empty)
    with pytest.raises(SuiteError, match="not a file and not a shipped suite"):
        load_suite("no-such-suite")
    # the CLI names file:line too
    bad = _write(tmp_path, "cli.jsonl", [good, "{oops"])
    r = run_cli("verify", "/nonexistent.gguf", "--suite", bad)
    assert r.exit_code == 1 and f"{bad}:2: invalid JSON" in r.output


def test_thinking_detection():
    assert modes_for_template("{% if enable_thinking is defined and enable_thinking is false %}{% endif %}") == [
        "thinking", "no-thinking"]
    assert modes_for_template("{{ messages }}") == ["default"] and modes_for_template(None) == ["default"]


# ----------------------------------------------------------------------------- bootstrap


def test_bootstrap_is_deterministic_and_handles_edges():
    rng = np.random.default_rng(1)
    d = rng.integers(50, 150, 30)
    a = rng.binomial(d, 0.6)
    e1, e2 = stats.ratio_of_sums(a, d), stats.ratio_of_sums(a, d)
    assert (e1.value, e1.lo, e1.hi) == (e2.value, e2.lo, e2.hi)
    assert e1.value == pytest.approx(a.sum() / d.sum()) and e1.lo < e1.value < e1.hi
    e3 = stats.ratio_of_sums(a, d, seed=99)
    assert (e3.lo, e3.hi) != (e1.lo, e1.hi) and abs(e3.lo - e1.lo) < 0.02
    one = stats.ratio_of_sums([3], [4])
    assert one.value == 0.75 and one.ci == [None, None]
    none = stats.ratio_of_sums([0, 0], [0, 0])
    assert none.value is None and none.ci == [None, None]
    # paired speedup: same tokens, arm A twice as fast on every unit -> exactly 2 with a point CI
    n = np.full(10, 64.0)
    ms_b = rng.uniform(30, 60, 10)
    sp = stats.throughput_ratio(n, ms_b / 2, n, ms_b)
    assert sp.value == pytest.approx(2.0) and sp.lo == pytest.approx(2.0) and sp.hi == pytest.approx(2.0)


def test_bootstrap_coverage_sanity():
    """On data with a known true ratio, the 95% interval covers it in roughly 95% of datasets.
    (Percentile bootstrap under-covers a little at n=40; accept 0.88-0.99 over 300 datasets.)"""
    rng = np.random.default_rng(12345)
    p, hits, trials = 0.45, 0, 300
    for i in range(trials):
        d = rng.integers(20, 120, 40)
        a = rng.binomial(d, rng.beta(p * 20, (1 - p) * 20, 40))  # prompt-level heterogeneity around p
        e = stats.ratio_of_sums(a, d, resamples=1000, seed=i)
        hits += e.lo <= p <= e.hi
    assert 0.88 <= hits / trials <= 0.99, hits / trials
    # and a deliberately wrong "truth" is rarely covered
    d = rng.integers(20, 120, 40)
    a = rng.binomial(d, p)
    assert not stats.ratio_of_sums(a, d).contains(p + 0.1)


# ----------------------------------------------------------------------------- verdict & sweep


def _cmp(k=4, **kw):
    """A comparison row with the given numbers (the rest empty)."""
    base = dict(acceptance=None, acceptance_ci95=[None, None], draft_n=0, draft_n_accepted=0,
                mtp_tokens_per_second=None, vanilla_tokens_per_second=None, speedup=None, speedup_ci95=[None, None],
                n_prompts=1, n_pairs=1, k=k, endpoint="chat", mode="default")
    return Comparison(**{**base, **kw})


def _m(acc=0.7, sp=0.8, ident=1.0):
    return _cmp(acceptance=acc, speedup=sp, speedup_ci95=[sp - 0.05, sp + 0.05], identical_output_fraction=ident)


def test_verdict_policy():
    th = Thresholds(min_acceptance=0.6, min_speedup=1.2)
    assert evaluate_verdict({"default": _m()}, th, offloaded=False)[0] == "pass"  # CPU: speedup not judged
    v, reasons, notes = evaluate_verdict({"default": _m()}, th, offloaded=True)
    assert v == "fail" and reasons == ["speedup 0.800× is below the minimum 1.200×"]
    v, reasons, _ = evaluate_verdict({"default": _m()}, Thresholds(0.6, 1.2, enforce_speedup=True), offloaded=False)
    assert v == "fail" and "speedup" in reasons[0]
    assert evaluate_verdict({"default": _m(sp=1.3)}, th, offloaded=True)[0] == "pass"
    v, reasons, _ = evaluate_verdict({"default": _m(acc=0.5, sp=1.3)}, th, offloaded=True)
    assert v == "fail" and reasons == ["acceptance 50.0 % is below the minimum 60.0 %"]
    v, reasons, _ = evaluate_verdict({"default": _m(ident=0.98)}, th, offloaded=False)
    assert v == "fail" and "identical output" in reasons[0]
    assert evaluate_verdict({"default": _m(ident=0.98)}, Thresholds(min_identical=0.95), False)[0] == "pass"
    _, _, notes = evaluate_verdict({"default": _m()}, Thresholds(), offloaded=False)
    assert any(n.startswith("speed not verified on this hardware") for n in notes)  # the defaults: a threshold
    v, reasons, _ = evaluate_verdict({"default": _m()}, Thresholds(min_acceptance=None), offloaded=True)
    assert v == "fail" and reasons[0].startswith("no acceptance threshold set: a verdict without thresholds")
    v, reasons, _ = evaluate_verdict({"thinking": _m(acc=0.9), "no-thinking": _m(acc=0.5)}, th, offloaded=False)
    assert v == "fail" and len(reasons) == 1 and "[no-thinking]" in reasons[0]


def test_recommend():
    def row(k, sp, lo, hi, acc=0.7, ident=1.0):
        return _cmp(k, speedup=sp, speedup_ci95=[lo, hi], acceptance=acc, identical_output_fraction=ident)

    rows = [row(2, 1.30, 1.27, 1.33), row(3, 1.44, 1.41, 1.47), row(4, 1.49, 1.46, 1.52), row(6, 1.14, 1.1, 1.2),
            row(8, 0.82, 0.8, 0.85)]
    t = recommend(rows)
    assert t.recommended_k == 4 and t.mtp_beats_vanilla and not t.clear and t.within_noise_of == [3]
    assert t.balanced_k == 3  # smallest k within 5% of 1.49
    prof = {p.profile: p for p in t.profiles}
    assert prof["low latency"].k == 4 and prof["balanced"].k == 3 and not prof["MTP off"].recommended
    t = recommend([row(2, 1.1, 1.05, 1.15), row(4, 1.6, 1.5, 1.7)])
    assert t.clear and t.recommended_k == 4 and t.balanced_k == 4
    # a window that changes the output is never recommended
    assert recommend([row(2, 1.1, 1.05, 1.15), row(4, 1.6, 1.5, 1.7, ident=0.9)]).best_k == 2
    # nothing beats vanilla -> MTP off
    t = recommend([row(2, 0.7, 0.6, 0.8), row(4, 0.95, 0.85, 1.02)])
    assert t.recommended_k is None and t.best_k == 4
    assert {p.profile: p.recommended for p in t.profiles} == {"low latency": False, "balanced": False,
                                                             "MTP off": True}


def test_step_cost_fits_a_line_through_the_windows():
    from ggufmtp.measure.verify.run import format_step_cost, step_cost

    # the H200's fourth run: k=3/4/5 at 3.202/3.815/4.234 tokens per step
    rows = [_cmp(3, tokens_per_step=3.202, mtp_tokens_per_second=335.39, vanilla_tokens_per_second=218.25),
            _cmp(4, tokens_per_step=3.815, mtp_tokens_per_second=354.23, vanilla_tokens_per_second=222.85),
            _cmp(5, tokens_per_step=4.234, mtp_tokens_per_second=347.11, vanilla_tokens_per_second=222.22)]
    sc = step_cost(rows)
    assert [round(p.ms_per_step, 2) for p in sc.points] == [9.55, 10.77, 12.20]
    assert sc.per_position_ms == pytest.approx(1.325, abs=0.002) and sc.fixed_ms == pytest.approx(5.54, abs=0.01)
    assert sc.per_position_in_vanilla_tokens == pytest.approx(sc.per_position_ms / sc.vanilla_ms_per_token)
    line = format_step_cost(sc)
    assert line.startswith("step cost: 5.54 ms + 1.33 ms per draft position (k=3 9.55 ms, k=4 10.77 ms")
    assert "costs 0.29 of one" in line
    # one window, or windows that never drafted: no fit
    assert step_cost(rows[:1]) is None
    assert step_cost([dataclasses.replace(r, tokens_per_step=None) for r in rows]) is None


# ----------------------------------------------------------------------------- tuned configuration, bandwidth


def test_verify_a_tuned_configuration_from_the_receipt(llama_server_bin, knob_models, tmp_path):
    """tune's recommendation, stored in the receipt, drives verify's MTP arm (vanilla stays default);
    verify rewrites its own results and keeps what tune added."""
    from ggufmtp._api import store_in_receipt
    from ggufmtp.measure.core.options import TuneConfig
    from ggufmtp.provenance.receipt import load_receipt, receipt_for_quantize, schema_errors
    from ggufmtp.quant.quantize import quantize

    q = quantize(knob_models[0.3], "q8_0-mtp", tmp_path / "tiny-q8.gguf", progress=False)
    rpath = receipt_for_quantize(q)
    # --receipt brings q8_0-mtp's [verify] (#28); this knob model drafts at ~50 %, under its 60 %
    first = run_cli("verify", q.output, "--seeds", "42", "--limit", 2, "--max-tokens", 32, "--threads", 2,
                    "--receipt", rpath, "--min-acceptance", 0.3, "--json")
    assert first.exit_code == 0, first.output
    cfg = TuneConfig(draft_n_max=2, draft_n_min=1, draft_p_min=0.5, threads=1)
    store_in_receipt(rpath, model=q.output, tuned={"kind": "ggufmtp tune", "recommended_config": cfg.to_dict(),
                                                   "best_config": cfg.to_dict()})
    r = run_cli("verify", q.output, "--tuned-from", rpath, "--seeds", "42", "--limit", 3, "--max-tokens", 48,
                "--threads", 2, "--receipt", rpath, "--peak-bandwidth", 50, "--min-acceptance", 0.3, "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["settings"]["mtp_config"]["key"] == cfg.key and d["mtp"]["draft_n_max"] == 2
    flags = d["server"]["flags"]["mtp"]["2"]
    i = flags.index("--spec-draft-p-min")
    assert float(flags[i + 1]) == 0.5 and flags[flags.index("--spec-draft-n-min") + 1] == "1"
    assert "--spec-draft-p-min" not in d["server"]["flags"]["vanilla"]
    # fair baseline: the configuration's thread count is not speculative, so both arms run with it; a
    # third, default vanilla arm keeps the run's --threads and gives speedup_vs_default_vanilla
    assert flags[flags.index("--threads") + 1] == "1"
    van = d["server"]["flags"]["vanilla"]
    assert van[van.index("--threads") + 1] == "1" and d["vanilla"]["server_args"] == van
    assert d["mtp"]["server_args"] == flags
    default = d["default_vanilla"]["server_args"]
    assert default[default.index("--threads") + 1] == "2" and "--spec-type" not in default
    assert d["speedup_vs_default_vanilla"] > 0 and len(d["speedup_vs_default_vanilla_ci95"]) == 2
    assert d["speedup_vs_default_vanilla"] == pytest.approx(
        d["mtp"]["tokens_per_second"] / d["default_vanilla"]["tokens_per_second"])
    assert d["identical_output_fraction"] == 1.0
    # p-min 0.5 stops drafts early on this head (30% wrong successors): fewer than 2 drafted per round
    assert d["mtp"]["draft_n"] < 2 * d["mtp"]["n_drafts"]
    bw = d["bandwidth"]
    assert bw["peak_bytes_per_second"] == 50e9 and bw["peak_source"] == "given"
    assert bw["fraction_of_limit"]["mtp"] == pytest.approx(
        d["mtp"]["tokens_per_second"] * bw["active_bytes_per_token"] / 50e9)
    st = load_receipt(rpath)
    assert schema_errors(st) == []
    v = st["predicate"]["verification"]
    assert v["tuned"]["kind"] == "ggufmtp tune" and v["settings"]["mtp_config"]["key"] == cfg.key
    assert v["bandwidth"]["active_bytes_per_token"] == bw["active_bytes_per_token"]
    text = run_cli("verify", q.output, "--tuned-from", rpath, "--seeds", "42", "--limit", 1, "--max-tokens", 16,
                   "--threads", 2)
    assert text.exit_code == 0, text.output
    assert "MTP arm flags (tuned): --spec-draft-n-max 2 --spec-draft-n-min 1 --spec-draft-p-min 0.5 --threads 1" in text.output
    # the fair figure is the overall row; the default-vanilla figure is labelled as such, below it
    lines = text.output.splitlines()
    overall = next(i for i, ln in enumerate(lines) if ln.startswith("overall"))
    assert lines[overall + 1].startswith("vs default vanilla") and "llama-server's defaults" in lines[overall + 1]
    assert "default vanilla arm (for speedup_vs_default_vanilla only):" in text.output
    assert "bandwidth: active weights" in text.output and "peak bandwidth unknown" in text.output  # CPU, no peak
    assert not _llama_children()


def test_tuned_configuration_errors(knob_models, tmp_path):
    from ggufmtp.measure.tune.run import TuneConfig

    empty = tmp_path / "tune.json"
    empty.write_text(json.dumps({"kind": "ggufmtp tune", "recommended_config": None, "best_config": None}))
    r = run_cli("verify", knob_models[0.0], "--tuned-from", empty)
    assert r.exit_code != 0 and f"{empty}: no tuned configuration" in r.output
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    r = run_cli("verify", knob_models[0.0], "--tuned-from", bad)
    assert r.exit_code != 0 and f"{bad}: not a JSON receipt or tune --out JSON" in r.output
    with pytest.raises(VerifyError, match="sweep cannot be combined"):
        VerifyOptions.from_dict({**FAST, "tuned": TuneConfig(2), "sweep": [2, 3]})
    with pytest.raises(VerifyError, match="disagrees with the tuned configuration"):
        VerifyOptions.from_dict({**FAST, "tuned": TuneConfig(2), "draft_n_max": 3})
    with pytest.raises(VerifyError, match="must be positive"):
        VerifyOptions.from_dict({**FAST, "peak_bandwidth_gbs": -1})


def test_thresholds_merge_and_abba_order():
    """The CLI's threshold merge is the library's; the paired-arm loop alternates V M, M V, ..."""
    from ggufmtp.measure.core.arms import ABBA, paired
    from ggufmtp.provenance.verdict import Verdict
    from ggufmtp.quant.recipe import VerifyThresholds

    rec = Thresholds.from_recipe(VerifyThresholds(min_acceptance=0.5, min_speedup=1.1), "q8_0-mtp")
    assert rec.source == "recipe q8_0-mtp" and rec.merged() == rec
    both = rec.merged(min_speedup=1.3, min_identical=0.9, enforce_speedup=True)
    assert (both.min_acceptance, both.min_speedup, both.min_identical, both.enforce_speedup, both.source) == (
        0.5, 1.3, 0.9, True, "recipe q8_0-mtp + flags")
    assert Thresholds().merged(min_acceptance=0.7).source == "ggufmtp defaults + flags"
    assert Thresholds().merged(min_acceptance=0.7, min_speedup=1.0).source == "flags"
    assert Thresholds().merged().source == "ggufmtp defaults"  # never "none": there is always a threshold
    assert Thresholds.coerce(VerifyThresholds(min_acceptance=0.5)).source == "recipe + ggufmtp defaults"
    assert Verdict.PASS == "pass" and Verdict("fail") is Verdict.FAIL
    calls = []
    order = ABBA()
    pairs = list(paired("ab", lambda x: calls.append(("v", x)), lambda x: calls.append(("m", x)), order))
    pairs += list(paired("c", lambda x: calls.append(("v", x)), lambda x: calls.append(("m", x)), order))
    assert calls == [("v", "a"), ("m", "a"), ("m", "b"), ("v", "b"), ("v", "c"), ("m", "c")]
    assert [p.vanilla_first for p in pairs] == [True, False, True] and order.index == 3


# ----------------------------------------------------------------------------- tests that would catch a wrong verify


def test_a_forced_mismatch_fails_the_verdict_and_exits_1(llama_server_bin, knob_models):
    """Synthetic acceptance of every draft (--spec-synth-len k+1, speculative: the MTP arm's own) lets
    the f=0.3 head's wrong tokens through: the replies differ from vanilla, so the verdict fails
    (no threshold set at all), the CLI exits 1, and both counts of identity agree."""
    r = run_cli("verify", knob_models[0.3], "--mtp-server-arg", f"--spec-synth-len {K + 1}", "--seeds", "42,7",
                "--limit", 3, "--max-tokens", 32, "--threads", 2, "--json")
    assert r.exit_code == 1, r.output
    d = json.loads(r.output.split("\nFAIL ")[0])
    assert d["verdict"] == "fail" and any(x.startswith("identical output") and "first: prompt" in x
                                          for x in d["reasons"]), d["reasons"]
    assert "--spec-synth-len" in d["mtp"]["server_args"] and "--spec-synth-len" not in d["vanilla"]["server_args"]
    assert not any("not speculative" in n for n in d["notes"])  # a speculative flag: the arms stay fair
    pairs = d["identical_outputs"]["pairs"]
    assert pairs == 3 * 2 and d["mismatch_count"] > 0
    assert d["identical_output_fraction"] == pytest.approx(1 - d["mismatch_count"] / pairs)
    assert d["identical_outputs"]["identical"] == pairs - d["mismatch_count"]
    # seeds do not change greedy text: a prompt's replies differ under every seed or under none
    ip = d["identical_prompts"]
    assert ip["prompts"] == 3 and d["identical_prompts_fraction"] == ip["identical"] / 3 < 1
    assert d["mismatch_count"] == 2 * (3 - ip["identical"])
    assert "speedup_vs_default_vanilla" not in d  # no non-speculative setting: no default arm
    assert not _llama_children()


def test_fair_baseline_gives_every_non_speculative_setting_to_both_arms(llama_server_bin, knob_models, tmp_path):
    """--server-arg reaches both arms; a tuned configuration's -bs reaches the vanilla arm too; a
    default vanilla arm (neither) then gives speedup_vs_default_vanilla beside the fair speedup."""
    from ggufmtp.measure.tune.run import TuneConfig

    cfg = TuneConfig(draft_n_max=3, backend_sampling=True)
    t = tmp_path / "t.json"
    t.write_text(json.dumps({"kind": "ggufmtp tune", "recommended_config": cfg.to_dict()}))
    r = run_cli("verify", knob_models[0.0], "--tuned-from", t, "--server-arg", "-ub 256", "--seeds", "42",
                "--limit", 2, "--max-tokens", 24, "--threads", 2, "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    van, mtp, default = d["vanilla"]["server_args"], d["mtp"]["server_args"], d["default_vanilla"]["server_args"]
    for arm in (van, mtp):
        assert "-bs" in arm and arm[arm.index("-ub") + 1] == "256"
    assert "-bs" not in default and "-ub" not in default and "--spec-type" not in van + default
    assert d["settings"]["server_args"] == {"both": ["-ub", "256"], "mtp": [], "vanilla": []}
    assert d["speedup"] == pytest.approx(d["mtp"]["tokens_per_second"] / d["vanilla"]["tokens_per_second"])
    assert d["speedup_vs_default_vanilla"] == pytest.approx(
        d["mtp"]["tokens_per_second"] / d["default_vanilla"]["tokens_per_second"])
    assert any("llama-server's defaults" in n for n in d["notes"]) and "default" in d["default_vanilla"]["label"]
    assert list(d).index("speedup") < list(d).index("speedup_vs_default_vanilla")  # the fair figure first
    # a speculative flag for the vanilla arm, or a non-speculative one for the MTP arm only
    bad = run_cli("verify", knob_models[0.0], "--server-arg", "--spec-draft-p-min 0.5", "--limit", 1)
    assert bad.exit_code == 1 and "would make the vanilla arm speculate too" in bad.output
    from ggufmtp.measure.core.options import ArmArgs

    assert any("not speculative" in n for n in ArmArgs.of(mtp=["-bs"]).notes())
    assert not ArmArgs.of(mtp=["--spec-draft-p-min", "0.5"]).notes() and not ArmArgs().differs_from_default
    assert not _llama_children()


def test_no_default_arm_without_non_speculative_settings(knob_results):
    for r in knob_results.values():
        d = r.to_dict()
        assert "speedup_vs_default_vanilla" not in d and "default_vanilla" not in d
        assert "speedup_vs_default_vanilla" not in d["modes"][d["mode"]]
        assert not any(x.arm == "vanilla-default" for x in r.records)
        assert d["vanilla"]["server_args"] == d["server"]["flags"]["vanilla"]
        # acceptance as the field reports it: 1 + accepted / steps, accepted at i / steps
        m = d["mtp"]
        assert m["mean_acceptance_length"] == pytest.approx(1 + m["draft_n_accepted"] / m["n_drafts"])
        assert m["acceptance_by_position"] == m["per_position"] and m["tokens_per_step"] == m["mean_acceptance_length"]
        assert m["mean_acceptance_length"] == pytest.approx(1 + sum(m["acceptance_by_position"]))
        assert "mean acceptance length" in r.table() and "acceptance by position" in r.table()


def test_bootstrap_units_are_the_prompts_and_the_ci_is_recomputable(knob_results):
    """The unit count is the number of prompts (seeds pooled), and the CIs equal a percentile
    bootstrap computed here, independently, from the recorded requests."""
    res = knob_results[0.3]  # 6 prompts x 2 seeds
    c = res.main
    assert c.n_prompts == FAST["limit"] and c.n_pairs == 2 * FAST["limit"]
    assert all(r.n_prompts == FAST["limit"] for r in c.per_seed.values())
    assert res.settings.bootstrap.unit.startswith("prompt")
    units: dict[str, np.ndarray] = {}
    for r in res.records:
        row = np.zeros(6)
        if r.arm == "mtp":
            row[:4] = [r.draft_n_accepted or 0, r.draft_n or 0, r.predicted_n, r.predicted_ms]
        else:
            row[4:] = [r.predicted_n, r.predicted_ms]
        units[r.prompt_id] = units.get(r.prompt_id, 0) + row
    x = np.array(list(units.values()))
    assert x.shape[0] == FAST["limit"]
    idx = np.random.Generator(np.random.PCG64(stats.DEFAULT_SEED)).integers(0, len(x), (stats.DEFAULT_RESAMPLES, len(x)))
    s = x[idx].sum(axis=1)
    acc = np.quantile(s[:, 0] / s[:, 1], [0.025, 0.975])
    sp = np.quantile((s[:, 2] / s[:, 3]) / (s[:, 4] / s[:, 5]), [0.025, 0.975])
    assert c.acceptance_ci95 == pytest.approx(list(acc)) and c.speedup_ci95 == pytest.approx(list(sp))


def test_ci_of_a_large_constructed_set_matches_the_normal_approximation():
    """n = 4000 prompts: the percentile bootstrap of a ratio of sums agrees with the delta-method
    normal interval R +- 1.96 SE, SE^2 = sum((a - R d)^2) / (sum d)^2."""
    rng = np.random.default_rng(7)
    d = rng.integers(20, 200, 4000).astype(float)
    a = rng.binomial(d.astype(int), rng.beta(6, 4, 4000)).astype(float)
    e = stats.ratio_of_sums(a, d)
    R = a.sum() / d.sum()
    se = np.sqrt(((a - R * d) ** 2).sum()) / d.sum()
    assert e.value == pytest.approx(R)
    assert e.lo == pytest.approx(R - 1.96 * se, abs=0.1 * 1.96 * se)
    assert e.hi == pytest.approx(R + 1.96 * se, abs=0.1 * 1.96 * se)


def test_tune_cis_cluster_by_prompt():
    """At concurrency > 1 a unit is a batch of prompts and the batches wrap around the suite: units
    that share a prompt are ONE resampling unit (a prompt is not two observations)."""
    from ggufmtp.measure.tune.rank import config_row, prompt_clusters
    from ggufmtp.measure.tune.search import SearchState, UnitResult

    def unit(u, prompts, tokens):
        return UnitResult(unit=u, mtp_tokens=tokens, mtp_ms=100.0, van_tokens=50.0, van_ms=100.0, draft_n=10,
                          draft_n_accepted=u + 2, requests=4, prompt_ids=prompts)

    # batches of 2 prompts; the third wraps around the suite to p0 again
    rs = [unit(0, ("p0", "p1"), 80.0), unit(1, ("p2", "p3"), 90.0), unit(2, ("p4", "p0"), 70.0),
          unit(3, ("p5", "p6"), 75.0)]
    x = prompt_clusters(rs)
    assert x.shape[0] == 3  # {0, 2} share p0; 1 and 3 alone
    st = SearchState(TuneConfig(3), results=rs)
    row = config_row(st, resamples=500)
    assert row.ci_units == 3 and row.to_dict()["ci_units"] == 3
    want = stats.throughput_ratio(x[:, 0], x[:, 1], x[:, 2], x[:, 3], resamples=500)
    assert row.speedup_ci95 == pytest.approx([want.lo, want.hi])
    # concurrency 1 (one prompt per unit, no repeats): every unit its own cluster
    assert prompt_clusters([unit(i, (f"p{i}",), 80.0) for i in range(4)]).shape[0] == 4


def test_a_mismatch_in_any_comparison_fails_and_is_never_recommended():
    ok = _m()
    bad = dataclasses.replace(_cmp(2, endpoint="raw", speedup=2.0, speedup_ci95=[1.9, 2.1], acceptance=0.9,
                                   identical_output_fraction=5 / 6, mismatch_count=1),
                              identical=5, n_pairs=6)
    v, reasons, _ = evaluate_verdict({"default": ok}, Thresholds(), offloaded=False, others=[ok, bad])
    assert v == "fail" and len(reasons) == 1 and reasons[0].startswith("identical output [k=2, raw /completion]: 5/6")
    # the sweep: the fastest window has one mismatch -> the next one is recommended, never it
    rows = [dataclasses.replace(bad, endpoint="chat"), _cmp(4, speedup=1.5, speedup_ci95=[1.4, 1.6], acceptance=0.7,
                                                             identical_output_fraction=1.0)]
    t = recommend(rows, min_identical=0.5)
    assert t.recommended_k == 4 and t.best_k == 4
    t = recommend(rows[:1])
    assert t.recommended_k is None and not t.mtp_beats_vanilla and "none is recommended" in t.notes[0]


def test_tuned_configuration_splits_into_shared_and_speculative_flags():
    from ggufmtp.measure.core.options import ArmArgs, TuneConfig, is_speculative

    cfg = TuneConfig(4, backend_sampling=True, draft_backend_sampling=False, cuda_graph_opt=True, threads=3)
    assert cfg.shared_args() == ["-bs"] and cfg.speculative_args() == ["--no-spec-draft-backend-sampling"]
    arms = ArmArgs.of(["-fa", "on"], ["--spec-draft-p-min", "0.5"], [], cfg)
    base = {"model": "m.gguf", "threads": 8, "extra_args": ["--chat-template-file", "x"]}
    van, mtp, default = arms.vanilla_fields(base), arms.mtp_fields(base, 4), arms.default_fields(base)
    assert van["extra_args"] == ["--chat-template-file", "x", "-fa", "on", "-bs"] and van["threads"] == 3
    assert van["env"] == {"GGML_CUDA_GRAPH_OPT": "1"} and "draft_mtp" not in van
    assert mtp["extra_args"] == ["--chat-template-file", "x", "-fa", "on", "-bs", "--no-spec-draft-backend-sampling",
                                 "--spec-draft-p-min", "0.5"] and mtp["threads"] == 3 and mtp["draft_mtp"]
    assert default == base and arms.differs_from_default
    assert all(is_speculative(f) for f in ("--spec-synth-len", "-md", "--threads-draft", "--draft-p-min", "-ngld"))
    assert not any(is_speculative(f) for f in ("-bs", "--threads", "-fa", "-ctk", "--cache-type-k", "-ub"))


# ----------------------------------------------------------------------------- replies that decode nothing


def _rec(arm, prompt, n, ms, endpoint="raw"):
    from ggufmtp.measure.verify.summary import Record

    drafts = 0 if arm == "mtp" else None
    return Record(arm=arm, k=3, endpoint=endpoint, mode="default", prompt_id=prompt, category="source", seed=42,
                  order=0, predicted_n=n, predicted_ms=ms, prompt_n=20, draft_n=drafts, draft_n_accepted=drafts,
                  text="x" * n)


def test_a_reply_that_ends_at_once_decodes_nothing():
    """``verify --raw`` reported 1,000,000 tok/s and a speedup of 1.000x when every raw reply ended
    at once: llama-server gives such a reply ``predicted_n`` 1 (the token of the prompt pass) and
    ``predicted_ms`` 0.001. A request of at most one token has no decode time: it adds nothing to
    its arm's throughput, and an arm where no request decoded has none (n/a), nor a speedup."""
    from ggufmtp.measure.verify.summary import summarize

    once = [_rec("vanilla", "q1", 1, 0.001), _rec("mtp", "q1", 1, 0.001)]
    c = summarize(once)
    assert c.mtp_tokens_per_second is None and c.vanilla_tokens_per_second is None
    assert c.speedup is None and c.speedup_ci95 == [None, None]
    assert c.to_dict()["speedup"] is None and c.to_dict()["mtp_tokens_per_second"] is None
    assert [r.to_dict()["tokens_per_second"] for r in once] == [None, None]
    # among replies that decoded, a one-token reply adds no tokens without time to its arm's figure
    mixed = once + [_rec("vanilla", "q2", 33, 100.0), _rec("mtp", "q2", 33, 50.0)]
    c = summarize(mixed)
    assert c.vanilla_tokens_per_second == pytest.approx(330.0) and c.mtp_tokens_per_second == pytest.approx(660.0)
    assert c.speedup == pytest.approx(2.0)


def test_raw_replies_that_end_at_once_are_reported_as_not_decoded(llama_server_bin, knob_models, monkeypatch):
    """The same on the real server: every ``/completion`` reply cut to one token (as a raw prompt
    the model ends at once): the raw row says n/a, not a throughput; the JSON and the receipt
    section hold no figure for it; a note says nothing was decoded there."""
    from ggufmtp.measure.verify import runner as verify_run  # the request loop's module

    real_send = verify_run.send

    def send(srv, p, seed, max_tokens, mode="default", endpoint="chat"):
        return real_send(srv, p, seed, 1 if endpoint == "raw" else max_tokens, mode, endpoint)

    monkeypatch.setattr(verify_run, "send", send)
    res = verify(knob_models[0.0], VerifyOptions.from_dict({**FAST, "limit": 2, "draft_n_max": 3, "raw": True}),
                 progress=False)
    raw = res.comparison(endpoint="raw")
    assert raw is not None and {r.predicted_n for r in res.records if r.endpoint == "raw"} == {1}
    assert raw.mtp_tokens_per_second is None and raw.vanilla_tokens_per_second is None and raw.speedup is None
    assert res.main.speedup is not None  # the chat arm decoded: its figures stand
    for d in (res.to_dict(), res.to_receipt()):
        assert d["raw"]["default"]["speedup"] is None
        assert d["raw"]["default"]["mtp"]["tokens_per_second"] is None
        assert d["raw"]["default"]["vanilla"]["tokens_per_second"] is None
        assert any("raw /completion" in n and "nothing was decoded" in n for n in d["notes"])
    row = next(line for line in res.table().splitlines() if line.startswith("raw /completion"))
    assert "1000000" not in row and "1.000×" not in row and "nothing decoded" in row, row


def test_a_record_keeps_every_figure_of_its_reply():
    """verify's arms, its reference arm and tune's numerics check make their records with one
    ``Record.of``: every field of the parsed reply (timings, draft counts, text, finish reason)
    reaches the record under its own name, and the request's place beside it."""
    from ggufmtp.measure.core.suite import Prompt
    from ggufmtp.measure.verify.summary import Record
    from ggufmtp.runtime.replies import Reply

    answer = {"choices": [{"message": {"content": "four", "reasoning_content": "2+2"}, "finish_reason": "length"}],
              "timings": {"predicted_n": 17, "predicted_ms": 85.5, "prompt_n": 9, "draft_n": 12,
                          "draft_n_accepted": 7}}
    reply = Reply.parse(answer, "chat")
    prompt = Prompt(id="p1", category="math", messages=({"role": "user", "content": "2+2?"},))
    rec = Record.of(reply, arm="mtp", k=3, endpoint="chat", mode="thinking", prompt=prompt, seed=7, order=5)
    assert {f.name: getattr(rec, f.name) for f in dataclasses.fields(Reply)} == dataclasses.asdict(reply)
    assert (rec.text, rec.finish_reason, rec.draft_n_accepted) == ("<think>2+2</think>four", "length", 7)
    assert (rec.arm, rec.k, rec.endpoint, rec.mode, rec.prompt_id, rec.category, rec.seed, rec.order) == \
        ("mtp", 3, "chat", "thinking", "p1", "math", 7, 5)
