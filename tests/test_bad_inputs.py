"""The bad-input and fault corpus (#16): careless and hostile inputs to every command.

Every case runs the real CLI in a subprocess (``python -m ggufmtp``, with a timeout: a hang is a
failure) and asserts what a user is owed whatever they pass:

* a non-zero exit, and no ``Traceback``;
* exactly one ``error:`` line on stderr naming the file or the problem (verdict commands such as
  ``audit`` may instead print their FAIL report);
* nothing left behind: the case's folder and the shared inputs hold exactly the files they held
  before (plus what the case expects);
* no process left running (every subprocess carries a marker in its environment, and no process
  with it may survive the command);
* no token in any output or file (``HF_TOKEN`` is set for every case).

Cases are tables: a name, a setup writing the inputs into the case's folder, the command line and
the words the error must contain. Outputs into full or read-only folders use small tmpfs mounts
(root only; those cases skip where mounting is impossible).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from ggufmtp.imatrix import check as imc
from ggufmtp.imatrix import entries as ime
from ggufmtp.imatrix import format as imx
from ggufmtp.synth.spec import SynthSpec

TOKEN = "hf_BadInputsFakeToken0123456789abcdefXYZ"
MARK = "GGUFMTP_BAD_INPUT_CASE"
STALL = "GGUFMTP_SERVER_STALL_TIMEOUT"


# ----------------------------------------------------------------------------- running one case


@dataclasses.dataclass
class Ran:
    rc: int
    out: str
    err: str
    seconds: float


def _env(tmp: Path, extra: dict[str, str] | None = None) -> tuple[dict[str, str], str]:
    mark = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("HF_") and k not in ("GGUFMTP_SIGNING_KEY", "GGUFMTP_PUBLIC_KEY", STALL)}
    env.update({"HF_TOKEN": TOKEN, "HF_HOME": str(tmp / ".hf"), "HF_HUB_DISABLE_XET": "1",
                "HF_HUB_DISABLE_TELEMETRY": "1", "HF_ENDPOINT": "http://127.0.0.1:9",  # closed: no real network
                "PYTHONPATH": str(Path(__file__).resolve().parent.parent), MARK: mark})
    env.update(extra or {})
    return env, mark


def run_cli(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 90) -> Ran:
    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "-m", "ggufmtp", *map(str, args)], cwd=cwd, env=env, text=True,
                           capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"hung: `ggufmtp {' '.join(map(str, args))}` still running after {timeout}s; "
                    f"stderr so far: {e.stderr!r}")
    return Ran(p.returncode, p.stdout, p.stderr, time.monotonic() - t0)


def marked_processes(mark: str) -> list[str]:
    """Command lines of the live processes whose environment carries ``mark`` (a leftover)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            if f"{MARK}={mark}".encode() in environ:
                found.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return found


def snapshot(*roots: Path) -> dict[str, int]:
    """Every path below ``roots`` (folders too: an empty stage folder is a leftover) with its size."""
    files = {}
    for root in roots:
        for p in root.rglob("*"):
            try:
                files[str(p)] = -2 if p.is_dir() and not p.is_symlink() else p.lstat().st_size
            except OSError:
                files[str(p)] = -1
    return files


def _files_with_token(*roots: Path) -> list[str]:
    hits = []
    for root in roots:
        for p in root.rglob("*"):
            if p.is_file() and not p.is_symlink() and p.stat().st_size < 64 << 20:
                with open(p, "rb") as fh:
                    if TOKEN.encode() in fh.read():
                        hits.append(str(p))
    return hits


def assert_clean_failure(ran: Ran, expect: tuple[str, ...], mark: str, before: dict[str, int],
                         roots: tuple[Path, ...], verdict: bool = False, allowed: tuple[str, ...] = ()) -> None:
    both = ran.out + ran.err
    assert ran.rc != 0, f"exit 0 on bad input:\n{both[-3000:]}"
    assert "Traceback" not in both, both[-4000:]
    errors = [line for line in ran.err.splitlines() if line.lower().startswith("error:")]  # click: "Error:"
    if verdict:
        assert len(errors) <= 1 and (errors or "FAIL" in both), both[-3000:]
    else:
        assert len(errors) == 1, f"want one error: line on stderr, got:\n{ran.err[-3000:]}"
    for word in expect:
        assert word.lower() in both.lower(), f"{word!r} not in the output:\n{both[-3000:]}"
    assert TOKEN not in both, "the token leaked into the output"
    assert not _files_with_token(*roots), "the token leaked into a file"
    assert marked_processes(mark) == [], "a process was left running"
    after = snapshot(*roots)
    new = sorted(set(after) - set(before))
    new = [p for p in new if not any(fnmatch.fnmatch(p, a) for a in allowed) and not p.endswith("/.hf")
           and "/.hf/" not in p]
    assert new == [], f"left behind: {new}"


def expect_clean_failure(argv: list, d: Path, words: tuple[str, ...] = (), *, roots: tuple[Path, ...] = (),
                         env: dict[str, str] | None = None, timeout: float = 60, verdict: bool = False,
                         allowed: tuple[str, ...] = ()) -> Ran:
    """Run ``ggufmtp ARGV`` in ``d`` and assert a clean failure (see :func:`assert_clean_failure`);
    build ``argv`` first: what it creates (a mount's filler) belongs to the "before"."""
    roots = roots or (d,)
    full_env, mark = _env(d, env)
    before = snapshot(*roots)
    ran = run_cli(argv, d, full_env, timeout=timeout)
    assert_clean_failure(ran, words, mark, before, roots, verdict=verdict, allowed=allowed)
    return ran


# ----------------------------------------------------------------------------- forged GGUF headers


