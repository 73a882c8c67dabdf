"""Split artifacts (#41 item 3): ``--split-max-size`` writes llama.cpp-compatible shards with the pinned
llama-gguf-split, one receipt covers every shard, audit finds the MTP head across the shards and refuses
a missing, extra, reordered, renamed or tampered shard naming the file, llama-server loads the set from
its first shard, and upload sends the whole set (a partial one is refused)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from gguf.constants import Keys

from ggufmtp.cli import main
from ggufmtp.errors import GGUFReadError, HubRefusedError
from ggufmtp.gguf.model import GGUFModel, check_mtp, has_mtp_head, is_mtp_sidecar, shard_path
from ggufmtp.gguf.reader import read_header
from ggufmtp.hub.upload import UploadOptions, upload
from ggufmtp.provenance.audit import audit
from ggufmtp.provenance.receipt import read_receipt
from ggufmtp.quant.split import DEFAULT_SPLIT_MAX_SIZE, HUB_FILE_LIMIT, SplitSize, parse_split_size

SIZE = "1M"  # the tiny model is about 4 MB: at least 3 shards


@pytest.fixture(scope="module")
def split_set(llama_runtime, synth_model, tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("split")
    out = d / "tiny-Q4_K_M.gguf"
    res = CliRunner().invoke(main, ["quantize", str(synth_model("tiny-qwen35moe")), "-r", "hifi-q4_k_m-mtp",
                                    "-o", str(out), "--split-max-size", SIZE, "--json"])
    assert res.exit_code == 0, res.output
    made = json.loads(res.stdout)
    shards = [Path(p) for p in made["shards"]]
    return {"dir": d, "out": out, "shards": shards, "receipt": Path(made["receipt"])}


def _copy(split_set: dict, where: Path) -> list[Path]:
    for p in [*split_set["shards"], split_set["receipt"]]:
        shutil.copy(p, where / p.name)
    return [where / p.name for p in split_set["shards"]]


def test_shards_are_what_llama_gguf_split_writes(split_set):
    shards = split_set["shards"]
    n = len(shards)
    assert n >= 3 and not split_set["out"].exists()
    assert [p.name for p in shards] == [f"tiny-Q4_K_M-{i:05d}-of-{n:05d}.gguf" for i in range(1, n + 1)]
    assert all(p.stat().st_size <= SplitSize(SIZE).n_bytes + 2**20 for p in shards)  # + the first's metadata
    total = 0
    for i, p in enumerate(shards):
        h = read_header(p)
        assert (h.metadata[Keys.Split.LLM_KV_SPLIT_NO], h.metadata[Keys.Split.LLM_KV_SPLIT_COUNT]) == (i, n)
        total += len(h.tensors)
    assert read_header(shards[0]).metadata[Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT] == total
    assert "general.architecture" not in read_header(shards[1]).metadata  # metadata in the first only


def test_the_head_is_found_across_shards(split_set):
    first = split_set["shards"][0]
    model = GGUFModel(first)
    head = model.tensors["blk.4.nextn.eh_proj.weight"]
    assert head.shard > 0  # written last by llama-quantize: not in the first shard
    assert check_mtp(model).status == "complete"
    # these read only the file they were given before: the head is in another shard
    assert has_mtp_head(first) is True and is_mtp_sidecar(first) is False


def test_the_receipt_covers_every_shard_in_order(split_set):
    rc = read_receipt(split_set["receipt"])
    assert split_set["receipt"].name == split_set["shards"][0].name + ".receipt.json"
    assert [s.name for s in rc.subjects] == [p.name for p in split_set["shards"]]
    assert [s.size for s in rc.subjects] == [p.stat().st_size for p in split_set["shards"]]
    assert rc.predicate["result"]["split"] == {"count": len(split_set["shards"]), "max_size": SIZE,
                                               "tool": "llama-gguf-split"}
    assert rc.predicate["result"]["size_bytes"] == sum(p.stat().st_size for p in split_set["shards"])
    report = audit(split_set["shards"][0], progress=False)
    assert report.ok, report.failures
    assert audit(split_set["shards"][-1], split_set["receipt"], progress=False).ok  # any shard names the set


def _missing(s: list[Path]) -> str:
    s[1].unlink()
    return s[1].name


def _extra(s: list[Path]) -> str:
    extra = s[0].with_name(s[0].name.replace("-00001-", "-00009-"))
    shutil.copy(s[-1], extra)
    return extra.name


def _reordered(s: list[Path]) -> str:
    tmp = s[0].with_name("swap")
    os.replace(s[1], tmp)
    os.replace(s[2], s[1])
    os.replace(tmp, s[2])
    return s[1].name


def _renamed(s: list[Path]) -> str:
    n = len(s)
    for i, p in enumerate(s, 1):
        os.replace(p, shard_path(p.with_name("other.gguf"), i, n))
    s[0] = shard_path(s[0].with_name("other.gguf"), 1, n)
    return s[0].name


def _tampered(s: list[Path]) -> str:
    data = bytearray(s[-1].read_bytes())
    data[-64] ^= 0x01
    s[-1].write_bytes(data)
    return s[-1].name


@pytest.mark.parametrize("attack", [_missing, _extra, _reordered, _renamed, _tampered])
def test_audit_refuses_a_changed_set_naming_the_file(split_set, tmp_path, attack):
    shards = _copy(split_set, tmp_path)
    named = attack(shards)
    report = audit(shards[0], tmp_path / split_set["receipt"].name, progress=False)
    assert not report.ok
    assert any(named in c.detail or named in c.name for c in report.failures), report.failures
    if attack is not _reordered:  # one clear error (a reordered set: the shard out of place, and two digests)
        assert len(report.failures) == 1, report.failures


def test_a_file_that_says_it_is_a_shard_must_be_named_as_one(split_set, tmp_path):
    lone = tmp_path / "renamed.gguf"
    shutil.copy(split_set["shards"][0], lone)
    with pytest.raises(GGUFReadError, match=r"renamed\.gguf: declares itself shard 0 of a \d+-file split"):
        GGUFModel(lone)


def test_upload_sends_the_whole_set_and_refuses_a_partial_one(split_set, tmp_path):
    shards = _copy(split_set, tmp_path)
    rc = tmp_path / split_set["receipt"].name
    card = tmp_path / "README.md"
    res = CliRunner().invoke(main, ["card", str(shards[0]), "--receipt", str(rc), "-o", str(card)])
    assert res.exit_code == 0, res.output
    opts = UploadOptions(dry_run=True, allow_unverified=True)
    done = upload("you/tiny", [shards[1]], [rc], card, opts, progress=False)  # any shard: the whole set
    sent = [op.path_in_repo for op in done.operations]
    assert sent[:len(shards)] == [p.name for p in shards] and rc.name in sent
    shards[2].unlink()
    with pytest.raises(HubRefusedError, match=f"partial split set.*{shards[2].name}"):
        upload("you/tiny", [shards[0]], [rc], card, opts, progress=False)


def test_a_file_under_the_size_stays_one_file(split_set):
    rc = read_receipt(split_set["receipt"])
    assert DEFAULT_SPLIT_MAX_SIZE.n_bytes < HUB_FILE_LIMIT
    assert rc.predicate["result"]["size_bytes"] < SplitSize("5M").n_bytes  # so --split-max-size 5M: one file
    assert parse_split_size("none") is None and parse_split_size("48g") == SplitSize("48G")


def test_split_size_is_refused_as_a_usage_error():
    res = CliRunner().invoke(main, ["quantize", "m.gguf", "-r", "Q4_K_M", "-o", "o.gguf", "--split-max-size", "2K"])
    assert res.exit_code == 2 and "'2K'" in res.output and "48G" in res.output


@pytest.mark.runtime
def test_a_runtime_built_before_llama_gguf_split_is_extended_not_rebuilt(tmp_path, monkeypatch):
    from ggufmtp.runtime import build as rt

    real = rt.installed_runtime()  # the one the suite runs with (a CUDA build on a GPU machine)
    assert real is not None
    cuda = real.variant.startswith("cuda-sm")
    cache = tmp_path / "cache"
    (cache / "llama.cpp").mkdir(parents=True)
    old = cache / "llama.cpp" / real.bin_dir.parent.name
    shutil.copytree(real.bin_dir.parent, old, symlinks=True, ignore=shutil.ignore_patterns("llama-gguf-split", ".*"))
    for sub in ("build", "src"):  # the build folder and source tree that made it, as on the machine that built it
        (cache / sub).symlink_to(rt.cache_root() / sub)
    monkeypatch.setenv(rt.ENV_CACHE, str(cache))
    monkeypatch.delenv(rt.ENV_BIN, raising=False)
    info = rt.installed_runtime(real.variant)
    assert info is not None and not (info.bin_dir / "llama-gguf-split").exists()  # still loads without it
    lib_mtime = (info.bin_dir / "libllama.so").stat().st_mtime_ns
    logged: list[str] = []
    build = {"cuda": cuda, "cuda_arch": real.variant.removeprefix("cuda-sm") if cuda else "90"}
    again = rt.build_runtime(**build, log=logged.append)  # what `make` and CI run: extends it
    assert (again.bin_dir / "llama-gguf-split").is_file()
    assert any("llama-gguf-split" in m and "own target only" in m for m in logged)
    assert (again.bin_dir / "libllama.so").stat().st_mtime_ns == lib_mtime  # nothing else rebuilt
    logged.clear()
    assert rt.find_binary("llama-gguf-split") == again.bin_dir / "llama-gguf-split"
    rt.build_runtime(**build, log=logged.append)  # idempotent: nothing to do the second time
    assert not any("building" in m or "configuring" in m for m in logged)


def test_llama_server_loads_the_set_from_its_first_shard_and_verify_binds_it(split_set, llama_server_bin, tmp_path):
    import ggufmtp

    shards = _copy(split_set, tmp_path)
    rc = tmp_path / split_set["receipt"].name
    opts = ggufmtp.VerifyOptions(seeds=(42,), limit=2, max_tokens=16, ctx_size=1024)
    v = ggufmtp.verify(shards[0], opts, receipt=rc, progress=False)
    assert v.main.acceptance > 0.5  # drafted with the head that lies in the last shard
    report = audit(shards[0], rc, progress=False)
    assert report.ok, report.failures
    assert read_receipt(rc).verification["model"]["sha256"] == read_receipt(rc).subjects[0].sha256


def test_a_ladder_file_splits_its_variants_and_the_card_lists_each_set_once(llama_runtime, synth_model, tmp_path):
    lad = tmp_path / "ladder.toml"
    lad.write_text(f'model = "{synth_model("tiny-qwen35moe")}"\nrecipes = ["q8_0-mtp"]\nsplit_max_size = "2M"\n')
    argv = ["ladder", "--ladder", str(lad), "--no-verify", "-o", str(tmp_path / "out"), "--json"]
    first = CliRunner().invoke(main, argv)
    assert first.exit_code == 0, first.output
    variant = json.loads(first.stdout)["variants"][0]["summary"]
    art = Path(variant["artifact"])
    n = len(read_receipt(variant["receipt"]).subjects)
    assert n >= 3 and art.name == f"{art.name.split('-00001-')[0]}-00001-of-{n:05d}.gguf"
    card = (tmp_path / "out" / "README.md").read_text()
    assert card.count(f"]({art.name}) ({n} shards) |") == 1  # one row: the first shard, the set's total size
    assert f'--include "{art.name.replace("-00001-", "-*-")}"' in card
    again = json.loads(CliRunner().invoke(main, argv).stdout)["variants"][0]["summary"]
    assert again["stages"]["quantize"] == "cached" and again["artifact"] == variant["artifact"]
    lad.write_text(lad.read_text().replace('"2M"', '"2 GB"'))
    bad = CliRunner().invoke(main, argv)
    assert bad.exit_code == 1 and f"{lad}: split_max_size: split size '2 GB'" in bad.output


def test_a_signed_split_set_has_every_shard_signed(split_set, synth_model, tmp_path):
    from fakehub import write_keypair

    priv, pub = write_keypair(tmp_path, "signer")
    out = tmp_path / "signed-Q8_0.gguf"
    res = CliRunner().invoke(main, ["quantize", str(synth_model("tiny-qwen35moe")), "-r", "q8_0-mtp", "-o", str(out),
                                    "--split-max-size", "3M", "--signing-key", str(priv), "--json"])
    assert res.exit_code == 0, res.output
    shards = [Path(p) for p in json.loads(res.stdout)["shards"]]
    assert len(shards) >= 2 and all(Path(f"{p}.sig").is_file() for p in shards)
    report = audit(shards[0], public_key=pub, progress=False)
    assert report.ok, report.failures
    os.replace(f"{shards[0]}.sig", f"{shards[-1]}.sig")  # the last shard's signature is now the first's
    assert any(shards[-1].name in c.name for c in audit(shards[0], public_key=pub, progress=False).failures)


def test_verify_given_a_later_shard_names_the_first_before_any_server_starts(split_set):
    import ggufmtp

    later, first = split_set["shards"][1], split_set["shards"][0]
    res = CliRunner().invoke(main, ["verify", str(later), "--limit", "1", "--max-tokens", "8"])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert f"{later}: shard 2 of {len(split_set['shards'])} of a split model; give its first shard, {first.name}" \
        in res.output
    with pytest.raises(GGUFReadError, match="give its first shard"):
        ggufmtp.verify(later, progress=False)


def test_a_build_folder_configured_from_another_tree_is_configured_again(tmp_path):
    from ggufmtp.runtime.build import _configured_from

    src, other = tmp_path / "src", tmp_path / "other"
    src.mkdir(), other.mkdir()
    build = tmp_path / "build"
    build.mkdir()
    assert not _configured_from(build, src)  # no configuration at all (a cache that lost its build folder)
    (build / "CMakeCache.txt").write_text(f"CMAKE_HOME_DIRECTORY:INTERNAL={other}\n")
    assert not _configured_from(build, src)
    (build / "CMakeCache.txt").write_text(f"X:BOOL=ON\nCMAKE_HOME_DIRECTORY:INTERNAL={src}\n")
    assert _configured_from(build, src)


def test_inspect_reads_the_set_as_one_model(split_set):
    res = CliRunner().invoke(main, ["inspect", str(split_set["shards"][-1])])
    assert res.exit_code == 0, res.output
    assert f"({len(split_set['shards'])} shards)" in res.output and "COMPLETE  (block blk.4)" in res.output


def test_a_split_ladder_variant_goes_up_whole_in_the_ladder_commit(llama_runtime, synth_model, tmp_path, monkeypatch):
    from fakehub import FakeHub, isolate_hf_client

    from ggufmtp.ladder.publish import upload_ladder
    from ggufmtp.ladder.run import run_ladder
    from ggufmtp.ladder.spec import LadderSpec

    spec = LadderSpec(model=str(synth_model("tiny-qwen35moe")), recipes=("q8_0-mtp",), out_dir=tmp_path / "out",
                      verify=False, split_max_size="3M").check()
    res = run_ladder(spec, progress=False, log=lambda m: None)
    (art, rc), = res.variants()
    shards = [s.name for s in read_receipt(rc).subjects]
    assert len(shards) >= 2 and art.name == shards[0]
    isolate_hf_client(tmp_path / "hf_home", monkeypatch)
    monkeypatch.delenv("GGUFMTP_PUBLIC_KEY", raising=False)
    with FakeHub(tokens=("hf_SPLITtoken0001",)) as fake:
        upload_ladder(res, "me/split", UploadOptions(token="hf_SPLITtoken0001", endpoint=fake.url,
                                                    allow_unverified=True), progress=False)
        files = set(fake.history("me/split")[0].files)
        assert files == {*shards, rc.name, "README.md", ".gitattributes"}
        assert all(fake.file("me/split", s) == (art.parent / s).read_bytes() for s in shards)


def test_a_new_split_replaces_the_old_set_and_never_the_input(split_set, synth_model, tmp_path):
    src = synth_model("tiny-qwen35moe")
    out = tmp_path / "m.gguf"
    runner = CliRunner()
    for size in ("1M", "3M", "none"):  # 5 shards, then 2, then one file: each replaces the one before
        res = runner.invoke(main, ["quantize", str(src), "-r", "q8_0-mtp", "-o", str(out), "--split-max-size", size])
        assert res.exit_code == 0, res.output
        made = sorted(p.name for p in tmp_path.iterdir())
        first = made[0].removesuffix(".receipt.json")
        assert audit(tmp_path / first, progress=False).ok, made
    assert made == ["m.gguf", "m.gguf.receipt.json"]
    inp = split_set["shards"]
    res = runner.invoke(main, ["quantize", str(inp[0]), "-r", "Q8_0", "--allow-requantize", "-o", str(split_set["out"])])
    assert res.exit_code == 1 and "the names a split output would replace" in res.output
    assert all(p.is_file() for p in inp)
