"""Receipts' loose ends (#51 item 4), on real receipts of ``builtin:tiny-qwen35moe``: a searched
recipe found by its sha256; receipts and cards naming files, never the out folder; ``receipt show``
and ``audit`` as the console writes numbers; each receipt read once by ``verify --receipt`` and
``audit``."""

from __future__ import annotations

import re
import shutil
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggufmtp.cli import main
from ggufmtp.errors import VerifyError
from ggufmtp.provenance import recipe_store
from ggufmtp.provenance.receipt import read_receipt

MODEL = "builtin:tiny-qwen35moe"


@pytest.fixture(scope="module")
def searched(tmp_path_factory, llama_runtime) -> tuple[Path, Path, str]:
    """A recipe `ggufmtp search` wrote (tiny settings), a file quantized with it, and its receipt;
    the search's store in this test's folder (the store's place, not what is stored, is redirected)."""
    d = tmp_path_factory.mktemp("searched")
    mp = pytest.MonkeyPatch()
    mp.setattr(recipe_store, "cache_root", lambda: d / "cache")
    recipe = d / "search-out" / "found.toml"
    recipe.parent.mkdir()
    r = CliRunner().invoke(main, ["search", MODEL, "--budget", "8.5bpw", "--types", "Q8_0,Q4_0", "--chunks", "2",
                                  "--ctx-size", "128", "--layers-per-group", "8", "-o", str(recipe), "--json"])
    assert r.exit_code == 0, r.output
    gguf = d / "out" / "model.gguf"
    gguf.parent.mkdir()
    r = CliRunner().invoke(main, ["quantize", MODEL, "-r", str(recipe), "-o", str(gguf)])
    assert r.exit_code == 0, r.output
    yield recipe, Path(f"{gguf}.receipt.json"), recipe.read_text()
    mp.undo()


def test_a_searched_recipe_is_found_by_its_sha256_in_the_store_and_beside_the_receipt(searched, tmp_path, monkeypatch):
    from ggufmtp import _api

    recipe, receipt, text = searched
    named = read_receipt(receipt).predicate["recipe"]
    assert named["name"] == "searched-mtp" and named["file"] == "found.toml"
    moved = tmp_path / "elsewhere.toml"
    shutil.move(recipe, moved)
    try:
        # the search kept it in its store: found by the sha256 although the file it wrote is gone
        assert recipe_store.stored_recipe_path(named["sha256"]).is_file()
        rec = _api.verify_recipe(None, receipt)
        assert rec is not None and rec.sha256 == named["sha256"] and rec.name == "searched-mtp"
        monkeypatch.setattr(recipe_store, "cache_root", lambda: tmp_path / "cache")  # an empty store
        with pytest.raises(VerifyError, match="searched-mtp.*sha256 " + named["sha256"]):
            _api.verify_recipe(None, receipt)  # named, with where it was looked for
        recipe_store.store_recipe(text)
        assert _api.verify_recipe(None, receipt).sha256 == named["sha256"]
        # beside the receipt, by its recorded file name, with the store empty again
        shutil.rmtree(tmp_path / "cache")
        beside = receipt.parent / "found.toml"
        beside.write_text(text)
        assert _api.verify_recipe(None, receipt).sha256 == named["sha256"]
        # a file of that name with other bytes: refused naming both digests
        beside.write_text(text.replace("searched by", "edited; searched by"))
        with pytest.raises(VerifyError) as e:
            _api.verify_recipe(None, receipt)
        assert named["sha256"] in str(e.value) and recipe_store.Recipe.load(beside).sha256 in str(e.value)
        with pytest.raises(VerifyError) as e:  # given with -r: the same
            _api.verify_recipe(str(beside), receipt)
        assert named["sha256"] in str(e.value) and recipe_store.Recipe.load(beside).sha256 in str(e.value)
        beside.unlink()
        # given with -r, the right bytes under any file name
        assert _api.verify_recipe(str(moved), receipt).sha256 == named["sha256"]
    finally:
        shutil.move(moved, recipe)


def _receipts_and_cards(folder: Path) -> list[Path]:
    return sorted([*folder.rglob("*.receipt.json"), *folder.rglob("README.md")])


