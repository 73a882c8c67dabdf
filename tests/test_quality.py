"""``ggufmtp eval`` (real llama-perplexity on synthetic models) and the head-precision sweep."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from ggufmtp.errors import CorpusError, HeadSweepError, LogitsFileError, ModelMismatchError, QualityError
from ggufmtp.quality import logits as logits_mod
from ggufmtp.quality.eval import evaluate
from ggufmtp.quality.options import EvalOptions
from ggufmtp.quant.quantize import quantize
from ggufmtp.synth.spec import SynthSpec

CTX = 128  # small chunks keep each llama-perplexity run to a few seconds on 2 cores


def _corpus(path: Path, words: int) -> Path:
    rng = random.Random(7)
    vocab = "the sea is blue and the sky was wide over a quiet town where people walk slowly , talking .".split()
    path.write_text(" ".join(rng.choice(vocab) for _ in range(words)) + "\n")
    return path


@pytest.fixture()
def kld_cache(tmp_path, monkeypatch) -> Path:
    """A fresh base-logits cache per test, so cache hits and misses are the test's own."""
    folder = tmp_path / "kld"
    monkeypatch.setattr(logits_mod, "cache_dir", lambda: folder)
    return folder


@pytest.fixture(scope="module")
def q4_model(tmp_path_factory, synth_model) -> tuple[Path, Path]:
    base = synth_model("tiny-qwen35moe-soft")  # soft distributions: quantization moves them measurably
    out = tmp_path_factory.mktemp("q4") / "tiny-Q4_K_M.gguf"
    quantize(base, "q4_k_m-mtp-q8", out, progress=False)
    return base, out


@pytest.mark.runtime
def test_quant_has_kld_above_zero_and_base_vs_itself_zero_within_error(q4_model, kld_cache, tmp_path):
    base, q4 = q4_model
    corpus = _corpus(tmp_path / "c.txt", 3000)
    same = evaluate(base, base, EvalOptions(corpus, ctx_size=CTX, chunks=4), progress=False)
    assert same.stats.kld_mean is not None and abs(same.stats.kld_mean) <= max(3 * (same.stats.kld_mean_err or 0), 1e-6)
    assert same.stats.same_top_p == pytest.approx(1.0)
    q = evaluate(base, q4, EvalOptions(corpus, ctx_size=CTX, chunks=4), progress=False)
    assert q.base_logits.cached  # same base, corpus, ctx and chunks: the base pass is not rerun
    assert q.stats.kld_mean > 0 and q.stats.kld_mean > 3 * (q.stats.kld_mean_err or 0)
    d = q.to_dict()
    for k in ("ppl", "ppl_base", "kld_mean", "kld_mean_err", "kld_p99_9", "kld_median", "same_top_p",
              "same_top_p_err", "rms_dp", "corpus", "chunks", "commit"):
        assert k in d
    assert d["chunks"] == 4 and d["commit"] and 0 <= d["same_top_p"] <= 1
    json.dumps(d)


@pytest.mark.runtime
def test_cache_hit_skips_the_base_pass_and_a_truncated_cache_file_is_refused(tiny_mtp_model, kld_cache, tmp_path):
    corpus = _corpus(tmp_path / "c.txt", 2000)
    first = evaluate(tiny_mtp_model, tiny_mtp_model, EvalOptions(corpus, ctx_size=CTX, chunks=3), progress=False)
    assert not first.base_logits.cached and first.base_logits.seconds > 0
    path = first.base_logits.path
    assert path.stat().st_size == logits_mod.logits_file_bytes(CTX, first.base_logits.header.n_vocab, 3)
    mtime = path.stat().st_mtime_ns
    second = evaluate(tiny_mtp_model, tiny_mtp_model, EvalOptions(corpus, ctx_size=CTX, chunks=3), progress=False)
    assert second.base_logits.cached and path.stat().st_mtime_ns == mtime
    with open(path, "r+b") as fh:
        fh.truncate(path.stat().st_size - 1000)
    with pytest.raises(LogitsFileError, match="truncated base-logits file"):
        evaluate(tiny_mtp_model, tiny_mtp_model, EvalOptions(corpus, ctx_size=CTX, chunks=3), progress=False)


@pytest.mark.runtime
def test_a_short_corpus_is_one_error_before_any_run(tiny_mtp_model, kld_cache, tmp_path):
    corpus = _corpus(tmp_path / "short.txt", 40)
    with pytest.raises(CorpusError, match="too short"):
        evaluate(tiny_mtp_model, tiny_mtp_model, EvalOptions(corpus, ctx_size=CTX), progress=False)
    assert not kld_cache.exists() or not list(kld_cache.glob("*"))


@pytest.mark.runtime
def test_models_of_different_vocabularies_or_architectures_are_refused(synth_model, kld_cache, tmp_path):
    corpus = _corpus(tmp_path / "c.txt", 2000)
    moe, dense = synth_model("tiny-qwen35moe"), synth_model("tiny-qwen35")
    with pytest.raises(ModelMismatchError, match="architecture qwen35moe vs qwen35"):
        evaluate(moe, dense, EvalOptions(corpus, ctx_size=CTX), progress=False)


