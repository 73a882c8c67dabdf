"""ggufmtp.synth: determinism, layout, tokenizer, knobs, atomic writes, CLI, real-shape table.

Behaviour against the real llama-server (acceptance, prompt dependence) is in test_server.py.
"""

from __future__ import annotations

import json
import math
import os

import gguf
import numpy as np
import pytest
from click.testing import CliRunner

from ggufmtp.cli import main
from ggufmtp.errors import SynthError
from ggufmtp.files.hashing import sha256_file
from ggufmtp.gguf.reader import read_header, tensor_nbytes
from ggufmtp.synth.builtin import BUILTIN_MODELS, builtin_path
from ggufmtp.synth.calibrate import calibrate_wrong_fraction
from ggufmtp.synth.chain import chain_for, predict_tokens, simulate_acceptance, suite_acceptance
from ggufmtp.synth.layout import PUBLISHED, SHAPE_DENSE_27B, SHAPE_REAL
from ggufmtp.synth.metadata import add_metadata
from ggufmtp.synth.spec import SynthSpec, expected_acceptance
from ggufmtp.synth.tensors import TensorBuilder, from_bf16
from ggufmtp.synth.tokenizer import build_vocab, bytes_to_unicode
from ggufmtp.synth.writer import plan, synthesize


def _reader(path) -> gguf.GGUFReader:
    return gguf.GGUFReader(str(path))


def _field(r: gguf.GGUFReader, key: str):
    f = r.fields[key]
    return f.contents()


def _tensors(r: gguf.GGUFReader) -> dict[str, gguf.ReaderTensor]:
    return {t.name: t for t in r.tensors}


# ----------------------------------------------------------------------------- determinism


def test_same_spec_same_bytes_other_seed_other_bytes(tmp_path):
    a = synthesize(tmp_path / "a.gguf", SynthSpec(seed=1), progress=False)
    b = synthesize(tmp_path / "b.gguf", SynthSpec(seed=1), progress=False)
    c = synthesize(tmp_path / "c.gguf", SynthSpec(seed=2), progress=False)
    d = synthesize(tmp_path / "d.gguf", SynthSpec(seed=1, wrong_successor_fraction=0.5), progress=False)
    assert a.sha256 == sha256_file(a.path)  # hashed while writing == hashed after
    assert a.sha256 == b.sha256
    assert c.sha256 != a.sha256
    assert d.sha256 not in (a.sha256, c.sha256)
    assert a.size_bytes == os.path.getsize(a.path) and a.size_bytes < 20 * 2**20  # "a few MB"


# ----------------------------------------------------------------------------- layout


def test_default_layout_and_metadata(tiny_mtp_model):
    r = _reader(tiny_mtp_model)
    t = _tensors(r)
    assert _field(r, "general.architecture") == "qwen35moe"
    assert _field(r, "qwen35moe.block_count") == 5
    assert _field(r, "qwen35moe.nextn_predict_layers") == 1
    assert _field(r, "qwen35moe.full_attention_interval") == 4
    assert _field(r, "qwen35moe.embedding_length") % 256 == 0
    assert _field(r, "qwen35moe.expert_feed_forward_length") % 256 == 0
    # 3 Gated DeltaNet : 1 full attention, then the MTP block (full attention) blk.4
    for il in (0, 1, 2):
        assert f"blk.{il}.ssm_out.weight" in t and f"blk.{il}.attn_q.weight" not in t
    for il in (3, 4):
        assert f"blk.{il}.attn_q.weight" in t and f"blk.{il}.ssm_out.weight" not in t
    for name in ("nextn.eh_proj", "nextn.enorm", "nextn.hnorm", "nextn.shared_head_norm"):
        assert f"blk.4.{name}.weight" in t
    assert "blk.4.nextn.embed_tokens.weight" not in t  # f=0: falls back to token_embd
    assert list(t["blk.4.nextn.eh_proj.weight"].shape) == [512, 256]
    # types: BF16 matrices, F32 for 1-D and the tensors convert_hf_to_gguf keeps in F32
    f32 = {n for n, x in t.items() if x.tensor_type == gguf.GGMLQuantizationType.F32}
    bf16 = {n for n, x in t.items() if x.tensor_type == gguf.GGMLQuantizationType.BF16}
    assert f32 | bf16 == set(t)
    for n, x in t.items():
        if len(x.shape) == 1 or n.endswith(("ffn_gate_inp.weight", "ssm_conv1d.weight", ".ssm_a", "ssm_dt.bias")):
            assert n in f32, n
        else:
            assert n in bf16, n
    assert _field(r, "general.file_type") == gguf.LlamaFileType.MOSTLY_BF16


