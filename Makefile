# kvobs developer entry points. `make demo` and `make test` are the two commands
# the README promises: each does its own set-up on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: demo test setup deps lint bench mutants

$(BIN)/kvobs: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

setup: $(BIN)/kvobs

demo: setup
	$(BIN)/kvobs demo

# Everything the tests talk to for real: each scripts/deps/*.sh installs one
# component (Prometheus, helm, engine venvs, ...) idempotently under .tools/ or .venv-*.
deps: setup
	@for script in scripts/deps/*.sh; do echo "== $$script"; bash $$script || exit 1; done

test: deps
	$(BIN)/python -m pytest

lint: setup
	$(BIN)/ruff check kvobs kernels dashboards tests benchmarks scripts
	$(BIN)/mypy
	$(BIN)/mypy dashboards
	cd kernels && ../$(BIN)/mypy --strict --ignore-missing-imports --explicit-package-bases .

bench: deps
	$(BIN)/python benchmarks/recorder_overhead.py
	$(BIN)/python benchmarks/swap_bandwidth.py
	.venv-vllm/bin/python benchmarks/vllm_overhead.py

# Each event the vLLM adapters record, doubled and dropped, must fail an engine test
# (about 25 min; run before a submission that touches kvobs/adapters/vllm).
mutants: deps
	$(BIN)/python scripts/mutation_check.py
