"""#50 item 5: a large release goes up in several commits, as huggingface_hub 2.x's multi-commit
upload does it, with the result naming every commit and the final one (hub/parts.py says why
huggingface_hub's own path, Xet-only, is not used). Against the local Hub (tests/fakehub.py, the real
huggingface_hub client, no Xet), with ``commit_max_bytes`` small enough that three small real GGUFs
need three commits: each model file goes up whole with its receipt, the card last, each commit on
the one before it; every uploaded file's sha256 is its receipt's; another writer between two parts
stops the upload (nothing interleaved), and the same upload run again resumes: the parts already
there make no commit and send no byte again."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from fakehub import FakeHub, isolate_hf_client
from receipt_kit import honest_statement, synth_artifact

from ggufmtp.cli import main
from ggufmtp.errors import HubError
from ggufmtp.hub.parts import plan_parts
from ggufmtp.hub.upload import UploadKind, UploadOperation, UploadOptions, upload
from ggufmtp.provenance.card import card_text
from ggufmtp.provenance.receipt import default_receipt_path

TOKEN = "hf_partsTESTtokenABCDEFGHIJKLMNOP"
REPO = "me/parts"
TAGS = ("Q8_0", "Q6_K", "Q4_K_M")
# no llama.cpp here, but over a second each (40 MB through the local Hub): out of `make test-fast`
SLOW = pytest.mark.runtime


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """Three real GGUFs (different seeds: different bytes), each with its honest receipt, and a card."""
    tmp_path = tmp_path_factory.mktemp("parts")
    arts = [synth_artifact(tmp_path / "rel", f"tiny-{t}.gguf", seed=i) for i, t in enumerate(TAGS)]
    for a in arts:
        default_receipt_path(a).write_text(json.dumps(honest_statement(a)))
    _, body = card_text(honest_statement(arts[0]))
    card = tmp_path / "rel" / "README.md"
    card.write_text("---\nlibrary_name: gguf\n---\n" + body)
    return arts, card


@pytest.fixture
def fake(tmp_path, monkeypatch):
    isolate_hf_client(tmp_path / "home", monkeypatch)
    with FakeHub(tokens=(TOKEN,)) as fh:
        yield fh


def _send(fake, arts, card, max_bytes):
    return upload(REPO, arts, [default_receipt_path(a) for a in arts], card,
                  UploadOptions(token=TOKEN, endpoint=fake.url, commit_max_bytes=max_bytes), progress=False)


@SLOW
def test_a_release_above_the_threshold_goes_up_in_parts_each_file_whole_and_bound(fake, release):
    """Fails on fedf5a8 (one commit whatever the size; no ``commit_max_bytes``)."""
    arts, card = release
    res = _send(fake, arts, card, arts[0].stat().st_size + 10_000)  # one model file (and its receipt) a part
    history = fake.history(REPO)[::-1][1:]  # oldest first, less the repo's initial commit
    assert [c.oid for c in history] == res.commits and res.commit_sha == res.commits[-1] == fake.head(REPO)
    assert [c.message for c in history] == [res.commit_message, f"{res.commit_message} (part 2)",
                                            f"{res.commit_message} (part 3)"]
    added = [sorted(set(c.files) - set(p.files)) for p, c in zip(fake.history(REPO)[::-1], history)]
    assert added == [sorted([a.name, a.name + ".receipt.json"] + (["README.md"] if i == 2 else []))
                     for i, a in enumerate(arts)], added
    assert [list(p) for p in res.parts] == [sorted(x, key=lambda n: (n == "README.md", n.endswith(".json")))
                                            for x in added]
    for a in arts:  # the bytes on the Hub are the bytes the receipt binds
        subject = json.loads(default_receipt_path(a).read_text())["subject"][0]
        assert fake.entry(REPO, a.name).sha256 == subject["digest"]["sha256"] and subject["name"] == a.name


@SLOW
def test_below_the_threshold_or_without_one_it_is_one_commit(fake, release):
    arts, card = release
    res = _send(fake, arts, card, None)
    assert len(res.commits) == len(res.parts) == 1 and len(fake.history(REPO)) == 2
    res = _send(fake, arts, card, 10**9)  # unchanged files: huggingface_hub makes no commit at all
    assert len(res.parts) == 1 and res.commits == [fake.head(REPO)] and len(fake.history(REPO)) == 2


@SLOW
def test_another_writer_between_parts_stops_the_upload_and_a_rerun_resumes(fake, release):
    arts, card = release
    fake.on("POST", rf"^/api/models/{REPO}/commit/main$",
            lambda req: fake.commit(REPO, {"notes.txt": b"someone else's commit"}, "meanwhile"))
    with pytest.raises(HubError, match=r"part 2 of 3"):
        _send(fake, arts, card, arts[0].stat().st_size + 10_000)
    assert [c.message for c in fake.history(REPO)][:1] == ["meanwhile"]  # part 2 did not go on top of it
    assert arts[1].name not in fake.history(REPO)[0].files
    puts = len(fake.requests_to("PUT", r"^/upload/"))
    res = _send(fake, arts, card, arts[0].stat().st_size + 10_000)
    sent_again = [r.route.rsplit("/", 1)[1] for r in fake.requests_to("PUT", r"^/upload/")[puts:]]
    # only the last part's model file: part 1's is committed, part 2's was stored before its commit failed
    assert sent_again == [fake.entry(REPO, arts[2].name).sha256], sent_again
    part3, part2, meanwhile, part1 = fake.history(REPO)[:4]
    assert (part3.message, part2.message, meanwhile.message) == (f"{res.commit_message} (part 3)",
                                                                 f"{res.commit_message} (part 2)", "meanwhile")
    assert part1.message == res.commit_message and arts[0].name in part1.files
    # part 1 made no commit this time: the head it found already held it, and part 2 went on top of that
    assert res.commits == [meanwhile.oid, part2.oid, part3.oid] and res.commit_sha == fake.head(REPO) == part3.oid
    assert {a.name for a in arts} | {"README.md", "notes.txt"} <= set(fake.history(REPO)[0].files)


def test_a_state_between_parts_that_serves_otherwise_falls_back_to_one_commit(tmp_path):
    """What no part may do (hub/parts.py): leave the repo, between two commits, serving a model
    otherwise than verified; then the release goes up in one commit."""
    ops = [UploadOperation(f"M-{t}.gguf", tmp_path / f"M-{t}.gguf", 100, UploadKind.ARTIFACT) for t in TAGS]
    ops.append(UploadOperation("README.md", tmp_path / "README.md", 10, UploadKind.CARD))

    def unit(op):
        return op.path_in_repo if op.kind == UploadKind.ARTIFACT else None

    def sidecar(op):
        return op.path_in_repo == "M-Q4_K_M.gguf"  # as if it were the sidecar: it goes first

    assert [[o.path_in_repo for o in p] for p in plan_parts(ops, 150, unit, sidecar, lambda done: [])] == [
        ["M-Q4_K_M.gguf"], ["M-Q8_0.gguf"], ["M-Q6_K.gguf", "README.md"]]
    assert [len(p) for p in plan_parts(ops, 250, unit, sidecar, lambda done: [])] == [2, 2]
    assert plan_parts(ops, 150, unit, sidecar, lambda done: ["tie"] if len(done) == 2 else []) == [ops]
    assert plan_parts(ops, 10**6, unit, sidecar, lambda done: ["never asked"]) == [ops]  # it fits one


@SLOW
def test_the_cli_takes_a_commit_size_and_says_each_part(fake, release, tmp_path):
    arts, card = release
    argv = ["upload", REPO, *map(str, arts), *[a for x in arts for a in ("--receipt", str(default_receipt_path(x)))],
            "--card", str(card), "--commit-max-size", "none", "--dry-run"]
    r = CliRunner().invoke(main, argv)
    assert r.exit_code == 0 and "in 3 commits" not in r.output, r.output
    size = f"{(arts[0].stat().st_size + 10_000) // 1000}K"
    r = CliRunner().invoke(main, [*argv[:-3], "--commit-max-size", size],
                           env={"HF_TOKEN": TOKEN, "HF_ENDPOINT": fake.url})
    assert r.exit_code == 0, r.output
    assert "in 3 commits: part 1: 2 file(s) " in r.output and f"commit: {fake.head(REPO)}" in r.output, r.output
    r = CliRunner().invoke(main, [*argv[:-3], "--commit-max-size", "12X"])
    assert r.exit_code == 2 and "'12X': give a whole number of decimal" in r.output, r.output
