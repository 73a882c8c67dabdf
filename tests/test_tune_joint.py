"""The joint search of the fastest verified configuration (issue #52, items 1 and 2): the head's
tensor type x the draft window x the server options, each head kept only while verify's head
finding against the source says ``preserved`` and the output is lossless, each server option given
to both arms and kept only while it leaves the output as the default vanilla writes it.

On main fedf5a8 none of this existed: ``TuneConfig`` had no server options or head, tune had no head
dimension and no check of an option against the default vanilla (an option given to both arms that
changes the text went unseen: both arms wrote the same changed text), and there was no
``ggufmtp tune-joint``. Speed numbers on CPU mean nothing: these tests assert structure and
exclusions, never a speed ordering.
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
from click.testing import CliRunner
from gguf import GGUFReader

from ggufmtp.cli import main
from ggufmtp.errors import TuneError
from ggufmtp.measure.core.options import ArmArgs, ServerOptions, TuneConfig
from ggufmtp.measure.tune.options import SearchOptions, TuneOptions
from ggufmtp.search import joint, joint_heads
from ggufmtp.search.joint import JointOptions, OptionSpace

SOURCE = "builtin:tiny-qwen35moe"
RECIPE = "hifi-q4_k_m-mtp"  # the lead's recipe: eh_proj Q8_0, the rest of the head at the Q4_K_M mix


# ----------------------------------------------------------------------------- fast: the options as flags


def test_server_options_go_to_both_arms_and_a_quantized_v_cache_needs_flash_attention():
    """Flash attention, KV types, batch sizes and an option set are non-speculative: the fair
    vanilla gets them too; a configuration's key names each; the head type is not a flag."""
    cfg = TuneConfig(3, flash_attn=True, cache_type="q8_0", batch=2048, ubatch=512, server_args=["--mlock"],
                     head="Q6_K")
    assert cfg.shared_args() == ["-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0", "-b", "2048", "-ub", "512", "--mlock"]
    arms = ArmArgs(tuned=cfg)
    van = arms.vanilla_fields({"extra_args": []})["extra_args"]
    mtp = arms.mtp_fields({"extra_args": []}, 3)["extra_args"]
    assert van == cfg.shared_args() and mtp[:len(van)] == van
    off = TuneConfig(3, flash_attn=False, backend_sampling=True)  # a value equal to another flag's ("--fit off")
    assert off.vanilla_fields({"extra_args": ["--fit", "off", "-bs"]})["extra_args"] == ["--fit", "off", "-bs", "-fa", "off"]
    assert cfg.key == "k=3 nmin=0 pmin=0 np=1 fa=on kv=q8_0 b=2048 ub=512 args='--mlock' head=Q6_K"
    assert cfg.sets_server_options and cfg.tunes_the_server and not TuneConfig(3).sets_server_options
    assert TuneConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg  # the JSON --tuned-from reads
    with pytest.raises(TuneError, match="flash attention"):
        TuneConfig(3, flash_attn=False, cache_type="q8_0")
    with pytest.raises(TuneError, match="speculative"):
        TuneConfig(3, server_args=("--spec-draft-n-max", "5"))
    space = OptionSpace(flash_attn=(None, False), cache_types=(None, "q8_0"), batches=(None, (512, 128)))
    got = space.configs(TuneConfig(2))
    assert len(got) == 6 and not any(c.flash_attn is False and c.cache_type == "q8_0" for c in got)


# ----------------------------------------------------------------------------- runtime: the search


def _zero_tensor(path, name: str) -> None:
    """Every byte of tensor ``name`` set to 0 in place (a Q8_0/Q4_K block of zeros decodes to zeros)."""
    r = GGUFReader(path, "r+")
    t = next(t for t in r.tensors if t.name == name)
    t.data[...] = 0
    r.data.flush()


@pytest.fixture(scope="module")
def artifact(tmp_path_factory, llama_runtime):
    """The tiny source at hifi-q4_k_m-mtp, with its receipt (naming the source)."""
    import ggufmtp

    d = tmp_path_factory.mktemp("joint")
    q = ggufmtp.quantize(SOURCE, RECIPE, d / "tiny-Q4_K_M_HiFi.gguf", progress=False)
    ggufmtp.write_receipt(q)
    return q.output


