"""An offloading spec that runs vLLM's ``OffloadingConnector`` on vLLM's CPU build, for
:mod:`benchmarks.vllm_engine_overhead` (benchmarks do not import the tests; the engine
tests keep their own, ``tests/engines/vllm032/cpu_offloading.py``).

vLLM's ``CPUOffloadingSpec.get_worker`` refuses the CPU platform (its worker copies with
CUDA streams), and the connector loads out-of-tree specs (``kv_connector_extra_config``:
``spec_name``, ``spec_module_path``). :class:`HostCopyOffloadingSpec` keeps everything of
``CPUOffloadingSpec`` on the scheduler side (the real ``CPUOffloadingManager``) and
replaces only the worker, which copies whole pages between the engine's KV cache tensors
and a host buffer with torch indexing, synchronously, and reports each job as vLLM's
worker does (``TransferResult(job_id, success, bytes, seconds)``). vLLM imports the module
by name: its folder must be on the engine process's path.
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
    """Copies whole pages engine tensor <-> host buffer, one GPU block per host chunk."""

    def __init__(self, kv_caches: CanonicalKVCaches, num_chunks: int,
                 blocks_per_chunk: int) -> None:
        if blocks_per_chunk != 1:
            raise ValueError(f"HostCopyWorker: blocks_per_chunk={blocks_per_chunk}, not 1")
        self.device = [c.tensor.view(torch.int8).view(-1, c.page_size_bytes)
                       for c in kv_caches.tensors]
        self.host = [torch.zeros((num_chunks, c.page_size_bytes), dtype=torch.int8)
                     for c in kv_caches.tensors]
        self.page_bytes = sum(int(t.shape[1]) for t in self.device)
        self.finished: list[TransferResult] = []

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
        self.finished.append(TransferResult(job_id, True, len(src_ids) * self.page_bytes,
                                            time.perf_counter() - started))
        return True

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec,
                     dst_spec: LoadStoreSpec) -> bool:
        return self._copy(job_id, self.device, list(src_spec.block_ids),
                          self.host, list(dst_spec.block_ids))  # type: ignore[attr-defined]

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec,
                    dst_spec: GPULoadStoreSpec) -> bool:
        return self._copy(job_id, self.host, list(src_spec.block_ids),  # type: ignore[attr-defined]
                          self.device, list(dst_spec.block_ids))

    def get_finished(self) -> list[TransferResult]:
        finished, self.finished = self.finished, []
        return finished

    def wait(self, job_ids: set[int]) -> None:
        return  # every copy completes inside its submit call


class HostCopyOffloadingSpec(CPUOffloadingSpec):
    """``CPUOffloadingSpec`` with :class:`HostCopyWorker` as its worker."""

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            self._worker = HostCopyWorker(  # type: ignore[assignment]
                kv_caches, self.num_chunks, self.blocks_per_chunk)
        return self._worker  # type: ignore[return-value]
