"""#50 item 2: release names the Hub's parser and llama.cpp's ``-hf`` read the same way.

Two rules, from their sources:

* the Hub's label (huggingface.js ``packages/tasks/src/gguf.ts``, ``parseGGUFQuantLabel``: a
  percentage-mixed name's dominant type, else ``fname.toUpperCase().match(GGUF_QUANT_RE_GLOBAL)
  ?.at(-1)`` with ``GGUF_QUANT_RE = (?<prefix>UD-)?(?<quant>F32|F16|Q4_0|...)(_(?<sizeVariation>[A-Z]+))?``;
  ``local-apps.ts`` ``getQuantTag(filepath)`` puts it in the "Use this model" line ``-hf REPO:LABEL``);
* llama.cpp's model for ``-hf REPO:TAG`` (pinned ``common/download.cpp``: ``find_best_model`` l.655
  takes the first model file whose path matches ``TAG[.-]`` case-insensitively, l.666;
  ``gguf_filename_is_model`` l.637 drops ``mtp-`` and the other non-model names).

ggufmtp.quant.naming implements both (``hub_label``, ``selects``); these tests pin them to names
whose readings follow from the quoted rules by hand, and hold every release name to them.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from ggufmtp.errors import HubRefusedError, LadderError, RecipeError
from ggufmtp.ladder.spec import LadderSpec
from ggufmtp.quant.naming import hub_label, label_problems, selects, variant_file_name, variant_folder
from ggufmtp.quant.recipe import Recipe, shipped_recipes


@pytest.mark.parametrize(("path", "label"), [
    ("M-Q4_K_M.gguf", "Q4_K_M"),
    ("M-Q4_K_M_HiFi.gguf", "Q4_K_M_HIFI"),  # "_" and letters: the size variation
    ("M-Q4_K_M_HeadQ8.gguf", "Q4_K_M_HEADQ"),  # [A-Z]+ stops at the digit (the case)
    ("M-Q4_K_M-HiFi.gguf", "Q4_K_M"),  # "-" ends the label
    ("M-UD-Q4_K_XL.gguf", "UD-Q4_K_XL"),  # Unsloth's prefix and custom type
    ("M-Q4_0_4_4.gguf", "Q4_0"),  # the alternation's first match, Q4_0, comes before Q4_0_4_4 in the enum
    ("Q8_0-old/M-Q4_K_M.gguf", "Q4_K_M"),  # the last match in the path
    ("Q4_K_M/M-Searched-4_88bpw.gguf", "Q4_K_M"),  # a folder's type when the name has none
    ("M-Searched-4_88bpw.gguf", None),  # the old searched tag: no label at all
    ("Model-55IQ2_XXS-34Q2_K-07Q8_0-03F16.gguf", "IQ2_XXS"),  # gguf.ts's own mix example: the dominant part
])
def test_hub_label_reads_names_as_huggingface_js_does(path, label):
    assert hub_label(path) == label


def test_every_shipped_tag_is_the_label_the_hub_shows_and_loads_its_own_file():
    """Fails on 8641bee: q4_k_m-mtp-q8 was tagged Q4_K_M_HeadQ8, labelled Q4_K_M_HEADQ, which -hf
    resolves to no file. Every shipped recipe's file, flat (as --upload commits them) and in the
    ladder's <TAG>/ folders: the Hub's label is its tag, and -hf REPO:LABEL matches it and no other."""
    tags = [Recipe.load(r).release_tag for r in shipped_recipes()]
    for at in (lambda t: "", variant_folder):
        paths = [f"{at(t) and at(t) + '/'}{variant_file_name('Qwen3.6-35B-A3B', t)}" for t in tags]
        for tag, path in zip(tags, paths, strict=True):
            label = hub_label(path)
            assert label == tag.upper(), path
            assert [p for p in paths if selects(label, p)] == [path]
        assert label_problems(paths) == []


def test_a_tag_the_hub_misreads_is_refused_when_the_recipe_loads(tmp_path):
    """Fails on 8641bee (the tag was accepted): a tag whose file the Hub labels otherwise."""
    for tag, said in (("Q4_K_M_HeadQ8", "Q4_K_M_HEADQ"), ("Q4_K_M-HiFi", "label Q4_K_M"),
                      ("Searched-4_88bpw", "no quant label")):
        f = tmp_path / "r.toml"
        f.write_text(f'name = "r"\nftype = "Q4_K_M"\ntag = "{tag}"\n')
        with pytest.raises(RecipeError, match=said):
            Recipe.load(str(f))


def test_a_searched_recipe_gets_a_label_the_hub_reads():
    """Fails on 8641bee (``Searched-<bpw>``: no label): the searched tag is its base type's label."""
    from ggufmtp.search.found import release_tag

    for ftype in ("Q4_K_M", "Q8_0", "IQ4_XS"):
        tag = release_tag(ftype)
        assert hub_label(variant_file_name("Qwen3.6-35B-A3B", tag)) == tag.upper() == f"{ftype}_SEARCHED"
        # and a shipped file of the same type is not taken for it, nor it for the shipped one
        assert not selects(ftype, variant_file_name("M", tag)) and not selects(tag, variant_file_name("M", ftype))


