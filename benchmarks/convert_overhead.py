"""``ggufmtp convert`` versus the pinned converter run by hand, on the same synthetic checkpoint.

    .venv/bin/python benchmarks/convert_overhead.py [--layers 16] [--runs 3]

Writes a ``synth --format hf`` checkpoint (the synth model's weights, ``--layers`` trunk layers + 1 MTP
layer), then alternates, ``--runs`` times: the converter alone (``python -m ggufmtp.hfconvert.runner``:
the pinned convert_hf_to_gguf.py plus the synth tokenizer's hash) and ``ggufmtp convert`` (source read,
the same converter, GGUF check, sha256 of every source file, source record). Wall time and peak RSS
(GNU time's maximum resident set size: the largest process of the tree) of each; then the overhead
parts: ``pull --check-mtp`` against the local fake Hub, and ``audit --source`` (MTP block / --all).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed(cmd: list[str]) -> tuple[float, float]:
    t0 = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stderr[-2000:]}")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr).group(1)) / 1024
    return wall, rss


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from ggufmtp.hfconvert.convert import converter_tree
    from ggufmtp.synth.hf import synthesize_hf
    from ggufmtp.synth.spec import SynthSpec

    py, tree = sys.executable, str(converter_tree())
    with tempfile.TemporaryDirectory() as tmp:
        src, tmp = Path(tmp) / "ck", Path(tmp)
        ck = synthesize_hf(src, SynthSpec(layers=a.layers), shards=4)
        size = sum(p.stat().st_size for p in src.glob("*.safetensors"))
        rows = {"converter": [], "ggufmtp convert": []}
        parts = []
        for i in range(a.runs):
            rows["converter"].append(timed([py, "-m", "ggufmtp.hfconvert.runner", tree, str(src), "--outfile",
                                            str(tmp / f"hand{i}.gguf"), "--outtype", "bf16"]))
            out = tmp / f"g{i}.gguf"
            rows["ggufmtp convert"].append(timed([py, "-m", "ggufmtp", "convert", str(src), "-o", str(out), "--json"]))
            parts.append(json.loads(Path(str(out) + ".source.json").read_text()) and None)
        audit_mtp = timed([py, "-m", "ggufmtp", "audit", str(tmp / "g0.gguf"), "--source", str(src), "--json"])
        audit_all = timed([py, "-m", "ggufmtp", "audit", str(tmp / "g0.gguf"), "--source", str(src), "--all",
                           "--json"])
        check = _check_mtp_time(src)
        from ggufmtp.hfconvert.convert import convert

        split = convert(src, tmp / "split.gguf", progress=False).seconds
    print(f"checkpoint: {a.layers}+1 layers, {ck.n_tensors} tensors, {size / 1e6:.1f} MB in {len(ck.shards)} shards")
    for name, vals in rows.items():
        w = [v[0] for v in vals]
        m = [v[1] for v in vals]
        print(f"{name:16} wall {statistics.median(w):6.2f} s (min {min(w):.2f}, max {max(w):.2f})  "
              f"peak RSS {statistics.median(m):7.1f} MiB  (n={len(vals)})")
    print(f"ggufmtp convert split (one in-process run): {split}")
    print(f"pull --check-mtp (fake Hub, headers only): {check:.2f} s")
    print(f"audit --source (MTP block): {audit_mtp[0]:.2f} s, peak {audit_mtp[1]:.0f} MiB; "
          f"--all: {audit_all[0]:.2f} s, peak {audit_all[1]:.0f} MiB")


def _check_mtp_time(src: Path) -> float:
    sys.path.insert(0, str(ROOT / "tests"))
    from fakehub import FakeHub

    from ggufmtp.hfconvert.remote import check_remote_mtp

    with FakeHub() as fh:
        fh.create_repo("me/ck")
        fh.commit("me/ck", {p.name: p.read_bytes() for p in src.iterdir()})
        t0 = time.perf_counter()
        check_remote_mtp("me/ck", endpoint=fh.url)
        return time.perf_counter() - t0


if __name__ == "__main__":
    main()
