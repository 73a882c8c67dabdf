"""A ladder in the sidecar layout (issue #41 item 2): N trunk-only variants and one MTP sidecar made
from the source, each trunk receipted as part of its pair and verified with ``-m TRUNK -md
SIDECAR`` by a real llama-server; the folder as docs/how-to/ladder.md documents it; a rerun that
reuses everything; names llama.cpp's ``-hf`` resolver picks (the model by TAG, the sidecar by
``mtp-``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggufmtp.cli import main
from ggufmtp.errors import LadderError
from ggufmtp.gguf.model import GGUFModel, MTPStatus, check_mtp
from ggufmtp.ladder.run import run_ladder
from ggufmtp.ladder.spec import LadderSpec, Layout, load_ladder_file
from ggufmtp.measure.core.options import VerifyOptions
from ggufmtp.provenance.audit import audit
from ggufmtp.provenance.receipt import default_receipt_path, read_receipt
from ggufmtp.quality.options import EvalOptions
from ggufmtp.quant.naming import best_sidecar, name_problem, selects

MODEL = "builtin:tiny-qwen35moe-f20"
NAME = "tiny-qwen35moe-f20"
RECIPES = ("q8_0-mtp", "q4_k_m-mtp-q8")
VERIFY = {"seeds": (42,), "limit": 3, "max_tokens": 24, "threads": 1}
EVAL = {"corpus": "builtin:calib-v1", "chunks": 2, "ctx_size": 128, "threads": 1}


def _spec(out: Path, **kw) -> LadderSpec:
    return LadderSpec(model=MODEL, recipes=RECIPES, out_dir=out, imatrix_corpus="builtin:calib-v1", imatrix_chunks=2,
                      threads=1, verify_options=VerifyOptions.from_dict(VERIFY), eval_options=EvalOptions(**EVAL),
                      layout=Layout.SIDECAR, **kw)


@pytest.fixture(scope="module")
def ladder(llama_server_bin, tmp_path_factory):
    out = tmp_path_factory.mktemp("ladder-sidecar")
    return out, run_ladder(_spec(out), progress=False)


def test_trunks_and_one_sidecar_in_the_documented_folder(ladder):
    out, res = ladder
    assert res.ok, [o.error for o in res.outcomes]
    side = out / f"mtp-{NAME}-Q8_0.gguf"
    assert res.sidecars == [side] and check_mtp(GGUFModel(side)).status == MTPStatus.SIDECAR
    assert audit(side).ok and read_receipt(default_receipt_path(side)).predicate["pair"]["role"] == "sidecar"
    assert list(res.to_dict()["phases"]) == ["imatrix", "sidecars", "variants", "card"]
    for o in res.outcomes:
        trunk, rc = Path(o.summary["artifact"]), Path(o.summary["receipt"])
        assert trunk == out / o.variant / f"{NAME}-{o.variant}.gguf" and rc == default_receipt_path(trunk)
        assert (out / ".full" / o.variant / trunk.name).is_file()  # the full variant it was cut from, not published
        assert check_mtp(GGUFModel(trunk)).status == MTPStatus.ABSENT and o.summary["mtp_status"] == "absent"
        assert o.summary["sidecar"] == str(side) and (out / o.variant / "README.md").is_file()
        p = read_receipt(rc).predicate
        side_sha = read_receipt(default_receipt_path(side)).artifact.sha256
        assert p["pair"]["role"] == "trunk" and p["pair"]["sidecar"] == {"name": side.name, "sha256": side_sha}
        v = p["verification"]
        assert v["model"]["sidecar"]["name"] == side.name and v["mtp"]["draft_n"] > 0  # the pair drafted
        args = v["mtp"]["server_args"]
        assert args[args.index("--spec-draft-model") + 1].endswith(side.name)
        assert p["quality"]["kld_mean"] is not None  # the trunk evaluated against the source
        report = audit(trunk, rc, sidecar=side)
        assert report.ok, [c.to_dict() for c in report.failures]
        # llama.cpp's -hf: TAG selects the trunk and no other variant; the sidecar is no model, and is the one picked
        assert selects(o.variant, f"{o.variant}/{trunk.name}") and name_problem(trunk.name) is None
        assert name_problem(side.name) is not None and best_sidecar(o.variant, [side.name]) == side.name


def test_a_rerun_reuses_the_sidecar_and_every_pair(ladder):
    out, res = ladder
    side = res.sidecars[0]
    before = side.stat().st_mtime_ns, [Path(o.summary["receipt"]).read_bytes() for o in res.outcomes]
    again = run_ladder(_spec(out), progress=False)
    assert again.ok and again.sidecars == res.sidecars
    assert (side.stat().st_mtime_ns, [Path(o.summary["receipt"]).read_bytes() for o in again.outcomes]) == before
    for o in again.outcomes:
        assert set(o.summary["stages"].values()) == {"cached"}, o.summary["stages"]


def test_best_sidecar_follows_llama_cpp_find_best_sibling():
    """common/download.cpp find_best_sibling at one depth: a name holding -TAG. first, else the
    closest number of bits to the tag's first number, the first listed on a tie."""
    names = ["mtp-M-Q8_0.gguf", "mtp-M-Q4_K_M.gguf", "mtp-M-BF16.gguf"]
    assert best_sidecar("Q4_K_M", names) == "mtp-M-Q4_K_M.gguf"
    assert best_sidecar("q8_0", names) == "mtp-M-Q8_0.gguf"
    assert best_sidecar("IQ4_XS", names) == "mtp-M-Q4_K_M.gguf"  # 4 bits: closest
    assert best_sidecar("Q6_K", names) == "mtp-M-Q8_0.gguf"  # |8-6| < |4-6|: the first listed of the two
    assert best_sidecar("Q4_K_M-HiFi", ["mtp-M-Q8_0.gguf"]) == "mtp-M-Q8_0.gguf"
    assert best_sidecar("Q8_0", []) is None


