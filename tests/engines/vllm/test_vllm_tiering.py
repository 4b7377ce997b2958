"""vLLM 0.33 offloading tiering in a real loop: a real ``Scheduler`` whose offloading
connector runs ``TieringOffloadingSpec`` with a real file-system secondary tier in
``tmp_path``, and the real worker-side ``OffloadingConnector`` moving the data.

vLLM's ``CPUOffloadingWorker`` needs CUDA (it asserts its KV tensors are on a GPU), so
the worker side runs vLLM's own ``OffloadingConnectorWorker`` (job bookkeeping, worker
metadata, finished loads) over :class:`CpuCopyWorker`, a subclass of vLLM's
``OffloadingWorker`` base class that copies blocks between CPU tensors. Everything on
the scheduler side, the tiering manager and its file-system tier is vLLM's.

Truth comes from vLLM: the files its file-system tier wrote, the promotion jobs its
tiering manager has in flight, its own prefix-cache stats by hit source, its tiering
manager's counters (``vllm:kv_offload_tiering_*``: bytes and seconds written and read,
failed jobs), and the OffloadingEvents its CPU primary tier records (which chunks hold
data: the host tier's occupancy, stores and evictions).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
from vllm.config import set_current_vllm_config
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
    OffloadingConnector,
)
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_offload.base import (
    OffloadingWorker,
    ReqContext,
    TransferResult,
    make_offload_key,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.structured_output import StructuredOutputManager

from kvobs.adapters._hooks import AdapterError
from kvobs.adapters.vllm import plugin
from kvobs.adapters.vllm.manager import instrument_scheduler
from kvobs.adapters.vllm.tiering import (
    TierHits,
    instrument_tiering,
    secondary_tier_name,
    tiering_manager,
)
from kvobs.recorder import Recorder
from kvobs.testing import Conformance, capture_telemetry
from tests.engines.vllm.vllm_engine import (
    SCHEDULING,
    EngineDriver,
    StepRecord,
    _Launched,
    _nothing,
    build_vllm_config,
    gpu_block_ids,
    layer_specs,
    plan_kv_cache,
    runner_output,
)

BLOCK = 16


# -- the worker side ---------------------------------------------------------------------
class CpuCopyWorker(OffloadingWorker):
    """vLLM's ``OffloadingWorker`` contract on CPU: copies GPU block rows to host chunks
    and back (one GPU block per chunk), done at the next ``get_finished``.

    ``timed``: report ``transfer_time`` (as vLLM's CUDA-event timing does) or None.
    ``failing_loads``: that many of the next async loads fail (copy nothing, report
    ``success=False``: what vLLM 0.34's worker passes on as a failed job); their chunks
    are added to ``failed_load_chunks``.
    """

    def __init__(self, gpu: list[torch.Tensor], num_chunks: int, timed: bool = True) -> None:
        self.gpu = gpu
        self.host = [torch.zeros((num_chunks, t.shape[1]), dtype=t.dtype) for t in gpu]
        self.timed = timed
        self.done: list[TransferResult] = []
        self.submitted = 0
        self.failing_loads = 0
        self.failed_load_chunks = 0
        self.loaded_chunks = 0  # host chunks copied to the GPU

    def _copy(self, job_id: int, to_host: bool, gpu_ids: Any, chunk_ids: Any) -> bool:
        start = time.perf_counter()
        src_rows = torch.as_tensor(gpu_ids if to_host else chunk_ids, dtype=torch.long)
        dst_rows = torch.as_tensor(chunk_ids if to_host else gpu_ids, dtype=torch.long)
        nbytes = 0
        for gpu, host in zip(self.gpu, self.host, strict=True):
            src, dst = (gpu, host) if to_host else (host, gpu)
            dst[dst_rows] = src[src_rows]
            nbytes += len(src_rows) * src.shape[1]
        seconds = time.perf_counter() - start if self.timed else None
        self.done.append(TransferResult(job_id, True, nbytes, seconds))
        self.submitted += 1
        return True

    def submit_store(self, job_id: int, src_spec: Any, dst_spec: Any) -> bool:
        return self._copy(job_id, True, gpu_block_ids(src_spec, self.gpu), dst_spec.block_ids)

    def submit_load(self, job_id: int, src_spec: Any, dst_spec: Any,
                    expedited: bool = False) -> bool:
        if self.failing_loads and not expedited:
            self.failing_loads -= 1
            self.failed_load_chunks += len(src_spec.block_ids)
            self.done.append(TransferResult(job_id, False))
            return True
        self.loaded_chunks += len(src_spec.block_ids)
        return self._copy(job_id, False, gpu_block_ids(dst_spec, self.gpu), src_spec.block_ids)

    def get_finished(self) -> list[TransferResult]:
        done, self.done = self.done, []
        return done

    def wait(self, job_ids: set[int]) -> None:
        return None


def worker_connector(scheduler: Scheduler | None = None, timed: bool = True, *,
                     config: Any = None, kv_config: Any = None) -> OffloadingConnector:
    """vLLM's worker-side ``OffloadingConnector`` for ``scheduler``'s config (or
    ``config`` / ``kv_config``), its KV caches registered (CPU tensors shaped as the model
    runner's), over a CpuCopyWorker."""
    if scheduler is not None:
        config, kv_config = scheduler.vllm_config, scheduler.kv_cache_config
    with set_current_vllm_config(config):
        connector = OffloadingConnector(config, KVConnectorRole.WORKER, kv_config)
    side = connector.connector_worker
    assert side is not None
    num_chunks = int(side.spec.num_chunks)
    side.spec.get_worker = lambda kv_caches: CpuCopyWorker(  # type: ignore[method-assign]
        [t.tensor for t in kv_caches.tensors], num_chunks, timed)
    page = kv_config.kv_cache_groups[0].kv_cache_spec.page_size_bytes
    caches = {name: torch.zeros((kv_config.num_blocks, page), dtype=torch.int8)
              for group in kv_config.kv_cache_groups for name in group.layer_names}
    connector.register_kv_caches(caches)
    return connector


class WorkerLoop(EngineDriver):
    """:class:`EngineDriver` whose worker side is vLLM's worker-side connector: each
    batch binds the scheduler's connector metadata, starts loads, defers stores, and
    returns the finished loads and the worker metadata, as vLLM's model runner does.
    Stepped as the engine core steps it (:func:`step_with_batch_queue`): with async
    scheduling the workers run a batch before the batch ahead of it is processed."""

    def __init__(self, scheduler: Scheduler, connector: OffloadingConnector,
                 settle: bool = True) -> None:
        super().__init__(scheduler)
        self.connector = connector
        self.settle = settle  # let the file-system tier finish its I/O after each step
        self.disk_hits_by_vllm = 0
        self.host_hits_by_vllm = 0

    @property
    def busy(self) -> bool:
        manager = self.offloading_manager
        return bool(self.scheduler.has_requests() or manager.has_pending_work())

    def _launch(self) -> _Launched:
        """``schedule()`` and the workers' run of the batch: its model-runner output."""
        out = self.scheduler.schedule()
        self.observe_block_tables()
        meta = out.kv_connector_metadata
        connector = self.connector
        connector.handle_preemptions(meta)
        connector.bind_connector_metadata(meta)
        connector.start_load_kv(None)  # type: ignore[arg-type]  # unused by this connector
        connector.wait_for_save()
        failed: dict[str, set[str]] = {}
        if hasattr(connector, "get_transfer_results"):  # vLLM 0.34: failed loads too
            results = connector.get_transfer_results(out.finished_req_ids)
            recving = results.finished_recving
            failed["failed_recving"] = results.failed_recving
        else:
            _, recving = connector.get_finished(out.finished_req_ids)
        worker_meta = connector.build_connector_worker_meta()
        connector.clear_connector_metadata()
        ids = list(out.num_scheduled_tokens)
        runner = runner_output(ids, [self._sample(out, r) for r in ids],
                               KVConnectorOutput(finished_recving=recving or None,
                                                 kv_connector_worker_meta=worker_meta,
                                                 **failed))
        return _Launched(out, runner, [], [], _nothing, 0.0)

    def _process(self, launched: _Launched) -> StepRecord:
        """``update_from_output()`` of the oldest batch; vLLM's hits by source."""
        record = super()._process(launched)
        connector_hits = getattr(record.stats, "connector_prefix_cache_stats", None)
        if connector_hits is not None:
            self.disk_hits_by_vllm += connector_hits.hits_by_source.get(CacheHitSource.DISK, 0)
            self.host_hits_by_vllm += connector_hits.hits_by_source.get(CacheHitSource.HOST, 0)
        if self.settle:
            self.settle_tiers()
        return record

    def settle_tiers(self) -> None:
        """Wait for the file-system tier's I/O, then let vLLM's manager take the results
        (what its next lookup or store would do first)."""
        manager = self.offloading_manager
        if not hasattr(manager, "secondary_tiers"):
            return  # plain CPU offloading: nothing asynchronous beyond the worker
        with manager.lock:
            for tier in manager.secondary_tiers:
                tier.drain_jobs()
            manager._process_finished_jobs()

    # -- truth from vLLM --------------------------------------------------------------
    def disk_files(self, root: Path) -> int:
        """Chunks on disk: the block files vLLM's file-system tier wrote."""
        return sum(1 for p in root.rglob("*.bin"))

    def primary_state(self) -> tuple[int, int]:
        """Host ``(in_use, cached)`` chunks of the tiering manager's CPU primary tier."""
        m = self.offloading_manager.primary_tier
        allocated = m._num_allocated_chunks - len(m._free_list)
        return allocated - m._num_evictable_cache_chunks, m._num_evictable_cache_chunks

    def promotions_in_flight(self, tier_idx: int = 0) -> int:
        """Chunks of promotion jobs the tiering manager has not seen finish."""
        return sum(len(job.transfer_job.keys) for job in self.offloading_manager._jobs.values()
                   if job.transfer_job.is_promotion and job.tier_idx == tier_idx)


def tiering_scheduler(tmp_path: Path, *, gpu_blocks: int = 16, host_chunks: int = 8,
                      secondary: dict[str, Any] | None = None,
                      kv_events: bool = False, async_scheduling: bool = False) -> Scheduler:
    """A real Scheduler whose offloading connector runs ``TieringOffloadingSpec`` with a
    file-system tier under ``tmp_path / "fs"`` (or the ``secondary`` tier config);
    ``kv_events``: vLLM's KV cache events on (its tiers then record OffloadingEvents);
    ``async_scheduling``: the class vLLM's engine core then builds (``AsyncScheduler``)."""
    page = next(iter(layer_specs().values())).page_size_bytes * len(layer_specs())
    config = build_vllm_config(tmp_path, cpu_bytes=page * host_chunks,
                               max_model_len=(gpu_blocks - 1) * BLOCK, kv_events=kv_events,
                               async_scheduling=async_scheduling)
    extra = config.kv_transfer_config.kv_connector_extra_config  # type: ignore[union-attr]
    extra["spec_name"] = "TieringOffloadingSpec"
    extra["tier_poll_interval_s"] = 0  # serviced per step, as vLLM does without peers
    extra["secondary_tiers"] = [secondary or {
        "type": "fs", "root_dir": str(tmp_path / "fs"), "n_read_threads": 2,
        "n_write_threads": 2}]
    kv_config = plan_kv_cache(config, layer_specs(), gpu_blocks)
    config.cache_config.num_gpu_blocks = gpu_blocks
    scheduler_cls = config.scheduler_config.get_scheduler_cls()
    assert issubclass(scheduler_cls, Scheduler), scheduler_cls
    return scheduler_cls(config, kv_config, StructuredOutputManager(config), block_size=BLOCK,
                         log_stats=True)


def prompt(conversation: int, blocks: int) -> list[int]:
    """Distinct per conversation, the same tokens each time it comes back."""
    return [1000 * (conversation + 1) + i for i in range(blocks * BLOCK + 1)]


@pytest.fixture(params=[False, True], ids=["sync", "async"])
def loop(tmp_path, request):
    scheduler = tiering_scheduler(tmp_path, async_scheduling=request.param)
    driver = WorkerLoop(scheduler, worker_connector(scheduler))
    assert driver.batch_queue_size == (2 if request.param else 1)
    yield driver
    driver.offloading_manager.shutdown()


def test_the_file_system_tier_is_the_disk_tier(loop, tmp_path):
    manager = tiering_manager(loop.scheduler)
    assert manager is loop.offloading_manager
    (tier,) = manager.secondary_tiers
    assert secondary_tier_name(tier) == "disk"
    rec = Recorder(engine="vllm")
    inst = instrument_tiering(manager, rec, block_tokens=BLOCK)
    assert inst.active and list(inst.tiers) == ["disk"]
    disk = rec.snapshot().tier("disk")
    assert disk.block_bytes == tier.block_size_bytes
    import shutil
    assert disk.capacity_blocks == shutil.disk_usage(tmp_path / "fs").total // tier.block_size_bytes
    inst.unwrap()
    assert tier.submit_store.__func__ is type(tier).submit_store
    assert manager.prepare_load.__func__ is type(manager).prepare_load


def test_disk_tier_equals_vllm_at_every_step(loop, tmp_path):
    """Conversations overflow the 8-chunk host tier, are cascaded to disk, come back
    and are promoted from disk; kvobs's disk tier equals vLLM's files at every step."""
    manager = loop.offloading_manager
    rec = Recorder(engine="vllm")
    inst = instrument_tiering(manager, rec, block_tokens=BLOCK)
    root = tmp_path / "fs"
    kit = Conformance(rec, truth=lambda: {
        "disk": (loop.promotions_in_flight(), loop.disk_files(root) - loop.promotions_in_flight())})
    for turn in range(3):
        for conv in range(6):
            loop.add(f"c{conv}-t{turn}", prompt(conv, 3), max_tokens=2)
            for _ in range(400):
                if not loop.busy:
                    break
                loop.step()
                kit.check(f"turn {turn} conv {conv} step {loop.steps}")
    snap = kit.check("end")
    disk = snap.tier("disk")
    cascade, promote = snap.link("host", "disk"), snap.link("disk", "host")
    assert loop.disk_files(root) == 6 * 3  # every full block of every prompt
    assert cascade.blocks == disk.stores
    rewrites = disk.evictions["other"]
    assert disk.stores - rewrites == loop.disk_files(root)
    assert cascade.bytes == cascade.blocks * manager.secondary_tiers[0].block_size_bytes
    assert promote.blocks > 0 and disk.reuses == promote.blocks
    assert disk.in_use_blocks == 0 and disk.cached_blocks == loop.disk_files(root)
    assert promote.seconds > 0 and cascade.seconds > 0  # the tier's own job timings
    assert_transfers_are_vllms(loop, cascade, promote)
    # disk hits as vLLM's own prefix-cache stats attribute them
    assert loop.disk_hits_by_vllm > 0
    inst.unwrap()


def assert_transfers_are_vllms(loop: WorkerLoop, cascade: Any, promote: Any) -> None:
    """host <-> disk transfers equal what vLLM's tiering manager counted: bytes and the
    tier's job seconds each way, and no failed job."""
    loop.take_scheduler_stats()
    vllm = loop.vllm_tiering
    assert cascade.bytes == vllm["vllm:kv_offload_tiering_write_bytes"] > 0
    assert promote.bytes == vllm["vllm:kv_offload_tiering_read_bytes"] > 0
    assert cascade.seconds == pytest.approx(vllm["vllm:kv_offload_tiering_write_time"],
                                            rel=1e-9)
    assert promote.seconds == pytest.approx(vllm["vllm:kv_offload_tiering_read_time"],
                                            rel=1e-9)
    assert cascade.failures == promote.failures == 0
    assert "vllm:kv_offload_tiering_cascade_job_failures" not in vllm
    assert "vllm:kv_offload_tiering_promotion_job_failures" not in vllm


@SCHEDULING
def test_promotions_in_flight_are_in_use_between_steps(tmp_path, async_scheduling):
    scheduler = tiering_scheduler(tmp_path, async_scheduling=async_scheduling)
    loop = WorkerLoop(scheduler, worker_connector(scheduler), settle=False)
    try:
        rec = Recorder(engine="vllm")
        inst = instrument_tiering(loop.offloading_manager, rec, block_tokens=BLOCK)
        for conv in range(6):  # 18 chunks through an 8-chunk host tier: the first evicted
            loop.add(f"c{conv}", prompt(conv, 3), max_tokens=2)
            while loop.busy:
                loop.step()
                loop.settle_tiers()
        loop.add("again", prompt(0, 3), max_tokens=2)
        seen = 0
        for _ in range(50):
            if not loop.busy:
                break
            loop.step()
            in_flight = loop.promotions_in_flight()
            assert rec.snapshot().tier("disk").in_use_blocks == in_flight
            seen = max(seen, in_flight)
            time.sleep(0.01)
        assert seen > 0
        assert rec.snapshot().link("disk", "host").blocks >= 1
        inst.unwrap()
    finally:
        loop.offloading_manager.shutdown()


def test_disk_hits_match_vllm_hits_by_source(loop, tmp_path):
    rec = Recorder(engine="vllm")
    inst = instrument_tiering(loop.offloading_manager, rec, block_tokens=BLOCK)
    for conv in range(6):
        loop.add(f"c{conv}", prompt(conv, 3), max_tokens=2)
        loop.run()
    taken = {}
    recorded = inst.disk_hits.take  # what the lookup adapter takes at the stats call
    loop.add("again", prompt(0, 3), max_tokens=2)
    while loop.busy:
        loop.step()
        taken["again"] = taken.get("again", 0) + recorded("again")
    assert loop.disk_hits_by_vllm > 0
    assert taken["again"] == loop.disk_hits_by_vllm
    inst.unwrap()


def test_tier_hits_are_bounded():
    hits = TierHits(tokens_per_chunk=16, max_requests=2)
    for i in range(3):
        hits.add(f"r{i}", 1)
    assert (hits.take("r0"), hits.take("r1"), hits.take("r2")) == (0, 16, 16)


def test_disk_series_are_exported(loop, tmp_path):
    rec = Recorder(engine="vllm")
    inst = instrument_tiering(loop.offloading_manager, rec, block_tokens=BLOCK)
    for conv in range(6):
        loop.add(f"c{conv}", prompt(conv, 3), max_tokens=2)
        loop.run()
    with capture_telemetry(rec) as telemetry:
        assert telemetry.value("kvobs_block_stores_total", tier="disk") == 18
        assert telemetry.value("kvobs_transfer_blocks_total", src_tier="host",
                               dst_tier="disk") == 18
        assert telemetry.value("kvobs_tier_capacity_blocks", tier="disk") > 0
    inst.unwrap()


def test_not_a_tiering_manager_is_refused():
    with pytest.raises(AdapterError, match="TieringOffloadingManager"):
        instrument_tiering(object(), Recorder(), block_tokens=16)


@pytest.fixture(params=[False, True], ids=["sync", "async"])
def wide_host_loop(tmp_path, request):
    """A host tier (12 chunks) wider than the GPU pool (11 blocks): host hits happen."""
    scheduler = tiering_scheduler(tmp_path, gpu_blocks=12, host_chunks=12,
                                  async_scheduling=request.param)
    driver = WorkerLoop(scheduler, worker_connector(scheduler))
    yield driver
    driver.offloading_manager.shutdown()


class PrimaryEvents:
    """The chunks holding data in the tiering manager's CPU primary tier, by vLLM's own
    account: the OffloadingEvents that tier records (a chunk stored when its write or
    promotion lands, removed when evicted or its write failed), every one of them seen
    once whoever drains them (vLLM's connector, or :meth:`drain`)."""

    def __init__(self, primary: Any) -> None:
        self.primary = primary
        self.stored = self.removed = self.failed = 0
        self.holding: set[Any] = set()
        take = primary.take_events

        def taken() -> Any:
            for event in take():
                self.add(event)
                yield event

        primary.take_events = taken

    def add(self, event: Any) -> None:
        assert event.ownership is None  # the primary tier's own
        if not event.removed:
            self.stored += len(event.keys)
            self.holding.update(event.keys)
        elif event.metadata_only:  # a write that failed: it never held data
            self.failed += len(event.keys)
        else:
            self.removed += len(event.keys)
            self.holding.difference_update(event.keys)

    def drain(self) -> int:
        """Chunks holding data now (the events not drained yet taken first)."""
        for _ in self.primary.take_events():
            pass
        return len(self.holding)


@SCHEDULING
def test_tiering_host_tier_equals_the_primary_tier_s_events(tmp_path, async_scheduling):
    """The host tier's occupancy and counters against the CPU primary tier's own
    OffloadingEvents, not its fields: at every step, the chunks kvobs counts resident
    less those being written (vLLM's count of pending writes) are the chunks the events
    say hold data; at the end, the chunks stored by the events are kvobs's stores plus
    the promotions landed from disk, and the chunks removed are kvobs's evictions."""
    scheduler = tiering_scheduler(tmp_path, gpu_blocks=12, host_chunks=12, kv_events=True,
                                  async_scheduling=async_scheduling)
    loop = WorkerLoop(scheduler, worker_connector(scheduler))
    try:
        rec = Recorder(engine="vllm")
        inst = instrument_scheduler(loop.scheduler, rec)
        tiering = plugin._attach_tiering(loop.scheduler, rec, inst)
        assert inst.active and tiering is not None and tiering.active
        primary = loop.offloading_manager.primary_tier
        assert primary.events is not None  # vLLM records them with KV cache events on
        events = PrimaryEvents(primary)
        steps = 0
        for turn in range(3):
            for conv in (*range(6), 2):
                loop.add(f"c{conv}-t{turn}-{loop.steps}", prompt(conv, 3), max_tokens=2)
                for _ in range(400):
                    if not loop.busy:
                        break
                    loop.step()
                    steps += 1
                    host = rec.snapshot().tier("host")
                    holding = events.drain()
                    assert host.resident_blocks - primary._num_write_pending_chunks \
                        == holding, f"step {loop.steps}"
        snap = rec.snapshot()
        host = snap.tier("host")
        promoted = snap.link("disk", "host").blocks
        assert steps > 50 and events.removed > 0 and promoted > 0
        assert events.stored == host.stores + promoted
        assert events.removed == sum(host.evictions.values())
        assert events.failed == snap.link("gpu", "host").failures == 0
        tiering.unwrap()
        inst.unwrap()
    finally:
        loop.offloading_manager.shutdown()


def test_whole_scheduler_with_tiering_equals_vllm_at_every_step(wide_host_loop, tmp_path):
    """``instrument_scheduler`` + the plugin's tiering attach on a tiering scheduler: the
    host tier is the CPU primary tier (promotions and cascade reads included), gpu<->host
    transfers are counted, and lookups split host / disk hits as vLLM's hits_by_source."""
    loop = wide_host_loop
    rec = Recorder(engine="vllm")
    cost = 2e-5                           # a configured prefill cost, s/token
    rec.prefill_cost.set(cost)
    inst = instrument_scheduler(loop.scheduler, rec)
    assert inst.active
    assert [p.component for p in inst.parts] == [
        "vllm.block_pool", "vllm.kv_cache_manager", "vllm.cpu_offloading_manager",
        "vllm.scheduler_steps", "vllm.offloading_connector"]
    primary = loop.offloading_manager.primary_tier
    assert inst.part("vllm.cpu_offloading_manager").target is primary
    for alias in ("prepare_write", "complete_write", "complete_read", "prepare_read"):
        assert alias in inst.part("vllm.cpu_offloading_manager").wrapped_methods
    tiering = plugin._attach_tiering(loop.scheduler, rec, inst)
    assert tiering is not None and tiering.active
    root = tmp_path / "fs"

    def truth():
        in_flight = loop.promotions_in_flight()
        return {"gpu": loop.gpu_state(), "host": loop.primary_state(),
                "disk": (in_flight, loop.disk_files(root) - in_flight)}

    kit = Conformance(rec, truth=truth)
    overlapped = 0  # steps that ended with the next batch already scheduled (async)
    for turn in range(3):
        for conv in (*range(6), 2):  # back after 3 others: off the GPU, still on the host
            loop.add(f"c{conv}-t{turn}-{loop.steps}", prompt(conv, 3), max_tokens=2)
            for _ in range(400):
                if not loop.busy:
                    break
                loop.step()
                overlapped += bool(loop._batch_queue)
                kit.check(f"turn {turn} conv {conv} step {loop.steps}")
    assert (overlapped > 0) == (loop.batch_queue_size == 2), overlapped
    snap = kit.check("end")
    host, offload = snap.tier("host"), snap.link("gpu", "host")
    assert host.stores == offload.blocks > 0  # promotions are not stores
    assert snap.link("host", "gpu").blocks > 0 and snap.link("disk", "host").blocks > 0
    lookups = snap.lookups
    assert loop.disk_hits_by_vllm > 0 and loop.host_hits_by_vllm > 0
    assert lookups.disk_hit == loop.disk_hits_by_vllm
    assert lookups.host_hit == loop.host_hits_by_vllm
    assert lookups.host_hit + lookups.disk_hit == loop.connector_hits
    assert (lookups.tokens, lookups.gpu_hit) == (loop.prefix_queries, loop.prefix_hits)
    assert_transfers_are_vllms(loop, snap.link("host", "disk"), snap.link("disk", "host"))
    # the verdict's savings per tier: the tokens vLLM says each source served
    assert snap.benefit.prefill_cost_source == "configured"
    assert snap.benefit.host_saved_s == pytest.approx(loop.host_hits_by_vllm * cost, rel=1e-9)
    assert snap.benefit.disk_saved_s == pytest.approx(loop.disk_hits_by_vllm * cost, rel=1e-9)
    tiering.unwrap()
    inst.unwrap()
    for alias in ("prepare_write", "complete_write", "complete_read"):
        assert getattr(primary, alias).__func__ is getattr(type(primary), alias.replace(
            "write", "store").replace("read", "load"))


def test_chunks_a_deferred_release_holds_stay_in_use_until_vllm_releases_them(tmp_path):
    """vLLM 0.34: a failed promotion whose tier may still write its chunks is failed with
    ``defer_write_release`` (the keys leave the cache, the chunks stay write-pending, out
    of the free pool) and freed later by ``release_deferred_write``. The host tier's in
    use and its allocations less frees equal vLLM's own account at each point (vLLM 0.33
    frees a failed promotion at once: no deferred release to follow)."""
    scheduler = tiering_scheduler(tmp_path)
    loop = WorkerLoop(scheduler, worker_connector(scheduler))
    try:
        primary = loop.offloading_manager.primary_tier
        if not hasattr(primary, "defer_write_release"):
            assert not hasattr(primary, "release_deferred_write")
            return
        rec = Recorder(engine="vllm")
        instrument_scheduler(scheduler, rec)  # the host tier: the tiering's primary tier

        def agree(in_use: int) -> None:
            host = rec.snapshot().tier("host")
            assert loop.primary_state()[0] == host.in_use_blocks == in_use
            assert host.allocations - host.frees == in_use  # every free counted
        keys = [make_offload_key(i.to_bytes(8, "big"), 0) for i in range(3)]
        ctx = ReqContext(req_id="promoted")
        output = primary.prepare_write(keys, ctx)  # the promotion reserves host chunks
        assert output is not None and len(output.keys_to_store) == 3
        agree(3)
        chunk_ids = primary.defer_write_release(keys)  # its tier failed, may still write
        assert primary.num_deferred_release_chunks == 3
        agree(3)
        primary.release_deferred_write(iter(chunk_ids))  # the tier let go of them
        assert primary.num_deferred_release_chunks == 0
        agree(0)
    finally:
        loop.offloading_manager.shutdown()


def test_a_load_a_worker_reports_failed_counts_as_a_failure_not_a_transfer(wide_host_loop):
    """vLLM 0.34: a load job a worker reports failed (``failed_jobs``) still completes
    through ``complete_load``, which does not say it failed: kvobs counts its chunks as
    failed host -> GPU transfers, and only the chunks the worker copied as moved. (vLLM
    0.33's worker asserts every transfer succeeded: there is nothing to count.)"""
    loop = wide_host_loop
    worker = loop.connector.connector_worker.worker
    if not hasattr(OffloadingWorkerMetadata(), "failed_jobs"):
        return
    rec = Recorder(engine="vllm")
    inst = instrument_scheduler(loop.scheduler, rec)
    for turn in range(3):
        if turn == 1:
            worker.failing_loads = 2
        for conv in (*range(6), 2):
            loop.add(f"c{conv}-t{turn}", prompt(conv, 3), max_tokens=2)
            loop.run()
    onload = rec.snapshot().link("host", "gpu")
    assert worker.failing_loads == 0 and worker.failed_load_chunks > 0
    assert onload.failures == worker.failed_load_chunks
    assert onload.blocks == worker.loaded_chunks > 0
    inst.unwrap()
