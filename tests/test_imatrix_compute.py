"""`ggufmtp imatrix compute`: the calibration corpus, the real llama-imatrix run, the provenance it
records (in the file and in a quantization receipt), the pre-flight for IQ types on the MTP head,
and `ggufmtp run --imatrix-corpus`."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from ggufmtp.cli import main
from ggufmtp.errors import CorpusError, ImatrixError, PlanError
from ggufmtp.files.hashing import sha256_file
from ggufmtp.imatrix import check as imc
from ggufmtp.imatrix import format as imx
from ggufmtp.imatrix.compute import KEY_PREFIX, ImatrixProvenance, compute_imatrix, llama_imatrix_command, merge_entries
from ggufmtp.imatrix.corpus import BUILTIN_CORPORA, DEFAULT_CORPUS, check_corpus_text, min_tokens_for, resolve_corpus
from ggufmtp.imatrix.mtp import mtp_imatrix_command
from ggufmtp.imatrix.settings import CollectMode, ImatrixSettings
from ggufmtp.runtime.build import find_binary

CTX = 128  # small chunks keep llama-imatrix fast on the tiny model


# ------------------------------------------------------------------------------------------------
# the corpus (no runtime)
# ------------------------------------------------------------------------------------------------


def test_builtin_corpus_is_a_mix_of_text_kinds():
    c = resolve_corpus(DEFAULT_CORPUS)
    assert c.name == "builtin:calib-v1" and c.builtin and c.path.is_file()
    text = check_corpus_text(c, min_tokens=min_tokens_for(512, chunks=64))  # bytes bound: >= 64 chunks of 512
    assert c.bytes == len(text.encode()) and len(c.sha256) == 64
    for marker in ("def ", "#include", "SELECT", "Problem.", "Solution.", "User:", "Assistant:", "lighthouse"):
        assert marker in text, marker
    assert c.to_dict() == {"path": str(c.path), "name": c.name, "sha256": c.sha256, "bytes": c.bytes}
    assert BUILTIN_CORPORA == ("calib-v1",)


def test_file_corpus_resolves_by_name_and_digest(tmp_path):
    p = tmp_path / "my-text.txt"
    p.write_text("hello world\n" * 10)
    c = resolve_corpus(p)
    assert c.name == "my-text.txt" and not c.builtin and c.bytes == 120
    p.write_text("hello world\n" * 10 + "!")
    assert resolve_corpus(str(p)).sha256 != c.sha256


@pytest.mark.parametrize("content, msg", [
    (b"", "is empty"),
    (b"   \n\t\n", "only whitespace"),
    (b"text then \x00 binary", "binary, not text (NUL byte at offset 10)"),
    (b"caf\xe9 latin-1", "not UTF-8 text (invalid byte at offset 3)"),
])
def test_bad_corpus_text_is_one_clear_error(tmp_path, content, msg):
    p = tmp_path / "bad.txt"
    p.write_bytes(content)
    with pytest.raises(CorpusError, match=re.escape(msg)) as ei:
        check_corpus_text(resolve_corpus(p))
    assert str(p) in str(ei.value)


def test_corpus_shorter_than_the_chunks_needed(tmp_path):
    p = tmp_path / "short.txt"
    p.write_text("x" * 1000)
    c = resolve_corpus(p)
    assert min_tokens_for(512) == 1024  # llama-imatrix wants two chunks
    with pytest.raises(CorpusError, match=r"too short: 1000 bytes cannot make the 1024 tokens"):
        check_corpus_text(c, min_tokens=1024)
    check_corpus_text(c, min_tokens=1000)  # the bound is exact
    with pytest.raises(CorpusError, match=r"tokenizes to 300 tokens, 1024 are needed"):
        check_corpus_text(c, min_tokens=1024, n_tokens=300)


def test_missing_or_unknown_corpus(tmp_path):
    with pytest.raises(CorpusError, match=r"nope\.txt: no such file"):
        resolve_corpus(tmp_path / "nope.txt")
    with pytest.raises(CorpusError, match=r"is a directory"):
        resolve_corpus(tmp_path)
    with pytest.raises(CorpusError, match=r"unknown built-in corpus builtin:calib-v9 \(available: builtin:calib-v1\)"):
        resolve_corpus("builtin:calib-v9")


def test_provenance_round_trips_through_gguf_metadata(tmp_path):
    shapes = {"blk.0.ffn_up.weight": (256, 512)}
    im = imc.synthetic_imatrix(shapes)
    assert ImatrixProvenance.from_imatrix(im) is None  # made otherwise: no claims
    prov = ImatrixProvenance("builtin:calib-v1", "ab" * 32, 81835, 8, 512, "0c1e570", True, 11)
    im.gguf_extra_kv = prov.to_kv()
    im.gguf_kv_order = list(imx.STANDARD_KEYS) + list(prov.to_kv())
    p = tmp_path / "i.gguf"
    imx.write_imatrix(im, p)
    back = imx.read_imatrix(p)
    assert ImatrixProvenance.from_imatrix(back) == prov
    # a value of another type, or a missing key, is no provenance rather than a wrong one
    back.gguf_extra_kv[KEY_PREFIX + "runtime_commit"] = back.gguf_extra_kv[KEY_PREFIX + "chunks"]
    assert ImatrixProvenance.from_imatrix(back) is None
    del back.gguf_extra_kv[KEY_PREFIX + "runtime_commit"]
    assert ImatrixProvenance.from_imatrix(back) is None


def test_merge_refuses_overlap():
    shapes = {"blk.0.ffn_up.weight": (256, 512), "blk.1.ffn_up.weight": (256, 512)}
    a = imc.synthetic_imatrix(shapes, exclude_prefixes=("blk.1.",))
    b = imc.synthetic_imatrix(shapes, exclude_prefixes=("blk.0.",))
    assert merge_entries(a, b).names() == ["blk.0.ffn_up.weight", "blk.1.ffn_up.weight"]
    with pytest.raises(ImatrixError, match="both hold 1 entries"):
        merge_entries(a, a)


def test_command_line_has_no_repack_and_optional_flags():
    cmd = llama_imatrix_command(Path("/b/llama-imatrix"), Path("m.gguf"), Path("c.txt"), Path("o.gguf"),
                                ImatrixSettings(chunks=3, ctx_size=256, gpu_layers=99, threads=2))
    assert cmd == ["/b/llama-imatrix", "-m", "m.gguf", "-f", "c.txt", "-o", "o.gguf", "-c", "256", "--no-repack",
                   "--chunks", "3", "-ngl", "99", "-t", "2"]
    both = mtp_imatrix_command(Path("t"), Path("m.gguf"), Path("c.txt"), Path("o.gguf"), ImatrixSettings(),
                               mode=CollectMode.BOTH, dump_hidden=Path("h.gguf"))
    assert both[-4:] == ["--no-repack", "--with-trunk", "--dump-hidden", "h.gguf"]
    assert "--trunk" in mtp_imatrix_command(Path("t"), Path("m"), Path("c"), Path("o"), ImatrixSettings(),
                                            mode=CollectMode.TRUNK)
    assert mtp_imatrix_command(Path("t"), Path("m"), Path("c"), Path("o"), ImatrixSettings())[-1] == "--no-repack"


@pytest.mark.parametrize(("fields", "message"), [({"chunks": 0}, "chunks must be at least 1, got 0"),
                                                 ({"ctx_size": 0}, "ctx_size must be at least 1, got 0"),
                                                 ({"threads": -1}, "threads must be at least 1, got -1")])
def test_settings_are_checked_when_built(fields, message, tmp_path):
    with pytest.raises(ImatrixError, match=f"^{message}$"):
        ImatrixSettings(**fields)
    model = tmp_path / "m.gguf"  # refused before the model is read
    model.write_bytes(b"GGUF")
    cli = "--" + message.replace("_", "-", 1)  # compute_imatrix names the command line's option
    with pytest.raises(ImatrixError, match=f"^{cli}$"):
        compute_imatrix(model, DEFAULT_CORPUS, tmp_path / "o.gguf", **fields)


# ------------------------------------------------------------------------------------------------
# the real llama-imatrix
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def computed(llama_runtime, tiny_mtp_model, tmp_path_factory):
    d = tmp_path_factory.mktemp("computed")
    res = compute_imatrix(tiny_mtp_model, DEFAULT_CORPUS, d / "trunk.gguf", chunks=3, ctx_size=CTX, threads=2)
    return res


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_compute_matches_llama_imatrix_and_records_provenance(computed, tiny_mtp_model, tmp_path):
    res = computed
    im = imx.read_imatrix(res.path)
    assert imx.imatrix_info(res.path).sha256 == res.sha256
    assert im.datasets == ["builtin:calib-v1"] and im.chunk_count == 3 and im.chunk_size == CTX
    corpus = resolve_corpus(DEFAULT_CORPUS)
    prov = ImatrixProvenance.from_imatrix(im)
    assert prov == res.provenance
    assert (prov.corpus_name, prov.corpus_sha256) == ("builtin:calib-v1", corpus.sha256)
    assert prov.corpus_bytes == corpus.bytes
    assert (prov.chunks, prov.ctx_size, prov.runtime_commit, prov.mtp) == (3, CTX, "0c1e570", False)
    assert res.perplexity is None or res.perplexity > 0  # informational; llama-imatrix may print none
    # the same statistics as llama-imatrix run by hand on the same corpus, chunks and context
    direct = tmp_path / "direct.gguf"
    r = subprocess.run([str(find_binary("llama-imatrix")), "-m", str(tiny_mtp_model), "-f", str(corpus.path),
                        "-o", str(direct), "-c", str(CTX), "--chunks", "3", "-t", "2", "--no-repack"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    ref = imx.read_imatrix(direct)
    assert im.names() == ref.names() and len(im.names()) == res.entries
    for name, e in ref.entries.items():
        np.testing.assert_allclose(im.entries[name].values, e.values, rtol=1e-5, err_msg=name)
        np.testing.assert_array_equal(im.entries[name].counts, e.counts)
    # no MTP statistics from llama-imatrix: the head is reported missing
    cov = imc.coverage(im, imc.read_model_tensors(tiny_mtp_model))
    assert cov.complete and cov.missing_mtp and all(n.startswith("blk.4.") for n in cov.missing_mtp)


def test_llama_quantize_accepts_the_extra_metadata(computed, tiny_mtp_model, tmp_path):
    out = tmp_path / "q.gguf"
    r = subprocess.run([str(find_binary("llama-quantize")), "--imatrix", str(computed.path), str(tiny_mtp_model),
                        str(out), "Q4_K_M", "2"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert f"loaded {computed.entries} importance matrix entries" in r.stdout + r.stderr


def test_compute_with_a_custom_file_and_the_cli(llama_runtime, tiny_mtp_model, tmp_path):
    text = resolve_corpus(DEFAULT_CORPUS).path.read_text()[:20000]
    corpus = tmp_path / "notes.txt"
    corpus.write_text(text)
    out = tmp_path / "out" / "im.gguf"
    out.parent.mkdir()
    res = CliRunner().invoke(main, ["imatrix", "compute", str(tiny_mtp_model), "--corpus", str(corpus), "-o", str(out),
                                    "--chunks", "2", "--ctx-size", str(CTX), "-t", "2", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["corpus"]["name"] == "notes.txt" and d["chunks"] == 2 and d["ctx_size"] == CTX and d["mtp"] is False
    assert d["sha256"] == imx.imatrix_info(out).sha256
    assert _leftovers(out.parent) == ["im.gguf"]  # llama-imatrix's own periodic saves went elsewhere
    info = CliRunner().invoke(main, ["imatrix", "info", str(out), "--model", str(tiny_mtp_model), "--json"])
    di = json.loads(info.output)
    assert di["computed"]["corpus"]["sha256"] == d["corpus"]["sha256"]
    mtp = di["mtp_coverage"]
    assert mtp["covered"] == 0 and mtp["tensors"] == len(di["coverage"]["missing_mtp"]) > 0


def test_corpus_too_short_in_tokens_is_llama_imatrix_refusal_in_words(llama_runtime, tiny_mtp_model, tmp_path):
    # 2 * CTX bytes pass the byte bound, but repeated words merge into far fewer tokens
    corpus = tmp_path / "short.txt"
    corpus.write_text("the " * (CTX // 2 + 8))
    out = tmp_path / "im.gguf"
    # llama-imatrix's own words, or (when llama.cpp's logger lost them at exit) the likely cause
    with pytest.raises((CorpusError, ImatrixError),
                       match=rf"short\.txt (is too short for --ctx-size {CTX}: it tokenizes to \d+ tokens, "
                             rf"llama-imatrix needs at least {2 * CTX}|may be too short)"):
        compute_imatrix(tiny_mtp_model, corpus, out, ctx_size=CTX, threads=2)
    assert _leftovers(tmp_path) == ["short.txt"]  # no output, no temporary folder


def test_bad_inputs_refused_before_running(tiny_mtp_model, tmp_path):
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"\x00\x01\x02" * 2000)
    with pytest.raises(CorpusError, match="binary"):
        compute_imatrix(tiny_mtp_model, binary, tmp_path / "o.gguf")
    with pytest.raises(ImatrixError, match="folder .* does not exist"):
        compute_imatrix(tiny_mtp_model, DEFAULT_CORPUS, tmp_path / "no" / "o.gguf")
    with pytest.raises(ImatrixError, match="--chunks must be at least 1"):
        compute_imatrix(tiny_mtp_model, DEFAULT_CORPUS, tmp_path / "o.gguf", chunks=0)
    assert _leftovers(tmp_path) == ["bin.txt"]


# ------------------------------------------------------------------------------------------------
# receipts and the pre-flight for IQ types on the MTP head
# ------------------------------------------------------------------------------------------------

HEAD_IQ2 = """name = "head-iq2_xxs"
description = "test: Q4_K_M trunk, the whole MTP block at IQ2_XXS (needs statistics for the head)"
ftype = "Q4_K_M"
imatrix = "required"

