"""A mistyped flag value is one clear error, in every command alike (the hunt after ``ladder --seeds
1,x``'s traceback): a value the command reads itself is a usage error (exit status 2) naming the flag,
a value only a later reader can judge one ``error:`` line naming it (exit status 1); never a
traceback, never work started first, never a file written. One reading per kind of value
(``cli/app.py``'s ``_number_list``/``_word_list``, ``cli/options.py``'s types): the same bad value
gets the same words from every command that takes the flag.

Every case runs the real CLI in-process, with a model that does not exist wherever the value is
refused before the model is read: nothing starts llama.cpp here."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from ggufmtp.cli import main

TINY = "builtin:tiny-qwen35moe"


def _run(argv: list[str], tmp: Path) -> tuple[click.testing.Result, Path]:
    out = tmp / "out"
    argv = [str(out) if a == "OUT" else a for a in argv]
    r = CliRunner().invoke(main, argv, prog_name="ggufmtp")
    assert "Traceback" not in r.output and isinstance(r.exception, SystemExit | None), (argv, r.output)
    return r, out


def _refused(argv: list[str], tmp: Path, status: int, flag: str, said: str) -> str:
    """The one error line of ``argv``: exit ``status``, the line naming ``flag`` and ``said``, no output."""
    r, out = _run(argv, tmp)
    assert r.exit_code == status, (argv, r.exit_code, r.output)
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and flag in errors[0] and said in errors[0], (argv, r.stderr)
    assert not out.exists(), f"{argv}: wrote {out}"
    return errors[0]


# ------------------------------------------------------------------------------------------------
# numbers that are not numbers: click's FloatRange passes nan (every comparison with it is false)
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["profiles", "m.gguf", "--scale", "inf", "-o", "OUT"],  # was an OverflowError traceback
    ["profiles", "m.gguf", "--scale", "nan", "-o", "OUT"],  # was a ValueError traceback
    ["profiles", "m.gguf", "--noise", "nan", "-o", "OUT"],
    ["verify", "m.gguf", "--min-acceptance", "nan", "-o", "OUT"],  # was a run whose verdict compares with nan
    ["verify", "m.gguf", "--min-speedup", "1e999", "-o", "OUT"],
    ["verify", "m.gguf", "--head-margin", "nan", "-o", "OUT"],
    ["search", "m.gguf", "--budget", "4.5bpw", "--max-kld", "nan", "-o", "OUT"],
    ["curve", "m.gguf", "--rates", "0.5,nan", "-o", "OUT"],
    ["tune-joint", "m.gguf", "--source", "s.gguf", "-r", "q8_0-mtp", "--p-min-values", "0.5,inf", "-o", "OUT"],
], ids=lambda a: " ".join(a[:1] + a[-4:-2]))
def test_a_number_that_is_not_finite_is_refused_before_any_work(argv, tmp_path):
    flag = next(a for a in argv[2:] if a.startswith("--") and a not in ("--budget", "--source"))
    _refused(argv, tmp_path, 2, flag, "is not a finite number")


# ------------------------------------------------------------------------------------------------
# values a later reader met first: a traceback, or each variant failing after the shared stages
# ------------------------------------------------------------------------------------------------


LATER = [
    # shlex's ValueError escaped tune-joint (--server-arg's reading already caught it)
    (["tune-joint", "m.gguf", "--source", "s.gguf", "-r", "q8_0-mtp", "-o", "OUT", "--option", "'-b 8"], 2,
     "--option", "No closing quotation"),
    # PyTorch's RuntimeErrors, after the output folder was made
    (["train", "OUT", "--torch-threads", "-1"], 2, "--torch-threads", "x>=1"),
    (["train", "OUT", "--device", "bogus"], 2, "--device", "'bogus' is not one of 'cpu', 'cuda'"),
    (["train", "OUT", "--steps", "0"], 2, "--steps", "x>=1"),
    (["runtime", "build", "--jobs", "0"], 2, "--jobs", "x>=1"),
    # a recipe for an MTP block -1 was written
    (["recipe", "from-flags", "Q4_K_M", "-o", "OUT", "--mtp-block", "-1"], 2, "--mtp-block", "x>=0"),
    # llama-quantize's positional NTHREADS: click's parser read -1 as a flag ("No such option: -1")
    (["quantize", TINY, "OUT", "Q8_0", "-1"], 2, "NTHREADS", "-1 is not in the range x>=0"),
    (["quantize", TINY, "OUT", "Q8_0", "-1", "--dry-run"], 2, "NTHREADS", "-1 is not in the range x>=0"),
    # llama-quant writes an int override as u32: 5000000000 was written as 705032704
    (["quantize", TINY, "-r", "q8_0-mtp", "-o", "OUT", "--override-kv", "a.b=int:5000000000"], 1,
     "--override-kv 'a.b=int:5000000000'", "u32"),
    (["quantize", TINY, "-r", "q8_0-mtp", "-o", "OUT", "--override-kv", "a.b=float:1e39"], 1,
     "--override-kv 'a.b=float:1e39'", "f32"),
    # ladder read --imatrix per variant, after pulling and inspecting: every variant FAILED, the folder made
    (["ladder", "-m", TINY, "-r", "q8_0-mtp", "-o", "OUT", "--imatrix", "missing.dat"], 1, "missing.dat",
     "does not exist"),
    (["ladder", "-m", TINY, "-r", "q8_0-mtp", "-o", "OUT", "--imatrix", "."], 2, "--imatrix", "is a directory"),
    (["run", "-m", TINY, "-r", "q8_0-mtp", "-o", "OUT", "--imatrix", "missing.dat"], 1, "missing.dat",
     "does not exist"),
    # the eval corpus was read by the last stage: after quantizing (run), after every variant (ladder)
    (["run", "-m", TINY, "-r", "q8_0-mtp", "-o", "OUT", "--no-verify", "--eval", "."], 1, "corpus file .",
     "is a directory"),
    (["ladder", "-m", TINY, "-r", "q8_0-mtp", "-o", "OUT", "--no-verify", "--eval", "."], 1, "corpus file .",
     "is a directory"),
    (["ladder", "-m", TINY, "-r", "q8_0-mtp", "-o", "OUT", "--imatrix-corpus", "."], 1, "corpus file .",
     "is a directory"),  # refused, but after making the output folder
    # the upload's settings were read by the upload, after every variant (the whole run) was made
    (["ladder", "-m", TINY, "-r", "q8_0-mtp", "-o", "OUT", "--dry-run-upload", "--upload", "bad name"], 1,
     "'bad name' is not a valid Hub repo id", ""),
    (["ladder", "-m", TINY, "-r", "q8_0-mtp", "-o", "OUT", "--upload", "org/x", "--dry-run-upload",
      "--path-in-repo", "../x"], 1, "--path-in-repo '../x'", "relative path"),
    (["ladder", "-m", TINY, "-r", "q8_0-mtp", "-o", "OUT", "--upload", "org/x", "--dry-run-upload",
      "--upload-revision", "0" * 40], 1, "--revision '" + "0" * 40, "branch name"),
    (["run", "-m", TINY, "-r", "q8_0-mtp", "-o", "OUT", "--dry-run-upload", "--upload", "bad name"], 1,
     "'bad name' is not a valid Hub repo id", ""),
    (["search", "m.gguf", "-o", "OUT", "--budget", ""], 1, "budget ''", "a size"),  # was ".: is a directory"
    # a signed, nan, inf or overflowing amount was planned as a recipe: "-1MB: no such recipe file"
    *[(["search", TINY, "-o", "OUT", "--budget", b], 1, f"budget '{b}'", "bits per weight (e.g. 4.5bpw), positive "
       "and finite") for b in ("-1MB", "nanbpw", "1e999GB", "0MB", "0bpw")],
    # verify refuses a bad suite at once; these read it after their first stage: every head's verify failed
    # ("no head kept"), or after hours of KLD measurements
    (["tune-joint", TINY, "--source", TINY, "-r", "q8_0-mtp", "-o", "OUT", "--suite", "nosuch"], 1,
     "error: suite 'nosuch': not a file and not a shipped suite", ""),
    (["search", TINY, "--budget", "4.5bpw", "--acceptance", "-o", "OUT", "--suite", "nosuch"], 1,
     "error: suite 'nosuch': not a file and not a shipped suite", ""),
    # the card named a repo and a folder upload refuses
    (["card", "m.gguf", "-o", "OUT", "--repo", "bad name"], 1, "'bad name' is not a valid Hub repo id", ""),
    (["card", "m.gguf", "-o", "OUT", "--path-in-repo", "../x"], 1, "--path-in-repo '../x'", "relative path"),
]


@pytest.mark.parametrize(("argv", "status", "flag", "said"), LATER, ids=[" ".join(c[0][:1] + c[0][-2:]) for c in LATER])
def test_a_value_a_later_reader_met_first_is_one_error_before_any_work(argv, status, flag, said, tmp_path,
                                                                         monkeypatch):
    monkeypatch.chdir(tmp_path)  # missing.dat and "." are the case's own
    _refused(argv, tmp_path, status, flag, said)


def _heads_stage(**change: Any) -> dict[str, Any]:
    """A heads stage as benchmarks/head_type_speed.py writes it (one row), with ``change`` over its keys."""
    from ggufmtp.search.joint_heads import HeadRow, HeadStage

    row = HeadRow(head="Q8_0", k=3, file=None, head_bytes=2**20, decision="preserved", lossless=True, acceptance=0.5,
                  speedup=1.2, speedup_ci95=[1.1, 1.3], mtp_tokens_per_second=12.0, vanilla_tokens_per_second=10.0,
                  kept=True)
    stage = HeadStage(model="m.gguf", model_sha256="0" * 64, source="s.gguf", source_sha256=["1" * 64],
                      recipe="q8_0-mtp", k=3, hardware="CPU", rows=[row])
    return {**stage.to_dict(), **change}


_ROW = _heads_stage()["rows"][0]


@pytest.mark.parametrize(("doc", "said"), [
    ({}, "lacks model, model_sha256, source, source_sha256, recipe, k, hardware, rows"),  # was "'rows'"
    ({"rows": 5}, "lacks model, model_sha256"),  # was "'int' object is not iterable"
    ([], "an array, not an object"),  # was "'list' object is not a mapping"
    ({"joint": 3}, "lacks model"),  # was an AttributeError traceback
    (_heads_stage(rows=5), "rows must be an array of head rows, not an integer"),
    (_heads_stage(rows=[7]), "rows[0]: an integer, not an object"),  # was an AttributeError traceback
    (_heads_stage(rows=[{k: v for k, v in _ROW.items() if k != "kept"}]), "rows[0]: lacks kept"),
    (_heads_stage(rows=[{**_ROW, "head_bytes": "1 MiB"}]), "rows[0]: head_bytes must be an integer, not a string"),
    (_heads_stage(k="3"), "k must be an integer, not a string"),  # taken: a TuneError only at the model's check
], ids=["empty", "rows only", "array", "joint not an object", "rows not an array", "row not an object",
        "row lacks a field", "row field of another type", "field of another type"])
def test_tune_joint_heads_from_names_what_the_file_lacks(doc, said, tmp_path):
    """``--heads-from`` a JSON that is not a heads stage: one error naming the file and what it lacks
    or holds of another type (a raw key ``'rows'``, Python's TypeError words or a traceback before)."""
    heads = tmp_path / "heads.json"
    heads.write_text(json.dumps(doc))
    _refused(["tune-joint", TINY, "--source", TINY, "-r", "q8_0-mtp", "--heads-from", str(heads), *_O], tmp_path, 1,
             f"error: {heads}: not a heads stage (benchmarks/head_type_speed.py or tune-joint JSON): ", said)


@pytest.mark.parametrize("argv", [["ladder", "-m", TINY, "-r", "q8_0-mtp", "-o", "OUT", "--scheduler", "host"],
                                  ["search", "m.gguf", "--budget", "4.5bpw", "-o", "OUT", "--scheduler", "tcp://host:x"]],
                         ids=["ladder", "search"])
def test_a_scheduler_address_dask_cannot_read_is_one_error_before_any_work(argv, tmp_path):
    """distributed's ValueError ("missing port number") escaped when the engine connected, after the
    ladder's shared stages (the output folder made)."""
    pytest.importorskip("distributed", reason="the ladder extra (pip install 'ggufmtp[ladder]')")
    _refused(argv, tmp_path, 1, f"--scheduler '{argv[-1]}'", "a Dask scheduler's address, e.g. tcp://host:8786")


@pytest.mark.parametrize(("argv", "flag"), [
    (["run", "-m", TINY, "-r", "q8_0-mtp", "--no-verify", "-o", ""], "--output"),  # ran the pipeline into "."
    (["recipe", "from-flags", "Q4_K_M", "-o", ""], "--output"),  # printed the recipe instead: "" read as not given
    (["card", "m.gguf", "-o", ""], "--output"),
    (["audit", ""], "ARTIFACT"),  # a ValueError traceback (Path(".").with_name)
    (["upload", "org/x", "", "--receipt", "r.json", "--dry-run"], "ARTIFACTS"),  # the same traceback
    (["pull", "org/x", "--local-dir", ""], "--local-dir"),
    (["verify", ""], "MODEL"),  # "model .: no such file"
    (["quantize", "", "-r", "q8_0-mtp", "-o", "OUT"], "MODEL"),  # ".: is a directory, not a GGUF file"
    (["verify", "m.gguf", "--reference", ""], "--reference"),  # read as no reference at all
    (["run", "-m", "", "-r", "q8_0-mtp", "-o", "OUT"], "MODEL"),
    (["search", "", "--budget", "4.5bpw", "-o", "OUT"], "MODEL"),
    (["convert", "", "-o", "OUT"], "SOURCE"),  # "./config.json: no such file"
], ids=lambda v: " ".join(v[:1] + v[-2:]) if isinstance(v, list) else None)
def test_an_empty_value_is_refused_not_read_as_the_current_folder(argv, flag, tmp_path, monkeypatch):
    """``-o "$OUT"`` (or MODEL) of an unset variable is ``""``, which click.Path takes and every
    reader took as the current folder: one usage error naming the flag, nothing written there."""
    monkeypatch.chdir(tmp_path)
    _refused(argv, tmp_path, 2, flag, "''")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("argv", "said"), [
    (["run", "-m", TINY, "-r", "q8_0-mtp", "--imatrix-chunks", "4"], "--imatrix-chunks goes with --imatrix-corpus"),
    (["run", "-m", TINY, "-r", "q8_0-mtp", "--dry-run-upload"], "--dry-run-upload goes with --upload"),
    (["ladder", "-m", TINY, "-r", "q8_0-mtp", "--gpus", "2"], "--gpus goes with --workers"),
    (["ladder", "-m", TINY, "-r", "q8_0-mtp", "--create-pr"], "--create-pr goes with --upload"),
    (["ladder", "-m", TINY, "-r", "q8_0-mtp", "--path-in-repo", "gguf"], "--path-in-repo goes with --upload"),
    (["search", "m.gguf", "--budget", "4.5bpw", "--acceptance-group", "attn.3"], "--acceptance-group goes with --acceptance"),
    (["verify", "m.gguf", "--budget", "8"], "--budget goes with --tune"),
    (["audit", "m.gguf", "--all"], "--all goes with --source"),
], ids=lambda v: " ".join(v[:1] + v[-2:]) if isinstance(v, list) else None)
def test_an_option_that_goes_with_another_is_refused_alone(argv, said, tmp_path):
    """Each of these says "With --X: ..." in its help and did nothing without --X: the run went on
    (a whole ladder, not on the GPUs asked for, or without the upload it was asked to shape)."""
    _refused([*argv, *(_O if argv[0] in ("run", "ladder", "search") else [])], tmp_path, 2, said, "")


