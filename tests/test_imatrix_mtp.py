"""The MTP-head imatrix collector (ggufmtp-mtp-imatrix, ggufmtp.imatrix.mtp) and the proof that
its numbers are right:

(a) in ``--trunk`` mode the same collector, on the trunk context, gives exactly what the real
    llama-imatrix gives for every trunk entry (same corpus, chunks, context);
(b) on the MTP head, the statistics of ``blk.4.nextn.eh_proj`` (input [enorm(embed(x_{p+1})) ;
    hnorm(h_p)]) and of ``blk.4.attn_q/k/v`` (input attn_norm(eh_proj @ that)) equal a numpy
    computation from the model's weights (read with gguf-py) and the trunk's hidden states;
(c) the same numpy computation with the pairing shifted by one position (h_p with x_p) does not
    match: the check can fail, and the tool pairs as draft-mtp does.

Plus: the dumped hidden states are the trunk's (row p belongs to token p), clear errors for a model
without MTP and a too-short corpus, and the runtime compiles the tool when it is missing or stale.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize

from ggufmtp.constants import MTP_ARCHITECTURES
from ggufmtp.errors import CorpusError, ImatrixError
from ggufmtp.imatrix.format import read_imatrix
from ggufmtp.imatrix.mtp import MTP_IMATRIX_TOOL, collect_mtp_statistics
from ggufmtp.imatrix.settings import CollectMode, ImatrixSettings
from ggufmtp.runtime import build as rt
from ggufmtp.synth.archs.registry import arch_names
from ggufmtp.synth.spec import SynthSpec

pytestmark = pytest.mark.runtime

CTX = 64
CHUNKS = 3
SETTINGS = ImatrixSettings(chunks=CHUNKS, ctx_size=CTX, threads=2)
MTP = 4  # the MTP block of the 4-layer synthetic models
WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards hex jolly crabs; "
         "def f(x): return x * 2 + 1 # 3.14 = pi, and chat: hello! how are you?").split()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    rng = np.random.default_rng(7)
    path = tmp_path_factory.mktemp("corpus") / "calib.txt"
    path.write_text(" ".join(WORDS[i] for i in rng.integers(0, len(WORDS), 1500)) + "\n")
    return path


@pytest.fixture(scope="module")
def noisy_model(synth_model) -> Path:
    """eh_proj = [I | 0] + noise: both halves of the head's input reach the attention block, so the
    pairing of h and x shows in the statistics."""
    return synth_model("tiny-qwen35moe-noise")


@pytest.fixture(scope="module")
def head_run(noisy_model, corpus, tmp_path_factory):
    dump = tmp_path_factory.mktemp("dump") / "hidden.gguf"
    im = collect_mtp_statistics(noisy_model, corpus, SETTINGS, dump_hidden=dump)
    r = gguf.GGUFReader(str(dump))
    t = {x.name: x for x in r.tensors}
    tokens = np.asarray(t["tokens"].data, dtype=np.int64)
    hidden = np.asarray(t["hidden"].data, dtype=np.float64)
    return im, tokens, hidden


# ------------------------------------------------------------------------------------------------
# numpy reference
# ------------------------------------------------------------------------------------------------


class Weights:
    def __init__(self, path: Path):
        r = gguf.GGUFReader(str(path))
        self.t = {x.name: x for x in r.tensors}
        self.eps = float(r.fields["qwen35moe.attention.layer_norm_rms_epsilon"].parts[-1][0])

    def f32(self, name: str) -> np.ndarray:
        x = self.t[name]
        return dequantize(x.data, x.tensor_type).astype(np.float64)

    def is_bf16(self, name: str) -> bool:
        return self.t[name].tensor_type == gguf.GGMLQuantizationType.BF16


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    x32 = x.astype(np.float32).astype(np.float64)
    return x32 / np.sqrt(np.mean(x32 * x32, axis=-1, keepdims=True) + eps) * w


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 -> float, round to nearest even (ggml's GGML_FP32_TO_BF16 for finite values):
    the CPU backend converts activations to a BF16 weight's dot type before multiplying."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


def pairs(tokens: np.ndarray, hidden: np.ndarray, shift: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """The (h, x) pairs the head sees, chunk by chunk. shift=1 is draft-mtp's: token x_k at
    position k carries h_{k-1}, position 0 a zero state. shift=0 is the off-by-one bug."""
    n_embd = hidden.shape[1]
    hs, xs = [], []
    for c in range(len(tokens) // CTX):
        tok, hid = tokens[c * CTX:(c + 1) * CTX], hidden[c * CTX:(c + 1) * CTX]
        if shift == 1:
            h = np.vstack([np.zeros((1, n_embd)), hid[:-1]])
        else:
            h = hid
        hs.append(h)
        xs.append(tok)
    return np.vstack(hs), np.concatenate(xs)


def head_inputs(w: Weights, h: np.ndarray, x: np.ndarray) -> dict[str, np.ndarray]:
    """Inputs of the MTP block's first matrices: eh_proj gets [enorm(embed(x)) ; hnorm(h)]
    (src/models/qwen35moe.cpp graph_mtp), attn_q/k/v get attn_norm(eh_proj @ that)."""
    embd_name = f"blk.{MTP}.nextn.embed_tokens.weight"
    embed = w.f32(embd_name if embd_name in w.t else "token_embd.weight")
    e = rms_norm(embed[x], w.f32(f"blk.{MTP}.nextn.enorm.weight"), w.eps)
    hh = rms_norm(h, w.f32(f"blk.{MTP}.nextn.hnorm.weight"), w.eps)
    concat = np.hstack([e, hh])
    eh = f"blk.{MTP}.nextn.eh_proj.weight"
    act = to_bf16(concat) if w.is_bf16(eh) else concat
    cur = act @ w.f32(eh).T
    attn_in = rms_norm(cur, w.f32(f"blk.{MTP}.attn_norm.weight"), w.eps)
    return {eh: concat, f"blk.{MTP}.attn_q.weight": attn_in, f"blk.{MTP}.attn_k.weight": attn_in,
            f"blk.{MTP}.attn_v.weight": attn_in}


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-3 * np.max(np.abs(want)))))


# ------------------------------------------------------------------------------------------------
# (a) trunk mode == llama-imatrix
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_imatrix_ref(tiny_mtp_model, corpus, tmp_path_factory):
    """The real llama-imatrix on the same model, corpus, chunks and context."""
    ref_path = tmp_path_factory.mktemp("ref") / "ref.gguf"
    cmd = [str(rt.find_binary("llama-imatrix")), "-m", str(tiny_mtp_model), "-f", str(corpus.resolve()),
           "-o", str(ref_path), "-c", str(CTX), "--chunks", str(CHUNKS), "-t", "2", "--no-ppl", "--no-repack"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return read_imatrix(ref_path)


def test_trunk_mode_equals_llama_imatrix(tiny_mtp_model, corpus, llama_imatrix_ref):
    ours = collect_mtp_statistics(tiny_mtp_model, corpus, SETTINGS, mode=CollectMode.TRUNK)
    ref = llama_imatrix_ref
    assert list(ours.entries) == list(ref.entries) and len(ref.entries) > 40
    assert not any(n.startswith(f"blk.{MTP}.") for n in ours.entries)  # trunk layers only
    assert (ours.chunk_count, ours.chunk_size, ours.datasets) == (ref.chunk_count, ref.chunk_size, ref.datasets)
    assert ours.chunk_count == CHUNKS and ours.chunk_size == CTX
    for name, want in ref.entries.items():
        got = ours.entries[name]
        np.testing.assert_array_equal(got.counts, want.counts, err_msg=name)
        np.testing.assert_allclose(got.values, want.values, rtol=1e-6, atol=0, err_msg=name)
    experts = [n for n in ref.entries if n.endswith("_exps.weight")]
    assert experts and all(ours.entries[n].nmat == 4 for n in experts)  # per-expert counts


def test_with_trunk_is_llama_imatrix_plus_the_head(tiny_mtp_model, corpus, llama_imatrix_ref):
    """One pass (collector on both contexts) = llama-imatrix's entries + the MTP-only run's entries."""
    both = collect_mtp_statistics(tiny_mtp_model, corpus, SETTINGS, mode=CollectMode.BOTH)
    head = collect_mtp_statistics(tiny_mtp_model, corpus, SETTINGS)
    assert head.entries and all(n.startswith(f"blk.{MTP}.") for n in head.entries)
    assert set(both.entries) == set(llama_imatrix_ref.entries) | set(head.entries)
    assert list(both.entries) == sorted(both.entries, key=str.encode)  # llama-imatrix's order
    for src in (llama_imatrix_ref, head):
        for name, want in src.entries.items():
            np.testing.assert_array_equal(both.entries[name].counts, want.counts, err_msg=name)
            np.testing.assert_allclose(both.entries[name].values, want.values, rtol=1e-6, err_msg=name)


# Whether the MTP context keeps every position an output, where the reason is known (else one per batch).
HEAD_ALL_OUTPUTS = {"qwen35moe": (False, "its LM head is output.weight, which is not collected"),
                    "glm4moe": (True, "its own nextn.shared_head_head is collected"),
                    "qwen3next": (True, "its MTP graph gathers the output rows before the MTP FFN")}


@pytest.mark.parametrize("arch", sorted(a for a in arch_names() if a in MTP_ARCHITECTURES))
def test_one_output_per_batch_changes_no_statistic(synth_model, corpus, tmp_path, arch):
    """#34: the trunk (and the MTP context where its graph allows it) asks for one output per batch
    instead of every token, which skips the LM head over the vocabulary and nothing that is
    collected: on every MTP architecture, the file equals the every-token-an-output run's byte for
    byte (the C++ tool's TRUNK_ROWS_KEPT / HEAD_ROWS_KEPT are claims about each graph; this checks them)."""
    model, exe = synth_model(SynthSpec(arch=arch)), rt.find_binary(MTP_IMATRIX_TOOL)
    got = {}
    for extra in ([], ["--all-outputs"]):
        out = tmp_path / f"im{len(extra)}.gguf"
        cmd = [str(exe), "-m", str(model), "-f", str(corpus), "-o", str(out), "-c", str(CTX), "--chunks", str(CHUNKS),
               "-t", "2", "--no-repack", "--with-trunk", "--profile", *extra]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        profile = json.loads(r.stderr.split(f"{MTP_IMATRIX_TOOL}: profile: ")[1].splitlines()[0])
        got[bool(extra)] = out.read_bytes(), profile
    (cut, p_cut), (full, p_full) = got[False], got[True]
    assert p_cut["trunk_all_outputs"] is False  # every MTP architecture's trunk gathers rows after h_nextn
    if arch in HEAD_ALL_OUTPUTS:
        assert p_cut["head_all_outputs"] is HEAD_ALL_OUTPUTS[arch][0], HEAD_ALL_OUTPUTS[arch][1]
    assert (p_full["trunk_all_outputs"], p_full["head_all_outputs"]) == (True, True)
    for k in ("trunk_collect_calls", "trunk_collect_floats", "head_collect_calls", "head_collect_floats", "tokens"):
        assert p_cut[k] == p_full[k] > 0, k
    assert cut == full


# ------------------------------------------------------------------------------------------------
# (b) the head's statistics == numpy from weights and hidden states; (c) a shifted pairing does not
# ------------------------------------------------------------------------------------------------


def test_head_covers_every_matrix_of_the_mtp_block(head_run, noisy_model):
    im, tokens, _ = head_run
    w = Weights(noisy_model)
    matrices = sorted(n for n, t in w.t.items() if n.startswith(f"blk.{MTP}.") and len(t.shape) >= 2
                      or n == f"blk.{MTP}.ffn_gate_inp_shexp.weight")
    assert sorted(im.entries) == matrices
    assert im.chunk_count == CHUNKS and im.chunk_size == CTX and len(tokens) == CHUNKS * CTX
    for name, e in im.entries.items():
        if name.endswith("_exps.weight"):
            # every token picks 2 of the 4 experts: per-expert counts add up to 2 per token
            assert e.nmat == 4 and e.counts.sum() == 2 * len(tokens), name
        else:
            assert e.counts.tolist() == [len(tokens)], name


def test_hidden_dump_rows_are_the_trunk_states_of_their_tokens(head_run, noisy_model):
    """The synthetic trunk is nearly a bigram model: h_p is close to output_norm(embed(x_p))."""
    _, tokens, hidden = head_run
    w = Weights(noisy_model)
    approx = rms_norm(w.f32("token_embd.weight")[tokens], w.f32("output_norm.weight"), w.eps)

    def cos(a, b):
        return np.sum(a * b, axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)

    same = cos(hidden, approx)
    shifted = cos(hidden[1:], approx[:-1])
    assert np.median(same) > 0.9 and np.median(same) > np.median(shifted) + 0.3


def test_head_statistics_match_numpy(head_run, noisy_model):
    im, tokens, hidden = head_run
    w = Weights(noisy_model)
    h, x = pairs(tokens, hidden, shift=1)
    for name, act in head_inputs(w, h, x).items():
        want = np.sum(act * act, axis=0)
        got = im.entries[name].values[0].astype(np.float64)
        assert rel_err(got, want) < 2e-5, name
        assert im.entries[name].counts.tolist() == [len(x)]


def test_shifted_pairing_does_not_match(head_run, noisy_model):
    im, tokens, hidden = head_run
    w = Weights(noisy_model)
    h, x = pairs(tokens, hidden, shift=0)
    wrong = head_inputs(w, h, x)
    name = f"blk.{MTP}.attn_q.weight"
    want = np.sum(wrong[name] ** 2, axis=0)
    assert rel_err(im.entries[name].values[0].astype(np.float64), want) > 1e-2
    eh = f"blk.{MTP}.nextn.eh_proj.weight"
    assert rel_err(im.entries[eh].values[0].astype(np.float64), np.sum(wrong[eh] ** 2, axis=0)) > 1e-3


# ------------------------------------------------------------------------------------------------
# errors
# ------------------------------------------------------------------------------------------------


def test_model_without_mtp_is_one_clear_error(synth_model, corpus):
    model = synth_model("tiny-qwen35moe-nomtp")
    with pytest.raises(ImatrixError, match=r"has no MTP \(NextN\) block") as ei:
        collect_mtp_statistics(model, corpus, ImatrixSettings(chunks=1, ctx_size=CTX, threads=2))
    assert str(model) in str(ei.value) and "\n" not in str(ei.value)


def test_tool_lines_are_found_behind_a_log_line_on_the_same_line():
    """llama.cpp's logger thread shares the tool's stderr: a log fragment can precede the tool's line
    (CI once read ``0.00.134.747 I cmn init: ...`` as the error). The error and progress still parse."""
    from types import SimpleNamespace

    from ggufmtp.imatrix.mtp import _pump, _ToolRun

    lines = [b"0.00.134.747 I cmn          init: llama threadpool init, n_threads = 2" + f"{MTP_IMATRIX_TOOL}: chunk 3/8\n".encode(),
             b"0.00.134.800 I " + f"{MTP_IMATRIX_TOOL}: error: m.gguf: the model has no MTP (NextN) block\n".encode(),
             b"n_threads = 2\n"]
    run = _ToolRun()
    bar = SimpleNamespace(n=0, total=None, update=lambda k: None)
    _pump(SimpleNamespace(stdout=iter(lines)), run, bar)
    assert (run.done, run.total) == (3, 8)
    assert run.error == "m.gguf: the model has no MTP (NextN) block"


def test_short_corpus_is_one_clear_error(tiny_mtp_model, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("the quick brown fox " * 40)  # 800 bytes, fewer than 2 * 300 tokens
    with pytest.raises(CorpusError, match=r"short\.txt: too short: it tokenizes to \d+ tokens") as ei:
        collect_mtp_statistics(tiny_mtp_model, short, ImatrixSettings(ctx_size=300, threads=2))
    assert "\n" not in str(ei.value)
    with pytest.raises(CorpusError, match="empty"):
        (tmp_path / "empty.txt").write_text("")
        collect_mtp_statistics(tiny_mtp_model, tmp_path / "empty.txt", ImatrixSettings(ctx_size=CTX))


def test_missing_model_is_one_clear_error(corpus, tmp_path):
    with pytest.raises(ImatrixError, match="no such file"):
        collect_mtp_statistics(tmp_path / "nope.gguf", corpus, ImatrixSettings(ctx_size=CTX))


# ------------------------------------------------------------------------------------------------
# the runtime compiles the tool when it is missing or its source changed
# ------------------------------------------------------------------------------------------------


def test_runtime_compiles_missing_or_stale_tool(tmp_path):
    info = rt.installed_runtime()
    assert info is not None, "run `ggufmtp runtime build`"
    info = rt.ensure_native_tools(info)
    root = tmp_path / "rt"
    shutil.copytree(info.bin_dir.parent, root, symlinks=True)
    copy = rt.RuntimeInfo.load(root)
    assert copy is not None and copy.native_tools[MTP_IMATRIX_TOOL] == rt.native_source_sha256(MTP_IMATRIX_TOOL)
    logs: list[str] = []
    exe = copy.binary(MTP_IMATRIX_TOOL)
    assert exe.name == f"{MTP_IMATRIX_TOOL}-{rt.native_source_sha256(MTP_IMATRIX_TOOL)[:16]}"
    assert rt.ensure_native_tools(copy, logs.append) == copy and logs == []  # current: nothing to do
    # this source's build missing (only another version's, or none): compiled, and the record follows
    meta = root / rt.RUNTIME_JSON
    exe.rename(exe.with_name(f"{MTP_IMATRIX_TOOL}-{'0' * 16}"))
    again = rt.ensure_native_tools(rt.RuntimeInfo.load(root), logs.append)
    assert any("compiling" in m for m in logs) and exe.is_file()
    assert again.native_tools[MTP_IMATRIX_TOOL] == rt.native_source_sha256(MTP_IMATRIX_TOOL)
    # a runtime built before the tool existed: no binary, no record -> compiled, and it runs
    exe.unlink()
    record = json.loads(meta.read_text())
    del record["native_tools"]
    meta.write_text(json.dumps(record))
    rt.ensure_native_tools(rt.RuntimeInfo.load(root))
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and f"commit {rt.LLAMA_CPP_COMMIT}" in out.stdout + out.stderr
    assert not list(copy.bin_dir.glob(f".{MTP_IMATRIX_TOOL}-*"))  # no temp file left


def test_two_versions_sharing_a_runtime_keep_their_own_tool(tmp_path, monkeypatch):
    """Two ggufmtp versions (two venvs, a checkout beside an install) share ~/.cache/ggufmtp. Each
    compiles the tool from its own source; neither may replace the other's under it (a process that
    found its tool current would run the other version's), nor recompile each time the other ran."""
    info = rt.ensure_native_tools(rt.installed_runtime())
    root = tmp_path / "rt"
    shutil.copytree(info.bin_dir.parent, root, symlinks=True)
    ours = rt.RuntimeInfo.load(root).binary(MTP_IMATRIX_TOOL)
    mine = ours.read_bytes()
    other = tmp_path / "other-version"  # the same tool as another version ships it
    other.mkdir()
    source = rt.NATIVE_DIR / rt.NATIVE_TOOLS[MTP_IMATRIX_TOOL]
    (other / source.name).write_text(source.read_text() + "\n// another version\n")
    with monkeypatch.context() as m:
        m.setattr(rt, "NATIVE_DIR", other)
        theirs = rt.ensure_native_tools(rt.RuntimeInfo.load(root)).binary(MTP_IMATRIX_TOOL)
    assert ours.read_bytes() == mine, "the other version's compile replaced our tool"
    assert theirs != ours and theirs.is_file()
    logs: list[str] = []
    assert rt.ensure_native_tools(rt.RuntimeInfo.load(root), logs.append).binary(MTP_IMATRIX_TOOL) == ours
    assert logs == []  # and current for us without a recompile


def test_a_fresh_install_comes_with_the_tool(tmp_path):
    """What `runtime build` does after CMake on a fresh machine: the install (staging dir, then
    rename) compiles the tool against the freshly copied libraries and records its source."""
    built = rt.cache_root() / "build" / f"{rt.LLAMA_CPP_COMMIT}-cpu" / "bin"
    src = rt.cache_root() / "src" / rt.LLAMA_CPP_COMMIT
    if not (built / "llama-server").is_file() or not (src / "include" / "llama.h").is_file():
        pytest.skip("no CPU build tree in the cache")
    logs: list[str] = []
    info = rt._install(built, tmp_path / "rt", "cpu", ["-DTEST=1"], src, logs.append)
    exe = info.binary(MTP_IMATRIX_TOOL)
    assert info.native_tools == {MTP_IMATRIX_TOOL: rt.native_source_sha256(MTP_IMATRIX_TOOL)}
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and f"commit {rt.LLAMA_CPP_COMMIT}" in out.stdout + out.stderr
    # linked against the runtime's own libraries, found through rpath $ORIGIN
    ldd = subprocess.run(["ldd", str(exe)], capture_output=True, text=True).stdout
    assert f"{info.bin_dir}/libllama.so" in ldd and "not found" not in ldd
