"""From a GLM-4.5 safetensors checkpoint: ``synth --format hf --arch glm4moe`` -> ``convert`` (the pinned
``convert_hf_to_gguf.py``, ``Glm4MoeModel``) -> the GGUF ``synth --arch glm4moe`` writes -> llama-server
drafts with its NextN block.

A GLM-4.5 checkpoint keeps its MTP head as the decoder layer after the trunk
(``model.layers.<num_hidden_layers>.*`` with ``eh_proj``, ``enorm``, ``hnorm``, ``embed_tokens``,
``shared_head.head`` / ``shared_head.norm``) and counts it in ``num_nextn_predict_layers``; no
``mtp.*`` tensors. The converter runs for real (a subprocess with the pinned gguf-py); the checkpoint
holds the synth GGUF's own weights, so the converted file must be that GGUF tensor for tensor, byte
for byte, and draft exactly as :func:`~ggufmtp.synth.chain.simulate_acceptance` says.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

pytest.importorskip("torch", reason="the convert extra (pip install 'ggufmtp[convert]')")

from ggufmtp.cli import main  # noqa: E402
from ggufmtp.gguf.model import GGUFModel, MTPStatus, check_mtp, inspect_model, tensor_array  # noqa: E402
from ggufmtp.hfconvert.convert import convert  # noqa: E402
from ggufmtp.hfconvert.source import read_checkpoint  # noqa: E402
from ggufmtp.runtime.server import LlamaServer, ServerConfig, require_drafting  # noqa: E402
from ggufmtp.synth.chain import predict_tokens, simulate_acceptance  # noqa: E402
from ggufmtp.synth.hf import INDEX_NAME, synthesize_hf  # noqa: E402
from ggufmtp.synth.spec import SynthSpec  # noqa: E402
from ggufmtp.synth.tokenizer import build_vocab  # noqa: E402
from ggufmtp.synth.writer import synthesize  # noqa: E402

# a leading dense block (model.layers.0), a MoE block (model.layers.1), the NextN layer model.layers.2
SPEC = SynthSpec(arch="glm4moe", layers=2)
SPEC_F50 = dataclasses.replace(SPEC, wrong_successor_fraction=0.5)  # the wrong rows ride in embed_tokens
# GLM-4.6's NextN layer: no embed_tokens / shared_head.head (llama.cpp falls back to the trunk's)
SPEC_GLM46 = dataclasses.replace(SPEC, omit_tensors=("nextn.embed_tokens", "nextn.shared_head_head"))
NEXTN = ("eh_proj.weight", "enorm.weight", "hnorm.weight", "embed_tokens.weight", "shared_head.head.weight",
         "shared_head.norm.weight")
PROMPTS = ["Tell me about the sea.", "How do I bake bread?", "What is a computer program?"]
N_TOKENS, K = 48, 3


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """The three checkpoints; the f=0 one through the CLI (``synth OUT --format hf --arch glm4moe``)."""
    root = tmp_path_factory.mktemp("glm-hf")
    r = CliRunner().invoke(main, ["synth", str(root / "f0"), "--format", "hf", "--arch", "glm4moe",
                                  "--layers", "2", "--json"])
    assert r.exit_code == 0, r.output
    synthesize_hf(root / "f50", SPEC_F50)
    synthesize_hf(root / "glm46", SPEC_GLM46)
    return {"f0": root / "f0", "f50": root / "f50", "glm46": root / "glm46"}


@pytest.fixture(scope="module")
def converted(checkpoints, tmp_path_factory, llama_runtime) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("glm-conv")
    paths = {k: out / f"{k}-bf16.gguf" for k in checkpoints}
    for k, d in checkpoints.items():
        res = convert(d, paths[k], progress=False)
        assert (res.architecture, res.nextn_predict_layers, res.mtp_status) == ("glm4moe", 1, "complete")
    return paths


def test_synth_hf_glm_writes_a_glm45_checkpoint_with_its_nextn_layer(checkpoints):
    d = checkpoints["f0"]
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["architectures"] == ["Glm4MoeForCausalLM"] and cfg["model_type"] == "glm4_moe"
    assert {k: cfg[k] for k in ("num_hidden_layers", "num_nextn_predict_layers", "first_k_dense_replace",
                                "n_routed_experts", "n_shared_experts", "moe_intermediate_size",
                                "num_experts_per_tok", "intermediate_size", "attention_bias")} == {
        "num_hidden_layers": 2, "num_nextn_predict_layers": 1, "first_k_dense_replace": 1, "n_routed_experts": 4,
        "n_shared_experts": 1, "moe_intermediate_size": 256, "num_experts_per_tok": 2, "intermediate_size": 512,
        "attention_bias": True}
    assert "mtp_num_hidden_layers" not in cfg
    names = set(json.loads((d / INDEX_NAME).read_text())["weight_map"])
    assert len(set(json.loads((d / INDEX_NAME).read_text())["weight_map"].values())) == 2
    assert not any(n.startswith("mtp.") for n in names)
    assert {f"model.layers.2.{n}" for n in NEXTN} <= names
    # GLM's own names: unstacked routed experts, the router's selection bias, plural shared_experts
    assert {"model.layers.1.mlp.experts.3.down_proj.weight", "model.layers.2.mlp.gate.e_score_correction_bias",
            "model.layers.1.mlp.shared_experts.up_proj.weight", "model.layers.0.mlp.gate_proj.weight",
            "model.layers.0.self_attn.q_proj.bias"} <= names
    head = read_checkpoint(d).mtp
    assert head.present and head.layers == 1 and head.trunk_layers == 2
    assert head.config_key == "num_nextn_predict_layers"
    assert all(t.name.startswith("model.layers.2.") for t in head.tensors)
    glm46 = {t.name for t in read_checkpoint(checkpoints["glm46"]).mtp.tensors}
    assert "model.layers.2.eh_proj.weight" in glm46
    assert not {"model.layers.2.embed_tokens.weight", "model.layers.2.shared_head.head.weight"} & glm46


def test_synth_hf_glm_refuses_what_it_cannot_write(tmp_path):
    from ggufmtp.errors import SynthError

    with pytest.raises(SynthError, match="glm4moe model with its NextN block only"):
        synthesize_hf(tmp_path / "x", dataclasses.replace(SPEC, mtp_only=True))


def _arch_keys(m: GGUFModel) -> dict:
    return {k: (v, type(v)) for k, v in m.metadata.items() if k.startswith("glm4moe.")}


@pytest.mark.parametrize("key,spec", [("f0", SPEC), ("f50", SPEC_F50), ("glm46", SPEC_GLM46)])
def test_the_converted_gguf_is_the_synth_gguf(converted, tmp_path, key, spec):
    """Same tensors (names, shapes, types, bytes), same glm4moe.* keys and tokenizer, MTP complete."""
    got, want = GGUFModel(converted[key]), GGUFModel(synthesize(tmp_path / "ref.gguf", spec, progress=False).path)
    rep = inspect_model(converted[key])
    assert (rep.architecture, rep.mtp_status, rep.block_count, rep.nextn_predict_layers) == (
        "glm4moe", "complete", 3, 1)
    assert check_mtp(got).status == MTPStatus.COMPLETE
    assert {n: (t.shape, t.type) for n, t in got.tensors.items()} == {
        n: (t.shape, t.type) for n, t in want.tensors.items()}
    differing = [n for n in want.tensors
                 if np.asarray(tensor_array(got, n)).tobytes() != np.asarray(tensor_array(want, n)).tobytes()]
    assert differing == []
    assert _arch_keys(got) == _arch_keys(want)
    for k in ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.merges",
              "tokenizer.ggml.eos_token_id", "tokenizer.chat_template"):
        assert got.metadata[k] == want.metadata[k], k


def _serve(srv: LlamaServer, spec: SynthSpec) -> tuple[int, int, int, int]:
    """(drafted, accepted, simulated drafted, simulated accepted) over PROMPTS; every reply is the
    bigram chain from its prompt's last token."""
    d = a = sd = sa = 0
    for p in PROMPTS:
        msgs = [{"role": "user", "content": p}]
        r = srv.chat(msgs, max_tokens=N_TOKENS)
        last = srv.chat_prompt_tokens(msgs)[-1]
        assert r["choices"][0]["message"]["content"] == build_vocab().decode(predict_tokens(spec, last, N_TOKENS))
        dd, aa = require_drafting(r)
        s_d, s_a = simulate_acceptance(spec, last, N_TOKENS, K)
        d, a, sd, sa = d + dd, a + aa, sd + s_d, sa + s_a
    return d, a, sd, sa


@pytest.mark.parametrize("key,spec", [("f0", SPEC), ("f50", SPEC_F50)])
def test_llama_server_drafts_with_the_converted_nextn_layer(llama_server_bin, converted, key, spec):
    cfg = ServerConfig(model=converted[key], threads=2, ctx_size=4096, draft_mtp=True, draft_n_max=K)
    with LlamaServer(cfg) as srv:
        d, a, sd, sa = _serve(srv, spec)
    assert d > 0 and (d, a) == (sd, sa)
    if key == "f0":
        assert a == d  # acceptance 1.0: the NextN layer agrees with the trunk at temperature 0
    else:
        assert 0 < a / d < 0.6
