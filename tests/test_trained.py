"""A model whose MTP head LEARNED its job (issue #29): trained here, converted by the real converter,
served by the real llama-server.

The ``micro`` preset (the layout of ``builtin:tiny-qwen35moe-trained`` with fewer modules and steps)
is trained once per module into a temporary cache (:func:`ggufmtp.train.builtin.ensure_trained`,
the builtin's own path), then: its held-out MTP loss is far below the untrained head's; the
checkpoint is Qwen3.6's published layout and loads strictly into transformers' modules; the GGUF
has a complete MTP block; llama-server tokenizes as the trainer did and computes the PyTorch model's
log-probabilities; and served with ``--spec-type draft-mtp``, the trained head's acceptance is far above the
untrained head's (same trunk, the head at its initial weights), with identical replies.

Kept cheap for CI (2 cores): one PyTorch thread, about 40 s of training, 8 held-out prompts x 64
tokens, one llama.cpp thread.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

pytest.importorskip("torch", reason="the train extra (pip install 'ggufmtp[train]')")

from ggufmtp.cli import main  # noqa: E402
from ggufmtp.gguf.model import GGUFModel, MTPStatus, inspect_model, tensor_array  # noqa: E402
from ggufmtp.hfconvert.runner import _is_trained_checkpoint  # noqa: E402
from ggufmtp.runtime.server import LlamaServer, ServerConfig  # noqa: E402
from ggufmtp.train import builtin as trained_builtin  # noqa: E402
from ggufmtp.train.config import PRESETS  # noqa: E402
from ggufmtp.train.data import build_corpus, read_corpus, write_corpus  # noqa: E402
from ggufmtp.train.export import INDEX_NAME, MARKER, load_checkpoint  # noqa: E402
from ggufmtp.train.tokenizer import train_tokenizer  # noqa: E402

PRESET = "micro"
THREADS = 1  # one llama.cpp thread per server (tests/test_arch_matrix.py: a busy 2-core machine stalls two)
N_PROMPTS, MAX_TOKENS, K = 8, 64, 3
MIN_GAIN = 0.15  # trained acceptance - untrained acceptance (measured: about 0.39 vs 0.03)

# The 19 MTP tensors of the published Qwen/Qwen3.6-35B-A3B index.
PUBLISHED_MTP = {
    "mtp.fc.weight", "mtp.norm.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight",
    *(f"mtp.layers.0.{n}" for n in (
        "input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
        "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight", "self_attn.q_norm.weight",
        "self_attn.k_norm.weight", "mlp.gate.weight", "mlp.experts.gate_up_proj", "mlp.experts.down_proj",
        "mlp.shared_expert.gate_proj.weight", "mlp.shared_expert.up_proj.weight",
        "mlp.shared_expert.down_proj.weight", "mlp.shared_expert_gate.weight")),
}


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("trained-cache")


@pytest.fixture(scope="module")
def trained(cache, llama_server_bin) -> trained_builtin.TrainedModel:
    """The micro preset, trained and both heads converted, through the builtin's cache."""
    return trained_builtin.ensure_trained(PRESET, cache)


@pytest.fixture(scope="module")
def heldout() -> list:
    return list(build_corpus(PRESETS[PRESET].data).heldout)


def _checkpoint(trained, head: str) -> Path:
    return Path(trained.record["checkpoint" if head == "trained" else "initial_checkpoint"])


def test_the_heads_heldout_loss_is_far_below_the_untrained_heads(trained):
    loss = trained.record["losses"]
    vocab = trained.record["vocab_size"]
    assert loss["heldout_mtp"] < loss["heldout_mtp_initial_head"] - 1.0, loss
    assert loss["train_mtp"] < loss["train_mtp_initial_head"] - 1.0, loss
    assert loss["heldout_lm"] < math.log(vocab) - 2.5, loss  # the trunk learnt too (uniform: ln V)
    assert loss["heldout_lm"] < loss["heldout_mtp"] < loss["heldout_mtp_initial_head"], loss  # t+2 is harder


def test_a_second_call_is_a_cache_hit(trained, cache):
    again = trained_builtin.ensure_trained(PRESET, cache)
    assert again.cached and again.gguf == trained.gguf and again.directory == trained.directory


