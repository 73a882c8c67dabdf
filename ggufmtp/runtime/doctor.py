"""``ggufmtp doctor``: is everything ggufmtp needs here, and from the pinned llama.cpp commit?"""

from __future__ import annotations

import dataclasses
import os
import platform
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from .._version import __version__
from ..constants import LLAMA_CPP_COMMIT, LLAMA_CPP_PYTHON_VERSION, MTP_ARCHITECTURES, RUNTIME_BINARIES
from ..errors import RuntimeMissingError
from ..jsontypes import JsonObject
from ..runtime import build as runtime
from .hardware import read_cpu_model


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def server_help(path: Path, timeout: float = 30) -> str:
    proc = subprocess.run([str(path), "--help"], capture_output=True, text=True, timeout=timeout)
    return proc.stdout + proc.stderr


def offers_draft_mtp(help_text: str) -> bool:
    """Whether ``--spec-type`` lists ``draft-mtp`` (the flag was once called ``mtp``)."""
    m = re.search(r"--spec-type\b(.*?)(?=\n\s*-{1,2}[a-z]|\Z)", help_text, re.S)
    return bool(m and "draft-mtp" in m.group(1))


@dataclasses.dataclass
class LibllamaInfo:
    """The libllama llama-cpp-python loads here: its file, commit, where both came from, and
    whether it loads (else the error)."""

    path: str | None = None
    commit: str | None = None
    source: str | None = None
    loadable: bool = False
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class BinaryInfo:
    """One llama.cpp binary: its file and what its ``--version`` says (all None when it is missing)."""

    path: str | None
    commit: str | None
    version: str | None


@dataclasses.dataclass(frozen=True)
class CpuInfo:
    model: str
    machine: str
    cores: int | None
    features: list[str]


@dataclasses.dataclass(frozen=True)
class CudaInfo:
    available: bool
    devices: list[str]


@dataclasses.dataclass(frozen=True)
class RuntimeSummary:
    """The installed ggufmtp runtime, as the doctor reports it."""

    bin_dir: str
    variant: str | None
    commit: str | None
    build_flags: list[str]
    mtp_architectures: list[str]


def libllama_info() -> LibllamaInfo:
    """Which libllama llama-cpp-python loads here, and its commit.

    libllama itself does not export its commit (build info lives in llama.cpp's ``common``), so
    the commit comes from the runtime record beside a ggufmtp-built library, or from the
    llama.cpp commit vendored in the installed llama-cpp-python release."""
    lib_dir = runtime.configure_libllama()
    info = LibllamaInfo()
    if lib_dir is not None:
        info.path = str(Path(lib_dir) / "libllama.so")
        rec = runtime.RuntimeInfo.load(Path(lib_dir).parent)
        info.commit = rec.commit if rec else None
        info.source = "ggufmtp runtime" if rec else "LLAMA_CPP_LIB_PATH"
    try:
        import llama_cpp  # noqa: F401  (loads libllama)

        info.loadable = True
        if info.path is None:
            info.path = str(Path(llama_cpp.__file__).parent / "lib" / "libllama.so")
            info.source = "llama-cpp-python wheel"
        if info.commit is None and _version("llama-cpp-python") == LLAMA_CPP_PYTHON_VERSION:
            info.commit = LLAMA_CPP_COMMIT
    except Exception as e:  # missing lib, ABI mismatch: report, do not crash the doctor
        info.error = f"{type(e).__name__}: {e}"
    return info


def cpu_info() -> CpuInfo:
    flags = runtime.cpu_flags()
    interesting = ["avx", "avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni",
                   "amx_tile", "amx_int8", "amx_bf16", "neon", "asimd"]
    return CpuInfo(model=read_cpu_model() or "", machine=platform.machine(), cores=os.cpu_count(),
                   features=[f for f in interesting if f in flags])


def cuda_info() -> CudaInfo:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return CudaInfo(available=False, devices=[])
    proc = subprocess.run([smi, "--query-gpu=name,memory.total,compute_cap", "--format=csv,noheader"],
                          capture_output=True, text=True)
    devices = [line.strip() for line in proc.stdout.splitlines() if line.strip()]
    return CudaInfo(available=proc.returncode == 0 and bool(devices), devices=devices)


@dataclasses.dataclass
class DoctorReport:
    ggufmtp_version: str
    python: str
    gguf_version: str | None
    llama_cpp_python_version: str | None
    llama_cpp_commit: str | None
    expected_commit: str
    libllama: LibllamaInfo
    binaries: dict[str, BinaryInfo]
    server_draft_mtp: bool
    cpu: CpuInfo
    cuda: CudaInfo
    runtime: RuntimeSummary | None
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> JsonObject:
        d = dataclasses.asdict(self)
        d["ok"] = self.ok
        return d


