"""The distribution works where users install it (#31): ``python -m build`` makes an sdist and a
wheel from the tracked files; the wheel, installed into a fresh virtual environment (no editable
install, no checkout on the path), carries its recipes, suites, corpus, schema and native source,
and runs inspect, plan, quantize with a shipped recipe, audit and a short verify from an empty
directory against the runtime ``ggufmtp runtime build`` made (nothing compiled twice).

The recipes' one home is the checkout's top-level ``recipes/`` (#42): the wheel carries them as
package data by build configuration, and an editable install (``pip install -e``) reads them
where they are, so a recipe added there is shipped without a copy.

The fresh environment gets the dependencies by a path entry to this environment's
site-packages (a ``.pth`` line adds the folder, it does not run that folder's own ``.pth`` files,
so the editable install of the checkout is not seen): the test is of the wheel, not of pip's
resolver, and needs no network.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

# Each test builds, installs or type-checks a distribution (seconds each): make test runs them,
# make test-fast does not.
pytestmark = pytest.mark.runtime

ROOT = Path(__file__).resolve().parents[1]
SHIPPED_RECIPES = {p.stem for p in (ROOT / "recipes").glob("*.toml")}
PACKAGE_DATA = ("ggufmtp/data/recipes/hifi-q4_k_m-mtp.toml", "ggufmtp/data/suites/chat-v1.jsonl",
                "ggufmtp/data/corpora/calib-v1.txt", "ggufmtp/data/receipt.schema.json",
                "ggufmtp/runtime/native/mtp_imatrix.cpp", "ggufmtp/py.typed")


def _tracked_tree(dest: Path) -> Path:
    """The tracked files of the checkout (what a clone has), copied: the build writes nothing here."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("dist")
    src = _tracked_tree(tmp / "src")
    out = tmp / "dist"
    p = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel", "-o", str(out), str(src)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    (wheel,) = out.glob("ggufmtp-*.whl")
    (sdist,) = out.glob("ggufmtp-*.tar.gz")
    return {"wheel": wheel, "sdist": sdist, "tmp": tmp}


def test_the_wheel_and_sdist_carry_the_package_data(dist):
    names = set(zipfile.ZipFile(dist["wheel"]).namelist())
    assert set(PACKAGE_DATA) <= names
    # every recipe of the top-level recipes/, as package data, and nothing of that folder elsewhere
    recipes = {n for n in names if n.startswith("ggufmtp/data/recipes/") and n.endswith(".toml")}
    assert {n.rsplit("/", 1)[1].removesuffix(".toml") for n in recipes} == SHIPPED_RECIPES
    assert len(SHIPPED_RECIPES) >= 5 and not [n for n in names if n.startswith("recipes/")]
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(dist["wheel"]).read(meta).decode()
    # the runtime's binding is pinned to the runtime's commit; the rest are ranges
    assert "Requires-Dist: llama-cpp-python==0.3.36" in text
    assert "Requires-Dist: numpy>=" in text
    entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "ggufmtp = ggufmtp.__main__:main" in zipfile.ZipFile(dist["wheel"]).read(entry).decode()
    import tarfile

    members = {m.split("/", 1)[1] for m in tarfile.open(dist["sdist"]).getnames() if "/" in m}
    assert set(PACKAGE_DATA) - {"ggufmtp/data/recipes/hifi-q4_k_m-mtp.toml"} <= members
    assert {"pyproject.toml", "setup.py", "recipes/hifi-q4_k_m-mtp.toml"} <= members  # the sdist builds the wheel


@pytest.fixture(scope="module")
def installed(dist) -> dict[str, Path]:
    """A fresh virtual environment with the wheel installed (not editable)."""
    venv = dist["tmp"] / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    purelib = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    (purelib / "ggufmtp-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    p = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q",
                        str(dist["wheel"])], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    work = dist["tmp"] / "empty"
    work.mkdir()
    return {"venv": venv, "py": py, "bin": venv / "bin" / "ggufmtp", "work": work, "purelib": purelib}