def test_convert_names_a_source_that_is_neither_a_folder_nor_a_repo_id_as_pull_does(tmp_path):
    """``convert builtin:NAME`` (or a mistyped folder) said "reading safetensors headers of: Repo id
    must use ..." (the Hub client's words, the source missing); ``pull`` says what the value is not."""
    if any(importlib.util.find_spec(m) is None for m in ("torch", "transformers")):  # found, not imported (slow)
        pytest.skip("the convert extra (pip install 'ggufmtp[convert]')")
    said = "is neither an existing directory nor a valid Hub repo id"
    convert = _refused(["convert", TINY, "-o", "OUT"], tmp_path, 1, f"error: '{TINY}' {said}", "")
    pull = _refused(["pull", TINY, "--local-dir", "OUT"], tmp_path, 1, f"error: '{TINY}' {said}", "")
    assert convert == pull


def test_audit_refuses_a_signature_nothing_would_check(tmp_path, monkeypatch):
    """``audit --signature FILE`` without a public key checked nothing and said PASS ("unsigned:
    checksum only"), whatever FILE held: a flag that does nothing is a usage error."""
    from receipt_kit import honest_statement, synth_artifact

    monkeypatch.delenv("GGUFMTP_PUBLIC_KEY", raising=False)
    art = synth_artifact(tmp_path / "m")
    receipt = tmp_path / "m" / "r.json"
    receipt.write_text(json.dumps(honest_statement(art, "pass")))
    (tmp_path / "x.sig").write_text("not a signature")
    _refused(["audit", str(art), "--receipt", str(receipt), "--signature", str(tmp_path / "x.sig")], tmp_path, 2,
             "--signature", "--public-key")