def test_a_folder_or_model_name_holding_another_type_is_refused_before_any_work(tmp_path):
    """Fails on 8641bee: with --path-in-repo Q8_0-old, -hf REPO:Q8_0 matched the Q4_K_M file too
    (``Q8_0-`` in its path), and so did a model named Q8_0-distill; the ladder took both."""
    spec = LadderSpec(model="builtin:tiny-qwen35moe-f20", recipes=("q8_0-mtp", "hifi-q4_k_m-mtp"), out_dir=tmp_path)
    spec.check_names("tiny")  # the names as they are: fine
    with pytest.raises(LadderError, match=r"--path-in-repo Q8_0-old.*-hf REPO:Q8_0 would match Q8_0-old/M-Q4_K_M_HiFi"):
        dataclasses.replace(spec, path_in_repo="Q8_0-old").check()
    with pytest.raises(LadderError, match=r"of model Q8_0-distill .*-hf REPO:Q8_0 would match"):
        spec.check_names("Q8_0-distill")
    # the CLI refuses it before the ladder starts: no imatrix, no variant folder
    from click.testing import CliRunner

    from ggufmtp.cli import main

    out = tmp_path / "ladder"
    r = CliRunner().invoke(main, ["ladder", "-m", "builtin:tiny-qwen35moe-f20", "-r", "q8_0-mtp", "-r",
                                  "hifi-q4_k_m-mtp", "-o", str(out), "--upload", "me/x", "--path-in-repo",
                                  "Q8_0-old", "--no-verify"])
    assert r.exit_code != 0 and "Q8_0-old" in r.output + (r.stderr if r.stderr_bytes else "")
    assert not (out / "Q8_0").exists() and not (out / "Q4_K_M_HiFi").exists()


def _dry_upload(files, receipts, folder=None):
    from ggufmtp.hub.upload import UploadOptions, upload

    return upload("me/x", files, receipts, None,
                  UploadOptions(dry_run=True, allow_unverified=True, path_in_repo=folder), progress=False)


def test_upload_refuses_labels_that_load_another_file(tmp_path):
    """Fails on 8641bee (only a note, then uploaded): under Q8_0-old/ -hf REPO:Q8_0 takes the Q4_K_M file."""
    files = [tmp_path / "M-Q8_0.gguf", tmp_path / "M-Q4_K_M.gguf"]
    for f in files:
        f.write_bytes(b"not read: refused before hashing")
    rc = tmp_path / "r.json"
    rc.write_text("{}")
    with pytest.raises(HubRefusedError, match=r"Q8_0-old/M-Q8_0.gguf: the Hub labels it Q8_0, and -hf REPO:Q8_0 "
                                              r"matches Q8_0-old/M-Q4_K_M.gguf"):
        _dry_upload(files, [rc], "Q8_0-old")
    (tmp_path / "M-Q4_K_M_HeadQ8.gguf").write_bytes(b"x")
    with pytest.raises(HubRefusedError, match=r"labels it Q4_K_M_HEADQ, and -hf REPO:Q4_K_M_HEADQ matches no file"):
        _dry_upload([files[0], tmp_path / "M-Q4_K_M_HeadQ8.gguf"], [rc])


def test_upload_refuses_a_sidecar_named_without_mtp(synth_model, tmp_path):
    """Fails on 8641bee (uploaded and carded as a sidecar): an MTP-only GGUF whose name lacks
    ``mtp-`` is a *model* to llama.cpp's -hf (gguf_filename_is_model), never a draft (find_best_mtp)."""
    from ggufmtp.quant.sidecar import SidecarOptions, make_sidecar
    from ggufmtp.synth.builtin import BUILTIN_MODELS

    src = synth_model(BUILTIN_MODELS["tiny-qwen35moe-f20"])
    side = tmp_path / "mtp-tiny-Q8_0.gguf"
    make_sidecar(src, side, SidecarOptions(recipe="Q8_0"))
    bare = tmp_path / "tiny-draft-Q8_0.gguf"
    shutil.copyfile(side, bare)
    rc = tmp_path / "r.json"
    rc.write_text("{}")
    with pytest.raises(HubRefusedError, match=r"tiny-draft-Q8_0.gguf is an MTP sidecar .* lacks 'mtp-'"):
        _dry_upload([bare], [rc])
    assert Path(side).is_file()
