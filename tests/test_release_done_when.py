"""Issue #50's Done-when, run as a publisher and a user would, end to end, against the local Hub.

The publisher ``ggufmtp search``es a recipe for ``builtin:tiny-qwen35moe-trained`` (a small budget
that no all-Q8_0 trunk fits, so the searched trunk differs from the shipped ones), then makes one
release of four variants, the searched one among them, as trunks in shards (``--split-max-size``)
beside an MTP sidecar (``--layout sidecar``), verified with the fewest prompts and tokens the
publish gate takes, and ``--upload``s it. Then a user, on an empty llama.cpp cache, takes for EVERY
file of the release the label the Hub shows for it (huggingface.js ``parseGGUFQuantLabel``:
:func:`ggufmtp.quant.naming.hub_label`), types it into the card's ``llama-server -hf REPO:TAG ...``
line for that file, exactly as the card prints it, and runs it: the pinned llama-server must load
that file (a trunk and all its shards, or the sidecar as the draft), with the draft the receipt
says it was verified with, and draft. The card must carry every element of #50's "What to build"
item 1. A rerun of the same ``ladder ... --upload`` measures nothing (no process, no quantization).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from fakehub import FakeHub, isolate_hf_client
from test_hf_serve import _downloaded, _run_lines, _serve, _shards, _tags
from test_ladder_reuse import _spy_on_processes

from ggufmtp.cli import main
from ggufmtp.quant.naming import hub_label

MODEL = "builtin:tiny-qwen35moe-trained"
REPO = "me/tiny-trained-release"
TOKEN = "hf_doneWHEN"
UPSTREAM = "upstream-org/Tiny-Qwen35MoE-Trained"  # --base-model: the card's base_model
# Q8_0 and Q4_0 work at the tiny model's widths (k-quants fall back there); 7 bpw is below an
# all-Q8_0 trunk (8.5 bpw), so the search must cut some trunk group to Q4_0 whatever it measures
SEARCH = ("--budget", "7bpw", "--types", "Q8_0,Q4_0", "--chunks", "2", "--layers-per-group", "8", "-t", "1")
RECIPES = ("q8_0-mtp", "q4_k_m-mtp-q8", "iq4_xs-mtp")
TAGS = {"Q8_0", "Q4_K_M_FullHead", "IQ4_XS", "Q8_0_Searched"}
COMMIT_MAX = "2000K"  # below the release's 6 MB: it goes up as a large one does, in several commits
# 8 prompts x 64 tokens: the least evidence the publish gate takes for a verdict. Too few to decide a
# trained head at the recipes' 3-point margin on every machine: 0.10 (the widest allowed), and
# --allow-unverified so an undecided head is published as such (the card then says so); this test is
# about what goes up and what -hf serves, not about judging heads (test_head_* do that)
VERIFY = ("--imatrix-corpus", "builtin:calib-v1", "--imatrix-chunks", "2", "--seeds", "42", "--limit", "8",
          "--max-tokens", "64", "-t", "1", "--head-margin", "0.10", "--allow-unverified")


@dataclass
class Release:
    hub: FakeHub
    argv: list[str]
    env: dict[str, str]
    out: Path


@pytest.fixture(scope="module")
def release(llama_server_bin, tmp_path_factory):
    root = tmp_path_factory.mktemp("done-when")
    with pytest.MonkeyPatch.context() as mp, FakeHub(tokens=(TOKEN,)) as fake:
        isolate_hf_client(root / "hf_home", mp)
        mp.delenv("GGUFMTP_PUBLIC_KEY", raising=False)
        found = root / "searched.toml"
        r = CliRunner().invoke(main, ["--no-progress", "search", MODEL, *SEARCH, "-o", str(found)])
        assert r.exit_code == 0 and found.is_file(), r.output
        recipes = [a for name in (*RECIPES, str(found)) for a in ("-r", name)]
        argv = ["--no-progress", "ladder", "-m", MODEL, *recipes, "--layout", "sidecar", "--split-max-size", "1M",
                *VERIFY, "--base-model", UPSTREAM, "--quantized-by", "me", "-o", str(root / "ladder"),
                "--upload", REPO, "--commit-max-size", COMMIT_MAX]
        env = {"HF_TOKEN": TOKEN, "HF_ENDPOINT": fake.url}
        r = CliRunner().invoke(main, argv, env=env)
        assert "uploaded: " in r.output and "Traceback" not in r.output, r.output
        assert r.exit_code == 0 or "inconclusive" in r.output, r.output
        assert f"uploaded: {fake.url}/{REPO}/commit/{fake.head(REPO)}" in r.output  # the final commit
        yield Release(fake, argv, env, root / "ladder")


def _receipt_draft(hub: FakeHub, model: str) -> str:
    """The sidecar the receipt of ``model`` (a trunk's first shard) says it was verified with."""
    p = json.loads(hub.file(REPO, model + ".receipt.json"))["predicate"]
    assert p["pair"]["role"] == "trunk"
    assert p["verification"]["model"]["sidecar"]["name"] == p["pair"]["sidecar"]["name"]
    return p["pair"]["sidecar"]["name"]


def test_every_file_s_hub_label_on_the_card_s_line_loads_that_file_and_its_verified_draft(release, tmp_path):
    hub = release.hub
    card = hub.file(REPO, "README.md").decode()
    files = sorted(f for f in hub.history(REPO)[0].files if f.endswith(".gguf"))
    tags, runs = _tags(card), _run_lines(card, REPO)
    assert set(tags) == set(runs) == TAGS, (tags, runs)
    sidecars = [f for f in files if f.startswith("mtp-")]
    assert len(sidecars) == 1 and all(len(_shards(f)) == 2 for f in tags.values()), files  # sidecar + split
    assert set(files) == {s for f in tags.values() for s in _shards(f)} | set(sidecars)
    for file in files:
        label = hub_label(file)
        assert label is not None, file
        # the card's line whose tag the Hub's label spells (the Hub upper-cases it)
        tag = next((t for t in runs if t.upper() == label), None)
        assert tag is not None, f"{file}: the Hub labels it {label}; the card has no -hf line for it: {sorted(runs)}"
        hub.requests.clear()
        cache = tmp_path / re.sub(r"\W", "_", file)
        snapshot = cache / f"models--{REPO.replace('/', '--')}" / "snapshots" / hub.head(REPO)
        model, draft, _ = _serve(hub, runs[tag], label, cache)  # asserts it drafted
        loaded = Path(model).relative_to(snapshot).as_posix()
        verified = _receipt_draft(hub, loaded)
        assert draft == f"loading draft model '{snapshot / verified}'", (file, draft)
        assert file in _shards(loaded) | {verified}, (file, label, loaded, verified)
        assert _downloaded(hub, REPO) == _shards(loaded) | {verified}, file


def test_the_release_went_up_in_parts_each_serving_what_it_holds(release):
    """Several commits (``(part N)``), the sidecar in the first, each trunk whole (both shards and its
    receipt) in one, the card in the last."""
    hub = release.hub
    parts = [c for c in hub.history(REPO)[::-1] if c.message.startswith("ggufmtp ladder")]
    assert len(parts) >= 3 and [c.message.endswith(f"(part {i + 1})") for i, c in enumerate(parts)][1:] == [True] * (
        len(parts) - 1), [c.message for c in parts]
    added = [set(c.files) - set(hub.repos[REPO].commits[c.parent].files) for c in parts]
    assert any(f.startswith("mtp-") for f in added[0]) and "README.md" in added[-1] and "README.md" not in added[0]
    for new in added:
        for first in (f for f in new if f.endswith("-00001-of-00002.gguf")):
            assert {first.replace("00001-of", "00002-of"), first + ".receipt.json"} <= new, new


def test_the_card_has_every_element_of_a_model_page(release):
    """#50 "What to build" item 1, element by element, on the uploaded card."""
    card = release.hub.file(REPO, "README.md").decode()
    front, body = card.removeprefix("---\n").split("\n---\n", 1)
    yaml = set(front.splitlines())
    assert {f"base_model: {UPSTREAM}", "base_model_relation: quantized", "quantized_by: me"} <= yaml, front
    # which file: its size, the GPU memory it needs with the head at a stated context, what it is for
    assert "| file | quant | size | GPU memory at 4K context | what it is for |" in body
    rows = re.findall(r"^\| \[[^\]]+\]\([^)]+\) \(2 shards\) \| [^|]+ \| ([\d.]+ [KM]iB) \| ([\d.]+ GiB) \| ([^|]+) \|$",
                      body, re.MULTILINE)
    assert len(rows) == 4 and all(len(purpose) > 20 for _, _, purpose in rows), rows
    assert sum("**Recommended**" in p for _, _, p in rows) == 1
    imatrix = body.split("## Importance matrix", 1)[1].split("\n## ", 1)[0]
    assert "builtin:calib-v1" in imatrix and "MTP head's own statistics" in imatrix, imatrix
    assert "```jinja\n" in body and "<|im_start|>" in body  # the template as a block
    for f in _tags(card).values():  # download and run lines for every file
        stem = f.removesuffix("-00001-of-00002.gguf")
        assert f'hf download {REPO} --include "{stem}-*-of-00002.gguf"' in body, stem
    assert all(" ".join(argv).count("--spec-type draft-mtp") == 1 for argv in _run_lines(card, REPO).values())
    findings = body.split("## Findings", 1)[1].split("\n## ", 1)[0]
    assert all(f"`{f}`" in findings for f in _tags(card).values()), findings  # findings per variant, in words
    provenance = body.split("## Provenance", 1)[1]
    assert "receipt" in provenance and "ggufmtp audit" in provenance and "sign" in provenance, provenance
    assert "How the recipe was found" in body  # the searched recipe's own section


def test_rerunning_the_ladder_with_upload_measures_nothing(release, monkeypatch):
    """The same ``ladder ... --upload`` again: no llama-server, no quantization, receipts untouched,
    and the release, all there already, makes no commit."""
    receipts = sorted(release.out.glob("**/*.receipt.json"))
    head = release.hub.head(REPO)
    before = {p: p.read_bytes() for p in receipts}
    started = _spy_on_processes(monkeypatch)
    r = CliRunner().invoke(main, release.argv, env=release.env)
    assert "uploaded: " in r.output and "Traceback" not in r.output, r.output
    assert started == [], started
    assert {p: p.read_bytes() for p in receipts} == before
    assert all(f"{t}: reused" in r.output for t in TAGS), r.output
    assert release.hub.head(REPO) == head and f"uploaded: {release.hub.url}/{REPO}/commit/{head}" in r.output
