"""``ggufmtp ladder`` (issue #33): three recipes of a builtin model on a two-worker local Dask
cluster, the shared imatrix computed once, one card rendered from the variants' audited receipts,
resumable per variant, and the whole ladder uploaded in one commit through the publish gate."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from fakehub import FakeHub, isolate_hf_client

from ggufmtp.cli import main
from ggufmtp.errors import AuditError, LadderError, SearchError
from ggufmtp.fmt import divergence
from ggufmtp.hub.upload import UploadOptions
from ggufmtp.ladder.engine import DaskEngine, task_result
from ggufmtp.ladder.publish import upload_ladder
from ggufmtp.ladder.run import run_ladder
from ggufmtp.ladder.spec import LadderSpec, load_ladder_file
from ggufmtp.measure.core.options import VerifyOptions
from ggufmtp.provenance.audit import audit
from ggufmtp.provenance.receipt import read_receipt
from ggufmtp.quality.options import EvalOptions

MODEL = "builtin:tiny-qwen35moe-f20"
RECIPES = ("q8_0-mtp", "q4_k_m-mtp-q8", "iq4_xs-mtp")
VERIFY = {"seeds": (42,), "limit": 3, "max_tokens": 24, "threads": 1}
EVAL = {"corpus": "builtin:calib-v1", "chunks": 2, "ctx_size": 128, "threads": 1}
TOKEN = "hf_ladderTOKEN"


def _spec(out: Path, recipes=RECIPES, **kw) -> LadderSpec:
    return LadderSpec(model=MODEL, recipes=tuple(recipes), out_dir=out, imatrix_corpus="builtin:calib-v1",
                      imatrix_chunks=2, threads=1, verify_options=VerifyOptions.from_dict(VERIFY), eval_options=EvalOptions(**EVAL), **kw)


@pytest.fixture(scope="module")
def ladder(llama_server_bin, tmp_path_factory):
    out = tmp_path_factory.mktemp("ladder")
    res = run_ladder(_spec(out), DaskEngine(workers=2), progress=False)
    return out, res


def test_three_variants_on_two_workers_one_card_from_the_receipts(ladder):
    out, res = ladder
    assert res.ok and res.engine == {"engine": "dask", "address": "local", "workers": 2, "gpus": 0}
    assert [o.recipe for o in res.outcomes] == list(RECIPES) and sorted(res.finished_order) == sorted(RECIPES)
    assert res.imatrix is not None and Path(res.imatrix).parent == out  # computed once, shared
    card = (out / "README.md").read_text()
    rows = [line for line in card.splitlines() if line.startswith("| [")]  # a published file's row links it
    assert len(rows) == 3 and card.startswith("---") and "\n# tiny-qwen35moe-f20 MTP GGUF\n" in card
    for o in res.outcomes:
        art, rc = Path(o.summary["artifact"]), Path(o.summary["receipt"])
        assert art.parent == out / o.variant and audit(art, rc).ok  # the release names: <TAG>/<Model>-<TAG>.gguf
        assert art.name == f"tiny-qwen35moe-f20-{o.variant}.gguf"
        st = read_receipt(rc).statement
        assert st["predicate"]["imatrix"]["sha256"]  # the shared imatrix, bound in every receipt
        v, q = st["predicate"]["verification"], st["predicate"]["quality"]
        row = " ".join(r for r in card.splitlines() if r.startswith("| ") and art.name in r)  # its row of each table
        acc = f"{100 * v['mtp']['acceptance']:.1f}%"
        assert acc in row and divergence(q['kld_mean']) in row and f"| {o.variant} |" in row, row
        assert f"llama-server -hf OWNER/REPO:{o.variant}" in card or f"`:{o.variant}`" in card  # its tag resolves it
    assert len({read_receipt(Path(o.summary['receipt'])).statement["predicate"]["imatrix"]["sha256"]
                for o in res.outcomes}) == 1


def test_the_ladder_json_times_every_task_stage_and_phase(ladder):
    """#41 item 7: where a ladder's wall time went (benchmarks/ladder_bound.py reads these): each
    variant's build and measure task (start, wall and CPU seconds), each stage inside them, and the
    ladder's own phases around the variants."""
    _, res = ladder
    d = res.to_dict()
    assert list(d["phases"]) == ["imatrix", "variants", "card"] and d["cpus"] and d["threads"] == 1
    assert sum(d["phases"].values()) <= d["seconds"] + 0.01
    for v in d["variants"]:
        build, measure = v["tasks"]["build"], v["tasks"]["measure"]
        assert build["seconds"] > 0 and measure["seconds"] > 0 and build["cpu_seconds"] > 0
        assert measure["start"] >= build["start"] + build["seconds"] - 0.01  # measure waits for its build
        times = v["summary"]["stage_seconds"]
        assert list(times) == list(v["summary"]["stages"]) and times["verify"] > 0
        assert times["quantize"] < 1  # the measure task's quantize is its build's, from the stage cache
        assert sum(times.values()) <= measure["seconds"]