def test_eh_proj_passes_the_embedding_half_through(tiny_mtp_model):
    t = _tensors(_reader(tiny_mtp_model))
    raw = np.asarray(t["blk.4.nextn.eh_proj.weight"].data).view(np.uint16).reshape(256, 512)
    m = from_bf16(raw)
    assert np.array_equal(m[:, :256], np.eye(256, dtype=np.float32))
    assert not m[:, 256:].any()


def test_no_mtp(tmp_path):
    res = synthesize(tmp_path / "n.gguf", SynthSpec(mtp=False), progress=False)
    r = _reader(res.path)
    assert res.mtp_block is None and res.expected_acceptance(3) == 0.0
    assert _field(r, "qwen35moe.block_count") == 4
    assert _field(r, "qwen35moe.nextn_predict_layers") == 0
    assert not [n for n in _tensors(r) if n.startswith("blk.4.") or "nextn" in n]


def test_omit_tensors_makes_an_incomplete_mtp_block(tmp_path):
    res = synthesize(tmp_path / "o.gguf", SynthSpec(omit_tensors=("nextn.hnorm", "ffn_up_shexp")), progress=False)
    t = _tensors(_reader(res.path))
    assert "blk.4.nextn.hnorm.weight" not in t and "blk.4.ffn_up_shexp.weight" not in t
    assert "blk.4.nextn.enorm.weight" in t and "blk.3.ffn_up_shexp.weight" in t
    with pytest.raises(SynthError, match="not a tensor of the MTP block"):
        synthesize(tmp_path / "x.gguf", SynthSpec(omit_tensors=("nextn.nope",)), progress=False)


def test_mtp_only_sidecar(tmp_path):
    res = synthesize(tmp_path / "s.gguf", SynthSpec(mtp_only=True), progress=False)
    r = _reader(res.path)
    names = set(_tensors(r))
    assert _field(r, "qwen35moe.block_count") == 5 and _field(r, "qwen35moe.nextn_predict_layers") == 1
    assert {"token_embd.weight", "output_norm.weight", "output.weight"} <= names
    assert all(n.startswith("blk.4.") for n in names - {"token_embd.weight", "output_norm.weight", "output.weight"})
    assert not res.servable


def test_dense_qwen35_layout(synth_model):
    r = _reader(synth_model("tiny-qwen35"))
    t = _tensors(r)
    assert _field(r, "general.architecture") == "qwen35"
    assert _field(r, "qwen35.feed_forward_length") % 256 == 0
    assert "blk.4.ffn_up.weight" in t and "blk.4.nextn.eh_proj.weight" in t
    assert not [n for n in t if "exps" in n or "shexp" in n]


def test_knob_writes_embed_tokens_with_exactly_the_wrong_rows(synth_model):
    spec = BUILTIN_MODELS["tiny-qwen35moe-f50"]
    t = _tensors(_reader(synth_model("tiny-qwen35moe-f50")))
    emb = np.asarray(t["token_embd.weight"].data).view(np.uint16).reshape(-1, 256)
    nxt = np.asarray(t["blk.4.nextn.embed_tokens.weight"].data).view(np.uint16).reshape(-1, 256)
    differs = (emb != nxt).any(axis=1)
    ch = chain_for(spec)
    assert np.array_equal(differs, ch.corrupted)
    n_text = len(ch.text_ids)
    assert differs.sum() == round(0.5 * n_text)
    # a corrupted token's draft successor is never the true one; clean ones agree
    assert (ch.draft_successor[ch.corrupted] != ch.successor[ch.corrupted]).all()
    assert (ch.draft_successor[~ch.corrupted] == ch.successor[~ch.corrupted]).all()


# ----------------------------------------------------------------------------- tokenizer & chain


