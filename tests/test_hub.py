"""ggufmtp.hub against a local Hub (tests/fakehub.py) - the real huggingface_hub client end to end.

Every test isolates huggingface_hub's state: HF_HOME / HF_HUB_CACHE / the token file in tmp dirs
(the constants are read at import time, so they are monkeypatched, not only the env vars), no
HF_TOKEN from the developer's environment, Xet disabled (the fake speaks LFS only).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner
from fakehub import FakeHub, isolate_hf_client, write_keypair
from receipt_kit import honest_statement, synth_artifact

from ggufmtp.cli import main
from ggufmtp.errors import HubDigestMismatchError, HubError, HubHTTPError, HubManifestError, HubRefusedError
from ggufmtp.files.hashing import file_digests, git_blob_sha1, sha256_file
from ggufmtp.hub.manifest import MANIFEST_NAME, PulledModel, read_manifest
from ggufmtp.hub.pull import pull
from ggufmtp.hub.transport import cache_dir, storage_folder
from ggufmtp.hub.upload import UploadOptions, upload

TOKEN = "hf_SECRETtoken123"
REPO_ROOT = Path(__file__).resolve().parents[1]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def gguf_bytes(n: int, seed: int = 0) -> bytes:
    """n bytes starting with the GGUF magic, deterministic per seed."""
    out = bytearray(b"GGUF")
    block = hashlib.sha256(str(seed).encode()).digest()
    while len(out) < n:
        block = hashlib.sha256(block).digest()
        out += block * 64
    return bytes(out[:n])


@pytest.fixture(autouse=True)
def hf_env(tmp_path, monkeypatch):
    home = tmp_path / "hf_home"
    isolate_hf_client(home, monkeypatch)
    monkeypatch.delenv("GGUFMTP_PUBLIC_KEY", raising=False)
    return home


@pytest.fixture
def fake():
    with FakeHub(tokens=(TOKEN,)) as fh:
        yield fh


def gets_of(fake: FakeHub, oid: str):
    return [r for r in fake.requests if r.server == "cdn" and r.method == "GET" and r.route == f"/lfs/{oid}"]


# ---------------------------------------------------------------------------------------------------
# hashing
# ---------------------------------------------------------------------------------------------------


def test_sha256_file_streams_and_matches_hashlib(tmp_path):
    data = gguf_bytes(9 * 1024 * 1024 + 7)  # more than one 4 MiB chunk, not a multiple of it
    p = tmp_path / "f.bin"
    p.write_bytes(data)
    assert sha256_file(p) == sha(data)
    assert sha256_file(p, chunk_size=1) == sha(data)  # clamped to the 1 MiB minimum
    d = file_digests(p, git_blob=True)
    assert (d.size, d.sha256, d.git_sha1) == (len(data), sha(data), git_blob_sha1(data))
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert sha256_file(empty) == sha(b"")


# ---------------------------------------------------------------------------------------------------
# pull
# ---------------------------------------------------------------------------------------------------


@pytest.mark.runtime  # huggingface_hub waits 1 s before it resumes
def test_pull_resumes_an_interrupted_download_with_range(fake, tmp_path):
    big = gguf_bytes(12 * 1024 * 1024 + 123, seed=1)  # > the client's 10 MiB read chunk
    fake.commit("org/model", {"model.gguf": big, "config.json": b'{"arch": "x"}'})
    oid = sha(big)
    fake.drop_connection_once("org/model", "model.gguf", after_bytes=11 * 1024 * 1024)

    res = pull("org/model", local_dir=tmp_path / "dl", endpoint=fake.url, progress=False)

    gets = gets_of(fake, oid)
    assert len(gets) == 2, [g.headers.get("range") for g in gets]
    assert "range" not in gets[0].headers
    first_byte = int(gets[1].headers["range"].removeprefix("bytes=").rstrip("-"))
    assert 0 < first_byte <= 11 * 1024 * 1024  # resumed where the written data ended, not from 0
    got = tmp_path / "dl" / "model.gguf"
    assert sha256_file(got) == oid
    assert res.model_path == got and res.verified
    assert not list((tmp_path / "dl").rglob("*.incomplete"))


def test_pull_refuses_a_sha256_mismatch_and_removes_only_its_own_download(fake, tmp_path):
    good = gguf_bytes(5000, seed=2)
    fake.commit("org/model", {"model.gguf": good, "README.md": b"# card"})
    bad = fake.serve_corrupted("org/model", "model.gguf")
    dest = tmp_path / "dl"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine")

    with pytest.raises(HubDigestMismatchError) as ei:  # corrupt bytes: not the kind a retry may fix
        pull("org/model", local_dir=dest, endpoint=fake.url, progress=False)
    assert not isinstance(ei.value, HubHTTPError)
    msg = str(ei.value)
    assert "model.gguf" in msg and sha(good) in msg and sha(bad) in msg
    assert not (dest / "model.gguf").exists()  # the corrupt file we downloaded is gone
    assert (dest / "notes.txt").read_text() == "mine"  # the user's file is not
    assert not (dest / MANIFEST_NAME).exists()

    # cache mode: the corrupt blob is removed from the cache too
    with pytest.raises(HubDigestMismatchError, match="sha256 mismatch"):
        pull("org/model", endpoint=fake.url, progress=False)
    blobs = Path(storage_folder(cache_dir(None), "org/model")) / "blobs"
    assert not (blobs / sha(good)).exists()


def test_pull_never_overwrites_a_users_file_with_the_same_name(fake, tmp_path):
    good = gguf_bytes(5000, seed=3)
    fake.commit("org/model", {"model.gguf": good})
    fake.serve_corrupted("org/model", "model.gguf")
    dest = tmp_path / "dl"
    dest.mkdir()
    (dest / "model.gguf").write_bytes(b"my own model, not the Hub's")

    with pytest.raises(HubRefusedError, match="refusing to overwrite") as ei:
        pull("org/model", local_dir=dest, endpoint=fake.url, progress=False)
    assert "model.gguf" in str(ei.value) and sha(good) in str(ei.value)
    assert (dest / "model.gguf").read_bytes() == b"my own model, not the Hub's"
    assert not gets_of(fake, sha(good))  # refused before downloading anything


def test_pull_reuses_an_identical_file_and_replaces_its_own_older_download(fake, tmp_path):
    v1 = gguf_bytes(4000, seed=4)
    fake.commit("org/model", {"model.gguf": v1})
    dest = tmp_path / "dl"
    dest.mkdir()
    (dest / "model.gguf").write_bytes(v1)  # the user already has the right bytes
    res = pull("org/model", local_dir=dest, endpoint=fake.url, progress=False)
    assert res.verified and not gets_of(fake, sha(v1))

    v2 = gguf_bytes(4100, seed=5)
    fake.commit("org/model", {"model.gguf": v2})
    res2 = pull("org/model", local_dir=dest, endpoint=fake.url, progress=False)
    assert (dest / "model.gguf").read_bytes() == v2  # ours (recorded in the manifest): replaceable
    assert res2.resolved_commit == fake.head("org/model") != res.resolved_commit


@pytest.mark.parametrize("evil", ["../escape.gguf", "sub/../../escape.gguf", "/abs/escape.gguf"])
def test_pull_refuses_paths_escaping_the_directory(fake, tmp_path, evil):
    fake.commit("org/evil", {evil: gguf_bytes(100), "ok.txt": b"fine"})
    dest = tmp_path / "a" / "dl"
    with pytest.raises(HubRefusedError, match="escape") as ei:
        pull("org/evil", local_dir=dest, endpoint=fake.url, progress=False)
    assert evil in str(ei.value)
    assert not (tmp_path / "a" / "escape.gguf").exists() and not (tmp_path / "escape.gguf").exists()
    assert not fake.requests_to("HEAD", r"/resolve/")  # nothing was downloaded at all
    # the safe part of the repo can still be pulled
    res = pull("org/evil", include=["ok.txt"], local_dir=dest, endpoint=fake.url, progress=False)
    assert [f.path for f in res.files] == ["ok.txt"]


def test_pull_groups_split_gguf_shards_into_one_model(fake, tmp_path):
    shards = {f"big-{i:05d}-of-00003.gguf": gguf_bytes(1000 + i, seed=10 + i) for i in (1, 2, 3)}
    fake.commit("org/split", {**shards, "other.gguf": gguf_bytes(50), "config.json": b"{}"})

    # selecting one shard pulls the whole model
    res = pull("org/split", include=["*-00002-of-00003.gguf"], local_dir=tmp_path / "dl", endpoint=fake.url,
               progress=False)
    assert sorted(f.path for f in res.files) == sorted(shards)
    assert res.model_entry == "big-00001-of-00003.gguf"
    assert res.gguf_models == [PulledModel("big-00001-of-00003.gguf", tuple(sorted(shards)))]
    manifest = json.loads((tmp_path / "dl" / MANIFEST_NAME).read_text())
    assert manifest["model_entry"] == "big-00001-of-00003.gguf"

    # a repo missing a shard is reported by name
    fake.commit("org/broken", {"m-00001-of-00003.gguf": gguf_bytes(10), "m-00003-of-00003.gguf": gguf_bytes(11)})
    with pytest.raises(HubError, match=r"m-00002-of-00003\.gguf") as ei:
        pull("org/broken", include=["*.gguf"], local_dir=tmp_path / "b", endpoint=fake.url, progress=False)
    assert "m-00003" not in str(ei.value).split("missing")[1]

    # same for a plain local directory
    local = tmp_path / "local"
    local.mkdir()
    (local / "m-00001-of-00002.gguf").write_bytes(b"GGUF1")
    with pytest.raises(HubError, match=r"missing m-00002-of-00002\.gguf"):
        pull(str(local))


def test_pull_downloads_the_selected_files_at_once(fake, tmp_path):
    """#42 item 6: the downloads are huggingface_hub's ``snapshot_download`` (its worker threads), not
    one ``hf_hub_download`` after another: each file's LFS download waits (up to 5 s, below the
    client's 10 s read timeout) for the other file's to start, which only downloads in flight together
    see happen."""
    files = {f"m-{i:05d}-of-00002.gguf": gguf_bytes(1000 + i, seed=40 + i) for i in (1, 2)}
    fake.commit("org/two", {**files, "README.md": b"hi"})
    started: set[str] = set()
    met: list[bool] = []
    cond = threading.Condition()

    def wait_for_the_other(req):
        with cond:
            started.add(req.route)  # /lfs/<sha256>: one route per file
            cond.notify_all()
            met.append(cond.wait_for(lambda: len(started) >= 2, timeout=5))

    fake.on("GET", r"^/lfs/", wait_for_the_other, once=False)
    res = pull("org/two", include=["*.gguf"], local_dir=tmp_path / "dl", endpoint=fake.url, progress=False)
    assert met == [True, True], "the two files were downloaded one after the other"
    assert res.verified and sorted(f.path for f in res.files) == sorted(files)
    assert all((tmp_path / "dl" / n).read_bytes() == b for n, b in files.items())


def test_pull_pins_the_resolved_commit_while_the_branch_moves(fake, tmp_path):
    v1 = gguf_bytes(3000, seed=20)
    old = fake.commit("org/moving", {"model.gguf": v1, "config.json": b'{"v": 1}'})
    moved = {}

    def push_new_version(_req):  # runs while the Hub serves the file listing, i.e. after the resolve
        moved["sha"] = fake.commit("org/moving", {"model.gguf": gguf_bytes(3000, seed=21),
                                                  "config.json": b'{"v": 2}'})

    fake.on("GET", r"^/api/models/org/moving/tree/", push_new_version)
    res = pull("org/moving", revision="main", local_dir=tmp_path / "dl", endpoint=fake.url, progress=False)

    assert moved["sha"] == fake.head("org/moving") != old  # main really moved mid-pull
    assert res.resolved_commit == old and res.requested_revision == "main"
    assert (tmp_path / "dl" / "model.gguf").read_bytes() == v1
    assert (tmp_path / "dl" / "config.json").read_bytes() == b'{"v": 1}'
    resolves = fake.requests_to("HEAD", r"/resolve/")
    assert resolves and all(f"/resolve/{old}/" in r.route for r in resolves)
    manifest = read_manifest(tmp_path / "dl")
    assert manifest.resolved_commit == old and manifest.requested_revision == "main"
    assert {f.path: f.sha256 for f in manifest.files}["model.gguf"] == sha(v1)


def test_pull_works_offline_from_the_cache(fake, tmp_path, monkeypatch, hf_env):
    from huggingface_hub import constants

    data = gguf_bytes(2000, seed=30)
    fake.commit("org/model", {"model.gguf": data, "config.json": b"{}"})
    online = pull("org/model", endpoint=fake.url, progress=False)
    assert online.source == "hub" and online.verified

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    n = len(fake.requests)
    off = pull("org/model", endpoint=fake.url, progress=False)
    assert len(fake.requests) == n  # no network at all
    assert off.source == "cache" and off.verified  # checked against the Hub metadata recorded online
    assert off.resolved_commit == online.resolved_commit
    assert [(f.path, f.sha256) for f in off.files] == [(f.path, f.sha256) for f in online.files]
    assert off.model_path.read_bytes() == data

    # offline and not cached: an actionable error, not a traceback
    with pytest.raises(HubError, match="HF_HUB_OFFLINE"):
        pull("org/other", endpoint=fake.url, progress=False)

    # offline into a --local-dir filled by an earlier online pull
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    pull("org/model", include=["*.gguf"], local_dir=tmp_path / "dl", endpoint=fake.url, progress=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    n = len(fake.requests)
    off_dir = pull("org/model", local_dir=tmp_path / "dl", endpoint=fake.url, progress=False)
    assert len(fake.requests) == n
    assert off_dir.source == "cache" and off_dir.verified and [f.path for f in off_dir.files] == ["model.gguf"]
    with pytest.raises(HubError, match="not available locally"):
        pull("org/model", include=["config.json"], local_dir=tmp_path / "dl", progress=False)
    with pytest.raises(HubError, match="without the network"):
        pull("org/model", revision="dev", local_dir=tmp_path / "dl", progress=False)

    # the real switch: a new process with HF_HUB_OFFLINE=1 in its environment, the Hub switched off
    fake.stop()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env.update(HF_HOME=str(hf_env), HF_HUB_OFFLINE="1", HF_HUB_DISABLE_XET="1", PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run([sys.executable, "-m", "ggufmtp", "pull", "org/model", "--json"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["source"] == "cache" and out["verified"] and out["resolved_commit"] == online.resolved_commit

    # a cached file altered after the pull is caught offline too
    blob = off.model_path.resolve()
    blob.chmod(0o644)
    blob.write_bytes(gguf_bytes(2000, seed=31))
    with pytest.raises(HubDigestMismatchError, match="sha256 mismatch"):
        pull("org/model", progress=False)


def test_pull_of_a_local_directory_builds_the_manifest(tmp_path):
    d = tmp_path / "ckpt"
    (d / "sub").mkdir(parents=True)
    (d / "model.gguf").write_bytes(gguf_bytes(700))
    (d / "sub" / "tokenizer.json").write_text("{}")
    res = pull(str(d))
    assert res.source == "local" and res.repo_id is None and res.resolved_commit is None
    assert {f.path: f.sha256 for f in res.files} == {
        "model.gguf": sha(gguf_bytes(700)), "sub/tokenizer.json": sha(b"{}")}
    assert res.model_path == d / "model.gguf" and not res.verified
    assert read_manifest(d).to_dict() == res.to_dict()
    with pytest.raises(HubRefusedError, match="no such directory"):
        pull(str(tmp_path / "nope"))
    with pytest.raises(HubManifestError, match="no pull manifest"):
        read_manifest(tmp_path / "nope")


def test_pull_reports_missing_repo_and_revision_clearly(fake, tmp_path):
    fake.commit("org/model", {"a.txt": b"a"})
    with pytest.raises(HubHTTPError, match="org/none.*not found"):
        pull("org/none", endpoint=fake.url, progress=False)
    with pytest.raises(HubHTTPError, match="revision 'nope' does not exist"):
        pull("org/model", revision="nope", endpoint=fake.url, progress=False)
    with pytest.raises(HubRefusedError, match=r"no file of org/model .* matches --include"):
        pull("org/model", include=["*.gguf"], endpoint=fake.url, progress=False)


# ---------------------------------------------------------------------------------------------------
# upload
# ---------------------------------------------------------------------------------------------------


def receipt_of(art: Path, verdict: str | None = "pass", served: str | None = None) -> dict:
    """The honest receipt of ``art`` (a real GGUF, see ``receipt_kit``): its verification has
    ``verdict`` (a failing one with the figures that fail it) and covers the bytes with sha256
    ``served`` (default: ``art``'s); no verification when ``verdict`` is None."""
    from ggufmtp.provenance.receipt import seal
    from ggufmtp.provenance.verdict import judge_recorded

    if verdict is None:
        return honest_statement(art, None)
    st = honest_statement(art, "pass", **({"acceptance": 0.12} if verdict == "fail" else {}))
    v = st["predicate"]["verification"]
    v["verdict"], v["reasons"] = verdict, judge_recorded(v)[1]
    if served:
        v["model"]["sha256"] = served
    return seal(st)


def other_artifact(folder: Path, seed: int = 41) -> Path:
    """Another real GGUF (another synth seed): other bytes, its own receipt needed."""
    return synth_artifact(folder, f"other-{seed}.gguf", seed=seed)


@pytest.fixture(scope="session")
def synth_gguf(tmp_path_factory):
    return synth_artifact(tmp_path_factory.mktemp("hubsynth"), "model.gguf")


@pytest.fixture
def artifacts(tmp_path, synth_gguf):
    d = tmp_path / "out"
    d.mkdir()
    art = d / "model-Q4_K_M-mtp.gguf"
    art.write_bytes(synth_gguf.read_bytes())
    rc = d / "model-Q4_K_M-mtp.receipt.json"
    rc.write_text(json.dumps(receipt_of(art)))
    card = d / "card.md"
    card.write_text("---\nlicense: apache-2.0\nlibrary_name: gguf\n---\n# model\n")
    return art, rc, card


def test_upload_creates_the_repo_and_makes_exactly_one_commit(fake, artifacts):
    art, rc, card = artifacts
    digest = sha256_file(art)
    res = upload("me/new-model", [art], [rc], card, UploadOptions(token=TOKEN, endpoint=fake.url,
                 recipe_name="hifi-q4_k_m-mtp", artifact_sha256=digest), progress=False)

    assert fake.requests_to("POST", r"^/api/repos/create$")
    history = fake.history("me/new-model")
    assert [c.message for c in history[1:]] == ["initial commit"]  # the Hub's own; ours is the only other
    commit = history[0]
    assert commit.oid == res.commit_sha
    assert sorted(commit.files) == sorted([".gitattributes", art.name, rc.name, "README.md"])
    assert "hifi-q4_k_m-mtp" in commit.message and digest in commit.message
    assert fake.file("me/new-model", art.name) == art.read_bytes()
    assert fake.entry("me/new-model", art.name).sha256 == digest  # went through LFS
    assert fake.file("me/new-model", "README.md") == card.read_bytes()
    assert fake.file("me/new-model", rc.name) == rc.read_bytes()
    assert len(fake.requests_to("POST", r"/commit/main$")) == 1
    assert res.commit_url.endswith(res.commit_sha)

    # again into the existing repo, on a new branch: create_repo(exist_ok) + create_branch, one more commit
    art.write_bytes(other_artifact(art.parent.parent / "v2").read_bytes())
    rc.write_text(json.dumps(receipt_of(art)))  # the receipt of the new bytes
    res2 = upload("me/new-model", [art], [rc], None, UploadOptions(token=TOKEN, endpoint=fake.url, revision="v2"), progress=False)
    assert fake.head("me/new-model", "v2") == res2.commit_sha
    assert fake.history("me/new-model", "v2")[1].oid == res.commit_sha
    assert fake.head("me/new-model") == res.commit_sha  # main untouched


def test_upload_refuses_a_receipt_digest_matching_no_file(fake, artifacts):
    art, rc, _ = artifacts
    with pytest.raises(HubRefusedError, match="matches none of the files"):
        upload("me/x", [art], [rc], None, UploadOptions(token=TOKEN, endpoint=fake.url, artifact_sha256="0" * 64), progress=False)
    assert not fake.requests  # checked before any request


def test_upload_dry_run_makes_no_request(fake, artifacts):
    art, rc, card = artifacts
    res = upload("me/dry", [art], [rc], card, UploadOptions(token=TOKEN, endpoint=fake.url, dry_run=True, recipe_name="r",
                                                         artifact_sha256=sha256_file(art)))
    assert fake.requests == []
    assert res.dry_run and res.commit_sha is None
    assert [(o.path_in_repo, o.size, o.kind) for o in res.operations] == [
        (art.name, art.stat().st_size, "artifact"), (rc.name, rc.stat().st_size, "receipt"),
        ("README.md", card.stat().st_size, "card")]
    # no endpoint reachable at all: still fine
    upload("me/dry", [art], [rc], None, UploadOptions(endpoint="http://127.0.0.1:9", dry_run=True))


def test_upload_validates_inputs(tmp_path, artifacts):
    art, rc, card = artifacts
    with pytest.raises(HubRefusedError, match="receipt"):
        upload("me/x", [art], [], None, UploadOptions(dry_run=True))
    with pytest.raises(HubRefusedError, match="does not exist"):
        upload("me/x", [tmp_path / "missing.gguf"], [rc], None, UploadOptions(dry_run=True))
    readme = tmp_path / "README.md"
    readme.write_text("x")
    with pytest.raises(HubError, match="README.md"):
        upload("me/x", [art], [readme], card, UploadOptions(dry_run=True))
    with pytest.raises(HubError, match="not a valid Hub repo id"):
        upload("not/a/repo", [art], [rc], None, UploadOptions(dry_run=True))
    # the options are checked when built, before any file is read; the token never shows in their repr
    with pytest.raises(HubRefusedError, match="uploads go to a branch name, not a commit sha"):
        UploadOptions(revision="0123456789abcdef" * 2 + "01234567")
    with pytest.raises(HubRefusedError, match="is not a 64-hex-digit sha256"):
        UploadOptions(artifact_sha256="abc")
    assert TOKEN not in repr(UploadOptions(token=TOKEN))


# ---------------------------------------------------------------------------------------------------
# tokens
# ---------------------------------------------------------------------------------------------------


def test_token_reaches_the_hub_but_never_any_output(fake, artifacts, tmp_path, capfd, caplog, monkeypatch):
    from huggingface_hub import constants
    from huggingface_hub.utils import logging as hf_logging

    monkeypatch.setattr(constants, "HF_DEBUG", True)  # the client logs every request as a curl command
    hf_logging.set_verbosity_debug()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setLevel(logging.DEBUG)
    logging.getLogger().addHandler(handler)
    caplog.set_level(logging.DEBUG)
    messages = []
    try:
        fake.commit("org/private", {"model.gguf": gguf_bytes(3000, seed=50), "config.json": b"{}"})
        fake.repos["org/private"].private = True
        res = pull("org/private", local_dir=tmp_path / "dl", token=TOKEN, endpoint=fake.url)
        assert res.verified

        fake.serve_corrupted("org/private", "model.gguf")
        for call in (
            lambda: pull("org/private", local_dir=tmp_path / "dl2", token=TOKEN, endpoint=fake.url),
            lambda: pull("org/missing", token=TOKEN, endpoint=fake.url),
            lambda: pull("org/private", token=TOKEN + "\n", endpoint=fake.url),  # illegal header value
            lambda: upload("me/m", [artifacts[0]], [artifacts[1]], None, UploadOptions(token=TOKEN + "x", endpoint=fake.url)),
        ):
            with pytest.raises(HubError) as ei:
                call()
            messages.append(str(ei.value))
            messages.append(repr(ei.value.__cause__))

        art, rc, card = artifacts
        up = upload("me/m", [art], [rc], card, UploadOptions(token=TOKEN, endpoint=fake.url))
        result = CliRunner().invoke(main, ["upload", "me/m", str(art), "--receipt", str(rc), "--json"],
                                    env={"HF_TOKEN": TOKEN, "HF_ENDPOINT": fake.url})
        assert result.exit_code == 0, result.output
        messages.append(result.output)
    finally:
        logging.getLogger().removeHandler(handler)
        hf_logging.set_verbosity_warning()

    # the Hub did receive it, as a Bearer header, and the CDN never did
    hub_auth = [r.headers.get("authorization") for r in fake.requests if r.server == "hub"]
    assert f"Bearer {TOKEN}" in hub_auth
    assert not any("authorization" in r.headers for r in fake.requests if r.server == "cdn")
    assert up.commit_sha

    out, err = capfd.readouterr()
    manifests = "".join(p.read_text() for p in tmp_path.rglob(MANIFEST_NAME))
    manifests += "".join(p.read_text() for p in Path(cache_dir(None)).rglob(MANIFEST_NAME))
    assert manifests
    everything = "\n".join([out, err, caplog.text, stream.getvalue(), manifests, json.dumps(up.to_dict()),
                            json.dumps(res.to_dict()), *messages,
                            *(r.getMessage() for r in caplog.records)])
    assert "SECRETtoken123" not in everything
    assert stream.getvalue()  # logging did happen (the check above is not vacuous)
    assert any("Illegal header value" in m for m in messages)  # the error that embeds the token was seen


# ---------------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------------


def test_cli_pull_and_upload(fake, artifacts, tmp_path):
    fake.commit("org/model", {"m-00001-of-00002.gguf": gguf_bytes(100), "m-00002-of-00002.gguf": gguf_bytes(101)})
    runner = CliRunner()
    env = {"HF_ENDPOINT": fake.url, "HF_TOKEN": TOKEN}

    r = runner.invoke(main, ["pull", "org/model", "--local-dir", str(tmp_path / "dl"), "--json"], env=env)
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["model_entry"] == "m-00001-of-00002.gguf" and data["verified"]
    assert data["manifest_path"] == str(tmp_path / "dl" / MANIFEST_NAME)

    r = runner.invoke(main, ["pull", "org/model", "--include", "*00002*", "--local-dir", str(tmp_path / "d2")],
                      env=env)
    assert r.exit_code == 0, r.output
    assert "all files match" in r.stdout and "(2 shards)" in r.stdout

    r = runner.invoke(main, ["pull", "org/none"], env=env)
    assert r.exit_code == 1 and r.stderr.startswith("error: ") and "not found" in r.stderr

    art, rc, card = artifacts
    r = runner.invoke(main, ["upload", "me/cli", str(art), "--receipt", str(rc), "--card", str(card), "--dry-run",
                             "--json"], env=env)
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)
    assert plan["dry_run"] and "hifi-q4_k_m-mtp" in plan["commit_message"]
    assert sha256_file(art) in plan["commit_message"]
    assert not fake.requests_to("POST", r"^/api/repos/create$")

    r = runner.invoke(main, ["upload", "me/cli", str(art), "--receipt", str(rc), "--card", str(card), "--private"],
                      env=env)
    assert r.exit_code == 0, r.output
    head = fake.history("me/cli")[0]
    assert "hifi-q4_k_m-mtp" in head.message and sha256_file(art) in head.message
    assert fake.repos["me/cli"].private
    assert "commit:" in r.stdout


