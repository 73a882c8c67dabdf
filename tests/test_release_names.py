"""Release names llama.cpp's ``-hf owner/repo:TAG`` resolves (issue #41, item 1).

The resolver is the pinned llama.cpp's own: ``llama-server -hf REPO:TAG --offline`` on a Hub cache
laid out as huggingface_hub lays it out (``models--owner--name/refs/main``,
``snapshots/<commit>/<path>``), which runs the same ``common_download_get_hf_plan`` ->
``find_best_model`` / ``find_best_mtp`` as a download, on the cache's listing instead of the Hub's
(common/download.cpp:706-716). Nothing of the resolver is re-implemented here: the names come from
ggufmtp (quant/naming.py, the recipes' tags), the choice from llama-server. The rules themselves
(documented in docs/reference/names.md) are checked on every shipped recipe without llama.cpp.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ggufmtp.errors import LadderError, RecipeError
from ggufmtp.ladder.spec import LadderSpec
from ggufmtp.quant.naming import (
    ambiguous_tags,
    hub_label,
    model_name,
    name_problem,
    sidecar_file_name,
    tag_problem,
    variant_file_name,
    variant_folder,
)
from ggufmtp.quant.recipe import Recipe, shipped_recipes
from ggufmtp.runtime.server import LlamaServer, ServerConfig

REPO, COMMIT = "me/tiny-release", "0123456789abcdef0123456789abcdef01234567"
TAGS = {r: Recipe.load(r).release_tag for r in shipped_recipes()}


def test_every_shipped_recipe_declares_a_tag_that_names_a_model():
    """Each shipped recipe states its tag, none holds what makes llama.cpp skip a file as a model
    (``gguf_filename_is_model``, common/download.cpp:637), and all of them can share one repo: no
    tag's search ``TAG[.-]`` (common/download.cpp:666) matches another variant's file."""
    for recipe in shipped_recipes():
        declared = Recipe.load(recipe).tag
        assert declared and tag_problem(declared) is None, recipe
        name = variant_file_name("Qwen3.6-35B-A3B", declared)
        assert name_problem(name) is None and name_problem(f"{variant_folder(declared)}/{name}") is None
        assert "mtp-" not in name.lower() and "mtp-" not in variant_folder(declared).lower()
    flat = [(t, variant_file_name("Qwen3.6-35B-A3B", t)) for t in TAGS.values()]
    assert ambiguous_tags(flat) == []
    assert TAGS["hifi-q4_k_m-mtp"] == "Q4_K_M_HiFi" and TAGS["q8_0-mtp"] == "Q8_0"


@pytest.mark.parametrize(("reference", "file", "converted", "name"), [
    ("builtin:tiny-qwen35moe", "/c/tiny-qwen35moe-0fef400b9589.gguf", False, "tiny-qwen35moe"),
    ("unsloth/Qwen3.6-35B-A3B-GGUF", "/c/Qwen3.6-35B-A3B-BF16-00001-of-00002.gguf", False, "Qwen3.6-35B-A3B"),
    ("Qwen/Qwen3.6-35B-A3B@main", "/c/converted/k/model-bf16.gguf", True, "Qwen3.6-35B-A3B"),
    ("/data/x.gguf", "/data/Foo-MTP-F16.gguf", False, "Foo"),
    ("/data/x.gguf", "/data/tiny-nomtp-BF16.gguf", False, "tiny-nomtp_"),
    ("/data/x.gguf", "/data/Bar-NoMTP-v2.gguf", False, "Bar-NoMTP_-v2"),
])
def test_the_model_name_drops_precision_hash_and_mtp(reference, file, converted, name):
    assert model_name(reference, file, converted=converted) == name
    assert name_problem(variant_file_name(name, "Q8_0")) is None
    assert sidecar_file_name(name, "Q8_0") == f"mtp-{name}-Q8_0.gguf"


def test_a_bad_tag_is_one_clear_error_naming_the_recipe(tmp_path):
    for tag, said in (("Q4_K_M-mtp-x", "'mtp-'"), ("Q4.K", "letters, digits"), ("a:b", "letters, digits"),
                      ("IQ4_imatrix", "'imatrix'")):
        f = tmp_path / "r.toml"
        f.write_text(f'name = "r"\nftype = "Q4_K_M"\ntag = "{tag}"\n')
        with pytest.raises(RecipeError, match=re.escape(str(f)) + ".*" + re.escape(said)):
            Recipe.load(f)


def test_a_ladder_refuses_tags_llama_cpp_cannot_tell_apart(tmp_path):
    """Two recipes with one tag, or one tag whose search matches the other's file (``Q4_K_M`` and
    ``Q4_K_M-x``: ``-hf REPO:Q4_K_M`` would take either), are refused before any work."""
    def recipe(name: str, tag: str) -> str:
        p = tmp_path / f"{name}.toml"
        p.write_text(f'name = "{name}"\nftype = "Q4_K_M"\ntag = "{tag}"\n')
        return str(p)

    with pytest.raises(LadderError, match=re.escape("tag Q4_K_M_HIFI is given twice")):
        LadderSpec(model="builtin:tiny-qwen35moe", recipes=(recipe("a", "Q4_K_M_HiFi"), "hifi-q4_k_m-mtp"),
                   out_dir=tmp_path / "out").check()
    # Q4_K_M-x is refused as it loads (the Hub labels its file Q4_K_M: tests/test_hub_labels.py), so
    # a colliding pair can no longer be declared
    with pytest.raises(RecipeError, match=re.escape("reads the label Q4_K_M in")):
        LadderSpec(model="builtin:tiny-qwen35moe", recipes=(recipe("b", "Q4_K_M"), recipe("c", "Q4_K_M-x")),
                   out_dir=tmp_path / "out").check()
    spec = LadderSpec(model="builtin:tiny-qwen35moe", recipes=tuple(TAGS), out_dir=tmp_path / "out").check()
    assert {spec.variant_dir(r).name for r in TAGS} == set(TAGS.values())


def _hub_cache(root: Path, files: list[str], target: Path) -> Path:
    """A Hub cache holding ``REPO`` at ``COMMIT`` with ``files`` (each a link to ``target``)."""
    repo = root / ("models--" + REPO.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    for f in files:
        p = repo / "snapshots" / COMMIT / f
        p.parent.mkdir(parents=True, exist_ok=True)
        p.symlink_to(target)
    return repo / "snapshots" / COMMIT


def _resolved(cache: Path, tag: str | None, stand_in: Path) -> tuple[str, str | None]:
    """(model, MTP draft) that the pinned llama-server's ``-hf REPO[:TAG] --spec-type draft-mtp``
    loads, as paths in the snapshot. ``--model`` names a file outside the repo: ``-hf`` replaces it
    with the file it resolved (common/arg.cpp, common_models_handler_apply)."""
    cfg = ServerConfig(model=stand_in, draft_mtp=True, ctx_size=256, threads=1,
                       extra_args=["-hf", REPO + (f":{tag}" if tag else ""), "--offline"],
                       env={"LLAMA_CACHE": str(cache)})
    with LlamaServer(cfg) as srv:
        model = srv.props()["model_path"]
        log = Path(srv.log_path).read_text()
    draft = re.search(r"loading draft model '([^']+)'", log)
    return model, draft.group(1) if draft else None


@pytest.mark.parametrize("layout", ["flat", "folders"])
def test_llama_server_hf_resolves_every_variant_and_the_sidecar(tiny_mtp_model, llama_server_bin, tmp_path, layout):
    """A repo of every shipped recipe's variant (flat, as ``ladder --upload`` commits them, or in
    the ladder's ``<TAG>/`` folders), the BF16 source and one MTP sidecar: ``-hf REPO:TAG`` loads
    that tag's variant and takes the sidecar as its draft; no tag takes Q8_0 (llama.cpp tries
    Q4_K_M, then Q8_0; no shipped tag is a bare Q4_K_M)."""
    model = model_name("builtin:tiny-qwen35moe", tiny_mtp_model)
    where = {t: (f"{variant_folder(t)}/" if layout == "folders" else "") + variant_file_name(model, t)
             for t in TAGS.values()}
    sidecar = sidecar_file_name(model, "Q8_0")
    snapshot = _hub_cache(tmp_path / "cache", [*where.values(), sidecar, f"{model}-BF16.gguf"], tiny_mtp_model)
    # each file's label as the Hub shows it (#50: huggingface.js parseGGUFQuantLabel), typed into -hf
    labels = {hub_label(path): path for path in where.values()}
    assert None not in labels and len(labels) == len(where)
    for label in [*labels, None]:
        got_model, got_draft = _resolved(tmp_path / "cache", label, tiny_mtp_model)
        assert got_model == str(snapshot / (labels[label] if label else where["Q8_0"])), label
        assert got_draft == str(snapshot / sidecar), label
