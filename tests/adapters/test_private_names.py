"""Every private engine name an adapter reads has a reason on the docs page, and every
reason names one still read (scripts/private_names.py scans the adapters)."""

from __future__ import annotations

import importlib.util

import pytest

from tests.required import REPO


def private_names():
    spec = importlib.util.spec_from_file_location("private_names",
                                                  REPO / "scripts/private_names.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("engine", ["vllm", "sglang", "lmcache"])
def test_every_private_name_read_has_a_reason_and_every_reason_is_read(engine):
    module = private_names()
    assert set(module.scan()[engine]) == set(module.REASONS[engine])


def test_the_scan_finds_attribute_reads_and_dotted_paths_in_strings(tmp_path):
    """What the scan counts as touching a private name: an attribute read and a name in a
    spec's dotted path; kvobs's own marks (``_kvobs...``) are not the engine's."""
    module = private_names()
    source = tmp_path / "adapter.py"
    source.write_text('x = manager._free_list\nSTATE = ("a._num_chunks", "_policy.get")\n'
                      'FLAG = "_kvobs_hook"\nDOC = "not a path: _x y"\n')
    assert sorted(n for n in module._touched(source) if module._not_ours(n)) == [
        "_free_list", "_num_chunks", "_policy"]
