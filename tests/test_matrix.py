"""verify's KV-cache types and context depth (``--cache-type-k/-v``, ``--context-fill``) and
``verify --matrix``: real llama-servers on the synthetic tiny model (cheap: two prompts, one seed,
16 tokens, depths 0 and 256 in a 1024-token context), plus the checks that must fail before any
server starts."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import subprocess
import time

import pytest
from click.testing import CliRunner

from ggufmtp.cli import main
from ggufmtp.errors import VerifyError
from ggufmtp.measure.core.options import ServerOptions, VerifyOptions
from ggufmtp.measure.verify.kvdepth import KNOWN_CACHE_TYPES, allowed_cache_types, neutral_text
from ggufmtp.measure.verify.matrix import MatrixSpec, parse_matrix, verify_matrix
from ggufmtp.measure.verify.run import verify
from ggufmtp.provenance.verdict import Verdict
from ggufmtp.runtime.server import LlamaServer, ServerConfig

CHEAP = VerifyOptions(seeds=(42,), limit=2, max_tokens=16, ctx_size=1024, server=ServerOptions(threads=2))
CHEAP_CLI = ("--seeds", "42", "--limit", "2", "--max-tokens", "16", "--threads", "2", "-c", "1024")
DEPTH = 256


def run_cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture
def spawned(monkeypatch):
    """Every command line started through subprocess while the test runs (passed through)."""
    seen: list[list[str]] = []
    real = subprocess.Popen

    class Spy(real):  # type: ignore[misc, valid-type]
        def __init__(self, args, *a, **kw):
            seen.append([str(x) for x in args])
            super().__init__(args, *a, **kw)

    monkeypatch.setattr(subprocess, "Popen", Spy)
    return seen


def _servers(seen: list[list[str]]) -> list[list[str]]:
    """The llama-server processes started as servers (``--help`` runs are not)."""
    return [c for c in seen if "llama-server" in c[0] and "--port" in c]


# ----------------------------------------------------------------------------- no server needed


def test_parse_matrix():
    assert parse_matrix("kv=f16,q8_0,q4_0 depth=0,8192") == MatrixSpec(("f16", "q8_0", "q4_0"), (0, 8192))
    assert parse_matrix("depth=0,8k;kv=Q8_0") == MatrixSpec(("q8_0",), (0, 8192))
    assert parse_matrix("kv=q4_0").depths == (0,) and parse_matrix("depth=256").kv_types == (None,)
    assert parse_matrix("kv=f16,q8_0 depth=0,256").cells == [("f16", None, 0), ("f16", None, 256),
                                                             ("q8_0", None, 0), ("q8_0", None, 256)]
    assert parse_matrix("kv=q8_0 draft-kv=f16,Q4_0").cells == [("q8_0", "f16", 0), ("q8_0", "q4_0", 0)]
    for bad, said in (("", "empty"), ("kv=f16 kv=q8_0", "given twice"), ("kv=f16,f16", "given twice"),
                      ("depth=0,8k,8192", "twice"), ("depth=-1", "whole number"), ("ctx=1", "expected kv="),
                      ("draft-kv=f16,f16", "given twice"),
                      ("kv=", "empty value"), ("kv=f16,,q8_0", "empty value"), ("f16", "expected kv=")):
        with pytest.raises(VerifyError, match=said):
            parse_matrix(bad)


def test_the_neutral_text_is_fixed():
    """The prefix is versioned (neutral-v1): the same bytes on every machine, run after run."""
    a = neutral_text(20_000)
    assert a == neutral_text(20_000) and len(a) >= 20_000 and neutral_text(40_000).startswith(a[:19_000])
    assert hashlib.sha256(neutral_text(4096).encode()).hexdigest()[:16] == "61d2b07ef5df9ba2"


@pytest.mark.runtime
def test_the_cache_types_come_from_llama_servers_help():
    assert allowed_cache_types() == KNOWN_CACHE_TYPES


@pytest.mark.parametrize("kwargs, said", [
    (dict(cache_type_k="q9_0"), r"--cache-type-k 'q9_0': not a KV-cache type .*allowed: f32, f16, bf16, q8_0"),
    (dict(cache_type_v="turbo3"), r"--cache-type-v 'turbo3': not a KV-cache type"),
    (dict(context_fill=1000), r"context depth 1000 does not fit: .*--ctx-size 1024.*raise --ctx-size to at least \d+"),
    (dict(cache_type_v="q4_0", server_args=["-fa", "off"]),
     r"quantized V cache needs flash attention.*--flash-attn off"),
    (dict(context_fill=-3), r"context_fill -3: must be a whole number"),
])
def test_bad_kv_or_depth_fails_before_any_server(tiny_mtp_model, spawned, kwargs, said):
    t0 = time.monotonic()
    with pytest.raises(VerifyError, match=said):
        verify(tiny_mtp_model, VerifyOptions.from_dict({**CHEAP.to_dict(), **kwargs}), progress=False)
    assert not _servers(spawned) and time.monotonic() - t0 < 10


def test_bad_matrix_fails_before_any_server(tiny_mtp_model, spawned):
    """Every cell is checked first: a bad KV type in the last cell, or a depth too deep for the
    context, fails before the first cell's servers start."""
    with pytest.raises(VerifyError, match="'q9_0': not a KV-cache type"):
        verify_matrix(tiny_mtp_model, ["f16", "q9_0"], [0], CHEAP, progress=False)
    with pytest.raises(VerifyError, match="context depth 4096 does not fit"):
        verify_matrix(tiny_mtp_model, ["f16"], [0, 4096], CHEAP, progress=False)
    with pytest.raises(VerifyError, match="draft-kv=q9_0: .q9_0.: not a KV-cache type"):
        verify_matrix(tiny_mtp_model, ["f16"], [0], CHEAP, draft_kv_types=["q9_0"], progress=False)
    with pytest.raises(VerifyError, match="set by the matrix's cells"):
        verify_matrix(tiny_mtp_model, ["f16"], [0], dataclasses.replace(CHEAP, cache_type_k="q8_0"), progress=False)
    r = run_cli("verify", tiny_mtp_model, "--matrix", "kv=f16,iq9 depth=0", *CHEAP_CLI)
    assert r.exit_code == 1 and "error: --cache-type-k 'iq9': not a KV-cache type" in r.output, r.output
    r = run_cli("verify", tiny_mtp_model, "--matrix", "kv=f16", "--context-fill", 64, *CHEAP_CLI)
    assert r.exit_code == 1 and "--context-fill and --matrix" in r.output, r.output
    r = run_cli("verify", tiny_mtp_model, "--matrix", "kv=f16 depth=0,1200", *CHEAP_CLI)
    assert r.exit_code == 1 and "context depth 1200 does not fit" in r.output, r.output
    assert not _servers(spawned)


