"""SGLang mutants: every event the SGLang adapter records, doubled and dropped.

Judged by the SGLang 0.5.23 suite (its scheduler loop on ``UnifiedRadixCache`` +
``init_hicache``, and the bare ``RadixCache`` / ``HiCacheController`` objects).
"""

from __future__ import annotations

from mutants import common as m

ADAPTERS = "kvobs/adapters/sglang"
SUITES = ((".venv-sglang/bin/python", "tests/engines/sglang0523"),)


def _list_arg(event: str, path: str, old: str, name: str) -> list[m.Mutant]:
    """Doubled / dropped mutants of a list argument ``name`` inside ``old``."""
    return [m.Mutant(f"{event}:doubled", path, old, old.replace(name, f"2 * {name}", 1)),
            m.Mutant(f"{event}:dropped", path, old, old.replace(name, f"0 * {name}", 1))]


def mutants() -> list[m.Mutant]:
    gpu, host = f"{ADAPTERS}/gpu.py", f"{ADAPTERS}/host.py"
    lookup = ("inst.rec.lookup(tokens, gpu_hit=gpu_hit, host_hit=min(promised, loaded), "
              "keys=keys)")
    timed = "link.timed(ack.start_event.elapsed_time(ack.finish_event) / 1000.0)"
    return [
        # the GPU tier: allocator and radix cache
        *m.recorder_call("gpu.allocate", gpu, "self.tier.allocate(taken)", "taken"),
        *m.recorder_call("gpu.free(emptied)", gpu, "self.tier.free(freed - absorbed)",
                         "freed - absorbed"),
        *m.recorder_call("gpu.free(cached)", gpu, "self.tier.free(grown, cached=True)", "grown"),
        *m.recorder_call("gpu.reuse", gpu, "self.tier.reuse(-grown)", "-grown"),
        *m.recorder_call("gpu.evict(capacity)", gpu, 'gpu.tier.evict(pages, "capacity")',
                         "pages"),
        *m.recorder_call("gpu.evict(reset)", gpu, 'gpu.tier.evict(gpu.cached_pages, "reset")',
                         "gpu.cached_pages"),
        # lookups: one per admitted request
        *m.recorder_call("lookup.tokens", gpu, lookup, "tokens"),
        *m.keyword("lookup.gpu_hit", gpu, lookup, "gpu_hit", "gpu_hit"),
        *m.keyword("lookup.host_hit", gpu, lookup, "host_hit", "min(promised, loaded)"),
        # the reuse profile: pages the tree took past the lookup's (the answers), written
        *m.recorder_call("reuse.written", gpu, "inst.rec.written(keys[start:end])",
                         "keys[start:end]"),
        # refused backups (drops): the shared counter and both callers
        *m.recorder_call("drop", gpu, "rec.link(src, dst).drop(len(new))", "len(new)"),
        *_list_arg("drop(tree refused)", gpu, "refuse_backup(inst.rec, gpu.refused, pages,",
                   "pages,"),
        *_list_arg("drop(controller refused)", host,
                   "refuse_backup(inst.rec, inst.refused, pages,", "pages,"),
        # durations: SGLang's device time of each reaped copy
        m.Mutant("transfer.seconds:doubled", gpu, timed, timed.replace("(ack.", "(2 * ack.", 1)),
        m.Mutant("transfer.seconds:dropped", gpu, timed, timed.replace("(ack.", "(0 * ack.", 1)),
        # the host tier: the group's anchor pool
        *m.recorder_call("host.store", host,
                       "inst.tier.store(need_size // inst.page, keys=inst.pages(indices))",
                       "need_size // inst.page"),
        *m.recorder_call("host.evict(capacity, other)", host,
                       'inst.tier.evict(len(keys), "capacity" if inst.evicting else "other",',
                       "len(keys)"),
        *m.recorder_call("host.evict(reset)", host, 'inst.tier.evict(cached, "reset")', "cached"),
        *m.recorder_call("host.reuse(load)", host,
                       "host.tier.reuse(pages, keys=host.pages(host_indices))", "pages"),
        *m.recorder_call("host.free(load)", host, "host.tier.free(pages, cached=True)", "pages"),
        # transfers: one per queued copy (HiCacheAck)
        *m.transfer("transfer", host, "link.transfer(tokens // host.page, nbytes)",
                  "tokens // host.page", "nbytes", indent="            "),
        # the keys the thrash tracker classifies offloads by (every load-back an onload)
        *m.keys_argument("host.reuse", host,
                         "host.tier.reuse(pages, keys=host.pages(host_indices))",
                         "host.pages(host_indices)", "host.pages(host_indices) * 2"),
        *m.keys_argument("host.store", host,
                       "inst.tier.store(need_size // inst.page, keys=inst.pages(indices))",
                       "inst.pages(indices)"),
        # one lookup per request the PrefillAdder admits
        *m.lookup_count(gpu, "    " + lookup),
        # the verdict's saving: a lookup's hits at the prefill cost
        *m.lookup_saved(("host",)),
    ]
