"""The local digest cache (issue #22): reused only for the very file it hashed, unchanged; the
receipt's digests are the bytes on disk; quantize's stage breakdown."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from fs_clock import past_the_ctime_of

from ggufmtp.cli import main
from ggufmtp.files.digest_cache import RACY_COARSE_NS, RACY_NS, DigestCache, racy_window
from ggufmtp.files.hashing import file_digests, sha256_cached
from ggufmtp.gguf.model import GGUFModel
from ggufmtp.provenance.audit import audit
from ggufmtp.provenance.receipt import load_receipt, receipt_for_quantize
from ggufmtp.quant.quantize import input_digest_cache, quantize

STAGES = {"plan", "predict_header", "quantize", "fsync", "audit", "hash_input", "hash_output", "receipt", "publish"}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _settled(path: Path) -> None:
    """Wait out the racy window: a file changed within RACY_NS of its hash is not recorded."""
    time.sleep(RACY_NS / 1e9 + 0.05)


@pytest.fixture()
def blob(tmp_path) -> Path:
    p = tmp_path / "blob.bin"
    p.write_bytes(os.urandom(3 * 1024 * 1024 + 17))
    _settled(p)
    return p


def test_read_ahead_hash_is_the_bytes_and_stops_its_thread(tmp_path):
    """The pipelined reader (a thread one or two chunks ahead) yields the file's bytes in order, for
    sizes around the chunk boundaries; a consumer that stops early leaves no thread behind."""
    import threading

    chunk = 1024 * 1024
    for size in (0, 1, chunk - 1, chunk, chunk + 1, 5 * chunk + 3):
        p = tmp_path / f"f{size}.bin"
        data = os.urandom(size)
        p.write_bytes(data)
        got = file_digests(p, git_blob=True, chunk_size=chunk)
        assert (got.size, got.sha256) == (size, hashlib.sha256(data).hexdigest()), size
        assert got.git_sha1 == hashlib.sha1(b"blob %d\0" % size + data).hexdigest()

    class Stop(Exception):
        pass

    def stop(_n):
        raise Stop

    before = threading.active_count()
    with pytest.raises(Stop):
        file_digests(tmp_path / f"f{5 * chunk + 3}.bin", chunk_size=chunk, on_chunk=stop)
    assert threading.active_count() == before


def test_hit_only_for_the_file_it_hashed(blob, tmp_path):
    cache = DigestCache(tmp_path / "c")
    assert cache.lookup(blob) is None  # never hashed: not trusted
    digest, cached = sha256_cached(blob, cache)
    assert (digest, cached) == (_sha(blob), False)
    assert sha256_cached(blob, cache) == (_sha(blob), True)
    # the same bytes in another file (another inode), even with the same mtime: not trusted
    twin = tmp_path / "twin.bin"
    shutil.copyfile(blob, twin)
    st = blob.stat()
    os.utime(twin, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert cache.lookup(twin) is None
    # a file renamed over it (new inode, same size and mtime) is another file
    os.replace(twin, blob)
    assert cache.lookup(blob) is None


def test_one_byte_edit_with_size_and_mtime_restored_misses(blob, tmp_path):
    cache = DigestCache(tmp_path / "c")
    old, _ = sha256_cached(blob, cache)
    assert cache.lookup(blob) == old
    st = blob.stat()
    past_the_ctime_of(blob)  # the edit lands in a later tick of the file system's clock
    with open(blob, "r+b") as f:  # one byte, same size
        f.seek(1234567)
        b = f.read(1)
        f.seek(1234567)
        f.write(bytes([b[0] ^ 0xFF]))
    os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns))  # `touch -d` back
    now = blob.stat()
    assert (now.st_size, now.st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert now.st_ctime_ns != st.st_ctime_ns  # the kernel moved ctime: that is what the key relies on
    assert cache.lookup(blob) is None
    _settled(blob)
    new, cached = sha256_cached(blob, cache)
    assert not cached and new == _sha(blob) != old


def test_racy_or_changing_file_is_not_recorded(tmp_path):
    cache = DigestCache(tmp_path / "c")
    p = tmp_path / "fresh.bin"
    p.write_bytes(b"x" * 4096)
    file_digests(p, cache=cache)  # changed just now: the key may not yet show a write in the same tick
    assert cache.lookup(p) is None
    _settled(p)
    grow = []

    def append(n: int) -> None:  # the file changes while it is read
        if not grow:
            grow.append(n)
            with open(p, "ab") as f:
                f.write(b"y")

    file_digests(p, cache=cache, on_chunk=append)
    assert cache.lookup(p) is None


def _stamped(st: os.stat_result, ns: int) -> os.stat_result:
    """``st`` with atime, mtime and ctime all ``ns`` (as a file system of that granularity stamps)."""
    return os.stat_result([*st[:10], ns / 1e9, ns / 1e9, ns / 1e9, ns, ns, ns])


def test_a_whole_second_file_system_gets_a_whole_tick_of_racy_window(tmp_path):
    """Found on an ext4 with 128-byte inodes (whole-second stamps): a file written, hashed 0.3 s
    later and written again in the same second kept its key, so the stale digest was served. A key
    whose stamps both fall on a whole second waits out 2 s (FAT's tick); a fine one 100 ms."""
    cache = DigestCache(tmp_path / "c")
    p = tmp_path / "coarse.bin"
    p.write_bytes(b"x" * 4096)
    st = p.stat()
    second = (time.time_ns() - 500_000_000) // 10**9 * 10**9  # a whole second 0.5-1.5 s ago
    coarse = _stamped(st, second)
    assert racy_window(coarse) == RACY_COARSE_NS and racy_window(_stamped(st, second + 1)) == RACY_NS
    assert not cache.record(p, "0" * 64, coarse, coarse)  # inside the coarse tick, past 100 ms
    old = _stamped(st, second - 3 * 10**9)
    assert cache.record(p, "0" * 64, old, old)  # 3 s: past it
    fine = _stamped(st, time.time_ns() - 500_000_000 + 1)  # 0.5 s, fine stamps: past 100 ms
    assert cache.record(p, "1" * 64, fine, fine)


def test_damaged_cache_is_empty(blob, tmp_path):
    cache = DigestCache(tmp_path / "c")
    sha256_cached(blob, cache)
    cache.path.write_text("{not json")
    assert cache.lookup(blob) is None
    assert sha256_cached(blob, cache) == (_sha(blob), False)


# ---------------------------------------------------------------------------- with the runtime


@pytest.fixture()
def model(tiny_mtp_model, tmp_path) -> Path:
    m = tmp_path / "in.gguf"
    shutil.copyfile(tiny_mtp_model, m)
    _settled(m)
    return m


def _flip_data_bit(path: Path) -> None:
    """Flip the lowest mantissa bit of a tensor's first element (stays finite), keeping size and mtime."""
    gm = GGUFModel(path)
    name = next(n for n, t in gm.tensors.items() if t.type in ("BF16", "F32"))
    st = path.stat()
    past_the_ctime_of(path)  # an edit after the last hash, in a later tick of the file system's clock
    with open(path, "r+b") as f:
        f.seek(gm.tensor_data_offsets[name])
        b = f.read(1)
        f.seek(gm.tensor_data_offsets[name])
        f.write(bytes([b[0] ^ 0x01]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _quantize_with_receipt(model: Path, out: Path):
    receipt = out.with_name(out.name + ".receipt.json")
    res = quantize(model, "q8_0-mtp", out, progress=False,
                   before_publish=lambda staged: receipt_for_quantize(staged, receipt_path=receipt))
    return res, receipt


@pytest.mark.runtime
def test_receipt_digests_are_the_bytes_and_the_cache_is_not_fooled(model, tmp_path):
    res, receipt = _quantize_with_receipt(model, tmp_path / "a.gguf")
    st = load_receipt(receipt)
    assert st["subject"][0]["digest"]["sha256"] == _sha(tmp_path / "a.gguf") == res.output_sha256
    assert st["predicate"]["base_model"]["files"][0]["sha256"] == _sha(model)
    assert input_digest_cache().lookup(model) == _sha(model)  # recorded by quantize's own hash
    # a second quantize reuses it: the input is not read again
    res2, _ = _quantize_with_receipt(model, tmp_path / "b.gguf")
    # the cache file only (it grows with the session's entries), not the input again
    assert res2.stages.stages["hash_input"].read_mib < model.stat().st_size / 2**20 / 4
    # an edit that keeps size and mtime: the receipt names the new bytes, not the cached digest
    _flip_data_bit(model)
    res3, receipt3 = _quantize_with_receipt(model, tmp_path / "c.gguf")
    assert res3.stages.stages["hash_input"].read_mib >= model.stat().st_size / 2**20
    assert load_receipt(receipt3)["predicate"]["base_model"]["files"][0]["sha256"] == _sha(model) != \
        load_receipt(receipt)["predicate"]["base_model"]["files"][0]["sha256"]
    # the auditor re-reads the artifact: one flipped byte fails
    assert audit(tmp_path / "c.gguf", receipt3).ok
    _flip_data_bit(tmp_path / "c.gguf")
    assert not audit(tmp_path / "c.gguf", receipt3).ok


@pytest.mark.runtime
def test_quantize_json_stage_breakdown(model, tmp_path):
    out = tmp_path / "s.gguf"
    t0 = time.perf_counter()
    r = CliRunner().invoke(main, ["quantize", str(model), "--recipe", "q8_0-mtp", "-o", str(out), "--json"])
    wall = time.perf_counter() - t0
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    stages = d["stages"]
    assert STAGES <= set(stages)
    assert d["sha256"] == _sha(out)
    assert d["output_hashed"] == "streamed"  # while libllama wrote it: its header was predicted
    for name in STAGES:
        s = stages[name]
        assert s["seconds"] >= 0 and 0 <= s["waited"] <= s["seconds"] + 0.05 and s["peak_rss_mib"] > 0
    critical = stages["critical_path_seconds"]
    assert critical == pytest.approx(sum(stages[n]["waited"] for n in STAGES), abs=0.01)
    assert stages["quantize"]["seconds"] <= critical <= wall
    size_mib = out.stat().st_size / 2**20
    # the audit reads the header, not the tensor data; hashing the output reads it all, once
    assert stages["audit"]["read_mib"] + stages["audit"]["mapped_mib"] < size_mib / 2
    # (plus the digest cache's own JSON, read to look up and to record the output's entry)
    cache_mib = input_digest_cache().path.stat().st_size / 2**20 if input_digest_cache().path.exists() else 0
    assert size_mib * 0.99 <= stages["hash_output"]["read_mib"] <= size_mib * 1.01 + 2 * cache_mib
    # --no-receipt hashes nothing
    r = CliRunner().invoke(main, ["quantize", str(model), "--recipe", "q8_0-mtp", "-o", str(tmp_path / "n.gguf"),
                                  "--no-receipt", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["sha256"] is None and not {"predict_header", "hash_input", "hash_output", "receipt"} & set(d["stages"])


def _quantize_json(model: Path, out: Path) -> dict:
    r = CliRunner().invoke(main, ["quantize", str(model), "--recipe", "q8_0-mtp", "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_a_wrong_header_prediction_falls_back_to_the_bytes(model, tmp_path, monkeypatch):
    """The streamed digest is only used when the finished file's header is the predicted one: a
    prediction one byte off (or none at all) is caught and the output is hashed after the write;
    the receipt's digest is the file's either way."""
    import dataclasses

    from ggufmtp.quant import quantize as qmod

    real = qmod.predict_output_header

    def off_by_one_byte(*a, **k):
        p = real(*a, **k)
        flipped = bytearray(p.header)
        flipped[len(flipped) // 2] ^= 0x01
        return dataclasses.replace(p, header=bytes(flipped))

    monkeypatch.setattr(qmod, "predict_output_header", off_by_one_byte)
    d = _quantize_json(model, tmp_path / "a.gguf")
    assert d["output_hashed"].startswith("after the write (stream header-mismatch")
    assert d["sha256"] == _sha(tmp_path / "a.gguf")
    assert load_receipt(tmp_path / "a.gguf.receipt.json")["subject"][0]["digest"]["sha256"] == d["sha256"]
    monkeypatch.setattr(qmod, "predict_output_header", lambda *a, **k: None)
    d = _quantize_json(model, tmp_path / "b.gguf")
    assert d["output_hashed"] == "after the write (header not predicted)" and d["sha256"] == _sha(tmp_path / "b.gguf")


def test_the_streamed_output_digest_is_known_to_the_cache_after_publishing(model, tmp_path, monkeypatch):
    """eval (or run --eval) after quantize does not read the output again: the streamed digest is
    recorded before the rename and follows it (the racy window is waived for this small file)."""
    monkeypatch.setattr("ggufmtp.files.digest_cache.RACY_NS", 0)
    out = tmp_path / "c.gguf"
    d = _quantize_json(model, out)
    assert d["output_hashed"] == "streamed"
    assert input_digest_cache().lookup(out) == d["sha256"] == _sha(out)
    past_the_ctime_of(out)  # later: an edit in the same timestamp tick is the racy window waived above
    with open(out, "r+b") as f:  # and a later edit is not covered by it
        f.seek(-1, os.SEEK_END)
        f.write(b"\x01")
    assert input_digest_cache().lookup(out) is None


# ---------------------------------------------------------------------------- pull records verified digests


@pytest.fixture()
def hub(tmp_path, monkeypatch):
    from fakehub import FakeHub, isolate_hf_client

    isolate_hf_client(tmp_path / "hf_home", monkeypatch)
    monkeypatch.setenv("GGUFMTP_CACHE", str(tmp_path / "ggufmtp-cache"))  # pull needs no runtime
    # a download is hashed milliseconds after it lands: let this test's small files count as settled
    monkeypatch.setattr("ggufmtp.files.digest_cache.RACY_NS", 0)
    with FakeHub() as fh:
        yield fh


def test_pull_records_only_verified_downloads(hub, tmp_path):
    from ggufmtp.errors import HubDigestMismatchError
    from ggufmtp.hub.pull import pull
    from ggufmtp.runtime.build import cache_root

    data = b"GGUF" + os.urandom(2 * 1024 * 1024)
    hub.commit("org/m", {"model.gguf": data})
    res = pull("org/m", local_dir=tmp_path / "dl", endpoint=hub.url, progress=False)
    cache = DigestCache.under(cache_root())
    assert cache.lookup(res.model_path) == hashlib.sha256(data).hexdigest()

    hub.commit("org/bad", {"model.gguf": data})
    bad = hub.serve_corrupted("org/bad", "model.gguf")
    with pytest.raises(HubDigestMismatchError):
        pull("org/bad", local_dir=tmp_path / "bad", endpoint=hub.url, progress=False)
    # a download that failed verification is not recorded
    recorded = {e["sha256"] for e in json.loads(cache.path.read_text())["entries"].values()}
    assert hashlib.sha256(data).hexdigest() in recorded and hashlib.sha256(bad).hexdigest() not in recorded


def test_verify_reuses_the_recorded_digest_of_the_very_file_it_serves(blob, tmp_path, monkeypatch):
    """A ladder verified every variant against its BF16 reference and hashed the reference again
    each time (21.6 GB: ~15 s of a core per variant). The file verify is about to serve takes the
    digest recorded for it, unchanged; an edit (size and mtime restored) is hashed again."""
    from ggufmtp.measure.core.records import ServedFile

    monkeypatch.setenv("GGUFMTP_CACHE", str(tmp_path / "ggufmtp-cache"))
    cache = input_digest_cache()
    st = blob.stat()
    forged = "f" * 64  # a digest the bytes do not have: returned only if the cache is consulted
    assert cache.record(blob, forged, st, blob.stat())
    assert ServedFile.of(blob).sha256 == forged
    past_the_ctime_of(blob)
    with open(blob, "r+b") as f:
        f.write(b"\0")
    os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns))
    _settled(blob)
    assert ServedFile.of(blob).sha256 == _sha(blob)