def test_cli_upload_names_the_recipe_and_digest_of_a_signed_receipt(fake, artifacts, tmp_path):
    art, rc, _ = artifacts
    priv, _ = write_keypair(tmp_path)
    signed = tmp_path / "signed.receipt.json"
    signed.write_text(json.dumps(sign_statement(json.loads(rc.read_text()), priv)))
    r = CliRunner().invoke(main, ["upload", "me/odd", str(art), "--receipt", str(signed), "--dry-run", "--json"],
                           env={"HF_ENDPOINT": fake.url})
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["commit_message"] == f"Upload {art.name} (recipe hifi-q4_k_m-mtp, sha256 {sha256_file(art)}) with ggufmtp"
    assert out["artifacts"][0]["receipt_signed"] and out["artifacts"][0]["verified"]


def test_receipt_commit_facts_reads_plain_and_dsse_receipts(artifacts, tmp_path):
    import base64

    from ggufmtp.hub.upload import receipt_commit_facts

    art, rc, _ = artifacts
    envelope = tmp_path / "signed.receipt.json"
    envelope.write_text(json.dumps({"payloadType": "application/vnd.in-toto+json",
                                    "payload": base64.b64encode(rc.read_bytes()).decode(), "signatures": []}))
    odd = tmp_path / "receipt.txt"
    odd.write_text("not json")
    for receipt in (rc, envelope):
        facts = receipt_commit_facts([odd, receipt], [art])
        assert (facts.recipe_name, facts.artifact_sha256) == ("hifi-q4_k_m-mtp", sha256_file(art))
        assert len(facts.notes) == 1 and facts.notes[0].startswith(f"{odd} is not a valid receipt (")