def test_an_int_override_that_survives_the_u32_is_still_taken():
    from ggufmtp.quant.kv import parse_kv_override

    assert parse_kv_override("a.b=int:4294967295").value == 4294967295
    assert parse_kv_override("a.b=int:-7").value == -7  # written as 7, as llama-quantize does (its parity test)


# ------------------------------------------------------------------------------------------------
# lists: one reading, and a value given twice is refused, not measured twice
# ------------------------------------------------------------------------------------------------


LISTS = [
    (["verify", "m.gguf", "--sweep", "0,4"], "--sweep", "0 is below 1"),
    (["verify", "m.gguf", "--sweep", "4,4"], "--sweep", "4 given twice"),
    (["tune-joint", "m.gguf", "--source", "s.gguf", "-r", "q8_0-mtp", "--n-max-values", "2,2"], "--n-max-values",
     "2 given twice"),
    (["tune-joint", "m.gguf", "--source", "s.gguf", "-r", "q8_0-mtp", "--n-max-values", "0,2"], "--n-max-values",
     "0 is below 1"),
    (["tune-joint", "m.gguf", "--source", "s.gguf", "-r", "q8_0-mtp", "--head-seeds", "1,1"], "--head-seeds",
     "1 given twice"),
    (["tune-joint", "m.gguf", "--source", "s.gguf", "-r", "q8_0-mtp", "--head-types", "Q8_0,q8_0"], "--head-types",
     "q8_0 given twice"),
    (["tune-joint", "m.gguf", "--source", "s.gguf", "-r", "q8_0-mtp", "--kv-values", "q8_0,q8_0"], "--kv-values",
     "given twice"),
    (["profiles", "m.gguf", "--workloads", "A,A"], "--workloads", "A given twice"),
    (["head-sweep", "m.gguf", "-r", "q8_0-mtp", "--types", ","], "--types", "no values"),
    (["head-sweep", "m.gguf", "-r", "q8_0-mtp", "--types", "Q8_0,Q6_K,Q8_0"], "--types", "Q8_0 given twice"),
    (["search", "m.gguf", "--budget", "4.5bpw", "--types", "Q4_K,Q4_K"], "--types", "Q4_K given twice"),
]


