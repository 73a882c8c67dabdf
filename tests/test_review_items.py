"""The review's smaller items (#40, item 5): special files, ladder file types, local paths, the
source section, the publish gate's thresholds and card, and ``receipt sign``.

Every CLI case runs ``python -m ggufmtp`` in a subprocess with a timeout (a hang is a failure,
never a hung test run) and asserts one clear error, no traceback, nothing left behind
(:func:`test_bad_inputs.expect_clean_failure`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_bad_inputs import expect_clean_failure

# ----------------------------------------------------------------------------- 1. regular files, bounded reads


def _fifo(d: Path, name: str) -> Path:
    p = d / name
    os.mkfifo(p)
    return p


def _zero(d: Path, name: str) -> Path:
    p = d / name
    p.symlink_to("/dev/zero")
    return p


SPECIAL_MAKERS = {"fifo": (_fifo, "fifo"), "dev-zero": (_zero, "device")}

# each command reads the special file as: a receipt, a key, a ladder file, a recipe, a card
SPECIAL_READERS = {
    "receipt-show": lambda d, s: ["receipt", "show", s("r.json")],
    "audit-receipt": lambda d, s: ["audit", d / "x.gguf", "--receipt", s("r.json")],
    "audit-public-key": lambda d, s: ["audit", d / "x.gguf", "--public-key", s("pub.pem")],
    "sign-key": lambda d, s: ["receipt", "sign", d / "r.json", "--signing-key", s("key.pem")],
    "ladder-file": lambda d, s: ["ladder", "--ladder", s("ladder.toml"), "-o", d / "out"],
    "recipe": lambda d, s: ["plan", d / "x.gguf", "-r", s("r.toml")],
}


@pytest.mark.parametrize("kind", sorted(SPECIAL_MAKERS))
@pytest.mark.parametrize("reader", sorted(SPECIAL_READERS))
def test_a_special_file_is_refused_at_once(reader, kind, tmp_path):
    make, word = SPECIAL_MAKERS[kind]
    (tmp_path / "x.gguf").write_bytes(b"GGUF")
    made: list[Path] = []

    def special(name: str) -> Path:
        made.append(make(tmp_path, name))
        return made[-1]

    argv = SPECIAL_READERS[reader](tmp_path, special)
    ran = expect_clean_failure(argv, tmp_path, (made[0].name, word), timeout=30,
                               verdict=reader.startswith("audit"))
    assert ran.seconds < 30


# ----------------------------------------------------------------------------- 2. ladder file types

LADDER_HEAD = 'recipes = ["q8_0-mtp"]\n'
LADDER_TYPES = {  # name: (the file's text, the key the error must name)
    "model-integer": ('model = 5\n' + LADDER_HEAD, "model"),
    "model-array": ('model = ["a", "b"]\n' + LADDER_HEAD, "model"),
    "model-date": ('model = 1979-05-27\n' + LADDER_HEAD, "model"),
    "model-table": ('model = {repo = "x"}\n' + LADDER_HEAD, "model"),
    "imatrix-table": ('model = "builtin:tiny"\nimatrix = {file = "x"}\n' + LADDER_HEAD, "imatrix"),
    "imatrix-corpus-integer": ('model = "builtin:tiny"\nimatrix_corpus = 3\n' + LADDER_HEAD, "imatrix_corpus"),
    "recipes-string": ('model = "builtin:tiny"\nrecipes = "q8_0-mtp"\n', "recipes"),
    "recipes-of-integers": ('model = "builtin:tiny"\nrecipes = [1, 2]\n', "recipes"),
    "threads-string": ('model = "builtin:tiny"\nthreads = "8"\n' + LADDER_HEAD, "threads"),
    "threads-boolean": ('model = "builtin:tiny"\nthreads = true\n' + LADDER_HEAD, "threads"),
    "chunks-float": ('model = "builtin:tiny"\nimatrix_chunks = 2.5\n' + LADDER_HEAD, "imatrix_chunks"),
    "verify-seeds-string": ('model = "builtin:tiny"\n' + LADDER_HEAD + '[verify]\nseeds = "42"\n', "seeds"),
    "verify-seeds-floats": ('model = "builtin:tiny"\n' + LADDER_HEAD + '[verify]\nseeds = [1.5]\n', "seeds"),
    "verify-gpu-layers-table": ('model = "builtin:tiny"\n' + LADDER_HEAD + '[verify]\ngpu_layers = {a = 1}\n',
                                "gpu_layers"),
    "verify-max-tokens-date": ('model = "builtin:tiny"\n' + LADDER_HEAD + '[verify]\nmax_tokens = 1979-05-27\n',
                               "max_tokens"),
    "verify-limit-boolean": ('model = "builtin:tiny"\n' + LADDER_HEAD + '[verify]\nlimit = true\n', "limit"),
    "eval-corpus-integer": ('model = "builtin:tiny"\n' + LADDER_HEAD + '[eval]\ncorpus = 5\n', "corpus"),
    "eval-chunks-string": ('model = "builtin:tiny"\n' + LADDER_HEAD + '[eval]\nchunks = "4"\n', "chunks"),
}


@pytest.mark.parametrize("name", sorted(LADDER_TYPES))
def test_a_ladder_file_value_of_the_wrong_type_is_one_error_naming_the_file_and_the_key(name, tmp_path):
    text, key = LADDER_TYPES[name]
    f = tmp_path / "ladder.toml"
    f.write_text(text)
    ran = expect_clean_failure(["ladder", "--ladder", f, "-o", tmp_path / "out"], tmp_path, ("ladder.toml", key),
                               timeout=60)
    assert "must be" in ran.err, ran.err