# ---------------------------------------------------------------------------------------------------
# the publish gate: real and dry-run uploads refuse the same things, before any request
# ---------------------------------------------------------------------------------------------------


def sign_statement(statement: dict, priv: Path) -> dict:
    from ggufmtp.provenance.signing import sign_statement as sign

    return sign(statement, priv)


def refused_both_ways(fake, files, receipts, match, card=None, allow_unverified=False, public_key=None):
    """The API and the CLI, dry run and real, all refuse with ``match`` and the Hub sees nothing."""
    flags = (["--allow-unverified"] if allow_unverified else []) + (["--public-key", str(public_key)]
                                                                   if public_key else [])
    for dry_run in (True, False):
        with pytest.raises(HubRefusedError, match=match):
            upload("me/gated", files, receipts, card, UploadOptions(token=TOKEN, endpoint=fake.url, dry_run=dry_run,
                   allow_unverified=allow_unverified, public_key=public_key), progress=False)
        argv = ["upload", "me/gated", *map(str, files), *(x for r in receipts for x in ("--receipt", str(r))),
                *(["--card", str(card)] if card else []), *flags, *(["--dry-run"] if dry_run else [])]
        r = CliRunner().invoke(main, argv, env={"HF_ENDPOINT": fake.url, "HF_TOKEN": TOKEN})
        assert r.exit_code == 1, (argv, r.output)
        assert r.stderr.startswith("error: ") and "Traceback" not in r.output
        assert re.search(match, r.stderr), r.stderr
    assert fake.requests == [] and fake.repos == {}  # nothing sent: no repo, no commit, no file


