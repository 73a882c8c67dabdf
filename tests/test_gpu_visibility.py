"""The memory plan sees the GPUs the servers will see (#49 item 6, found on nvidia-h200-x2): a process
pinned with CUDA_VISIBLE_DEVICES (a ladder's Dask worker, a user's `CUDA_VISIBLE_DEVICES=0 ggufmtp
verify`) starts llama-servers that see that card alone, yet the plan spread the servers over every
card nvidia-smi lists and said "fits" against both cards' free memory.

nvidia-smi is not on this machine, so a stand-in prints what the pinned driver's nvidia-smi printed
there for this query (2 x H200, the second half-used); the code under test is ggufmtp's reading of it."""

from __future__ import annotations

import os
import stat

import pytest

from ggufmtp.runtime.hardware import nvidia_gpus, visible_gpus
from ggufmtp.runtime.memory import MIB, gpu_free

ROWS = [("0", "GPU-4c06f86d-fb4f-a342-9b2d-d92451c0eb45", "a"), ("1", "GPU-020682c2-7896-cf68-2517-c937a087f87e", "b")]


@pytest.mark.parametrize(("cvd", "seen"), [
    (None, ["a", "b"]), ("1", ["b"]), ("1,0", ["b", "a"]), ("GPU-0206", ["b"]), ("", []), ("-1", []),
    ("0,7,1", ["a"]),  # CUDA stops at the first entry that names no device
    ("0,0,1", ["a"]),  # ... or one already named
    ("GPU-", []),  # a prefix of both names neither
])
def test_cuda_visible_devices_is_read_as_cuda_reads_it(cvd, seen):
    assert visible_gpus(ROWS, cvd) == seen


@pytest.fixture
def two_h200(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\n"
                   "echo '0, GPU-4c06f86d-fb4f-a342-9b2d-d92451c0eb45, NVIDIA H200, 143771, 143165, 580.159.04'\n"
                   "echo '1, GPU-020682c2-7896-cf68-2517-c937a087f87e, NVIDIA H200, 143771, 92774, 580.159.04'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def test_a_pinned_process_plans_against_its_own_card_alone(two_h200):
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "GGUFMTP_GPU_FREE_MIB")}
    assert gpu_free(env) == ((143165 * MIB, 92774 * MIB), "nvidia-smi")
    assert gpu_free({**env, "CUDA_VISIBLE_DEVICES": "1"}) == ((92774 * MIB,), "nvidia-smi")
    assert gpu_free({**env, "CUDA_VISIBLE_DEVICES": ""}) == (None, "no GPU found")
    gpus = nvidia_gpus({**env, "CUDA_VISIBLE_DEVICES": "1"})
    assert [(g.name, g.memory, g.free_mib) for g in gpus] == [("NVIDIA H200", "143771 MiB", 92774)]