# ----------------------------------------------------------------------------- real servers


@pytest.fixture(scope="module")
def matrix(tiny_mtp_model):
    return verify_matrix(tiny_mtp_model, ["f16", "q8_0"], [0, DEPTH], CHEAP, progress=False)


def test_one_cell_per_combination_with_the_cache_types_in_both_arms(matrix):
    assert [(c.kv_type, c.depth) for c in matrix.cells] == [("f16", 0), ("f16", DEPTH), ("q8_0", 0), ("q8_0", DEPTH)]
    assert len(matrix.results) == 4
    for c, res in zip(matrix.cells, matrix.results):
        for args in (c.vanilla_server_args, c.mtp_server_args):
            assert args[args.index("--cache-type-k") + 1] == c.kv_type
            assert args[args.index("--cache-type-v") + 1] == c.kv_type
            # a quantized V cache needs flash attention: on in both arms, said so in the arguments
            assert ("--flash-attn" in args) == (c.kv_type == "q8_0")
        assert "--spec-type" in c.mtp_server_args and "--spec-type" not in c.vanilla_server_args
        assert res.settings.cache_type_k == res.settings.cache_type_v == c.kv_type
        assert res.settings.to_dict()["cache_type_k"] == c.kv_type


def test_the_context_fill_puts_every_request_at_the_depth(matrix):
    """prompt_n (the server's own count) grows by the depth, for every request of both arms."""
    for kv in ("f16", "q8_0"):
        shallow, deep = matrix.results[[c.kv_type for c in matrix.cells].index(kv):][:2]
        base = {(r.prompt_id, r.arm): r.prompt_n for r in shallow.records}
        assert len(deep.records) == len(base) == 4
        for r in deep.records:
            assert abs(r.prompt_n - base[(r.prompt_id, r.arm)] - DEPTH) <= 2, (r.prompt_id, r.arm, r.prompt_n)
        fill = deep.settings.context_fill
        assert fill is not None and fill.depth == DEPTH and abs(fill.tokens - DEPTH) <= 2
        assert shallow.settings.context_fill is None
        d = deep.settings.to_dict()["context_fill"]
        assert d["depth"] == DEPTH and d["text"] == "neutral-v1" and d["cache_prompt"] is False
        assert "context fill 256 tokens" in deep.table()


