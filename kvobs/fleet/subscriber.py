"""Follow every replica's KV event publisher: one thread, one socket a replica.

Each replica's publisher (vLLM's or SGLang's ``ZmqEventPublisher``) sends
``(topic, sequence number, payload)`` on a PUB socket and, where it has a replay
endpoint, answers on a ROUTER socket a request for the batches from a sequence number on
(``[b"", start as 8 bytes big-endian]``), then an end marker (sequence -1). The
:class:`Subscriber` reads every PUB socket in one poll loop and feeds the replica's
:class:`~kvobs.fleet.index.FleetIndex` in sequence order:

* **a gap** (a batch whose number is past the next expected; ZeroMQ drops messages when a
  subscriber falls behind or has just connected) is asked for again on the replay
  endpoint; what the publisher no longer holds is counted lost and the replica's entries
  are dropped from the index (the index no longer knows what it holds; new events fill it
  again), so a gap never leaves wrong holders behind;
* **a restart** (a number below the last: the engine started again, with an empty cache)
  drops the replica's entries;
* **a payload that is not a batch**, an event of an unknown type or a malformed one is
  counted and skipped;
* **an unreachable publisher**: PUB/SUB cannot tell a silent engine from a dead one, so
  where a replay endpoint is given, it is asked every ``probe_interval_s`` for a batch
  past the last (the publisher answers with its end marker alone); no answer within
  ``timeout_s`` reads as down, and the replica's entries are dropped (a replica that is
  down serves none of its blocks; a restarted one starts empty). Without a replay
  endpoint a restart is seen only at the new engine's first batch.

Nothing here raises out of the loop: an error is counted on the replica and logged at
most once a minute.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import zmq

from kvobs.fleet.endpoints import Endpoint
from kvobs.fleet.index import FleetIndex
from kvobs.fleet.wire import MalformedBatch, decode_batch
from kvobs.logs import get_logger
from kvobs.ratelimit import RateLimit

_END = -1
_PROBE_SEQ = 1 << 62  # past any batch: the publisher answers with its end marker alone
_log = get_logger("kvobs.fleet")


@dataclass
class ReplicaState:
    """What the subscriber knows of one replica's stream."""

    endpoint: Endpoint
    index: FleetIndex
    replica: int
    next_seq: int | None = None
    batches: int = 0
    skipped: dict[str, int] = field(
        default_factory=lambda: {"malformed_batch": 0, "malformed": 0, "unknown": 0})
    gaps: dict[str, int] = field(default_factory=lambda: {"replayed": 0, "lost": 0})
    lost_batches: int = 0
    restarts: int = 0
    errors: int = 0
    last_batch_ts: float | None = None
    up: float | None = None  # 1 or 0 once probed; None without a replay endpoint
    probe: Any = None
    probe_sent: float | None = None


