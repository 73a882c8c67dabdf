"""The llama.cpp runtime: build it from the pinned sdist, find its binaries and its libllama.

One CMake build of the llama.cpp tree vendored in the llama-cpp-python sdist yields
``llama-server``, ``llama-quantize``, ``llama-imatrix``, ``llama-perplexity`` *and* the shared ``libllama`` that the
Python binding loads (through ``LLAMA_CPP_LIB_PATH``), so the binaries, the in-process quantizer
and every receipt share one llama.cpp commit.

ggufmtp's own C++ tools (``NATIVE_TOOLS``, sources in ``ggufmtp/runtime/native/``, e.g.
``ggufmtp-mtp-imatrix``) are compiled against that runtime's libraries and the headers of the same
source tree, and installed into its bin dir (rpath ``$ORIGIN``). ``runtime.json`` records each
tool's source sha256, and each build is a file named for it (``native_file_name``): a runtime built
before a tool existed, or holding another version's build, gets this version's compiled beside it
on first use (seconds; ``ensure_native_tools``) without rebuilding llama.cpp. So do llama.cpp's own
binaries added after a runtime was built (``EXTRA_BINARIES``: ``llama-gguf-split``, ``llama-fit-params``):
``ensure_extra_binary`` builds that one target in the runtime's build folder (configured again with
the recorded flags when the cache lost it) and installs it into the bin dir. It also
records the architectures whose graph in that source drafts with MTP (``mtp_architectures``, read by
:mod:`.mtp_graphs`), which ``doctor`` and the tests compare with ggufmtp's own list.

This module uses only the standard library so ``tools/build_runtime.py`` can run it before the
package's dependencies are installed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import fcntl
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

from ..constants import EXTRA_BINARIES, LLAMA_CPP_COMMIT, LLAMA_CPP_PYTHON_VERSION, RUNTIME_BINARIES
from ..errors import RuntimeBuildError, RuntimeMissingError
from ..files.digest_cache import file_key
from ..files.fsutil import atomic_write_json
from ..files.hashing import sha256_file
from ..files.memo import JsonMemo
from .mtp_graphs import READER_VERSION, mtp_architectures

ENV_BIN = "GGUFMTP_LLAMA_CPP_BIN"
ENV_SDIST = "GGUFMTP_LLAMA_CPP_SDIST"
ENV_CACHE = "GGUFMTP_CACHE"
ENV_VARIANT = "GGUFMTP_RUNTIME_VARIANT"
RUNTIME_JSON = "runtime.json"
SDIST_NAME = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"

# ggufmtp's own C++ tools: installed name -> source file in ggufmtp/runtime/native/.
NATIVE_DIR = Path(__file__).resolve().parent / "native"
MTP_IMATRIX_TOOL = "ggufmtp-mtp-imatrix"
NATIVE_TOOLS = {MTP_IMATRIX_TOOL: "mtp_imatrix.cpp"}

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
    native_tools: dict[str, str] = dataclasses.field(default_factory=dict)  # tool -> source sha256
    #: the architectures whose graph in the compiled source drafts (:mod:`.mtp_graphs`); empty when
    #: a runtime built before ggufmtp recorded them has not been brought up to date yet
    mtp_architectures: frozenset[str] = frozenset()
    mtp_reader: int = 0  # the mtp_graphs reader version that recorded them

    def binary(self, name: str) -> Path:
        return self.bin_dir / (native_file_name(name) if name in NATIVE_TOOLS else name)

    @classmethod
    def load(cls, root: Path) -> RuntimeInfo | None:
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
            native_tools={k: str(v) for k, v in (data.get("native_tools") or {}).items()},
            mtp_architectures=frozenset(str(a) for a in data.get("mtp_architectures") or ()),
            mtp_reader=int(data.get("mtp_reader") or 0),
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


def find_binary(name: str, explicit: str | os.PathLike | None = None, build: bool = True) -> Path:
    """Locate a llama.cpp binary: an explicit path or directory, then ``$GGUFMTP_LLAMA_CPP_BIN`` (a
    directory), then the ggufmtp cache (``build=False``: not building an extra one it lacks), then ``PATH``."""
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
        if name in NATIVE_TOOLS:
            info = ensure_native_tools(info)
        if name in EXTRA_BINARIES:
            if not build and not info.binary(name).is_file():
                raise RuntimeMissingError(f"{name}: not in the runtime {info.bin_dir}; `ggufmtp runtime build` adds it")
            return ensure_extra_binary(info, name)
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
    """``{"version", "build", "commit"}`` as the binary's ``--version`` reports them.

    A CUDA build initializes the device to print its version (about a second on an H200), so a
    parsed answer is kept in ``versions.json`` of the cache root, keyed by the binary's path and
    file identity (device, inode, size, mtime, ctime: a rebuilt or replaced binary is asked again)."""
    try:
        key = f"{Path(path).resolve()}:{file_key(os.stat(path)).text()}"
    except OSError:
        key = None
    memo = JsonMemo(cache_root() / "versions.json", max_entries=256)
    known = memo.get(key) if key else None
    if isinstance(known, dict) and known.get("commit"):
        return known
    found = _ask_version(path, timeout)
    if key and found.get("commit"):
        memo.put(key, found)
    return found


def _ask_version(path: Path, timeout: float) -> dict:
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
        for name in EXTRA_BINARIES:  # a runtime built before one was added: extended, not rebuilt
            ensure_extra_binary(existing, name, log)
        return ensure_native_tools(existing, log)
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
    targets = ["llama", *RUNTIME_BINARIES, *EXTRA_BINARIES]
    log(f"building {', '.join(targets)} with {jobs} jobs (a few minutes) ...")
    _run(["cmake", "--build", str(build), "--config", "Release", "-j", str(jobs), "--target", *targets],
         build / "build.log")
    return _install(build / "bin", root, variant, flags, src, log)


def _run(cmd: list[str], logfile: Path) -> None:
    with open(logfile, "w") as fh:
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = logfile.read_text(errors="replace").splitlines()[-25:]
        raise RuntimeBuildError(f"`{' '.join(cmd[:3])} ...` failed (log: {logfile}):\n" + "\n".join(tail))


def _install(built: Path, root: Path, variant: str, flags: list[str], src: Path,
             log: Callable[[str], None]) -> RuntimeInfo:
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=_mkdir(root.parent)))
    try:
        bin_dir = _mkdir(staging / "bin")
        for name in RUNTIME_BINARIES + EXTRA_BINARIES:
            shutil.copy2(built / name, bin_dir / name)
        for lib in built.glob("lib*.so*"):
            shutil.copy2(lib, bin_dir / lib.name, follow_symlinks=False)
        # the tools are compiled into the staging dir, so the runtime appears with them or not at all
        native = {name: compile_native_tool(name, bin_dir, src, log) for name in NATIVE_TOOLS}
        record = {
            "commit": LLAMA_CPP_COMMIT,
            "variant": variant,
            "llama_cpp_python": LLAMA_CPP_PYTHON_VERSION,
            "build_flags": flags,
            "amx": False,
            "compiler": _compiler_version(),
            "built_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "native_tools": native,
            "mtp_architectures": sorted(mtp_architectures(src)), "mtp_reader": READER_VERSION,
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


# ----------------------------------------------------------------------------- ggufmtp's own C++ tools


# The optimisation of llama.cpp's own tools (CMake's Release flags): at -O2, GCC 12's "very cheap"
# vectoriser leaves the collector's accumulation loop (``acc[j] += x[j] * x[j]``, two float pointers
# that may alias) scalar, where llama-imatrix's, at -O3, is vectorised; the sums are the same either
# way (each element still adds its rows in order), only the time differs.
NATIVE_OPT_FLAGS = ("-O3", "-DNDEBUG")


def native_source_sha256(name: str) -> str:
    """sha256 of a native tool's source as shipped in the package and of the flags it is compiled
    with (what runtime.json records: a change of either recompiles the tool on first use)."""
    import hashlib

    h = hashlib.sha256(bytes.fromhex(sha256_file(NATIVE_DIR / NATIVE_TOOLS[name])))
    h.update(" ".join(NATIVE_OPT_FLAGS).encode())
    return h.hexdigest()


def _cxx() -> str:
    for cand in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if cand and shutil.which(cand):
            return cand
    raise RuntimeBuildError("no C++ compiler found (set $CXX or install g++): ggufmtp's native tools need one")


def native_file_name(name: str) -> str:
    """The file a runtime holds tool ``name`` in, named for its source and flags: two ggufmtp
    versions sharing one runtime (two venvs, a checkout beside an install) each keep their own
    build, none replaces the other's under a running process, and neither recompiles after the
    other ran. The names ggufmtp prints (progress, errors) stay ``name``."""
    return f"{name}-{native_source_sha256(name)[:16]}"


def native_compile_argv(name: str, bin_dir: Path, src: Path, out: Path) -> list[str]:
    """The compiler command for one tool: the headers of the pinned source tree (``src/`` for the
    staging header ``llama-ext.h``), the runtime's own shared libraries, rpath ``$ORIGIN``."""
    includes = [src / "common", src / "include", src / "ggml" / "include", src / "src", src / "vendor"]
    return [
        _cxx(), "-std=c++17", *NATIVE_OPT_FLAGS, "-DGGML_SHARED", "-DGGML_BACKEND_SHARED", "-DLLAMA_SHARED",
        *(f"-I{p}" for p in includes),
        str(NATIVE_DIR / NATIVE_TOOLS[name]), "-o", str(out),
        f"-L{bin_dir}", f"-Wl,-rpath-link,{bin_dir}", "-Wl,-rpath,$ORIGIN",
        # a CUDA runtime's libggml needs libcudart & co.; the tool never calls them itself
        "-Wl,--allow-shlib-undefined",
        "-lllama-common", "-lllama", "-lggml", "-lggml-base", "-lpthread",
    ]


