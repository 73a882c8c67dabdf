"""The llama.cpp runtime: build it from the pinned sdist, find its binaries and its libllama.

One CMake build of the llama.cpp tree vendored in the llama-cpp-python sdist yields
``llama-server``, ``llama-quantize``, ``llama-imatrix``, ``llama-perplexity`` *and* the shared ``libllama`` that the
Python binding loads (through ``LLAMA_CPP_LIB_PATH``), so the binaries, the in-process quantizer
and every receipt share one llama.cpp commit.

This module uses only the standard library so ``tools/build_runtime.py`` can run it before the
package's dependencies are installed.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Callable

from ..constants import LLAMA_CPP_COMMIT, LLAMA_CPP_PYTHON_VERSION, RUNTIME_BINARIES
from ..errors import RuntimeMissingError, RuntimeBuildError

ENV_BIN = "GGUFMTP_LLAMA_CPP_BIN"
ENV_SDIST = "GGUFMTP_LLAMA_CPP_SDIST"
ENV_CACHE = "GGUFMTP_CACHE"
ENV_VARIANT = "GGUFMTP_RUNTIME_VARIANT"
RUNTIME_JSON = "runtime.json"
SDIST_NAME = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"

# x86 features read from /proc/cpuinfo, i.e. what the *kernel* enables. -march=native would
# follow CPUID instead, which on some VMs advertises AMX that the kernel never enabled: the AMX
# repack path then crashes (SIGSEGV in ggml_backend_amx_mul_mat). AMX is therefore never built.
_X86_FEATURES = {
    "GGML_SSE42": ("sse4_2",),
    "GGML_AVX": ("avx",),
    "GGML_AVX2": ("avx2",),
    "GGML_FMA": ("fma",),
    "GGML_F16C": ("f16c",),
    "GGML_BMI2": ("bmi2",),
    "GGML_AVX_VNNI": ("avx_vnni",),
    "GGML_AVX512": ("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd"),
    "GGML_AVX512_VBMI": ("avx512vbmi",),
    "GGML_AVX512_VNNI": ("avx512_vnni",),
    "GGML_AVX512_BF16": ("avx512_bf16",),
}


def cache_root() -> Path:
    """Per-user cache: ``$GGUFMTP_CACHE``, else ``$XDG_CACHE_HOME/ggufmtp``, else ``~/.cache/ggufmtp``."""
    if os.environ.get(ENV_CACHE):
        return Path(os.environ[ENV_CACHE]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "ggufmtp"


def variant_name(cuda: bool = False, cuda_arch: str = "90") -> str:
    return f"cuda-sm{cuda_arch}" if cuda else "cpu"


def runtime_dir(variant: str = "cpu", commit: str = LLAMA_CPP_COMMIT) -> Path:
    """Where a built runtime lives, e.g. ``~/.cache/ggufmtp/llama.cpp/0c1e570-cpu``."""
    return cache_root() / "llama.cpp" / f"{commit}-{variant}"


@dataclasses.dataclass(frozen=True)
class RuntimeInfo:
    """A built runtime: where its binaries and libllama are and how they were built."""

    bin_dir: Path
    commit: str
    variant: str
    build_flags: list[str]
    built_at: str
    amx: bool = False

    def binary(self, name: str) -> Path:
        return self.bin_dir / name

    @classmethod
    def load(cls, root: Path) -> "RuntimeInfo | None":
        meta = root / RUNTIME_JSON
        if not meta.is_file():
            return None
        data = json.loads(meta.read_text())
        bin_dir = root / "bin"
        if not all((bin_dir / b).is_file() for b in RUNTIME_BINARIES):
            return None
        return cls(
            bin_dir=bin_dir,
            commit=data["commit"],
            variant=data["variant"],
            build_flags=list(data.get("build_flags", [])),
            built_at=data.get("built_at", ""),
            amx=bool(data.get("amx", False)),
        )


# ----------------------------------------------------------------------------- discovery


def installed_runtime(variant: str | None = None) -> RuntimeInfo | None:
    """The cached runtime of ``variant`` (default: ``$GGUFMTP_RUNTIME_VARIANT``, then a CUDA
    build if one exists, then the CPU build)."""
    wanted = variant or os.environ.get(ENV_VARIANT)
    if wanted:
        return RuntimeInfo.load(runtime_dir(wanted))
    root = cache_root() / "llama.cpp"
    candidates = sorted(root.glob(f"{LLAMA_CPP_COMMIT}-cuda-*")) + [runtime_dir("cpu")]
    for cand in candidates:
        info = RuntimeInfo.load(cand)
        if info is not None:
            return info
    return None


def find_binary(name: str, explicit: str | os.PathLike | None = None) -> Path:
    """Locate a llama.cpp binary: an explicit path or directory, then ``$GGUFMTP_LLAMA_CPP_BIN``
    (a directory), then the ggufmtp cache, then ``PATH``."""
    for source, where in (("option", explicit), (ENV_BIN, os.environ.get(ENV_BIN))):
        if not where:
            continue
        p = Path(where).expanduser()
        cand = p / name if p.is_dir() else p
        if cand.is_file() and os.access(cand, os.X_OK):
            return cand
        raise RuntimeMissingError(
            f"{name}: not found at {cand} (given by {source}); point it at the directory holding the "
            f"llama.cpp binaries, or build them with `ggufmtp runtime build`"
        )
    info = installed_runtime()
    if info is not None:
        return info.binary(name)
    on_path = shutil.which(name)
    if on_path:
        return Path(on_path)
    raise RuntimeMissingError(
        f"{name}: not found (no --llama-cpp-bin, no ${ENV_BIN}, nothing in {cache_root() / 'llama.cpp'}, "
        f"not on PATH); run `ggufmtp runtime build` (or `make test`, which builds it)"
    )


def binary_is_ggufmtp_build(path: Path) -> RuntimeInfo | None:
    """The runtime record of the ggufmtp build that ``path`` belongs to, if any."""
    root = path.resolve().parent.parent
    info = RuntimeInfo.load(root)
    if info is not None and path.resolve().parent == info.bin_dir.resolve():
        return info
    return None


def configure_libllama() -> Path | None:
    """Point llama-cpp-python at the cached runtime's libllama (same commit as the binaries)
    unless the user already chose one. Must run before ``llama_cpp`` is imported."""
    if os.environ.get("LLAMA_CPP_LIB_PATH"):
        return Path(os.environ["LLAMA_CPP_LIB_PATH"])
    info = installed_runtime()
    if info is not None and (info.bin_dir / "libllama.so").exists():
        os.environ["LLAMA_CPP_LIB_PATH"] = str(info.bin_dir)
        return info.bin_dir
    return None


def binary_version(path: Path, timeout: float = 30) -> dict:
    """``{"version", "build", "commit"}`` as the binary's ``--version`` reports them."""
    proc = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=timeout)
    text = proc.stdout + proc.stderr
    if "commit" not in text:
        # llama-quantize has no --version, but prints its build info before opening the input.
        probe = [str(path), "--dry-run", "/nonexistent/ggufmtp-version-probe.gguf", "Q8_0"]
        proc = subprocess.run(probe, capture_output=True, text=True, timeout=timeout)
        text = proc.stdout + proc.stderr
    m = re.search(r"version:\s*(\S+)\s*\(build\s*(\d+),\s*commit\s*([0-9a-fA-F]+|unknown)\)", text)
    if not m:
        return {"version": None, "build": None, "commit": None, "raw": text.strip()[:200]}
    return {"version": m.group(1), "build": int(m.group(2)), "commit": m.group(3)}