def test_acceptance_and_identical_output_hold_in_every_cell(matrix):
    for c in matrix.cells:
        assert c.verdict == Verdict.PASS, (c.label, c.reasons)
        assert c.acceptance == 1.0 and c.identical_output_fraction == 1.0 and c.mismatch_count == 0
        assert c.mean_acceptance_length == pytest.approx(5.0)  # k=4, every draft accepted
        assert c.speedup is not None and c.speedup_ci95[0] <= c.speedup <= c.speedup_ci95[1]
    assert matrix.ok
    text = matrix.table()
    assert text.count("  PASS") == 4 and "matrix verdict: PASS (4/4 cells pass)" in text
    d = json.loads(json.dumps(matrix.to_dict()))
    assert d["kind"] == "ggufmtp verify --matrix" and d["kv_types"] == ["f16", "q8_0"] and d["depths"] == [0, DEPTH]
    assert [(c["kv_type"], c["depth"]) for c in d["cells"]] == [(c.kv_type, c.depth) for c in matrix.cells]
    assert "speedup_vs_default_vanilla" not in d["cells"][0]  # no default vanilla arm ran: absent, not null


def test_matrix_receipt_survives_a_later_verify_and_reaches_the_card(llama_server_bin, tiny_mtp_model, tmp_path):
    from ggufmtp.provenance.card import card_text
    from ggufmtp.provenance.receipt import load_receipt, receipt_for_quantize, schema_errors
    from ggufmtp.quant.quantize import quantize

    q = quantize(tiny_mtp_model, "q8_0-mtp", tmp_path / "tiny-q8.gguf", progress=False)
    rpath = receipt_for_quantize(q)
    r = run_cli("verify", q.output, "--matrix", "kv=q8_0", *CHEAP_CLI, "--receipt", rpath)
    assert r.exit_code == 1 and "no verification section yet" in r.output, r.output  # before any server
    r = run_cli("verify", q.output, *CHEAP_CLI, "--receipt", rpath, "--json")
    assert r.exit_code == 0, r.output
    out = tmp_path / "matrix.json"
    r = run_cli("verify", q.output, "--matrix", f"kv=q8_0 depth={DEPTH}", *CHEAP_CLI, "--receipt", rpath,
                "--out", out, "--json")
    assert r.exit_code == 0, r.output
    shown = json.loads(r.output)
    assert [c["kv_type"] for c in shown["cells"]] == ["q8_0"] and shown["cells"][0]["context_tokens"] == DEPTH
    assert len(json.loads(out.read_text())["verifications"][0]["requests"]) == 4
    section = load_receipt(rpath)["predicate"]["verification"]["matrix"]
    assert section["cells"] == shown["cells"] and section["model"]["sha256"] == shown["model"]["sha256"]
    r = run_cli("verify", q.output, *CHEAP_CLI, "--receipt", rpath, "--json")  # a later verify keeps it
    assert r.exit_code == 0, r.output
    st = load_receipt(rpath)
    assert st["predicate"]["verification"]["matrix"] == section and schema_errors(st) == []
    _, body = card_text(st)
    assert "## KV cache and context depth" in body and f"| q8_0 | {DEPTH} | 100.0%" in body