def test_the_layout_in_a_ladder_file_and_its_errors(tmp_path):
    f = tmp_path / "ladder.toml"
    f.write_text(f'model = "{MODEL}"\nrecipes = ["q8_0-mtp"]\nlayout = "sidecar"\nsidecars = ["Q8_0", "Q4_K_M"]\n')
    fields = load_ladder_file(f)
    assert fields["layout"] == Layout.SIDECAR and fields["sidecars"] == ("Q8_0", "Q4_K_M")
    spec = LadderSpec(out_dir=tmp_path, **fields).check()  # type: ignore[arg-type]
    assert [p.name for p in spec.sidecar_paths("M")] == ["mtp-M-Q8_0.gguf", "mtp-M-Q4_K_M.gguf"]
    f.write_text(f'model = "{MODEL}"\nrecipes = ["q8_0-mtp"]\nlayout = "split"\n')
    with pytest.raises(LadderError, match=f"{f}: layout must be one of 'full', 'sidecar', not 'split'"):
        load_ladder_file(f)
    with pytest.raises(LadderError, match="name the sidecar Q8_0 twice"):
        dataclasses.replace(spec, sidecars=("Q8_0", "q8_0")).check()
    assert [p.name for p in dataclasses.replace(spec, sidecars=()).check().sidecar_paths("M")] == ["mtp-M-Q8_0.gguf"]
    with pytest.raises(LadderError, match="sidecars Q8_0, Q4_K_M: a ladder makes MTP sidecars only in the sidecar layout"):
        dataclasses.replace(spec, layout=Layout.FULL).check()
    assert dataclasses.replace(spec, layout=Layout.FULL, sidecars=()).check().sidecar_paths("M") == []


def test_the_cli_layout_flag_reruns_the_same_ladder_from_its_records(ladder, tmp_path):
    """``ladder --layout sidecar --sidecar-type Q8_0`` with the fixture's settings (a ladder file):
    every stage comes from the records, and the JSON names the layout and the sidecar."""
    out, res = ladder
    f = tmp_path / "ladder.toml"
    f.write_text(f'model = "{MODEL}"\nrecipes = {list(RECIPES)!r}\nimatrix_corpus = "builtin:calib-v1"\n'
                 'imatrix_chunks = 2\nthreads = 1\n[verify]\nseeds = [42]\nlimit = 3\nmax_tokens = 24\nthreads = 1\n'
                 '[eval]\ncorpus = "builtin:calib-v1"\nchunks = 2\nctx_size = 128\nthreads = 1\n'.replace("'", '"'))
    r = CliRunner().invoke(main, ["ladder", "--ladder", str(f), "-o", str(out), "--layout", "sidecar",
                                  "--sidecar-type", "Q8_0", "--json"])
    assert r.exit_code == 0 or '"verdict": "fail"' in r.output, r.output
    d = json.loads(r.stdout)
    assert d["layout"] == "sidecar" and d["sidecars"] == [str(s) for s in res.sidecars]
    for v in d["variants"]:
        assert set(v["summary"]["stages"].values()) == {"cached"}, v["summary"]["stages"]
    r = CliRunner().invoke(main, ["ladder", "--ladder", str(f), "-o", str(tmp_path / "x"), "--layout", "sidecar",
                                  "--sidecar-type", "Q8_0", "--sidecar-type", "q8_0"])
    assert r.exit_code == 1 and "name the sidecar Q8_0 twice" in r.output and "Traceback" not in r.output