def compile_native_tool(name: str, bin_dir: Path, src: Path, log: Callable[[str], None] = print) -> str:
    """Compile tool ``name`` into ``bin_dir`` (atomically: a temp file renamed into place) against
    the libraries already there; returns the source sha256 to record in runtime.json."""
    digest = native_source_sha256(name)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}-", dir=bin_dir)
    os.close(fd)
    try:
        log(f"compiling {name} against llama.cpp {LLAMA_CPP_COMMIT} in {bin_dir}")
        proc = subprocess.run(native_compile_argv(name, bin_dir, src, Path(tmp)), capture_output=True, text=True)
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-25:])
            raise RuntimeBuildError(f"compiling {NATIVE_DIR / NATIVE_TOOLS[name]} failed:\n{tail}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, bin_dir / native_file_name(name))
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return digest


def _native_current(info: RuntimeInfo, name: str) -> bool:
    exe = info.binary(name)  # named for this version's source: its existence says it is current
    return exe.is_file() and os.access(exe, os.X_OK)


@contextlib.contextmanager
def _runtime_lock(root: Path):
    """Serialises tool compilation between processes (tests, helpers) sharing one runtime."""
    try:
        fh = open(root / ".native.lock", "a")
    except OSError as e:
        raise RuntimeBuildError(f"{root}: cannot compile ggufmtp's native tools here ({e.strerror}); "
                                f"run `ggufmtp runtime build` as the runtime's owner") from None
    with fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _record_current(info: RuntimeInfo) -> bool:
    return info.mtp_reader == READER_VERSION and all(_native_current(info, n) for n in NATIVE_TOOLS)


def ensure_native_tools(info: RuntimeInfo, log: Callable[[str], None] = lambda m: None) -> RuntimeInfo:
    """Compile every native tool that ``info``'s runtime lacks or has from another source, and
    record it in runtime.json, with the MTP architectures of the source when the record lacks them.
    No llama.cpp rebuild: the libraries in the bin dir are linked as is."""
    if _record_current(info):
        return info
    root = info.bin_dir.parent
    with _runtime_lock(root):
        info = RuntimeInfo.load(root) or info  # another process may have compiled them meanwhile
        if _record_current(info):
            return info
        stale = [n for n in NATIVE_TOOLS if not _native_current(info, n)]
        src = source_tree(log)
        record = json.loads((root / RUNTIME_JSON).read_text())
        tools = dict(record.get("native_tools") or {})
        for name in stale:
            tools[name] = compile_native_tool(name, info.bin_dir, src, log)
        record["native_tools"] = tools
        record["mtp_architectures"] = sorted(mtp_architectures(src))
        record["mtp_reader"] = READER_VERSION
        atomic_write_json(root / RUNTIME_JSON, record)
    loaded = RuntimeInfo.load(root)
    assert loaded is not None
    return loaded


def ensure_extra_binary(info: RuntimeInfo, name: str, log: Callable[[str], None] = lambda m: None) -> Path:
    """``info``'s ``name`` (one of ``EXTRA_BINARIES``), built first when a runtime made before it was
    added lacks it: only that target is compiled, in the runtime's build folder (configured again
    with the runtime's recorded flags when that folder is gone or was configured from another
    source tree), then copied into the bin dir under its final name by a rename. Idempotent."""
    exe = info.bin_dir / name
    if exe.is_file() and os.access(exe, os.X_OK):
        return exe
    root = info.bin_dir.parent
    with _runtime_lock(root):
        if exe.is_file() and os.access(exe, os.X_OK):  # another process built it meanwhile
            return exe
        src = source_tree(log)
        build = _mkdir(cache_root() / "build" / f"{LLAMA_CPP_COMMIT}-{info.variant}")
        if not _configured_from(build, src):
            shutil.rmtree(build / "CMakeFiles", ignore_errors=True)
            (build / "CMakeCache.txt").unlink(missing_ok=True)
            log(f"configuring llama.cpp {LLAMA_CPP_COMMIT} ({info.variant}) in {build} for {name}")
            _run(["cmake", "-S", str(src), "-B", str(build), *info.build_flags], build / "configure.log")
        log(f"building {name} for the {info.variant} runtime (its own target only) ...")
        _run(["cmake", "--build", str(build), "--config", "Release", "-j", str(os.cpu_count() or 2),
              "--target", name], build / f"{name}.log")
        for src in [*sorted((build / "bin").glob("lib*.so*")), build / "bin" / name]:  # its own libraries first
            dest = info.bin_dir / src.name  # (libllama-fit-params-impl.so); one already there stays: a server maps it
            if src.name == name or not (dest.exists() or dest.is_symlink()):
                staged = info.bin_dir / f".{src.name}.partial-{os.getpid()}"
                shutil.copy2(src, staged, follow_symlinks=False)
                os.replace(staged, dest)
    return exe


def _configured_from(build: Path, src: Path) -> bool:
    """Whether ``build`` holds a CMake configuration of the source tree ``src``."""
    try:
        cache = (build / "CMakeCache.txt").read_text(errors="replace")
    except OSError:
        return False
    home = re.search(r"^CMAKE_HOME_DIRECTORY:INTERNAL=(.*)$", cache, re.M)
    return home is not None and Path(home.group(1)).resolve() == src.resolve()


def source_tree(log: Callable[[str], None] = lambda m: None) -> Path:
    """The pinned source tree (headers), extracted from the sdist again if the cache lost it."""
    src = cache_root() / "src" / LLAMA_CPP_COMMIT
    if (src / "include" / "llama.h").is_file() and (src / "src" / "llama-ext.h").is_file():
        return src
    return extract_llama_cpp(fetch_sdist(log))
