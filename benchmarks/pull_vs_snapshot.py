#!/usr/bin/env python3
"""``ggufmtp.hub.pull.pull`` against huggingface_hub's own calls for the same job (#42 item 6):
``snapshot_download(allow_patterns=...)`` then ``HfApi.verify_repo_checksums``.

    .venv/bin/python benchmarks/pull_vs_snapshot.py [--files 4] [--mb 256] [--runs 3]

Both pull the same selection (``--files`` LFS safetensors shards of ``--mb`` MB and a config.json,
not the repo's other file) pinned to one commit from the local Hub-protocol server of the tests
(``tests/fakehub.py``, plain HTTP and LFS on 127.0.0.1) into a fresh folder, interleaved, and both
check every pulled byte against the Hub's checksums (ggufmtp hashes file i while file i+1
downloads; the library's pair downloads with 8 threads, then hashes everything again in series).
Prints the wall time of each run and the medians. Nothing leaves the machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HOME = Path(tempfile.mkdtemp(prefix="pull-bench-"))
# huggingface_hub reads these at import: a private home, no token, LFS only (the fake speaks no Xet)
os.environ.update(HF_HOME=str(HOME), HF_HUB_DISABLE_XET="1", HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_OFFLINE="0")
for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_ENDPOINT"):
    os.environ.pop(var, None)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from fakehub import FakeHub  # noqa: E402
from huggingface_hub import HfApi, snapshot_download  # noqa: E402

from ggufmtp.hub.pull import pull  # noqa: E402

REPO = "me/bench"
INCLUDE = ["*.safetensors", "*.json"]


def _ggufmtp(url: str, dest: Path) -> None:
    res = pull(REPO, include=INCLUDE, local_dir=dest, endpoint=url, progress=False)
    assert all(f.verified for f in res.files)


def _library(url: str, dest: Path, commit: str) -> None:
    snapshot_download(REPO, revision=commit, allow_patterns=INCLUDE, local_dir=dest, endpoint=url)
    v = HfApi(endpoint=url).verify_repo_checksums(REPO, revision=commit, local_dir=dest)
    assert not v.mismatches and not v.extra_paths and set(v.missing_paths) == {"other.bin", ".gitattributes"}, v


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    block = os.urandom(1 << 20)
    files = {f"model-{i:05d}-of-{args.files:05d}.safetensors": block * args.mb + bytes([i])
             for i in range(1, args.files + 1)}
    files |= {"config.json": b'{"architectures": ["X"]}\n', "other.bin": block}
    times: dict[str, list[float]] = {"ggufmtp pull": [], "snapshot_download + verify_repo_checksums": []}
    try:
        with FakeHub() as hub:
            hub.create_repo(REPO)
            hub.commit(REPO, files)
            commit = hub.head(REPO)
            for run in range(args.runs):
                for name in times:
                    dest = HOME / f"{run}-{len(name)}"
                    t = time.perf_counter()
                    if name == "ggufmtp pull":
                        _ggufmtp(hub.url, dest)
                    else:
                        _library(hub.url, dest, commit)
                    times[name].append(time.perf_counter() - t)
                    shutil.rmtree(dest)
                    shutil.rmtree(HOME / "hub", ignore_errors=True)
    finally:
        shutil.rmtree(HOME, ignore_errors=True)
    total = sum(len(b) for n, b in files.items() if n != "other.bin") / 1e6
    print(f"{args.files} x {args.mb} MB LFS shards + config.json ({total:.0f} MB), {args.runs} interleaved runs")
    for name, ts in times.items():
        print(f"{name:42s} median {statistics.median(ts):6.2f} s  (runs: {', '.join(f'{t:.2f}' for t in ts)})")


if __name__ == "__main__":
    main()
