"""ggufmtp.imatrix: formats (byte-exact), means, conversion, validation, coverage, CLI.

The optional tests at the end compare with the real llama-imatrix of the pinned runtime (skipped
when it is not built).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from ggufmtp.errors import ImatrixError
from ggufmtp.imatrix import check as imc
from ggufmtp.imatrix import entries as ime
from ggufmtp.imatrix import format as imx

ARCH = "qwen35moe"
N_EMBD, N_FF, N_EXP, N_VOCAB, N_BLOCK = 64, 32, 4, 96, 5  # blk.4 is the MTP block


# ------------------------------------------------------------------------------------------------
# a small qwen35moe-shaped model (written here with gguf-py; independent of ggufmtp.synth)
# ------------------------------------------------------------------------------------------------


def model_tensors(n_embd: int = N_EMBD, n_exp: int = N_EXP) -> dict[str, tuple[int, ...]]:
    """name -> shape in GGUF ne order (ne0 first)."""
    t: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (n_embd, N_VOCAB),
        "output_norm.weight": (n_embd,),
        "output.weight": (n_embd, N_VOCAB),
    }
    for b in range(N_BLOCK):
        p = f"blk.{b}."
        t[p + "attn_norm.weight"] = (n_embd,)
        t[p + "post_attention_norm.weight"] = (n_embd,)
        if b in (0, 1, 2):  # linear-attention layers
            t[p + "attn_qkv.weight"] = (n_embd, 2 * n_embd)
            t[p + "attn_gate.weight"] = (n_embd, n_embd)
            t[p + "ssm_conv1d.weight"] = (4, 2 * n_embd)
            t[p + "ssm_a"] = (2,)
            t[p + "ssm_beta.weight"] = (n_embd, 2)
            t[p + "ssm_alpha.weight"] = (n_embd, 2)
            t[p + "ssm_out.weight"] = (n_embd, n_embd)
        else:  # full attention (blk.3 and the MTP block)
            t[p + "attn_q.weight"] = (n_embd, 2 * n_embd)
            t[p + "attn_k.weight"] = (n_embd, n_embd // 2)
            t[p + "attn_v.weight"] = (n_embd, n_embd // 2)
            t[p + "attn_output.weight"] = (n_embd, n_embd)
        t[p + "ffn_gate_inp.weight"] = (n_embd, n_exp)
        t[p + "ffn_gate_exps.weight"] = (n_embd, N_FF, n_exp)
        t[p + "ffn_up_exps.weight"] = (n_embd, N_FF, n_exp)
        t[p + "ffn_down_exps.weight"] = (N_FF, n_embd, n_exp)
        t[p + "ffn_gate_inp_shexp.weight"] = (n_embd,)
        t[p + "ffn_up_shexp.weight"] = (n_embd, N_FF)
        t[p + "ffn_down_shexp.weight"] = (N_FF, n_embd)
    t["blk.4.nextn.eh_proj.weight"] = (2 * n_embd, n_embd)
    t["blk.4.nextn.enorm.weight"] = (n_embd,)
    t["blk.4.nextn.hnorm.weight"] = (n_embd,)
    return t


def write_model(path: Path, n_embd: int = N_EMBD, n_exp: int = N_EXP) -> dict[str, tuple[int, ...]]:
    shapes = model_tensors(n_embd, n_exp)
    w = gguf.GGUFWriter(str(path), arch=ARCH)
    w.add_uint32(f"{ARCH}.block_count", N_BLOCK)
    w.add_uint32(f"{ARCH}.nextn_predict_layers", 1)
    w.add_uint32(f"{ARCH}.embedding_length", n_embd)
    w.add_uint32(f"{ARCH}.expert_count", n_exp)
    for name, ne in shapes.items():
        w.add_tensor(name, np.zeros(tuple(reversed(ne)), dtype=np.float16))  # numpy order = reversed ne
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return shapes


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("model") / "tiny-qwen35moe.gguf"
    write_model(p)
    return p


@pytest.fixture(scope="module")
def shapes() -> dict[str, tuple[int, ...]]:
    return model_tensors()


def synth(shapes, fmt="gguf", seed=0, **kw) -> ime.Imatrix:
    return imc.synthetic_imatrix(shapes, mtp_blocks=[4], format=fmt, seed=seed, **kw)


def legacy_bytes(entries, trailer=None) -> bytes:
    """A legacy .dat built by hand with struct (independent of the module's writer)."""
    out = struct.pack("<i", len(entries))
    for name, ncall, values in entries:
        b = name.encode()
        out += struct.pack("<i", len(b)) + b + struct.pack("<ii", ncall, len(values))
        out += struct.pack(f"<{len(values)}f", *values)
    if trailer is not None:
        chunks, dataset = trailer
        out += struct.pack("<ii", chunks, len(dataset)) + dataset.encode()
    return out


# ------------------------------------------------------------------------------------------------
# model reading
# ------------------------------------------------------------------------------------------------


def test_read_model_tensors_ne_order_and_mtp(model, shapes):
    mt = imc.read_model_tensors(model)
    assert mt.arch == ARCH and mt.block_count == 5 and mt.nextn_predict_layers == 1
    assert mt.mtp_blocks == [4]
    assert mt.shapes["blk.0.ffn_up_exps.weight"] == (N_EMBD, N_FF, N_EXP)  # ne0 first
    assert mt.shapes["token_embd.weight"] == (N_EMBD, N_VOCAB)
    assert mt.shapes == shapes


def test_mtp_block_indices():
    assert imc.mtp_block_indices(41, 1) == [40]
    assert imc.mtp_block_indices(5, 2) == [3, 4]
    assert imc.mtp_block_indices(5, 0) == []


# ------------------------------------------------------------------------------------------------
# formats, byte-exact round trips
# ------------------------------------------------------------------------------------------------


def test_gguf_round_trip_is_byte_identical(tmp_path, shapes):
    im = synth(shapes)
    a = tmp_path / "a.gguf"
    digest = imx.write_imatrix(im, a)
    raw = a.read_bytes()
    assert digest == hashlib.sha256(raw).hexdigest()
    back = imx.read_imatrix(a)
    assert back.format == "gguf" and back.sha256 == digest and back.path == a
    assert back.chunk_size == 512 and back.chunk_count == 8 and back.datasets == ["synthetic-calibration.txt"]
    assert list(back.entries) == list(im.entries)
    for n, e in im.entries.items():
        np.testing.assert_array_equal(back.entries[n].values, e.values)
        np.testing.assert_array_equal(back.entries[n].counts, e.counts)
    b = tmp_path / "b.gguf"
    imx.write_imatrix(back, b)
    assert b.read_bytes() == raw


def test_gguf_layout_matches_llama_imatrix(tmp_path, shapes):
    """Checked with gguf-py's reader: KV order, tensor order/shapes, alignment (save_imatrix)."""
    im = synth(shapes)
    p = tmp_path / "a.gguf"
    imx.write_imatrix(im, p)
    r = gguf.GGUFReader(str(p))
    keys = [k for k in r.fields if not k.startswith("GGUF.")]
    assert keys == ["general.type", "imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size"]
    assert r.fields["general.type"].contents() == "imatrix"
    assert r.fields["imatrix.datasets"].contents() == ["synthetic-calibration.txt"]
    assert r.fields["imatrix.chunk_count"].types == [gguf.GGUFValueType.UINT32]
    assert r.fields["imatrix.chunk_size"].contents() == 512
    names = [t.name for t in r.tensors]
    bases = sorted(im.entries, key=str.encode)
    assert names == [n + s for n in bases for s in (".in_sum2", ".counts")]
    t = {x.name: x for x in r.tensors}
    # dense: ggml_n_dims drops the trailing 1s -> in_sum2 ne [ne0], counts ne [1]
    assert list(t["blk.0.attn_qkv.weight.in_sum2"].shape) == [N_EMBD]
    assert list(t["blk.0.attn_qkv.weight.counts"].shape) == [1]
    # experts: in_sum2 ne [ne0, n_expert], counts ne [1, n_expert]
    assert list(t["blk.0.ffn_down_exps.weight.in_sum2"].shape) == [N_FF, N_EXP]
    assert list(t["blk.0.ffn_down_exps.weight.counts"].shape) == [1, N_EXP]
    assert all(x.tensor_type == gguf.GGMLQuantizationType.F32 for x in r.tensors)
    assert all(x.data_offset % 32 == 0 for x in r.tensors)
    assert p.stat().st_size % 32 == 0  # the last tensor is padded too
    e = im.entries["blk.0.ffn_down_exps.weight"]
    np.testing.assert_array_equal(t["blk.0.ffn_down_exps.weight.in_sum2"].data, e.values)


def test_dat_round_trip_is_byte_identical(tmp_path, shapes):
    im = synth(shapes, fmt="dat")
    assert im.format == "dat" and im.chunk_size is None
    p = tmp_path / "a.dat"
    imx.write_imatrix(im, p)
    raw = p.read_bytes()
    back = imx.read_imatrix(p)
    assert back.format == "dat" and back.datasets == ["synthetic-calibration.txt"] and back.chunk_count == 8
    q = tmp_path / "b.dat"
    imx.write_imatrix(back, q)
    assert q.read_bytes() == raw


@pytest.mark.parametrize("trailer", [None, (7, ""), (3, "data/calibration.txt")])
def test_dat_hand_built_reads_and_round_trips(tmp_path, trailer):
    raw = legacy_bytes([("blk.0.attn_q.weight", 4, [4.0, 8.0, 2.0]),
                        ("blk.0.ffn_up_exps.weight", 2, [2.0, 4.0, 6.0, 8.0])], trailer)
    p = tmp_path / "h.dat"
    p.write_bytes(raw)
    im = imx.read_imatrix(p)
    assert im.format == "dat" and list(im.entries) == ["blk.0.attn_q.weight", "blk.0.ffn_up_exps.weight"]
    assert im.dat_trailer is (trailer is not None)
    assert im.chunk_count == (trailer[0] if trailer else 0)
    assert im.datasets == ([trailer[1]] if trailer and trailer[1] else [])
    e = im.entries["blk.0.attn_q.weight"]
    assert e.ncall == 4 and e.nval == 3
    np.testing.assert_array_equal(ime.mean_values(e), np.array([1.0, 2.0, 0.5], np.float32))
    np.testing.assert_array_equal(ime.mean_values(im.entries["blk.0.ffn_up_exps.weight"]),
                                  np.array([1, 2, 3, 4], np.float32))
    assert imx.imatrix_to_bytes(im) == raw


def test_write_is_atomic_and_keeps_no_temp_files(tmp_path, shapes):
    im = synth(shapes)
    p = tmp_path / "x.gguf"
    p.write_bytes(b"old")
    p.chmod(0o640)
    imx.write_imatrix(im, p)
    assert sorted(os.listdir(tmp_path)) == ["x.gguf"]
    assert p.read_bytes()[:4] == b"GGUF"
    assert p.stat().st_mode & 0o777 == 0o640  # a replaced file keeps its permissions
    q = tmp_path / "new.gguf"
    imx.write_imatrix(im, q)
    umask = os.umask(0o022)
    os.umask(umask)
    assert q.stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's 0600
    with pytest.raises(ImatrixError, match="no-such-dir"):
        imx.write_imatrix(im, tmp_path / "no-such-dir" / "y.gguf")


def test_gguf_name_too_long_is_refused(tmp_path):
    name = "blk.0." + "x" * 60 + ".weight"
    e = ime.ImatrixEntry(name, np.ones((1, 4), np.float32), np.ones(1, np.float32), "gguf")
    im = ime.Imatrix(entries={name: e}, chunk_size=512)
    with pytest.raises(ImatrixError, match="too long"):
        imx.write_imatrix(im, tmp_path / "long.gguf")
    assert not any(tmp_path.iterdir())


# ------------------------------------------------------------------------------------------------
# means as llama-quantize computes them
# ------------------------------------------------------------------------------------------------


def test_mean_values_gguf_counts_rules():
    sums = np.array([[2.0, 4.0], [9.0, 9.0], [5.0, 7.0], [3.0, 3.0]], np.float32)
    counts = np.array([2.0, 0.0, 2.5, 0.4], np.float32)  # lround: 2, 0 -> 1.0s, 3 (half away), 0 -> 1.0s
    e = ime.ImatrixEntry("blk.0.ffn_up_exps.weight", sums, counts, "gguf")
    m = ime.mean_values(e)
    assert m.dtype == np.float32 and m.shape == (8,)
    np.testing.assert_array_equal(m, np.array([1, 2, 1, 1, 5 / 3, 7 / 3, 1, 1], np.float32))


def test_mean_values_dat_ncall_zero_keeps_values():
    e = ime.ImatrixEntry("x.weight", np.array([3.0, 6.0], np.float32), np.array([0]), "dat")
    np.testing.assert_array_equal(ime.mean_values(e), [3.0, 6.0])
    e = ime.ImatrixEntry("x.weight", np.array([3.0, 6.0], np.float32), np.array([3]), "dat")
    np.testing.assert_array_equal(ime.mean_values(e), np.array([1.0, 2.0], np.float32))


def test_to_quantize_data_sizes(shapes):
    data = ime.to_quantize_data(synth(shapes))
    assert data["blk.0.attn_qkv.weight"].shape == (N_EMBD,)
    assert data["blk.0.ffn_down_exps.weight"].shape == (N_FF * N_EXP,)  # ne0 * n_expert, expert-major
    assert all(v.dtype == np.float32 and v.flags.c_contiguous for v in data.values())
    assert all(np.all(np.isfinite(v)) and np.all(v > 0) for v in data.values())


# ------------------------------------------------------------------------------------------------
# conversion
# ------------------------------------------------------------------------------------------------


def test_convert_gguf_to_dat_and_back(tmp_path, shapes):
    g = synth(shapes)
    g.datasets = ["first.txt", "second.txt"]
    d = ime.convert_imatrix(g, "dat")
    assert d.format == "dat" and d.datasets == ["second.txt"] and d.chunk_count == g.chunk_count
    qg, qd = ime.to_quantize_data(g), ime.to_quantize_data(d)
    assert list(qg) == list(qd)
    for n in qg:
        np.testing.assert_allclose(qd[n], qg[n], rtol=2e-7)  # (s/c)*ncall/ncall: float rounding only
    e = d.entries["blk.0.ffn_up_exps.weight"]
    assert e.ncall == -(-int(g.entries["blk.0.ffn_up_exps.weight"].counts.max()) // 512)
    losses = ime.conversion_losses(g, "dat")
    assert any("MoE" in s for s in losses) and any("chunk_size" in s for s in losses)
    assert any("last of 2 datasets" in s for s in losses)

    # dat -> gguf with a power-of-two chunk size keeps the means bit for bit
    back = ime.convert_imatrix(d, "gguf", chunk_size=512)
    assert back.chunk_size == 512 and back.datasets == ["second.txt"]
    qb = ime.to_quantize_data(back)
    for n in qd:
        np.testing.assert_array_equal(qb[n], qd[n])
    assert back.entries["blk.0.ffn_up_exps.weight"].nmat == 1  # per-expert counts are gone
    # write_imatrix converts on the fly
    p = tmp_path / "c.dat"
    imx.write_imatrix(g, p, format="dat")
    assert p.read_bytes() == imx.imatrix_to_bytes(d)


def test_convert_drops_entries_without_data():
    a = ime.ImatrixEntry("a.weight", np.ones((1, 4), np.float32), np.array([0.0], np.float32), "gguf")
    b = ime.ImatrixEntry("b.weight", np.full((2, 4), 6.0, np.float32), np.array([3.0, 0.0], np.float32), "gguf")
    g = ime.Imatrix(entries={"a.weight": a, "b.weight": b}, chunk_size=2, chunk_count=1)
    d = ime.convert_imatrix(g, "dat")
    assert list(d.entries) == ["b.weight"]
    eb = d.entries["b.weight"]
    assert eb.ncall == 2  # ceil(3 / 2)
    # expert with count 0 stores 1 * ncall (save_imatrix_legacy), so both means agree
    np.testing.assert_array_equal(eb.values, np.array([4, 4, 4, 4, 2, 2, 2, 2], np.float32))
    np.testing.assert_array_equal(ime.mean_values(eb), ime.mean_values(b))


def test_gguf_to_dat_needs_chunk_size():
    a = ime.ImatrixEntry("a.weight", np.ones((1, 4), np.float32), np.array([5.0], np.float32), "gguf")
    g = ime.Imatrix(entries={"a.weight": a}, chunk_size=None)
    with pytest.raises(ImatrixError, match="chunk_size"):
        ime.convert_imatrix(g, "dat")
    assert ime.convert_imatrix(g, "dat", chunk_size=4).entries["a.weight"].ncall == 2


# ------------------------------------------------------------------------------------------------
# validation against a model
# ------------------------------------------------------------------------------------------------


def test_validate_clean(model, shapes):
    im = synth(shapes)
    rep = imc.validate(im, imc.read_model_tensors(model))
    assert rep.ok and rep.problems == [] and rep.matched == rep.entries == len(im.entries)


def test_validate_nan(shapes):
    im = synth(shapes)
    im.entries["blk.1.ffn_up_exps.weight"].values[2, 5] = np.nan
    with pytest.raises(ImatrixError, match=r"blk\.1\.ffn_up_exps\.weight: 1 of 256 values are NaN"):
        imc.validate(im, shapes)
    rep = imc.validate(im, shapes, strict=False)
    assert [p.kind for p in rep.errors] == ["non_finite"]


def test_validate_nan_in_expert_without_tokens_is_ignored(shapes):
    im = synth(shapes)
    e = im.entries["blk.1.ffn_up_exps.weight"]
    e.values[2, :] = np.nan
    e.counts[2] = 0  # llama-quantize uses 1.0 for that expert
    rep = imc.validate(im, shapes, strict=False)
    assert rep.ok and [p.kind for p in rep.warnings] == ["no_data"]


def test_validate_negative(shapes):
    im = synth(shapes, fmt="dat")
    im.entries["blk.0.attn_qkv.weight"].values[0] = -1.0
    with pytest.raises(ImatrixError, match="negative"):
        imc.validate(im, shapes)


def test_validate_wrong_size(shapes):
    im = synth(shapes)
    name = "blk.2.ffn_down_shexp.weight"
    e = im.entries[name]
    im.entries[name] = ime.ImatrixEntry(name, e.values[:, :-1].copy(), e.counts, "gguf")
    rep = imc.validate(im, shapes, strict=False)
    assert [(p.kind, p.name) for p in rep.errors] == [("size_mismatch", name)]
    assert "needs 32" in rep.errors[0].message
    with pytest.raises(ImatrixError, match="is not usable for this model"):
        imc.validate(im, shapes)


def test_validate_expert_layout(shapes):
    im = synth(shapes)
    name = "blk.0.ffn_up_exps.weight"  # 4 experts of 64 -> 2 "experts" of 128: same size, wrong layout
    e = im.entries[name]
    im.entries[name] = ime.ImatrixEntry(name, e.values.reshape(2, 128).copy(), e.counts[:2].copy(), "gguf")
    rep = imc.validate(im, shapes, strict=False)
    assert [p.kind for p in rep.errors] == ["shape_mismatch"]


def test_validate_unknown_names_warn(shapes):
    im = synth(shapes)
    extra = ime.ImatrixEntry("blk.9.attn_q.weight", np.ones((1, 8), np.float32), np.ones(1, np.float32))
    im.entries["blk.9.attn_q.weight"] = extra
    rep = imc.validate(im, shapes)
    assert rep.ok and [p.kind for p in rep.warnings] == ["unknown_tensor"]
    assert "blk.9.attn_q.weight" in rep.warnings[0].message


def test_validate_wrong_model(tmp_path, shapes):
    other = synth(model_tensors(n_embd=128, n_exp=8))  # same names, other sizes
    n = len(other.entries)
    bad = sum(e.nval != imc.expected_size(shapes[k]) for k, e in other.entries.items())
    assert n / 2 < bad < n  # ffn_down_shexp (ne0 = n_ff) still fits
    with pytest.raises(ImatrixError, match=rf"was made for another model: {bad} of {n} entries do not match"):
        imc.validate(other, shapes, strict=False)
    renamed = ime.Imatrix(entries={"x" + k: ime.ImatrixEntry("x" + k, e.values, e.counts)
                                   for k, e in synth(shapes).entries.items()}, chunk_size=512)
    with pytest.raises(ImatrixError, match="unknown tensor names"):
        imc.validate(renamed, shapes, strict=False)


def test_validate_missing_metadata(shapes):
    im = synth(shapes)
    im.gguf_kv_order = ["general.type"]  # as a file without the imatrix.* keys
    assert not im.has_metadata
    rep = imc.validate(im, shapes, strict=False)
    assert [p.kind for p in rep.errors] == ["missing_metadata"]
    back = imx.imatrix_from_bytes(imx.imatrix_to_bytes(im))
    assert not back.has_metadata and back.chunk_size is None


# ------------------------------------------------------------------------------------------------
# coverage and imatrix requirements
# ------------------------------------------------------------------------------------------------


def test_coverage_reports_mtp_block(model):
    mt = imc.read_model_tensors(model)
    im = imc.synthetic_imatrix(mt)  # takes the MTP block from the model, like llama-imatrix skips it
    assert not any(n.startswith("blk.4.") for n in im.entries)
    cov = imc.coverage(im, mt)
    assert cov.mtp_blocks == [4]
    assert cov.missing == [] and cov.complete
    expected_mtp = [n for n, s in mt.shapes.items() if n.startswith("blk.4.") and imc.is_quantizable(n, s)]
    assert cov.missing_mtp == expected_mtp
    assert "blk.4.nextn.eh_proj.weight" in cov.missing_mtp
    assert "blk.4.nextn.enorm.weight" not in cov.missing_mtp  # 1-D: never quantized
    assert "blk.4.ffn_gate_inp.weight" not in cov.missing_mtp  # router: never quantized
    assert cov.missing_exempt == ["token_embd.weight", "output.weight"]
    assert set(cov.missing_by_block) == {"blk.4", "other"}
    d = cov.to_dict()
    assert d["missing_mtp"] == expected_mtp and d["missing"] == []


def test_coverage_trunk_gap_and_blocking(shapes):
    im = synth(shapes, exclude_prefixes=("blk.2.",))
    cov = imc.coverage(im, shapes, mtp_blocks=[4])
    assert cov.missing and all(n.startswith("blk.2.") for n in cov.missing) and not cov.complete
    types = {n: "IQ2_XXS" for n in cov.quantizable}
    types.update({n: "IQ3_XXS" for n in imc.EXEMPT_TENSORS & set(types) | {"token_embd.weight"}})
    blocking = cov.blocking(types)
    assert "token_embd.weight" not in blocking and "output.weight" not in blocking  # exempt from llama-quant's check, and ggml quantizes it
    assert set(blocking) == set(cov.missing) | set(cov.missing_mtp)
    # but ggml_quantize_chunk asserts statistics for IQ2_XXS whatever the tensor: llama.cpp aborts
    assert "token_embd.weight" in cov.blocking({**types, "token_embd.weight": "IQ2_XXS"})
    assert cov.blocking({n: "Q4_K" for n in cov.quantizable}) == []


def test_coverage_counts_a_wrong_size_entry_as_missing(shapes):
    im = synth(shapes)
    name = "blk.0.attn_qkv.weight"
    e = im.entries[name]
    im.entries[name] = ime.ImatrixEntry(name, e.values[:, :10].copy(), e.counts, "gguf")
    cov = imc.coverage(im, shapes, mtp_blocks=[4])
    assert cov.missing == [name]


def test_coverage_explicit_quantizable(shapes):
    im = synth(shapes)
    cov = imc.coverage(im, shapes, quantizable={"blk.0.attn_qkv.weight", "blk.4.attn_q.weight"}, mtp_blocks=[4])
    assert cov.covered == ["blk.0.attn_qkv.weight"] and cov.missing_mtp == ["blk.4.attn_q.weight"]


def test_needs_imatrix():
    for t in ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "iq2_xxs"):
        assert imc.needs_imatrix(t)
    for t in ("IQ3_S", "IQ4_XS", "Q4_K", "Q8_0", "F16", "Q2_K"):
        assert not imc.needs_imatrix(t)
    assert imc.needs_imatrix("Q2_K", "Q2_K_S") and imc.needs_imatrix("Q2_K", "LLAMA_FTYPE_MOSTLY_Q2_K_S")
    assert imc.needs_imatrix("Q2_K", 21) and not imc.needs_imatrix("Q2_K", "Q2_K")
    # exempt from llama-quant's check by name, but ggml_quantize_chunk asserts statistics for these
    assert imc.needs_imatrix("IQ2_XXS", tensor_name="token_embd.weight")
    assert imc.needs_imatrix("IQ1_S", tensor_name="output.weight")
    for t in ("IQ3_XXS", "IQ2_S", "IQ1_M"):
        assert not imc.needs_imatrix(t, tensor_name="token_embd.weight")
    assert imc.needs_imatrix("IQ1_S", tensor_name="blk.4.nextn.eh_proj.weight")


def test_is_quantizable():
    assert imc.is_quantizable("blk.0.attn_q.weight", (64, 128))
    assert imc.is_quantizable("blk.0.ffn_up_exps.weight", (64, 32, 4))
    assert not imc.is_quantizable("blk.0.attn_norm.weight", (64,))
    assert not imc.is_quantizable("blk.0.attn_q.weight", (64, 1))  # ggml_n_dims == 1
    assert not imc.is_quantizable("blk.0.ffn_gate_inp.weight", (64, 4))
    assert not imc.is_quantizable("blk.0.ssm_conv1d.weight", (4, 128))
    assert not imc.is_quantizable("blk.0.ssm_a", (2, 2))


# ------------------------------------------------------------------------------------------------
# corrupt, truncated and foreign files
# ------------------------------------------------------------------------------------------------


def _bad_files(tmp_path: Path, shapes, model: Path) -> dict[str, Path]:
    g = imx.imatrix_to_bytes(synth(shapes))
    d = imx.imatrix_to_bytes(synth(shapes, fmt="dat"))
    files = {
        "truncated.gguf": g[: len(g) - 100],
        "truncated-header.gguf": g[:200],
        "truncated.dat": d[: len(d) // 2],
        "truncated-trailer.dat": d[:-30],
        "text.dat": b"hello, this is not an imatrix at all\n" * 3,
        "empty.dat": b"",
        "tiny.dat": b"\x01\x00",
        "zero-entries.dat": struct.pack("<i", 0),
        "garbage-after.dat": d + b"\x00\x01",
        "badtype.gguf": g.replace(b"imatrix.chunk_count\x04\x00\x00\x00", b"imatrix.chunk_count\x05\x00\x00\x00"),
    }
    out = {}
    for name, data in files.items():
        p = tmp_path / name
        p.write_bytes(data)
        out[name] = p
    out["model.gguf"] = model
    return out


def test_bad_files_raise_one_clear_error(tmp_path, shapes, model):
    for name, p in _bad_files(tmp_path, shapes, model).items():
        with pytest.raises(ImatrixError) as ei:
            imx.read_imatrix(p)
        msg = str(ei.value)
        assert str(p) in msg and "\n" not in msg, (name, msg)
    with pytest.raises(ImatrixError, match="does not exist"):
        imx.read_imatrix(tmp_path / "nope.gguf")


def test_bad_file_messages(tmp_path, shapes, model):
    f = _bad_files(tmp_path, shapes, model)
    cases = {
        "truncated.gguf": "is truncated",
        "truncated.dat": "is truncated",
        "truncated-trailer.dat": "truncated",
        "text.dat": "neither a GGUF file nor a legacy .dat imatrix",
        "empty.dat": "is empty",
        "zero-entries.dat": "invalid entry count 0",
        "garbage-after.dat": "unexpected bytes after the trailer",
        "badtype.gguf": "requires UINT32",
        "model.gguf": "not an imatrix",
    }
    for name, pattern in cases.items():
        with pytest.raises(ImatrixError, match=pattern):
            imx.read_imatrix(f[name])


# ------------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------------


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ggufmtp", *args], capture_output=True, text=True, timeout=120)


def test_cli_info_json(tmp_path, shapes):
    p = tmp_path / "a.gguf"
    digest = imx.write_imatrix(synth(shapes), p)
    r = cli("imatrix", "info", str(p), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for k in ("path", "sha256", "format", "entries", "chunk_count", "chunk_size", "datasets"):
        assert k in out
    assert out["sha256"] == digest and out["format"] == "gguf" and out["chunk_size"] == 512
    assert out["entries"] == len(synth(shapes).entries)


def test_cli_info_with_model(tmp_path, model, shapes):
    p = tmp_path / "a.dat"
    imx.write_imatrix(imc.synthetic_imatrix(imc.read_model_tensors(model), format="dat"), p)
    r = cli("imatrix", "info", str(p), "--model", str(model), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["format"] == "dat" and out["chunk_size"] is None
    assert out["coverage"]["missing"] == []
    assert "blk.4.nextn.eh_proj.weight" in out["coverage"]["missing_mtp"]
    assert out["validation"]["ok"] is True and out["validation"]["problems"] == []
    r = cli("imatrix", "info", str(p), "--model", str(model))
    assert r.returncode == 0 and "missing (MTP block)" in r.stdout


def test_cli_info_with_model_problems(tmp_path, model, shapes):
    im = synth(shapes)
    im.entries["blk.0.attn_qkv.weight"].values[0, 0] = np.inf
    p = tmp_path / "nan.gguf"
    imx.write_imatrix(im, p)
    r = cli("imatrix", "info", str(p), "--model", str(model), "--json")
    assert r.returncode == 1
    out = json.loads(r.stdout)
    assert out["validation"]["ok"] is False
    assert [x["kind"] for x in out["validation"]["problems"]] == ["non_finite"]
    wrong = tmp_path / "wrong.gguf"
    imx.write_imatrix(synth(model_tensors(n_embd=128)), wrong)
    r = cli("imatrix", "info", str(wrong), "--model", str(model))
    assert r.returncode == 1 and "was made for another model" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.runtime  # five CLI processes: ~1.5 s
def test_cli_errors_on_bad_files(tmp_path, shapes, model):
    f = _bad_files(tmp_path, shapes, model)
    for name in ("truncated.gguf", "truncated.dat", "text.dat", "empty.dat", "model.gguf"):
        r = cli("imatrix", "info", str(f[name]))
        assert r.returncode != 0, name
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and str(f[name]) in lines[0] and lines[0].startswith("error:"), r.stderr
        assert "Traceback" not in r.stderr and r.stdout == ""


def test_cli_convert(tmp_path, shapes):
    src = tmp_path / "a.gguf"
    imx.write_imatrix(synth(shapes), src)
    dst = tmp_path / "a.dat"
    r = cli("imatrix", "convert", str(src), str(dst), "--format", "dat", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["format"] == "dat" and out["notes"] and out["sha256"] == hashlib.sha256(dst.read_bytes()).hexdigest()
    assert dst.read_bytes() == imx.imatrix_to_bytes(imx.read_imatrix(src), "dat")
    back = tmp_path / "b.gguf"
    r = cli("imatrix", "convert", str(dst), str(back), "--format", "gguf", "--chunk-size", "256")
    assert r.returncode == 0, r.stderr
    assert imx.read_imatrix(back).chunk_size == 256
    r = cli("imatrix", "convert", str(tmp_path / "missing.dat"), str(back), "--format", "gguf")
    assert r.returncode == 1 and "missing.dat" in r.stderr and "Traceback" not in r.stderr


# ------------------------------------------------------------------------------------------------
# against the real llama-imatrix (pinned runtime; skipped when it is not built)
# ------------------------------------------------------------------------------------------------


def _llama_imatrix() -> Path:
    from ggufmtp.errors import RuntimeMissingError
    from ggufmtp.runtime.build import find_binary

    try:
        return find_binary("llama-imatrix")
    except RuntimeMissingError as e:
        pytest.skip(f"llama-imatrix not built: {e}")


def _run_imatrix(binary: Path, *args: str) -> None:
    r = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


@pytest.mark.runtime
def test_llama_imatrix_rewrites_our_files_identically(tmp_path, shapes):
    """llama-imatrix --in-file (no prompt: load + save, the model is never opened) must write back
    exactly what we write, and its format conversions must equal ours."""
    binary = _llama_imatrix()
    im = synth(shapes, chunk_size=64, chunk_count=5)
    ours_g, ours_d = tmp_path / "ours.gguf", tmp_path / "ours.dat"
    imx.write_imatrix(im, ours_g)
    imx.write_imatrix(im, ours_d, format="dat")
    m = str(tmp_path / "unused-model.gguf")
    cases = [
        (ours_g, "gguf", "64", ours_g.read_bytes()),
        (ours_g, "dat", "64", ours_d.read_bytes()),
        (ours_d, "dat", "64", ours_d.read_bytes()),
        (ours_d, "gguf", "64", imx.imatrix_to_bytes(ime.convert_imatrix(imx.read_imatrix(ours_d), "gguf", chunk_size=64))),
    ]
    for i, (src, fmt, cs, want) in enumerate(cases):
        out = tmp_path / f"theirs{i}.{fmt}"
        _run_imatrix(binary, "-m", m, "--in-file", str(src), "-o", str(out), "--output-format", fmt, "-c", cs)
        assert out.read_bytes() == want, (src.name, fmt)


@pytest.mark.runtime
def test_real_llama_imatrix_collection(tmp_path):
    """A real collection run on a runnable synthetic model (needs ggufmtp.synth and the runtime)."""
    binary = _llama_imatrix()
    synth_mod = pytest.importorskip("ggufmtp.synth.writer")
    model_path = tmp_path / "m.gguf"
    synth_mod.synthesize(model_path, synth_mod.SynthSpec(), progress=False)
    text = tmp_path / "calib.txt"
    words = "the quick brown fox jumps over a lazy dog while seven wizards hex jolly crabs".split()
    rng = np.random.default_rng(0)
    text.write_text(" ".join(words[i] for i in rng.integers(0, len(words), 4000)))
    outs = {}
    for fmt in ("gguf", "dat"):
        out = tmp_path / f"real.{fmt}"
        _run_imatrix(binary, "-m", str(model_path), "-f", str(text), "-o", str(out), "--output-format", fmt,
                     "-c", "128", "--chunks", "4", "-t", "2", "--no-ppl")
        outs[fmt] = out
        im = imx.read_imatrix(out)
        assert im.format == fmt and im.chunk_count == 4
        assert imx.imatrix_to_bytes(im) == out.read_bytes()  # byte-identical round trip
    g, d = imx.read_imatrix(outs["gguf"]), imx.read_imatrix(outs["dat"])
    assert g.chunk_size == 128 and g.datasets == [str(text)]
    mt = imc.read_model_tensors(model_path)
    assert imc.validate(g, mt).ok and imc.validate(d, mt).ok
    cov = imc.coverage(g, mt)
    assert cov.missing == [] and cov.mtp_blocks == [4]
    assert cov.missing_mtp == [n for n, s in mt.shapes.items() if n.startswith("blk.4.") and imc.is_quantizable(n, s)]
    # our synthetic imatrix covers exactly what llama-imatrix collects, in the same order
    assert list(imc.synthetic_imatrix(mt).entries) == list(g.entries)
    # the same activations written both ways give the same means
    qg, qd = ime.to_quantize_data(g), ime.to_quantize_data(d)
    for n in qg:
        np.testing.assert_allclose(qd[n], qg[n], rtol=2e-7)
    # and our GGUF -> dat conversion equals llama-imatrix's
    conv = tmp_path / "conv.dat"
    _run_imatrix(binary, "-m", str(model_path), "--in-file", str(outs["gguf"]), "-o", str(conv),
                 "--output-format", "dat", "-c", "128")
    assert conv.read_bytes() == imx.imatrix_to_bytes(g, "dat")


def _gguf_py_imatrix(path: Path, tensors: dict[str, np.ndarray], **kv) -> Path:
    w = gguf.GGUFWriter(str(path), arch="unused")  # adds general.architecture: an extra key
    w.add_string("general.type", "imatrix")
    w.add_array("imatrix.datasets", ["d.txt"])
    w.add_uint32("imatrix.chunk_count", 2)
    w.add_uint32("imatrix.chunk_size", 512)
    for k, v in kv.items():
        w.add_string(k, v)
    for name, arr in tensors.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_reads_gguf_py_written_imatrix(tmp_path):
    """Another writer (gguf-py, explicit trailing dims, extra metadata) reads fine; the entry data
    survive a rewrite, the dims are normalised like ggml_n_dims."""
    sums = np.arange(8, dtype=np.float32).reshape(1, 8) + 1
    p = _gguf_py_imatrix(tmp_path / "py.gguf", {"a.weight.in_sum2": sums,
                                                "a.weight.counts": np.array([[4.0]], np.float32)},
                         **{"general.name": "made by gguf-py"})
    im = imx.read_imatrix(p)
    assert im.gguf_kv_order[-1] == "general.name" and "general.name" in im.gguf_extra_kv
    np.testing.assert_array_equal(ime.mean_values(im.entries["a.weight"]), sums.reshape(-1) / 4)
    back = imx.imatrix_from_bytes(imx.imatrix_to_bytes(im))
    assert back.gguf_kv_order == im.gguf_kv_order and back.gguf_extra_kv == im.gguf_extra_kv
    np.testing.assert_array_equal(back.entries["a.weight"].values, im.entries["a.weight"].values)


def test_gguf_unpaired_tensor_is_refused(tmp_path):
    p = _gguf_py_imatrix(tmp_path / "half.gguf", {"a.weight.in_sum2": np.ones((1, 8), np.float32)})
    with pytest.raises(ImatrixError, match=r"entry 'a.weight' has .in_sum2 but not .counts"):
        imx.read_imatrix(p)


@pytest.mark.runtime
def test_mean_values_equal_what_llama_quantize_uses(tmp_path):
    """llama-quantize with a real GGUF imatrix writes the same tensors as with a .dat holding our
    mean_values (ncall = 1, so its loader passes them unchanged); one ulp off in one entry shows."""
    from ggufmtp.errors import RuntimeMissingError
    from ggufmtp.runtime.build import find_binary

    imatrix_bin = _llama_imatrix()
    try:
        quantize_bin = find_binary("llama-quantize")
    except RuntimeMissingError as e:
        pytest.skip(f"llama-quantize not built: {e}")
    synth_mod = pytest.importorskip("ggufmtp.synth.writer")
    model_path = tmp_path / "m.gguf"
    synth_mod.synthesize(model_path, synth_mod.SynthSpec(), progress=False)
    text = tmp_path / "calib.txt"
    rng = np.random.default_rng(1)
    text.write_text(" ".join(["alpha", "beta", "gamma", "delta", "epsilon"][i] for i in rng.integers(0, 5, 3000)))
    real = tmp_path / "real.gguf"
    _run_imatrix(imatrix_bin, "-m", str(model_path), "-f", str(text), "-o", str(real), "-c", "128",
                 "--chunks", "3", "-t", "2", "--no-ppl")
    g = imx.read_imatrix(real)
    e0 = g.entries["blk.0.ffn_up_exps.weight"]
    e0.counts = e0.counts.copy()
    e0.counts[1] = 0  # an expert without tokens: llama-quantize uses 1.0
    imx.write_imatrix(g, real)

    def as_means_dat(path: Path, bump: str | None = None) -> Path:
        ents = {}
        for n, e in g.entries.items():
            m = ime.mean_values(e)
            if n == bump:
                m = np.nextafter(m, np.float32(np.inf)).astype(np.float32)
            ents[n] = ime.ImatrixEntry(n, m, np.array([1]), "dat")
        imx.write_imatrix(ime.Imatrix(entries=ents, datasets=g.datasets, chunk_count=g.chunk_count,
                                      format="dat"), path)
        return path

    def quantized(im_path: Path) -> dict[str, bytes]:
        out = tmp_path / f"q-{im_path.stem}.gguf"
        r = subprocess.run([str(quantize_bin), "--imatrix", str(im_path), str(model_path), str(out), "Q4_K_M", "2"],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        return {t.name: t.data.tobytes() for t in gguf.GGUFReader(str(out)).tensors}

    ref = quantized(real)
    assert quantized(as_means_dat(tmp_path / "means.dat")) == ref
    bumped = quantized(as_means_dat(tmp_path / "bumped.dat", bump="blk.1.ffn_up_exps.weight"))
    assert [n for n in ref if ref[n] != bumped[n]] == ["blk.1.ffn_up_exps.weight"]