def test_the_checkpoint_is_qwen36s_published_layout(trained):
    d = _checkpoint(trained, "trained")
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3_5MoeForConditionalGeneration"] and cfg["model_type"] == "qwen3_5_moe"
    text = cfg["text_config"]
    assert text["mtp_num_hidden_layers"] == 1 and text["layer_types"][-1] == "full_attention"
    assert text["layer_types"][:3] == ["linear_attention"] * 3 and text["full_attention_interval"] == 4
    assert cfg[MARKER]["head"] == "trained" and cfg[MARKER]["preset"] == PRESET
    names = set(json.loads((d / INDEX_NAME).read_text())["weight_map"])
    assert {n for n in names if n.startswith("mtp.")} == PUBLISHED_MTP
    assert "model.language_model.layers.0.mlp.experts.gate_up_proj" in names and "lm_head.weight" in names
    assert "model.language_model.layers.0.linear_attn.A_log" in names
    assert all(n.startswith(("model.language_model.", "mtp.")) or n == "lm_head.weight" for n in names)
    load_checkpoint(d)  # strict: every published name is a parameter of transformers' modules or the head


def test_the_converter_adds_one_to_the_zero_centred_norms(trained):
    """What a real Qwen3.6 checkpoint stores (w) and what llama.cpp reads (1 + w): the converter's own
    transform, on the head's norms too."""
    from safetensors.torch import load_file

    d = _checkpoint(trained, "trained")
    shard = json.loads((d / INDEX_NAME).read_text())["weight_map"]["mtp.pre_fc_norm_hidden.weight"]
    w = load_file(str(d / shard))["mtp.pre_fc_norm_hidden.weight"].float().numpy()
    model = GGUFModel(trained.gguf)
    got = np.asarray(tensor_array(model, "blk.4.nextn.hnorm.weight")).view(np.float32)
    assert np.abs(got - (1.0 + w)).max() < 1e-6 and np.abs(w).max() > 0.01  # trained away from 0


