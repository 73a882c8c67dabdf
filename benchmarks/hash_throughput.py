#!/usr/bin/env python3
"""sha256 throughput of ggufmtp.files.hashing.sha256_file from page cache, against `sha256sum`
and the standard library's one-call ``hashlib.file_digest`` (#42: the library call where it fits).

    .venv/bin/python benchmarks/hash_throughput.py [--size-gb 2] [--runs 3]

Writes a temporary file of --size-gb, reads it once to warm the page cache, then times
interleaved runs of sha256_file, hashlib.file_digest and coreutils sha256sum; prints GB/s of each and
the median ratios (ours / sha256sum, ours / file_digest) last. Then what the Hub's check of a
regular (non-LFS) file needs, sha256 and the git blob sha1: ggufmtp's one pass
(``file_digests(git_blob=True)``) against two ``file_digest`` calls. Peak RSS of the Python process is printed too (bounded memory).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from ggufmtp.files.hashing import file_digests, sha256_file


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-gb", type=float, default=2.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where to write the scratch file (default: TMPDIR)")
    args = ap.parse_args()
    size = int(args.size_gb * 1e9)
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        path = Path(d) / "blob.bin"
        block = os.urandom(64 << 20)
        with open(path, "wb") as fh:
            left = size
            while left > 0:
                fh.write(block[: min(left, len(block))])
                left -= len(block)
        subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)  # warm the page cache
        ours, stdlib, theirs = [], [], []
        for _ in range(args.runs):
            t = time.perf_counter()
            digest = sha256_file(path)
            ours.append(time.perf_counter() - t)
            t = time.perf_counter()
            with open(path, "rb") as fh:
                assert hashlib.file_digest(fh, "sha256").hexdigest() == digest
            stdlib.append(time.perf_counter() - t)
            t = time.perf_counter()
            out = subprocess.run(["sha256sum", str(path)], capture_output=True, text=True, check=True).stdout
            theirs.append(time.perf_counter() - t)
            assert out.split()[0] == digest
        gb = size / 1e9
        print(f"file {gb:.2f} GB, {args.runs} interleaved runs each, page cache warm")
        print(f"ggufmtp sha256_file : median {gb / statistics.median(ours):.2f} GB/s  (runs: "
              + ", ".join(f"{gb / s:.2f}" for s in ours) + ")")
        print(f"hashlib.file_digest : median {gb / statistics.median(stdlib):.2f} GB/s  (runs: "
              + ", ".join(f"{gb / s:.2f}" for s in stdlib) + ")")
        print(f"coreutils sha256sum : median {gb / statistics.median(theirs):.2f} GB/s")
        print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
        print(f"ratio ours/sha256sum throughput: {statistics.median(theirs) / statistics.median(ours):.3f}")
        print(f"ratio ours/file_digest throughput: {statistics.median(stdlib) / statistics.median(ours):.3f}")
        both, twice = [], []
        for _ in range(args.runs):
            t = time.perf_counter()
            file_digests(path, git_blob=True)
            both.append(time.perf_counter() - t)
            t = time.perf_counter()
            with open(path, "rb") as fh:
                hashlib.file_digest(fh, "sha256")
            with open(path, "rb") as fh:  # git's blob id: sha1 of a header and the bytes, a second pass
                h = hashlib.sha1(b"blob %d\0" % size, usedforsecurity=False)
                hashlib.file_digest(fh, lambda h=h: h)
            twice.append(time.perf_counter() - t)
        print(f"sha256 + git blob sha1: ggufmtp one pass median {statistics.median(both):.2f} s, "
              f"file_digest twice {statistics.median(twice):.2f} s")


if __name__ == "__main__":
    main()
