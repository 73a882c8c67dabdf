"""The predicted llama-quant header (ggufmtp.quant.output_header) and the streaming output hash
(ggufmtp.quant.stream_hash): the prediction must equal the real output's first meta_size bytes and
size, and the hasher's digest must be the file's sha256 or be refused."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
import struct
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from gguf.constants import GGUFValueType
from gguf.gguf_writer import GGUFWriter
from gguf_copy import copy_gguf

from ggufmtp.errors import UnpredictableHeader
from ggufmtp.gguf.model import MTPStatus
from ggufmtp.gguf.reader import read_header
from ggufmtp.imatrix import check as imc
from ggufmtp.imatrix import format as imx
from ggufmtp.quant import output_header as oh
from ggufmtp.quant.output_header import PredictedHeader, build_output_header, predict_output_header
from ggufmtp.quant.plan import Plan, PlannedTensor, make_plan
from ggufmtp.quant.quantize import quantize
from ggufmtp.quant.recipe import Recipe
from ggufmtp.quant.stream_hash import StreamingOutputHash, StreamStatus
from ggufmtp.quant.worker import run_quantize_interruptible
from ggufmtp.runtime.libllama import KVOverride, QuantizeParams

PLAIN = {"name": "plain-q4_k_m", "ftype": "Q4_K_M", "imatrix": "none", "mtp": {"required": False}}
MTP_BF16 = {"name": "mtp-bf16", "ftype": "Q4_K_M", "imatrix": "none", "output_type": "Q6_K",
            "token_embedding_type": "Q5_K",
            "mtp": {"eh_proj": "BF16", "attention": "BF16", "routed_experts": "Q8_0", "shared_expert": "BF16",
                    "rest": "Q8_0"}}


@pytest.fixture(scope="module")
def full_imatrix(synth_model, tmp_path_factory) -> Path:
    model = synth_model("tiny-qwen35moe")
    p = tmp_path_factory.mktemp("imx") / "full.gguf"
    imx.write_imatrix(imc.synthetic_imatrix(imc.read_model_tensors(model), seed=3, mtp_blocks=[]), p)
    return p


def _recipe(r: str | dict) -> Recipe | str:
    return Recipe.from_dict(r) if isinstance(r, dict) else r


def _assert_predicted(model: Path, recipe, out: Path, imatrix: Path | None = None,
                      plan: Plan | None = None) -> PredictedHeader:
    plan = plan or make_plan(model, _recipe(recipe), imatrix)
    assert plan.ok, plan.errors
    pred = build_output_header(model, plan)
    quantize(model, _recipe(recipe), out, imatrix=imatrix, plan=plan, progress=False)
    real = out.read_bytes()
    assert pred.file_size == len(real)
    assert pred.header == real[:pred.meta_size]
    assert read_header(out).data_offset == pred.meta_size
    return pred


@pytest.mark.parametrize("recipe", [PLAIN, "q4_k_m-mtp-q8", MTP_BF16, "q8_0-mtp"],
                         ids=["plain", "mtp-q8", "mtp-bf16-outputs", "q8_0"])
def test_prediction_equals_real_header(recipe, synth_model, tmp_path):
    _assert_predicted(synth_model("tiny-qwen35moe"), recipe, tmp_path / "out.gguf")


@pytest.mark.parametrize("recipe", ["hifi-q4_k_m-mtp", "iq4_xs-mtp"])
def test_prediction_with_imatrix_keys(recipe, synth_model, full_imatrix, tmp_path):
    model = synth_model("tiny-qwen35moe")
    pred = _assert_predicted(model, recipe, tmp_path / "out.gguf", imatrix=full_imatrix)
    md = read_header(tmp_path / "out.gguf").metadata
    assert md["quantize.imatrix.file"] == full_imatrix.name and md["quantize.imatrix.entries_count"] > 0
    assert b"quantize.imatrix.chunks_count" in pred.header


@pytest.mark.parametrize("name", ["tiny-glm4moe", "tiny-qwen35", "tiny-deepseek2"])
def test_prediction_other_architectures(name, synth_model, tmp_path):
    _assert_predicted(synth_model(name), "q4_k_m-mtp-q8", tmp_path / "out.gguf")


def test_override_of_an_existing_key_moves_it_to_the_end(synth_model, tmp_path):
    """gguf_set_val_* removes and appends: an override of general.name is written last, not in place."""
    model = synth_model("tiny-qwen35moe")
    plan = make_plan(model, Recipe.from_dict(PLAIN))
    plan.params = dataclasses.replace(plan.params, kv_overrides=[KVOverride("general.name", "renamed"),
                                                                 KVOverride("quantize.test.count", -7)])
    _assert_predicted(model, PLAIN, tmp_path / "out.gguf", plan=plan)
    fields = list(read_header(tmp_path / "out.gguf").fields.values())
    assert [f.name for f in fields[-2:]] == ["general.name", "quantize.test.count"]
    assert fields[-2].value == "renamed" and fields[-1].value == 7 and fields[-1].type == GGUFValueType.UINT32


def _with_trailing_unit_dim(src: Path, dst: Path, name: str) -> Path:
    """``src`` with the 1-D tensor ``name`` stored as 2-D ``[ne0, 1]`` (same bytes, one more
    dimension in its tensor info): gguf.cpp writes it back with ggml_n_dims = 1."""
    raw = src.read_bytes()
    h = read_header(src)
    key = struct.pack("<Q", len(name)) + name.encode() + struct.pack("<I", 1)
    at = raw.index(key, 0, h.data_offset) + len(key)
    meta = raw[:at - 4] + struct.pack("<IQQ", 2, struct.unpack_from("<Q", raw, at)[0], 1) + raw[at + 8:h.data_offset]
    end = len(meta) - (h.data_offset - _infos_end(h))  # drop the old padding
    meta = meta[:end] + bytes(-end % 32)
    dst.write_bytes(meta + raw[h.data_offset:])
    return dst


def _infos_end(h) -> int:
    """Where the tensor infos end (the data section starts at the next multiple of 32)."""
    kv_end = max(f.value_span[1] for f in h.fields.values())
    return kv_end + sum(8 + len(t.name.encode()) + 4 + 8 * len(t.shape) + 4 + 8 for t in h.tensors)


def test_trailing_unit_dimensions_are_dropped(synth_model, tmp_path):
    """A tensor stored as [256, 1] comes out as [256] (ggml_n_dims), so its info is 8 bytes shorter."""
    model = _with_trailing_unit_dim(synth_model("tiny-qwen35moe"), tmp_path / "unit.gguf", "output_norm.weight")
    assert next(t for t in read_header(model).tensors if t.name == "output_norm.weight").shape == (256, 1)
    _assert_predicted(model, PLAIN, tmp_path / "out.gguf")
    out = read_header(tmp_path / "out.gguf")
    assert next(t for t in out.tensors if t.name == "output_norm.weight").shape == (256,)


def test_prediction_of_a_split_source(synth_model, tmp_path):
    """Every shard's tensors in one output, the split.* keys removed."""
    (tmp_path / "src").mkdir()
    shards = copy_gguf(synth_model("tiny-qwen35moe"), tmp_path / "src" / "split.gguf", split_max_tensors=20)
    assert len(shards) > 1
    first = shards[0]
    assert "split.count" in read_header(first).metadata
    pred = _assert_predicted(first, "q4_k_m-mtp-q8", tmp_path / "out.gguf")
    assert b"split.count" not in pred.header


