"""The data-parallel rank kvobs labels and places an engine's endpoints by, read from
vLLM's real ``ParallelConfig`` as each of vLLM's engine-core paths leaves it.

A dense model's DP ranks are independent engines: vLLM's ``run_engine_core`` sets
``data_parallel_index`` to the rank and then ``reconfigure_for_independent_dp_rank``
resets ``data_parallel_rank`` to 0 (the worker gets that config, pickled). A MoE
model's ranks (``DPEngineCoreProc``) keep ``data_parallel_rank``. The end-to-end check
is ``test_vllm_net_benefit_dp.py``.
"""

from __future__ import annotations

import pickle
from types import SimpleNamespace
from typing import Any

import pytest

from kvobs.adapters.vllm.plugin import _dp_rank


def engine_config(rank: int, moe: bool) -> Any:
    """A config as rank ``rank``'s engine core (and, pickled, its worker) holds it."""
    from vllm.config import ParallelConfig

    parallel = ParallelConfig(data_parallel_size=2, distributed_executor_backend="mp")
    parallel.data_parallel_index = rank  # run_engine_core, every model
    if moe:
        parallel.data_parallel_rank = rank
    else:
        parallel.reconfigure_for_independent_dp_rank()
        assert parallel.data_parallel_rank == 0  # vLLM's reset, which kvobs must see past
    return SimpleNamespace(parallel_config=pickle.loads(pickle.dumps(parallel)))


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
@pytest.mark.parametrize("rank", [0, 1])
def test_each_dp_rank_reads_its_own_rank(rank: int, moe: bool) -> None:
    assert _dp_rank(engine_config(rank, moe)) == rank


def test_a_config_without_data_parallelism_is_rank_0() -> None:
    from vllm.config import ParallelConfig

    assert _dp_rank(SimpleNamespace(parallel_config=ParallelConfig())) == 0
    assert _dp_rank(None) == 0
