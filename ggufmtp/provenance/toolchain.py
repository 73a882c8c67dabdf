"""The receipt's ``toolchain`` section: versions and build facts of everything that touched an artifact."""

from __future__ import annotations

import platform
import sys
from importlib import metadata

from .._version import __version__
from ..constants import LLAMA_CPP_COMMIT, LLAMA_CPP_PYTHON_VERSION
from .statement import Quantizer, ServerSection, Toolchain

__all__ = ["toolchain"]


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def toolchain(server: ServerSection | None = None) -> Toolchain:
    """Versions and build facts of everything that touched the artifact. The llama.cpp commit is
    the one of the libllama this process loaded (its runtime record, else the ``LLAMA_COMMIT`` of
    its build); ``pinned_commit`` appears when that is not the commit ggufmtp pins."""
    from ..runtime.build import cpu_flags
    from ..runtime.libllama import loaded_libllama  # loads libllama: quantize already has

    lib = loaded_libllama()
    quantizer: Quantizer = {
        "library": "libllama via llama-cpp-python",
        "llama_cpp_commit": lib.commit or "unknown",
        "variant": lib.variant,
        "build_flags": list(lib.build_flags),
    }
    if lib.commit != LLAMA_CPP_COMMIT:
        quantizer["pinned_commit"] = LLAMA_CPP_COMMIT
    flags = sorted(cpu_flags() & {"avx", "avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16",
                                  "avx_vnni", "amx_tile", "amx_int8", "amx_bf16"})
    compiler = lib.compiler
    return {
        "ggufmtp": __version__,
        "python": sys.version.split()[0],
        "gguf": _dist_version("gguf"),
        "llama_cpp_python": _dist_version("llama-cpp-python") or LLAMA_CPP_PYTHON_VERSION,
        "quantizer": quantizer,
        "server": server,
        "compiler": compiler,
        "cpu_flags": flags,
        "os": f"{platform.system()} {platform.release()} {platform.machine()}",
    }
