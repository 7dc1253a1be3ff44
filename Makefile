# Two commands on a fresh clone: `make test` and `make demo`. Each sets up .venv itself.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0

.PHONY: venv install browser test lint demo bench clean

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

# The web pages' tests drive a headless Chromium through its chromedriver, both from the system's packages.
# Installed here when missing and the machine allows it (root with apt); otherwise those tests skip and say why.
browser:
	@if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing chromium and chromium-driver (apt) for the browser tests"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null) \
			|| echo "could not install chromium: the browser tests will be skipped"; \
	else echo "no chromium/chromedriver and no root apt to install them: the browser tests will be skipped"; fi

# -rs lists why tests were skipped (no browser, for instance)
test: install browser
	$(BIN)/python -m pytest -n 2 -rs tests

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
