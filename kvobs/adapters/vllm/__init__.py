"""vLLM 0.33 adapters: the GPU tier, prefix lookups, the CPU offloading tier, transfers.

Each function wraps one engine object through an :class:`~kvobs.adapters.api.AdapterSpec`
table; :func:`instrument_scheduler` wraps all of them that a vLLM ``Scheduler`` holds
(the ``BlockPool``, the ``KVCacheManager``'s lookups and, with the offloading connector,
its ``CPUOffloadingManager`` and the transfers its scheduler side completes): what the
``vllm.general_plugins`` entry point uses. The worker side's transfer durations are
:func:`instrument_offloading_worker`.

Example:
    >>> from kvobs.recorder import Recorder
    >>> rec = Recorder(engine="vllm", model="llama-3-8b")
    >>> from kvobs.adapters.vllm import instrument_kv_cache_manager
    >>> inst = instrument_kv_cache_manager(scheduler.kv_cache_manager, rec)  # doctest: +SKIP
    >>> inst.unwrap()                                                     # doctest: +SKIP
"""

from kvobs.adapters.vllm.block_pool import BlockPoolInstrumentation, instrument_block_pool
from kvobs.adapters.vllm.capacity import gpu_tier_capacity, host_tier_capacity
from kvobs.adapters.vllm.connector import (
    ConnectorInstrumentation,
    instrument_connector_scheduler,
)
from kvobs.adapters.vllm.lookups import (
    ExternalHits,
    HostHits,
    LookupInstrumentation,
    instrument_lookups,
)
from kvobs.adapters.vllm.manager import (
    VllmInstrumentation,
    instrument_kv_cache_manager,
    instrument_scheduler,
)
from kvobs.adapters.vllm.offloading import (
    OffloadingInstrumentation,
    instrument_offloading_manager,
)
from kvobs.adapters.vllm.steps import StepInstrumentation, instrument_steps
from kvobs.adapters.vllm.transfers import TransferInstrumentation, instrument_offloading_worker

__all__ = [
    "BlockPoolInstrumentation",
    "ConnectorInstrumentation",
    "ExternalHits",
    "HostHits",
    "LookupInstrumentation",
    "OffloadingInstrumentation",
    "StepInstrumentation",
    "TransferInstrumentation",
    "VllmInstrumentation",
    "gpu_tier_capacity",
    "host_tier_capacity",
    "instrument_block_pool",
    "instrument_connector_scheduler",
    "instrument_kv_cache_manager",
    "instrument_lookups",
    "instrument_offloading_manager",
    "instrument_offloading_worker",
    "instrument_scheduler",
    "instrument_steps",
]
