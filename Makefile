# Two commands: `make train` and `make test` (which runs `make lint`, ruff, first). Both set up .venv on first use.
# torch is installed before the package, pinned: left to the package's `torch>=2.11`, pip would take
# the newest build the index serves, which on PyPI is a multi-GB CUDA build.
# Which build TORCH_SPEC gets: with TORCH_INDEX set, the one that index serves. Without it,
# scripts/torch_args.py decides: on a machine with no NVIDIA driver, a CUDA build the configured
# indexes would serve is swapped for TORCH_CPU_INDEX's CPU build (when that index serves it); a CPU
# build they serve (a local CPU wheel, as on this project's CI) is installed as is.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
PYTEST_ARGS ?= -m "not gpu and not multigpu"
# `make test` runs test files in TEST_WORKERS pytest-xdist processes side by side (TEST_WORKERS=0: one process).
# Each test process runs torch on one thread (tests/conftest.py), so on CI's 2 cores one process leaves a core
# idle; whole files go to one worker (--dist loadfile), so a module's shared runs are made once. Files go out
# in collection order (--no-loadscope-reorder): xdist's default sends files with the fewest tests last, and
# those are the long end-to-end runs of tests/integration, which then finish alone.
TEST_WORKERS ?= 2

ifeq ($(strip $(TORCH_INDEX)),)
TORCH_ARGS = $$($(PY) scripts/torch_args.py "$(TORCH_SPEC)" "$(TORCH_CPU_INDEX)")
else
TORCH_ARGS = --index-url "$(TORCH_INDEX)" "$(TORCH_SPEC)"
endif

.PHONY: setup train lint test test-gpu clean clean-cache

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_ARGS)
	$(PY) -m pip install -q -e ".[test]"
	@# Read the installed signatures once, so that from the first run on a kwarg the library refuses
	@# fails without importing torch or transformers (align.core.signatures; timings: docs/provenance.md).
	-$(PY) -m align.tools.preflight allow_dirty=true > /dev/null 2>&1
	touch $@

train: setup
	$(PY) -m align.train $(ARGS)

# The rules are [tool.ruff] in pyproject.toml.
lint: setup
	$(PY) -m ruff check align tests bench scripts examples

test: lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS) tests

# The GPU suite on the GPU machine, in one command (docs/NOTES.md#measuring-on-the-gpu-machine). That
# machine has no venv (python3 with the carried wheels on PYTHONPATH); its image has pytest-xdist, and the
# suite's time is mostly compiling on the host, so test files run in GPU_WORKERS processes side by side.
GPU_PY ?= python3
GPU_WORKERS ?= 4
test-gpu:
	$(GPU_PY) -m pytest -q -m "gpu and not multigpu" -n $(GPU_WORKERS) --dist loadfile -p no:cacheprovider tests/gpu

# What runs leave in the checkout. align's caches are not here (align.core.caches): `make clean-cache`.
# .cache: a checkout's old encode and eval caches (they defaulted to the working directory).
clean:
	rm -rf outputs multirun .cache

# align's caches (encode, reference, eval, signatures, inductor): $ALIGN_CACHE_DIR, else
# $XDG_CACHE_HOME/align, else ~/.cache/align.
clean-cache:
	rm -rf "$${ALIGN_CACHE_DIR:-$${XDG_CACHE_HOME:-$$HOME/.cache}/align}"