def test_tokenizer_is_consistent_bpe(tiny_mtp_model):
    r = _reader(tiny_mtp_model)
    tokens = _field(r, "tokenizer.ggml.tokens")
    merges = _field(r, "tokenizer.ggml.merges")
    types = _field(r, "tokenizer.ggml.token_type")
    assert _field(r, "tokenizer.ggml.model") == "gpt2" and _field(r, "tokenizer.ggml.pre") == "qwen2"
    assert len(merges) >= 256
    vocab = set(tokens)
    assert len(vocab) == len(tokens)
    b2u = bytes_to_unicode()
    assert tokens[:256] == [b2u[b] for b in range(256)]
    for m in merges:
        a, b = m.split(" ")
        assert a in vocab and b in vocab and a + b in vocab, m
    specials = {tokens[i]: i for i, ty in enumerate(types) if ty == 3}
    assert set(specials) == {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}
    assert _field(r, "tokenizer.ggml.eos_token_id") == specials["<|im_end|>"]
    assert _field(r, "tokenizer.ggml.bos_token_id") == specials["<|endoftext|>"]
    assert _field(r, "tokenizer.ggml.padding_token_id") == specials["<|endoftext|>"]
    assert _field(r, "tokenizer.ggml.add_bos_token") is False
    tmpl = _field(r, "tokenizer.chat_template")
    assert "<|im_start|>" in tmpl and "add_generation_prompt" in tmpl


def test_successor_never_yields_control_tokens_and_is_one_cycle():
    vocab = build_vocab()
    ch = chain_for(SynthSpec())
    text = set(ch.text_ids.tolist())
    assert set(ch.successor.tolist()) <= text
    for special in (vocab.bos, vocab.eos, vocab.im_start):
        assert special not in text
    # one cycle through all text tokens
    start = int(ch.text_ids[0])
    seen, t = set(), start
    for _ in range(len(text)):
        seen.add(t)
        t = int(ch.successor[t])
    assert t == start and seen == text
    s = vocab.decode(predict_tokens(SynthSpec(), vocab.eos, 200))
    assert s.isascii() and "<|" not in s


def test_expected_acceptance_formula_and_simulation():
    assert expected_acceptance(0.0, 3) == 1.0
    assert math.isclose(expected_acceptance(0.5, 3), (0.5 + 0.25 + 0.125) / 3)
    assert math.isclose(expected_acceptance(0.2, 1), 0.8)
    with pytest.raises(ValueError):
        expected_acceptance(0.1, 0)
    # the exact per-reply simulation agrees with the formula on long replies
    spec = SynthSpec(wrong_successor_fraction=0.3)
    ch = chain_for(spec)
    d = a = 0
    for start in ch.text_ids[:40]:
        dd, aa = simulate_acceptance(spec, int(start), 256, 3)
        d, a = d + dd, a + aa
    assert abs(a / d - expected_acceptance(0.3, 3)) < 0.04
    assert simulate_acceptance(SynthSpec(), 5, 64, 3) == (47, 47)



def test_calibration_picks_the_fraction_whose_realized_acceptance_is_nearest():
    """calibrate_wrong_fraction searches whole numbers of corrupted tokens around the formula's
    inverse and returns the one whose exact acceptance on the given prompts is nearest the target."""
    starts = [int(t) for t in chain_for(SynthSpec()).text_ids[::37]]
    cal = calibrate_wrong_fraction(0.7, 3, starts, 48)
    n_text = len(build_vocab().text_token_ids())
    assert math.isclose(expected_acceptance(cal.formula_fraction, 3), 0.7, abs_tol=1e-9)
    d, a = suite_acceptance(SynthSpec(wrong_successor_fraction=cal.wrong_successor_fraction), starts, 48, 3)
    assert cal.acceptance == a / d
    # brute force over the same window: nobody is nearer the target
    lo, hi = math.floor(cal.formula_fraction * 0.75 * n_text), math.ceil(cal.formula_fraction * 1.25 * n_text)
    assert cal.candidates == hi - lo + 1
    for n_bad in range(lo, hi + 1):
        dd, aa = suite_acceptance(SynthSpec(wrong_successor_fraction=n_bad / n_text), starts, 48, 3)
        assert abs(aa / dd - 0.7) >= abs(cal.acceptance - 0.7)
    for bad in (0.0, 1.0, 1.5):
        with pytest.raises(SynthError, match="target acceptance"):
            calibrate_wrong_fraction(bad, 3, starts, 48)
    with pytest.raises(SynthError, match="at least one prompt"):
        calibrate_wrong_fraction(0.7, 3, [], 48)

