"""#50 item 3 on the single-variant card (``ggufmtp card``): it says which draft its ``-hf`` tag loads.

The ladder card said, per tag, what ``llama-server -hf REPO:TAG --spec-type draft-mtp`` loads as the
draft (the pinned llama.cpp's resolver on the release's files: the head inside the file, or an
``mtp-`` sidecar); the single-variant card gave the same ``-hf`` line without it. Now it says so from
the same resolver (:func:`ggufmtp.quant.hf_resolve.draft_for`, through ``pair_card.draft_lines``), for a
variant with its own head and for a trunk served with the sidecar its receipt names, under
``--path-in-repo`` too. Receipts are honest ones of real synthesized GGUFs (tests/receipt_kit.py).
"""

from __future__ import annotations

import copy

from receipt_kit import honest_statement, synth_artifact

from ggufmtp.provenance.card import card_text
from ggufmtp.provenance.card_page import PageOptions
from ggufmtp.provenance.receipt import seal

REPO = "me/tiny-MTP-GGUF"
SIDECAR = "mtp-tiny-qwen35moe-Q8_0.gguf"


def _how_to_run(body: str) -> str:
    return body.split("## How to run", 1)[1].split("\n## ", 1)[0]


def test_a_full_variant_s_card_says_its_tag_drafts_with_the_head_inside_it(tmp_path):
    """Fails on fedf5a8: the card names no draft."""
    art = synth_artifact(tmp_path, "tiny-qwen35moe-Q4_K_M.gguf")
    _, body = card_text(honest_statement(art), options=PageOptions(repo_id=REPO))
    run = _how_to_run(body)
    assert f"llama-server -hf {REPO}:Q4_K_M --spec-type draft-mtp" in run, run
    assert (f"What `-hf {REPO}:TAG --spec-type draft-mtp` loads as the draft (llama.cpp's own choice, which the "
            "variant was verified with): `:Q4_K_M` drafts with the head inside its file.") in run, run


def test_a_trunk_s_card_says_its_tag_drafts_with_its_sidecar_under_the_folder_too(tmp_path):
    """Fails on fedf5a8: the card names no draft (only the -md line for local files)."""
    art = synth_artifact(tmp_path, "tiny-qwen35moe-Q4_K_M.gguf")
    st = copy.deepcopy(honest_statement(art))
    st["predicate"]["pair"] = {"role": "trunk", "made_from": {"name": art.name, "sha256": "a" * 64},
                               "source_sha256": ["b" * 64], "trunk": None,
                               "sidecar": {"name": SIDECAR, "sha256": "c" * 64}}
    for folder in (None, "v2"):
        _, body = card_text(seal(st), options=PageOptions(repo_id=REPO, path_in_repo=folder))
        at = f"{folder}/" if folder else ""
        assert f"`:Q4_K_M` drafts with the sidecar `{at}{SIDECAR}`." in _how_to_run(body), body
