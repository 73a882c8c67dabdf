"""``ggufmtp synth --arch step35``: the layout llama.cpp 0c1e570 loads (``src/models/step35.cpp``,
``conversion/step3.py``), and llama-server's chained MTP heads on it.

Step-3.5 chains its MTP heads: draft step ``i`` runs head ``i``, and the draft length is capped at
the number of heads when there are several (``common/speculative.cpp``, ``chain_heads``). These
tests pin both: a 3-head file drafts 3 tokens at ``--spec-draft-n-max 4`` while a 1-head file drafts
4, and a file whose first head alone is clean drafts as the per-head replay says.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from ggufmtp.errors import SynthError
from ggufmtp.gguf.model import GGUFModel, MTPStatus, check_mtp
from ggufmtp.gguf.reader import read_header, tensor_nbytes
from ggufmtp.runtime.server import LlamaServer, ServerConfig, require_drafting
from ggufmtp.synth.archs.step35 import STEP35_MTP_LAYERS
from ggufmtp.synth.chain import chain_for, effective_draft_n_max, predict_tokens, simulate_acceptance
from ggufmtp.synth.spec import SynthSpec
from ggufmtp.synth.tokenizer import build_vocab
from ggufmtp.synth.writer import synthesize

PROMPTS = ["Tell me about the sea.", "Explain gravity to a child."]
N_TOKENS = 64
LAYERS = 4  # blocks 0 (full attention, dense), 1-3 (sliding window, MoE)


def _spec(mtp_layers: int, f: float = 0.0) -> SynthSpec:
    return SynthSpec(arch="step35", layers=LAYERS, mtp_layers=mtp_layers, wrong_successor_fraction=f)


def _cfg(model: Path, **kw) -> ServerConfig:
    return ServerConfig(model=model, threads=2, ctx_size=4096, **kw)


def _last_prompt_token(srv: LlamaServer, prompt: str) -> int:
    return srv.chat_prompt_tokens([{"role": "user", "content": prompt}])[-1]


def _serve(model: Path, spec: SynthSpec, k: int | None) -> tuple[list[str], list[int], int, int, dict]:
    """(texts, prompts' last tokens, drafted, accepted, /metrics); ``k`` None = vanilla. Every reply
    is checked to be the bigram chain from its prompt's last token."""
    texts, lasts, d, a = [], [], 0, 0
    cfg = _cfg(model, draft_mtp=True, draft_n_max=k) if k else _cfg(model)
    with LlamaServer(cfg) as srv:
        for p in PROMPTS:
            r = srv.chat([{"role": "user", "content": p}], max_tokens=N_TOKENS)
            assert r["timings"]["predicted_n"] == N_TOKENS
            texts.append(r["choices"][0]["message"]["content"])
            lasts.append(_last_prompt_token(srv, p))
            assert texts[-1] == build_vocab().decode(predict_tokens(spec, lasts[-1], N_TOKENS))
            if k:
                dd, aa = require_drafting(r)
                d, a = d + dd, a + aa
        metrics = srv.metrics()
    return texts, lasts, d, a, metrics


def _simulated(spec: SynthSpec, lasts: list[int], k: int) -> tuple[int, int]:
    counts = [simulate_acceptance(spec, t, N_TOKENS, k) for t in lasts]
    return sum(c.drafted for c in counts), sum(c.accepted for c in counts)


# ----------------------------------------------------------------------------- the file


def test_layout_keys_and_tensors(synth_model):
    model = GGUFModel(synth_model(_spec(STEP35_MTP_LAYERS, 0.5)))
    mtp = check_mtp(model)
    assert mtp.status == MTPStatus.COMPLETE and not mtp.missing and not mtp.problems
    assert model.mtp_blocks == [4, 5, 6] and model.trunk_layers == LAYERS
    md = model.metadata
    # the keys step35's loader reads (required ones first), with the converter's per-layer arrays
    assert md["step35.block_count"] == 7 and md["step35.nextn_predict_layers"] == 3
    assert md["step35.attention.sliding_window_pattern"] == [False, True, True, True, True, True, True]
    assert md["step35.attention.head_count"] == [2, 4, 4, 4, 4, 4, 4]
    assert md["step35.expert_feed_forward_length"] == 256 and md["step35.attention.sliding_window"] == 32
    assert md["step35.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-5)
    assert md["step35.expert_gating_func"] == 2  # sigmoid
    assert "step35.rope.dimension_count" not in md  # the loader halves the head dim on full layers
    t = model.tensors
    attn = {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm", "attn_gate",
            "ffn_norm"}
    dense = {"ffn_gate", "ffn_up", "ffn_down"}
    moe = {"ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_shexp", "ffn_up_shexp",
           "ffn_down_shexp"}
    nextn = {f"nextn.{n}" for n in ("eh_proj", "enorm", "hnorm", "shared_head_norm", "shared_head_head",
                                    "embed_tokens")}

    def block(b: int) -> set[str]:
        return {n.removeprefix(f"blk.{b}.").removesuffix(".weight") for n in t if n.startswith(f"blk.{b}.")}

    assert block(0) == attn | dense
    assert block(1) == attn | moe | {"exp_probs_b.bias"}
    for b in (4, 5, 6):
        assert block(b) == attn | dense | nextn
    assert t["blk.0.attn_q.weight"].shape == (256, 256) and t["blk.1.attn_q.weight"].shape == (256, 512)
    assert t["blk.1.attn_gate.weight"].shape == (256, 4) and t["blk.1.attn_output.weight"].shape == (512, 256)
    assert {t[n].type for n in ("blk.1.ffn_gate_inp.weight", "blk.1.exp_probs_b.bias", "blk.4.nextn.enorm.weight",
                                "blk.1.attn_q_norm.weight")} == {"F32"}
    assert {t[n].type for n in ("blk.4.nextn.eh_proj.weight", "blk.1.ffn_up_exps.weight",
                                "blk.6.nextn.shared_head_head.weight")} == {"BF16"}


def test_mtp_layers_range_and_servable(tmp_path):
    with pytest.raises(SynthError, match="arch step35 takes 1 to 3"):
        _spec(STEP35_MTP_LAYERS + 1).validate()
    res = synthesize(tmp_path / "s.gguf", _spec(2), progress=False)
    assert res.servable and res.mtp_blocks == [4, 5]
    # every head has its own embed_tokens, even when nothing is corrupted (as step35 files do)
    assert {"blk.4.nextn.embed_tokens.weight", "blk.5.nextn.embed_tokens.weight"} <= set(GGUFModel(res.path).tensors)


def test_chained_heads_draft_at_most_one_token_per_head():
    """Several heads cap the draft at their number; identical heads are one head at that length,
    and each head's own table is what a patched head changes."""
    one = _spec(1, 0.5)
    corrupt = chain_for(one).draft_successor
    for heads in (1, 2, 3):
        spec = _spec(heads, 0.5)
        for k in (1, 3, 4):
            kk = effective_draft_n_max(spec, k)
            assert kk == (min(k, heads) if heads > 1 else k)
            for last in (65, 300):
                assert simulate_acceptance(spec, last, N_TOKENS, k) == simulate_acceptance(one, last, N_TOKENS, kk) \
                    == simulate_acceptance(spec, last, N_TOKENS, k, head_successors=[corrupt] * heads)


# ----------------------------------------------------------------------------- llama-server


@pytest.mark.parametrize("mtp_layers,f,k", [(1, 0.0, 3), (STEP35_MTP_LAYERS, 0.0, 3), (1, 0.5, 4),
                                            (STEP35_MTP_LAYERS, 0.5, 4)])
def test_acceptance_is_the_replay_with_the_head_cap(llama_server_bin, synth_model, mtp_layers, f, k):
    """One head drafts k tokens; three heads draft min(k, 3) (llama.cpp caps draft-n-max at the head
    count when it chains heads). Acceptance is then exactly the simulated one at that length."""
    spec = _spec(mtp_layers, f)
    _, lasts, d, a, m = _serve(synth_model(spec), spec, k)
    kk = effective_draft_n_max(spec, k)
    assert (d, a) == _simulated(spec, lasts, k)
    assert m["llamacpp:spec_decode_num_draft_tokens_total"] == d
    positions = {key for key in m if "accepted_tokens_per_pos_total" in key}
    assert len(positions) == kk  # one counter per draft position: the cap is the server's own
    if f == 0:
        assert a == d
    elif mtp_layers > 1:
        # the uncapped length (one head drafting k) would be told apart
        assert (d, a) != _simulated(dataclasses.replace(spec, mtp_layers=1), lasts, k)


def test_vanilla_gives_the_same_texts(llama_server_bin, synth_model):
    spec = _spec(STEP35_MTP_LAYERS, 0.5)
    model = synth_model(spec)
    assert _serve(model, spec, None)[0] == _serve(model, spec, 3)[0]


def _clean_first_head(src: Path, dst: Path) -> None:
    """Copy ``src`` and overwrite its first head's ``nextn.embed_tokens`` with ``token_embd`` (same
    shape and type): head 0 then drafts the true successor, heads 1 and 2 stay corrupted."""
    shutil.copyfile(src, dst)
    tensors = {t.name: t for t in read_header(dst).tensors}
    emb, head0 = tensors["token_embd.weight"], tensors["blk.4.nextn.embed_tokens.weight"]
    assert (emb.shape, emb.type_id) == (head0.shape, head0.type_id)
    n = tensor_nbytes(emb.shape, emb.type_id)[1]
    with open(dst, "r+b") as fh:
        fh.seek(emb.offset)
        data = fh.read(n)
        fh.seek(head0.offset)
        fh.write(data)


def test_draft_step_i_runs_head_i(llama_server_bin, synth_model, tmp_path):
    """Heads that differ: the counts are the replay where step 0 uses the clean head 0 and steps 1-2
    the corrupted heads, not what any single head (or the reverse order) would give."""
    spec = _spec(STEP35_MTP_LAYERS, 0.5)
    model = tmp_path / "clean-head0.gguf"
    _clean_first_head(synth_model(spec), model)
    ch = chain_for(spec)
    heads = [ch.successor, ch.draft_successor, ch.draft_successor]
    _, lasts, d, a, _ = _serve(model, spec, 3)

    def replay(tables) -> tuple[int, int]:
        counts = [simulate_acceptance(spec, t, N_TOKENS, 3, head_successors=tables) for t in lasts]
        return sum(c.drafted for c in counts), sum(c.accepted for c in counts)

    assert (d, a) == replay(heads)
    assert (d, a) != replay(heads[::-1]) and (d, a) != replay([ch.draft_successor] * 3)
    assert (d, a) != replay([ch.successor] * 3)


def test_mtp_only_sidecar_chains_its_heads(llama_server_bin, synth_model):
    """step35's loader takes an MTP-only file (``--spec-draft-model``, as ``convert --mtp`` writes
    it) next to a trunk without MTP; its three heads chain the same way."""
    spec = SynthSpec(arch="step35", layers=LAYERS, mtp_layers=STEP35_MTP_LAYERS, wrong_successor_fraction=0.5,
                     mtp_only=True)
    target = synth_model(SynthSpec(arch="step35", layers=LAYERS, mtp=False))
    d = a = 0
    cfg = _cfg(target, draft_mtp=True, draft_n_max=4, draft_model=synth_model(spec))
    with LlamaServer(cfg) as srv:
        for p in PROMPTS:
            r = srv.chat([{"role": "user", "content": p}], max_tokens=N_TOKENS)
            dd, aa = require_drafting(r)
            d, a = d + dd, a + aa
        lasts = [_last_prompt_token(srv, p) for p in PROMPTS]
    assert (d, a) == _simulated(spec, lasts, 3)
