"""Engine suites run inside their own venvs (.venv-vllm, .venv-lmcache, .venv-sglang).

The main test run collects none of them directly: tests/adapters/test_engine_suites.py
runs each suite with its venv's interpreter and asserts it passed.
"""

import importlib.util

SUITES = {"vllm033": "vllm", "lmcache056": "lmcache", "sglang0523": "sglang"}

collect_ignore_glob = [f"{suite}/*" for suite, module in SUITES.items()
                       if importlib.util.find_spec(module) is None]