def test_upload_refuses_receipts_that_do_not_describe_the_artifacts(fake, artifacts, tmp_path):
    art, rc, card = artifacts
    other = other_artifact(tmp_path)
    other_rc = tmp_path / "other.receipt.json"
    other_rc.write_text(json.dumps(receipt_of(other)))
    odd = tmp_path / "receipt.txt"
    odd.write_text("not json")
    listing = tmp_path / "list.json"
    listing.write_text("[1, 2]")
    refused_both_ways(fake, [art], [other_rc], f"no receipt describes .*{art.name} .*sha256 {sha256_file(art)}", card)
    refused_both_ways(fake, [art, other], [rc], f"no receipt describes .*{other.name}")  # one of two covered
    refused_both_ways(fake, [art], [rc, other_rc], "describes none of the files being uploaded")
    refused_both_ways(fake, [art], [odd], f"refusing to upload with receipt .*{odd.name}")
    refused_both_ways(fake, [art], [listing], f"refusing to upload with receipt .*{listing.name}")
    refused_both_ways(fake, [art], [tmp_path / "missing.json"], "missing.json")
    # the two artifacts, each with its own receipt, pass
    res = upload("me/two", [art, other], [rc, other_rc], None, UploadOptions(token=TOKEN, endpoint=fake.url), progress=False)
    assert sorted(fake.history("me/two")[0].files) == sorted([".gitattributes", art.name, other.name, rc.name,
                                                              other_rc.name])
    assert [a["verified"] for a in res.to_dict()["artifacts"]] == [True, True]


