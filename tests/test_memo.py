"""The cache's small facts (issue #19's eval overhead, #22's output digest): the JSON memo, the
binary version asked once per binary file, the output digest carried across quantize's rename, and
a missing llama-cpp-python as one clear error."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

from fs_clock import past_the_ctime_of

from ggufmtp.files.digest_cache import RACY_NS, DigestCache
from ggufmtp.files.hashing import file_digests
from ggufmtp.files.memo import JsonMemo
from ggufmtp.runtime.build import binary_version

REPO = Path(__file__).resolve().parents[1]


def test_memo_keeps_the_newest_entries_and_reads_damage_as_empty(tmp_path):
    memo = JsonMemo(tmp_path / "m.json", max_entries=3)
    for i in range(5):
        assert memo.put(f"k{i}", i)
    memo.put("k2", 22)  # stored again: now the newest
    assert [memo.get(f"k{i}") for i in range(5)] == [None, None, 22, 3, 4]
    assert memo.pop("k3") == 3 and memo.pop("k3") is None
    (tmp_path / "m.json").write_text("{not json")
    assert memo.get("k4") is None
    (tmp_path / "m.json").write_text(json.dumps({"version": 2, "entries": {"k4": 4}}))
    assert memo.get("k4") is None  # another version's file is not this one's


def _fake_binary(path: Path, calls: Path, commit: str | None) -> Path:
    line = f"version: 1 (build 7, commit {commit})" if commit else "no version here"
    path.write_text(f"#!/bin/sh\necho x >> '{calls}'\necho '{line}' >&2\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _calls(calls: Path) -> int:
    return len(calls.read_text().splitlines()) if calls.exists() else 0


def test_binary_version_is_asked_once_per_binary_file(tmp_path, monkeypatch):
    """A CUDA binary initializes the GPU to print --version: asked once, again only when the file
    changes (rebuilt: new mtime/ctime), never remembered when it printed no commit."""
    monkeypatch.setenv("GGUFMTP_CACHE", str(tmp_path / "cache"))
    calls = tmp_path / "calls"
    b = _fake_binary(tmp_path / "llama-perplexity", calls, "abc1234")
    assert binary_version(b)["commit"] == "abc1234" and _calls(calls) == 1
    assert binary_version(b)["commit"] == "abc1234" and _calls(calls) == 1
    past_the_ctime_of(b)  # a rebuild stamps a later ctime (same size: the key's ctime is what changes)
    _fake_binary(b, calls, "def5678")  # rebuilt in place
    assert binary_version(b)["commit"] == "def5678" and _calls(calls) == 2
    n = tmp_path / "no-commit"
    _fake_binary(n, calls, None)
    assert binary_version(n)["commit"] is None and binary_version(n)["commit"] is None
    assert _calls(calls) == 2 + 2 * 2  # asked each time (--version, then the llama-quantize probe)


def _hashed(path: Path, cache: DigestCache) -> str:
    time.sleep(RACY_NS / 1e9 + 0.05)  # past the racy window, as a real output is by the time it is hashed
    return file_digests(path, cache=cache).sha256


def test_output_digest_follows_the_publishing_rename_only(tmp_path):
    """quantize hashes its staged output, then renames it into place (which sets ctime): the entry
    moves with the rename; an edit before the rename (mtime set back) or a copy does not carry it."""
    cache = DigestCache(tmp_path / "digests")
    staged, out = tmp_path / "partial" / "q.gguf", tmp_path / "q.gguf"
    staged.parent.mkdir()
    staged.write_bytes(os.urandom(1 << 20))
    sha = _hashed(staged, cache)
    assert cache.lookup(staged) == sha
    before = staged.stat()
    past_the_ctime_of(staged)
    os.replace(staged, out)
    if out.stat().st_ctime_ns != before.st_ctime_ns:  # rename sets ctime here: the key changed
        assert cache.lookup(out) is None
    assert cache.follow_rename(before, out) and cache.lookup(out) == sha == hashlib.sha256(out.read_bytes()).hexdigest()

    staged.write_bytes(os.urandom(1 << 20))
    _hashed(staged, cache)
    st = staged.stat()
    past_the_ctime_of(staged)  # an edit in the hash's own timestamp tick is the racy case, not this one
    with open(staged, "r+b") as f:  # one byte changed after the hash, mtime restored
        f.write(b"\0")
    os.utime(staged, ns=(st.st_atime_ns, st.st_mtime_ns))
    edited = staged.stat()
    os.replace(staged, out)
    assert not cache.follow_rename(edited, out) and cache.lookup(out) is None

    staged.write_bytes(os.urandom(1 << 20))
    _hashed(staged, cache)
    copied = staged.stat()
    shutil.copy2(staged, out)  # another inode with the same bytes: not the file that was hashed
    assert not cache.follow_rename(copied, out) and cache.lookup(out) is None


def test_missing_llama_cpp_python_is_one_clear_error(tmp_path):
    """Without llama-cpp-python (a machine where it did not install), a command that needs libllama
    says so in one line: no traceback, nothing written."""
    shadow = tmp_path / "shadow" / "llama_cpp"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError(\"No module named 'llama_cpp'\")\n")
    env = {**os.environ, "PYTHONPATH": f"{shadow.parent}{os.pathsep}{REPO}"}
    model = tmp_path / "m.gguf"
    out = tmp_path / "q.gguf"
    r = subprocess.run([sys.executable, "-m", "ggufmtp", "synth", str(model), "--arch", "qwen35moe"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-m", "ggufmtp", "quantize", str(model), "-r", "hifi-q4_k_m-mtp", "-o", str(out)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert "llama-cpp-python is not importable" in r.stderr
    assert not out.exists() and not list(tmp_path.glob(".q.gguf*"))


def _store_many(path: str, prefix: str, n: int) -> None:
    from ggufmtp.files.memo import JsonMemo

    memo = JsonMemo(path)
    for i in range(n):
        memo.put(f"{prefix}{i}", i)


def test_two_processes_storing_at_once_keep_every_entry(tmp_path):
    """#32: the memo's read-modify-write is locked between processes (it lost entries before)."""
    import multiprocessing

    from ggufmtp.files.memo import JsonMemo

    path = str(tmp_path / "memo.json")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_store_many, args=(path, p, 60)) for p in ("a", "b", "c")]
    for pr in procs:
        pr.start()
    for pr in procs:
        pr.join(120)
        assert pr.exitcode == 0
    memo = JsonMemo(path)
    assert all(memo.get(f"{p}{i}") == i for p in ("a", "b", "c") for i in range(60))
