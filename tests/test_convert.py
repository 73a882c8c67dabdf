"""From safetensors (issue #20): synth --format hf -> convert (the pinned convert_hf_to_gguf.py) ->
inspect -> audit --source -> quantize -> verify, and the checkpoints that must give a clear answer.

The converter runs for real (a subprocess with the pinned gguf-py); the checkpoint is the synth
model's own weights, so the converted GGUF drafts like the synth GGUF does."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("torch", reason="the convert extra (pip install 'ggufmtp[convert]')")

from ggufmtp.cli import main  # noqa: E402
from ggufmtp.errors import ConvertError  # noqa: E402
from ggufmtp.gguf.model import GGUFModel, inspect_model  # noqa: E402
from ggufmtp.hfconvert.convert import check_converted, convert, source_record_path  # noqa: E402
from ggufmtp.hfconvert.source import read_checkpoint  # noqa: E402
from ggufmtp.synth.hf import INDEX_NAME, synthesize_hf  # noqa: E402
from ggufmtp.synth.spec import SynthSpec  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fakehub import FakeHub, isolate_hf_client  # noqa: E402


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("hf") / "tiny-hf"
    synthesize_hf(d, SynthSpec(), shards=2)
    return d


@pytest.fixture(scope="module")
def converted(checkpoint, tmp_path_factory, llama_runtime) -> Path:
    out = tmp_path_factory.mktemp("conv") / "model-bf16.gguf"
    convert(checkpoint, out, progress=False)
    return out


def _cli(args: list[str], env: dict | None = None):
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


def test_synth_hf_writes_a_sharded_checkpoint_with_an_mtp_head(checkpoint):
    index = json.loads((checkpoint / INDEX_NAME).read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert shards == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    cfg = json.loads((checkpoint / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3_5MoeForCausalLM"] and cfg["mtp_num_hidden_layers"] == 1
    ck = read_checkpoint(checkpoint)
    names = {t.name for t in ck.mtp.tensors}
    assert {"mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.norm.weight"} <= names
    assert ck.mtp.layers == 1 and ck.mtp.trunk_layers == 4
    assert (checkpoint / "tokenizer.json").is_file() and (checkpoint / "tokenizer_config.json").is_file()


def test_convert_keeps_the_mtp_block_and_records_the_source(checkpoint, converted):
    rep = inspect_model(converted)
    assert rep.mtp_status == "complete" and rep.block_count == 5 and rep.nextn_predict_layers == 1
    assert rep.architecture == "qwen35moe"
    record = json.loads(Path(str(converted) + ".source.json").read_text())
    files = {f["path"]: f["sha256"] for f in record["files"]}
    assert "model-00001-of-00002.safetensors" in files and "config.json" in files
    assert not list(converted.parent.glob(".*converting*"))


def test_audit_source_matches_then_finds_a_tampered_gguf_and_a_tampered_source(checkpoint, converted, tmp_path):
    r = _cli(["audit", converted, "--source", checkpoint, "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.output)
    assert res["ok"] and res["scope"] == "mtp" and res["n_tensors"] >= 20 and res["n_mismatches"] == 0
    r = _cli(["audit", converted, "--source", checkpoint, "--all", "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["n_tensors"] == len(GGUFModel(converted).tensors)
    # one value of the MTP block changed in the GGUF
    bad = tmp_path / "bad.gguf"
    shutil.copy(converted, bad)
    m = GGUFModel(bad)
    off = m.tensor_data_offsets["blk.4.nextn.eh_proj.weight"]
    with open(bad, "r+b") as fh:
        fh.seek(off + 2)
        b = fh.read(1)
        fh.seek(off + 2)
        fh.write(bytes([b[0] ^ 0x40]))
    r = _cli(["audit", bad, "--source", checkpoint])
    assert r.exit_code == 1 and "MISMATCH blk.4.nextn.eh_proj.weight" in r.output
    # one value of the MTP head changed in the source
    src = tmp_path / "src"
    shutil.copytree(checkpoint, src)
    _tamper_source(src, "mtp.fc.weight")
    r = _cli(["audit", converted, "--source", src])
    assert r.exit_code == 1 and "blk.4.nextn.eh_proj.weight" in r.output


def test_audit_source_never_writes_and_add_source_records_a_bound_pass(checkpoint, converted, tmp_path):
    """#28 finding 6: `audit --source` wrote a source section into whatever receipt was named, without
    a digest binding and even when the comparison failed. An audit never writes; `receipt
    add-source` records a passing comparison bound to the artifact's sha256, and refuses the rest."""
    from receipt_kit import honest_statement

    from ggufmtp.files.hashing import sha256_file
    from ggufmtp.provenance.audit import audit
    from ggufmtp.provenance.receipt import load_receipt

    art = tmp_path / converted.name
    shutil.copy(converted, art)
    rc = tmp_path / (art.name + ".receipt.json")
    rc.write_text(json.dumps(honest_statement(art, None)))
    before = rc.read_bytes()
    r = _cli(["audit", art, "--source", checkpoint, "--receipt", rc])
    assert r.exit_code == 0, r.output
    assert rc.read_bytes() == before and "written" not in r.output  # an audit never writes
    # a failing comparison is not recorded
    src = tmp_path / "src"
    shutil.copytree(checkpoint, src)
    _tamper_source(src, "mtp.fc.weight")
    r = _cli(["receipt", "add-source", art, "--source", src])
    assert r.exit_code == 1 and "mismatch" in r.stderr and rc.read_bytes() == before
    # another file's receipt is not given the section
    other = tmp_path / "other.receipt.json"
    other.write_text(json.dumps({**honest_statement(art, None), "subject": [
        {"name": art.name, "digest": {"sha256": "ab" * 32}, "annotations": {"size": art.stat().st_size}}]}))
    r = _cli(["receipt", "add-source", art, "--source", checkpoint, "--receipt", other])
    assert r.exit_code == 1 and "not recorded" in r.stderr
    # the explicit command, on a passing comparison: bound to the artifact's digest, the receipt still audits
    r = _cli(["receipt", "add-source", art, "--source", checkpoint, "--json"])
    assert r.exit_code == 0, r.output
    section = load_receipt(rc)["predicate"]["source"]
    assert section["ok"] and section["artifact_sha256"] == sha256_file(art) and "path" not in section
    assert audit(art, rc).ok


