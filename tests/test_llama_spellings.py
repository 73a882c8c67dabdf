"""llama.cpp's spellings in every command (#51 item 2): a multi-letter short flag is one whole name
(``-md`` is not click's ``-m -d``), ``-m/--model`` is the MODEL argument, ``-n``, ``-s``, ``-f``,
``-c`` mean what they mean in llama.cpp wherever the command has the concept, and an unknown flag is
reported exactly as typed (with the reason when llama.cpp's name has no place in the command).
On the old main ``verify X -md SIDE`` said "No such option: -m" and ``-hf R`` "No such option: -f"."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner
from test_flag_vocabulary import COMMANDS  # every command of the app, walked once

from ggufmtp.cli import main
from ggufmtp.cli.options import LLAMA_SPELLINGS


def _params(path: str, args: list[str]) -> dict:
    return COMMANDS[path].make_context(path, list(args), resilient_parsing=True).params


def _usage_error(argv: list[str]) -> str:
    r = CliRunner().invoke(main, argv, prog_name="ggufmtp")
    assert r.exit_code == 2 and "Traceback" not in r.output, (argv, r.output)
    return r.stderr.splitlines()[0]


def test_draft_model_is_the_sidecar_and_m_the_model():
    for spelling in ("-md", "--spec-draft-model", "--model-draft"):
        p = _params("verify", ["-m", "trunk.gguf", spelling, "mtp.gguf"])
        assert (p["model"], p["sidecar"]) == ("trunk.gguf", "mtp.gguf"), spelling
    assert _params("audit", ["-m", "a.gguf", "-md", "s.gguf"])["sidecar"] == "s.gguf"
    assert _params("verify", ["--model=x.gguf"])["model"] == "x.gguf"


def test_m_is_the_model_argument_wherever_it_stands():
    p = _params("quantize", ["--pure", "-m", "in.gguf", "out.gguf", "Q4_K_M"])
    assert (p["model"], p["positional"], p["pure"]) == ("in.gguf", ("out.gguf", "Q4_K_M"), True)
    p = _params("plan", ["-r", "Q4_K_M", "-m", "in.gguf"])
    assert (p["model"], p["recipe_name"]) == ("in.gguf", "Q4_K_M")


@pytest.mark.parametrize(("path", "args", "key", "value"), [
    ("verify", ["m", "-n", "64"], "max_tokens", 64),
    ("verify", ["m", "--n-predict", "64"], "max_tokens", 64),
    ("run", ["-n", "64"], "max_tokens", 64),
    ("verify", ["m", "-s", "7"], "seeds", "7"),
    ("verify", ["m", "--seed", "7,8"], "seeds", "7,8"),
    ("synth", ["o.gguf", "-s", "3"], "seed", 3),
    ("verify", ["m", "-f", "p.jsonl"], "suite", "p.jsonl"),
    ("eval", ["b", "q", "-f", "c.txt"], "corpus", "c.txt"),
    ("imatrix compute", ["m", "-f", "c.txt"], "corpus_ref", "c.txt"),
    ("run", ["-c", "8192"], "ctx_size", 8192),
    ("ladder", ["-c", "8192"], "ctx_size", 8192),
    ("run", ["-hf", "org/model"], "model", "org/model"),
    ("ladder", ["--hf-repo", "org/model"], "model", "org/model"),
])
def test_llama_cpp_names_mean_llama_cpps_thing(path, args, key, value):
    assert _params(path, args)[key] == value


def test_a_spelling_joins_only_where_the_concept_is_one_option():
    for row in LLAMA_SPELLINGS:
        for path, cmd in COMMANDS.items():
            carriers = [o for o in cmd.params if isinstance(o, click.Option) and set(row.names) & set(o.opts)]
            assert len(carriers) <= 1, (path, row.names)
    # search reads a corpus and a prompt suite: -f would be a guess, so it is refused, saying why
    assert "--corpus or --suite" in _usage_error(["search", "m.gguf", "-f", "x.txt"])


@pytest.mark.parametrize(("argv", "said"), [
    (["verify", "m.gguf", "-xyz"], "No such option '-xyz'"),
    (["verify", "m.gguf", "-mdx", "s.gguf"], "No such option '-mdx'"),
    (["verify", "m.gguf", "-hf", "org/model"], "No such option '-hf': this command takes a local model"),
    (["quantize", "m.gguf", "-md", "s.gguf", "-r", "Q4_K_M"], "No such option '-md'"),
    (["inspect", "m.gguf", "--n-gpu", "3"], "No such option '--n-gpu'"),
])
def test_an_unknown_flag_is_reported_as_typed(argv, said):
    assert said in _usage_error(argv)


def test_values_that_look_like_flags_stay_values():
    p = _params("verify", ["m", "--server-arg", "-fa on", "--head-margin", "0.05"])
    assert p["server_args"] == ("-fa", "on") and p["head_margin"] == 0.05
    # an option with an optional value, given none, before another flag
    assert _params("run", ["--eval", "-c", "4096"])["eval_corpus"] == "builtin:calib-v1"


def test_hf_repo_with_a_quant_tag_is_refused_with_a_pointer():
    said = _usage_error(["run", "-hf", "org/model-GGUF:Q4_K_M", "-r", "Q4_K_M"])
    assert "REPO:QUANT" in said and "-r Q4_K_M" in said


def test_help_shows_llama_cpps_names():
    out = CliRunner().invoke(main, ["verify", "--help"]).output
    assert "-md, --model-draft, --spec-draft-model, --sidecar" in out and "-n, --n-predict, --max-tokens" in out


@pytest.mark.usefixtures("llama_runtime")
def test_every_llama_quantize_option_works_or_is_refused_and_the_docs_say_which():
    import re
    from pathlib import Path

    from ggufmtp.cli.options import LLAMA_REFUSALS
    from ggufmtp.runtime import build as runtime

    src = (runtime.source_tree() / "tools" / "quantize" / "quantize.cpp").read_text()
    theirs = set(re.findall(r'strcmp\(argv\[arg_idx\], "(--[a-z-]+)"\) == 0', src))
    assert len(theirs) >= 15, theirs  # the whole list, read off the pinned source
    quantize = COMMANDS["quantize"]
    ours = {s for o in quantize.params if isinstance(o, click.Option) for s in o.opts}
    assert theirs - ours == set(LLAMA_REFUSALS) & theirs == {"--keep-split", "--prune-layers", "--max-buffer-size"}
    docs = (Path(__file__).resolve().parent.parent / "docs" / "reference" / "flags.md").read_text()
    assert all(f"`{flag}" in docs for flag in theirs), sorted(f for f in theirs if f"`{f}" not in docs)
    assert all(f"`{name}`" in docs for row in LLAMA_SPELLINGS for name in row.names)
