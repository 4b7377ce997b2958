"""lmcache mutants: every event the lmcache adapter records, doubled and dropped."""

from __future__ import annotations

from mutants import common as m

ADAPTER = "kvobs/adapters/lmcache"
BATCH_REUSE = ("inst.tier.reuse(len(objs), keys=[block_key(inst, key) for key in "
               "keys[: len(objs)]])")
POPPED = 'inst.tier.evict(len(popped), "capacity", keys=popped)'
SUITES = ((".venv-lmcache/bin/python", "tests/engines/lmcache056"),)


def mutants() -> list[m.Mutant]:
    backend, engine = f"{ADAPTER}/backend.py", f"{ADAPTER}/engine.py"
    lookup = "    inst.rec.lookup(counted, host_hit=host, disk_hit=hit - host, keys=keys)"
    return [
        # the host tier (LocalCPUBackend and its memory allocator)
        *m.recorder_call("host.allocate", backend,
                         "    if obj is not None:\n        inst.tier.allocate(1)", "1"),
        *m.recorder_call("host.allocate(batched)", backend, "inst.tier.allocate(len(objs))",
                         "len(objs)"),
        *m.recorder_call("host.store", backend, "inst.tier.store(1, keys=(block,))", "1"),
        *m.recorder_call("host.reuse", backend, "inst.tier.reuse(1, keys=(block_key(inst, key),))",
                         "1"),
        *m.recorder_call("host.reuse(batched)", backend, BATCH_REUSE, "len(objs)"),
        *m.recorder_call("host.evict(remove)", backend,
                         "inst.tier.evict(1, reason, keys=(block_key(inst, key),))", "1"),
        *m.recorder_call("host.allocate(evicted while read)", backend,
                         "memory stays in use\n        inst.tier.allocate(1)",
                         "1"),
        *m.recorder_call("host.evict(popped)", backend, POPPED, "len(popped)"),
        *m.keys_argument("host.evict(popped)", backend, POPPED, "popped"),
        # the frees, derived at collection from LMCache's live memory objects: those back
        # to the cache (a read chunk stays cached) and those out of use
        *m.recorder_call("host.free(cached)", backend,
                         "tier.free(reuses - tier.frees_to_cache, cached=True)",
                         "reuses - tier.frees_to_cache"),
        *m.recorder_call("host.free(emptied)", backend,
                         "tier.free(to_free - tier.frees_to_free)", "to_free - tier.frees_to_free"),
        *m.counter_add("host.found", backend, "inst.found += int(hits)", "int(hits)"),
        # the reuse profile: chunks stored with no lookup (the answers), written
        *m.recorder_call("reuse.written", backend, "inst.rec.written((key.chunk_hash,))",
                         "(key.chunk_hash,)"),
        # lookups (LMCacheEngine.lookup)
        *m.recorder_call("lookup.tokens", engine, lookup, "counted"),
        *m.keyword("lookup.host_hit", engine, lookup, "host_hit", "host"),
        *m.keyword("lookup.disk_hit", engine, lookup, "disk_hit", "hit - host"),
        *m.lookup_count(engine, lookup),
        # transfers (the GPU connector's copies) and LMCache's timings of them
        *m.transfer("offload", engine, "inst.offload.transfer(chunks, nbytes)", "chunks", "nbytes"),
        *m.transfer("onload", engine, "inst.onload.transfer(chunks, nbytes)", "chunks", "nbytes"),
        # a layerwise connector's copies, one layer per step of its generators
        *m.transfer("layer copy", engine, "link.transfer(chunks, nbytes)", "chunks", "nbytes",
                    indent="            "),
        *m.recorder_call("offload.seconds", engine, "inst.offload.timed(seconds)", "seconds"),
        *m.recorder_call("onload.seconds", engine, "inst.onload.timed(seconds)", "seconds"),
        # chunks a store dropped (an allocation refused): LMCache's chunks less those copied
        *m.recorder_call("store.drops", engine, "self.offload.drop(dropped)", "dropped"),
        m.Mutant("store.drops:refusal unnoted", backend,
                 "drops the rest\n        inst.refused()", "drops the rest\n        pass"),
        m.Mutant("store.drops:stored not subtracted", engine,
                 "dropped = chunks - stored", "dropped = chunks"),
        # the reuse profile of a layerwise engine: a chunk's keys once, its size in chunks
        m.Mutant("layerwise.profile:no lookup keys", engine,
                 "if backend.keyed and inst.keys_per_chunk > 1:",
                 "if backend.keyed and inst.keys_per_chunk > 1 and False:"),
        m.Mutant("layerwise.profile:every layer written", backend,
                 "if inst.keyed and not (inst.layerwise and key.layer_id) and",
                 "if inst.keyed and"),
        m.Mutant("layerwise.profile:size in blocks", engine,
                 "capacity_blocks=max(inst.tier.capacity_blocks // layers, 1))",
                 "capacity_blocks=max(inst.tier.capacity_blocks, 1))"),
        # objects a layerwise store_layer dropped: chunks neither held nor stored, x layers
        *m.recorder_call("store_layer.drops", engine, "self.offload.drop(dropped * layers)",
                         "dropped * layers"),
        m.Mutant("store_layer.drops:refusal unnoted", backend,
                 "store_layer counts its drops\n        inst.refused()",
                 "store_layer counts its drops\n        pass"),
        m.Mutant("store_layer.drops:held chunks counted", engine,
                 "not held(key.split_layers(layers)[0], where))", "True)"),
        m.Mutant("store_layer.drops:stored chunks counted", engine,
                 "if end > start and start >= refused and", "if end > start and"),
        m.Mutant("store.drops:empty chunks counted", engine, "if end > start)",
                 "if end >= start)"),
        # the keys the thrash tracker classifies offloads by (every retrieval an onload)
        *m.keys_argument("host.reuse(batch)", backend, BATCH_REUSE,
                         "[block_key(inst, key) for key in keys[: len(objs)]]"),
        *m.keys_argument("host.reuse(get)", backend,
                         "inst.tier.reuse(1, keys=(block_key(inst, key),))",
                         "(block_key(inst, key),)", "(block_key(inst, key), block_key(inst, key))"),
        *m.keys_argument("host.store", backend, "inst.tier.store(1, keys=(block,))", "(block,)"),
        # a layerwise block's key its chunk's alone: a chunk's layers one block to the tracker
        m.Mutant("host.keys:layer left out", backend,
                 "return (key.chunk_hash, key.layer_id) if inst.layerwise else key.chunk_hash",
                 "return key.chunk_hash"),
        # the verdict's saving: a lookup's hits at the prefill cost
        *m.lookup_saved(("host", "disk")),
        # use_layerwise: the host tier's blocks are layer objects, chunk_size / layers
        # tokens each, whole numbers only; their bytes as LMCache's buffer takes them
        *layerwise(engine, backend),
    ]


