# Two entry points: `make run` (set up, then the main job) and `make test` (set up, then the suite).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup run test

$(BIN)/hf-tfm: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# Pinned: a CPU wheel on these machines, PyPI's build elsewhere. An unpinned torch pulls gigabytes.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[test]"
	touch $@

setup: $(BIN)/hf-tfm

run: setup
	$(BIN)/hf-tfm demo --output-dir runs/demo

test: setup
	$(BIN)/python -m pytest -n 2 -q tests