def _user_env(*drop: str) -> dict[str, str]:
    """This environment as a user's shell would have it: no PYTHONPATH (a developer's, naming the
    checkout, would shadow the installed package) and no activated virtual environment."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", *drop)}


def _run(installed: dict[str, Path], *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = _user_env()
    env["PATH"] = f"{installed['venv'] / 'bin'}:/usr/bin:/bin"
    return subprocess.run([str(installed["bin"]), *args], cwd=installed["work"], env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_the_installed_wheel_is_not_the_checkout(installed):
    p = subprocess.run([str(installed["py"]), "-c", "import ggufmtp, sys; print(ggufmtp.__file__)"],
                       cwd=installed["work"], env=_user_env(), capture_output=True, text=True, check=True)
    assert Path(p.stdout.strip()).is_relative_to(installed["purelib"]), p.stdout
    r = _run(installed, "recipe", "list", "--json")  # loads every shipped recipe
    assert r.returncode == 0, r.stderr
    assert {x["name"] for x in json.loads(r.stdout)} == SHIPPED_RECIPES
    p = subprocess.run([str(installed["py"]), "-c", "from ggufmtp.quant.recipe import recipes_dir; print(recipes_dir())"],
                       cwd=installed["work"], env=_user_env(), capture_output=True, text=True, check=True)
    assert Path(p.stdout.strip()) == installed["purelib"] / "ggufmtp" / "data" / "recipes"


def test_an_editable_install_reads_the_recipes_where_they_are(dist):
    """``pip install -e`` of a clone: the recipes are the clone's recipes/ itself (one added after the
    install is listed, no copy was made) and each loads."""
    src, venv = dist["tmp"] / "src", dist["tmp"] / "venv-editable"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    purelib = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    (purelib / "ggufmtp-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    p = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index",
                        "--no-build-isolation", "-q", "-e", str(src)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    q8 = (src / "recipes" / "q8_0-mtp.toml").read_text()
    (src / "recipes" / "added-later.toml").write_text(q8.replace('name = "q8_0-mtp"', 'name = "added-later"'))
    env = _user_env()
    work = dist["tmp"] / "empty-editable"
    work.mkdir()
    r = subprocess.run([str(venv / "bin" / "ggufmtp"), "recipe", "list", "--json"], cwd=work, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert {x["name"] for x in json.loads(r.stdout)} == SHIPPED_RECIPES | {"added-later"}
    p = subprocess.run([str(py), "-c", "import ggufmtp.quant.recipe as r; print(r.__file__); print(r.recipes_dir())"],
                       cwd=work, env=env, capture_output=True, text=True, check=True)
    assert [Path(x) for x in p.stdout.split()] == [src / "ggufmtp" / "quant" / "recipe.py", src / "recipes"]


# A user's script against the installed wheel (#42): with py.typed the annotations reach mypy, so a
# correct script checks clean and each wrong argument below is an error on its own line.
USER_SCRIPT_OK = """\
from pathlib import Path

import ggufmtp


def main() -> None:
    p: ggufmtp.Plan = ggufmtp.plan("builtin:tiny-qwen35moe", "q8_0-mtp")
    q: ggufmtp.QuantizeResult = ggufmtp.quantize(Path("in.gguf"), "q8_0-mtp", "out.gguf", progress=False)
    a: ggufmtp.AuditReport = ggufmtp.audit(q.output, "out.gguf.receipt.json")
    v: ggufmtp.VerifyResult = ggufmtp.verify(q.output, ggufmtp.VerifyOptions(draft_n_max=2), receipt="r.json")
    print(p.ok, a.ok, v.verdict)
"""
USER_SCRIPT_WRONG = """\
import ggufmtp

ggufmtp.plan(4, "q8_0-mtp")
ggufmtp.quantize("in.gguf", "q8_0-mtp", "out.gguf", progress="yes")
ggufmtp.audit("out.gguf", receipt=3.5)
ggufmtp.verify("out.gguf", {"draft_n_max": 2})
n: int = ggufmtp.plan("in.gguf", "q8_0-mtp").model
"""


EXAMPLE = ROOT / "docs" / "examples" / "quantize_verify_audit_card.py"  # the docs' 15-line script


def _user_mypy(py: Path, tmp_path: Path, *args: str) -> list[str]:
    """mypy (this environment's, run by ``py``, the interpreter of the environment under test, so
    it finds the package as installed there and no checkout) on a user's scripts in ``tmp_path``;
    returns the error lines."""
    env = _user_env("MYPYPATH")
    # ggufmtp's modules are followed; the third-party ones they import are not (Any): a minute less
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\nfollow_imports = skip\n\n[mypy-ggufmtp.*]\nfollow_imports = normal\n")
    p = subprocess.run([str(py), "-m", "mypy", "--no-incremental", "--no-error-summary", "--config-file", str(config),
                        "--cache-dir", str(tmp_path / "mypy-cache"), *args], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode in (0, 1), p.stdout + p.stderr  # 2: mypy itself failed
    return [m for m in p.stdout.splitlines() if ": error:" in m]


def test_the_wheel_s_annotations_reach_a_user_s_mypy(installed, tmp_path):
    """A user's script against the installed wheel: clean when correct, one error per wrong line;
    the docs' example script is clean under ``--strict``."""
    for name, text in (("ok.py", USER_SCRIPT_OK), ("wrong.py", USER_SCRIPT_WRONG), ("example.py", EXAMPLE.read_text())):
        (tmp_path / name).write_text(text)
    errors = _user_mypy(installed["py"], tmp_path, "ok.py", "wrong.py")
    assert not [m for m in errors if not m.startswith("wrong.py:")], errors  # ok.py checks clean
    assert {int(m.split(":")[1]) for m in errors} == {3, 4, 5, 6, 7}, errors
    assert _user_mypy(installed["py"], tmp_path, "--strict", "example.py") == []