# ----------------------------------------------------------------------------- writing


def test_interrupted_write_leaves_nothing(tmp_path, monkeypatch):
    orig = TensorBuilder.plans

    def broken(self):
        plans = orig(self)

        def boom():
            yield np.zeros(4, dtype=np.uint16)
            raise KeyboardInterrupt

        plans[10].chunks = boom
        return plans

    monkeypatch.setattr(TensorBuilder, "plans", broken)
    with pytest.raises(KeyboardInterrupt):
        synthesize(tmp_path / "m.gguf", SynthSpec(), progress=False)
    assert list(tmp_path.iterdir()) == []


def test_builtin_path_caches(tmp_path):
    p = builtin_path("builtin:tiny-qwen35moe", cache_dir=tmp_path)
    mtime = p.stat().st_mtime_ns
    assert builtin_path("tiny-qwen35moe", cache_dir=tmp_path) == p
    assert p.stat().st_mtime_ns == mtime
    assert [x.name for x in tmp_path.iterdir()] == [p.name]
    with pytest.raises(SynthError, match="unknown built-in"):
        builtin_path("nope", cache_dir=tmp_path)


def test_invalid_specs():
    for bad in (SynthSpec(arch="llama"), SynthSpec(shape="huge"), SynthSpec(layers=0),
                SynthSpec(wrong_successor_fraction=1.5), SynthSpec(mtp=False, wrong_successor_fraction=0.1),
                SynthSpec(arch="qwen35", shape=SHAPE_REAL), SynthSpec(arch="qwen35moe", shape=SHAPE_DENSE_27B)):
        with pytest.raises(SynthError):
            bad.validate()


# ----------------------------------------------------------------------------- real shape (no GBs)


def test_real_shape_tensor_table():
    spec = SynthSpec(shape=SHAPE_REAL, layers=1)
    plans = {p.name: p for p in plan(spec)}
    V = 248320
    expect = {
        "token_embd.weight": (2048, V), "output.weight": (2048, V), "output_norm.weight": (2048,),
        # blk.0: Gated DeltaNet, 16 key heads / 32 value heads of 128, conv kernel 4
        "blk.0.attn_qkv.weight": (2048, 2 * 16 * 128 + 32 * 128), "blk.0.attn_gate.weight": (2048, 4096),
        "blk.0.ssm_conv1d.weight": (4, 8192), "blk.0.ssm_a": (32,), "blk.0.ssm_dt.bias": (32,),
        "blk.0.ssm_beta.weight": (2048, 32), "blk.0.ssm_alpha.weight": (2048, 32),
        "blk.0.ssm_norm.weight": (128,), "blk.0.ssm_out.weight": (4096, 2048),
        # 256 experts of width 512 (top-8), one shared expert of 512
        "blk.0.ffn_gate_inp.weight": (2048, 256), "blk.0.ffn_gate_exps.weight": (2048, 512, 256),
        "blk.0.ffn_up_exps.weight": (2048, 512, 256), "blk.0.ffn_down_exps.weight": (512, 2048, 256),
        "blk.0.ffn_gate_inp_shexp.weight": (2048,), "blk.0.ffn_up_shexp.weight": (2048, 512),
        "blk.0.ffn_down_shexp.weight": (512, 2048),
        # MTP block blk.1: full attention, 16 heads x 256 (q carries the gate), 2 KV heads
        "blk.1.attn_q.weight": (2048, 2 * 16 * 256), "blk.1.attn_k.weight": (2048, 512),
        "blk.1.attn_v.weight": (2048, 512), "blk.1.attn_output.weight": (4096, 2048),
        "blk.1.attn_q_norm.weight": (256,), "blk.1.nextn.eh_proj.weight": (4096, 2048),
        "blk.1.nextn.enorm.weight": (2048,), "blk.1.nextn.hnorm.weight": (2048,),
    }
    for name, ne in expect.items():
        assert plans[name].ne == ne, name
    total = sum(p.nbytes for p in plans.values())
    assert total > 5 * 10**9  # several GB even with one layer
    assert len(build_vocab(SHAPE_REAL)) == V


