"""``kvobs fleet`` against an engine's own KV event publisher (vLLM's or SGLang's
``ZmqEventPublisher``, as their servers start it with ``--kv-events-config``), through the
faults a fleet meets: a subscriber that joins late, batches lost on the way (replayed, or
lost for good when the publisher's buffer no longer holds them), an engine that restarts,
payloads that are no batch, events of a type or medium kvobs does not know, a publisher
that does not answer. The faults on the way are made by :class:`Relay`, a forwarder
between the publisher and kvobs that drops or adds messages (a network fault injector,
like toxiproxy); the replay requests go to the publisher directly.

Each engine suite runs these checks with its engine's classes (:class:`Kit`):
``tests/engines/vllm032/test_fleet_events.py``, ``tests/engines/sglang0523/test_fleet_events.py``.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest
import zmq

from kvobs.fleet.endpoints import Endpoint
from kvobs.fleet.service import Fleet
from tests.fleet.scrape import value, wait_for


@dataclass(frozen=True)
class Kit:
    """An engine's publisher and event classes."""

    publisher: Callable[..., Any]   # (rank, endpoint=, replay_endpoint=, buffer_steps=, topic=)
    stored: Callable[[list[int], str], Any]
    removed: Callable[[list[int], str], Any]
    cleared: Callable[[], Any]
    batch: Callable[[list[Any]], Any]
    host: str                       # the engine's name for the host tier's medium


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])

class Relay:
    """Forwards a publisher's messages to its own PUB socket, leaving out the sequence
    numbers in :attr:`drop` and sending :meth:`inject`'s frames in between."""

    def __init__(self, source: str) -> None:
        self.port = free_port()
        self.drop: set[int] = set()
        self.forwarded: list[int] = []
        ctx: Any = zmq.Context.instance()
        self._sub = ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub.connect(source)
        self._pub = ctx.socket(zmq.PUB)
        self._pub.bind(f"tcp://127.0.0.1:{self.port}")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._sub.poll(20):
                frames = self._sub.recv_multipart()
                seq = int.from_bytes(frames[1], "big")
                if seq not in self.drop:
                    with self._lock:
                        self._pub.send_multipart(frames)
                    self.forwarded.append(seq)

    def inject(self, frames: list[bytes]) -> None:
        with self._lock:
            self._pub.send_multipart(frames)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._sub.close(linger=0)
        self._pub.close(linger=0)


class Engine:
    """The engine's publisher, as a replica runs it, and a relay in front of it."""

    def __init__(self, kit: Kit, buffer_steps: int = 10_000) -> None:
        self.kit = kit
        self.events_port, self.replay_port = free_port(), free_port()
        self.buffer_steps = buffer_steps
        self.publisher = self._publisher()
        self.relay = Relay(f"tcp://127.0.0.1:{self.events_port}")
        time.sleep(0.3)  # the relay's subscription reaches the publisher

    def _publisher(self) -> Any:
        return self.kit.publisher(0, endpoint=f"tcp://*:{self.events_port}",
                                  replay_endpoint=f"tcp://*:{self.replay_port}",
                                  buffer_steps=self.buffer_steps, topic="kv")

    def endpoint(self, name: str) -> Endpoint:
        return Endpoint(name, self.relay.address, f"tcp://127.0.0.1:{self.replay_port}",
                        "kv", "tiny")

    def publish(self, *events: Any) -> None:
        """One batch per event, in order."""
        for event in events:
            self.publisher.publish(self.kit.batch([event]))

    def restart(self) -> None:
        """A new publisher on the same ports, its batches numbered from 0 again (ZeroMQ
        releases a closed socket's port in its I/O thread: a moment later)."""
        self.publisher.shutdown()
        deadline = time.monotonic() + 5
        while True:
            try:
                self.publisher = self._publisher()
                return
            except zmq.ZMQError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def close(self) -> None:
        self.publisher.shutdown()
        self.relay.close()


@pytest.fixture
def engines() -> Iterator[list[Engine]]:
    """The engines a check made, closed after it (the engine suites import this)."""
    made: list[Engine] = []
    yield made
    for engine in made:
        engine.close()


def start(engines: list[Engine], *made: Engine) -> Fleet:
    engines.extend(made)
    names = "abcdefgh"
    return Fleet([e.endpoint(names[n]) for n, e in enumerate(made)], "127.0.0.1:0",
                 timeout_s=1.0, probe_interval_s=0.2)