def test_a_rerun_resumes_every_variant_and_a_failed_one_does_not_stop_the_others(ladder):
    """In sequence this time: the three made variants come from their stage caches (nothing
    quantized or verified again); a fourth whose folder cannot be made fails alone, named."""
    out, res = ladder
    (out / "Q4_K_M_HiFi").write_text("a file where the variant's folder goes")
    try:
        again = run_ladder(dataclasses.replace(_spec(out), recipes=(*RECIPES, "hifi-q4_k_m-mtp")), progress=False)
    finally:
        (out / "Q4_K_M_HiFi").unlink()
    assert not again.ok and again.engine["engine"] == "sequential"
    failed = [o for o in again.outcomes if not o.ok]
    assert [o.recipe for o in failed] == ["hifi-q4_k_m-mtp"] and "Q4_K_M_HiFi" in (failed[0].error or "")
    for o in again.outcomes[:3]:
        assert o.ok and set(o.summary["stages"].values()) == {"cached"}, o.summary["stages"]
    assert len([r for r in (out / "README.md").read_text().splitlines() if r.startswith("| [")]) == 3
    with pytest.raises(LadderError, match="hifi-q4_k_m-mtp"):
        upload_ladder(again, "me/ladder", UploadOptions(dry_run=True))


def test_ladder_upload_with_a_failed_variant_names_it_exits_1_and_sends_nothing(ladder, tmp_path):
    """``ladder --upload`` when a variant failed: the upload is refused with an error naming the
    variant, its folder and why, and the command exits 1 (it used to skip the upload silently)."""
    out, _ = ladder
    f = tmp_path / "ladder.toml"
    f.write_text(f'model = "{MODEL}"\nimatrix_corpus = "builtin:calib-v1"\nimatrix_chunks = 2\nthreads = 1\n'
                 '[verify]\nseeds = [42]\nlimit = 3\nmax_tokens = 24\nthreads = 1\n'
                 '[eval]\ncorpus = "builtin:calib-v1"\nchunks = 2\nctx_size = 128\nthreads = 1\n')
    (out / "Q4_K_M_HiFi").write_text("a file where the variant's folder goes")
    try:
        r = CliRunner().invoke(main, ["ladder", "--ladder", str(f), *(a for x in (*RECIPES, "hifi-q4_k_m-mtp")
                                                                      for a in ("-r", x)),
                                      "-o", str(out), "--upload", "me/ladder", "--dry-run-upload"])
    finally:
        (out / "Q4_K_M_HiFi").unlink()
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert "error: not uploaded to me/ladder: the ladder has variants that failed (hifi-q4_k_m-mtp in Q4_K_M_HiFi/" in r.stderr