def test_logits_size_and_header_checks(tmp_path):
    n_ctx, n_vocab, n_chunk = 64, 739, 2
    p = tmp_path / "x.logits"
    size = logits_mod.logits_file_bytes(n_ctx, n_vocab, n_chunk)
    p.write_bytes(logits_mod.HEADER.pack(logits_mod.MAGIC, n_ctx, n_vocab, n_chunk)
                  + bytes(size - logits_mod.HEADER.size))
    assert logits_mod.check_logits_file(p, n_vocab).n_chunk == n_chunk
    with pytest.raises(LogitsFileError, match="vocabulary of 739"):
        logits_mod.check_logits_file(p, 740)
    p.write_bytes(p.read_bytes()[:-2])
    with pytest.raises(LogitsFileError, match="truncated"):
        logits_mod.check_logits_file(p)
    p.write_bytes(b"not logits at all, no")
    with pytest.raises(LogitsFileError, match="not a llama-perplexity"):
        logits_mod.check_logits_file(p)


@pytest.fixture(scope="module")
def head_variants(tmp_path_factory, synth_model) -> dict[str, Path]:
    from ggufmtp.quality.head_sweep import head_recipe
    from ggufmtp.quant.recipe import Recipe

    base = synth_model("tiny-qwen35moe-margin")
    folder = tmp_path_factory.mktemp("heads")
    out = {}
    for t in ("Q8_0", "Q4_K"):
        out[t] = folder / f"head-{t}.gguf"
        quantize(base, head_recipe(Recipe.load("q4_k_m-mtp-q8"), t), out[t], progress=False)
    return out


@pytest.mark.runtime
def test_head_variants_share_the_trunk_and_a_changed_trunk_is_caught(head_variants, tmp_path):
    from ggufmtp.gguf.model import GGUFModel
    from ggufmtp.quality.head_sweep import head_bytes, refuse_different_trunks, trunk_digests

    q8, q4 = head_variants["Q8_0"], head_variants["Q4_K"]
    d8, d4 = trunk_digests(q8), trunk_digests(q4)
    refuse_different_trunks(q8, d8, q4, d4)  # only the head differs
    assert head_bytes(q4) < head_bytes(q8)
    types = {n: t.type for n, t in GGUFModel(q4).tensors.items()}
    assert types["blk.4.nextn.embed_tokens.weight"] == "Q4_K" and types["blk.4.nextn.eh_proj.weight"] == "Q4_K"
    tampered = tmp_path / "tampered.gguf"
    tampered.write_bytes(q4.read_bytes())
    m = GGUFModel(tampered)
    off = m.tensor_data_offsets["blk.0.attn_norm.weight"] if "blk.0.attn_norm.weight" in m.tensors else \
        m.tensor_data_offsets["output.weight"]
    with open(tampered, "r+b") as fh:
        fh.seek(off)
        b = fh.read(1)
        fh.seek(off)
        fh.write(bytes([b[0] ^ 0xFF]))
    with pytest.raises(HeadSweepError, match="trunk differs"):
        refuse_different_trunks(q8, d8, tampered, trunk_digests(tampered))


def test_recommendation_is_the_smallest_head_whose_ci_overlaps_bf16():
    from ggufmtp.quality.head_sweep import HeadVariant, recommend

    def v(t, size, ci):
        return HeadVariant(t, Path(t), size, size, sum(ci) / 2, list(ci), 1.0, [1.0, 1.0], 2.0, "pass")

    rows = [v("BF16", 100, (0.90, 0.95)), v("Q8_0", 50, (0.89, 0.94)), v("Q6_K", 40, (0.86, 0.91)),
            v("Q4_K", 25, (0.60, 0.70))]
    assert recommend(rows) == "Q6_K"
    assert recommend(rows[1:]) is None  # no BF16 reference, no recommendation


def test_head_margin_knob_keeps_bf16_drafts_and_leaves_default_digests_alone():
    import numpy as np

    from ggufmtp.synth.tensors import TensorBuilder

    assert SynthSpec().digest() == SynthSpec(head_margin=0.0).digest()
    b = TensorBuilder(SynthSpec(head_margin=0.08))
    rows, out, ch = b.draft_embeddings(), b.output_rows(), b.chain
    r = rows[ch.text_ids]
    logits = (out @ (r / np.sqrt((r ** 2).mean(1, keepdims=True))).T).T
    top2 = np.sort(logits, 1)[:, -2:]
    assert (logits.argmax(1) == ch.draft_successor[ch.text_ids]).all()
    assert np.allclose(top2[:, 1] - top2[:, 0], 0.08, atol=0.01)


