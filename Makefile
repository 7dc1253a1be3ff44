# Two commands on a fresh clone: `make test` and `make demo`. Each sets up .venv itself.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0

.PHONY: venv install test lint demo bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch first and pinned: an unpinned torch pulls the CUDA wheels. A torch that is already there
# (for example a user's CUDA build in a venv made with --system-site-packages) is kept.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q torch==$(TORCH_VERSION)
	$(BIN)/pip install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed

test: install
	$(BIN)/python -m pytest -n 2 tests

# ruff: lint rules and formatting, configured in pyproject.toml
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

demo: install
	$(BIN)/rlhfkit demo --output-dir runs/demo

bench: install
	$(BIN)/python bench/ppo_vs_trl.py

clean:
	rm -rf $(VENV) runs