[mtp]
required = true
eh_proj = "IQ2_XXS"
attention = "IQ2_XXS"
routed_experts = "IQ2_XXS"
shared_expert = "IQ2_XXS"
rest = "IQ2_XXS"
"""


@pytest.fixture(scope="module")
def computed_mtp(llama_runtime, tiny_mtp_model, tmp_path_factory):
    d = tmp_path_factory.mktemp("computed-mtp")
    return compute_imatrix(tiny_mtp_model, DEFAULT_CORPUS, d / "with-head.gguf", chunks=3, ctx_size=CTX, threads=2,
                           mtp=True)


def test_mtp_statistics_are_merged_into_the_same_file(computed, computed_mtp, tiny_mtp_model):
    im, trunk = imx.read_imatrix(computed_mtp.path), imx.read_imatrix(computed.path)
    head = [n for n in im.names() if n.startswith("blk.4.")]
    prov = ImatrixProvenance.from_imatrix(im)
    assert prov is not None and prov.mtp and prov.mtp_entries == len(head) == computed_mtp.provenance.mtp_entries > 0
    assert "blk.4.nextn.eh_proj.weight" in head and "blk.4.ffn_up_exps.weight" in head
    assert im.names() == sorted(im.names(), key=lambda n: n.encode())  # llama-imatrix's order, one file
    for name, e in trunk.entries.items():  # the trunk's statistics are llama-imatrix's, untouched
        np.testing.assert_array_equal(im.entries[name].values, e.values)
    for name in head:
        e = im.entries[name]
        assert np.all(np.isfinite(e.values)) and np.all(e.values >= 0) and e.counts.sum() > 0, name
    cov = imc.coverage(im, imc.read_model_tensors(tiny_mtp_model))
    assert cov.complete and not cov.missing_mtp
    info = CliRunner().invoke(main, ["imatrix", "info", str(computed_mtp.path), "--model", str(tiny_mtp_model)])
    assert "MTP block: 11 of 11 quantizable tensors covered" in info.output, info.output
    assert f"MTP statistics: {len(head)} entries" in info.output


def test_mtp_in_one_pass_is_the_two_pass_result_byte_for_byte(computed, computed_mtp, tiny_mtp_model, tmp_path):
    """#34: `compute --mtp` loads the model once and runs the trunk once (the collector's
    CollectMode.BOTH). Its file is the one the two-pass way wrote (llama-imatrix's file with the head-only
    collector's entries merged in): the same entries, values and counts bit for bit (both sum the
    same float32 squares in the same order: llama-imatrix's collect loop and the native tool's are
    the same code path over the same graph), the same metadata, the same bytes."""
    from ggufmtp.imatrix.compute import _with_provenance
    from ggufmtp.imatrix.corpus import resolve_corpus
    from ggufmtp.imatrix.mtp import collect_mtp_statistics

    corpus = resolve_corpus(DEFAULT_CORPUS)
    trunk = imx.read_imatrix(computed.path)  # llama-imatrix, as computed without --mtp
    head = collect_mtp_statistics(tiny_mtp_model, corpus, ImatrixSettings(chunks=3, ctx_size=CTX, threads=2))
    two_pass = _with_provenance(merge_entries(trunk, head), corpus, computed_mtp.provenance)
    digest = imx.write_imatrix(two_pass, tmp_path / "two-pass.gguf")
    one = imx.read_imatrix(computed_mtp.path)
    assert list(one.entries) == list(two_pass.entries)
    for name, e in two_pass.entries.items():
        np.testing.assert_array_equal(one.entries[name].values, e.values, err_msg=name)
        np.testing.assert_array_equal(one.entries[name].counts, e.counts, err_msg=name)
    assert digest == computed_mtp.sha256 == sha256_file(computed_mtp.path)
    assert computed_mtp.llama_imatrix_s == 0 and computed_mtp.mtp_s > 0  # llama-imatrix did not run


def test_head_at_iq2_xxs_refused_on_trunk_only_imatrix_and_quantized_when_covered(computed, computed_mtp,
                                                                                   tiny_mtp_model, tmp_path):
    from ggufmtp.provenance.receipt import load_receipt, schema_errors, write_receipt
    from ggufmtp.quant.plan import make_plan
    from ggufmtp.quant.quantize import quantize

    recipe = tmp_path / "head-iq2.toml"
    recipe.write_text(HEAD_IQ2)
    plan = make_plan(tiny_mtp_model, recipe, computed.path)
    assert len(plan.errors) == 1
    err = plan.errors[0]
    assert "needs an imatrix" in err and "imatrix compute --mtp" in err
    assert all(n.startswith("blk.4.") for n in plan.imatrix_missing) and len(plan.imatrix_missing) == 11
    assert all(n in err for n in plan.imatrix_missing) and not err.endswith("...")  # every head tensor named
    with pytest.raises(PlanError):
        quantize(tiny_mtp_model, recipe, tmp_path / "refused.gguf", computed.path, progress=False)
    assert not (tmp_path / "refused.gguf").exists()

    res = quantize(tiny_mtp_model, recipe, tmp_path / "q.gguf", computed_mtp.path, progress=False)
    assert not res.plan.errors and not res.plan.imatrix_missing
    types = {t.name: t.to_type for t in res.plan.tensors}
    assert types["blk.4.nextn.eh_proj.weight"] == "IQ2_XXS" and types["blk.4.ffn_up_exps.weight"] == "IQ2_XXS"
    # the receipt of a quantization with a computed imatrix carries how it was computed
    st = load_receipt(write_receipt(res))
    assert not schema_errors(st)
    sec = st["predicate"]["imatrix"]
    assert sec["computed"] == computed_mtp.provenance.to_dict() and sec["computed"]["mtp"] is True
    assert sec["computed"]["corpus"]["sha256"] == resolve_corpus(DEFAULT_CORPUS).sha256


def test_receipt_of_an_imatrix_made_elsewhere_has_no_computed_claims(tiny_mtp_model, tmp_path):
    from ggufmtp.provenance.receipt import imatrix_section

    p = tmp_path / "plain.gguf"
    imx.write_imatrix(imc.synthetic_imatrix(imc.read_model_tensors(tiny_mtp_model)), p)
    assert imatrix_section(p, [])["computed"] is None


def test_cli_bad_corpus_is_one_line(tiny_mtp_model, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    r = subprocess.run([sys.executable, "-m", "ggufmtp", "imatrix", "compute", str(tiny_mtp_model), "--corpus",
                        str(empty), "-o", str(tmp_path / "o.gguf")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stderr.strip() == f"error: corpus file {empty} is empty"
    assert _leftovers(tmp_path) == ["empty.txt"]


# ------------------------------------------------------------------------------------------------
# ggufmtp run --imatrix-corpus
# ------------------------------------------------------------------------------------------------


def _stages(res) -> dict[str, str]:
    return {s.stage: ("cached" if s.cached else "ran") for s in res.stages}


@pytest.mark.runtime
def test_run_imatrix_corpus_computes_with_mtp_caches_and_uses_it(tmp_path):
    import ggufmtp
    from ggufmtp.provenance.receipt import load_receipt

    recipe = tmp_path / "head-iq2.toml"
    recipe.write_text(HEAD_IQ2)  # only quantizes when the imatrix covers the MTP head
    out = tmp_path / "out"
    opts = ggufmtp.RunOptions(verify=False, imatrix_corpus="builtin:calib-v1", imatrix_chunks=2)
    kw = dict(out_dir=out, progress=False)
    first = ggufmtp.run("builtin:tiny-qwen35moe", recipe, opts, **kw)
    assert _stages(first)["imatrix"] == "ran" and _stages(first)["quantize"] == "ran"
    im_path = out / "imatrix.gguf"
    prov = ImatrixProvenance.from_imatrix(imx.read_imatrix(im_path))
    assert prov.mtp and prov.mtp_entries > 0 and prov.chunks == 2 and prov.corpus_name == "builtin:calib-v1"
    sec = load_receipt(first.receipt)["predicate"]["imatrix"]
    assert sec["file"] == "imatrix.gguf" and sec["computed"] == prov.to_dict() and sec["missing"] == []

    again = ggufmtp.run("builtin:tiny-qwen35moe", recipe, opts, **kw)  # same model, corpus, chunks: nothing recomputed
    assert set(_stages(again).values()) == {"cached"}

    # same content under another name is the same corpus; another chunk count is not
    copy = tmp_path / "copy.txt"
    copy.write_bytes(resolve_corpus(DEFAULT_CORPUS).path.read_bytes())
    renamed = ggufmtp.run("builtin:tiny-qwen35moe", recipe, dataclasses.replace(opts, imatrix_corpus=copy), **kw)
    assert _stages(renamed)["imatrix"] == "cached"
    assert _stages(ggufmtp.run("builtin:tiny-qwen35moe", recipe, dataclasses.replace(opts, imatrix_chunks=3), **kw))["imatrix"] == "ran"
    # a tampered imatrix is not reused
    raw = bytearray(im_path.read_bytes())
    raw[-8] ^= 0x01
    im_path.write_bytes(bytes(raw))
    assert _stages(ggufmtp.run("builtin:tiny-qwen35moe", recipe, dataclasses.replace(opts, imatrix_chunks=3), **kw))["imatrix"] == "ran"


def test_run_refuses_both_imatrix_options_and_a_bad_corpus_before_work(tmp_path):
    import ggufmtp
    from ggufmtp.errors import GgufmtpError

    out = tmp_path / "out"
    with pytest.raises(GgufmtpError, match="not both"):
        ggufmtp.run("builtin:tiny-qwen35moe", "q8_0-mtp", ggufmtp.RunOptions(
            imatrix=tmp_path / "x.gguf", imatrix_corpus="builtin:calib-v1", verify=False), out_dir=out, progress=False)
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(CorpusError, match="is empty"):
        ggufmtp.run("builtin:tiny-qwen35moe", "q8_0-mtp", ggufmtp.RunOptions(imatrix_corpus=empty, verify=False),
                    out_dir=out, progress=False)
    assert not out.exists()