def test_add_source_refuses_a_checkpoint_with_the_same_head_on_another_trunk(checkpoint, converted, tmp_path):
    """#40: `receipt add-source` recorded any checkpoint whose MTP block matched, though the
    receipt's base model was converted from another one (`base_model.converted_from`): a trunk
    tensor changed is the same head on another model."""
    from receipt_kit import honest_statement

    from ggufmtp.provenance.audit import audit
    from ggufmtp.provenance.receipt import converted_from, seal

    art = tmp_path / converted.name
    shutil.copy(converted, art)
    st = honest_statement(art, None)
    st["predicate"]["base_model"]["converted_from"] = converted_from(converted)
    rc = tmp_path / (art.name + ".receipt.json")
    rc.write_text(json.dumps(seal(st)))
    before = rc.read_bytes()
    other = tmp_path / "other-trunk"
    shutil.copytree(checkpoint, other)
    trunk = next(n for n in json.loads((other / INDEX_NAME).read_text())["weight_map"] if not n.startswith("mtp."))
    _tamper_source(other, trunk)
    r = _cli(["audit", art, "--source", other])
    assert r.exit_code == 0, r.output  # the MTP block alone matches
    r = _cli(["receipt", "add-source", art, "--source", other])
    assert r.exit_code == 1 and "converted from" in r.stderr and "safetensors" in r.stderr, r.output
    assert rc.read_bytes() == before
    r = _cli(["receipt", "add-source", art, "--source", checkpoint])
    assert r.exit_code == 0, r.output
    assert audit(art, rc).ok


def _tamper_source(directory: Path, name: str) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    shard = json.loads((directory / INDEX_NAME).read_text())["weight_map"][name]
    tensors = load_file(str(directory / shard))
    tensors[name] = tensors[name].clone()
    tensors[name][0, 0] += torch.tensor(0.5, dtype=tensors[name].dtype)
    save_file(tensors, str(directory / shard), metadata={"format": "pt"})


