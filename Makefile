# Two commands do all the set-up: `make demo` and `make test` (both run `setup` first).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
IMAGE  ?= ghcr.io/kfp-ddp/kfp-ddp:0.1.0

.PHONY: setup test lint format demo bench compile image constraints clean

setup: $(STAMP)

# torch goes in first and alone: anything that depends on an unpinned torch would otherwise pull
# a multi-GB CUDA build. Everything else is pinned by constraints.txt.
$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 is required (set PYTHON=...)"'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt torch
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

test: setup
	$(PY) -m pytest

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

demo: setup
	$(PY) -m pipelines.demo

bench: setup
	$(PY) benchmarks/trainer_throughput.py
	$(PY) benchmarks/s3_sync.py

compile: setup
	$(VENV)/bin/kfp-ddp compile

image:
	docker build -t $(IMAGE) .

constraints: setup
	$(PY) -m pip freeze --exclude-editable | sed -E 's/\+(cpu|cu[0-9]+)$$//' > constraints.txt

clean:
	rm -rf $(VENV) demo-output .pytest_cache .ruff_cache