def _mtp_architecture_problems(info: runtime.RuntimeInfo | None) -> list[str]:
    """Where the runtime's source drafts with other architectures than ggufmtp recognises."""
    if info is None or not info.mtp_architectures or info.mtp_architectures == MTP_ARCHITECTURES:
        return []
    extra, lacking = sorted(info.mtp_architectures - MTP_ARCHITECTURES), sorted(MTP_ARCHITECTURES - info.mtp_architectures)
    return [f"{info.bin_dir.parent}: the runtime's llama.cpp drafts with MTP on {len(info.mtp_architectures)} "
            f"architectures, ggufmtp recognises {len(MTP_ARCHITECTURES)} (runtime only: {', '.join(extra) or '-'}; "
            f"ggufmtp only: {', '.join(lacking) or '-'}); this ggufmtp was not made for this llama.cpp"]


def run_doctor(llama_cpp_bin: str | None = None) -> DoctorReport:
    problems: list[str] = []
    lib = libllama_info()
    if not lib.loadable:
        problems.append(f"llama-cpp-python cannot load libllama ({lib.error}); run `make test` or "
                        f"`ggufmtp runtime build`, or reinstall llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}")
    elif lib.commit != LLAMA_CPP_COMMIT:
        problems.append(f"libllama commit is {lib.commit}, expected {LLAMA_CPP_COMMIT}")
    binaries: dict[str, BinaryInfo] = {}
    draft_mtp = False
    for name in RUNTIME_BINARIES:
        try:
            path = runtime.find_binary(name, llama_cpp_bin)
        except RuntimeMissingError as e:
            binaries[name] = BinaryInfo(path=None, commit=None, version=None)
            problems.append(str(e))
            continue
        ver = runtime.binary_version(path)
        binaries[name] = BinaryInfo(path=str(path), commit=ver.get("commit"), version=ver.get("version"))
        if ver.get("commit") != LLAMA_CPP_COMMIT:
            problems.append(f"{path}: built from commit {ver.get('commit')}, expected {LLAMA_CPP_COMMIT}; "
                            f"run `ggufmtp runtime build`")
        if name == "llama-server":
            draft_mtp = offers_draft_mtp(server_help(path))
            if not draft_mtp:
                problems.append(f"{path}: --spec-type does not offer draft-mtp; this llama-server cannot run MTP")
    info = runtime.installed_runtime()
    problems += _mtp_architecture_problems(info)
    gguf_version = _version("gguf")
    if gguf_version is None:
        problems.append("the gguf package is not installed")
    return DoctorReport(
        ggufmtp_version=__version__,
        python=sys.version.split()[0],
        gguf_version=gguf_version,
        llama_cpp_python_version=_version("llama-cpp-python"),
        llama_cpp_commit=lib.commit,
        expected_commit=LLAMA_CPP_COMMIT,
        libllama=lib,
        binaries=binaries,
        server_draft_mtp=draft_mtp,
        cpu=cpu_info(),
        cuda=cuda_info(),
        runtime=None if info is None else RuntimeSummary(bin_dir=str(info.bin_dir), variant=info.variant,
                                                         commit=info.commit, build_flags=info.build_flags,
                                                         mtp_architectures=sorted(info.mtp_architectures)),
        problems=problems,
    )


def format_doctor(r: DoctorReport) -> str:
    mark = lambda ok: "ok " if ok else "!! "  # noqa: E731
    lines = [
        f"ggufmtp            {r.ggufmtp_version}",
        f"python             {r.python}",
        f"gguf               {r.gguf_version}",
        f"llama-cpp-python   {r.llama_cpp_python_version}",
        f"{mark(r.llama_cpp_commit == r.expected_commit)}libllama        {r.llama_cpp_commit}  "
        f"({r.libllama.source}: {r.libllama.path})",
    ]
    for name, b in r.binaries.items():
        lines.append(f"{mark(b.commit == r.expected_commit)}{name:<15} {b.commit}  ({b.path})")
    lines.append(f"{mark(r.server_draft_mtp)}draft-mtp       {'offered' if r.server_draft_mtp else 'NOT offered'} by llama-server")
    if r.runtime and r.runtime.mtp_architectures:
        archs = r.runtime.mtp_architectures
        agree = set(archs) == MTP_ARCHITECTURES
        lines.append(f"{mark(agree)}mtp graphs      {len(archs)} architectures"
                     f"{', as ggufmtp recognises' if agree else ', NOT the ones ggufmtp recognises'}")
    lines.append(f"cpu                {r.cpu.model} ({r.cpu.cores} cores; {' '.join(r.cpu.features)})")
    lines.append(f"cuda               {'; '.join(r.cuda.devices) if r.cuda.available else 'not available'}")
    if r.problems:
        lines.append("")
        lines += [f"problem: {p}" for p in r.problems]
    else:
        lines.append("\nall good")
    return "\n".join(lines)