def _first_token(model, mode_index: int = 0) -> int:
    """The first token vanilla writes to the suite's first prompt (the thinking mode tune uses)."""
    from ggufmtp.measure.core.suite import load_suite, modes_for_template
    from ggufmtp.measure.verify.divergence import prompt_ids
    from ggufmtp.runtime.server import LlamaServer, ServerConfig

    with LlamaServer(ServerConfig(model=model, threads=2, ctx_size=2048)) as srv:
        mode = modes_for_template(srv.props().get("chat_template"))[mode_index]
        r = srv.complete(prompt_ids(srv, load_suite().prompts[0], mode, "chat"), n_predict=4, temperature=0.0,
                         seed=42, cache_prompt=False, return_tokens=True)
    return int(r["tokens"][0])


@pytest.fixture(scope="module")
def searched(artifact, tmp_path_factory, llama_server_bin):
    """A joint search with a tiny budget: Q8_0 and a Q4_K head whose eh_proj is destroyed (all zeros:
    the head then drafts without the trunk's state), k=2, and one option set that forbids the first
    token vanilla writes (``--logit-bias TOKEN-inf``: at temperature 0 the reply must change)."""
    from ggufmtp.refs import local_model_arg

    d = tmp_path_factory.mktemp("joint-heads")
    real = joint_heads.make_head

    def make_head(source, recipe, head_type):
        if head_type == "Q6_K":  # not a head at all: the whole artifact (verify refuses it as a sidecar)
            return artifact
        path = real(source, recipe, head_type)
        if head_type != "Q4_K":
            return path
        broken = d / f"broken-{path.name}"
        shutil.copyfile(path, broken)
        _zero_tensor(broken, "blk.4.nextn.eh_proj.weight")
        return broken

    bias = ("--logit-bias", f"{_first_token(artifact)}-inf")
    o = JointOptions(head_types=("Q8_0", "Q4_K", "Q6_K"), own_head=False, head_k=2, head_limit=4, head_seeds=(42,),
                     options=OptionSpace(option_sets=(bias,)),
                     tune=TuneOptions(budget=8, limit=2, max_tokens=32, seeds=(42,), server=ServerOptions(threads=2),
                                      search=SearchOptions(n_max_values=(2,), n_min_values=(0,), p_min_values=(0.0,)),
                                      bootstrap_resamples=200))
    mp = pytest.MonkeyPatch()
    mp.setattr(joint_heads, "make_head", make_head)
    try:
        res = joint.joint_search(artifact, local_model_arg(SOURCE), RECIPE, o)
    finally:
        mp.undo()
    return res, bias


@pytest.mark.runtime
def test_a_destroyed_head_is_excluded_by_its_head_finding(searched):
    """The Q4_K head with its eh_proj zeroed still writes lossless output (speculation is lossless
    whatever the head drafts), so only the head finding against the source can exclude it: it is
    not 'preserved', and it never reaches the joint stage; the Q8_0 head is preserved and kept. A
    "head" verify cannot serve (Q6_K here: the whole artifact) leaves with its error, the search goes on."""
    res, _ = searched
    rows = {h.head: h for h in res.heads.rows}
    assert set(rows) == {"Q8_0", "Q4_K", "Q6_K"}
    good, bad, broken = rows["Q8_0"], rows["Q4_K"], rows["Q6_K"]
    assert broken.decision == "failed" and not broken.kept and "not an MTP-only sidecar" in broken.why, broken
    assert good.kept and good.decision == "preserved" and good.lossless and good.why is None
    assert not bad.kept and bad.decision != "preserved" and bad.lossless, bad
    assert bad.why.startswith(f"head finding {bad.decision} against")
    assert bad.acceptance < good.acceptance - 0.3  # designed: a zeroed eh_proj cannot draft the trunk's tokens
    assert {r.key.split("head=")[-1] for r in res.tuned.rows} == {"Q8_0"}
    assert any("head Q4_K left out" in n for n in res.notes)