def _sparse_header(tmp_path, spec: SynthSpec):
    """``spec``'s real-shape file as its header (metadata and tensor infos) over a sparse data section:
    no GBs written. Read back with the one header reader (llama.cpp's header rules; gguf-py's
    GGUFReader takes seconds over 248k tokens): every string walked, the long arrays' lengths kept."""
    plans = plan(spec)
    w = gguf.GGUFWriter(path=None, arch=spec.arch)
    add_metadata(w, spec, build_vocab(spec.shape))
    for p in plans:
        w.add_tensor_info(p.name, tuple(reversed(p.ne)), np.dtype(np.float16), p.nbytes,
                          raw_dtype=gguf.GGMLQuantizationType(p.dtype))
    out = tmp_path / "hdr.gguf"
    w.write_header_to_file(path=out)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    assert w.fout is not None
    start = w.fout[0].tell()
    w.close()
    pad = lambda n: (n + 31) // 32 * 32  # noqa: E731
    os.truncate(out, pad(start) + sum(pad(p.nbytes) for p in plans))  # sparse: no disk blocks
    h = read_header(out)
    assert len(h.tensors) == len(plans)
    assert h.array_lengths["tokenizer.ggml.tokens"] == 248320
    # every tensor's data inside the file, the data section where the writer put it
    assert h.data_offset == pad(start) and h.file_size == pad(start) + sum(pad(p.nbytes) for p in plans)
    assert all(x.offset + tensor_nbytes(x.shape, x.type_id)[1] <= h.file_size for x in h.tensors)
    return h


def test_real_shape_metadata(tmp_path):
    """The real-shape header (metadata and tensor infos) over a sparse file: no GBs written."""
    h = _sparse_header(tmp_path, SynthSpec(shape=SHAPE_REAL, layers=2))
    m, a = h.metadata, "qwen35moe."
    assert m[a + "embedding_length"] == 2048
    assert m[a + "attention.head_count"] == 16 and m[a + "attention.head_count_kv"] == 2
    assert m[a + "attention.key_length"] == 256
    assert m[a + "expert_count"] == 256 and m[a + "expert_used_count"] == 8
    assert m[a + "expert_feed_forward_length"] == 512
    assert m[a + "expert_shared_feed_forward_length"] == 512
    assert m[a + "ssm.group_count"] == 16 and m[a + "ssm.time_step_rank"] == 32
    assert m[a + "ssm.inner_size"] == 4096 and m[a + "ssm.conv_kernel"] == 4
    assert m[a + "rope.dimension_count"] == 64  # 25% of the 256 head dim
    assert m[a + "block_count"] == 3 and m[a + "nextn_predict_layers"] == 1
    t = {x.name: x for x in h.tensors}
    assert list(t["blk.2.ffn_down_exps.weight"].shape) == [512, 2048, 256]
    assert list(t["blk.2.nextn.eh_proj.weight"].shape) == [4096, 2048]
    assert t["token_embd.weight"].type_id == gguf.GGMLQuantizationType.BF16


# Qwen3.6-27B's text config.json (model_type qwen3_5_text), the figures the dense shape must reproduce
Q27 = dict(hidden=5120, layers=64, interval=4, ffn=17408, heads=24, kv_heads=4, head_dim=256, k_heads=16,
           v_heads=48, k_dim=128, v_dim=128, conv=4, vocab=248320)


def _dense_27b(**kw) -> SynthSpec:
    return SynthSpec(arch="qwen35", shape=SHAPE_DENSE_27B, layers=Q27["layers"], **kw)