def _s(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


def _kv(key: bytes, type_id: int, value: bytes) -> bytes:
    return _s(key) + struct.pack("<I", type_id) + value


ARCH_KV = _kv(b"general.architecture", 8, _s(b"llama"))


def _tensor(name: bytes = b"t.weight", dims: tuple[int, ...] = (8,), type_id: int = 0, offset: int = 0) -> bytes:
    return (_s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
            + struct.pack("<IQ", type_id, offset))


def gguf(kvs: list[bytes] | None = None, tensors: list[bytes] | None = None, n_tensors: int | None = None,
         n_kv: int | None = None, version: int = 3, data: bytes = b"\0" * 32) -> bytes:
    kvs = [ARCH_KV] if kvs is None else kvs
    tensors = [_tensor()] if tensors is None else tensors
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                                 len(kvs) if n_kv is None else n_kv)
    body = head + b"".join(kvs) + b"".join(tensors)
    return body + b"\0" * (-len(body) % 32) + data


HEADERS: dict[str, tuple[bytes, tuple[str, ...]]] = {
    "empty": (b"", ()),
    "two-bytes": (b"GG", ()),
    "text-file": (b"hello, I am not a model\n" * 4, ("not a gguf",)),
    "version-99": (gguf(version=99), ("version",)),
    "tensor-count-2^63": (gguf(n_tensors=2**63), ()),
    "kv-count-2^62": (gguf(n_kv=2**62), ()),
    "key-length-2^60": (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 2**60) + b"general", ()),
    "string-length-2^62": (gguf(kvs=[_s(b"general.architecture") + struct.pack("<I", 8)
                                     + struct.pack("<Q", 2**62) + b"llama"]), ()),
    "array-length-2^61": (gguf(kvs=[ARCH_KV, _kv(b"x.tokens", 9, struct.pack("<IQ", 8, 2**61))]), ()),
    "unknown-value-type": (gguf(kvs=[ARCH_KV, _kv(b"x.y", 99, b"\0" * 8)]), ()),
    "duplicate-key": (gguf(kvs=[ARCH_KV, ARCH_KV]), ("duplicate",)),
    "alignment-3": (gguf(kvs=[ARCH_KV, _kv(b"general.alignment", 4, struct.pack("<I", 3))]), ("alignment",)),
    "nine-dims": (gguf(tensors=[_tensor(dims=(1,) * 9)]), ()),
    "tensor-name-2^62": (gguf(tensors=[struct.pack("<Q", 2**62) + b"t"]), ()),
    "unknown-tensor-type": (gguf(tensors=[_tensor(type_id=999)]), ()),
    "data-past-the-end": (gguf(tensors=[_tensor(dims=(4096, 4096))]), ("truncated",)),
    "cut-in-the-kv": (gguf()[:40], ()),
}


def _write_header_case(name: str, d: Path) -> Path:
    p = d / f"{name}.gguf"
    p.write_bytes(HEADERS[name][0])
    return p


@pytest.mark.parametrize("name", sorted(HEADERS))
def test_inspect_forged_header(name, tmp_path):
    p = _write_header_case(name, tmp_path)
    expect_clean_failure(["inspect", p], tmp_path, (p.name, *HEADERS[name][1]), timeout=30)


def _fifo(d: Path) -> Path:
    p = d / "pipe.gguf"
    os.mkfifo(p)
    return p


SPECIAL: dict[str, tuple[Callable[[Path], Path], tuple[str, ...]]] = {
    "fifo": (_fifo, ("fifo",)),
    "directory": (lambda d: (d / "dir.gguf").mkdir() or d / "dir.gguf", ("directory",)),
    "missing": (lambda d: d / "nothing-here.gguf", ("no such file",)),
    "char-device": (lambda d: Path("/dev/zero"), ("/dev/zero",)),
    "missing-shard": (lambda d: (d / "m-00001-of-00002.gguf").write_bytes(gguf()) and d / "m-00001-of-00002.gguf",
                      ("m-00002-of-00002.gguf",)),
}


@pytest.mark.parametrize("name", sorted(SPECIAL))
def test_inspect_special_files(name, tmp_path):
    make, words = SPECIAL[name]
    expect_clean_failure(["inspect", make(tmp_path)], tmp_path, words, timeout=20)


# ----------------------------------------------------------------------------- recipes (no model needed)

RECIPES: dict[str, tuple[str, tuple[str, ...]]] = {
    "toml-syntax": ('name = "x"\nftype = Q8_0\n', ()),
    "bad-regex": ('name = "x"\nftype = "Q4_K_M"\n[[rules]]\npattern = "blk\\\\.([0-9"\ntype = "Q8_0"\n', ("regex",)),
    "unknown-type": ('name = "x"\nftype = "Q4_K_M"\n[[rules]]\npattern = "ffn"\ntype = "Q9_Z"\n', ("Q9_Z",)),
    "unknown-ftype": ('name = "x"\nftype = "Q3_Z"\n', ("Q3_Z",)),
    "rules-not-a-list": ('name = "x"\nftype = "Q4_K_M"\nrules = 5\n', ("rules",)),
    "binary-garbage": ("\x00\x01\x02\xff", ()),
}


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_show_bad_toml(name, tmp_path):
    p = tmp_path / f"{name}.toml"
    p.write_text(RECIPES[name][0], errors="surrogateescape")
    expect_clean_failure(["recipe", "show", p], tmp_path, (p.name, *RECIPES[name][1]), timeout=30)


# ----------------------------------------------------------------------------- mounts: full and read-only


@pytest.fixture
def mounts(tmp_path):
    """``mounts("full")`` / ``mounts("ro")``: a 1 MiB tmpfs (filled up) or a read-only one; unmounted after."""
    made: list[Path] = []

    def mount(kind: str) -> Path:
        d = tmp_path / f"mnt-{kind}"
        d.mkdir()
        opts = "size=1m" if kind == "full" else "ro,size=1m"
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(d)], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
        made.append(d)
        if kind == "full":
            with open(d / "filler", "wb", buffering=0) as fh:  # fill it up: files can start, not grow
                try:
                    while True:
                        fh.write(b"\0" * 4096)
                except OSError:
                    pass
        return d

    yield mount
    for d in made:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