def test_upload_refuses_an_unverified_artifact_unless_allowed_and_the_card_says_so(fake, artifacts, tmp_path):
    from ggufmtp.provenance.card import UNVERIFIED_HEADING

    art, rc, card = artifacts
    for statement, match in ((receipt_of(art, "fail"), r"its verification failed \(verdict fail: acceptance 12.0 % is below"),
                             (receipt_of(art, None), "the receipt holds no runtime verification of it"),
                             ):
        rc.write_text(json.dumps(statement))
        refused_both_ways(fake, [art], [rc], f"refusing to publish .*{art.name}: {match}.*--allow-unverified", card)
    # a verification of other bytes is not an unverified artifact: the audit fails, no flag publishes it
    rc.write_text(json.dumps(receipt_of(art, "pass", served="ab" * 32)))
    for allow in (False, True):
        refused_both_ways(fake, [art], [rc], f"`ggufmtp audit` fails .*verification of these bytes: the verification "
                                             f"is of another file: .*sha256 {'ab' * 32}", card, allow_unverified=allow)
    rc.write_text(json.dumps(receipt_of(art, "fail")))
    refused_both_ways(fake, [art], [rc], "does not state that .* is not verified", card, allow_unverified=True)

    card.write_text(card.read_text() + f"\n{UNVERIFIED_HEADING}\n\n{art.name}: verification failed\n")
    runner, env = CliRunner(), {"HF_ENDPOINT": fake.url, "HF_TOKEN": TOKEN}
    argv = ["upload", "me/gated", str(art), "--receipt", str(rc), "--card", str(card), "--allow-unverified"]
    r = runner.invoke(main, [*argv, "--dry-run", "--json"], env=env)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["artifacts"][0]["verified"] is False and fake.requests == []
    r = runner.invoke(main, argv, env=env)
    assert r.exit_code == 0, r.output
    assert f"NOT VERIFIED {art.name}: its verification failed" in r.stdout
    head = fake.history("me/gated")[0]
    assert "NOT VERIFIED" in head.description and UNVERIFIED_HEADING in fake.file("me/gated", "README.md").decode()