def test_the_cards_explain_the_pair(ladder):
    """The ladder's card and each trunk's card: what the sidecar is, that -hf fetches it, the -md
    line for local files, and what the layout saves against full variants (sizes from the files)."""
    out, res = ladder
    side = res.sidecars[0]
    card = (out / "README.md").read_text()
    assert "## The MTP sidecar" in card and f"`{side.name}`" in card and "trunk-only" in card
    assert "llama-server -hf OWNER/REPO:TAG --spec-type draft-mtp` downloads the sidecar with the trunk" in card
    big = max(res.outcomes, key=lambda o: o.summary["size_bytes"])
    trunk = Path(big.summary["artifact"]).name
    assert f"llama-server -m {trunk} -md {side.name} --spec-type draft-mtp" in card
    # the download lines (How to run, and the sidecar's section) fetch the trunk with its sidecar
    assert card.count(f'hf download OWNER/REPO --include "{trunk}" --include "{side.name}" --local-dir .') == 2
    gm = GGUFModel(side)
    head = sum(t.n_bytes for n, t in gm.tensors.items() if n.startswith("blk.4."))
    trunks = sum(o.summary["size_bytes"] for o in res.outcomes)
    from ggufmtp.fmt import human_bytes

    assert (f"2 trunks and 1 sidecar take {human_bytes(trunks + side.stat().st_size)}; the same 2 variants each "
            f"with that head would take {human_bytes(trunks + 2 * head)}") in card
    assert "Each is a trunk without the multi-token-prediction (NextN) head" in card
    for o in res.outcomes:
        own = (out / o.variant / "README.md").read_text()
        name = Path(o.summary["artifact"]).name
        assert f"`{name}`: a trunk-only MTP runtime GGUF" in own and "## The MTP sidecar" in own
        assert f"llama-server -m {name} -md {side.name} -ngl 999" in own
        assert own.count(f'--include "{name}" --include "{side.name}" --local-dir .') == 2
        assert f"1 trunk and 1 sidecar take {human_bytes(o.summary['size_bytes'] + side.stat().st_size)}" in own


@pytest.fixture(scope="module")
def other_pair(synth_model, tmp_path_factory):
    """Another model of the same shape (another seed: another source), split as the ladder's files are
    named: its sidecar and its trunk, with their receipts."""
    from ggufmtp.provenance.pair import pair_receipt_writer
    from ggufmtp.quant.sidecar import SidecarOptions, make_sidecar
    from ggufmtp.synth.builtin import BUILTIN_MODELS

    other = synth_model(dataclasses.replace(BUILTIN_MODELS[NAME], seed=1))
    d = tmp_path_factory.mktemp("other")
    side, trunk = d / f"mtp-{NAME}-Q8_0.gguf", d / f"{NAME}-Q8_0.gguf"
    make_sidecar(other, side, SidecarOptions(recipe="Q8_0", trunk_out=trunk), before_publish=pair_receipt_writer())
    return side, trunk


def _upload(files, card):
    from ggufmtp.hub.upload import UploadOptions, upload

    return upload("me/ladder", files, [default_receipt_path(f) for f in files], card,
                  UploadOptions(dry_run=True, allow_unverified=True), progress=False)


def test_the_gate_takes_the_sidecar_through_its_trunks_receipts(ladder):
    from ggufmtp.errors import HubRefusedError
    from ggufmtp.hub.upload import UploadOptions
    from ggufmtp.ladder.publish import upload_ladder

    out, res = ladder
    side = res.sidecars[0]
    with pytest.raises(HubRefusedError, match="too little to publish"):  # the tiny verifications: not publishable
        upload_ladder(res, "me/ladder", UploadOptions(dry_run=True), progress=False)
    up = upload_ladder(res, "me/ladder", UploadOptions(dry_run=True, allow_unverified=True), progress=False)
    sent = {o.path_in_repo for o in up.operations}
    trunks = [Path(o.summary["artifact"]) for o in res.outcomes]
    assert sent == {p.name for t in (*trunks, side) for p in (t, default_receipt_path(t))} | {"README.md"}
    checked = {c.artifact.name: c for c in up.checks.artifacts}
    assert "served only with trunks that are not verified" in (checked[side.name].problem or "")
    # a trunk verified with the sidecar does not go up without it
    with pytest.raises(HubRefusedError, match=f"drafted with the MTP sidecar {side.name} .* not in this upload"):
        _upload(trunks, out / "README.md")
    # nor a sidecar without a trunk that names it
    with pytest.raises(HubRefusedError, match=f"MTP sidecar {side}.*no trunk in this upload names it"):
        _upload([side], out / "README.md")