def _parent_is_file(d: Path) -> Path:
    (d / "plain.txt").write_text("a file, not a folder\n")
    return d / "plain.txt"


def _outdir(kind: str, d: Path, mounts) -> Path:
    if kind in ("full", "ro"):
        return mounts(kind)
    if kind == "missing":
        return d / "no" / "such" / "folder"
    return _parent_is_file(d)


FROM_FLAGS = ["--tensor-type", r"blk\.4\.nextn\.eh_proj=q8_0", "in.gguf", "out.gguf", "Q4_K_M"]


@pytest.mark.parametrize("kind", ["full", "ro", "parent-is-file"])
def test_recipe_from_flags_unwritable_output(kind, tmp_path, mounts):
    out = _outdir(kind, tmp_path, mounts) / "r.toml"
    expect_clean_failure(["recipe", "from-flags", "-o", out, "--", *FROM_FLAGS], tmp_path, ("r.toml",))


def test_recipe_from_flags_bad_flag(tmp_path):
    expect_clean_failure(["recipe", "from-flags", "--", "--tensor-type", "no-equals-sign", "a.gguf", "b.gguf",
                          "Q4_K_M"], tmp_path, ("no-equals-sign",))


# ----------------------------------------------------------------------------- imatrix files (no model needed)


def _imatrix_shapes() -> dict[str, tuple[int, ...]]:
    return {"blk.0.attn_qkv.weight": (64, 96), "blk.0.ffn_up_exps.weight": (64, 32, 4)}


def _write_im(d: Path, name: str, fmt: str = "gguf", poison: Callable[[ime.Imatrix], None] | None = None) -> Path:
    im = imc.synthetic_imatrix(_imatrix_shapes(), format=fmt)
    if poison is not None:
        poison(im)
    p = d / name
    imx.write_imatrix(im, p)
    return p


def _nan(im: ime.Imatrix) -> None:
    next(iter(im.entries.values())).values.flat[3] = np.nan


def _negative_values(im: ime.Imatrix) -> None:
    next(iter(im.entries.values())).values.flat[0] = -4.0


def _negative_ncall(im: ime.Imatrix) -> None:
    for e in im.entries.values():
        e.counts[0] = -7


IMATRIX_FILES: dict[str, tuple[Callable[[Path], Path], tuple[str, ...]]] = {
    "nan": (lambda d: _write_im(d, "nan.gguf", poison=_nan), ("nan",)),
    "negative-values-dat": (lambda d: _write_im(d, "neg.dat", "dat", _negative_values), ("negative",)),
    "negative-ncall-dat": (lambda d: _write_im(d, "negcall.dat", "dat", _negative_ncall), ("ncall",)),
    "truncated": (lambda d: (d / "cut.gguf").write_bytes(_write_im(d, "whole.gguf").read_bytes()[:300])
                  and d / "cut.gguf", ("cut.gguf",)),
    "fifo": (lambda d: (os.mkfifo(d / "p.dat"), d / "p.dat")[1], ("fifo",)),
}


@pytest.mark.parametrize("name", sorted(IMATRIX_FILES))
def test_imatrix_convert_refuses(name, tmp_path):
    make, words = IMATRIX_FILES[name]
    src = make(tmp_path)
    fmt = "gguf" if src.suffix == ".dat" else "dat"
    expect_clean_failure(["imatrix", "convert", src, tmp_path / "converted.out", "--format", fmt, "--chunk-size",
                          "512"], tmp_path, (src.name, *words))


@pytest.mark.parametrize("kind", ["missing", "ro", "full"])
def test_imatrix_convert_unwritable_output(kind, tmp_path, mounts):
    src = _write_im(tmp_path, "good.gguf")
    dst = _outdir(kind, tmp_path, mounts) / "out.dat"
    expect_clean_failure(["imatrix", "convert", src, dst, "--format", "dat"], tmp_path, ("out.dat",))


# ----------------------------------------------------------------------------- with a real (tiny) model


@pytest.fixture(scope="module")
def world(tiny_mtp_model, synth_model, tmp_path_factory):
    """Shared inputs: the tiny MTP model, one without MTP, a Q8_0 artifact with its receipt, imatrices
    good and bad, and an EC key pair. Cases only read them."""
    d = tmp_path_factory.mktemp("bad-inputs-world")
    w = {"model": tiny_mtp_model, "nomtp": synth_model(SynthSpec(mtp=False)), "dir": d}
    env, _ = _env(d)
    art = d / "q8.gguf"
    ran = run_cli(["quantize", tiny_mtp_model, "-r", "q8_0-mtp", "-o", art, "--no-progress"], d, env, timeout=300)
    assert ran.rc == 0, ran.err
    w["art"], w["receipt"] = art, d / "q8.gguf.receipt.json"
    shapes = imc.read_model_tensors(tiny_mtp_model).shapes
    good = imc.synthetic_imatrix(shapes)
    w["im_good"] = d / "good.imatrix.gguf"
    imx.write_imatrix(good, w["im_good"])
    for name, poison, fmt in (("im_nan", _nan, "gguf"), ("im_negval", _negative_values, "dat"),
                              ("im_negcall", _negative_ncall, "dat")):
        im = imc.synthetic_imatrix(shapes, format=fmt)
        poison(im)
        w[name] = d / f"{name}.{fmt}"
        imx.write_imatrix(im, w[name])
    other = {n: (s[0] * 2, *s[1:]) for n, s in shapes.items()}
    w["im_other"] = d / "other-model.imatrix.gguf"
    imx.write_imatrix(imc.synthetic_imatrix(other), w["im_other"])
    w["pub"] = _ec_public_key(d)
    return w


def _ec_public_key(d: Path) -> Path:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    pub = d / "pub.pem"
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    return pub


@dataclasses.dataclass
class Case:
    """One command on bad input: ``args(ctx)`` with ctx = {"d": case folder, **world}; ``setup``
    writes extra inputs first; ``expect``: words the output must contain; ``verdict``: a FAIL report
    may stand for the error line; ``area``: whose code answers it."""

    args: Callable[[dict], list]
    expect: tuple[str, ...] = ()
    setup: Callable[[dict], None] | None = None
    verdict: bool = False
    timeout: float = 90
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    area: str = "D"
    allowed: tuple[str, ...] = ()