def test_upload_with_a_public_key_requires_valid_signatures(fake, artifacts, tmp_path, monkeypatch):
    from ggufmtp.provenance.signing import sign_artifact

    art, rc, card = artifacts
    priv, pub = write_keypair(tmp_path)
    other_priv, _ = write_keypair(tmp_path, "other")
    refused_both_ways(fake, [art], [rc], "unsigned", card, public_key=pub)  # a plain receipt
    rc.write_text(json.dumps(sign_statement(receipt_of(art), priv)))
    refused_both_ways(fake, [art], [rc], f"signature of {art.name}: .*no signature at .*{art.name}.sig", card,
                      public_key=pub)
    sign_artifact(art, other_priv)
    refused_both_ways(fake, [art], [rc], f"`ggufmtp audit` fails .*signature of {art.name}: .*does not verify", card,
                      public_key=pub)
    rc.write_text(json.dumps(sign_statement(receipt_of(art), other_priv)))
    sign_artifact(art, priv)
    refused_both_ways(fake, [art], [rc], "signature of the receipt: .*DSSE signature does not verify", card,
                      public_key=pub)
    rc.write_text(json.dumps(sign_statement(receipt_of(art), priv)))

    monkeypatch.setenv("GGUFMTP_PUBLIC_KEY", str(pub))  # configured through the environment this time
    res = upload("me/signed", [art], [rc], card, UploadOptions(token=TOKEN, endpoint=fake.url), progress=False)
    files = fake.history("me/signed")[0].files
    assert f"{art.name}.sig" in files and fake.file("me/signed", f"{art.name}.sig") == (tmp_path / "out" / f"{art.name}.sig").read_bytes()
    check = res.to_dict()["artifacts"][0]
    assert check["signatures_checked"] and check["receipt_signed"] and check["signature"] == f"{art.name}.sig"
    art.write_bytes(art.read_bytes()[:-1] + b"\0")  # one byte changed: its receipt no longer describes it
    with pytest.raises(HubRefusedError, match="no receipt describes"):
        upload("me/signed", [art], [rc], None, UploadOptions(token=TOKEN, endpoint=fake.url, dry_run=True))