@pytest.mark.parametrize(("argv", "flag", "said"), LISTS, ids=[" ".join(c[0][:1] + c[0][-2:]) for c in LISTS])
def test_a_list_value_given_twice_or_out_of_range_is_a_usage_error(argv, flag, said, tmp_path):
    _refused([*argv, *_O], tmp_path, 2, flag, said)


# ------------------------------------------------------------------------------------------------
# the same flag, the same words, in every command that takes it
# ------------------------------------------------------------------------------------------------

_O = ["-o", "OUT"]
_MODEL = {  # each command as far as its flags, with -o where it writes
    "verify": ["verify", "m.gguf", *_O], "tune": ["tune", "m.gguf", *_O], "curve": ["curve", "m.gguf", *_O],
    "head-sweep": ["head-sweep", "m.gguf", "-r", "q8_0-mtp", *_O],
    "search": ["search", "m.gguf", "--budget", "4.5bpw", *_O],
    "tune-joint": ["tune-joint", "m.gguf", "--source", "s.gguf", "-r", "q8_0-mtp", *_O],
    "run": ["run", "-m", "m.gguf", "-r", "q8_0-mtp", *_O], "ladder": ["ladder", "-m", "m.gguf", "-r", "q8_0-mtp", *_O],
    "eval": ["eval", "a.gguf", "b.gguf"], "profiles": ["profiles", "m.gguf", *_O],
    "imatrix compute": ["imatrix", "compute", "m.gguf", *_O],
}
_TAKE = {  # the commands that take each flag
    "--seeds": ("verify", "tune", "curve", "head-sweep", "search", "tune-joint", "run", "ladder"),
    "--limit": ("verify", "tune", "curve", "head-sweep", "search", "tune-joint", "run", "ladder"),
    "--max-tokens": ("verify", "tune", "curve", "head-sweep", "search", "tune-joint", "run", "ladder"),
    "-ngl": ("verify", "tune", "curve", "head-sweep", "search", "tune-joint", "run", "ladder", "eval", "profiles",
             "imatrix compute"),
    "--head-margin": ("verify", "run", "ladder"),
    "--chunks": ("eval", "imatrix compute"),
}


