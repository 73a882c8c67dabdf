"""The joint search's profile reaches the receipt and the card as the verified artifact is served
(issue #52 item 1), on the H200/H100 runs' own records:

* ``verify --tuned-from joint.json`` records the profile as served for the verified file
  (``verification.tuned``: its own name, the head built in, the verification's exact flags and
  figures, the search's kind and the JSON's sha256); the card's "Recommended server settings" shows
  it. On main ec4d486 such a verification had no ``tuned`` (only ``tune --receipt`` wrote one), so
  a re-typed head's card had no such section, and the search's own command drafted with the cached
  ``--spec-draft-model mtp-F16-....gguf`` sidecar.
* When MTP was not faster, the card said nothing of it: it showed vanilla's command under
  "Recommended server settings" as if it were MTP settings.
* A recommendation that is not the verification's own (another command, the search's figures) is
  refused by the receipt writer and failed by the audit; older receipts' sections are accepted.
"""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
from pathlib import Path

import pytest

from ggufmtp.errors import AuditError
from ggufmtp.measure.tune.run import load_tuned_profile
from ggufmtp.provenance.card import card_text
from ggufmtp.provenance.receipt import load_receipt, read_receipt, set_verification
from ggufmtp.provenance.tuned import TUNE_JOINT_KIND, ProfileSource, tuned_binding_problem, verified_tuned

ROOT = Path(__file__).resolve().parent.parent
JOINT = ROOT / "benchmarks/gpu/results-2026-11-29e-h200x2-joint"  # tune-joint, quantize, verify --tuned-from
TRAINED = ROOT / "benchmarks/gpu/results-2026-11-26e-h100-tune-trained/tune-trained.json"  # tune: MTP off
TINY = ROOT / "receipts" / "tiny-qwen35moe-0fef400b9589-hifi-q4_k_m-mtp.gguf.receipt.json"


def _joint_verification() -> dict:
    """The H200 run's ``verify joint.gguf --tuned-from joint.json`` in the receipt's form (file names,
    no paths: what ``VerifyResult.to_receipt`` makes of its JSON)."""
    v = json.loads((JOINT / "verify-joint.json").read_text())
    for key in ("requests", "seconds"):
        v.pop(key, None)
    v["model"]["name"] = Path(v["model"].pop("path")).name
    suite = v["suite"]
    if suite.get("path"):
        suite["file"] = Path(suite.pop("path")).name
    v["server"].pop("log", None)
    v["server"]["binary"] = Path(v["server"]["binary"]).name
    return v


def _with_profile(v: dict) -> dict:
    return {**v, "tuned": verified_tuned(v, load_tuned_profile(JOINT / "joint.json").source)}


def test_the_joint_profile_is_recommended_as_the_verified_file_is_served():
    """The search's command drafted with the cached sidecar; the recorded one is the verified file's,
    its head built in, with the verification's flags and figures (1.378x, not the search's 1.397x)."""
    search = json.loads((JOINT / "joint.json").read_text())
    assert "--spec-draft-model mtp-F16-" in search["command"]  # what the search measured
    v = _with_profile(_joint_verification())
    t = v["tuned"]
    assert t["kind"] == TUNE_JOINT_KIND  # the file says "ggufmtp tune" (older tune-joint): its joint section tells
    assert t["profile"]["name"] == "joint.json" and t["profile"]["search_recommended"] is True
    assert t["profile"]["sha256"] == hashlib.sha256((JOINT / "joint.json").read_bytes()).hexdigest()
    assert t["mtp_beats_vanilla"] and t["recommended"] == t["best"] == v["settings"]["mtp_config"]["key"]
    assert t["command"] == t["mtp_command"] == ("llama-server --model joint.gguf " + " ".join(v["mtp"]["server_args"]))
    assert "--spec-draft-model" not in t["command"] and "/dev/shm" not in t["command"]
    assert (t["speedup"], t["speedup_ci95"], t["acceptance"]) == (v["speedup"], v["speedup_ci95"],
                                                                  v["mtp"]["acceptance"])
    assert t["speedup"] != search["speedup"]
    st = json.loads(TINY.read_text())
    st["predicate"]["verification"] = v
    _, body = card_text(st)
    section = body.split("## Recommended server settings\n", 1)[1].split("\n## ", 1)[0]
    assert f"```sh\n{t['command']}\n```" in section and "`joint.json` (ggufmtp tune-joint" in section
    assert "not faster" not in section


def test_the_verification_decides_the_recommendation_not_the_search():
    """The same profile, verified with a CI lower bound at 1.0 or with output that differs from
    vanilla's: the recommendation is to serve without MTP, vanilla's command."""
    v = _joint_verification()
    for change in ({"speedup_ci95": [1.0, 1.6]}, {"findings": {**v["findings"], "lossless": "fail"}}):
        t = verified_tuned({**v, **change}, ProfileSource("joint.json", "ab" * 32, TUNE_JOINT_KIND, True))
        assert not t["mtp_beats_vanilla"] and t["recommended"] is None and t["recommended_config"] is None
        assert t["command"] == "llama-server --model joint.gguf " + " ".join(v["vanilla"]["server_args"])
        assert "run without MTP" in t["why"]