def test_a_config_without_the_mtp_layer_count_converts_with_the_inferred_count(tmp_path, llama_runtime):
    d = tmp_path / "no-count"
    synthesize_hf(d, SynthSpec(), mtp_layers_in_config=False)
    assert "mtp_num_hidden_layers" not in json.loads((d / "config.json").read_text())
    assert read_checkpoint(d).mtp.layers == 1
    res = convert(d, tmp_path / "m.gguf", progress=False)
    assert res.nextn_predict_layers == 1 and res.block_count == 5 and res.mtp_status == "complete"


def test_a_checkpoint_without_mtp_tensors_is_a_clear_answer(tmp_path):
    d = tmp_path / "no-mtp"
    synthesize_hf(d, SynthSpec(), drop_mtp=True)
    r = _cli(["convert", d, "-o", tmp_path / "m.gguf"])
    assert r.exit_code == 1 and "no mtp.* tensors" in r.output
    assert not (tmp_path / "m.gguf").exists()


def _glm_style_checkpoint(d: Path, nextn_layers: int, write_nextn: bool) -> Path:
    """Headers of a GLM-4.5 / DeepSeek-V3-style checkpoint: the NextN layer is stored as decoder layer
    ``num_hidden_layers`` (``model.layers.2.*`` here), counted by ``num_nextn_predict_layers``."""
    import numpy as np
    from safetensors.numpy import save_file

    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["Glm4MoeForCausalLM"], "num_hidden_layers": 2,
                                               "num_nextn_predict_layers": nextn_layers}))
    z = np.zeros((4, 4), dtype=np.float32)
    tensors = {"model.embed_tokens.weight": z, "lm_head.weight": z, "model.norm.weight": z[0]}
    for i in range(2):
        tensors |= {f"model.layers.{i}.input_layernorm.weight": z[0], f"model.layers.{i}.mlp.down_proj.weight": z}
    if write_nextn:
        tensors |= {f"model.layers.2.{n}": z for n in ("eh_proj.weight", "enorm.weight", "hnorm.weight",
                                                     "shared_head.norm.weight", "input_layernorm.weight",
                                                     "self_attn.q_proj.weight")}
    save_file(tensors, str(d / "model.safetensors"))
    return d


def test_glm_and_deepseek_style_nextn_layers_are_the_mtp_head(tmp_path):
    """GLM/DeepSeek checkpoints have no ``mtp.*`` tensors: their MTP head is the decoder layer after
    the trunk. It is found (the converter keeps it: ``num_nextn_predict_layers``), and a checkpoint
    whose config promises it but whose shards lack it is the same clear refusal as a Qwen one."""
    head = read_checkpoint(_glm_style_checkpoint(tmp_path / "glm", 1, write_nextn=True)).mtp
    assert head.present and head.layers == 1 and head.layers_in_tensors == 1 and head.trunk_layers == 2
    assert head.config_key == "num_nextn_predict_layers"
    assert {t.name for t in head.tensors} == {f"model.layers.2.{n}" for n in (
        "eh_proj.weight", "enorm.weight", "hnorm.weight", "shared_head.norm.weight", "input_layernorm.weight",
        "self_attn.q_proj.weight")}
    stripped = _glm_style_checkpoint(tmp_path / "stripped", 1, write_nextn=False)
    assert not read_checkpoint(stripped).mtp.present
    r = _cli(["convert", stripped, "-o", tmp_path / "m.gguf"])
    assert r.exit_code == 1 and "no NextN layers" in r.output and "num_nextn_predict_layers=1" in r.output
    assert not (tmp_path / "m.gguf").exists()


def test_a_corrupted_shard_is_one_error_naming_it(checkpoint, tmp_path):
    d = tmp_path / "corrupt"
    shutil.copytree(checkpoint, d)
    shard = d / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-1000])
    with pytest.raises(ConvertError, match="model-00002-of-00002.safetensors.*(truncated|damaged)"):
        convert(d, tmp_path / "m.gguf", progress=False)
    assert not (tmp_path / "m.gguf").exists()