def check_residency_duplication_and_routing_misses(kit: Kit, engines: list[Engine]) -> None:
    a, b = Engine(kit), Engine(kit)
    fleet = start(engines, a, b)
    try:
        a.publish(kit.stored([1, 2, 3], "GPU"), kit.stored([1, 2], kit.host),
                  kit.removed([3], "GPU"))
        wait_for(fleet.url, lambda s: value(s, "kvobs_fleet_event_batches_total") == 3)
        b.publish(kit.stored([1, 2, 4, 5], "GPU"))  # after a's: the streams interleave
        got = wait_for(fleet.url, lambda s: value(
            s, "kvobs_fleet_event_batches_total") == 4)
        assert value(got, "kvobs_fleet_resident_blocks", replica="b", tier="gpu") == 4
        assert value(got, "kvobs_fleet_resident_blocks", replica="a", tier="gpu") == 2
        assert value(got, "kvobs_fleet_resident_blocks", replica="a", tier="host") == 2
        assert value(got, "kvobs_fleet_duplicated_blocks", tier="gpu") == 2
        assert value(got, "kvobs_fleet_duplicate_copies_blocks", tier="gpu") == 2
        assert value(got, "kvobs_fleet_distinct_blocks", tier="gpu") == 4
        # b computed 1 and 2 while a held them: 32 tokens a prefix router would have hit
        assert value(got, "kvobs_fleet_computed_tokens_total", replica="b",
                     cause="routing") == 32
        assert value(got, "kvobs_fleet_computed_tokens_total", replica="b", cause="cold") == 32
        wait_for(fleet.url, lambda s: value(s, "kvobs_fleet_publisher_up", replica="a") == 1)
        a.publish(kit.cleared())
        got = wait_for(fleet.url, lambda s: value(s, "kvobs_fleet_cleared_total") == 1)
        assert value(got, "kvobs_fleet_resident_blocks", replica="a", tier="gpu") == 0
        assert value(got, "kvobs_fleet_resident_blocks", replica="a", tier="host") == 2
    finally:
        fleet.close()


def check_a_late_join_and_a_lost_batch_are_replayed_from_the_buffer(
        kit: Kit, engines: list[Engine]) -> None:
    a = Engine(kit)
    engines.append(a)
    a.publish(kit.stored([1], "GPU"), kit.stored([2], "GPU"))  # before kvobs subscribed
    time.sleep(0.3)
    fleet = start([], a)
    try:
        a.relay.drop = {3}
        a.publish(kit.stored([3], "GPU"), kit.stored([4], "GPU"), kit.stored([5], "GPU"))
        got = wait_for(fleet.url, lambda s: value(
            s, "kvobs_fleet_event_batches_total", replica="a") == 5)
        assert value(got, "kvobs_fleet_resident_blocks", replica="a", tier="gpu") == 5
        assert value(got, "kvobs_fleet_gaps_total", replica="a", outcome="replayed") == 2
        assert value(got, "kvobs_fleet_gaps_total", replica="a", outcome="lost") == 0
        assert 3 not in a.relay.forwarded
    finally:
        fleet.close()


def check_a_gap_past_the_buffer_is_lost_and_the_replica_refills(
        kit: Kit, engines: list[Engine]) -> None:
    a = Engine(kit, buffer_steps=2)
    fleet = start(engines, a)
    try:
        a.publish(kit.stored([1, 2], "GPU"))
        wait_for(fleet.url, lambda s: value(s, "kvobs_fleet_resident_blocks", tier="gpu") == 2)
        a.relay.drop = {1, 2, 3}
        a.publish(*(kit.stored([10 + n], "GPU") for n in range(3)), kit.stored([20], "GPU"))
        got = wait_for(fleet.url, lambda s: value(
            s, "kvobs_fleet_gaps_total", outcome="lost") == 1)
        # what a held before the gap is unknown now: dropped, then refilled by the batches
        # the buffer still held (the last before the gap's end) and the new ones
        assert value(got, "kvobs_fleet_resident_blocks", tier="gpu") == 2
        assert value(got, "kvobs_fleet_lost_batches_total") == 2
    finally:
        fleet.close()


