#!/usr/bin/env python3
"""Build llama-server, llama-quantize, llama-imatrix, llama-fit-params & co. and libllama from the pinned sdist.

Same as `ggufmtp runtime build`, but runnable before the package is installed (stdlib only):
    python3 tools/build_runtime.py [--cuda] [--cuda-arch 90] [--jobs N] [--force] [--print-lib-dir]
"""

import argparse
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Load ggufmtp.runtime.build without running ggufmtp/__init__.py, which imports the package's
# dependencies (numpy, gguf, ...): this script runs before they are installed.
_pkg = types.ModuleType("ggufmtp")
_pkg.__path__ = [str(ROOT / "ggufmtp")]
sys.modules.setdefault("ggufmtp", _pkg)

from ggufmtp.errors import GgufmtpError  # noqa: E402
from ggufmtp.runtime import build as runtime  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cuda", action="store_true", help="build with CUDA")
    ap.add_argument("--cuda-arch", default="90", help="CUDA architecture (default 90: H100/H200)")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--force", action="store_true", help="rebuild even if the cache has it")
    ap.add_argument("--print-lib-dir", action="store_true", help="only print the runtime's bin dir")
    ap.add_argument("--print-sdist", action="store_true", help="fetch the sdist and print its path")
    args = ap.parse_args()
    try:
        if args.print_sdist:
            print(runtime.fetch_sdist(log=lambda m: print(m, file=sys.stderr)))
            return 0
        info = runtime.build_runtime(args.cuda, args.cuda_arch, args.jobs, args.force,
                                     log=lambda m: print(m, file=sys.stderr))
    except GgufmtpError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.print_lib_dir:
        print(info.bin_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