def test_a_converter_output_without_the_mtp_block_is_refused(checkpoint, synth_model):
    """What an older converter did (return early on mtp.*): the check names what is missing."""
    no_mtp = synth_model(SynthSpec(mtp=False))
    with pytest.raises(ConvertError, match="lost the MTP block.*nextn_predict_layers 0"):
        check_converted(no_mtp, read_checkpoint(checkpoint))


@pytest.mark.runtime
def test_converted_model_quantizes_and_drafts_with_a_receipt_naming_the_safetensors(converted, tmp_path):
    import ggufmtp
    from ggufmtp.provenance.receipt import load_receipt

    q = ggufmtp.quantize(converted, "q8_0-mtp", tmp_path / "q8.gguf", progress=False)
    receipt = ggufmtp.write_receipt(q)
    base = load_receipt(receipt)["predicate"]["base_model"]
    assert any(f["path"] == "model-00001-of-00002.safetensors" for f in base["converted_from"]["files"])
    v = ggufmtp.verify(q.output, ggufmtp.VerifyOptions(draft_n_max=2, seeds=(42,), limit=1, max_tokens=16,
                                                       server=ggufmtp.ServerOptions(threads=2)), progress=False)
    mtp = v.to_receipt()["mtp"]
    assert mtp["draft_n"] > 0 and mtp["draft_n_accepted"] / mtp["draft_n"] > 0.9


@pytest.fixture
def hub_repo(checkpoint, tmp_path, monkeypatch):
    isolate_hf_client(tmp_path / "hfhome", monkeypatch)
    with FakeHub() as fh:
        fh.create_repo("me/tiny-hf")
        fh.commit("me/tiny-hf", {p.name: p.read_bytes() for p in checkpoint.iterdir()})
        monkeypatch.setenv("HF_ENDPOINT", fh.url)
        yield fh


def test_pull_check_mtp_reads_headers_only_then_pull_and_convert_from_the_hub(hub_repo, tmp_path, llama_runtime):
    r = _cli(["pull", "me/tiny-hf", "--check-mtp", "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["has_mtp"] and res["mtp"]["layers"] == 1
    assert {"name": "mtp.fc.weight", "dtype": "BF16", "shape": [256, 512],
            "file": "model-00002-of-00002.safetensors"} in res["mtp"]["tensors"]
    lfs_gets = [q for q in hub_repo.requests if q.server == "cdn" and q.method == "GET"
                and not q.headers.get("range")]
    assert not lfs_gets, "check-mtp downloaded whole files"
    res = convert("me/tiny-hf", tmp_path / "hub.gguf", progress=False)
    assert res.repo_id == "me/tiny-hf" and res.commit == hub_repo.head("me/tiny-hf")
    assert res.mtp_status == "complete"


def test_run_accepts_a_safetensors_hub_repo(hub_repo, tmp_path, llama_runtime):
    import ggufmtp

    r = ggufmtp.run("me/tiny-hf", "q8_0-mtp", ggufmtp.RunOptions(verify=False), out_dir=tmp_path / "run",
                    progress=False)
    converted = list((tmp_path / "run" / "converted").rglob("model-bf16.gguf"))
    assert len(converted) == 1 and inspect_model(converted[0]).mtp_status == "complete"
    record = json.loads(source_record_path(converted[0]).read_text())
    assert record["repo_id"] == "me/tiny-hf" and record["commit"] == hub_repo.head("me/tiny-hf")
    assert [s.stage for s in r.stages][:2] == ["pull", "inspect"]


def test_run_accepts_a_safetensors_directory(checkpoint, tmp_path, llama_runtime):
    import ggufmtp

    r = ggufmtp.run(str(checkpoint), "q8_0-mtp", ggufmtp.RunOptions(verify=False), out_dir=tmp_path / "run",
                    progress=False)
    converted = list((tmp_path / "run" / "converted").rglob("model-bf16.gguf"))
    assert len(converted) == 1 and inspect_model(converted[0]).mtp_status == "complete"
    assert r.stages
    # the second run reuses the conversion (same source digests): no second converted file, same mtime
    before = converted[0].stat().st_mtime_ns
    ggufmtp.run(str(checkpoint), "q8_0-mtp", ggufmtp.RunOptions(verify=False), out_dir=tmp_path / "run",
                progress=False)
    assert converted[0].stat().st_mtime_ns == before