def test_pull_flags_files_the_hub_gives_no_checksum_for(fake, tmp_path):
    fake.commit("org/model", {"model.gguf": gguf_bytes(3000, seed=60), "config.json": b"{}"})
    fake.withhold_checksums("org/model", "model.gguf")
    res = pull("org/model", local_dir=tmp_path / "dl", endpoint=fake.url, progress=False)
    flags = {f.path: f.verified for f in res.files}
    assert flags == {".gitattributes": True, "config.json": True, "model.gguf": False} and not res.verified
    manifest = json.loads((tmp_path / "dl" / MANIFEST_NAME).read_text())
    assert manifest["verified"] is False
    assert {f["path"]: f["verified"] for f in manifest["files"]} == flags
    r = CliRunner().invoke(main, ["pull", "org/model", "--local-dir", str(tmp_path / "dl")],
                           env={"HF_ENDPOINT": fake.url})
    assert r.exit_code == 0 and "1 file(s) have no Hub checksum to compare with (sha256 recorded): model.gguf" in r.stdout


# ---------------------------------------------------------------------------------------------------
# hf upload's conventions (#41): --commit-message, --create-pr, --revision, --path-in-repo
# ---------------------------------------------------------------------------------------------------


def test_upload_into_a_folder_as_a_pull_request_with_its_own_message(fake, artifacts):
    """As ``hf upload --create-pr``: the commit goes onto a pull request against the branch (main
    here), which is left as it was and no branch is created; the files go into the folder, the card
    stays the repo's README.md."""
    art, rc, card = artifacts
    first = upload("me/pr", [art], [rc], card, UploadOptions(token=TOKEN, endpoint=fake.url), progress=False)
    res = upload("me/pr", [art], [rc], card, UploadOptions(token=TOKEN, endpoint=fake.url, create_pr=True,
                 path_in_repo="/Q4_K_M/", commit_message="Add the Q4_K_M variant"), progress=False)
    assert res.pr_url == f"{fake.url}/me/pr/discussions/1" and res.to_dict()["pr_url"] == res.pr_url
    assert fake.head("me/pr") == first.commit_sha  # main untouched
    pr = fake.history("me/pr", "refs/pr/1")
    assert pr[0].oid == res.commit_sha and pr[1].oid == first.commit_sha and pr[0].message == "Add the Q4_K_M variant"
    assert {f"Q4_K_M/{art.name}", f"Q4_K_M/{rc.name}", "README.md"} <= set(pr[0].files)
    assert fake.file("me/pr", f"Q4_K_M/{art.name}", "refs/pr/1") == art.read_bytes()
    assert not fake.requests_to("POST", r"/branch/")
    # a pull request against a branch that does not exist: the Hub's error, and no branch made for it
    with pytest.raises(HubError, match="v9"):
        upload("me/pr", [art], [rc], None, UploadOptions(token=TOKEN, endpoint=fake.url, create_pr=True,
                                                          revision="v9"), progress=False)
    assert "v9" not in fake.repos["me/pr"].branches and not fake.requests_to("POST", r"/branch/")


def test_the_hub_lists_the_refs_of_a_repo(fake, artifacts):
    """``GET /api/models/REPO/refs`` as the Hub answers it (huggingface_hub's ``list_repo_refs``, and
    what llama.cpp's ``-hf`` resolves a repo's commit from): branches with their commits, main first,
    pull requests only when asked for."""
    from huggingface_hub import HfApi

    art, rc, card = artifacts
    for folder, extra in (("a", {}), ("b", {"revision": "dev"}), ("c", {"create_pr": True})):  # each a change
        upload("me/refs", [art], [rc], card, UploadOptions(token=TOKEN, endpoint=fake.url, path_in_repo=folder, **extra),
               progress=False)
    refs = HfApi(endpoint=fake.url).list_repo_refs("me/refs", include_pull_requests=True)
    assert [(b.name, b.ref, b.target_commit) for b in refs.branches] == [
        ("main", "refs/heads/main", fake.head("me/refs")), ("dev", "refs/heads/dev", fake.head("me/refs", "dev"))]
    assert [(p.ref, p.target_commit) for p in refs.pull_requests or []] == [("refs/pr/1", fake.head("me/refs", "refs/pr/1"))]
    assert refs.tags == [] and HfApi(endpoint=fake.url).list_repo_refs("me/refs").pull_requests is None


