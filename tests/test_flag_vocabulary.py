"""One vocabulary of flags (#42 item 2): every command of the app is walked (a new command is checked
too), and a shared name means the same wherever it appears: the dest, the kind of value and the help
text's first words of its row in ``ggufmtp.cli.options.VOCABULARY``, with all of its spellings. An
old spelling is hidden, listed in ``LEGACY_ALIASES`` and still works. Usage errors follow the
documented form (one ``error: ...`` line on stderr) and exit status (2). ``pull`` takes
huggingface_hub's ``--include/--exclude`` (allow/ignore patterns), ``--token`` and ``--revision``
beside ``REPO@REV``."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from fakehub import FakeHub, isolate_hf_client

from ggufmtp.cli import main
from ggufmtp.cli.options import LEGACY_ALIASES, VOCABULARY, GpuLayers, with_revision
from ggufmtp.hub.files import matches

DOCS = Path(__file__).resolve().parent.parent / "docs" / "reference"
ROWS = {name: row for row in VOCABULARY for name in row.names}
TOKEN = "hf_VOCABtoken0042"


def _commands(group: click.Group = main, path: tuple[str, ...] = ()):
    for name, cmd in sorted(group.commands.items()):
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, (*path, name))
        else:
            yield " ".join((*path, name)), cmd


COMMANDS = dict(_commands())
OPTIONS = [(path, opt) for path, cmd in COMMANDS.items() for opt in cmd.params if isinstance(opt, click.Option)]


def _spellings(opt: click.Option) -> list[str]:
    return [*opt.opts, *opt.secondary_opts]


def _shown(opt: click.Option) -> list[str]:
    hidden = set(getattr(opt, "hidden_opts", ()))
    return [s for s in _spellings(opt) if s not in hidden]


def _kind(opt: click.Option) -> str:
    if isinstance(opt.type, GpuLayers):
        return "gpu layers"
    if isinstance(opt.type, click.Path):
        return "path"
    if isinstance(opt.type, click.types.IntParamType):
        return "integer"
    if isinstance(opt.type, click.types.StringParamType):
        return "text (repeatable)" if opt.multiple else "text"
    return opt.type.name


def test_each_shared_name_means_one_thing_in_every_command():
    wrong, seen = [], {row.dest: set() for row in VOCABULARY}
    for path, opt in OPTIONS:
        for s in _spellings(opt):
            row = ROWS.get(s)
            if row is None or (path, s) in LEGACY_ALIASES:
                continue
            seen[row.dest].add(path)
            got = (opt.name, _kind(opt), (opt.help or "").startswith(row.stem), set(row.names) <= set(_shown(opt)))
            if got != (row.dest, row.kind, True, True):
                wrong.append(f"{path} {s}: dest {opt.name}, {_kind(opt)}, help {opt.help!r}, spelled {_shown(opt)}")
    assert not wrong, "a shared name means something else here:\n" + "\n".join(wrong)
    assert all(seen.values()), f"a row no command uses: {[d for d, p in seen.items() if not p]}"
    # the names the issue asked for are where a llama.cpp or Hub user looks for them
    assert {"verify", "eval", "tune", "curve", "profiles", "imatrix compute", "run", "ladder"} <= seen["gpu_layers"]
    assert {"verify", "eval", "imatrix compute"} <= seen["ctx_size"]
    assert {"verify", "curve", "profiles", "run", "ladder", "head-sweep"} <= seen["draft_n_max"]
    assert {"run", "ladder", "pull"} <= seen["revision"] and {"pull"} <= seen["exclude"] & seen["include"]
    assert {"quantize", "sidecar", "run", "ladder", "head-sweep"} <= seen["quantize_threads"]


def test_output_is_always_the_path_of_the_main_product():
    for path, opt in OPTIONS:
        if "-o" in _spellings(opt) or "--output" in _spellings(opt):
            assert opt.name == "output" and isinstance(opt.type, click.Path), path
    assert {p for p, o in OPTIONS if o.name == "output"} >= {"verify", "tune", "curve", "profiles", "quantize",
                                                              "convert", "card", "sidecar", "imatrix compute", "run",
                                                              "ladder", "head-sweep", "recipe from-flags"}


def test_hidden_spellings_are_the_listed_old_ones_and_not_in_help():
    found = {}
    for path, opt in OPTIONS:
        for s in getattr(opt, "hidden_opts", ()):
            found[(path, s)] = opt
            assert LEGACY_ALIASES.get((path, s)) in _shown(opt), f"{path} {s}: not an alias of {LEGACY_ALIASES.get((path, s))}"
            record = opt.get_help_record(click.Context(COMMANDS[path]))
            assert record is not None and s not in [n.split()[0] for n in record[0].split(", ")], (path, s, record)
    assert set(found) == set(LEGACY_ALIASES), "LEGACY_ALIASES lists a spelling no command has"


@pytest.mark.parametrize(("path", "old"), sorted(LEGACY_ALIASES))
def test_old_spellings_still_work(path, old):
    ctx = COMMANDS[path].make_context(path, [old, "7"], resilient_parsing=True)
    opt = next(o for p, o in OPTIONS if p == path and old in _spellings(o))
    assert ctx.params[opt.name] in (7, "7")


def test_the_docs_table_lists_every_shared_and_old_spelling():
    text = (DOCS / "flags.md").read_text()
    for row in VOCABULARY:
        for name in row.names:
            assert f"`{name}`" in text, name
    for path, old in LEGACY_ALIASES:
        assert f"`{path} {old}" in text or f"`{path} {old}`" in text or f"{old}`)" in text, (path, old)
    assert "flags.md" in (DOCS / "cli.md").read_text()


# ------------------------------------------------------------------------------------------------
# usage errors: the documented form and status
# ------------------------------------------------------------------------------------------------


def _usage_error(argv: list[str]) -> str:
    r = CliRunner().invoke(main, argv, prog_name="ggufmtp")
    assert r.exit_code == 2, (argv, r.exit_code, r.output)
    lines = r.stderr.splitlines()
    assert lines[0].startswith("error: ") and [ln for ln in lines if ln.lower().startswith("error")] == [lines[0]], r.stderr
    assert lines[1:] == [f"Try 'ggufmtp{''.join(' ' + a for a in argv[:_depth(argv)])} --help' for help."], r.stderr
    assert r.stdout == "" and "Usage:" not in r.stderr and "Traceback" not in r.output
    return lines[0]


def _depth(argv: list[str]) -> int:
    group, n = main, 0
    while n < len(argv) and isinstance(group, click.Group) and argv[n] in group.commands:
        group, n = group.commands[argv[n]], n + 1
    return n


def test_the_documented_rule():
    text = (DOCS / "cli.md").read_text()
    assert "`error: ...` line" in text and "exit status 2" in text and "exit status 1" in text


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_an_unknown_option_is_a_usage_error_in_every_command(path):
    if COMMANDS[path].context_settings.get("ignore_unknown_options"):  # recipe from-flags: a llama-quantize line, read as such
        assert "Missing argument" in _usage_error(path.split())
        return
    assert "--no-such-flag" in _usage_error([*path.split(), "--no-such-flag"])


@pytest.mark.parametrize(("argv", "said"), [
    (["no-such-command"], "No such command"),
    (["--no-such-flag"], "--no-such-flag"),
    (["quantize"], "Missing argument 'MODEL'"),
    (["verify", "m.gguf", "-ngl", "lots"], "'lots': a number of layers, auto or all"),
    (["verify", "m.gguf", "--seeds", "x"], "expected comma-separated integers"),
    (["eval", "a.gguf", "b.gguf", "-c", "1"], "--ctx-size"),
    (["run", "-r", "q8_0-mtp", "-m", "org/x@v1", "--revision", "v2", "--no-verify"], "two revisions"),
    (["pull", "org/x@v1", "--revision", "v2"], "two revisions"),
    (["ladder", "--revision", "v2", "-r", "q8_0-mtp"], "--revision goes with -m MODEL"),
    (["run", "-r", "q8_0-mtp", "-m", "builtin:tiny-qwen35moe", "--revision", "main"], "not a Hub repo"),
])
def test_usage_errors_have_one_form(argv, said):
    assert said in _usage_error(argv)


def test_gpu_layers_takes_what_llama_cpp_takes():
    ctx = COMMANDS["verify"].make_context("verify", ["m", "-ngl", "auto"], resilient_parsing=True)
    assert ctx.params["gpu_layers"] == "auto"
    for spelling, value in (("--n-gpu-layers", "all"), ("--gpu-layers", "99"), ("-ngl", "0")):
        ctx = COMMANDS["run"].make_context("run", [spelling, value], resilient_parsing=True)
        assert ctx.params["gpu_layers"] == (int(value) if value.isdigit() else value)


# ------------------------------------------------------------------------------------------------
# huggingface_hub's names: --revision beside REPO@REV, --include/--exclude, --token
# ------------------------------------------------------------------------------------------------


def test_revision_and_repo_at_rev_say_the_same(tmp_path):
    assert with_revision("org/x", None) == ("org/x", None)
    assert with_revision("org/x@v1", None) == with_revision("org/x", "v1") == with_revision("org/x@v1", "v1")
    odd = tmp_path / "model@v1.gguf"  # a local file whose name has an @ is a file, not a revision
    odd.write_bytes(b"")
    assert with_revision(str(odd), None) == (str(odd), None)
    with pytest.raises(click.UsageError, match="two revisions"):
        with_revision("org/x@v1", "v2")


def test_include_and_exclude_are_huggingface_hubs_allow_and_ignore_patterns():
    assert matches("a/b.gguf", ["*.gguf"]) and not matches("a/b.gguf", ["*.txt"])
    assert matches("a/b.gguf", None, ["*.txt"]) and not matches("a/b.gguf", None, ["*.gguf"])
    assert not matches("sub/c.txt", None, ["sub/"])  # a folder pattern takes the folder, as the Hub client's
    assert not matches("x.gguf", ["*.gguf"], ["x*"])  # exclude wins over include


@pytest.fixture
def fake(tmp_path, monkeypatch):
    isolate_hf_client(tmp_path / "hf_home", monkeypatch)
    with FakeHub(tokens=(TOKEN,)) as fh:
        yield fh


def test_pull_with_token_revision_include_and_exclude(fake, tmp_path):
    fake.create_repo("org/priv", private=True)
    files = {"m.gguf": b"GGUF" + bytes(60), "w.safetensors": b"x" * 10, "sub/c.txt": b"c", "d.txt": b"d"}
    fake.commit("org/priv", files)
    commit = fake.head("org/priv")
    runner, env = CliRunner(), {"HF_ENDPOINT": fake.url}
    argv = ["pull", f"org/priv@{commit}", "--exclude", "*.safetensors", "--exclude", "sub/", "--json"]

    r = runner.invoke(main, [*argv, "--local-dir", str(tmp_path / "a")], env=env)
    assert r.exit_code == 1 and r.stderr.startswith("error: "), r.output  # private: no token, no pull

    r = runner.invoke(main, [*argv, "--revision", commit, "--token", TOKEN, "--local-dir", str(tmp_path / "b")],
                      env=env)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert sorted(f["path"] for f in out["files"]) == [".gitattributes", "d.txt", "m.gguf"]
    assert out["resolved_commit"] == commit
    assert out["exclude"] == ["*.safetensors", "sub/"] and TOKEN not in r.output
    assert TOKEN not in (tmp_path / "b" / "ggufmtp-pull.json").read_text()

    r = runner.invoke(main, ["pull", "org/priv", "--include", "*.txt", "--exclude", "sub/*", "--token", TOKEN,
                             "--local-dir", str(tmp_path / "c"), "--json"], env=env)
    assert r.exit_code == 0 and [f["path"] for f in json.loads(r.stdout)["files"]] == ["d.txt"], r.output


@pytest.mark.runtime
def test_run_threads_and_gpu_layers_are_the_servers(tmp_path):
    """``run -t``/``-ngl`` reach verify's llama-servers (llama.cpp's meaning), ``--quantize-threads``
    the quantization: before this vocabulary ``run -t`` was quantization threads."""
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["run", "-r", "q8_0-mtp", "-m", "builtin:tiny-qwen35moe", "-o", str(out), "--seeds",
                                  "42", "--limit", "1", "--max-tokens", "8", "-t", "1", "-ngl", "0",
                                  "--quantize-threads", "1", "--no-reference", "--json"])
    assert r.exit_code == 0, r.output
    verify = json.loads((out / ".ggufmtp" / "stages" / "verify.json").read_text())["result"]["verification"]
    assert (verify["settings"]["threads"], verify["settings"]["gpu_layers"]) == (1, 0)


def test_run_and_ladder_read_their_verify_flags_alike(tmp_path):
    """``run`` and ``ladder`` verify as a stage: the same flags make the same verify options (one
    reading of them, ``stage_verify_options``), each given flag kept, an absent one left out."""
    from ggufmtp.cli.measure_common import stage_verify_options

    flags = ["--seeds", "42, 7,", "--limit", "3", "-ngl", "all", "-t", "2", "--head-margin", "0.05",
             "--reference", str(tmp_path / "ref.gguf"), "--server-arg=-b 256", "--n-cpu-moe", "0"]
    want = {"seeds": (42, 7), "limit": 3, "gpu_layers": "all", "threads": 2, "head_margin": 0.05,
            "reference": str(tmp_path / "ref.gguf"), "server_args": ("-b", "256"), "n_cpu_moe": 0}
    for path, argv in (("run", ["-r", "q8_0-mtp", "-m", "x.gguf", *flags]), ("ladder", flags)):
        params = dict(COMMANDS[path].make_context(path, list(argv)).params)
        got = stage_verify_options(params.pop("seeds"), params.pop("limit"), params.pop("max_tokens"),
                                   params.pop("gpu_layers"), params.pop("threads"), params.pop("ctx_size"), params)
        assert got == want, path


@pytest.mark.parametrize("argv", [["run", "-m", "builtin:tiny-qwen35moe", "-r", "q8_0-mtp", "--seeds", "1,x"],
                                  ["ladder", "-m", "builtin:tiny-qwen35moe", "-r", "q8_0-mtp", "-o", "OUT",
                                   "--seeds", "1,x"]])
def test_run_and_ladder_refuse_a_bad_seed_as_verify_does(argv, tmp_path):
    """``verify --seeds abc`` is one usage error; ``run`` and ``ladder`` (which verify as a stage)
    parsed --seeds with a bare int() and died with a ValueError traceback: what one command refuses,
    every command refuses, in the same words, before any work starts."""
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    r = CliRunner().invoke(main, argv)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and isinstance(r.exception, SystemExit)
    assert "Invalid value for --seeds: '1,x': expected comma-separated integers" in r.output, r.output
    assert not (tmp_path / "out").exists()