def test_tensor_order_is_weight_name_comparer():
    names = ["output.weight", "blk.10.a.weight", "blk.2.z.weight", "token_embd.weight", "blk.2.a.weight",
             "blk.x.weight", "output_norm.weight"]
    assert oh.quant_tensor_order(names) == ["blk.x.weight", "output.weight", "output_norm.weight",
                                            "token_embd.weight", "blk.2.a.weight", "blk.2.z.weight",
                                            "blk.10.a.weight"]


# ----------------------------------------------------------------------------- what cannot be predicted


def _tiny_gguf(path: Path, *, alignment: int | None = None, strings: dict[str, str] | None = None,
               tokens: list[str] | None = None) -> Path:
    w = GGUFWriter(path, "llama")
    if alignment:
        w.add_custom_alignment(alignment)
    for k, v in (strings or {}).items():
        w.add_key_value(k, v.encode(), GGUFValueType.STRING)
    if tokens:
        w.add_key_value("tokenizer.ggml.tokens", [t.encode() for t in tokens], GGUFValueType.ARRAY,
                        sub_type=GGUFValueType.STRING)
    w.add_tensor("a.weight", np.zeros(64, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _plan_for(path: Path) -> Plan:
    t = PlannedTensor("a.weight", [64], "F32", "F32", "", 256)
    return Plan(model=str(path), recipe="x", ftype="Q8_0", mtp_block=None, mtp_status=MTPStatus.ABSENT, rules=[],
                tensors=[t], n_params=64, errors=[], warnings=[], params=QuantizeParams(ftype=7))


def test_plain_tiny_gguf_is_predictable(tmp_path):
    p = _tiny_gguf(tmp_path / "a.gguf", strings={"general.name": "ok"}, tokens=["a", "bc", "x" * 300])
    pred = build_output_header(p, _plan_for(p))
    assert pred.file_size == pred.meta_size + 256 and pred.meta_size % 32 == 0


@pytest.mark.parametrize("kind", ["alignment", "nul-value", "nul-token", "plan-mismatch"])
def test_unpredictable_returns_none(kind, tmp_path):
    p = tmp_path / "a.gguf"
    if kind == "alignment":
        _tiny_gguf(p, alignment=64)
    elif kind == "nul-value":
        _tiny_gguf(p, strings={"general.name": "a\0b"})
    elif kind == "nul-token":
        _tiny_gguf(p, tokens=["a", "b\0c", "d"])
    else:
        _tiny_gguf(p)
    plan = _plan_for(p)
    if kind == "plan-mismatch":
        plan.tensors[0].name = "b.weight"
    with pytest.raises(UnpredictableHeader):
        build_output_header(p, plan)
    assert predict_output_header(p, plan) is None


def test_nul_detection_in_string_arrays_matches_a_naive_scan():
    """Lengths whose prefixes hold few or many zero bytes (0, 255, 256, 65536) must not fool the count."""
    rng = random.Random(0)
    for trial in range(200):
        items = []
        for _ in range(rng.randrange(0, 30)):
            n = rng.choice([0, 1, 5, 255, 256, 257, 65536])
            items.append(rng.randbytes(n).replace(b"\0", b"\1"))  # no zero byte of its own
        if trial % 2 and items:
            i = rng.randrange(len(items))
            if items[i]:
                j = rng.randrange(len(items[i]))
                items[i] = items[i][:j] + b"\0" + items[i][j + 1:]
        packed = b"".join(struct.pack("<Q", len(s)) + s for s in items)
        assert oh._strings_hold_nul(memoryview(packed)) == any(b"\0" in s for s in items), items


# ----------------------------------------------------------------------------- the streaming hash


def _write_like_llama_quant(path: Path, final: bytes, meta_size: int, chunk: int = 64 * 1024,
                            pause: float = 0.0) -> None:
    """What llama-quant does to its output: zeros for the header, the data front to back, then
    the header at offset 0 (flushed chunk by chunk so a follower sees the file grow)."""
    with open(path, "wb") as f:
        f.write(bytes(meta_size))
        f.flush()
        for pos in range(meta_size, len(final), chunk):
            f.write(final[pos:pos + chunk])
            f.flush()
            if pause:
                time.sleep(pause)
        f.seek(0)
        f.write(final[:meta_size])


@pytest.fixture(scope="module")
def quantized(synth_model, tmp_path_factory):
    """A real quantization (bytes) and its prediction."""
    model = synth_model("tiny-qwen35moe")
    plan = make_plan(model, "q4_k_m-mtp-q8")
    out = tmp_path_factory.mktemp("q") / "q.gguf"
    quantize(model, "q4_k_m-mtp-q8", out, plan=plan, progress=False)
    pred = build_output_header(model, plan)
    return {"model": model, "plan": plan, "bytes": out.read_bytes(), "pred": pred}


def _stream(tmp_path: Path, quantized, pred: PredictedHeader | None = None, pause: float = 0.0, **kw):
    path = tmp_path / "staged" / "out.gguf"
    path.parent.mkdir(exist_ok=True)
    pred = pred or quantized["pred"]
    h = StreamingOutputHash(path, pred, margin=kw.pop("margin", 4096), poll_seconds=0.005, **kw)
    w = threading.Thread(target=_write_like_llama_quant, args=(path, quantized["bytes"], quantized["pred"].meta_size),
                         kwargs={"pause": pause})
    w.start()
    return path, h, w


def test_stream_hash_of_a_concurrent_real_quantization(quantized, tmp_path):
    """Start the hasher, let libllama write the staged file meanwhile, finish: the digest is the file's."""
    staged = tmp_path / ".out.gguf.partial-1" / "out.gguf"
    staged.parent.mkdir()
    pred = quantized["pred"]
    h = StreamingOutputHash(staged, pred, margin=0, chunk_size=256 * 1024, poll_seconds=0.001)
    params = dataclasses.replace(quantized["plan"].params, nthread=1, dry_run=False)
    run = run_quantize_interruptible(str(quantized["model"]), str(staged), params)
    assert run.rc == 0 and run.exc is None
    res = h.finish()
    assert res.status == StreamStatus.VERIFIED, res.detail
    assert res.sha256 == hashlib.sha256(staged.read_bytes()).hexdigest()
    assert res.size == staged.stat().st_size == pred.file_size


def test_stream_hash_follows_the_file_while_it_grows(quantized, tmp_path):
    path, h, w = _stream(tmp_path, quantized, pause=0.002)
    w.join()
    data = quantized["pred"].data_size
    deadline = time.monotonic() + 5
    while h.read_bytes < data - 4096 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert h.read_bytes >= data - 4096, "nothing was hashed before the writer finished"
    res = h.finish()
    assert res.ok and res.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert res.read_bytes <= data + quantized["pred"].meta_size  # the data once, the header once to compare


def test_stream_hash_detects_a_one_byte_header_difference(quantized, tmp_path):
    good = quantized["pred"]
    flipped = bytearray(good.header)
    flipped[len(flipped) // 2] ^= 0x01
    path, h, w = _stream(tmp_path, quantized, pred=dataclasses.replace(good, header=bytes(flipped)))
    w.join()
    res = h.finish()
    assert res.status == StreamStatus.HEADER_MISMATCH and res.sha256 is None
    assert str(len(flipped) // 2) in res.detail


@pytest.mark.parametrize("delta", [-32, 32])
def test_stream_hash_detects_a_wrong_predicted_size(delta, quantized, tmp_path):
    good = quantized["pred"]
    path, h, w = _stream(tmp_path, quantized, pred=dataclasses.replace(good, file_size=good.file_size + delta))
    w.join()
    res = h.finish()
    assert res.status == StreamStatus.SIZE_MISMATCH and res.sha256 is None


def _wait_until_reading(h: StreamingOutputHash) -> None:
    deadline = time.monotonic() + 5
    while h.read_bytes == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert h.read_bytes > 0


def test_stream_hash_detects_a_replaced_file(quantized, tmp_path):
    path, h, w = _stream(tmp_path, quantized)
    w.join()
    _wait_until_reading(h)  # it follows the first file (one opened after the swap would be a fine one)
    other = path.with_name("other")
    other.write_bytes(path.read_bytes())
    os.replace(other, path)
    res = h.finish()
    assert res.status == StreamStatus.REPLACED and res.sha256 is None


def test_stream_hash_refuses_a_preexisting_file(quantized, tmp_path):
    path = tmp_path / "out.gguf"
    path.write_bytes(quantized["bytes"])
    h = StreamingOutputHash(path, quantized["pred"])
    res = h.finish()
    assert res.status == StreamStatus.PREEXISTING and res.sha256 is None


def test_cancel_stops_the_thread(quantized, tmp_path):
    h = StreamingOutputHash(tmp_path / "never.gguf", quantized["pred"], poll_seconds=0.05)
    time.sleep(0.1)
    assert h.thread.is_alive()
    h.cancel()
    h.thread.join(2)
    assert not h.thread.is_alive()
    assert h.result().status == StreamStatus.CANCELLED and h.result().sha256 is None


def test_cancel_while_following(quantized, tmp_path):
    path, h, w = _stream(tmp_path, quantized, pause=0.01)
    time.sleep(0.05)
    h.cancel()
    h.thread.join(2)
    assert not h.thread.is_alive()
    w.join()
    assert h.result().status == StreamStatus.CANCELLED


def test_writer_that_never_wrote(quantized, tmp_path):
    h = StreamingOutputHash(tmp_path / "never.gguf", quantized["pred"], poll_seconds=0.01)
    res = h.finish()
    assert res.status == StreamStatus.ERROR and "never appeared" in res.detail