@pytest.mark.runtime
def test_an_option_that_changes_the_output_is_excluded(searched):
    """The option set is given to both arms, so MTP and its fair vanilla write the same (changed)
    text; the search drops it because that vanilla's text differs from the default vanilla's."""
    res, bias = searched
    rows = {r.key: r for r in res.tuned.rows}
    lossy = next(r for k, r in rows.items() if "args=" in k)
    plain = next(r for k, r in rows.items() if "args=" not in k)
    assert lossy.status == "dropped" and "change the output" in lossy.reason, lossy.reason
    assert plain.status == "final" and plain.identical
    assert res.config == TuneConfig(2, head="Q8_0") and bias[0] not in res.tuned.mtp_command


@pytest.fixture(scope="module")
def joint_artifact(searched, tmp_path_factory):
    """The source quantized with the search's recipe (--recipe-out), beside the search's JSON (-o)."""
    import ggufmtp

    res, _ = searched
    d = tmp_path_factory.mktemp("joint-artifact")
    recipe = d / "joint.toml"
    recipe.write_text(res.recipe.to_toml())
    out = d / "joint.json"
    out.write_text(json.dumps(res.to_dict()))
    q = ggufmtp.quantize(SOURCE, str(recipe), d / "tiny-joint.gguf", progress=False)
    ggufmtp.write_receipt(q)
    return recipe, out, q.output


@pytest.mark.runtime
def test_verify_tuned_from_reproduces_the_recipe_and_profile(searched, joint_artifact, tmp_path):
    """The result's recipe (the base recipe with every [mtp] role at Q8_0) quantizes a new artifact
    whose head is Q8_0; ``verify --tuned-from`` the result's JSON serves it with the profile's
    flags, drafts and is lossless, at the acceptance the search measured on the same prompts."""
    res, _ = searched
    assert dict(res.recipe.mtp_roles) == dict.fromkeys(("eh_proj", "attention", "routed_experts", "shared_expert",
                                                       "rest"), "Q8_0")
    recipe, out, art = joint_artifact
    head = {t.name: t.tensor_type.name for t in GGUFReader(art).tensors if t.name.startswith("blk.4.")
            and len(t.shape) > 1 and "gate_inp" not in t.name}
    assert head and set(head.values()) == {"Q8_0"}, head
    r = CliRunner().invoke(main, ["verify", str(art), "--tuned-from", str(out), "--limit", "2", "--seeds", "42",
                                  "--max-tokens", "32", "--threads", "2", "--receipt", f"{art}.receipt.json", "-r", str(recipe),
                                  "--json"])
    assert r.exit_code == 0, r.output
    v = json.loads(r.output)
    m = v["mtp"]
    assert m["draft_n_max"] == 2 and v["identical_outputs"]["identical"] == v["identical_outputs"]["pairs"] > 0
    args = m["server_args"]
    assert args[args.index("--spec-draft-n-max") + 1] == "2" and "--logit-bias" not in args
    row = next(r for r in res.tuned.rows if r.key == res.config.key)
    assert m["acceptance"] == pytest.approx(row.acceptance, abs=0.05)  # wide margins: the same drafts
    card = tmp_path / "card.md"
    r = CliRunner().invoke(main, ["card", str(art), "-o", str(card)])
    assert r.exit_code == 0, r.output
    assert "MTP arm run with the tuned flags `--spec-draft-n-max 2 --spec-draft-n-min 0" in card.read_text()


@pytest.mark.runtime
def test_the_joint_result_calls_itself_tune_joint_and_names_its_head(searched):
    """On main ec4d486 the joint search's text began ``ggufmtp tune MODEL`` and its JSON (what a
    receipt stores as ``tuned.kind``) said "ggufmtp tune"."""
    res, _ = searched
    assert res.to_dict()["kind"] == "ggufmtp tune-joint" and res.tuned.kind == "ggufmtp tune-joint"
    header = next(ln for ln in res.text().splitlines() if ln.startswith("ggufmtp tune"))
    assert header.startswith("ggufmtp tune-joint tiny-Q4_K_M_HiFi.gguf  (head Q8_0; concurrency 1;"), header


