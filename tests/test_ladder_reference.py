"""A ladder measures its reference once per trunk (issue #49, Done-when "a 3-variant ladder measures
its reference once").

The reference arm is the source's MTP head drafting on the artifact's own trunk (``-md``): the
artifact's own head is loaded but never drafts, so its counts depend on the trunk alone. On main
9cff1e5 the measurement was cached by the sha256 of the artifact's whole file, its head included, so a
head-precision ladder (one trunk recipe, the ``[mtp]`` roles at Q4_K, Q8_0 and BF16) measured the
same reference arm once per variant. It is now keyed by the trunk's content
(:func:`ggufmtp.gguf.trunk.trunk_digest`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggufmtp.cli import main
from ggufmtp.errors import GGUFReadError
from ggufmtp.provenance.receipt import read_receipt
from ggufmtp.runtime import build as rt

MODEL = "builtin:tiny-qwen35moe"
# the head-precision ladder: one Q4_K_M trunk, its MTP block at three precisions
HEADS = {"Q4_K_M_HeadLow": "Q4_K", "Q4_K_M_HeadMid": "Q8_0", "Q4_K_M_HeadFull": "BF16"}
OTHER_TRUNK = "q8_0-mtp"  # tag Q8_0: another trunk, so its own reference measurement
# the reference's cache, the trunk digests and the heads cut: fresh for this test, so "measured" is this run's
FRESH = ("references.json", "references.json.lock", "trunks.json", "trunks.json.lock", "heads", "locks")


def _head_recipe(folder: Path, tag: str, head: str) -> Path:
    """A recipe identical to the others but for its name, tag and [mtp] roles."""
    roles = "\n".join(f'{r} = "{head}"' for r in ("eh_proj", "attention", "routed_experts", "shared_expert", "rest"))
    path = folder / f"{tag.lower()}.toml"
    path.write_text(f'name = "{tag.lower()}"\nftype = "Q4_K_M"\ntag = "{tag}"\nimatrix = "none"\n\n'
                    f"[mtp]\nrequired = true\n{roles}\n\n[verify]\ndraft_n_max = 3\n")
    return path


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """A cache root of its own that shares the built runtime and builtin models with the real one."""
    real = rt.cache_root()
    cache = tmp_path / "cache"
    cache.mkdir()
    for entry in real.iterdir():
        if entry.name not in FRESH and not entry.name.startswith("."):
            (cache / entry.name).symlink_to(entry)
    monkeypatch.setenv(rt.ENV_CACHE, str(cache))
    return cache


@pytest.mark.runtime
def test_a_head_ladder_measures_its_reference_once_and_another_trunk_again(llama_server_bin, fresh_cache, tmp_path):
    """``ggufmtp ladder`` of three recipes identical but for the [mtp] roles, and q8_0-mtp, with the
    default reference (the source): the three share one reference measurement (the first measures it,
    the others read it, the same records), each still judges its own head against it, and the Q8_0
    variant, another trunk, measures its own. The JSON and the console say so."""
    recipes = [str(_head_recipe(tmp_path, tag, head)) for tag, head in HEADS.items()]
    out = tmp_path / "ladder"
    args = ["ladder", "-m", MODEL, *(a for r in [*recipes, OTHER_TRUNK] for a in ("-r", r)), "-o", str(out),
            "--seeds", "42", "--limit", "2", "--max-tokens", "16", "-t", "1"]
    r = CliRunner().invoke(main, [*args, "--json"])
    assert r.exit_code in (0, 1), r.output  # 1: two prompts leave a head inconclusive
    d = json.loads(r.stdout)
    variants = {v["variant"]: v for v in d["variants"]}
    assert list(variants) == [*HEADS, "Q8_0"] and all(v["ok"] for v in variants.values()), r.output
    verification = {t: read_receipt(Path(v["summary"]["receipt"])).statement["predicate"]["verification"]
                    for t, v in variants.items()}
    phase = {t: v["settings"]["reference_phase"] for t, v in verification.items()}
    first, *rest = HEADS
    assert phase[first]["cached"] is False and all(phase[t]["cached"] is True for t in rest), phase
    assert len({phase[t]["key"] for t in HEADS}) == 1 and phase["Q8_0"]["key"] != phase[first]["key"], phase
    assert phase["Q8_0"]["cached"] is False, phase
    for t in HEADS:  # each head judged on its own: its own MTP arm's counts beside the one reference's
        head = verification[t]["head"]
        assert head["findings"] and head["pairs"], head
        assert [p["reference_drafted"] for p in head["pairs"]] == \
            [p["reference_drafted"] for p in verification[first]["head"]["pairs"]]
        assert variants[t]["summary"]["reference"] == phase[t]
    assert d["references"] == [
        {"key": phase[first]["key"], "trunk": phase[first]["trunk"], "measured_by": [first], "reused_by": rest},
        {"key": phase["Q8_0"]["key"], "trunk": phase["Q8_0"]["trunk"], "measured_by": ["Q8_0"], "reused_by": []}]
    again = CliRunner().invoke(main, args)  # the console: a rerun reuses every variant and says how the reference was had
    assert f"reference (trunk {phase[first]['trunk']}): measured once ({first}), reused by 2 variants " \
           f"({', '.join(rest)}): the same trunk" in again.output, again.output


def _model(path: Path, *, name: str = "m", head: float = 1.0, trunk: float = 2.0, rope: float = 1e6,
           imatrix: str | None = None) -> Path:
    """A two-block GGUF whose last block is the MTP block (``nextn_predict_layers`` 1)."""
    import numpy as np
    from gguf import GGUFWriter

    w = GGUFWriter(path, arch="qwen35moe")
    w.add_name(name)
    w.add_block_count(2)
    w.add_uint32("qwen35moe.nextn_predict_layers", 1)
    w.add_rope_freq_base(rope)
    if imatrix:
        w.add_string("quantize.imatrix.file", imatrix)
    w.add_tensor("token_embd.weight", np.full((8, 32), trunk, dtype=np.float32))
    w.add_tensor("blk.0.attn_norm.weight", np.full(32, trunk, dtype=np.float32))
    w.add_tensor("blk.1.nextn.eh_proj.weight", np.full((32, 64), head, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_the_trunk_digest_is_the_trunk_s_tensors_and_the_keys_the_server_computes_with(tmp_path):
    """Another head, name or imatrix file name: the same trunk; another trunk tensor byte or a
    hyperparameter the server reads: another trunk."""
    from ggufmtp.gguf.trunk import trunk_digest

    base = trunk_digest(_model(tmp_path / "a.gguf"))
    assert trunk_digest(_model(tmp_path / "b.gguf", head=3.0, name="other", imatrix="x.dat")) == base
    assert trunk_digest(_model(tmp_path / "c.gguf", trunk=2.5)) != base
    assert trunk_digest(_model(tmp_path / "d.gguf", rope=1e4)) != base


def test_a_trunk_whose_tensors_cannot_be_read_is_one_error_naming_the_file(tmp_path):
    """The trunk digest reads every tensor: a file cut short inside its tensor data is refused by the
    GGUF reader's error naming the file, before anything is hashed."""
    from ggufmtp.gguf.trunk import trunk_digest

    src = _model(tmp_path / "whole.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(src.read_bytes()[:-100])
    with pytest.raises(GGUFReadError, match=f"{cut}: truncated GGUF"):
        trunk_digest(cut)


def test_the_trunk_digest_is_read_once_per_artifact_then_remembered_by_its_files(tmp_path):
    """Hashing a 20 GB trunk costs a read: with a memo, the digest is looked up by the files' sha256
    first (the file below is cut short after the first read: the memo answers without reading it),
    and files with other digests are read again (and the cut file is refused)."""
    from ggufmtp.files.memo import JsonMemo
    from ggufmtp.gguf.trunk import TRUNK_DIGEST_VERSION, trunk_digest

    path = _model(tmp_path / "a.gguf")
    memo = JsonMemo(tmp_path / "trunks.json", version=TRUNK_DIGEST_VERSION)
    first = trunk_digest(path, ["f" * 64], memo)
    path.write_bytes(path.read_bytes()[:-100])
    assert trunk_digest(path, ["f" * 64], memo) == first
    with pytest.raises(GGUFReadError, match="truncated"):
        trunk_digest(path, ["e" * 64], memo)


@pytest.mark.runtime
def test_a_split_set_has_the_trunk_of_the_same_model_in_one_file(llama_runtime, tmp_path):
    """Every shard is read and the split.* keys are layout: the same quant split into shards has the
    trunk of its one-file form, and another recipe's trunk differs."""
    from ggufmtp.gguf.trunk import trunk_digest

    def quantize(recipe: str, out: Path, *split: str) -> list[str]:
        r = CliRunner().invoke(main, ["quantize", MODEL, "-r", recipe, "-o", str(out), *split, "--json"])
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout).get("shards") or [str(out)]

    shards = quantize("q8_0-mtp", tmp_path / "split" / "m.gguf", "--split-max-size", "1M")
    assert len(shards) >= 3
    one = quantize("q8_0-mtp", tmp_path / "one.gguf")[0]
    other = quantize("q4_k_m-mtp-q8", tmp_path / "other.gguf")[0]
    assert trunk_digest(shards[0]) == trunk_digest(one) != trunk_digest(other)
