"""lmcache mutants: every event the lmcache adapter records, doubled and dropped."""

from __future__ import annotations

from mutants import common as m

ADAPTER = "kvobs/adapters/lmcache"
SUITES = ((".venv-lmcache/bin/python", "tests/engines/lmcache056"),)


def mutants() -> list[m.Mutant]:
    backend, engine = f"{ADAPTER}/backend.py", f"{ADAPTER}/engine.py"
    lookup = "    inst.rec.lookup(tokens, host_hit=host, disk_hit=hit - host, keys=keys)"
    return [
        # the host tier (LocalCPUBackend and its memory allocator)
        *m.recorder_call("host.allocate", backend,
                         "    if obj is not None:\n        inst.tier.allocate(1)", "1"),
        *m.recorder_call("host.allocate(batched)", backend, "inst.tier.allocate(len(objs))",
                         "len(objs)"),
        *m.recorder_call("host.free(put)", backend,
                         "inst.tier.free(1)                 # the writer's", "1"),
        *m.recorder_call("host.store", backend, "inst.tier.store(1, keys=(key,))", "1"),
        *m.recorder_call("host.reuse", backend, "inst.tier.reuse(1, keys=(key,))", "1"),
        *m.recorder_call("host.free(read)", backend, "inst.tier.free(1, cached=True)", "1"),
        *m.recorder_call("host.reuse(batched)", backend,
                         "inst.tier.reuse(len(objs), keys=keys[: len(objs)])", "len(objs)"),
        *m.recorder_call("host.free(batched read)", backend,
                         "inst.tier.free(len(objs), cached=True)", "len(objs)"),
        *m.recorder_call("host.evict(remove)", backend, "inst.tier.evict(1, reason, keys=(key,))",
                         "1"),
        *m.recorder_call("host.allocate(evicted while read)", backend,
                         "memory stays in use\n        inst.tier.allocate(1)",
                         "1"),
        *m.recorder_call("host.evict(popped)", backend, 'owner.tier.evict(1, "capacity")', "1"),
        *m.recorder_call("host.free(dropped)", backend, "    owner.tier.free(1)\n", "1"),
        *m.counter_add("host.found", backend, "inst.found += int(hits)", "int(hits)"),
        # the reuse profile: chunks stored with no lookup (the answers), written
        *m.recorder_call("reuse.written", backend, "inst.rec.written((key.chunk_hash,))",
                         "(key.chunk_hash,)"),
        # lookups (LMCacheEngine.lookup)
        *m.recorder_call("lookup.tokens", engine, lookup, "tokens"),
        *m.keyword("lookup.host_hit", engine, lookup, "host_hit", "host"),
        *m.keyword("lookup.disk_hit", engine, lookup, "disk_hit", "hit - host"),
        *m.lookup_count(engine, lookup),
        # transfers (the GPU connector's copies) and LMCache's timings of them
        *m.transfer("offload", engine, "inst.offload.transfer(chunks, nbytes)", "chunks", "nbytes"),
        *m.transfer("onload", engine, "inst.onload.transfer(chunks, nbytes)", "chunks", "nbytes"),
        *m.recorder_call("offload.seconds", engine, "inst.offload.timed(seconds)", "seconds"),
        *m.recorder_call("onload.seconds", engine, "inst.onload.timed(seconds)", "seconds"),
        # chunks a store dropped (an allocation refused): LMCache's chunks less those copied
        *m.recorder_call("store.drops", engine, "self.offload.drop(dropped)", "dropped"),
        m.Mutant("store.drops:refusal unnoted", backend,
                 "counts the drops\n        inst.refused()", "counts the drops\n        pass"),
        m.Mutant("store.drops:copies unnoted", engine,
                 "self.copied[ident] = (chunks, backend.refusals)",
                 "self.copied[ident] = (0 * chunks, backend.refusals)"),
        m.Mutant("store.drops:copies not subtracted", engine,
                 "stored = copied if stamp > refusals else 0", "stored = 0"),
        m.Mutant("store.drops:an older copy subtracted", engine,
                 "stored = copied if stamp > refusals else 0", "stored = copied"),
        m.Mutant("store.drops:any thread's refusal", engine,
                 "        if refused_at <= refusals:", "        if False:"),
        m.Mutant("store.drops:empty chunks counted", engine, "if end > start)",
                 "if end >= start)"),
        # the keys the thrash tracker classifies offloads by (every retrieval an onload)
        *m.keys_argument("host.reuse(batch)", backend,
                         "inst.tier.reuse(len(objs), keys=keys[: len(objs)])", "keys[: len(objs)]"),
        *m.keys_argument("host.reuse(get)", backend, "inst.tier.reuse(1, keys=(key,))", "(key,)",
                         "(key, key)"),
        *m.keys_argument("host.store", backend, "inst.tier.store(1, keys=(key,))", "(key,)"),
        # the verdict's saving: a lookup's hits at the prefill cost
        *m.lookup_saved(("host", "disk")),
    ]
