# Everything a fresh machine needs, in two targets: `make demo` and `make test` (README.md).
SHELL := /bin/bash
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.frscope-installed

.PHONY: demo test check lint typecheck importlint unit venv clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch comes from pip's cache after the first install (several GB: the CUDA build runs on the CPU)
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

# A real 4-rank gloo job on loopback that hangs; frscope collects every rank's recorder and stacks
# while it is blocked and prints the diagnosis. No cluster needed.
demo: $(STAMP)
	$(BIN)/frscope demo $(DEMO_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check frscope tests bench scripts

typecheck: $(STAMP)
	$(BIN)/mypy

importlint: $(STAMP)
	$(BIN)/lint-imports

check: lint typecheck importlint

test: check
	$(BIN)/pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