class Subscriber:
    """Reads every endpoint's events into its model's index, on one daemon thread.

    Collections read the indexes and :attr:`replicas` while holding :attr:`lock`.
    """

    def __init__(self, endpoints: Sequence[Endpoint], indexes: dict[str, FleetIndex], *,
                 timeout_s: float = 2.0, probe_interval_s: float = 10.0) -> None:
        self.lock = threading.Lock()
        self.timeout_s = timeout_s
        self.probe_interval_s = probe_interval_s
        self._ctx = zmq.Context()
        self._poller = zmq.Poller()
        self._by_socket: dict[Any, ReplicaState] = {}
        self.replicas: list[ReplicaState] = []
        self._limiter = RateLimit(60.0)
        for endpoint in endpoints:
            index = indexes[endpoint.model]
            state = ReplicaState(endpoint, index, index.replica(endpoint.name))
            sub = self._ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.SUBSCRIBE, endpoint.topic.encode())
            sub.setsockopt(zmq.RCVHWM, 100_000)
            sub.connect(endpoint.events)
            self._poller.register(sub, zmq.POLLIN)
            self._by_socket[sub] = state
            if endpoint.replay:
                state.probe = self._dealer(endpoint.replay)
                self._poller.register(state.probe, zmq.POLLIN)
                self._by_socket[state.probe] = state
            self.replicas.append(state)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="kvobs-fleet")

    def start(self) -> Subscriber:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._ctx.destroy(linger=0)

    def _dealer(self, address: str) -> Any:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        return sock

    def _run(self) -> None:
        next_probe = time.monotonic()
        while not self._stop.is_set():
            try:
                ready = dict(self._poller.poll(100))
                for sock in ready:
                    state = self._by_socket[sock]
                    if sock is state.probe:
                        self._probe_answer(state)
                    else:
                        self._receive(sock, state)
                now = time.monotonic()
                if now >= next_probe:
                    next_probe = now + self.probe_interval_s
                    self._probe_all(now)
                self._probe_timeouts(now)
            except Exception as exc:  # never let one bad message end the loop
                self._error(None, exc)

    def _receive(self, sock: Any, state: ReplicaState) -> None:
        for _ in range(1000):  # a burst at a time, then the other sockets get a turn
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                self._frames(state, frames)
            except Exception as exc:
                self._error(state, exc)

    def _frames(self, state: ReplicaState, frames: list[bytes]) -> None:
        """One live message: a restart or a gap seen by its number, then its batch."""
        if len(frames) != 3 or len(frames[1]) != 8:
            with self.lock:
                state.skipped["malformed_batch"] += 1
            return
        seq = int.from_bytes(frames[1], "big", signed=True)
        if state.next_seq is not None and seq < state.next_seq:
            self._restarted(state)
        start = state.next_seq or 0  # from 0 when first heard: it may have joined late
        if seq > start:
            if state.endpoint.replay:
                self._replay(state, start, seq)
            else:
                self._lost(state, seq - start)
        self._apply(state, seq, frames[2])

    def _apply(self, state: ReplicaState, seq: int, payload: bytes) -> None:
        try:
            batch = decode_batch(payload)
        except MalformedBatch:
            with self.lock:
                state.skipped["malformed_batch"] += 1
                state.next_seq = seq + 1
            return
        with self.lock:
            state.index.apply(state.replica, batch.events)
            state.batches += 1
            state.skipped["unknown"] += batch.unknown
            state.skipped["malformed"] += batch.malformed
            state.last_batch_ts = batch.ts
            state.next_seq = seq + 1

    def _restarted(self, state: ReplicaState) -> None:
        with self.lock:
            state.restarts += 1
            state.index.forget_replica(state.replica)
            state.next_seq = None
        _log.info("kv_events_publisher_restarted", replica=state.endpoint.name)

    def _lost(self, state: ReplicaState, batches: int) -> None:
        with self.lock:
            state.gaps["lost"] += 1
            state.lost_batches += batches
            state.index.forget_replica(state.replica)
        if self._limiter.allow(("lost", state.endpoint.name)):
            _log.warning("kv_events_lost", replica=state.endpoint.name, batches=batches,
                         fix="give the publisher's replay endpoint (replay=) and a larger "
                         "buffer_steps, or scrape more often")

    def _replay(self, state: ReplicaState, start: int, until: int) -> None:
        """Ask for batches ``start`` .. ``until - 1`` and apply them; what does not come
        back is lost (:meth:`_lost`)."""
        assert state.endpoint.replay is not None
        sock = self._dealer(state.endpoint.replay)
        got: list[tuple[int, bytes]] = []
        try:
            sock.send_multipart([b"", start.to_bytes(8, "big")])
            deadline = time.monotonic() + self.timeout_s
            while (left := deadline - time.monotonic()) > 0 and sock.poll(left * 1000):
                frames = sock.recv_multipart()
                if len(frames) != 4 or len(frames[2]) != 8:
                    continue
                seq = int.from_bytes(frames[2], "big", signed=True)
                if seq == _END:
                    break
                if start <= seq < until:
                    got.append((seq, frames[3]))
        finally:
            sock.close(linger=0)
        got.sort()
        if [seq for seq, _ in got] == list(range(start, until)):
            with self.lock:
                state.gaps["replayed"] += 1
        else:
            self._lost(state, until - start - len(got))
            got = _run_before(got, until)
        for seq, payload in got:
            self._apply(state, seq, payload)

    def _probe_all(self, now: float) -> None:
        for state in self.replicas:
            if state.probe is not None and state.probe_sent is None:
                state.probe.send_multipart([b"", _PROBE_SEQ.to_bytes(8, "big")],
                                           zmq.NOBLOCK)
                state.probe_sent = now

    def _probe_answer(self, state: ReplicaState) -> None:
        while True:
            try:
                frames = state.probe.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) == 4 and int.from_bytes(frames[2], "big", signed=True) == _END:
                with self.lock:
                    state.up = 1.0
                    state.probe_sent = None

    def _probe_timeouts(self, now: float) -> None:
        for state in self.replicas:
            if state.probe_sent is not None and now - state.probe_sent > self.timeout_s:
                with self.lock:
                    if state.up != 0.0:  # its blocks serve no request while it is down
                        state.index.forget_replica(state.replica)
                    state.up = 0.0
                # a fresh socket: an answer that comes late must not read as the next one's
                self._poller.unregister(state.probe)
                del self._by_socket[state.probe]
                state.probe.close(linger=0)
                assert state.endpoint.replay is not None
                state.probe = self._dealer(state.endpoint.replay)
                self._poller.register(state.probe, zmq.POLLIN)
                self._by_socket[state.probe] = state
                state.probe_sent = None

    def _error(self, state: ReplicaState | None, exc: BaseException) -> None:
        name = state.endpoint.name if state is not None else "-"
        if state is not None:
            with self.lock:
                state.errors += 1
        if self._limiter.allow(("error", name)):
            _log.warning("kv_events_error", replica=name, error=repr(exc))


def _run_before(batches: list[tuple[int, bytes]], until: int) -> list[tuple[int, bytes]]:
    """The batches numbered ``until - k`` .. ``until - 1`` for the largest such ``k``:
    what still applies once a replica is forgotten (batches before a hole describe blocks
    it may no longer hold)."""
    run = until
    for seq, _ in reversed(batches):
        if seq != run - 1:
            break
        run = seq
    return [batch for batch in batches if batch[0] >= run]
