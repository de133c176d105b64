# Two commands: `make train` and `make test`. Both set up .venv on first use.
# torch is installed before the package (LANDMINES 24): an unpinned torch would pull a multi-GB CUDA
# build; on a CUDA machine set TORCH_SPEC to the build you want.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?= -m "not gpu and not multigpu"

.PHONY: setup train test clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test]"
	@# Read the installed signatures once, so that a kwarg the library refuses fails in < 1 s from
	@# the first run on (align.signatures; a cold read imports torch and transformers: ~3 s).
	-$(PY) -m align.preflight allow_dirty=true > /dev/null 2>&1
	touch $@

train: setup
	$(PY) -m align.train $(ARGS)

test: setup
	$(PY) -m pytest -q $(PYTEST_ARGS) tests

clean:
	rm -rf outputs multirun .cache
