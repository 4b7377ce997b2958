"""``kvobs top``: a live terminal view of kvobs ``/metrics`` endpoints.

Per endpoint: per-tier capacity and occupancy bars (in use / cached / free), where
looked-up tokens were found, transfer throughput and p50 / p99 latency per direction,
drops and failures, thrash and wasted offloads; refreshed every second with rates from
successive scrapes. Layers: :mod:`.scrape` (HTTP + text parsing) -> :mod:`.model`
(rates, quantiles; no drawing) -> :mod:`.render` (rich renderables) -> :mod:`.app`
(the refresh loop and keys).

Example::

    from kvobs.top import run_top
    run_top(["http://127.0.0.1:9464/metrics"])   # until q or Ctrl-C
"""

from kvobs.top.app import Watcher, run_top
from kvobs.top.model import EndpointView, build_view
from kvobs.top.scrape import Scrape, fetch, parse_text

__all__ = ["EndpointView", "Scrape", "Watcher", "build_view", "fetch", "parse_text", "run_top"]