def test_inspect_finds_the_mtp_block_complete(trained, monkeypatch):
    for path in (trained.gguf, trained.initial_gguf):
        rep = inspect_model(path)
        assert rep.architecture == "qwen35moe" and rep.mtp_status == MTPStatus.COMPLETE
        assert rep.block_count == 5 and rep.nextn_predict_layers == 1 and rep.mtp_block == 4
    assert GGUFModel(trained.gguf).metadata["tokenizer.ggml.pre"] == "qwen2"
    # the builtin name, resolved by the CLI (the builtin mapped onto this module's micro cache)
    monkeypatch.setitem(trained_builtin.TRAINED_BUILTINS, "tiny-qwen35moe-trained", (PRESET, "trained"))
    monkeypatch.setattr(trained_builtin, "default_cache_dir", lambda: trained.directory.parent)
    r = CliRunner().invoke(main, ["inspect", "builtin:tiny-qwen35moe-trained", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output[r.output.index("{"):])["path"] == str(trained.gguf)


def test_llama_server_computes_what_pytorch_computes(trained, heldout):
    """Same tokens for the same text (the trained BPE as llama.cpp's qwen2 pre-tokenizer), and, along
    llama-server's greedy continuation, the same log-probabilities as the PyTorch model loaded from the
    checkpoint (within 0.03 nats; measured: 0.005) and the same choice wherever it is not a near-tie:
    the converted trunk IS the trained one."""
    import torch
    from tokenizers import Tokenizer

    d = _checkpoint(trained, "trained")
    model = load_checkpoint(d)
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    with LlamaServer(ServerConfig(model=trained.gguf, threads=THREADS, ctx_size=1024, metrics=False)) as srv:
        for conv in heldout[:2]:
            text = conv.render().rsplit("<|im_start|>assistant\n", 1)[0] + "<|im_start|>assistant\n"
            ids = tok.encode(text).ids
            assert srv.tokenize(text) == ids
            r = srv.complete(ids, n_predict=16, n_probs=1, return_tokens=True, cache_prompt=False)
            theirs, lp = r["tokens"], [c["logprob"] for c in r["completion_probabilities"]]
            with torch.no_grad():
                logp = model.trunk(input_ids=torch.tensor([ids + theirs])).logits[0, len(ids) - 1:-1].log_softmax(-1)
            ours = [float(logp[i, t]) for i, t in enumerate(theirs)]
            assert max(abs(a - b) for a, b in zip(ours, lp)) < 0.03, (ours, lp)
            top = logp.topk(2, dim=-1)
            clear = (top.values[:, 0] - top.values[:, 1]) > 0.06
            assert all(int(i) == t for i, t, c in zip(top.indices[:, 0], theirs, clear) if c)


def _serve(path: Path, prompts: list) -> tuple[float, list[str], tuple[int, int]]:
    with LlamaServer(ServerConfig(model=path, draft_mtp=True, draft_n_max=K, threads=THREADS, ctx_size=2048)) as srv:
        before = srv.spec_counters()
        replies = [srv.chat(p, max_tokens=MAX_TOKENS, seed=42, cache_prompt=False)["choices"][0]["message"]["content"]
                   for p in prompts]
        c = srv.spec_counters().since(before)
    assert c.draft_tokens > 0, f"{path}: llama-server did not draft"
    return c.accepted / c.draft_tokens, replies, (c.draft_tokens, c.accepted)


def test_the_trained_head_is_accepted_far_more_than_the_untrained_one(trained, heldout):
    prompts = [c.prompt() for c in heldout[:N_PROMPTS]]
    acc, replies, counts = _serve(trained.gguf, prompts)
    acc0, replies0, counts0 = _serve(trained.initial_gguf, prompts)
    print(f"acceptance at k={K}: trained {acc:.3f} {counts}, untrained {acc0:.3f} {counts0}")
    assert replies == replies0  # the same trunk; greedy speculative decoding is lossless
    assert acc >= acc0 + MIN_GAIN, (acc, acc0)


def test_the_converter_declares_only_the_recorded_tokenizer(trained, tmp_path):
    d = _checkpoint(trained, "trained")
    assert _is_trained_checkpoint(d)
    copy = tmp_path / "edited"
    shutil.copytree(d, copy)
    tj = json.loads((copy / "tokenizer.json").read_text())
    tj["pre_tokenizer"] = None  # another pre-tokenizer: no longer what the hash would be declared as
    (copy / "tokenizer.json").write_text(json.dumps(tj))
    assert not _is_trained_checkpoint(copy)
    cfg = json.loads((d / "config.json").read_text())
    del cfg[MARKER]
    (copy / "config.json").write_text(json.dumps(cfg))
    shutil.copy(d / "tokenizer.json", copy / "tokenizer.json")
    assert not _is_trained_checkpoint(copy)


def test_the_corpus_and_the_tokenizer_are_deterministic(tmp_path):
    data = PRESETS[PRESET].data
    a, b = build_corpus(data), build_corpus(data)
    assert a.digest == b.digest and a.heldout and a.train
    assert not {c.id.removesuffix("#doc") for c in a.train} & {c.id.removesuffix("#doc") for c in a.heldout}
    assert train_tokenizer(a.train, PRESETS[PRESET].tokenizer).json == train_tokenizer(b.train, PRESETS[PRESET].tokenizer).json
    path = write_corpus(a, tmp_path / "corpus.jsonl")
    assert read_corpus(path).digest == a.digest
    path.write_text(path.read_text().replace("def ", "def  ", 1))
    with pytest.raises(ValueError, match="digest"):
        read_corpus(path)


@pytest.mark.runtime  # builds the torch model: ~2 s
def test_the_head_sees_nothing_after_the_token_it_is_given():
    """The MTP layer runs its attention outside the model that picks an implementation: it must still be
    causal (eager attention without a mask would not be). Changing token 30 changes the trunk from
    position 30 on and the head from 29 on (it reads the embedding of t+1), nothing before."""
    import torch

    from ggufmtp.train.model import _positions, build_model

    model = build_model(PRESETS[PRESET].model, 256, 255, seed=0)
    ids = torch.randint(0, 250, (2, 40), generator=torch.Generator().manual_seed(0))
    changed = ids.clone()
    changed[:, 30] = (changed[:, 30] + 1) % 250

    def run(x):
        h = model.trunk.model(input_ids=x).last_hidden_state
        rope = model.trunk.model.rotary_emb(h, _positions(torch, 2, 38, x.device))
        return h, model.head(h[:, :38], model.trunk.model.embed_tokens(x[:, 1:39]), rope)

    with torch.no_grad():
        (h1, g1), (h2, g2) = run(ids), run(changed)

    def diff(a, b):  # rounding differs between the two runs (threads, chunking); a leak is of order 1
        return float((a - b).abs().max())

    assert diff(h1[:, :30], h2[:, :30]) < 1e-4 < 0.1 < diff(h1[:, 30], h2[:, 30])
    assert diff(g1[:, :29], g2[:, :29]) < 1e-4 < 0.1 < diff(g1[:, 29], g2[:, 29])


@pytest.mark.runtime  # imports torch and trains two steps: >1 s
def test_ggufmtp_train_runs_from_the_cli(tmp_path):
    out = tmp_path / "run"
    r = CliRunner().invoke(main, ["train", str(out), "--preset", PRESET, "--steps", "2", "--no-convert", "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.output[r.output.index("{"):])
    assert res["preset"]["schedule"]["steps"] == 2 and res["gguf"] is None
    assert (out / "train.json").is_file() and len((out / "train-log.jsonl").read_text().splitlines()) == 1
    assert _is_trained_checkpoint(Path(res["checkpoint"]))


def test_without_torch_the_package_imports_and_training_names_the_extra():
    code = ("import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None\n"
            "import ggufmtp.cli, ggufmtp.train.builtin, ggufmtp.refs\n"
            "from ggufmtp.train.model import require_torch\n"
            "try:\n    require_torch()\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "pip install 'ggufmtp[train]'" in out.stdout