@pytest.mark.runtime
def test_verify_tuned_from_records_the_profile_as_served_and_the_card_recommends_it(joint_artifact):
    """The how-to's flow (tune-joint -> quantize -> verify --tuned-from --receipt -> card): on main
    ec4d486 the receipt had no ``verification.tuned`` and the card no "Recommended server settings".
    Now the receipt holds the profile as this file is served (its name, the head built in: no
    sidecar), with the search's kind, the JSON's sha256 and this verification's figures; the audit
    binds it to the verification, the card shows its command, and a later plain verify drops it."""
    from ggufmtp.files.hashing import sha256_file
    from ggufmtp.provenance.receipt import read_receipt

    recipe, out, art = joint_artifact
    receipt = f"{art}.receipt.json"
    base = ["--limit", "2", "--seeds", "42", "--max-tokens", "32", "--threads", "2", "--receipt", receipt, "-r", str(recipe)]
    r = CliRunner().invoke(main, ["verify", str(art), "--tuned-from", str(out), *base])
    assert r.exit_code == 0, r.output
    v = read_receipt(receipt).verification
    t = v["tuned"]
    assert t["kind"] == "ggufmtp tune-joint" and t["profile"] == {
        "name": "joint.json", "sha256": sha256_file(out), "search_recommended": t["profile"]["search_recommended"]}
    assert t["mtp_command"] == "llama-server --model tiny-joint.gguf " + " ".join(v["mtp"]["server_args"])
    assert "--spec-draft-n-max 2" in t["mtp_command"]
    assert not any(f in t["mtp_command"] for f in ("--spec-draft-model", "-md ", "mtp-Q8_0-", str(art.parent)))
    assert t["command"] == (t["mtp_command"] if t["mtp_beats_vanilla"] else t["vanilla_command"])
    assert (t["speedup"], t["speedup_ci95"]) == (v["speedup"], v["speedup_ci95"])  # this run's, not the search's
    assert t["best"] == v["settings"]["mtp_config"]["key"] == "k=2 nmin=0 pmin=0 np=1 head=Q8_0"
    audit = CliRunner().invoke(main, ["audit", str(art)])
    assert audit.exit_code == 0 and "recommended settings are this verification's" in audit.output, audit.output
    card = CliRunner().invoke(main, ["card", str(art), "-o", str(art.parent / "card.md")])
    assert card.exit_code == 0, card.output
    section = (art.parent / "card.md").read_text().split("## Recommended server settings\n", 1)[1].split("\n## ")[0]
    assert f"```sh\n{t['command']}\n```" in section and "`joint.json` (ggufmtp tune-joint" in section
    r = CliRunner().invoke(main, ["verify", str(art), *base])
    assert r.exit_code == 0, r.output
    assert read_receipt(receipt).verification["tuned"] is None  # the older run's recommendation is not carried


@pytest.mark.runtime
def test_dry_run_lists_the_candidates_and_the_evaluations(artifact):
    """``--dry-run`` makes no head and serves nothing: the heads, the candidates in search order (each
    head and each option value among the first), and the evaluations the budget allows, never more."""
    r = CliRunner().invoke(main, ["tune-joint", str(artifact), "--source", SOURCE, "-r", RECIPE, "--dry-run",
                                  "--budget", "40", "--kv-values", "default,q8_0", "--flash-attn-values", "auto,off",
                                  "--json"])
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output)
    assert plan["heads"] == ["own", "own-md", "F16", "BF16", "Q8_0", "Q6_K", "Q4_K"]
    assert 0 < plan["evaluations"] <= 40 and plan["searched"] == plan["rungs"][0][0] <= plan["n_candidates"]
    keys = plan["candidates"]
    assert len(keys) == len(set(keys)) == plan["n_candidates"]
    assert not any("fa=off" in k and "kv=q8_0" in k for k in keys)
    assert {k.split("head=")[1] for k in keys if "head=" in k} == {"F16"}  # the first two heads stand for the kept
    searched = keys[:plan["searched"]]  # anchors: every head and every option value within a small budget
    assert all(any(x in k for k in searched) for x in ("head=F16", "kv=q8_0", "fa=off")), searched
    bad = CliRunner().invoke(main, ["tune-joint", str(artifact), "--source", SOURCE, "-r", RECIPE, "--dry-run",
                                    "--batch-values", "2048"])
    assert bad.exit_code != 0 and "--batch-values '2048'" in bad.output and "Traceback" not in bad.output


