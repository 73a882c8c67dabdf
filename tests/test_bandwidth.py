"""ggufmtp.bandwidth: active weight bytes per token, computed from the header, checked against
gguf-py's own reader (an independent implementation of the tensor sizes)."""

from __future__ import annotations

import gguf
import pytest

from ggufmtp.runtime.hardware import (
    PEAK_BANDWIDTH_ENV,
    BandwidthError,
    active_weights,
    bandwidth_report,
    format_bandwidth,
    peak_bandwidth,
)
from ggufmtp.synth.spec import SynthSpec


def _sizes(path):
    return {t.name: int(t.n_bytes) for t in gguf.GGUFReader(path).tensors}


def test_active_weights_of_a_moe_model(synth_model):
    spec = SynthSpec()
    path = synth_model(spec)
    sizes = _sizes(path)
    r = gguf.GGUFReader(path)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    val = (lambda k: int(r.fields[f"{arch}.{k}"].parts[-1][0]))  # noqa: E731 (a local one-liner)
    n_exp, n_used, blocks = val("expert_count"), val("expert_used_count"), val("block_count")
    mtp = blocks - 1
    experts = sum(n for k, n in sizes.items() if "_exps." in k and not k.startswith(f"blk.{mtp}."))
    dense = sum(n for k, n in sizes.items() if k.startswith("blk.") and "_exps." not in k
                and not k.startswith(f"blk.{mtp}."))
    dense += sizes["output_norm.weight"] + sizes.get("output.weight", 0)
    aw = active_weights(path)
    assert aw.trunk_layers == mtp and aw.expert_fraction == n_used / n_exp < 1
    assert aw.expert_bytes_total == experts and aw.dense_bytes == dense
    assert aw.bytes_per_token == int(dense + experts * n_used / n_exp)
    # the MTP block and the embedding lookup are not part of the trunk's per-token reads
    assert aw.bytes_per_token < sum(sizes.values()) - sizes["token_embd.weight"]


def test_peak_bandwidth_table_and_overrides(monkeypatch):
    monkeypatch.delenv(PEAK_BANDWIDTH_ENV, raising=False)
    assert peak_bandwidth("NVIDIA H200")[0] == 4800e9
    assert peak_bandwidth("NVIDIA H100 PCIe")[0] == 2000e9  # not the SXM figure
    assert peak_bandwidth("NVIDIA H100 80GB HBM3")[0] == 3350e9
    assert peak_bandwidth("NVIDIA GH200 480GB")[0] == 4000e9  # not the H200 figure
    assert peak_bandwidth("NVIDIA A100-SXM4-80GB")[0] == 2039e9
    assert peak_bandwidth("Some Future GPU") == (None, None) and peak_bandwidth(None) == (None, None)
    assert peak_bandwidth("NVIDIA H200", 1000) == (1000e9, "given")
    monkeypatch.setenv(PEAK_BANDWIDTH_ENV, "123.5")
    assert peak_bandwidth("NVIDIA H200") == (123.5e9, f"${PEAK_BANDWIDTH_ENV}")
    monkeypatch.setenv(PEAK_BANDWIDTH_ENV, "fast")
    with pytest.raises(BandwidthError, match=PEAK_BANDWIDTH_ENV):
        peak_bandwidth("NVIDIA H200")
    with pytest.raises(BandwidthError, match="must be positive"):
        peak_bandwidth(None, 0)


def test_report_fractions(synth_model, monkeypatch):
    monkeypatch.delenv(PEAK_BANDWIDTH_ENV, raising=False)
    path = synth_model(SynthSpec())
    gpu = {"gpu": "NVIDIA H200", "offloaded": True}
    b = bandwidth_report(path, gpu, {"vanilla": 100.0, "mtp": 150.0})
    per_tok = b["active_bytes_per_token"]
    assert b["limit_tokens_per_second"] == pytest.approx(4800e9 / per_tok)
    assert b["fraction_of_limit"]["vanilla"] == pytest.approx(100.0 * per_tok / 4800e9)
    assert b["fraction_of_limit"]["mtp"] == pytest.approx(1.5 * b["fraction_of_limit"]["vanilla"])
    assert "4.80 TB/s" in format_bandwidth(b) and "vendor specification for H200" in format_bandwidth(b)
    # a GPU present but not used: CPU memory is what is read, and its peak is unknown
    cpu = bandwidth_report(path, {"gpu": "NVIDIA H200", "offloaded": False}, {"vanilla": 100.0})
    assert cpu["limit_tokens_per_second"] is None and cpu["fraction_of_limit"]["vanilla"] is None
    assert "peak bandwidth unknown" in format_bandwidth(cpu)
