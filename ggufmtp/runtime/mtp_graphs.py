"""Which GGUF architectures the pinned llama.cpp drafts with, read off the source it compiles.

An architecture drafts with ``--spec-type draft-mtp`` when its model class builds the
``LLM_GRAPH_TYPE_DECODER_MTP`` graph. At 0c1e570 each architecture is a class
``llama_model_<x>`` (``src/models/models.h``), created in ``src/llama-model.cpp``
(``case LLM_ARCH_X: return new llama_model_<x>(params);``) and named in ``src/llama-arch.cpp``
(``{ LLM_ARCH_X, "name" }``); its graph comes from ``llama_model_<x>::build_arch_graph`` in
``src/models/*.cpp``, or from its base class's when it does not define one (``mistral4`` defines its
own and drafts with nothing, though its base ``deepseek2`` drafts). So the set is: the classes whose
own ``build_arch_graph`` returns a graph for ``LLM_GRAPH_TYPE_DECODER_MTP``, plus their subclasses
that inherit it, mapped to architecture names. ``grep -l DECODER_MTP src/models/*.cpp`` finds 15
files at 0c1e570, but glm5-next's branch throws "GLM5-Next NextN graph not implemented yet": 14
architectures draft.

The runtime build records the set in ``runtime.json`` (``mtp_architectures``);
:data:`ggufmtp.constants.MTP_ARCHITECTURES` is the project's view, and a test fails when they differ.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import RuntimeBuildError

MTP_GRAPH = "LLM_GRAPH_TYPE_DECODER_MTP"
#: the version of this reader: a runtime.json recorded by another version is read again
READER_VERSION = 2

_ARCH_NAME = re.compile(r'\{\s*LLM_ARCH_(\w+)\s*,\s*"([^"]+)"\s*\}')
_ARCH_CLASS = re.compile(r"case\s+LLM_ARCH_(\w+)\s*:\s*return\s+new\s+llama_model_(\w+)\s*\(")
_CLASS_BASE = re.compile(r"struct\s+llama_model_(\w+)\s*:\s*public\s+llama_model_(\w+)\s*\{")
_GRAPH_DEF = re.compile(r"llama_model_(\w+)::build_arch_graph\s*\([^)]*\)\s*const\s*\{")


def _read(src: Path, rel: str) -> str:
    path = src / rel
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise RuntimeBuildError(f"{path}: cannot read the llama.cpp source ({e.strerror})") from None


def _body(text: str, open_brace: int) -> str:
    """The text of the ``{...}`` block that opens at ``open_brace`` (braces balanced)."""
    depth = 0
    for i in range(open_brace, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[open_brace:i + 1]
    return text[open_brace:]


def builds_mtp_graph(body: str) -> bool:
    """Whether a ``build_arch_graph`` body builds a graph for ``LLM_GRAPH_TYPE_DECODER_MTP``: its
    branch for that type returns one (glm5-next's at 0c1e570 throws "NextN graph not implemented yet")."""
    at = body.find(MTP_GRAPH)
    if at < 0:
        return False
    brace = body.find("{", at)
    branch = _body(body, brace) if brace >= 0 else ""
    return "return" in branch and "throw" not in branch


def graph_classes(src: Path) -> dict[str, bool]:
    """``x`` -> whether ``llama_model_<x>::build_arch_graph`` (defined in ``src/models/*.cpp``) builds
    the MTP graph."""
    found: dict[str, bool] = {}
    for cpp in sorted((src / "src" / "models").glob("*.cpp")):
        text = _read(src, str(cpp.relative_to(src)))
        for m in _GRAPH_DEF.finditer(text):
            found[m.group(1)] = found.get(m.group(1), False) or builds_mtp_graph(_body(text, m.end() - 1))
    return found


def _drafts(cls: str, graphs: dict[str, bool], bases: dict[str, str]) -> bool:
    seen: set[str] = set()
    while cls not in graphs and cls in bases and cls not in seen:  # inherits its base's graph
        seen.add(cls)
        cls = bases[cls]
    return graphs.get(cls, False)


def mtp_architectures(src: Path) -> frozenset[str]:
    """The GGUF architecture names whose graph in the llama.cpp tree ``src`` has an MTP draft path."""
    names = dict(_ARCH_NAME.findall(_read(src, "src/llama-arch.cpp")))
    classes = dict(_ARCH_CLASS.findall(_read(src, "src/llama-model.cpp")))
    bases = dict(_CLASS_BASE.findall(_read(src, "src/models/models.h")))
    graphs = graph_classes(src)
    if not names or not classes or not graphs:
        raise RuntimeBuildError(f"{src}: not a llama.cpp tree this reader understands "
                                f"(architectures {len(names)}, model classes {len(classes)}, graphs {len(graphs)})")
    return frozenset(names[arch] for arch, cls in classes.items() if arch in names and _drafts(cls, graphs, bases))
