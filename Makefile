# Set-up is part of every target: a fresh clone needs only `make demo` / `make test`.
# Idempotent: the venv, the llama.cpp runtime (in ~/.cache/ggufmtp) and the install are reused.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
# llama-cpp-python is installed from the same sdist the runtime is built from, without building
# its own libllama: it loads the runtime's (LLAMA_CPP_LIB_PATH), so everything shares one commit.
LLAMA_CPP_PYTHON_CMAKE_ARGS := -DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF
PYTEST_ARGS ?=

.PHONY: setup runtime test test-fast lint docs demo clean-venv

$(PY):
	$(PYTHON) -m venv $(VENV)

runtime: $(PY)
	$(PY) tools/build_runtime.py

$(VENV)/.llama-cpp-python: | $(PY)
	$(MAKE) runtime
	CMAKE_ARGS="$(LLAMA_CPP_PYTHON_CMAKE_ARGS)" $(PIP) install "$$($(PY) tools/build_runtime.py --print-sdist)"
	touch $@

# editable_mode=compat: a .pth line naming the checkout, which mypy follows (a user's `mypy --strict`
# sees the package and its py.typed); setuptools' default editable finder is an import hook mypy
# cannot see. The recipes are then read from the checkout's recipes/ (ggufmtp.quant.recipe.recipes_dir).
EDITABLE := --config-settings editable_mode=compat

$(VENV)/.installed: pyproject.toml setup.py constraints.txt Makefile $(VENV)/.llama-cpp-python
	$(PIP) install -c constraints.txt $(EDITABLE) -e '.[test,convert,lint,docs,train,ladder]'
	touch $@

setup: runtime $(VENV)/.installed

test: setup
	@$(PY) -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "error: pytest collected no tests" >&2; exit 1; fi; exit $$rc

# The tests that start no llama.cpp process, load no libllama and take under ~1 s each (marker
# `runtime`, see tests/conftest.py): under 2 minutes on a 2-core machine. `make test` stays the whole suite.
test-fast: setup
	@$(PY) -m pytest -m "not runtime" $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "error: pytest collected no tests" >&2; exit 1; fi; exit $$rc

# ruff (lint) on the package, tests and tools; mypy on the package (its baseline is in pyproject.toml).
lint: setup
	$(VENV)/bin/ruff check ggufmtp tests tools benchmarks
	$(VENV)/bin/mypy ggufmtp

# The docs site (mkdocs-material; the CLI reference generated from the commands, the API from the
# docstrings) into site/, with warnings as errors (tests/test_docs.py builds it too).
docs: setup
	$(VENV)/bin/mkdocs build --strict -d site

# The whole pipeline on the built-in synthesized model: inspect, plan, quantize with the Hi-Fi
# recipe, audit, verify with llama-server (draft-mtp vs vanilla), receipt, card; summary printed.
DEMO_OUT ?= demo-out
demo: setup
	$(VENV)/bin/ggufmtp inspect builtin:tiny-qwen35moe
	$(VENV)/bin/ggufmtp run --recipe hifi-q4_k_m-mtp --model builtin:tiny-qwen35moe -o $(DEMO_OUT) \
		--imatrix-corpus builtin:calib-v1 --imatrix-chunks 4 --seeds 42,1337,2024 --max-tokens 64

clean-venv:
	rm -rf $(VENV)