@pytest.fixture(scope="module")
def sidecar_ladder(tmp_path_factory, llama_runtime) -> Path:
    """A sidecar ladder of the tiny model (one recipe, tiny settings: verified and evaluated) into a
    RELATIVE out folder, ``h2-ladder-out`` under the module's folder (the cwd while it runs)."""
    d = tmp_path_factory.mktemp("ladder")
    (d / "ladder.toml").write_text(
        f'model = "{MODEL}"\nrecipes = ["q8_0-mtp"]\nimatrix_corpus = "builtin:calib-v1"\nimatrix_chunks = 2\n'
        'threads = 1\n[verify]\nseeds = [42]\nlimit = 2\nmax_tokens = 16\nthreads = 1\n'
        '[eval]\ncorpus = "builtin:calib-v1"\nchunks = 2\nctx_size = 128\nthreads = 1\n')
    mp = pytest.MonkeyPatch()
    mp.chdir(d)
    try:
        r = CliRunner().invoke(main, ["ladder", "--ladder", "ladder.toml", "-o", "h2-ladder-out", "--layout", "sidecar",
                                      "--json"])
    finally:
        mp.undo()
    assert r.exit_code in (0, 1) and '"layout": "sidecar"' in r.stdout, r.output
    return d / "h2-ladder-out"


def test_a_sidecar_ladder_s_receipts_and_cards_name_files_never_the_out_folder(sidecar_ladder):
    """The writer turns absolute paths into names, but a relative one passed through: main's trunk
    receipt had ``quality.quant.path`` = ``<out>/Q8_0/<file>``. No receipt or card holds the out
    folder's name or any local path."""
    from ggufmtp.provenance.names import local_paths

    files = _receipts_and_cards(sidecar_ladder)
    receipts = [f for f in files if f.name.endswith(".receipt.json")]
    assert len(receipts) >= 2 and any(f.name.startswith("mtp-") for f in receipts)  # the trunk's and the sidecar's
    trunk = next(f for f in receipts if not f.name.startswith("mtp-") and ".full" not in f.parts)
    assert read_receipt(trunk).predicate["quality"]["quant"]["path"] == trunk.name.removesuffix(".receipt.json")
    for f in files:
        text = f.read_text()
        assert "h2-ladder-out" not in text and str(sidecar_ladder.parent) not in text, f
        if f.suffix == ".json":
            assert local_paths(read_receipt(f).statement) == [], f


def test_a_command_line_stored_in_a_receipt_names_its_files(sidecar_ladder, tmp_path, monkeypatch):
    """What tune stores (``verification.tuned``: llama-server's command line for the model as the
    user named it, ``tune out/m.gguf``) keeps only the files' names, through the receipt writer;
    the store reads the receipt once."""
    from ggufmtp import _api

    receipt = tmp_path / "t.gguf.receipt.json"
    shutil.copy(next(sidecar_ladder.glob("Q8_0/*.receipt.json")), receipt)
    command = ("GGML_X=1 llama-server --model h2-ladder-out/Q8_0/m.gguf -md ../h2-ladder-out/mtp-m.gguf "
               "--chat-template-file tmpl/chat.jinja --spec-type draft-mtp --spec-draft-n-max 3")
    reads = _count_receipt_reads(monkeypatch)
    _api.store_in_receipt(receipt, tuned={"kind": "ggufmtp tune", "command": command})
    assert reads == {receipt.name: 1}, reads
    stored = read_receipt(receipt).verification["tuned"]["command"]
    assert stored == ("GGML_X=1 llama-server --model m.gguf -md mtp-m.gguf --chat-template-file chat.jinja "
                      "--spec-type draft-mtp --spec-draft-n-max 3")


_LONG_FLOAT = re.compile(r"\d\.\d{5,}")