def check_an_engine_restart_drops_its_blocks(kit: Kit, engines: list[Engine]) -> None:
    a = Engine(kit)
    fleet = start(engines, a)
    try:
        a.publish(kit.stored([1, 2, 3], "GPU"), kit.stored([4], "GPU"))
        wait_for(fleet.url, lambda s: value(s, "kvobs_fleet_resident_blocks", tier="gpu") == 4)
        a.restart()  # a new publisher numbers its batches from 0 again
        time.sleep(0.3)
        a.publish(kit.stored([7], "GPU"))
        got = wait_for(fleet.url, lambda s: value(s, "kvobs_fleet_restarts_total") == 1)
        got = wait_for(fleet.url, lambda s: value(
            s, "kvobs_fleet_resident_blocks", tier="gpu") == 1)
        assert value(got, "kvobs_fleet_gaps_total", outcome="lost") == 0
    finally:
        fleet.close()


def check_bad_payloads_and_unknown_events_are_counted_never_fatal(
        kit: Kit, engines: list[Engine]) -> None:
    a = Engine(kit)
    fleet = start(engines, a)
    try:
        a.publish(kit.stored([1], "GPU"))
        wait_for(fleet.url, lambda s: value(s, "kvobs_fleet_event_batches_total") == 1)
        a.relay.inject([b"kv", (1).to_bytes(8, "big"), b"\xc1 not msgpack"])
        a.relay.inject([b"kv", b"short"])
        later = msgspec.msgpack.encode([1.0, [{"type": "BlockPinned", "block_hashes": [1]},
                                              {"type": "BlockStored", "block_hashes": [9],
                                               "block_size": 16, "medium": "HBM3"}], 0])
        a.relay.inject([b"kv", (2).to_bytes(8, "big"), later])
        a.relay.drop = {1, 2}  # vLLM's own batches 1 and 2: the injected ones stand in
        a.publish(kit.stored([2], "GPU"), kit.stored([3], "GPU"), kit.stored([4], "GPU"))
        got = wait_for(fleet.url, lambda s: value(
            s, "kvobs_fleet_resident_blocks", tier="gpu") == 2)
        assert value(got, "kvobs_fleet_skipped_events_total", reason="malformed_batch") == 2
        assert value(got, "kvobs_fleet_skipped_events_total", reason="unknown") == 2
        assert value(got, "kvobs_fleet_errors_total") == 0
    finally:
        fleet.close()


def check_a_publisher_that_does_not_answer_reads_down(kit: Kit, engines: list[Engine]) -> None:
    silent = Endpoint("gone", f"tcp://127.0.0.1:{free_port()}",
                      f"tcp://127.0.0.1:{free_port()}", "kv", "tiny")
    fleet = Fleet([silent], "127.0.0.1:0", timeout_s=0.3, probe_interval_s=0.2)
    try:
        got = wait_for(fleet.url, lambda s: ("kvobs_fleet_publisher_up", frozenset(
            {("model", "tiny"), ("replica", "gone")})) in s)
        assert value(got, "kvobs_fleet_publisher_up", replica="gone") == 0
    finally:
        fleet.close()


def check_a_replica_read_down_holds_nothing(kit: Kit, engines: list[Engine]) -> None:
    a, b = Engine(kit), Engine(kit)
    fleet = start(engines, a, b)
    try:
        a.publish(kit.stored([1, 2], "GPU"))
        b.publish(kit.stored([1, 2], "GPU"))
        wait_for(fleet.url, lambda s: value(s, "kvobs_fleet_duplicated_blocks") == 2 and
                 value(s, "kvobs_fleet_publisher_up") == 2)
        a.publisher.shutdown()  # the engine stops: its replay socket no longer answers
        got = wait_for(fleet.url, lambda s: value(
            s, "kvobs_fleet_publisher_up", replica="a") == 0 and
            ("kvobs_fleet_publisher_up", frozenset({("model", "tiny"), ("replica", "a")})) in s)
        assert value(got, "kvobs_fleet_resident_blocks", replica="a") == 0
        assert value(got, "kvobs_fleet_resident_blocks", replica="b") == 2
        assert value(got, "kvobs_fleet_duplicated_blocks") == 0
        a.restart()  # it comes back (the fixture shuts the new publisher down)
    finally:
        fleet.close()


#: Every check, for the engine suites' test modules.
CHECKS: tuple[Callable[[Kit, list[Engine]], None], ...] = (
    check_residency_duplication_and_routing_misses,
    check_a_late_join_and_a_lost_batch_are_replayed_from_the_buffer,
    check_a_gap_past_the_buffer_is_lost_and_the_replica_refills,
    check_an_engine_restart_drops_its_blocks,
    check_bad_payloads_and_unknown_events_are_counted_never_fatal,
    check_a_publisher_that_does_not_answer_reads_down,
    check_a_replica_read_down_holds_nothing,
)