@pytest.mark.parametrize(("flag", "value", "said"), [
    ("--seeds", "42,42", "42 given twice"),  # was "seeds [42, 42]: duplicates" (exit 1) or "need at least one, no duplicates"
    ("--seeds", "1,x", "expected comma-separated integers"),
    ("--seeds", ",", "no values"),
    ("--limit", "0", "0 is not in the range x>=1"),  # run, ladder: "limit 0: the number of the suite's prompts ..."
    ("--max-tokens", "1", "1 is not in the range x>=2"),  # run, ladder: "max_tokens 1: must be a whole number ..."
    ("-ngl", "-1", "a number of layers, auto or all"),  # was taken, then "gpu_layers -1: ..." from the options
    ("--head-margin", "nan", "is not a finite number"),
    ("--chunks", "0", "0 is not in the range x>=1"),  # imatrix compute: "--chunks must be at least 1, got 0" (exit 1)
])
def test_the_same_bad_value_gets_the_same_words_from_every_command(flag, value, said, tmp_path):
    lines = {cmd: _refused([*_MODEL[cmd], flag, value], tmp_path, 2, "", said) for cmd in _TAKE[flag]}
    assert len(set(lines.values())) == 1, lines


@pytest.mark.runtime
def test_tune_joint_refuses_a_kv_type_the_server_does_not_take_as_verify_does(tmp_path):
    """``verify --cache-type-k bogus`` is refused before any server starts; ``tune-joint --kv-values
    default,bogus`` ran the whole heads stage, then dropped the bogus configuration as failed
    ("llama-server rejected its arguments") and exited 0. Now one error in verify's words, before the
    heads stage, nothing written."""
    from ggufmtp.refs import local_model_arg

    model = tmp_path / "m.gguf"
    r = CliRunner().invoke(main, ["quantize", TINY, "-r", "q8_0-mtp", "-o", str(model), "--no-receipt"])
    assert r.exit_code == 0, r.output
    source = local_model_arg(TINY)
    joint = _refused(["tune-joint", str(model), "--source", source, "-r", "q8_0-mtp", "--head-types", "Q8_0",
                      "--kv-values", "default,bogus", *_O], tmp_path, 1, "--kv-values 'bogus'", "")
    single = _refused(["verify", str(model), "--cache-type-k", "bogus", *_O], tmp_path, 1, "--cache-type-k 'bogus'", "")
    said = ": not a KV-cache type this llama-server supports (allowed: "
    assert said in joint and joint.split(said)[1] == single.split(said)[1], (joint, single)