def layerwise(engine: str, backend: str) -> list[m.Mutant]:
    """A layerwise host tier's units: its block's tokens (a chunk's, or a fraction's
    rounded down, instead of left out), its block's bytes unaligned, and the token
    figures the capacity series, event and lines leave out when they are unknown."""
    tokens = "block_tokens=self.chunk_tokens // layers if exact else 0"
    exact = "exact = self.chunk_tokens % layers == 0"
    aligned = "block_bytes=object_bytes(backend, backend.get_full_chunk_size_bytes())"
    series = "        if t.block_tokens > 0:  # no whole token count per block"
    return [
        m.Mutant("layerwise.block_tokens:a chunk's", engine, tokens,
                 "block_tokens=self.chunk_tokens if exact else 0"),
        m.Mutant("layerwise.block_tokens:always whole", engine, exact, "exact = True"),
        m.Mutant("layerwise.block_tokens:never whole", engine, exact, "exact = False"),
        m.Mutant("layerwise.block_bytes:unaligned", engine, aligned,
                 "block_bytes=backend.get_full_chunk_size_bytes()"),
        m.Mutant("layerwise.object_bytes:unaligned", backend,
                 "return int(aligned(nbytes)) if callable(aligned) else nbytes",
                 "return nbytes"),
        m.Mutant("layerwise.tokens unknown:series", "kvobs/telemetry/series.py", series,
                 series.replace("if t.block_tokens > 0:", "if True:")),
        m.Mutant("layerwise.tokens unknown:event tokens", "kvobs/capacity.py",
                 '"tokens": t.tokens if t.block_tokens else None,', '"tokens": t.tokens,'),
        m.Mutant("layerwise.tokens unknown:event requests held", "kvobs/capacity.py",
                 "                    if t.block_tokens else None,\n",
                 "                    if True else None,\n"),
        m.Mutant("layerwise.tokens unknown:lines", "kvobs/capacity.py",  # and the log line
                 'return f"{self.tokens:,} tokens" if self.block_tokens else "tokens unknown"',
                 'return f"{self.tokens:,} tokens"'),
    ]
