"""A test-only offloading spec that runs vLLM's ``OffloadingConnector`` on a CPU build.

vLLM's ``CPUOffloadingSpec.get_worker`` refuses the CPU platform ("CPU Offloading is
currently only supported on CUDA-alike and XPU GPUs"): its worker copies with CUDA
streams and events. The connector loads out-of-tree specs
(``kv_connector_extra_config``: ``spec_name``, ``spec_module_path``), so this module keeps
everything of ``CPUOffloadingSpec`` on the scheduler side (the real
``CPUOffloadingManager``: lookups, LRU, evictions, events, vLLM's own metrics) and replaces
only the worker: :class:`HostCopyWorker` copies the pages between the engine's KV cache
tensors and a host buffer with torch indexing and reports each job as vLLM's worker does,
``TransferResult(job_id, success, transfer_size=bytes, transfer_time=seconds)``, the
seconds timed around the copy (the stand-in for the CUDA events on the copy stream).

Usage (the module must be importable in every vLLM process: put its folder on
``PYTHONPATH``)::

    kv_connector_extra_config={"cpu_bytes_to_use": 1 << 22,
                               "spec_name": "HostCopyOffloadingSpec",
                               "spec_module_path": "cpu_offloading"}
"""

from __future__ import annotations

import time

import torch
from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec


class HostCopyWorker(OffloadingWorker):
    """Copies whole pages GPU-tier tensor <-> host buffer, one chunk per GPU block."""

    def __init__(self, kv_caches: CanonicalKVCaches, num_chunks: int,
                 blocks_per_chunk: int) -> None:
        if blocks_per_chunk != 1:
            raise ValueError(f"HostCopyWorker: blocks_per_chunk={blocks_per_chunk}; this "
                             "test worker copies one GPU block per host chunk")
        self.device: list[torch.Tensor] = []
        self.host: list[torch.Tensor] = []
        for canonical in kv_caches.tensors:
            pages = canonical.tensor.view(torch.int8).view(-1, canonical.page_size_bytes)
            self.device.append(pages)
            self.host.append(torch.zeros((num_chunks, canonical.page_size_bytes),
                                         dtype=torch.int8))
        self.page_bytes = sum(int(t.shape[1]) for t in self.device)
        self.finished: list[TransferResult] = []
        self.jobs = {"store": 0, "load": 0}

    def _copy(self, job_id: int, src: list[torch.Tensor], src_ids: list[int],
              dst: list[torch.Tensor], dst_ids: list[int]) -> bool:
        if len(src_ids) != len(dst_ids):
            self.finished.append(TransferResult(job_id, False))
            return True
        started = time.perf_counter()
        src_index = torch.as_tensor(src_ids, dtype=torch.long)
        dst_index = torch.as_tensor(dst_ids, dtype=torch.long)
        for source, destination in zip(src, dst, strict=True):
            destination.index_copy_(0, dst_index, source.index_select(0, src_index))
        seconds = time.perf_counter() - started
        self.finished.append(TransferResult(job_id, True, len(src_ids) * self.page_bytes,
                                            seconds))
        return True

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec,
                     dst_spec: LoadStoreSpec) -> bool:
        self.jobs["store"] += 1
        return self._copy(job_id, self.device, list(src_spec.block_ids),
                          self.host, list(dst_spec.block_ids))  # type: ignore[attr-defined]

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec,
                    dst_spec: GPULoadStoreSpec) -> bool:
        self.jobs["load"] += 1
        return self._copy(job_id, self.host, list(src_spec.block_ids),  # type: ignore[attr-defined]
                          self.device, list(dst_spec.block_ids))

    def get_finished(self) -> list[TransferResult]:
        finished, self.finished = self.finished, []
        return finished

    def wait(self, job_ids: set[int]) -> None:
        return  # every copy completes inside its submit call


class HostCopyOffloadingSpec(CPUOffloadingSpec):
    """``CPUOffloadingSpec`` with :class:`HostCopyWorker` as its worker (CPU builds)."""

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            self._worker = HostCopyWorker(  # type: ignore[assignment]
                kv_caches, self.num_chunks, self.blocks_per_chunk)
        return self._worker  # type: ignore[return-value]
