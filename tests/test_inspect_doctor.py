"""inspect on synthesized models (complete, absent, incomplete, sidecar, split, corrupt); doctor."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from ggufmtp.cli import main
from ggufmtp.constants import LLAMA_CPP_COMMIT
from ggufmtp.gguf.model import inspect_model
from ggufmtp.synth.spec import SynthSpec
from ggufmtp.synth.writer import synthesize


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("inspect")
    out = {}
    for name, spec in {
        "complete": SynthSpec(),
        "absent": SynthSpec(mtp=False),
        "incomplete": SynthSpec(omit_tensors=("nextn.hnorm",)),
        "dense": SynthSpec(arch="qwen35"),
    }.items():
        out[name] = synthesize(d / f"{name}.gguf", spec, progress=False).path
    return out


def run_cli(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_complete_mtp_block(models):
    r = inspect_model(models["complete"])
    assert r.architecture == "qwen35moe"
    assert (r.block_count, r.trunk_layers, r.nextn_predict_layers, r.mtp_block) == (5, 4, 1, 4)
    assert r.mtp_status == "complete"
    assert r.mtp_tensors["blk.4.nextn.eh_proj.weight"] == "BF16"
    assert r.mtp_tensors["blk.4.nextn.enorm.weight"] == "F32"
    assert "blk.4.nextn.embed_tokens.weight" in r.mtp_fallbacks or "blk.4.nextn.embed_tokens.weight" in r.mtp_tensors
    assert r.file_type == "BF16"
    assert r.tensor_types["BF16"]["count"] > 0
    assert r.n_params > 0 and 15.5 < r.bpw < 16.5
    assert r.size_bytes == os.path.getsize(models["complete"])


def test_dense_variant_complete(models):
    r = inspect_model(models["dense"])
    assert r.architecture == "qwen35" and r.mtp_status == "complete"
    assert "blk.4.ffn_down.weight" in r.mtp_tensors


def test_absent_mtp(models):
    r = inspect_model(models["absent"])
    assert r.mtp_status == "absent" and r.mtp_block is None and r.nextn_predict_layers == 0


def test_incomplete_names_missing_tensor(models):
    r = inspect_model(models["incomplete"])
    assert r.mtp_status == "incomplete"
    assert r.mtp_missing == ["blk.4.nextn.hnorm.weight"]
    res = run_cli("inspect", str(models["incomplete"]))
    assert "INCOMPLETE" in res.output and "MISSING blk.4.nextn.hnorm.weight" in res.output


def test_inspect_json_keys(models):
    res = run_cli("inspect", str(models["complete"]), "--json")
    assert res.exit_code == 0
    d = json.loads(res.output)
    for key in ("architecture", "block_count", "nextn_predict_layers", "mtp_block", "mtp_status", "mtp_tensors",
                "file_type", "tensor_types", "n_params", "size_bytes", "bpw"):
        assert key in d, key
    assert d["tensor_types"]["F32"]["bytes"] > 0


def test_split_gguf_read_as_one_model(models, tmp_path):
    from gguf_copy import copy_gguf

    from ggufmtp.gguf.model import GGUFModel

    src = GGUFModel(models["complete"])
    shards = copy_gguf(models["complete"], tmp_path / "split.gguf", split_max_tensors=40)
    assert len(shards) == 3
    r = inspect_model(shards[1])
    assert r.mtp_status == "complete" and len(r.shards) == 3
    assert r.n_params == src.n_params
    shards[2].unlink()
    res = CliRunner().invoke(main, ["inspect", str(shards[0])])
    assert res.exit_code == 1 and "missing shard" in res.output


@pytest.mark.parametrize("content,needle", [
    (b"not a gguf at all", "not a GGUF file"),
    (b"", "not a GGUF file"),
])
def test_not_gguf_clear_error(tmp_path, content, needle):
    p = tmp_path / "bad.gguf"
    p.write_bytes(content)
    res = CliRunner().invoke(main, ["inspect", str(p)])
    assert res.exit_code == 1
    assert needle in res.output and str(p) in res.output
    assert "Traceback" not in res.output


def test_truncated_gguf_clear_error(models, tmp_path):
    data = models["complete"].read_bytes()
    for cut in (len(data) // 2, 200):
        p = tmp_path / f"trunc{cut}.gguf"
        p.write_bytes(data[:cut])
        proc = subprocess.run([sys.executable, "-m", "ggufmtp", "inspect", str(p)], capture_output=True, text=True)
        assert proc.returncode == 1
        err = proc.stderr.strip().splitlines()
        assert len(err) == 1 and str(p) in err[0] and ("truncated" in err[0] or "corrupt" in err[0]), err
        assert "Traceback" not in proc.stderr


def test_missing_file(tmp_path):
    res = CliRunner().invoke(main, ["inspect", str(tmp_path / "nope.gguf")])
    assert res.exit_code == 1 and "no such file" in res.output


@pytest.mark.runtime
def test_doctor_json_reports_pinned_commit_everywhere():
    proc = subprocess.run([sys.executable, "-m", "ggufmtp", "doctor", "--json"], capture_output=True, text=True)
    d = json.loads(proc.stdout)
    assert proc.returncode == 0, d.get("problems")
    assert d["ggufmtp_version"] and d["llama_cpp_commit"] == LLAMA_CPP_COMMIT
    for name in ("llama-server", "llama-quantize", "llama-imatrix"):
        assert d["binaries"][name]["commit"] == LLAMA_CPP_COMMIT, name
        assert os.path.isfile(d["binaries"][name]["path"])
    assert d["server_draft_mtp"] is True


def test_doctor_fails_with_advice_when_binary_missing(tmp_path):
    env = dict(os.environ, GGUFMTP_LLAMA_CPP_BIN=str(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "ggufmtp", "doctor"], capture_output=True, text=True, env=env)
    assert proc.returncode == 1
    assert "llama-server: not found" in proc.stdout and "ggufmtp runtime build" in proc.stdout


@pytest.mark.runtime
def test_binary_discovery_order(tmp_path, monkeypatch):
    from ggufmtp.runtime import build as runtime
    fake = tmp_path / "llama-server"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert runtime.find_binary("llama-server", tmp_path) == fake          # explicit option first
    monkeypatch.setenv(runtime.ENV_BIN, str(tmp_path))
    assert runtime.find_binary("llama-server") == fake                    # then the env var
    monkeypatch.delenv(runtime.ENV_BIN)
    assert runtime.find_binary("llama-server") != fake                    # then the cache / PATH


@pytest.mark.parametrize("arch,tensor,named", [("glm4moe", "ffn_gate_inp", "ffn_gate_inp"),
                                               ("glm4moe", "attn_q", "attn_qkv"),  # the fused tensor or its parts
                                               ("deepseek2", "attn_kv_a_mqa", "attn_kv_a_mqa"),
                                               ("deepseek2", "ffn_up_shexp", "ffn_up_shexp")])
def test_an_mtp_block_missing_a_tensor_its_graph_needs_is_incomplete(tmp_path, arch, tensor, named):
    """Per-architecture requirements (not the generic norm/attention/FFN check): a GLM or DeepSeek
    NextN block without a tensor its MTP graph loads is INCOMPLETE, naming the tensor."""
    res = synthesize(tmp_path / "m.gguf", SynthSpec(arch=arch, layers=2, omit_tensors=(tensor,)), progress=False)
    rep = inspect_model(res.path)
    assert rep.mtp_status == "incomplete"
    assert rep.mtp_missing == [f"blk.2.{named}.weight"]