def test_an_interrupted_upload_resends_only_what_the_hub_lacks(fake, artifacts, tmp_path):
    """A ladder goes up as ONE commit, never huggingface_hub's multi-commit folder pipeline (the
    reasons: ggufmtp/hub/upload.py's docstring); an upload that broke off is resumed by running it
    again, and sends only the files the Hub does not hold yet (the LFS batch API has no upload
    action for an object already stored), so the variants sent before the break are not sent twice."""
    art, rc, card = artifacts
    art2 = other_artifact(tmp_path)
    rc2 = tmp_path / "other.receipt.json"
    rc2.write_text(json.dumps(receipt_of(art2)))
    oid, oid2 = sha256_file(art), sha256_file(art2)
    # the second variant's upload is lost on the way (the connection broke): nothing of it is stored
    fake.on("PUT", rf"^/upload/{oid2}$", lambda req: fake.pending_uploads.pop(oid2, None))
    options = UploadOptions(token=TOKEN, endpoint=fake.url, revision="release")
    with pytest.raises(HubError):
        upload("me/big", [art, art2], [rc, rc2], card, options, progress=False)
    assert oid in fake.lfs and oid2 not in fake.lfs and len(fake.history("me/big", "release")) == 1  # no commit
    fake.requests.clear()
    res = upload("me/big", [art, art2], [rc, rc2], card, options, progress=False)
    assert [r.route for r in fake.requests_to("PUT", r"^/upload/")] == [f"/upload/{oid2}"]  # only what was lost
    commit = fake.history("me/big", "release")[0]
    assert commit.oid == res.commit_sha and {art.name, art2.name, rc.name, rc2.name, "README.md"} <= set(commit.files)
    assert fake.file("me/big", art2.name, "release") == art2.read_bytes() and len(fake.history("me/big")) == 1


def test_bad_upload_conventions_are_refused_before_anything_is_read(tmp_path):
    for bad, said in (("../up", "relative path"), ("a//b", "relative path"), ("a\\b", "relative path"),
                      ("mtp-heads", "'mtp-'"), ("x/Foo-mtp-bar", "'mtp-'")):
        with pytest.raises(HubRefusedError, match=re.escape(f"--path-in-repo {bad!r}") + ".*" + re.escape(said)):
            UploadOptions(path_in_repo=bad)
    with pytest.raises(HubRefusedError, match="--commit-message is empty"):
        UploadOptions(commit_message="  ")
    assert UploadOptions(path_in_repo="/").folder == "" and UploadOptions(path_in_repo="a/b/").folder == "a/b/"


def test_cli_upload_takes_hf_uploads_options(fake, artifacts):
    art, rc, card = artifacts
    env = {"HF_ENDPOINT": fake.url, "HF_TOKEN": TOKEN}
    argv = ["upload", "me/cli-pr", str(art), "--receipt", str(rc), "--card", str(card)]
    r = CliRunner().invoke(main, [*argv, "--revision", "dev", "--commit-message", "first", "--path-in-repo", "Q8_0"],
                           env=env)
    assert r.exit_code == 0, r.output
    assert fake.history("me/cli-pr", "dev")[0].message == "first"
    assert f"Q8_0/{art.name}" in fake.history("me/cli-pr", "dev")[0].files
    r = CliRunner().invoke(main, [*argv, "--revision", "dev", "--create-pr", "--dry-run"], env=env)
    assert r.exit_code == 0 and "would open a pull request of" in r.output, r.output
    r = CliRunner().invoke(main, [*argv, "--revision", "dev", "--create-pr"], env=env)
    assert r.exit_code == 0 and f"pull request: {fake.url}/me/cli-pr/discussions/1" in r.output, r.output
    assert fake.history("me/cli-pr", "refs/pr/1")[1].message == "first"  # opened against dev
    r = CliRunner().invoke(main, [*argv, "--path-in-repo", "../x"], env=env)
    assert r.exit_code == 1 and r.output.startswith("error: --path-in-repo '../x'") and "Traceback" not in r.output


def test_upload_notes_an_artifact_llama_cpp_would_not_take_as_a_model(fake, artifacts, capsys):
    """A name holding ``mtp-`` (ggufmtp's own names never do) is uploaded, with a note: llama.cpp's
    ``-hf`` skips it as a model and may serve it as another file's MTP draft."""
    art, rc, card = artifacts
    odd = art.with_name("model-mtp-q8.gguf")
    odd.write_bytes(other_artifact(art.parent.parent / "odd").read_bytes())  # other bytes: its own receipt
    orc = odd.with_name(odd.name + ".receipt.json")
    orc.write_text(json.dumps(receipt_of(odd)))
    res = upload("me/odd-name", [art, odd], [rc, orc], None, UploadOptions(dry_run=True), progress=False)
    assert len(res.notes) == 1 and "model-mtp-q8.gguf contains 'mtp-'" in res.notes[0]
    assert res.to_dict()["notes"] == list(res.notes)
    r = CliRunner().invoke(main, ["upload", "me/odd-name", str(odd), "--receipt", str(orc), "--dry-run"],
                           env={"HF_ENDPOINT": fake.url})
    assert r.exit_code == 0 and "note: model-mtp-q8.gguf contains 'mtp-'" in r.stderr, r.output