@pytest.mark.runtime
def test_a_small_budget_measures_every_window_before_the_options(artifact):
    """Found on the H200 (2026-11-29): the dense shape's budget of 48 reached 8 candidates, all at
    k=4, because the options came before the window sweep; the window moves the speedup most. Now
    the windows next to the default come first, ahead of the heads and the option values."""
    r = CliRunner().invoke(main, ["tune-joint", str(artifact), "--source", SOURCE, "-r", RECIPE, "--dry-run",
                                  "--n-max-values", "3,4,5,6", "--head-k", "4", "--budget", "48",
                                  "--kv-values", "default,q8_0", "--flash-attn-values", "auto,off",
                                  "--batch-values", "default,2048:2048", "--json"])
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output)
    searched = plan["candidates"][:plan["searched"]]
    windows = [next(int(w[2:]) for w in k.split() if w.startswith("k=")) for k in searched]
    first_option = min(i for i, k in enumerate(searched) if any(x in k for x in ("kv=", "fa=", "b=", "head=")))
    assert set(windows[:first_option]) == {3, 4, 5}, searched


@pytest.mark.runtime
def test_the_profile_of_a_retyped_head_refuses_an_artifact_of_another_head(searched, artifact, tmp_path):
    """``verify --tuned-from`` the joint result on the artifact searched (its head: eh_proj Q8_0, the
    rest at the Q4_K_M mix) would measure another head than the profile was found with: one clear
    error naming a tensor and the way out, before any server starts; ``--heads-from`` likewise
    refuses a heads stage measured with another recipe."""
    res, _ = searched
    out = tmp_path / "joint.json"
    out.write_text(json.dumps(res.to_dict()))
    r = CliRunner().invoke(main, ["verify", str(artifact), "--tuned-from", str(out), "--limit", "1"])
    assert r.exit_code != 0 and "Traceback" not in r.output
    assert "found with every MTP tensor at Q8_0" in r.output and "blk.4." in r.output and "--recipe-out" in r.output
    r = CliRunner().invoke(main, ["tune-joint", str(artifact), "--source", SOURCE, "-r", "q8_0-mtp",
                                  "--heads-from", str(out)])
    assert r.exit_code != 0 and "Traceback" not in r.output
    assert "--heads-from: measured with the recipe hifi-q4_k_m-mtp, not q8_0-mtp" in r.output, r.output


@pytest.mark.runtime
def test_the_own_head_is_measured_built_in_and_as_a_sidecar(artifact, llama_server_bin):
    """The artifact's own head twice: built in (a candidate) and cut as a sidecar served with -md
    like every re-typed head (a measurement of what -md costs, never a candidate); the same head
    drafts the same tokens either way, and the markdown table says which row is which."""
    from ggufmtp.quant.recipe import Recipe
    from ggufmtp.refs import local_model_arg

    o = joint_heads.HeadSettings(head_types=(), own_head=True, k=2, limit=2, seeds=(42,), suite="chat-v1",
                                 max_tokens=32, server=ServerOptions(threads=2))
    stage = joint_heads.head_stage(artifact, local_model_arg(SOURCE), Recipe.load(RECIPE), o)
    own, md = stage.rows
    assert (own.head, own.file, own.kept) == ("own", None, True) and own.decision == "preserved"
    assert md.head == "own-md" and md.file == "mtp-reference.gguf" and not md.kept and "what -md costs" in md.why
    assert md.head_bytes == own.head_bytes and md.acceptance == pytest.approx(own.acceptance, abs=0.02)
    table = stage.markdown()
    assert "| own | " in table and "| own-md | " in table and "(-md cost)" in table
    assert stage.to_dict()["rows"][1]["kept"] is False and stage.recipe == RECIPE and stage.hardware == "CPU"


