"""lmcache mutants: every event the lmcache adapter records, doubled and dropped."""

from __future__ import annotations

from mutants.common import (
    Mutant,
    counter_add,
    keys_argument,
    keyword,
    lookup_count,
    lookup_saved,
    recorder_call,
    transfer,
)

ADAPTER = "kvobs/adapters/lmcache"
SUITES = ((".venv-lmcache/bin/python", "tests/engines/lmcache056"),)


def mutants() -> list[Mutant]:
    backend, engine = f"{ADAPTER}/backend.py", f"{ADAPTER}/engine.py"
    lookup = "    inst.rec.lookup(tokens, host_hit=host, disk_hit=hit - host, keys=keys)"
    return [
        # the host tier (LocalCPUBackend and its memory allocator)
        *recorder_call("host.allocate", backend,
                       "    if obj is not None:\n        inst.tier.allocate(1)", "1"),
        *recorder_call("host.allocate(batched)", backend, "inst.tier.allocate(len(objs))",
                       "len(objs)"),
        *recorder_call("host.free(put)", backend,
                       "inst.tier.free(1)                 # the writer's", "1"),
        *recorder_call("host.store", backend, "inst.tier.store(1, keys=(key,))", "1"),
        *recorder_call("host.reuse", backend, "inst.tier.reuse(1, keys=(key,))", "1"),
        *recorder_call("host.free(read)", backend, "inst.tier.free(1, cached=True)", "1"),
        *recorder_call("host.reuse(batched)", backend,
                       "inst.tier.reuse(len(objs), keys=keys[: len(objs)])", "len(objs)"),
        *recorder_call("host.free(batched read)", backend,
                       "inst.tier.free(len(objs), cached=True)", "len(objs)"),
        *recorder_call("host.evict(remove)", backend, "inst.tier.evict(1, reason, keys=(key,))",
                       "1"),
        *recorder_call("host.allocate(evicted while read)", backend,
                       "memory stays in use\n        inst.tier.allocate(1)",
                       "1"),
        *recorder_call("host.evict(popped)", backend, 'owner.tier.evict(1, "capacity")', "1"),
        *recorder_call("host.free(dropped)", backend, "    owner.tier.free(1)\n", "1"),
        *counter_add("host.found", backend, "inst.found += int(hits)", "int(hits)"),
        # the reuse profile: chunks stored with no lookup (the answers), written
        *recorder_call("reuse.written", backend, "inst.rec.written((key.chunk_hash,))",
                       "(key.chunk_hash,)"),
        # lookups (LMCacheEngine.lookup)
        *recorder_call("lookup.tokens", engine, lookup, "tokens"),
        *keyword("lookup.host_hit", engine, lookup, "host_hit", "host"),
        *keyword("lookup.disk_hit", engine, lookup, "disk_hit", "hit - host"),
        *lookup_count(engine, lookup),
        # transfers (the GPU connector's copies) and LMCache's timings of them
        *transfer("offload", engine, "inst.offload.transfer(chunks, nbytes)", "chunks", "nbytes"),
        *transfer("onload", engine, "inst.onload.transfer(chunks, nbytes)", "chunks", "nbytes"),
        *recorder_call("offload.seconds", engine, "inst.offload.timed(seconds)", "seconds"),
        *recorder_call("onload.seconds", engine, "inst.onload.timed(seconds)", "seconds"),
        # the keys the thrash tracker classifies offloads by (every retrieval an onload)
        *keys_argument("host.reuse(batch)", backend,
                       "inst.tier.reuse(len(objs), keys=keys[: len(objs)])", "keys[: len(objs)]"),
        *keys_argument("host.reuse(get)", backend, "inst.tier.reuse(1, keys=(key,))", "(key,)",
                       "(key, key)"),
        *keys_argument("host.store", backend, "inst.tier.store(1, keys=(key,))", "(key,)"),
        # the verdict's saving: a lookup's hits at the prefill cost
        *lookup_saved(("host", "disk")),
    ]