def test_the_card_says_plainly_when_mtp_was_not_faster():
    """The H100 tune of a trained head recommended MTP off (CI [0.620-0.719]); the card named its
    vanilla command "Recommended server settings" and nothing else. Now it says MTP was slower on
    that hardware, recommends serving without it, and shows the best MTP line as not recommended."""
    tuned = json.loads(TRAINED.read_text())
    assert tuned["recommended"] is None and tuned["command"] != tuned["mtp_command"]
    st = json.loads(TINY.read_text())
    st["predicate"]["verification"]["tuned"] = tuned
    _, body = card_text(st)
    section = body.split("## Recommended server settings\n", 1)[1].split("\n## ", 1)[0]
    assert "**MTP was slower on the hardware measured** (its 95% CI below 1.0), NVIDIA H100 80GB HBM3" in section
    assert "serve this file without MTP" in section and "not recommended" in section
    vanilla, mtp = section.index(f"```sh\n{tuned['command']}\n```"), section.index(f"```sh\n{tuned['mtp_command']}\n```")
    assert vanilla < section.index("not recommended") < mtp
    st["predicate"]["verification"]["tuned"] = {**tuned, "mtp_beats_vanilla": True, "command": tuned["mtp_command"]}
    assert not any(h in card_text(st)[1] for h in ("not faster", "**MTP was slower", "**MTP was not shown"))


@pytest.mark.parametrize(("ci", "headline"), [
    ([0.62, 0.72], "**MTP was slower on the hardware measured**"),
    ([0.49, 1.72], "**MTP was not shown to be faster on the hardware measured** (undecided: its 95% CI spans 1.0)"),
    (None, "**MTP was not shown to be faster on the hardware measured** (undecided: no CI)"),
    ([1.10, 1.30], "**MTP was faster, but its output was not vanilla's on the hardware measured**"),
])
def test_the_card_says_slower_only_when_the_ci_says_so(ci, headline):
    """An undecided speedup (its CI spanning 1.0) is reported as undecided, never as a loss: the card
    said "MTP was not faster" for a CPU run at 0.82x [0.49-1.72] as for the H100's [0.62-0.72], and
    for a profile refused because its output was not lossless although its CI was above 1."""
    tuned = json.loads(TRAINED.read_text())
    st = json.loads(TINY.read_text())
    st["predicate"]["verification"]["tuned"] = {**tuned, "speedup": 0.8 if ci is None else sum(ci) / 2,
                                                "speedup_ci95": ci}
    section = card_text(st)[1].split("## Recommended server settings\n", 1)[1].split("\n## ", 1)[0]
    assert headline in section, section
    assert "serve this file without MTP" in section
    assert sum(h in section for h in ("**MTP was slower", "**MTP was not shown", "**MTP was faster, but")) == 1


def test_a_recommendation_not_bound_to_its_verification_is_refused(tmp_path):
    """The receipt of the H200 joint artifact takes the verification with its profile; one whose
    recommended command is the search's sidecar line, or whose figures are the search's, is refused
    (receipt writer) and failed (audit check); an older receipt's search or sweep section is not
    derived from the verification and stays accepted."""
    from ggufmtp.provenance.audit import _verification_checks

    r = tmp_path / "joint.gguf.receipt.json"
    shutil.copy(JOINT / "joint.gguf.receipt.json", r)
    v = _with_profile(_joint_verification())
    set_verification(r, v)
    st = load_receipt(r)
    assert tuned_binding_problem(st["predicate"]["verification"]) is None
    assert all(c.ok for c in _verification_checks(st) if "recommended" in c.name)
    search = json.loads((JOINT / "joint.json").read_text())
    for change in ({"command": search["command"]}, {"speedup": search["speedup"]}):
        bad = copy.deepcopy(v)
        bad["tuned"].update(change)
        with pytest.raises(AuditError, match=r"verification.tuned \(verify --tuned-from joint.json\) is not this"):
            set_verification(r, bad)
        st["predicate"]["verification"] = bad
        check = next(c for c in _verification_checks(st) if c.name == "recommended settings are this verification's")
        assert not check.ok and next(iter(change)) in check.detail
    for older in ({"kind": "ggufmtp tune", "command": "llama-server --model joint.gguf"}, {"recommended_k": 4}):
        set_verification(r, {**v, "tuned": older})
        assert read_receipt(r).verification["tuned"] == older


def test_a_newer_verification_keeps_a_search_and_drops_an_older_verifications_profile(tmp_path):
    """A plain verify after ``verify --tuned-from`` drops that run's recommendation (its figures are
    the older run's), as it drops a sweep's; a search's section (tune, now also tune-joint) stays: a
    ``--tuned-from`` verification keeps it inside its own, and it comes back when that one goes."""
    r = tmp_path / "joint.gguf.receipt.json"
    shutil.copy(JOINT / "joint.gguf.receipt.json", r)
    v = _joint_verification()
    set_verification(r, _with_profile(v))
    set_verification(r, {**v, "tuned": None}, keep_added=True)
    assert read_receipt(r).verification["tuned"] is None
    for kind in ("ggufmtp tune", TUNE_JOINT_KIND):
        search = {"kind": kind, "command": "llama-server --model joint.gguf", "best": "k=4"}
        set_verification(r, {**v, "tuned": search})
        set_verification(r, {**v, "tuned": None}, keep_added=True)
        assert read_receipt(r).verification["tuned"] == search
    set_verification(r, _with_profile(v), keep_added=True)
    t = read_receipt(r).verification["tuned"]
    assert t["profile"]["name"] == "joint.json" and t["search"] == search
    assert tuned_binding_problem(read_receipt(r).verification) is None
    set_verification(r, {**v, "tuned": None}, keep_added=True)
    assert read_receipt(r).verification["tuned"] == search