# ----------------------------------------------------------------------------- building


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    m = re.search(r"^flags\s*:\s*(.*)$", text, re.M)
    return set(m.group(1).split()) if m else set()


def cpu_cmake_flags() -> list[str]:
    """GGML ISA options for this CPU (see ``_X86_FEATURES``); AMX is always off."""
    flags = cpu_flags()
    if platform.machine() not in ("x86_64", "AMD64") or not flags:
        return ["-DGGML_NATIVE=ON"]
    out = ["-DGGML_NATIVE=OFF"]
    for opt, needs in _X86_FEATURES.items():
        out.append(f"-D{opt}={'ON' if all(n in flags for n in needs) else 'OFF'}")
    out += ["-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]
    return out


def cmake_flags(cuda: bool, cuda_arch: str) -> list[str]:
    flags = [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=ON",
        "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
        "-DCMAKE_INSTALL_RPATH=$ORIGIN",
        "-DLLAMA_CURL=OFF",
        "-DLLAMA_OPENSSL=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_TOOLS=ON",
        "-DLLAMA_BUILD_SERVER=ON",
        "-DLLAMA_BUILD_UI=OFF",
        "-DLLAMA_USE_PREBUILT_UI=OFF",
        f"-DLLAMA_BUILD_COMMIT={LLAMA_CPP_COMMIT}",
        "-DLLAMA_BUILD_NUMBER=1",
    ]
    flags += cpu_cmake_flags()
    if cuda:
        flags += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={cuda_arch}"]
    return flags


def fetch_sdist(log: Callable[[str], None] = print) -> Path:
    """The pinned llama-cpp-python sdist: ``$GGUFMTP_LLAMA_CPP_SDIST``, the cache, or PyPI."""
    if os.environ.get(ENV_SDIST):
        p = Path(os.environ[ENV_SDIST]).expanduser()
        if not p.is_file():
            raise RuntimeBuildError(f"{p}: ${ENV_SDIST} names no file")
        return p
    dest = cache_root() / "sdist"
    target = dest / SDIST_NAME
    if target.is_file():
        return target
    dest.mkdir(parents=True, exist_ok=True)
    log(f"fetching llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION} sdist from the package index ...")
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--no-build-isolation", f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}", "-d", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        got = Path(tmp) / SDIST_NAME
        if not got.is_file():
            # --no-build-isolation needs scikit-build-core for metadata; retry without it.
            cmd.remove("--no-build-isolation")
            proc = subprocess.run(cmd, capture_output=True, text=True)
        if not got.is_file():
            raise RuntimeBuildError(
                f"could not download {SDIST_NAME}: {(proc.stderr or proc.stdout).strip()[-500:]}"
            )
        os.replace(got, target)
    return target


def extract_llama_cpp(sdist: Path) -> Path:
    """Extract ``vendor/llama.cpp`` from the sdist once, into the cache (keyed by commit)."""
    src = cache_root() / "src" / LLAMA_CPP_COMMIT
    if (src / "CMakeLists.txt").is_file():
        return src
    prefix = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/"
    tmp = Path(tempfile.mkdtemp(dir=src.parent if src.parent.exists() else _mkdir(src.parent)))
    try:
        with tarfile.open(sdist) as tar:
            members = []
            for m in tar.getmembers():
                if m.name.startswith(prefix) and not m.name.startswith(prefix + "models/"):
                    m.name = m.name[len(prefix):]
                    if m.name:
                        members.append(m)
            tar.extractall(tmp, members=members, filter="data")
        if not (tmp / "CMakeLists.txt").is_file():
            raise RuntimeBuildError(f"{sdist}: no vendor/llama.cpp tree inside")
        os.replace(tmp, src)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return src


def _mkdir(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


def build_runtime(
    cuda: bool = False,
    cuda_arch: str = "90",
    jobs: int | None = None,
    force: bool = False,
    log: Callable[[str], None] = print,
) -> RuntimeInfo:
    """Build (or reuse) the runtime for this variant and install it into the cache."""
    variant = variant_name(cuda, cuda_arch)
    root = runtime_dir(variant)
    existing = RuntimeInfo.load(root)
    if existing is not None and not force:
        log(f"llama.cpp {existing.commit} ({variant}) already built: {existing.bin_dir}")
        return existing
    for tool in ("cmake",):
        if shutil.which(tool) is None:
            raise RuntimeBuildError(f"{tool} not found: install cmake and a C/C++ compiler first")
    sdist = fetch_sdist(log)
    src = extract_llama_cpp(sdist)
    build = _mkdir(cache_root() / "build" / f"{LLAMA_CPP_COMMIT}-{variant}")
    flags = cmake_flags(cuda, cuda_arch)
    jobs = jobs or os.cpu_count() or 2
    log(f"configuring llama.cpp {LLAMA_CPP_COMMIT} ({variant}) in {build}")
    _run(["cmake", "-S", str(src), "-B", str(build), *flags], build / "configure.log")
    targets = ["llama", *RUNTIME_BINARIES]
    log(f"building {', '.join(targets)} with {jobs} jobs (a few minutes) ...")
    _run(["cmake", "--build", str(build), "--config", "Release", "-j", str(jobs), "--target", *targets],
         build / "build.log")
    return _install(build / "bin", root, variant, flags, log)


def _run(cmd: list[str], logfile: Path) -> None:
    with open(logfile, "w") as fh:
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = logfile.read_text(errors="replace").splitlines()[-25:]
        raise RuntimeBuildError(f"`{' '.join(cmd[:3])} ...` failed (log: {logfile}):\n" + "\n".join(tail))


def _install(built: Path, root: Path, variant: str, flags: list[str], log: Callable[[str], None]) -> RuntimeInfo:
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=_mkdir(root.parent)))
    try:
        bin_dir = _mkdir(staging / "bin")
        for name in RUNTIME_BINARIES:
            shutil.copy2(built / name, bin_dir / name)
        for lib in built.glob("lib*.so*"):
            shutil.copy2(lib, bin_dir / lib.name, follow_symlinks=False)
        record = {
            "commit": LLAMA_CPP_COMMIT,
            "variant": variant,
            "llama_cpp_python": LLAMA_CPP_PYTHON_VERSION,
            "build_flags": flags,
            "amx": False,
            "compiler": _compiler_version(),
            "built_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }
        (staging / RUNTIME_JSON).write_text(json.dumps(record, indent=2) + "\n")
        if root.exists():
            shutil.rmtree(root)
        os.replace(staging, root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log(f"installed llama.cpp {LLAMA_CPP_COMMIT} ({variant}) into {root / 'bin'}")
    info = RuntimeInfo.load(root)
    assert info is not None
    return info


def _compiler_version() -> str:
    for cc in ("c++", "g++", "clang++"):
        if shutil.which(cc):
            out = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
            return out.splitlines()[0] if out else cc
    return "unknown"