def test_a_receipt_edited_after_the_ladder_keeps_the_card_from_being_written(ladder, tmp_path):
    from ggufmtp.provenance.ladder_card import make_ladder_card

    out, res = ladder
    arts = res.variants()
    art, rc = arts[0]
    edited = tmp_path / rc.name
    edited.write_text(rc.read_text().replace('"pass"', '"fail"', 1))
    with pytest.raises(AuditError, match=re.escape(art.name)):
        make_ladder_card([(art, edited), *arts[1:]], tmp_path / "README.md", "x")
    assert not (tmp_path / "README.md").exists()


def test_the_ladder_goes_up_in_one_commit_through_the_gate(ladder, tmp_path, monkeypatch):
    out, res = ladder
    isolate_hf_client(tmp_path / "hf_home", monkeypatch)
    monkeypatch.delenv("GGUFMTP_PUBLIC_KEY", raising=False)
    with FakeHub(tokens=(TOKEN,)) as fake:
        # the tiny verifications measure less than a publishable verdict needs: the gate says so
        from ggufmtp.errors import HubRefusedError

        with pytest.raises(HubRefusedError):
            upload_ladder(res, "me/ladder", UploadOptions(token=TOKEN, endpoint=fake.url), progress=False)
        assert not fake.requests_to("POST", r"^/api/repos/create$")
        up = upload_ladder(res, "me/ladder", UploadOptions(token=TOKEN, endpoint=fake.url, allow_unverified=True),
                           progress=False)
        commit = fake.history("me/ladder")[0]
        names = {Path(o.summary[k]).name for o in res.outcomes for k in ("artifact", "receipt")}
        assert commit.oid == up.commit_sha and set(commit.files) == names | {"README.md", ".gitattributes"}
        assert len(fake.requests_to("POST", r"/commit/main$")) == 1
        assert fake.file("me/ladder", "README.md") == (out / "README.md").read_bytes()
        assert b"llama-server -hf me/ladder:" in fake.file("me/ladder", "README.md")  # the card names its repo


def test_ladder_upload_takes_upload_s_hub_options(ladder, tmp_path, monkeypatch):
    """#41 item 6: ``ladder --upload`` publishes with ``upload``'s options (the branch as
    --upload-revision, since --revision is the source model's; --commit-message, --path-in-repo,
    --create-pr), in one commit; the variants were made already, so nothing is remade."""
    out, res = ladder
    isolate_hf_client(tmp_path / "hf_home", monkeypatch)
    monkeypatch.delenv("GGUFMTP_PUBLIC_KEY", raising=False)
    f = tmp_path / "ladder.toml"
    f.write_text(f'model = "{MODEL}"\nrecipes = {json.dumps(list(RECIPES))}\nimatrix_corpus = "builtin:calib-v1"\n'
                 'imatrix_chunks = 2\nthreads = 1\n[verify]\nseeds = [42]\nlimit = 3\nmax_tokens = 24\nthreads = 1\n'
                 '[eval]\ncorpus = "builtin:calib-v1"\nchunks = 2\nctx_size = 128\nthreads = 1\n')
    argv = ["ladder", "--ladder", str(f), "-o", str(out), "--upload", "me/rel", "--allow-unverified", "--json"]
    with FakeHub(tokens=(TOKEN,)) as fake:
        env = {"HF_ENDPOINT": fake.url, "HF_TOKEN": TOKEN}
        r = CliRunner().invoke(main, [*argv, "--upload-revision", "v1", "--commit-message", "Release 1",
                                      "--path-in-repo", "gguf"], env=env)
        assert r.exit_code == 0, r.output
        d = json.loads(r.output[r.output.index("{"):])
        assert all(set(v["summary"]["stages"].values()) == {"cached"} for v in d["variants"])
        commit = fake.history("me/rel", "v1")[0]
        assert commit.message == "Release 1" and len(fake.requests_to("POST", r"/commit/v1$")) == 1
        arts = {Path(o.summary["artifact"]).name for o in res.outcomes}
        assert {f"gguf/{a}" for a in arts} <= set(commit.files) and "README.md" in commit.files
        # a PR against main (v1's root beside its gguf/ would give each tag two files: -hf takes the first listed)
        r = CliRunner().invoke(main, [*argv, "--create-pr"], env=env)
        assert r.exit_code == 0, r.output
        pr = fake.history("me/rel", "refs/pr/1")[0]
        assert pr.message.startswith("ggufmtp ladder: ") and {a for a in arts} <= set(pr.files)


