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
