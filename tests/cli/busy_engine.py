"""A small engine for the terminal tests: the generic callbacks, a real exporter.

``python tests/cli/busy_engine.py URL_FILE [HOST:PORT]`` serves ``/metrics`` (on a free
port unless HOST:PORT is given), writes the URL to URL_FILE and keeps a GPU and a host
tier busy (allocations, offloads, onloads, host hits, drops, a thrash onload now and
then) until killed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import kvobs

BLOCK = (16, 16 * 12288)  # tokens per block, bytes per block (Qwen2.5-0.5B layout)


def main(url_file: str, addr: str = "127.0.0.1:0") -> None:
    rec = kvobs.Recorder(engine="busy", model="qwen2.5-0.5b")
    kv = kvobs.KVCacheCallbacks(rec, {"gpu": (512, *BLOCK), "host": (2048, *BLOCK)})
    telemetry = kvobs.start_telemetry(rec, metrics_addr=addr, summary_interval_s=0,
                                       logs="json")
    Path(url_file).write_text(str(telemetry.metrics_url))
    step = 0
    kv.allocate("gpu", 300)
    kv.free("gpu", 100, cached=True)
    while True:
        step += 1
        kv.lookup(2048, gpu_hit=1024, host_hit=512)
        kv.allocate("gpu", 8)
        kv.free("gpu", 8, cached=True)
        kv.transfer("gpu", "host", 4, 4 * BLOCK[1], 0.0008 + 0.0001 * (step % 5))
        kv.store("host", 4, keys=[("k", step % 97, i) for i in range(4)])
        kv.reuse("host", 2, keys=[("k", (step - 3) % 97, i) for i in range(2)])
        kv.free("host", 2, cached=True)
        kv.transfer("host", "gpu", 2, 2 * BLOCK[1], 0.0004)
        kv.evict("host", 2, keys=[("k", (step - 40) % 97, i) for i in range(2, 4)])
        if step % 7 == 0:
            kv.drop("gpu", "host", 1)
        time.sleep(0.02)


if __name__ == "__main__":
    main(*sys.argv[1:3])
