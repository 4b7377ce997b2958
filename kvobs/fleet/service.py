"""``kvobs fleet``'s process: follow the replicas, serve the fleet's ``/metrics``.

Example:
    >>> from kvobs.fleet.endpoints import Endpoint
    >>> fleet = Fleet([Endpoint("a", "tcp://127.0.0.1:5557", model="m")], "127.0.0.1:0")
    >>> fleet.url.startswith("http://127.0.0.1:")
    True
    >>> fleet.close()
"""

from __future__ import annotations

from collections.abc import Sequence

from kvobs.fleet.collector import FleetCollector
from kvobs.fleet.endpoints import Endpoint
from kvobs.fleet.index import HISTORY_KEYS, FleetIndex, Sampling
from kvobs.fleet.subscriber import Subscriber
from kvobs.telemetry.prometheus import start_metrics_server


class Fleet:
    """The subscriber, one index per model, and the ``/metrics`` server; started at once."""

    def __init__(self, endpoints: Sequence[Endpoint], metrics_addr: str, *,
                 sampling: Sampling | None = None, history_keys: int = HISTORY_KEYS,
                 block_bytes: int | None = None, pooled_capacity: int | None = None,
                 web_config_file: str | None = None,
                 timeout_s: float = 2.0, probe_interval_s: float = 10.0) -> None:
        self.indexes = {e.model: FleetIndex(sampling, history_keys, pooled_capacity)
                        for e in endpoints}
        self.subscriber = Subscriber(endpoints, self.indexes, timeout_s=timeout_s,
                                     probe_interval_s=probe_interval_s)
        self.server = start_metrics_server(metrics_addr, web_config_file)
        self.server.registry.register(
            FleetCollector(self.subscriber, self.indexes, block_bytes))
        self.subscriber.start()

    @property
    def url(self) -> str:
        return self.server.url

    def close(self) -> None:
        self.subscriber.close()
        self.server.close()