def test_the_gate_refuses_a_sidecar_of_another_model_and_a_swapped_trunk(ladder, other_pair):
    """The attack cases: the ladder's trunks with another model's sidecar under the same name, and
    the ladder's sidecar with another model's trunk under the variant's name: each refused, naming
    the files, before anything is sent."""
    from ggufmtp.errors import HubRefusedError

    out, res = ladder
    foreign_side, foreign_trunk = other_pair
    trunks = [Path(o.summary["artifact"]) for o in res.outcomes]
    assert foreign_side.name == res.sidecars[0].name and foreign_trunk.name == trunks[0].name
    with pytest.raises(HubRefusedError, match=f"{foreign_side}.*no trunk in this upload names it.*belongs to another model"):
        _upload([foreign_side, *trunks], out / "README.md")
    with pytest.raises(HubRefusedError, match=f"{res.sidecars[0]}.*no trunk in this upload names it.*belongs to another "
                                              "model"):
        _upload([res.sidecars[0], foreign_trunk], out / "README.md")
    # and the pair check itself: the foreign trunk does not audit as the ladder sidecar's trunk
    assert not audit(foreign_trunk, sidecar=res.sidecars[0]).ok


def test_each_trunk_is_shown_with_the_sidecar_its_tag_resolves_to():
    """Two sidecars: the card's -md line pairs a 4-bit trunk with the 4-bit sidecar, as -hf does."""
    from ggufmtp.provenance.card_page import FileRow
    from ggufmtp.provenance.pair_card import SidecarFile, pair_lines, served_with

    row = FileRow(artifact="M-Q4_K_M.gguf", receipt="r", recipe="q4_k_m", size_bytes=100, bpw=4.8, quality={},
                  verification={}, unverified=None, source={}, model="M", tag="Q4_K_M")
    sides = [SidecarFile("mtp-M-Q8_0.gguf", 50, 40), SidecarFile("mtp-M-Q4_K_M.gguf", 30, 20)]
    assert served_with(row, sides) == "mtp-M-Q4_K_M.gguf"
    from ggufmtp.provenance.card_page import PageOptions

    text = "\n".join(pair_lines([row], sides, PageOptions(repo_id="me/m")))
    assert "llama-server -m M-Q4_K_M.gguf -md mtp-M-Q4_K_M.gguf --spec-type draft-mtp" in text
    assert "1 trunk and 2 sidecars take 180 B; the same 1 variant each with that head would take 140 B" in text


def test_a_signed_sidecar_ladder_audits_and_passes_the_gate_with_the_public_key(llama_server_bin, tmp_path):
    """With a signing key every file of the pair is signed (receipt envelopes and FILE.sig), through
    the verification and the eval that rewrite the trunk's receipt; the gate checks every signature."""
    from fakehub import write_keypair

    from ggufmtp.hub.upload import UploadOptions
    from ggufmtp.ladder.publish import upload_ladder

    priv, pub = write_keypair(tmp_path, "signer")
    res = run_ladder(dataclasses.replace(_spec(tmp_path / "ladder", signing_key=priv), recipes=("q8_0-mtp",)),
                     progress=False)
    assert res.ok, [o.error for o in res.outcomes]
    trunk, side = Path(res.outcomes[0].summary["artifact"]), res.sidecars[0]
    for p, kw in ((trunk, {"sidecar": side}), (side, {})):
        report = audit(p, public_key=pub, **kw)
        assert report.ok and report.trust is not None and report.trust.value == "verified", report.failures
    up = upload_ladder(res, "me/ladder", UploadOptions(dry_run=True, allow_unverified=True, public_key=pub),
                       progress=False)
    assert {f"{p.name}.sig" for p in (trunk, side)} <= {o.path_in_repo for o in up.operations}
    assert all(c.signatures_checked for c in up.checks.artifacts)
