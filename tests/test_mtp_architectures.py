"""ggufmtp's MTP architectures are the pinned llama.cpp's (issue #30): the set is read off the source
the runtime compiles, recorded in runtime.json, and compared with ``MTP_ARCHITECTURES`` here, so an
upgrade that adds or drops one turns this red."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggufmtp.cli import main
from ggufmtp.constants import MTP_ARCHITECTURES
from ggufmtp.errors import RuntimeBuildError
from ggufmtp.runtime.build import RUNTIME_JSON, RuntimeInfo, ensure_native_tools, installed_runtime, source_tree
from ggufmtp.runtime.doctor import _mtp_architecture_problems
from ggufmtp.runtime.mtp_graphs import mtp_architectures


@pytest.fixture(scope="module")
def source() -> Path:
    """The pinned llama.cpp tree the runtime compiles (extracted from the sdist again if the cache lost it)."""
    return source_tree()


def test_the_pinned_source_drafts_with_exactly_the_architectures_ggufmtp_recognises(source):
    assert mtp_architectures(source) == MTP_ARCHITECTURES
    assert len(MTP_ARCHITECTURES) == 14 and "glm5-next" not in MTP_ARCHITECTURES


def test_a_graph_that_throws_for_mtp_does_not_draft(source):
    """glm5-next's build_arch_graph names LLM_GRAPH_TYPE_DECODER_MTP only to throw: grep counts 15
    files, 14 architectures draft. When upstream implements it, this fails and glm5-next joins."""
    text = (source / "src" / "models" / "glm5-next.cpp").read_text()
    assert "GLM5-Next NextN graph not implemented yet" in text
    assert "glm5-next" not in mtp_architectures(source)


def test_the_runtime_records_them_and_doctor_agrees(llama_server_bin):
    info = installed_runtime()
    assert info is not None and info.mtp_architectures == MTP_ARCHITECTURES
    r = CliRunner().invoke(main, ["doctor", "--json"])
    assert json.loads(r.output)["runtime"]["mtp_architectures"] == sorted(MTP_ARCHITECTURES)


def _tree(root: Path, models_h: str, model_cpp: str, arch_cpp: str, graphs: dict[str, str]) -> Path:
    (root / "src" / "models").mkdir(parents=True)
    (root / "src" / "models" / "models.h").write_text(models_h)
    (root / "src" / "llama-model.cpp").write_text(model_cpp)
    (root / "src" / "llama-arch.cpp").write_text(arch_cpp)
    for name, body in graphs.items():
        (root / "src" / "models" / f"{name}.cpp").write_text(body)
    return root


def _graph(cls: str, mtp: bool) -> str:
    inner = ("if (params.gtype == LLM_GRAPH_TYPE_DECODER_MTP) { return mtp(); }" if mtp else
             'if (params.gtype == LLM_GRAPH_TYPE_DECODER_MTP) { throw std::runtime_error("not yet"); }')
    return (f"std::unique_ptr<llm_graph_context> llama_model_{cls}::build_arch_graph(const llm_graph_params & params) const {{\n"
            f"    {inner}\n    return std::make_unique<graph>(*this, params);\n}}\n"
            f"// a later mention outside the function: LLM_GRAPH_TYPE_DECODER_MTP must not count for {cls}\n")


def test_a_subclass_inherits_its_base_graph_unless_it_defines_its_own(tmp_path):
    """What a new architecture would look like: ``child`` inherits ``base``'s MTP graph, ``own``
    overrides it without one (as mistral4 does over deepseek2), ``plain`` never had one."""
    src = _tree(
        tmp_path,
        models_h="struct llama_model_child : public llama_model_base2 {\n};\n"
                 "struct llama_model_own : public llama_model_base2 {\n};\n",
        model_cpp="".join(f"case LLM_ARCH_{a.upper()}: return new llama_model_{a}(params);\n"
                          for a in ("base2", "child", "own", "plain")),
        arch_cpp="".join(f'{{ LLM_ARCH_{a.upper()}, "{a}-name" }},\n' for a in ("base2", "child", "own", "plain")),
        graphs={"base2": _graph("base2", True), "own": _graph("own", False), "plain": _graph("plain", False)},
    )
    assert mtp_architectures(src) == {"base2-name", "child-name"}


def test_a_tree_it_cannot_read_is_one_clear_error(tmp_path):
    with pytest.raises(RuntimeBuildError, match="cannot read the llama.cpp source"):
        mtp_architectures(tmp_path)
    src = _tree(tmp_path / "t", "", "", "", {})
    with pytest.raises(RuntimeBuildError, match="not a llama.cpp tree this reader understands"):
        mtp_architectures(src)


def test_doctor_names_the_difference_when_the_runtime_drafts_with_others(llama_server_bin):
    info = installed_runtime()
    assert info is not None
    other = RuntimeInfo(**{**info.__dict__, "mtp_architectures": (MTP_ARCHITECTURES - {"step35"}) | {"new_arch"}})
    (problem,) = _mtp_architecture_problems(other)
    assert "runtime only: new_arch" in problem and "ggufmtp only: step35" in problem


def test_a_runtime_recorded_before_the_field_gets_it_without_a_rebuild(llama_server_bin, tmp_path):
    info = installed_runtime()
    assert info is not None
    copy = tmp_path / "rt"
    shutil.copytree(info.bin_dir.parent, copy, symlinks=True)
    record = json.loads((copy / RUNTIME_JSON).read_text())
    del record["mtp_architectures"], record["mtp_reader"]
    (copy / RUNTIME_JSON).write_text(json.dumps(record))
    old = RuntimeInfo.load(copy)
    assert old is not None and old.mtp_architectures == frozenset()
    assert ensure_native_tools(old).mtp_architectures == MTP_ARCHITECTURES
    assert json.loads((copy / RUNTIME_JSON).read_text())["mtp_architectures"] == sorted(MTP_ARCHITECTURES)