def test_the_ladder_file_and_the_cli(ladder, tmp_path):
    out, _ = ladder
    f = tmp_path / "ladder.toml"
    f.write_text(f'model = "{MODEL}"\nrecipes = {json.dumps(list(RECIPES))}\nimatrix_corpus = "builtin:calib-v1"\n'
                 'imatrix_chunks = 2\nthreads = 1\n[verify]\nseeds = [42]\nlimit = 3\nmax_tokens = 24\nthreads = 1\n'
                 '[eval]\ncorpus = "builtin:calib-v1"\nchunks = 2\nctx_size = 128\nthreads = 1\n')
    fields = load_ladder_file(f)
    assert fields["verify_options"] == VerifyOptions.from_dict(VERIFY) and fields["eval_options"] == EvalOptions(**EVAL)
    r = CliRunner().invoke(main, ["ladder", "--ladder", str(f), "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output[r.output.index("{"):])
    assert d["ok"] and [v["recipe"] for v in d["variants"]] == list(RECIPES)
    assert [v["variant"] for v in d["variants"]] == ["Q8_0", "Q4_K_M_FullHead", "IQ4_XS"]
    assert all(set(v["summary"]["stages"].values()) == {"cached"} for v in d["variants"])
    for bad, said in (("recipes = 3\n", "recipes must be an array of strings"), ("colour = 1\n", "unknown keys colour"),
                      ("[verify]\nspeed = 1\n", "unknown keys speed"), ("model = \n", "not a TOML ladder file")):
        f.write_text(bad)
        r = CliRunner().invoke(main, ["ladder", "--ladder", str(f), "-o", str(tmp_path / "x")])
        assert r.exit_code == 1 and said in r.output and str(f) in r.output, r.output
    r = CliRunner().invoke(main, ["ladder", "-m", MODEL, "-r", "q8_0-mtp", "-r", "q8_0-mtp", "-o", str(tmp_path / "y")])
    assert r.exit_code == 1 and "given twice" in r.output
    for args, said in ((["-m", MODEL], "at least one recipe"), (["-r", "q8_0-mtp"], "no model")):
        r = CliRunner().invoke(main, ["ladder", *args, "-o", str(tmp_path / "z")])
        assert r.exit_code == 1 and said in r.output and "Traceback" not in r.output, r.output


def test_bad_values_in_a_ladder_file_name_the_file_and_the_table(tmp_path):
    """The ``[verify]`` and ``[eval]`` tables become options objects when the file is read: a bad
    value is refused then, naming the file and the table, before any variant starts."""
    f = tmp_path / "ladder.toml"
    for body, said in (("[verify]\nseeds = [42, 42]\n", "[verify] seeds [42, 42]: duplicates"),
                       ("[eval]\nchunks = 0\n", "[eval] chunks 0: must be an integer of at least 1"),
                       ("[eval]\nctx_size = 8\n", "[eval] ctx_size 8: must be an integer of at least 16")):
        f.write_text(f'model = "{MODEL}"\nrecipes = ["q8_0-mtp"]\n' + body)
        with pytest.raises(LadderError, match=re.escape(f"{f}: {said}")):
            load_ladder_file(f)


def test_a_searched_recipe_is_a_ladder_rung_like_a_shipped_one(llama_server_bin, tmp_path):
    """#43: a recipe `ggufmtp search` wrote (its [search] table included) is one of a ladder's recipes:
    planned, quantized, verified and carded beside a shipped one, its file named by its release tag
    (``<FTYPE>_Searched``) and its receipt binding the recipe file by sha256. The allocation is designed on
    the model's real groups (half of them at Q8_0, half at Q4_0), so no search runs here."""
    from ggufmtp.quant.recipe import Recipe
    from ggufmtp.refs import local_model_arg
    from ggufmtp.search.allocate import allocate
    from ggufmtp.search.found import allocation_recipe, search_toml
    from ggufmtp.search.groups import candidates, groups_of
    from ggufmtp.search.records import Budget, Cost, SensitivityTable

    model = Path(local_model_arg(MODEL))
    groups = groups_of(model, 2)
    cands = candidates(model, groups, ("Q8_0", "Q4_0"))
    # every group costs 0.01 at Q4_0 over Q8_0's 0.001: under the midway budget the allocator keeps
    # the largest groups at Q8_0 until the bytes run out, so both types appear
    costs = tuple(Cost(c, 0.001 if c.qtype == "Q8_0" else 0.011, (0.0, 0.02), (0.001,) * 2) for c in cands)
    table = SensitivityTable("ab" * 32, "builtin:calib-v1", "Q8_0", 0.001, (0.001,) * 2, groups, costs)
    lo = sum(c.n_bytes for c in cands if c.qtype == "Q4_0")
    hi = sum(c.n_bytes for c in cands if c.qtype == "Q8_0")
    alloc = allocate(table, Budget(n_bytes=(lo + hi) // 2))
    assert {t for _, t in alloc.types} == {"Q8_0", "Q4_0"}
    found = tmp_path / "searched.toml"
    found.write_text(search_toml(allocation_recipe(table, alloc, Recipe.load("Q8_0")), table, alloc))
    out = tmp_path / "ladder"
    res = run_ladder(_spec(out, recipes=("q8_0-mtp", str(found))), progress=False)
    assert res.ok, [o.error for o in res.outcomes]
    tag = Recipe.load(found).release_tag
    searched = next(o for o in res.outcomes if o.recipe == str(found))
    art, rc = Path(searched.summary["artifact"]), Path(searched.summary["receipt"])
    assert art.name == f"tiny-qwen35moe-f20-{tag}.gguf" and audit(art, rc).ok
    p = read_receipt(rc).statement["predicate"]
    assert p["recipe"]["file"] == "searched.toml" and p["recipe"]["sha256"] == Recipe.load(found).sha256
    allocated = dict(alloc.types)  # every tensor of every group at its allocated type, as written
    assert {t: p["result"]["tensor_types"][t] for g in groups for t in g.tensors} == {
        t: allocated[g.name] for g in groups for t in g.tensors}
    card = (out / "README.md").read_text()
    assert f"| [{art.name}]" in card and f"| {tag} |" in card and "tiny-qwen35moe-f20-q8_0-mtp" not in card


def _abort_like_llama_cpp() -> None:
    os.abort()  # what GGML_ASSERT does to the process that loaded libllama


@pytest.mark.runtime  # starts a Dask cluster whose worker aborts: >1 s
def test_a_task_whose_worker_dies_is_one_error_naming_it_not_a_dask_traceback():
    """The gpu-small search (2026-11-29): token_embd at IQ2_XXS aborted llama.cpp inside a Dask worker
    on every try, and the CLI printed distributed's KilledWorker traceback. ``task_result`` turns it
    into the command's own error, naming the task."""
    distributed = pytest.importorskip("distributed", reason="the ladder extra (pip install 'ggufmtp[ladder]')")
    import dask

    with dask.config.set({"distributed.scheduler.allowed-failures": 0}), \
            distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None,
                                     silence_logs=50) as cluster, distributed.Client(cluster) as client:
        fut = client.submit(_abort_like_llama_cpp, pure=False)
        with pytest.raises(SearchError, match=r"^tiny: measuring token_embd at IQ2_XXS: its worker process died"):
            task_result(fut, "tiny: measuring token_embd at IQ2_XXS", SearchError)
        assert task_result(client.submit(sum, [1, 2]), "a sum") == 3  # the cluster goes on