def _copy(src: Path, dst: Path) -> Path:
    dst.write_bytes(src.read_bytes())
    return dst


def _tampered_receipt(c: dict) -> None:
    r = json.loads(c["receipt"].read_text())
    r["predicate"]["recipe"]["ftype"] = "Q2_K"
    (c["d"] / "tampered.json").write_text(json.dumps(r))


def _forged_receipt(c: dict) -> None:
    from ggufmtp.provenance.receipt import seal

    r = json.loads(c["receipt"].read_text())
    if "payload" in r:  # a signed receipt: forge its statement, drop the envelope
        pytest.skip("the shared receipt is signed")
    r["predicate"]["recipe"]["ftype"] = "Q2_K"
    (c["d"] / "forged.json").write_text(json.dumps(seal(r)))


def _flipped_artifact(c: dict) -> None:
    b = bytearray(c["art"].read_bytes())
    b[-100] ^= 0xFF
    (c["d"] / "q8.gguf").write_bytes(bytes(b))


def _deep_json(c: dict) -> None:
    (c["d"] / "deep.json").write_text("[" * 200000 + "]" * 200000)


def _fake_bin(c: dict, body: str) -> None:
    """A fake llama-server in d/bin: ``--help`` per ``body``, or hangs without a word."""
    b = c["d"] / "bin"
    b.mkdir()
    real = _real_server()
    script = b / "llama-server"
    script.write_text(f"#!/bin/sh\n{body.format(real=real)}\n")
    script.chmod(0o755)


def _real_server() -> str:
    from ggufmtp.runtime import build as runtime

    return str(runtime.find_binary("llama-server"))


HANG_ON_HELP = "exec sleep 600"
NEVER_HEALTHY = 'if [ "$1" = "--help" ]; then exec {real} --help; fi\nexec sleep 600'

Q = ["-r", "q8_0-mtp", "--no-progress"]