@pytest.fixture(scope="module")
def make_venv(tmp_path_factory) -> dict[str, Path]:
    """The environment ``make setup`` makes, installed by the Makefile's own rule (its pip
    arguments, the editable mode among them) from a copy of the tracked files. Offline: the
    dependencies come by a path entry to this environment (as for the wheel), pip runs with
    ``--no-deps --no-index`` (its environment variables), and the runtime's binding counts as installed."""
    tmp = tmp_path_factory.mktemp("make")
    src = _tracked_tree(tmp / "src")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    purelib = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    (purelib / "ggufmtp-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (venv / ".llama-cpp-python").touch()  # the binding: this environment's, through the path entry
    # pip's own settings from the environment (PIP_NO_BUILD_ISOLATION=0 is --no-build-isolation)
    env = {**os.environ, "PIP_NO_DEPS": "1", "PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0"}
    p = subprocess.run(["make", "-C", str(src), f"VENV={venv}", f"{venv}/.installed"], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return {"src": src, "py": py}


def test_a_user_s_mypy_strict_sees_the_package_in_the_make_venv(make_venv, tmp_path):
    """#51: in the ``make`` environment a user's mypy could not find the package (setuptools'
    editable finder is an import hook, invisible to mypy). Now the docs' example checks clean under
    ``--strict``, and a wrong argument is an error: the annotations are read, not skipped."""
    p = subprocess.run([str(make_venv["py"]), "-c", "import ggufmtp; print(ggufmtp.__file__)"], cwd=tmp_path,
                       env=_user_env(), capture_output=True, text=True,
                       check=True)
    assert Path(p.stdout.strip()) == make_venv["src"] / "ggufmtp" / "__init__.py"  # the checkout, editable
    (tmp_path / "example.py").write_text(EXAMPLE.read_text())
    (tmp_path / "wrong.py").write_text('import ggufmtp\n\nggufmtp.quantize("m.gguf", "Q8_0", "o.gguf", threads=2)\n')
    assert _user_mypy(make_venv["py"], tmp_path, "--strict", "example.py") == []
    errors = _user_mypy(make_venv["py"], tmp_path, "--strict", "wrong.py")
    assert len(errors) == 1 and 'Unexpected keyword argument "threads"' in errors[0], errors


def readme_quickstart() -> list[list[str]]:
    """The README's quickstart commands, each split into its arguments (without ``ggufmtp``)."""
    import shlex

    text = (ROOT / "README.md").read_text()
    block = text.split("<!-- quickstart:begin -->", 1)[1].split("<!-- quickstart:end -->", 1)[0]
    lines = [ln.strip() for ln in block.splitlines() if ln.strip().startswith("ggufmtp ")]
    assert len(lines) >= 5
    return [shlex.split(ln)[1:] for ln in lines]


def test_the_readme_quickstart_runs_from_the_installed_wheel(installed):
    """The README's quickstart, line by line, as a user runs it: the installed wheel, an empty
    directory, the runtime `ggufmtp runtime build` made. Its result is the demo's: the head verified
    at 100% acceptance, the verdict pass, the audit clean, the gate open."""
    out = {}
    # the README's install lines after pip: the runtime is found, not built again, and doctor is happy
    for argv in (["runtime", "build"], ["doctor"]):
        r = _run(installed, *argv)
        assert r.returncode == 0, (argv, r.stdout[-2000:], r.stderr[-2000:])
        assert "building llama" not in (r.stdout + r.stderr)
    for argv in readme_quickstart():
        r = _run(installed, *argv)
        assert r.returncode == 0, (argv, r.stdout[-2000:], r.stderr[-2000:])
        assert "Traceback" not in r.stderr
        out[argv[0]] = r.stdout
    assert "blk.4" in out["inspect"] and "nextn.eh_proj" in out["plan"]
    # the shipped recipe the receipt names judged the run, on the whole suite: a publishable verdict
    assert "thresholds from recipe hifi-q4_k_m-mtp" in out["verify"] and "verdict: PASS" in out["verify"]
    assert "MTP head: acceptance 100.0 %" in out["verify"] and "(publishable" in out["verify"]
    assert "verdict follows from the figures: pass" in out["audit"]
    assert out["audit"].rstrip().splitlines()[-1].startswith("PASS")
    assert "dry run" in out["upload"].lower() and "NOT VERIFIED" not in out["upload"]
    assert {p.name for p in installed["work"].iterdir()} >= {"tiny-mtp.gguf", "tiny-mtp.gguf.receipt.json", "README.md"}