@pytest.mark.runtime
def test_bad_inputs_are_one_clear_error(artifact, tmp_path):
    """A missing source, an unknown head type, a bad option value: one error line naming it, exit
    status non-zero, nothing written."""
    out = tmp_path / "joint.json"
    cases = [(["--source", str(tmp_path / "missing.gguf")], "missing.gguf: no such file"),
             (["--source", SOURCE, "--head-types", "Q9_9"], "Q9_9"),
             (["--source", SOURCE, "--flash-attn-values", "sometimes"], "--flash-attn-values sometimes")]
    for args, says in cases:
        r = CliRunner().invoke(main, ["tune-joint", str(artifact), "-r", RECIPE, *args, "-o", str(out)])
        assert r.exit_code != 0 and says in r.output and "Traceback" not in r.output, r.output
        assert r.output.count("error:") == 1 and not out.exists()


@pytest.mark.runtime
def test_heads_from_skips_the_heads_stage_and_a_retyped_profile_stays_out_of_this_receipt(searched, artifact,
                                                                                           tmp_path):
    """``--heads-from`` the earlier result: no head is verified again (the rows are the file's), the
    joint stage runs on its kept head; the profile found drafts with a Q8_0 head the artifact does not
    have, so ``--receipt`` of this artifact is refused (one error, after -o and --recipe-out are written).
    The receipt holds a verification of its own (a copy of the artifact's, verified here): a receipt
    without one is refused before the search (``--receipt`` is checked first)."""
    res, _ = searched
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps(res.to_dict()))
    out, recipe, receipt = tmp_path / "joint.json", tmp_path / "joint.toml", str(tmp_path / "receipt.json")
    shutil.copyfile(f"{artifact}.receipt.json", receipt)
    v = CliRunner().invoke(main, ["verify", str(artifact), "--limit", "1", "--seeds", "42", "--max-tokens", "16",
                                  "--threads", "2", "--receipt", receipt])
    from ggufmtp.provenance.receipt import read_receipt

    assert read_receipt(receipt).verification, v.output  # written whatever the verdict
    before = open(receipt).read()
    r = CliRunner().invoke(main, ["tune-joint", str(artifact), "--source", SOURCE, "-r", RECIPE, "--heads-from",
                                  str(earlier), "--n-max-values", "2", "--p-min-values", "0", "--n-min-values", "0",
                                  "--budget", "4", "--limit", "2", "--max-tokens", "32", "--threads", "2",
                                  "-o", str(out), "--recipe-out", str(recipe), "--receipt", receipt])
    assert r.exit_code != 0 and r.output.count("error:") == 1 and "not written" in r.output, r.output
    assert open(receipt).read() == before
    d = json.loads(out.read_text())
    assert d["joint"]["heads_stage"] == res.heads.to_dict() and d["joint"]["head"] == "Q8_0"
    assert 'rest = "Q8_0"' in recipe.read_text()


@pytest.mark.runtime
def test_a_head_type_the_recipe_does_not_allow_or_that_cannot_be_made_leaves_with_the_reason(artifact):
    """A type below the recipe's ``[mtp] floor`` (Q4_K_M as a recipe: floor Q4_K) is not measured; a
    type llama.cpp cannot make without an imatrix (IQ1_S) leaves as failed; neither stops the stage
    and neither starts a server."""
    from ggufmtp.quant.recipe import Recipe
    from ggufmtp.refs import local_model_arg

    o = joint_heads.HeadSettings(head_types=("Q3_K",), own_head=False, k=2, limit=2, seeds=(42,), suite="chat-v1",
                                 max_tokens=32, server=ServerOptions(threads=2))
    floor = joint_heads.head_stage(artifact, local_model_arg(SOURCE), Recipe.load("Q4_K_M"), o).rows[0]
    assert (floor.decision, floor.kept) == ("not measured", False) and "[mtp] floor Q4_K" in floor.why
    o = dataclasses.replace(o, head_types=("IQ1_S",))
    failed = joint_heads.head_stage(artifact, local_model_arg(SOURCE), Recipe.load(RECIPE), o).rows[0]
    assert (failed.decision, failed.kept) == ("failed", False) and failed.why.startswith("cannot be made:"), failed
    assert "imatrix" in failed.why and "/" not in failed.why  # one line, no local path