CASES: dict[str, Case] = {
    # ---- plan
    "plan/model-not-gguf": Case(lambda c: ["plan", c["d"] / "x.gguf", "-r", "q8_0-mtp"], ("x.gguf",),
                                setup=lambda c: (c["d"] / "x.gguf").write_text("not a model")),
    "plan/missing-model": Case(lambda c: ["plan", c["d"] / "gone.gguf", "-r", "q8_0-mtp"], ("gone.gguf",)),
    "plan/unknown-recipe": Case(lambda c: ["plan", c["model"], "-r", "no-such-recipe"], ("no-such-recipe",)),
    "plan/bad-regex-recipe": Case(lambda c: ["plan", c["model"], "-r", c["d"] / "bad.toml"], ("regex",),
                                  setup=lambda c: (c["d"] / "bad.toml").write_text(RECIPES["bad-regex"][0])),
    "plan/recipe-is-a-directory": Case(lambda c: ["plan", c["model"], "-r", c["d"]], ()),
    "plan/missing-imatrix": Case(lambda c: ["plan", c["model"], "-r", "q8_0-mtp", "--imatrix", c["d"] / "no.dat"],
                                 ("no.dat",)),
    "plan/truncated-imatrix": Case(lambda c: ["plan", c["model"], "-r", "q8_0-mtp", "--imatrix", c["d"] / "t.gguf"],
                                   ("t.gguf",), setup=lambda c: (c["d"] / "t.gguf").write_bytes(
                                       c["im_good"].read_bytes()[:500])),
    "plan/imatrix-of-another-model": Case(lambda c: ["plan", c["model"], "-r", "q8_0-mtp", "--imatrix",
                                                     c["im_other"]], ("another model",)),
    # ---- quantize
    "quantize/output-is-input": Case(lambda c: ["quantize", c["d"] / "m.gguf", *Q, "-o", c["d"] / "m.gguf"],
                                     ("overwrite the input",), setup=lambda c: _copy(c["model"], c["d"] / "m.gguf")),
    "quantize/output-is-a-directory": Case(lambda c: ["quantize", c["model"], *Q, "-o", c["d"]], ()),
    "quantize/output-parent-is-a-file": Case(lambda c: ["quantize", c["model"], *Q, "-o", c["d"] / "f" / "o.gguf"],
                                             ("o.gguf",), setup=lambda c: (c["d"] / "f").write_text("x")),
    "quantize/receipt-is-the-output": Case(lambda c: ["quantize", c["model"], *Q, "-o", c["d"] / "o.gguf",
                                                      "--receipt", c["d"] / "o.gguf"], ("receipt",)),
    "quantize/receipt-is-a-directory": Case(lambda c: ["quantize", c["model"], *Q, "-o", c["d"] / "o.gguf",
                                                       "--receipt", c["d"] / "rdir"], ("rdir",),
                                            setup=lambda c: (c["d"] / "rdir").mkdir()),
    "quantize/receipt-folder-is-a-file": Case(lambda c: ["quantize", c["model"], *Q, "-o", c["d"] / "o.gguf",
                                                         "--receipt", c["d"] / "f" / "r.json"], ("r.json",),
                                              setup=lambda c: (c["d"] / "f").write_text("x")),
    "quantize/imatrix-of-another-model": Case(lambda c: ["quantize", c["model"], *Q, "-o", c["d"] / "o.gguf",
                                                         "--imatrix", c["im_other"]], ("another model",)),
    "quantize/nan-imatrix": Case(lambda c: ["quantize", c["model"], *Q, "-o", c["d"] / "o.gguf",
                                            "--imatrix", c["im_nan"]], ("nan",)),
    "quantize/negative-values-dat": Case(lambda c: ["quantize", c["model"], *Q, "-o", c["d"] / "o.gguf",
                                                    "--imatrix", c["im_negval"]], ("negative",)),
    "quantize/negative-ncall-dat": Case(lambda c: ["quantize", c["model"], *Q, "-o", c["d"] / "o.gguf",
                                                   "--imatrix", c["im_negcall"]], ("ncall",)),
    "quantize/needs-imatrix": Case(lambda c: ["quantize", c["model"], "-r", "iq2_xxs-mtp", "--no-progress", "-o",
                                              c["d"] / "o.gguf"], ("imatrix",)),
    "quantize/mtp-recipe-without-mtp": Case(lambda c: ["quantize", c["nomtp"], *Q, "-o", c["d"] / "o.gguf"],
                                            ("mtp",)),
    "quantize/bad-toml-recipe": Case(lambda c: ["quantize", c["model"], "-r", c["d"] / "r.toml", "--no-progress",
                                                "-o", c["d"] / "o.gguf"], ("r.toml",),
                                     setup=lambda c: (c["d"] / "r.toml").write_text(RECIPES["toml-syntax"][0])),
    # ---- imatrix with a model
    "imatrix/info-of-another-model": Case(lambda c: ["imatrix", "info", c["im_other"], "--model", c["model"]],
                                          ("another model",)),
    # ---- receipt and audit (S)
    "receipt/show-not-json": Case(lambda c: ["receipt", "show", c["d"] / "r.json"], ("r.json",),
                                  setup=lambda c: (c["d"] / "r.json").write_text("{not json"), area="S"),
    "receipt/show-wrong-shape": Case(lambda c: ["receipt", "show", c["d"] / "r.json"], ("r.json",),
                                     setup=lambda c: (c["d"] / "r.json").write_text("[1, 2, 3]"), area="S"),
    "receipt/show-deep-nesting": Case(lambda c: ["receipt", "show", c["d"] / "deep.json"], ("deep.json",),
                                      setup=_deep_json, area="S"),
    "receipt/show-directory": Case(lambda c: ["receipt", "show", c["d"]], (), area="S"),
    "audit/tampered-receipt": Case(lambda c: ["audit", c["art"], "--receipt", c["d"] / "tampered.json"], (),
                                   setup=_tampered_receipt, verdict=True, area="S"),
    "audit/forged-receipt-with-public-key": Case(lambda c: ["audit", c["art"], "--receipt", c["d"] / "forged.json",
                                                            "--public-key", c["pub"]], (),
                                                 setup=_forged_receipt, verdict=True, area="S"),
    "audit/foreign-receipt": Case(lambda c: ["audit", c["model"], "--receipt", c["receipt"]], (),
                                  verdict=True, area="S"),
    "audit/flipped-artifact": Case(lambda c: ["audit", c["d"] / "q8.gguf", "--receipt", c["receipt"]], (),
                                   setup=_flipped_artifact, verdict=True, area="S"),
    "audit/wrong-shape-receipt": Case(lambda c: ["audit", c["art"], "--receipt", c["d"] / "r.json"], ("r.json",),
                                      setup=lambda c: (c["d"] / "r.json").write_text('{"_type": 5}'), verdict=True,
                                      area="S"),
    "audit/deep-nesting-receipt": Case(lambda c: ["audit", c["art"], "--receipt", c["d"] / "deep.json"],
                                       ("deep.json",), setup=_deep_json, verdict=True, area="S"),
    "audit/missing-artifact": Case(lambda c: ["audit", c["d"] / "gone.gguf", "--receipt", c["receipt"]],
                                   ("gone.gguf",), verdict=True, area="S"),
    "audit/fifo-artifact": Case(lambda c: ["audit", c["d"] / "pipe.gguf", "--receipt", c["receipt"]], ("fifo",),
                                setup=lambda c: _fifo(c["d"]), timeout=30, verdict=True, area="S"),
    # ---- verify (T; the server's timeouts: D)
    "verify/model-not-gguf": Case(lambda c: ["verify", c["d"] / "x.gguf", "--limit", "1"], ("x.gguf",),
                                  setup=lambda c: (c["d"] / "x.gguf").write_text("not a model"), area="T"),
    "verify/model-without-mtp": Case(lambda c: ["verify", c["nomtp"], "--limit", "1"], ("mtp",), area="T"),
    "verify/fifo-model": Case(lambda c: ["verify", c["d"] / "pipe.gguf", "--limit", "1"], ("pipe.gguf",),
                              setup=lambda c: _fifo(c["d"]), timeout=30, area="T"),
    "verify/receipt-of-another-file": Case(lambda c: ["verify", c["model"], "--limit", "1", "--max-tokens", "4",
                                                      "--seeds", "1", "--receipt", c["d"] / "r.json"],
                                           ("r.json",), setup=lambda c: _copy(c["receipt"], c["d"] / "r.json"),
                                           timeout=240, area="T+S"),
    "verify/server-hangs-on-help": Case(lambda c: ["verify", c["model"], "--limit", "1", "--llama-cpp-bin",
                                                   c["d"] / "bin"], ("--help",),
                                        setup=lambda c: _fake_bin(c, HANG_ON_HELP), timeout=45),
    "verify/server-never-healthy": Case(lambda c: ["verify", c["model"], "--limit", "1", "--llama-cpp-bin",
                                                   c["d"] / "bin"], ("no progress",),
                                        setup=lambda c: _fake_bin(c, NEVER_HEALTHY), timeout=60,
                                        env={STALL: "4"}),
    # ---- pull (P), against a closed local port or the fake Hub
    "pull/no-network": Case(lambda c: ["pull", "org/model", "--local-dir", c["d"] / "dl"], ("org/model",),
                            area="P", timeout=60),
    "pull/malformed-repo-id": Case(lambda c: ["pull", "../../etc/passwd/x", "--local-dir", c["d"] / "dl"], (),
                                   area="P"),
    # ---- upload (P): --dry-run touches no network
    "upload/receipt-not-json": Case(lambda c: ["upload", "org/x", c["art"], "--receipt", c["d"] / "r.json",
                                               "--dry-run"], ("r.json",),
                                    setup=lambda c: (c["d"] / "r.json").write_text("{nope"), area="P"),
    "upload/receipt-of-another-artifact": Case(lambda c: ["upload", "org/x", c["model"], "--receipt", c["receipt"],
                                                          "--dry-run"], (), area="P"),
    "upload/unverified-receipt": Case(lambda c: ["upload", "org/x", c["art"], "--receipt", c["receipt"],
                                                 "--dry-run"], ("verif",), area="P"),
    "upload/missing-artifact": Case(lambda c: ["upload", "org/x", c["d"] / "gone.gguf", "--receipt", c["receipt"],
                                               "--dry-run"], ("gone.gguf",), area="P"),
    "upload/flipped-artifact": Case(lambda c: ["upload", "org/x", c["d"] / "q8.gguf", "--receipt", c["receipt"],
                                               "--dry-run"], (), setup=_flipped_artifact, area="P"),
    # ---- run (P)
    "run/model-not-gguf": Case(lambda c: ["run", "-r", "q8_0-mtp", "-m", c["d"] / "x.gguf", "-o", c["d"] / "out",
                                          "--no-verify"], ("x.gguf",),
                               setup=lambda c: (c["d"] / "x.gguf").write_text("not a model"), area="P"),
    "run/missing-model": Case(lambda c: ["run", "-r", "q8_0-mtp", "-m", c["d"] / "gone.gguf", "-o", c["d"] / "out",
                                         "--no-verify"], ("gone.gguf",), area="P"),
    "run/bad-recipe": Case(lambda c: ["run", "-r", c["d"] / "r.toml", "-m", c["model"], "-o", c["d"] / "out",
                                      "--no-verify"], ("r.toml",),
                           setup=lambda c: (c["d"] / "r.toml").write_text(RECIPES["bad-regex"][0]), area="P"),
    "run/out-dir-is-a-file": Case(lambda c: ["run", "-r", "q8_0-mtp", "-m", c["model"], "-o", c["d"] / "f",
                                             "--no-verify"], ("f",),
                                  setup=lambda c: (c["d"] / "f").write_text("x"), area="P"),
    # ---- card (P)
    "card/missing-receipt": Case(lambda c: ["card", c["art"], "--receipt", c["d"] / "none.json", "-o",
                                            c["d"] / "README.md"], ("none.json",), area="P"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input(name, world, tmp_path):
    case = CASES[name]
    ctx = {**world, "d": tmp_path}
    if case.setup is not None:
        case.setup(ctx)
    expect_clean_failure(case.args(ctx), tmp_path, case.expect, roots=(tmp_path, world["dir"]), env=case.env,
                         timeout=case.timeout, verdict=case.verdict, allowed=case.allowed)


# ----------------------------------------------------------------------------- unwritable outputs with a model

OUTPUT_COMMANDS: dict[str, Callable[[dict, Path], list]] = {
    "quantize": lambda c, o: ["quantize", c["model"], *Q, "-o", o / "o.gguf"],
    "quantize-receipt": lambda c, o: ["quantize", c["model"], *Q, "-o", c["d"] / "o.gguf", "--receipt", o / "r.json"],
    "synth": lambda c, o: ["synth", o / "o.gguf"],
    "card": lambda c, o: ["card", c["art"], "--receipt", c["receipt"], "-o", o / "README.md"],
}


@pytest.mark.parametrize("kind", ["full", "ro"])
@pytest.mark.parametrize("command", sorted(OUTPUT_COMMANDS))
def test_unwritable_output(command, kind, world, tmp_path, mounts):
    ctx = {**world, "d": tmp_path}
    argv = OUTPUT_COMMANDS[command](ctx, mounts(kind))
    ran = expect_clean_failure(argv, tmp_path, roots=(tmp_path, world["dir"]), timeout=120)
    if kind == "full" and command == "quantize":
        assert "no space left" in ran.err.lower() and "o.gguf" in ran.err and str(world["model"]) not in ran.err
    assert not (tmp_path / "o.gguf").exists(), "an artifact without its receipt"


# ----------------------------------------------------------------------------- kill -9 and Ctrl-C


def _partials(d: Path) -> list[Path]:
    return [p for p in d.iterdir() if ".partial-" in p.name]


@pytest.mark.runtime
def test_kill_9_mid_quantize_leaves_nothing_and_a_rerun_succeeds(tmp_path, synth_model):
    model = synth_model(SynthSpec(layers=12))  # big enough that the quantization takes a moment
    out = tmp_path / "o.gguf"
    env, mark = _env(tmp_path)
    argv = [sys.executable, "-m", "ggufmtp", "quantize", str(model), *Q, "-t", "1", "-o", str(out)]
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not any(p.is_dir() and any(p.iterdir()) for p in _partials(tmp_path)):
        assert proc.poll() is None, "quantize finished before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.002)
    proc.kill()
    proc.wait()
    assert not out.exists() and not (tmp_path / "o.gguf.receipt.json").exists()
    assert _partials(tmp_path), "the kill left no partial: it came too late to test anything"
    assert marked_processes(mark) == []
    ran = run_cli(argv[3:], tmp_path, env, timeout=300)
    assert ran.rc == 0, ran.err
    assert out.is_file() and (tmp_path / "o.gguf.receipt.json").is_file()
    assert _partials(tmp_path) == [], "the rerun did not remove the dead process's partial"


# The child starts as a terminal's foreground command does, with Python's Ctrl-C handler: a test
# run started as a background job of a non-interactive shell (`make test &`) hands its children
# SIGINT ignored (POSIX, asynchronous lists), and Python installs no handler for an ignored signal,
# so the SIGINT below would be dropped and the command would run to completion.
INTERRUPT_DURING = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
from ggufmtp.quant import worker
real = worker.run_quantize
sent = []
def interrupted(src, dst, params, on_line=None):
    def line(level, text):
        if {when} and not sent:
            sent.append(1)
            os.kill(os.getpid(), signal.{sig})
        if on_line is not None:
            on_line(level, text)
    return real(src, dst, params, line)
worker.run_quantize = interrupted
from ggufmtp.__main__ import main  # the console script's entry: SIGTERM handled as the CLI handles it
sys.argv = ["ggufmtp", *sys.argv[1:]]
main()
"""


@pytest.mark.runtime
@pytest.mark.parametrize("stage,sig", [("dry-run", "SIGINT"), ("quantize", "SIGINT"), ("quantize", "SIGTERM")])
def test_ctrl_c_stops_with_130_and_writes_nothing(stage, sig, world, tmp_path):
    """Ctrl-C arriving while libllama is inside its log callback (the dry run of the plan, or the
    quantization itself) stops the command with 130 and leaves no file; SIGTERM (what `timeout`,
    CI time-outs and systemd send) cleans up the same way and exits 143 (#28: it left
    ``.OUT.partial-<pid>/``)."""
    when = "params.dry_run" if stage == "dry-run" else "not params.dry_run and text.startswith('[')"
    out = tmp_path / "o.gguf"
    env, mark = _env(tmp_path)
    before = snapshot(tmp_path)
    p = subprocess.run([sys.executable, "-c", INTERRUPT_DURING.format(when=when, sig=sig), "quantize",
                        str(world["model"]), *Q, "-o", str(out)], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == (130 if sig == "SIGINT" else 143), p.stderr[-3000:]
    assert "Traceback" not in p.stderr and ("interrupted" if sig == "SIGINT" else "terminated") in p.stderr
    assert snapshot(tmp_path) == before
    assert marked_processes(mark) == []


@pytest.mark.runtime
def test_stale_partial_of_a_dead_process_is_removed(world, tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f".o.gguf.partial-{dead.pid}"
    stale.mkdir()
    (stale / "o.gguf").write_bytes(b"half a model")
    old_style = tmp_path / f".o.gguf.partial-{dead.pid + 1}"
    old_style.write_bytes(b"a partial file of an older ggufmtp")
    alive = tmp_path / f".o.gguf.partial-{os.getpid()}"
    alive.mkdir()
    env, _ = _env(tmp_path)
    ran = run_cli(["quantize", world["model"], *Q, "-o", tmp_path / "o.gguf"], tmp_path, env, timeout=300)
    assert ran.rc == 0, ran.err
    assert not stale.exists() and alive.exists()
    if not Path(f"/proc/{dead.pid + 1}").exists():
        assert not old_style.exists()



# ----------------------------------------------------------------------------- pull from a (fake) Hub that misbehaves


@pytest.fixture(scope="module")
def hub():
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fakehub import FakeHub

    with FakeHub(tokens=(TOKEN,)) as fh:
        fh.commit("org/model", {"model.gguf": gguf(), "README.md": b"# a model\n"})
        fh.commit("org/corrupt", {"model.gguf": gguf(data=b"\1" * 32)})
        fh.serve_corrupted("org/corrupt", "model.gguf")
        yield fh


# a failed pull may keep huggingface_hub's resume metadata and the files it did verify
PULL_RESUME_STATE = ("*/dl", "*/dl/.cache", "*/dl/.cache/huggingface*", "*/dl/.gitattributes")
HUB_CASES: dict[str, tuple[Callable[[Path, Callable], list], tuple[str, ...]]] = {
    "corrupted-download": (lambda d, m: ["pull", "org/corrupt", "--local-dir", d / "dl"], ("model.gguf", "sha256")),
    "no-such-repo": (lambda d, m: ["pull", "org/nothing", "--local-dir", d / "dl"], ("org/nothing",)),
    "no-such-revision": (lambda d, m: ["pull", "org/model", "--revision", "v9.9", "--local-dir", d / "dl"], ("v9.9",)),
    "local-dir-read-only": (lambda d, m: ["pull", "org/model", "--local-dir", m("ro") / "dl"], ()),
    "local-dir-full": (lambda d, m: ["pull", "org/model", "--local-dir", m("full") / "dl"], ()),
}


@pytest.mark.parametrize("name", sorted(HUB_CASES))
def test_pull_bad_hub(name, hub, tmp_path, mounts):
    """Pull (P's area) when the Hub serves corrupt bytes, lacks the repo or revision, or the
    destination cannot be written."""
    args, words = HUB_CASES[name]
    argv = args(tmp_path, mounts)
    expect_clean_failure(argv, tmp_path, words, env={"HF_ENDPOINT": hub.url}, allowed=PULL_RESUME_STATE)
    assert not list(tmp_path.rglob("model.gguf")), "an unverified download was left in place"


# ----------------------------------------------------------------------------- imatrix compute (#18)


def _corpus(d: Path, data: bytes) -> Path:
    p = d / "corpus.txt"
    p.write_bytes(data)
    return p


IMATRIX_COMPUTE_CASES: dict[str, tuple[Callable[[Path], list], tuple[str, ...]]] = {
    "corpus-missing": (lambda d: ["--corpus", d / "nope.txt"], ("nope.txt", "no such file")),
    "corpus-directory": (lambda d: ["--corpus", d], ("is a directory",)),
    "corpus-unknown-builtin": (lambda d: ["--corpus", "builtin:nope"], ("builtin:nope", "unknown built-in corpus")),
    "corpus-empty": (lambda d: ["--corpus", _corpus(d, b"")], ("corpus.txt", "is empty")),
    "corpus-whitespace": (lambda d: ["--corpus", _corpus(d, b"\n \n\t")], ("corpus.txt", "only whitespace")),
    "corpus-binary": (lambda d: ["--corpus", _corpus(d, b"GGUF\x03\x00\x00\x00" * 500)], ("corpus.txt", "binary")),
    "corpus-not-utf8": (lambda d: ["--corpus", _corpus(d, b"\xff\xfeh\x00i" * 500)], ("corpus.txt", "binary")),
    "corpus-latin1": (lambda d: ["--corpus", _corpus(d, "café ".encode("latin-1") * 500)], ("corpus.txt", "UTF-8")),
    "corpus-too-short-bytes": (lambda d: ["--corpus", _corpus(d, b"short text\n")], ("corpus.txt", "too short")),
    "corpus-too-short-tokens": (lambda d: ["--corpus", _corpus(d, b"the " * 300)],
                                ("corpus.txt", "too short")),
    "chunks-zero": (lambda d: ["--chunks", "0"], ("--chunks",)),
    "output-folder-missing": (lambda d: ["-o", d / "no" / "im.gguf"], ("does not exist",)),
}


@pytest.mark.parametrize("name", sorted(IMATRIX_COMPUTE_CASES))
def test_imatrix_compute_bad_input(name, world, tmp_path):
    """A corpus that is missing, empty, binary or too short, or an impossible output: one error
    line, no imatrix, no temporary folder, no llama-imatrix left running."""
    args, words = IMATRIX_COMPUTE_CASES[name]
    extra = args(tmp_path)
    out = [] if "-o" in extra else ["-o", tmp_path / "im.gguf"]
    argv = ["imatrix", "compute", world["model"], "--ctx-size", "512", "-t", "2", *out, *extra]
    expect_clean_failure(argv, tmp_path, words, roots=(tmp_path, world["dir"]), timeout=120)


@pytest.mark.parametrize("kind", ["ro", "full", "parent-is-file"])
def test_imatrix_compute_unwritable_output(kind, world, tmp_path, mounts):
    dst = _outdir(kind, tmp_path, mounts) / "im.gguf"
    expect_clean_failure(["imatrix", "compute", world["model"], "--chunks", "2", "-t", "2", "-o", dst], tmp_path,
                         ("im.gguf",), roots=(tmp_path, world["dir"]), timeout=120)


# ----------------------------------------------------------------------------- convert (from safetensors)


def _checkpoint_dir(d: Path, files: dict[str, bytes]) -> Path:
    (d / "ck").mkdir()
    for name, data in files.items():
        (d / "ck" / name).write_bytes(data)
    return d / "ck"


CONVERT_CASES: dict[str, tuple[Callable[[Path], list], tuple[str, ...]]] = {
    "no-such-directory": (lambda d: ["convert", d / "nothing", "-o", d / "m.gguf"], ("nothing",)),
    "no-config": (lambda d: ["convert", _checkpoint_dir(d, {"model.safetensors": b"\0" * 16}), "-o", d / "m.gguf"],
                  ("config.json",)),
    "not-safetensors": (lambda d: ["convert", _checkpoint_dir(d, {"config.json": b"{}", "model.safetensors":
                                                                  b"\xff" * 64}), "-o", d / "m.gguf"],
                        ("model.safetensors",)),
    "bad-outtype": (lambda d: ["convert", d, "-o", d / "m.gguf", "--outtype", "q4_k"], ("q4_k",)),
}


@pytest.mark.parametrize("name", sorted(CONVERT_CASES))
def test_convert_bad_input(name, tmp_path):
    args, words = CONVERT_CASES[name]
    expect_clean_failure(args(tmp_path), tmp_path, words)


def test_convert_without_the_extra_names_what_to_install(monkeypatch):
    import importlib.util

    from ggufmtp.errors import ConvertDependencyError
    from ggufmtp.hfconvert.convert import require_convert_deps

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "torch" else real(n, *a))
    with pytest.raises(ConvertDependencyError, match=r"pip install 'ggufmtp\[convert\]'"):
        require_convert_deps()


# ----------------------------------------------------------------------------- eval and head-sweep (#19)


EVAL_CASES: dict[str, tuple[Callable[[Path, dict], list], tuple[str, ...]]] = {
    "quant-missing": (lambda d, w: [w["model"], d / "nope.gguf"], ("nope.gguf",)),
    "other-architecture": (lambda d, w: [w["model"], w["dense"]], ("not a quantization of", "architecture")),
    "corpus-missing": (lambda d, w: [w["model"], w["art"], "--corpus", d / "nope.txt"], ("nope.txt",)),
    "corpus-too-short": (lambda d, w: [w["model"], w["art"], "--corpus", _corpus(d, b"the sea " * 40)],
                         ("corpus.txt", "too short")),
    "chunks-zero": (lambda d, w: [w["model"], w["art"], "--chunks", "0"], ("--chunks",)),
}


@pytest.mark.parametrize("name", sorted(EVAL_CASES))
def test_eval_bad_input(name, world, synth_model, tmp_path):
    """Missing files, models that are not one model, a too-short corpus: one error line, no
    llama-perplexity started, nothing cached."""
    args, words = EVAL_CASES[name]
    w = {**world, "dense": synth_model(SynthSpec(arch="qwen35"))}
    expect_clean_failure(["eval", *args(tmp_path, w)], tmp_path, words, roots=(tmp_path, world["dir"]), timeout=120)


def test_head_sweep_without_an_mtp_block(world, tmp_path):
    expect_clean_failure(["head-sweep", world["nomtp"], "-r", "q8_0-mtp", "--types", "Q8_0", "-o", tmp_path / "s"],
                         tmp_path, ("no MTP block",), roots=(tmp_path, world["dir"]), timeout=120)


@pytest.mark.parametrize("corpus, words", [("empty", ("corpus.txt", "is empty")),
                                           ("both", ("--imatrix", "--imatrix-corpus", "not both"))])
def test_run_imatrix_corpus_bad_input(corpus, words, world, tmp_path):
    """`run --imatrix-corpus` refuses a bad corpus (or both imatrix options) before writing anything."""
    extra = ["--imatrix-corpus", _corpus(tmp_path, b"")] if corpus == "empty" else \
        ["--imatrix", world["im_good"], "--imatrix-corpus", "builtin:calib-v1"]
    expect_clean_failure(["run", "-r", "q8_0-mtp", "-m", world["model"], "-o", tmp_path / "out", "--no-verify",
                          *extra], tmp_path, words, roots=(tmp_path, world["dir"]), timeout=120)
