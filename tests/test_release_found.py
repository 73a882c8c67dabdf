"""What broke when issue #50's Done-when was run as a publisher would (tests/test_release_done_when.py).

Publishing the same release again: before any work the ladder checks what ``-hf REPO:TAG`` would load from the repo's final listing: the
repo's files plus the release's. It does not know yet whether a variant will be written whole or in
shards (its size decides), so it plans the whole name; a repo that already holds that variant in
shards (the same ``ladder ... --upload``, run again) was taken for a second file answering the tag,
and the rerun was refused. A file of the repo that is the planned variant in another form is not a
second file; one that is another variant's still is.

Two variants with the same bytes: a searched recipe that differs from a shipped one only in the MTP
head gives, in the sidecar layout (trunks without the head), a trunk byte for byte the shipped one's.
The publish gate found each artifact's receipt by digest alone, gave both files the first receipt,
and refused the second (``receipt covers <the other's name>``).
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
from receipt_kit import honest_statement, synth_artifact

from ggufmtp.errors import HubRefusedError, LadderError
from ggufmtp.files.hashing import sha256_file
from ggufmtp.hub.gate import check_publishable
from ggufmtp.ladder.spec import LadderSpec
from ggufmtp.provenance.receipt import default_receipt_path

MODEL = "tiny"


def _spec(tmp_path, repo_files: tuple[str, ...]) -> LadderSpec:
    spec = LadderSpec(model="builtin:tiny-qwen35moe-trained", recipes=("q8_0-mtp", "iq4_xs-mtp"), out_dir=tmp_path,
                      layout="sidecar", split_max_size="1M", repo_id="me/rel")
    return dataclasses.replace(spec, repo_files=repo_files)


def test_a_repo_holding_this_release_in_shards_is_not_a_second_file_for_its_tags(tmp_path):
    """Fails on fedf5a8: ``-hf REPO:Q8_0 matches both tiny-Q8_0.gguf and tiny-Q8_0-00001-of-00002.gguf``."""
    published = ("README.md", "mtp-tiny-Q8_0.gguf", "mtp-tiny-Q8_0.gguf.receipt.json",
                 *(f"tiny-{t}-0000{i}-of-00002.gguf" for t in ("Q8_0", "IQ4_XS") for i in (1, 2)),
                 "tiny-Q8_0-00001-of-00002.gguf.receipt.json", "tiny-IQ4_XS-00001-of-00002.gguf.receipt.json")
    _spec(tmp_path, published).check_names(MODEL)
    _spec(tmp_path, ("tiny-Q8_0.gguf", "tiny-IQ4_XS.gguf")).check_names(MODEL)  # published whole before


def test_another_file_answering_a_tag_is_still_refused(tmp_path):
    """What the check is for stays: a file of the repo that another name's search ``Q8_0[.-]`` also
    matches (another model's, an older folder's) would be loaded by the same tag."""
    for other in ("other-Q8_0.gguf", "old/tiny-Q8_0-00001-of-00002.gguf"):
        with pytest.raises(LadderError, match=rf"-hf REPO:Q8_0 matches both .*{other}|{other}.* matches both"):
            _spec(tmp_path, (other,)).check_names(MODEL)


def test_two_files_with_the_same_bytes_each_pass_the_gate_with_their_own_receipt(tmp_path):
    """Fails on fedf5a8: ``refusing to upload .../M-Q8_0_Searched.gguf: `ggufmtp audit` fails ...
    receipt covers M-Q8_0.gguf; not M-Q8_0_Searched.gguf``."""
    a = synth_artifact(tmp_path, "M-Q8_0.gguf")
    b = shutil.copyfile(a, tmp_path / "M-Q8_0_Searched.gguf")
    for art in (a, b):
        default_receipt_path(art).write_text(json.dumps(honest_statement(art)))
    sha = sha256_file(a)
    receipts = [default_receipt_path(a), default_receipt_path(b)]
    for order in (receipts, receipts[::-1]):
        found = check_publishable({a: sha, b: sha}, order, allow_unverified=True)
        assert {c.artifact: c.receipt for c in found.artifacts} == {a: receipts[0], b: receipts[1]}
    # a file no receipt names is still refused by the audit, whichever receipt its digest finds
    c = shutil.copyfile(a, tmp_path / "M-IQ4_XS.gguf")
    with pytest.raises(HubRefusedError, match="receipt covers M-Q8_0.gguf; not M-IQ4_XS.gguf"):
        check_publishable({a: sha, c: sha}, receipts[:1], allow_unverified=True)