def test_cli_single_run_with_cache_types_and_depth(llama_server_bin, tiny_mtp_model):
    r = run_cli("verify", tiny_mtp_model, *CHEAP_CLI, "-ctk", "q8_0", "--cache-type-v", "q4_0", "--context-fill", 64,
                "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    for arm in ("mtp", "vanilla"):
        args = d[arm]["server_args"]
        assert args[args.index("--cache-type-k") + 1] == "q8_0" and args[args.index("--cache-type-v") + 1] == "q4_0"
        assert args[args.index("--flash-attn") + 1] == "on"
    s = d["settings"]
    assert (s["cache_type_k"], s["cache_type_v"], s["context_fill"]["depth"]) == ("q8_0", "q4_0", 64)
    assert abs(s["context_fill"]["tokens"] - 64) <= 2 and d["verdict"] == "pass"


def test_matrix_out_keeps_the_finished_cells_of_a_stopped_run(tmp_path):
    """--out holds every finished cell after each one (``"partial": true``), so a long GPU run that is
    stopped (a machine taken back) still leaves its cells; the final write replaces it."""
    import enum
    import types

    from ggufmtp.cli.matrix_cmd import _progress

    class V(enum.Enum):
        PASS = "pass"

    out = tmp_path / "m.json"
    on_cell = _progress(3, str(out), quiet=True)
    for i in range(2):
        on_cell(types.SimpleNamespace(label=f"c{i}", acceptance=0.5, speedup=1.1, verdict=V.PASS,
                                      to_dict=lambda i=i: {"depth": i}))
        data = json.loads(out.read_text())
        assert data["partial"] is True and data["cells_total"] == 3
        assert [c["depth"] for c in data["cells"]] == list(range(i + 1))


def _draft_cache_types(log: str) -> tuple[str, str]:
    """The MTP draft context's KV-cache types, as llama-server logs them at verbosity 4 (``cache_k=..., cache_v=...``)."""
    m = re.search(r"cache_k=(\w+), cache_v=(\w+)", log)
    assert m, log[-2000:]
    return m.group(1), m.group(2)


def test_the_target_cache_type_leaves_the_drafts_at_f16(llama_server_bin, tiny_mtp_model, tmp_path):
    """Why the matrix has a draft-kv axis: at 0c1e570 --cache-type-k/-v quantize the target's cache
    only; the MTP draft context takes -ctkd/-ctvd (common_base_params_to_speculative), default f16."""
    seen = {}
    for name, extra in (("target only", []), ("draft too", ["--spec-draft-type-k", "q8_0", "--spec-draft-type-v", "q8_0"])):
        log = tmp_path / f"{name}.log"
        cfg = ServerConfig(tiny_mtp_model, draft_mtp=True, cache_type_k="q8_0", cache_type_v="q8_0", ctx_size=1024,
                           threads=1, extra_args=["--flash-attn", "on", "-lv", "4", *extra], log_path=log)
        with LlamaServer(cfg):
            pass
        seen[name] = _draft_cache_types(log.read_text())
    assert seen == {"target only": ("f16", "f16"), "draft too": ("q8_0", "q8_0")}


def test_the_draft_kv_axis_goes_to_the_mtp_arm_only(llama_server_bin, tiny_mtp_model):
    m = verify_matrix(tiny_mtp_model, ["q8_0"], [0], CHEAP, draft_kv_types=[None, "q8_0"], progress=False)
    assert [(c.kv_type, c.draft_kv_type) for c in m.cells] == [("q8_0", None), ("q8_0", "q8_0")]
    plain, drafted = m.cells
    assert "--spec-draft-type-k" not in plain.mtp_server_args
    assert drafted.mtp_server_args[drafted.mtp_server_args.index("--spec-draft-type-k") + 1] == "q8_0"
    assert drafted.mtp_server_args[drafted.mtp_server_args.index("--spec-draft-type-v") + 1] == "q8_0"
    assert all("--spec-draft-type-k" not in c.vanilla_server_args for c in m.cells)
    assert all(c.verdict == Verdict.PASS and c.identical_output_fraction == 1.0 for c in m.cells), m.table()
    assert m.cell("q8_0", 0, "q8_0") is drafted and "draft-kv=q8_0" in drafted.label
    assert m.to_receipt()["draft_kv_types"] == [None, "q8_0"] and "draft kv" in m.table()