def test_dense_27b_tensor_table_is_the_released_models():
    """The dense shape at its released depth, listed without data: every tensor llama.cpp's qwen35
    loader creates (``load_arch_tensors``) with the ggml shape it computes from the config, full
    attention on layers 3, 7, ..., 63, the MTP block blk.64, ~27 B parameters."""
    c = Q27
    H, V, key, val = c["hidden"], c["vocab"], c["k_heads"] * c["k_dim"], c["v_heads"] * c["v_dim"]
    q, kv = c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"]
    spec = _dense_27b(wrong_successor_fraction=PUBLISHED[SHAPE_DENSE_27B].head.wrong_successor_fraction)
    plans = {p.name: p.ne for p in plan(spec)}
    common = {"attn_norm.weight": (H,), "post_attention_norm.weight": (H,), "ffn_gate.weight": (H, c["ffn"]),
              "ffn_up.weight": (H, c["ffn"]), "ffn_down.weight": (c["ffn"], H)}
    recurrent = {"attn_qkv.weight": (H, 2 * key + val), "attn_gate.weight": (H, val),
                 "ssm_conv1d.weight": (c["conv"], 2 * key + val), "ssm_dt.bias": (c["v_heads"],),
                 "ssm_a": (c["v_heads"],), "ssm_beta.weight": (H, c["v_heads"]),
                 "ssm_alpha.weight": (H, c["v_heads"]), "ssm_norm.weight": (c["v_dim"],), "ssm_out.weight": (val, H)}
    attention = {"attn_q.weight": (H, 2 * q), "attn_k.weight": (H, kv), "attn_v.weight": (H, kv),  # q carries the gate
                 "attn_output.weight": (q, H), "attn_q_norm.weight": (c["head_dim"],),
                 "attn_k_norm.weight": (c["head_dim"],)}
    nextn = {"nextn.eh_proj.weight": (2 * H, H), "nextn.enorm.weight": (H,), "nextn.hnorm.weight": (H,),
             "nextn.shared_head_norm.weight": (H,), "nextn.embed_tokens.weight": (H, V)}
    expect = {"token_embd.weight": (H, V), "output.weight": (H, V), "output_norm.weight": (H,)}
    L = c["layers"]
    for il in range(L + 1):
        full = il == L or (il + 1) % c["interval"] == 0
        block = {**common, **(attention if full else recurrent), **(nextn if il == L else {})}
        expect.update({f"blk.{il}.{k}": ne for k, ne in block.items()})
    assert plans == expect  # names and shapes, nothing more, nothing less
    assert [il for il in range(L) if f"blk.{il}.attn_q.weight" in plans] == list(range(3, L, 4))
    assert (PUBLISHED[SHAPE_DENSE_27B].arch, PUBLISHED[SHAPE_DENSE_27B].layers) == ("qwen35", L)
    # "27B" (text model and MTP block; nextn.embed_tokens is synth's knob carrier, the release shares token_embd)
    n_params = sum(math.prod(ne) for name, ne in plans.items() if "embed_tokens" not in name)
    assert 26.5e9 < n_params < 28e9


def test_dense_27b_metadata(tmp_path):
    """The dense shape's header (block_count 65: 64 trunk layers, for which the qwen35 loader names
    the model 27B, and one NextN layer) over a sparse file."""
    c = Q27
    m, a = _sparse_header(tmp_path, _dense_27b()).metadata, "qwen35."
    assert m["general.architecture"] == "qwen35"
    assert m[a + "block_count"] == 65 and m[a + "nextn_predict_layers"] == 1
    assert m[a + "embedding_length"] == c["hidden"] and m[a + "feed_forward_length"] == c["ffn"]
    assert m[a + "attention.head_count"] == c["heads"] and m[a + "attention.head_count_kv"] == c["kv_heads"]
    assert m[a + "attention.key_length"] == m[a + "attention.value_length"] == c["head_dim"]
    assert m[a + "rope.dimension_count"] == 64 and list(m[a + "rope.dimension_sections"]) == [11, 11, 10, 0]
    assert m[a + "ssm.group_count"] == c["k_heads"] and m[a + "ssm.time_step_rank"] == c["v_heads"]
    assert m[a + "ssm.state_size"] == c["k_dim"] and m[a + "ssm.inner_size"] == c["v_heads"] * c["v_dim"]
    assert m[a + "ssm.conv_kernel"] == c["conv"] and m[a + "full_attention_interval"] == c["interval"]
    assert m[a + "context_length"] == 262144 and m[a + "rope.freq_base"] == pytest.approx(1e7)
    assert not [k for k in m if "expert" in k]  # dense: no MoE keys