@pytest.mark.runtime
def test_head_sweep_on_a_reacting_head_shows_acceptance_falling_with_precision(synth_model, tmp_path):
    """The head_margin model (drafts win by 0.08 logits): BF16 and Q8_0 heads agree, Q4_K loses
    many drafts; the trunk is byte-identical across the variants; the recipe written is Q8_0's or
    BF16's. Measured here on 2 CPU cores (8 prompts, seed 42): 89.8 / 88.6 / 77.1 / 37.6 % for
    BF16 / Q8_0 / Q6_K / Q4_K."""
    from ggufmtp.measure.core.options import VerifyOptions
    from ggufmtp.quality.head_sweep import head_sweep, write_recommended_recipe
    from ggufmtp.quant.recipe import Recipe

    res = head_sweep(synth_model("tiny-qwen35moe-margin"), "q4_k_m-mtp-q8", ["Q8_0", "Q4_K"], tmp_path / "s",
                     verify_options=VerifyOptions(limit=6, seeds=(42,), max_tokens=96), progress=False)
    acc = {v.head_type: v.acceptance for v in res.variants}
    assert list(acc) == ["BF16", "Q8_0", "Q4_K"]
    assert abs(acc["BF16"] - acc["Q8_0"]) < 0.05 and acc["Q4_K"] < acc["Q8_0"] - 0.2
    assert res.recommended in ("Q8_0", "BF16") and res.to_dict()["trunk_identical"]
    # each verdict is the recipe's (min_acceptance 0.60): the Q4_K head fails it, the BF16 head passes
    verdicts = {v.head_type: v.verdict for v in res.variants}
    assert verdicts["Q4_K"] == "fail" and verdicts["BF16"] == "pass", verdicts
    written = write_recommended_recipe(res, tmp_path / "rec.toml")
    assert dict(Recipe.load(written).mtp_roles)["eh_proj"] == res.recommended


@pytest.mark.runtime
def test_token_count_is_remembered_per_base_corpus_and_commit(tiny_mtp_model, kld_cache, tmp_path, monkeypatch):
    """The corpus's token count (a libllama load: a GPU initialization with a CUDA build) is counted
    once per base, corpus and commit; another corpus is counted again."""
    from ggufmtp.quality import eval as eval_mod

    corpus = _corpus(tmp_path / "c.txt", 2000)
    first = evaluate(tiny_mtp_model, tiny_mtp_model, EvalOptions(corpus, ctx_size=CTX, chunks=3), progress=False)
    memo = json.loads((kld_cache / "tokens.json").read_text())["entries"]
    assert list(memo.values()) == [first.n_tokens] and first.n_tokens > 3 * CTX
    counted: list[str] = []
    real = eval_mod.count_tokens
    monkeypatch.setattr(eval_mod, "count_tokens", lambda m, t: counted.append(t) or real(m, t))
    again = evaluate(tiny_mtp_model, tiny_mtp_model, EvalOptions(corpus, ctx_size=CTX, chunks=3), progress=False)
    assert again.n_tokens == first.n_tokens and counted == []
    other = _corpus(tmp_path / "d.txt", 2500)
    third = evaluate(tiny_mtp_model, tiny_mtp_model, EvalOptions(other, ctx_size=CTX, chunks=3), progress=False)
    assert len(counted) == 1 and third.n_tokens > first.n_tokens


@pytest.mark.runtime
def test_lost_final_lines_are_read_from_the_last_table_row_only_when_the_table_is_whole(q4_model, kld_cache, tmp_path):
    """llama.cpp's logger can lose a process's last lines at exit (upstream 22142): RMS Δp and Same
    top p, printed last, equal the per-chunk table's last row, so a log cut after the KLD
    percentiles still gives the same statistics; one cut before them is still an error."""
    from ggufmtp.quality.perplexity import parse_kld_output

    base, q4 = q4_model
    q = evaluate(base, q4, EvalOptions(_corpus(tmp_path / "c.txt", 3000), ctx_size=CTX, chunks=4), progress=False)
    # distinct values (RMS Δp, Same top p, mean KLD): a row read from the wrong column would differ
    assert len({q.stats.rms_dp, q.stats.same_top_p, q.stats.kld_mean}) == 3 and q.stats.rms_dp > 0
    log = q.base_logits.path.with_name(f"{q.base_logits.path.stem}.{q4.name}.kld.log").read_text()
    assert parse_kld_output(log, "q") == q.stats
    assert parse_kld_output(log[:log.index(" 1.0%   Δp")], "q") == q.stats
    with pytest.raises(QualityError, match="no 'KLD' statistic"):
        parse_kld_output(log[:log.index("Median  KLD")], "q")


def test_eval_options_are_checked_when_built():
    """:class:`EvalOptions` refuses a setting llama-perplexity cannot run with, naming it, before
    anything is read; its defaults are ``ggufmtp eval``'s, and ``to_dict`` is every setting."""
    with pytest.raises(QualityError, match="ctx_size 8: must be an integer of at least 16"):
        EvalOptions(ctx_size=8)
    for name in ("chunks", "threads"):
        with pytest.raises(QualityError, match=f"{name} 0: must be an integer of at least 1"):
            EvalOptions(**{name: 0})
    assert EvalOptions(chunks=2).to_dict() == {"corpus": "builtin:calib-v1", "ctx_size": 512, "chunks": 2,
                                               "gpu_layers": None, "threads": None, "llama_cpp_bin": None}
    assert EvalOptions(Path("c.txt")).to_dict()["corpus"] == "c.txt"