def test_receipt_show_and_audit_read_like_the_console_and_their_json_is_the_receipt_s(sidecar_ladder):
    """The verified trunk (no MTP block; acceptance and speedup with CIs) and the sidecar (a
    llama-quantize type: no recipe file, no recipe sha256): main printed ``blk.None``, ``sha256
    None`` and 17-digit floats. --json stays the receipt's own numbers."""
    import json

    trunk = next(sidecar_ladder.glob("Q8_0/*.receipt.json"))
    side = next(sidecar_ladder.glob("mtp-*.receipt.json"))
    for receipt in (trunk, side):
        artifact = receipt.with_name(receipt.name.removesuffix(".receipt.json"))
        shown = CliRunner().invoke(main, ["receipt", "show", str(receipt)])
        audited = CliRunner().invoke(main, ["audit", str(artifact)])
        assert shown.exit_code == 0 and audited.exit_code == 0, shown.output + audited.output
        for out in (shown.output, audited.output):
            assert "None" not in out and not _LONG_FLOAT.search(out), out
        st = read_receipt(receipt).statement
        assert json.loads(CliRunner().invoke(main, ["receipt", "show", str(receipt), "--json"]).stdout) == st
        assert json.loads(CliRunner().invoke(main, ["audit", str(artifact), "--json"]).stdout)["ok"] is True
    shown = CliRunner().invoke(main, ["receipt", "show", str(trunk)]).output
    v = read_receipt(trunk).predicate["verification"]
    assert f"acceptance {v['mtp']['acceptance'] * 100:.1f} %" in shown and f"speedup {v['speedup']:.2f}×" in shown
    assert "MTP       no block (absent)" in shown
    assert "a llama-quantize type, no recipe file" in CliRunner().invoke(main, ["receipt", "show", str(side)]).output


def test_a_type_recipe_s_card_names_no_sha256_none(tmp_path, llama_runtime):
    """``quantize MODEL OUT Q4_K_M`` (llama-quantize's line: a type, no recipe file): its card said
    ``sha256 `None```."""
    out = tmp_path / "m.gguf"
    assert CliRunner().invoke(main, ["quantize", "--no-progress", MODEL, str(out), "Q4_K_M"]).exit_code == 0
    r = CliRunner().invoke(main, ["card", str(out), "-o", str(tmp_path / "README.md")])
    assert r.exit_code == 0, r.output
    card = (tmp_path / "README.md").read_text()
    assert "None" not in card and "- Recipe: `Q4_K_M-plain` (a llama-quantize type, no recipe file)" in card


def _count_receipt_reads(monkeypatch) -> Counter:
    """Reads of each receipt file by the one reader (read_receipt's file read, wrapped: instrumentation)."""
    from ggufmtp.provenance import receipt as receipt_mod

    reads: Counter = Counter()
    real = receipt_mod.read_json_file

    def counted(path, what):
        reads[Path(path).name] += 1
        return real(path, what)

    monkeypatch.setattr(receipt_mod, "read_json_file", counted)
    return reads


def test_verify_receipt_and_audit_read_each_receipt_once(sidecar_ladder, tmp_path, monkeypatch):
    """``verify TRUNK -md SIDECAR --receipt R`` (thresholds from R's recipe, the size check, the
    source binding, the write), ``audit TRUNK --sidecar SIDECAR`` and ``eval ... --receipt R``: one
    read of each receipt (main read R five times in verify, twice in eval)."""
    for f in [*sidecar_ladder.glob("Q8_0/*.gguf*"), *sidecar_ladder.glob("mtp-*.gguf*")]:
        shutil.copy(f, tmp_path / f.name)
    trunk = next(p for p in tmp_path.glob("*.gguf") if not p.name.startswith("mtp-"))
    side = next(tmp_path.glob("mtp-*.gguf"))
    receipt = Path(f"{trunk}.receipt.json")
    before = read_receipt(receipt).verification
    reads = _count_receipt_reads(monkeypatch)
    r = CliRunner().invoke(main, ["verify", str(trunk), "-md", str(side), "--receipt", str(receipt), "--limit", "2",
                                  "--max-tokens", "16", "--seeds", "42", "-t", "1", "--json"])
    assert r.exit_code in (0, 1) and '"verdict"' in r.stdout, r.output
    assert reads == {receipt.name: 1, f"{side.name}.receipt.json": 1}, reads  # the sidecar's binds the pair
    assert read_receipt(receipt).verification != before  # written back, from that one read
    reads.clear()
    r = CliRunner().invoke(main, ["audit", str(trunk), "--sidecar", str(side), "--json"])
    assert '"checks"' in r.stdout, r.output
    assert reads == {receipt.name: 1, f"{side.name}.receipt.json": 1}, reads
    reads.clear()  # eval --receipt: the artifact check and the quality section's write, from one read
    r = CliRunner().invoke(main, ["eval", MODEL, str(trunk), "--receipt", str(receipt), "--chunks", "2", "-c", "128"])
    assert r.exit_code == 0, r.output
    assert reads == {receipt.name: 1}, reads
