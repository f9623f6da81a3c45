# Set-up and entry points. `make demo` and `make test` work on a fresh clone: they create
# .venv, install torch (the CPU build) and guidedec with its dependencies, then run.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m guidedec generate --json-schema examples/person.schema.json --whitespace compact \
		--max-tokens 128 "A person, as JSON:" "The admin's user record:" "Describe a guest."

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/mypy

test: lint
	$(PY) -m pytest -n 2 --dist loadfile -q

bench: $(STAMP)
	$(PY) benchmarks/bench_apply.py
	$(PY) benchmarks/bench_decoder.py
	$(PY) benchmarks/bench_e2e.py

clean:
	rm -rf $(VENV) build dist .mypy_cache .ruff_cache .pytest_cache