def test_real_shapes_draft_as_their_tiny_twins():
    """Why the designed acceptance can be shown at tiny scale: the successor chain (and so every
    reply and every draft, :func:`simulate_acceptance`) depends on the seed and the fraction, not on
    the shape -- the real shapes share the tiny tokenizer's text tokens and pad the vocabulary."""
    for shape, pub in PUBLISHED.items():
        f = pub.head.wrong_successor_fraction
        real, tiny = (chain_for(SynthSpec(arch=pub.arch, shape=s, wrong_successor_fraction=f))
                      for s in (shape, "tiny"))
        for field in ("successor", "draft_successor", "corrupted", "text_ids"):
            assert np.array_equal(getattr(real, field), getattr(tiny, field)), (shape, field)
        assert len(build_vocab(shape)) == 248320 and build_vocab(shape).n_text_vocab == build_vocab().n_text_vocab


# ----------------------------------------------------------------------------- CLI


def test_cli_synth_json(tmp_path):
    out = tmp_path / "c.gguf"
    res = CliRunner().invoke(main, ["synth", str(out), "--wrong-successor-fraction", "0.2", "--seed", "3",
                                    "--layers", "4", "--json"])
    assert res.exit_code == 0, res.output
    j = json.loads(res.output)
    assert j["path"] == str(out) and out.is_file() and j["mtp_block"] == 4
    assert j["spec"]["seed"] == 3 and j["sha256"] == sha256_file(out)
    assert math.isclose(j["expected_acceptance"]["3"], expected_acceptance(j["realized_wrong_fraction"], 3))


def test_omit_tensors_takes_bias_names_and_keeps_the_knob_carrier():
    """``exp_probs_b.bias`` (a bias-only tensor) can be omitted; ``nextn.embed_tokens`` cannot while
    a knob is set: its rows carry the wrong successors (the head would silently agree again)."""
    SynthSpec(arch="glm4moe", omit_tensors=("exp_probs_b.bias",)).validate()
    for knob in ({"wrong_successor_fraction": 0.2}, {"head_margin": 0.1}):
        with pytest.raises(SynthError, match="carries the wrong-successor fraction"):
            SynthSpec(omit_tensors=("nextn.embed_tokens",), **knob).validate()
    SynthSpec(omit_tensors=("nextn.embed_tokens",)).validate()  # f = 0: nothing to carry


def test_cli_synth_dense_shape_defaults_to_its_arch(tmp_path):
    """``--shape qwen3.6-27b`` is the dense qwen35's: without --arch the spec is qwen35 (its error names
    it, before anything is written); with --arch qwen35moe the shape is refused by name."""
    out = tmp_path / "d.gguf"
    r = CliRunner().invoke(main, ["synth", str(out), "--shape", SHAPE_DENSE_27B, "--mtp-layers", "3"])
    assert r.exit_code == 1 and "arch qwen35 takes 1 to 2" in r.output, r.output
    r = CliRunner().invoke(main, ["synth", str(out), "--shape", SHAPE_DENSE_27B, "--arch", "qwen35moe"])
    assert r.exit_code == 1 and "'qwen3.6-27b' is not written for arch qwen35moe" in r.output, r.output
    assert not out.exists()
    assert SHAPE_DENSE_27B in CliRunner().invoke(main, ["synth", "--help"]).output


def test_cli_synth_text_no_mtp_and_omit(tmp_path):
    r1 = CliRunner().invoke(main, ["synth", str(tmp_path / "a.gguf"), "--no-mtp"])
    assert r1.exit_code == 0 and "no MTP block" in r1.output
    r2 = CliRunner().invoke(main, ["synth", str(tmp_path / "b.gguf"), "--omit-tensor", "nextn.hnorm"])
    assert r2.exit_code == 0 and "k=3: 1.000" in r2.output
    assert "blk.4.nextn.hnorm.weight" not in _tensors(_reader(tmp_path / "b.gguf"))
    r3 = CliRunner().invoke(main, ["synth", str(tmp_path / "c.gguf"), "--no-mtp", "--wrong-successor-fraction", "0.5"])
    assert r3.exit_code == 1 and "error:" in r3.output and not (tmp_path / "c.gguf").exists()


def test_every_builtin_spec_validates_and_names_a_known_arch():
    """``builtin:NAME`` of every synthesized architecture: each spec validates (a typo in an arch or
    knob would otherwise surface only when a user asks for it)."""
    from ggufmtp.synth.archs.registry import arch_names

    for name, spec in BUILTIN_MODELS.items():
        spec.validate()
        assert spec.arch in arch_names(), name
    assert {s.arch for s in BUILTIN_MODELS.values()} == set(arch_names())
