"""The hot path: plain integer counters that engine adapters bump on every event.

An allocator event costs one method call and one integer add (:class:`TierCore`,
:class:`LinkCore`; ``benchmarks/recorder_overhead.py`` measures them). Nothing here calls
a telemetry library, takes a lock per block, logs, or allocates per event; sinks read
:meth:`Recorder.snapshot` at collection time instead.

The events are the vocabulary of :mod:`kvobs.events`. Occupancy is derived from the
counters rather than kept as separate gauges, so every event touches a single counter::

    in_use = allocations + reuses - frees
    cached = frees_to_cache + stores - reuses - evictions

Thread safety: each event is one ``+=`` on a slot attribute or dict value, which the
GIL of CPython 3.10-3.13 runs without a switch in between (switches happen only at
calls and backward jumps), so concurrent callers lose no update; the stress test pins
this. Free-threaded builds would need per-thread shards.

Example:
    >>> rec = Recorder(engine="demo", model="llama-3-8b")
    >>> gpu = rec.add_tier("gpu", capacity_blocks=8, block_tokens=16, block_bytes=2**21)
    >>> gpu.allocate(3); gpu.free(2, cached=True); gpu.reuse(1)
    >>> t = rec.snapshot().tier("gpu")
    >>> (t.in_use_blocks, t.cached_blocks, t.free_blocks)
    (2, 1, 5)
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence

from kvobs.benefit import PrefillCost
from kvobs.catalog import EVICTION_REASONS
from kvobs.errors import ConfigError, UnknownTierError
from kvobs.events import Keys
from kvobs.logs import get_logger
from kvobs.ratelimit import RateLimit
from kvobs.residency import ResidencyTracker
from kvobs.reuse import ReuseProfile
from kvobs.samples import SampleHistograms
from kvobs.snapshot import (
    MISS_CAUSES,
    BenefitSnapshot,
    LinkSnapshot,
    LookupSnapshot,
    RecorderSnapshot,
    ReuseSnapshot,
    TierSnapshot,
)
from kvobs.thrash import ThrashTracker
from kvobs.tiers import GPU, HOST, ROLES, default_role, tier_order, validate_tier_name
from kvobs.trace import DEFAULT_MAX_BYTES as DEFAULT_TRACE_BYTES
from kvobs.trace import TraceWriter

ResidentSource = Callable[[], tuple[int, int]]
#: Positions of the causes in :attr:`Recorder.miss_causes` (:data:`MISS_CAUSES`' order).
COLD, EVICTED, DROPPED, IN_FLIGHT, OTHER, NOT_CACHEABLE, UNKNOWN = range(len(MISS_CAUSES))
#: Series an adapter exports beyond tiers and links: ``{metric: [(labels, value)]}``.
SeriesSource = Callable[[], Mapping[str, list[tuple[dict[str, str], float]]]]

#: Most written blocks waiting for the next keyed lookup (:meth:`Recorder.written`).
WRITTEN_MAX = 4096

_log = get_logger("kvobs")


class TierCore:
    """A tier's event counters, :class:`TierRecorder`'s base: the event methods of
    :class:`~kvobs.events.TierEvents`.

    Every method is one or two integer adds and never raises for valid ints; keyed
    events also feed the tier's thrash and residency trackers (one C call each).
    """

    __slots__ = (
        "allocations",
        "evictions",
        "evictions_capacity",
        "frees_to_cache",
        "frees_to_free",
        "residency",
        "reuses",
        "stores",
        "thrash",
    )

    allocations: int
    frees_to_cache: int
    frees_to_free: int
    reuses: int
    stores: int
    evictions_capacity: int
    evictions: dict[str, int]
    thrash: ThrashTracker | None
    residency: ResidencyTracker | None

    def allocate(self, n: int = 1, keys: Keys = None) -> None:
        """``n`` free blocks were handed to requests (free -> in use)."""
        self.allocations += n
        if keys is not None and self.residency is not None:
            self.residency.born(keys)

    def free(self, n: int = 1, cached: bool = False) -> None:
        """``n`` blocks were released: kept as cached data if ``cached``, else emptied."""
        if cached:
            self.frees_to_cache += n
        else:
            self.frees_to_free += n

    def reuse(self, n: int = 1, keys: Keys = None) -> None:
        """``n`` cached blocks were taken back into use by a prefix hit (cached -> in use)."""
        self.reuses += n
        if keys is not None:
            if self.thrash is not None:
                self.thrash.onloaded(keys)
            if self.residency is not None:
                self.residency.reused(keys)

    def store(self, n: int = 1, keys: Keys = None) -> None:
        """``n`` blocks were written into this tier as cached data (free -> cached)."""
        self.stores += n
        if keys is not None:
            if self.thrash is not None:
                self.thrash.offloaded(keys)
            if self.residency is not None:
                self.residency.born(keys)

    def evict(self, n: int = 1, reason: str = "capacity", keys: Keys = None) -> None:
        """``n`` cached blocks were dropped (cached -> free); unknown reasons count as other."""
        if keys is not None:
            if self.thrash is not None:
                self.thrash.evicted(keys)
            if self.residency is not None:
                self.residency.evicted(keys)
        if reason == "capacity":  # the common case skips the dict
            self.evictions_capacity += n
            return
        try:
            self.evictions[reason] += n
        except KeyError:
            self.evictions["other"] += n


class TierRecorder(TierCore):
    """Counters of one tier, fed by the :class:`~kvobs.events.TierEvents` vocabulary.

    Bind once (``gpu = rec.tier("gpu")``), call per event. Every event method
    (``allocate`` / ``free`` / ``reuse`` / ``store`` / ``evict``, from :class:`TierCore`) is
    one or two integer adds and never raises for valid ints.
    """

    __slots__ = (
        "_resident",
        "_resident_source",
        "block_bytes",
        "block_tokens",
        "capacity_blocks",
        "name",
        "request_blocks",
        "role",
    )

    def __init__(self, name: str, capacity_blocks: int, block_tokens: int, block_bytes: int,
                 thrash: ThrashTracker | None = None,
                 residency: ResidencyTracker | None = None):
        self.name = name
        self.capacity_blocks = capacity_blocks
        self.block_tokens = block_tokens
        self.block_bytes = block_bytes
        #: ``primary`` (running requests need blocks here) or ``cache``; see kvobs.capacity
        self.role = default_role(name)
        #: blocks one request needs here, where the engine says (0: by tokens)
        self.request_blocks = 0
        self.allocations = 0
        self.frees_to_cache = 0
        self.frees_to_free = 0
        self.reuses = 0
        self.stores = 0
        self.evictions_capacity = 0
        self.evictions = dict.fromkeys(EVICTION_REASONS, 0)  # "capacity" stays 0 here
        self.thrash = thrash  # offload tiers: keys of stores / reuses / evictions feed it
        self.residency = residency  # keyed events: time in the tier, gaps between reuses
        self._resident: tuple[int, int] | None = None
        self._resident_source: ResidentSource | None = None

    def set_resident(self, in_use: int, cached: int) -> None:
        """Override derived occupancy with absolute values read from the engine."""
        self._resident = (in_use, cached)

    def set_resident_source(self, source: ResidentSource | None) -> None:
        """Read occupancy as ``(in_use, cached)`` from ``source()`` at every snapshot."""
        self._resident_source = source

    def set_capacity(self, blocks: int) -> None:
        """Change the capacity (engines that size the pool after start-up)."""
        _check_count("capacity_blocks", blocks, self.name)
        self.capacity_blocks = blocks

    def snapshot(self) -> TierSnapshot:
        """Point-in-time copy of the counters and occupancy.

        Occupancy is read first (a resident source may settle derived counters), then
        the counters. It is clamped so that a reading taken while the engine is between
        two updates still satisfies ``0 <= in_use``, ``0 <= cached`` and
        ``in_use + cached <= capacity`` (free never reads negative).
        """
        resident = self._resident
        if self._resident_source is not None:
            resident = self._resident_source()
        evictions = dict(self.evictions)
        evictions["capacity"] = self.evictions_capacity
        to_cache = self.frees_to_cache
        frees = to_cache + self.frees_to_free
        if resident is None:
            resident = (
                self.allocations + self.reuses - frees,
                to_cache + self.stores - self.reuses - sum(evictions.values()),
            )
        capacity = self.capacity_blocks
        in_use = min(max(resident[0], 0), capacity)
        cached = min(max(resident[1], 0), capacity - in_use)
        return TierSnapshot(
            self.name,
            capacity,
            self.block_tokens,
            self.block_bytes,
            self.allocations,
            frees,
            to_cache,
            self.reuses,
            self.stores,
            evictions,
            in_use,
            cached,
        )


class LinkCore:
    """A link's event counters, :class:`LinkRecorder`'s base: the event methods of
    :class:`~kvobs.events.LinkEvents`."""

    __slots__ = (
        "blocks",
        "buffer_limit",
        "bytes",
        "dropped_samples",
        "drops",
        "durations",
        "failures",
        "operations",
        "seconds",
    )

    operations: int
    blocks: int
    bytes: int
    failures: int
    drops: int
    seconds: float
    dropped_samples: int
    buffer_limit: int
    durations: deque[float]

    def transfer(self, blocks: int, nbytes: int, seconds: float | None = None) -> None:
        """A batch of ``blocks`` blocks (``nbytes`` bytes) landed, in ``seconds`` if timed."""
        self.operations += 1
        self.blocks += blocks
        self.bytes += nbytes
        if seconds is not None:  # timed(seconds), written out: one frame per transfer
            self.seconds += seconds
            durations = self.durations
            if len(durations) < self.buffer_limit:
                durations.append(seconds)
            else:
                self.dropped_samples += 1

    def timed(self, seconds: float) -> None:
        """One transfer took ``seconds`` (device time where there is a device)."""
        self.seconds += seconds
        self.sample(seconds)

    def sample(self, seconds: float) -> None:
        """A duration sample alone, for an engine that reports its transfers' seconds
        summed elsewhere (:meth:`add_seconds`) and each transfer's time here."""
        if len(self.durations) < self.buffer_limit:
            self.durations.append(seconds)
        else:
            self.dropped_samples += 1

    def add_seconds(self, seconds: float) -> None:
        """Seconds spent moving, as an engine reports them summed over its transfers
        (no duration sample: the per-transfer times come through :meth:`sample`)."""
        self.seconds += seconds

    def add_bytes(self, nbytes: int) -> None:
        """Bytes moved, as an engine reports them summed over its transfers, apart from
        the transfers themselves (which then count ``nbytes=0``)."""
        self.bytes += nbytes

    def fail(self, blocks: int, nbytes: int = 0) -> None:
        """A batch of ``blocks`` blocks failed to move."""
        self.failures += blocks

    def drop(self, blocks: int) -> None:
        """``blocks`` distinct blocks were refused because the destination tier was full."""
        self.drops += blocks

    # kvobs.kernels reports through TransferLink (completed / failed): the same events.
    def completed(self, blocks: int, nbytes: int, seconds: float) -> None:
        """:meth:`transfer`, under the name :class:`kvobs.kernels.link.TransferLink` uses."""
        self.transfer(blocks, nbytes, seconds)

    failed = fail


class LinkRecorder(LinkCore):
    """Transfers in one direction, fed by the :class:`~kvobs.events.LinkEvents` vocabulary
    (the event methods come from :class:`LinkCore`).

    ``transfer`` is called once per batch, not per block. Durations go to a bounded
    buffer that the telemetry sink drains into a histogram at collection time; when it
    is full, samples are dropped and counted, counters stay exact.

    ``counts=False`` makes a link that only times transfers (``timed``): a process that
    sees a transfer's device time but not its landing (a vLLM worker, whose scheduler
    process counts the transfer) exports the duration histogram and no counters, so a
    sum across processes never counts one transfer twice.
    """

    __slots__ = ("counts", "dst", "src")

    def __init__(self, src: str, dst: str, buffer_limit: int = 65536, counts: bool = True):
        self.src = src
        self.dst = dst
        self.counts = counts
        self.operations = 0
        self.blocks = 0
        self.bytes = 0
        self.failures = 0
        self.drops = 0
        self.seconds = 0.0
        self.dropped_samples = 0
        self.buffer_limit = buffer_limit
        self.durations = deque()

    def drain_durations(self) -> list[float]:
        """Take the buffered durations (oldest first); safe against concurrent appends."""
        taken = []
        pop = self.durations.popleft
        for _ in range(len(self.durations)):
            taken.append(pop())
        return taken

    def snapshot(self) -> LinkSnapshot:
        """Point-in-time copy of the counters."""
        return LinkSnapshot(
            self.src,
            self.dst,
            self.operations,
            self.blocks,
            self.bytes,
            self.failures,
            self.drops,
            self.seconds,
            self.counts,
        )


class Recorder:
    """All counters of one engine: tiers, transfer links, lookups, thrash, errors.

    Args:
        engine: value of the ``engine`` label (``vllm``, ``lmcache``, ``demo``...).
        model: value of the ``model`` label.
        thrash_window_s: an onload within this many seconds of the block's offload
            counts as thrash.
        clock_ns: the thrash tracker's clock; simulations pass their virtual clock.
        labels: constant labels this process adds to every series (``dp_rank``,
            ``role``...), for processes of one engine that export side by side.
        profile_reuse: keep the reuse-distance profile of keyed lookups
            (:mod:`kvobs.reuse`).
        residency_rate: fraction of keyed blocks whose residency is sampled
            (:mod:`kvobs.residency`).
        exclusive_tiers: a block lives in one tier at a time, so the cache holds the
            sum of the tiers' blocks (default: inclusive tiers, the largest tier's).
    """

    def __init__(
        self,
        engine: str = "unknown",
        model: str = "unknown",
        thrash_window_s: float = 10.0,
        clock_ns: Callable[[], int] = time.monotonic_ns,
        labels: Mapping[str, str] | None = None,
        profile_reuse: bool = True,
        residency_rate: float = 1 / 16,
        exclusive_tiers: bool = False,
    ) -> None:
        self.engine = engine
        self.model = model
        self.labels = dict(labels or {})
        self.clock_ns = clock_ns
        self.residency_rate = residency_rate
        self._tiers: dict[str, TierRecorder] = {}
        self._links: dict[tuple[str, str], LinkRecorder] = {}
        self._setup_lock = threading.Lock()
        self.thrash = ThrashTracker(window_s=thrash_window_s, clock_ns=clock_ns)
        self.lookups = 0
        self.lookup_tokens = 0
        self.gpu_hit_tokens = 0
        self.host_hit_tokens = 0
        self.disk_hit_tokens = 0
        #: missed tokens per cause (:data:`~kvobs.snapshot.MISS_CAUSES`), summing to the
        #: lookups' missed tokens
        self.miss_causes = [0] * len(MISS_CAUSES)
        #: evicted missed tokens an LRU cache of twice the capacity would have hit
        self.miss_recoverable = 0
        #: ``explain(keys) -> (dropped, in_flight)`` of lookup keys missed within the
        #: capacity (an adapter that knows refused and unfinished offloads), or None
        self.miss_explainer: Callable[[Sequence[Hashable]], tuple[int, int]] | None = None
        #: tokens per lookup key (the GPU tier's block), set when the profile starts
        self.key_tokens = 0
        self.prefill_cost = PrefillCost()
        self.host_saved_s = 0.0
        self.disk_saved_s = 0.0
        #: re-lookups of preempted requests (vLLM), apart from the lookups; None until an
        #: adapter that tells them apart calls :meth:`track_relookups`
        self.relookups: list[int] | None = None  # [lookups, tokens, gpu, host, disk hits]
        self.profile_reuse = profile_reuse
        self.exclusive_tiers = exclusive_tiers
        self.reuse: ReuseProfile | None = None
        self.trace: TraceWriter | None = None
        #: blocks written since the last keyed lookup, in order (one list for the
        #: recorder's life: a flush empties it in place, so a hot reader may hold it)
        self.written_pending: list[Hashable] = []
        self._errors: dict[str, int] = {}
        self._error_log_limit = RateLimit(60.0)
        #: The duration / residency samples as histograms; drained at collection only.
        self.histograms = SampleHistograms(self)
        #: Series an adapter owns beyond the tiers and links (read at collection).
        self.sources: tuple[SeriesSource, ...] = ()

    def add_tier(
        self, name: str, capacity_blocks: int, block_tokens: int, block_bytes: int, *,
        role: str = "", request_blocks: int = 0,
    ) -> TierRecorder:
        """Register a tier (or return the existing one after updating its capacity).

        The host tier's keyed events (stores, reuses, evictions) feed the thrash tracker.
        ``role`` (``primary`` / ``cache``, default by name) and ``request_blocks`` (blocks
        one request needs in a primary tier, where the engine says) shape the capacity
        log (see :class:`kvobs.capacity.CapacityPlan`).
        """
        validate_tier_name(name)
        for field, value in (
            ("capacity_blocks", capacity_blocks),
            ("block_tokens", block_tokens),
            ("block_bytes", block_bytes),
            ("request_blocks", request_blocks),
        ):
            _check_count(field, value, name)
        if role and role not in ROLES:
            raise ConfigError(f"tier {name!r}: role must be one of {', '.join(ROLES)}, "
                              f"got {role!r}")
        with self._setup_lock:
            tier = self._tiers.get(name)
            if tier is None:
                tier = self._tiers[name] = TierRecorder(
                    name, capacity_blocks, block_tokens, block_bytes,
                    self.thrash if name == HOST else None,
                    ResidencyTracker(clock_ns=self.clock_ns, rate=self.residency_rate),
                )
            else:
                tier.capacity_blocks = capacity_blocks
                tier.block_tokens, tier.block_bytes = block_tokens, block_bytes
            tier.role = role or default_role(name)
            tier.request_blocks = request_blocks
            return tier

    def tier(self, name: str) -> TierRecorder:
        """The recorder of tier ``name``; UnknownTierError names the registered tiers."""
        try:
            return self._tiers[name]
        except KeyError:
            raise UnknownTierError(
                f"tier {name!r} is not registered: call add_tier({name!r}, ...) first "
                f"(registered: {', '.join(self._tiers) or 'none'})"
            ) from None

    @property
    def tier_names(self) -> tuple[str, ...]:
        """Registered tiers, fastest first."""
        return tuple(sorted(self._tiers, key=tier_order))

    def link(self, src: str, dst: str, counts: bool = True) -> LinkRecorder:
        """The transfer recorder for ``src -> dst``, created on first use.

        ``counts=False`` (at creation) makes a link that only times transfers; see
        :class:`LinkRecorder`.
        """
        key = (src, dst)
        link = self._links.get(key)
        if link is None:
            validate_tier_name(src)
            validate_tier_name(dst)
            with self._setup_lock:
                link = self._links.setdefault(key, LinkRecorder(src, dst, counts=counts))
        return link

    @property
    def links(self) -> tuple[LinkRecorder, ...]:
        """All transfer directions seen so far."""
        return tuple(self._links.values())

    def lookup(self, tokens: int, gpu_hit: int = 0, host_hit: int = 0, disk_hit: int = 0,
               keys: Sequence[Hashable] | None = None,
               cacheable_tokens: int | None = None) -> None:
        """One prefix lookup of ``tokens`` prompt tokens and where they were found.

        Tokens not found in any tier are misses. Hits beyond ``tokens`` raise ``tokens``
        so that the outcomes always sum to the looked-up tokens. Host and disk hits
        count as saved prefill at the current :attr:`prefill_cost`; while it is unknown
        they are held and credited at the first cost known
        (:meth:`~kvobs.benefit.PrefillCost.hold`). ``keys``, the
        prompt's block keys in order (GPU blocks), feed the reuse-distance profile
        (:mod:`kvobs.reuse`) and the trace, if one is open, and give each missed token a
        cause (:data:`~kvobs.snapshot.MISS_CAUSES`): the missed blocks' reuse distances
        say cold, evicted or within the capacity, and of those the :attr:`miss_explainer`
        (if an adapter set one) which were dropped or in flight; tokens beyond the blocks
        the engine could hit (``cacheable_tokens``, default every key's) are not
        cacheable.

        Example:
            >>> rec = Recorder()
            >>> _ = rec.add_tier("gpu", 4, block_tokens=16, block_bytes=0)
            >>> rec.lookup(40, keys=["a", "b"]); rec.lookup(40, gpu_hit=16, keys=["a", "b"])
            >>> {k: v for k, v in rec.snapshot().lookups.miss_causes().items() if v}
            {'cold': 32, 'other': 16, 'not_cacheable': 16}
        """
        hits = gpu_hit + host_hit + disk_hit
        if tokens < hits:
            tokens = hits
        self.lookups += 1
        self.lookup_tokens += tokens
        self.gpu_hit_tokens += gpu_hit
        self.host_hit_tokens += host_hit
        self.disk_hit_tokens += disk_hit
        cost = self.prefill_cost.seconds_per_token
        if not cost and (host_hit or disk_hit):
            cost = self.prefill_cost.hold(host_hit, disk_hit)  # unknown: the first cost's
        if cost:
            self.host_saved_s += host_hit * cost
            self.disk_saved_s += disk_hit * cost
        missed = tokens - hits
        if keys is None:
            self.miss_causes[UNKNOWN] += missed
            return
        profile = self.reuse
        if profile is None and self.profile_reuse:
            profile = self.start_reuse_profile()
        # the blocks written since, then this prompt: engine order (one profile call)
        pending, trace = self.written_pending, self.trace
        if trace is not None and pending:
            trace.write(pending, written=True)
        block = self.key_tokens
        causes = self.miss_causes
        if profile is None:
            pending.clear()
            causes[UNKNOWN] += missed
        elif not missed or not block:
            profile.written_then_reference(pending, keys)
            causes[UNKNOWN] += missed
        else:
            first = -(-hits // block)  # the first block not (even partly) hit
            last = len(keys) if cacheable_tokens is None else \
                min(len(keys), cacheable_tokens // block)
            classified = max(min(last - first, missed // block), 0)
            explain = self.miss_explainer
            within: list[int] = []
            found = profile.written_then_reference(
                pending, keys, first, first + classified, profile.capacity_blocks,
                *((within,) if explain is not None else ()))
            assert found is not None
            cold, evicted, other, recoverable = found
            dropped = in_flight = 0
            if within and explain is not None:
                try:  # an adapter's reader: never into the engine, never past `other`
                    dropped, in_flight = explain([keys[i] for i in within])
                    dropped = min(max(dropped, 0), other)
                    in_flight = min(max(in_flight, 0), other - dropped)
                except Exception as exc:
                    self.error("recorder.miss_explainer", exc)
                    dropped = in_flight = 0
            causes[COLD] += cold * block
            causes[EVICTED] += evicted * block
            self.miss_recoverable += recoverable * block
            causes[DROPPED] += dropped * block
            causes[IN_FLIGHT] += in_flight * block
            causes[OTHER] += (other - dropped - in_flight) * block
            causes[NOT_CACHEABLE] += missed - (cold + evicted + other) * block
        if trace is not None:
            trace.write(keys)

    def written(self, keys: Sequence[Hashable]) -> None:
        """Blocks ``keys`` entered the cache without a lookup (an answer's blocks written
        during decode, once full): the reuse profile makes them its most recent blocks
        without counting them (:meth:`kvobs.reuse.ReuseProfile.write`), and the trace, if
        one is open, records them as ``written``. Kept in order and handed over at the
        next keyed lookup (they change no count before one): one list extend here, and
        at most :data:`WRITTEN_MAX` waiting (an engine without keyed lookups keeps no
        more). A reader in C may extend :attr:`written_pending` itself while the keys fit
        under that bound, and calls this method when they would not."""
        pending = self.written_pending
        pending.extend(keys)
        if len(pending) > WRITTEN_MAX:
            profile = self.reuse
            if profile is None and self.profile_reuse:
                profile = self.start_reuse_profile()
            self._flush_written(profile)

    def _flush_written(self, profile: ReuseProfile | None) -> None:
        """Hand the written blocks waiting to ``profile`` (and the trace)."""
        pending = self.written_pending
        keys = pending[:]
        pending.clear()
        if profile is not None:
            profile.record(keys, False)
        if self.trace is not None:
            self.trace.write(keys, written=True)

    def track_relookups(self) -> None:
        """Export re-lookups of preempted requests (:meth:`relookup`), from 0."""
        if self.relookups is None:
            self.relookups = [0, 0, 0, 0, 0]

    def relookup(self, tokens: int, gpu_hit: int = 0, host_hit: int = 0,
                 disk_hit: int = 0) -> None:
        """A preempted request looked its prompt up again at re-admission.

        Counted apart from :meth:`lookup` (vLLM's prefix-cache hit rate leaves these
        out, and so do ``kvobs_lookup_tokens_total`` and the reuse profile); its host and
        disk hits spare a recompute all the same, so they count as saved prefill.

        Example:
            >>> rec = Recorder()
            >>> rec.relookup(64, gpu_hit=16, host_hit=32)
            >>> rec.snapshot().relookups.outcomes()["host_hit"], rec.snapshot().lookups.tokens
            (32, 0)
        """
        self.track_relookups()
        tally = self.relookups
        assert tally is not None
        hits = gpu_hit + host_hit + disk_hit
        tally[0] += 1
        tally[1] += max(tokens, hits)
        tally[2] += gpu_hit
        tally[3] += host_hit
        tally[4] += disk_hit
        cost = self.prefill_cost.seconds_per_token
        if not cost and (host_hit or disk_hit):
            cost = self.prefill_cost.hold(host_hit, disk_hit)
        if cost:
            self.host_saved_s += host_hit * cost
            self.disk_saved_s += disk_hit * cost

    def open_trace(self, path: str, max_bytes: int = DEFAULT_TRACE_BYTES,
                   clock: Callable[[], float] = time.time) -> TraceWriter:
        """Write every keyed lookup to ``path`` as JSONL (hashes only) for ``kvobs whatif``,
        up to ``max_bytes``; line-buffered, so a crash loses at most one line.

        Raises:
            ConfigError: the file cannot be created (the message names it).
        """
        try:
            out = open(path, "w", encoding="utf-8", buffering=1)  # noqa: SIM115 - kept open
        except OSError as exc:
            raise ConfigError(f"trace file {path!r} cannot be written ({exc.strerror}): pass "
                              "a path in a writable directory") from None
        self.trace = TraceWriter(out, max_bytes=max_bytes, clock=clock)
        return self.trace

    def step(self, seconds: float, prefill_tokens: int, decode_tokens: int) -> None:
        """One engine step took ``seconds`` for this many scheduled tokens: measures the
        prefill cost per token (:class:`~kvobs.benefit.PrefillCost`)."""
        self.prefill_cost.observe_step(seconds, prefill_tokens, decode_tokens)

    def start_reuse_profile(self, capacity_blocks: int | None = None,
                            rate: float | None = None) -> ReuseProfile | None:
        """Start the reuse-distance profile (the first keyed lookup does it with defaults).

        ``capacity_blocks`` defaults to the distinct blocks the registered tiers hold, in
        tokens over the GPU tier's block size (lookup keys are GPU blocks): the largest
        tier's where the tiers keep copies of each other (inclusive, every engine kvobs
        reads: a block offloaded to the host stays on the GPU until evicted there), their
        sum where a block lives in one tier at a time (``exclusive_tiers``).
        Returns None when no tier is registered yet.
        """
        with self._setup_lock:
            if self.reuse is None:
                tiers = list(self._tiers.values())
                if tiers:  # lookup keys are GPU blocks
                    self.key_tokens = self._tiers[GPU].block_tokens if GPU in self._tiers \
                        else tiers[0].block_tokens
                if capacity_blocks is None:
                    if not tiers:
                        return None
                    block = self.key_tokens
                    held = [t.capacity_blocks * t.block_tokens for t in tiers]
                    tokens = sum(held) if self.exclusive_tiers else max(held)
                    capacity_blocks = max(tokens // max(block, 1), 1)
                self.reuse = ReuseProfile(capacity_blocks, rate=rate)
            return self.reuse

    def add_source(self, source: SeriesSource) -> None:
        """Export the catalog series ``source()`` returns with this recorder's (an
        adapter's own counters, e.g. vLLM HiSparse's hot-buffer counts); every reader of
        the recorder (``/metrics``, OTLP) calls it at collection."""
        with self._setup_lock:
            self.sources = (*self.sources, source)

    def remove_source(self, source: SeriesSource) -> None:
        """Stop exporting ``source`` (an adapter being unwrapped)."""
        with self._setup_lock:
            self.sources = tuple(s for s in self.sources if s != source)

    def error(self, component: str, exc: BaseException | None = None) -> None:
        """Count a failure inside kvobs instrumentation; log it at most once a minute.

        Adapters call this from ``except`` blocks around their bookkeeping, so the
        engine call they wrap goes on with its normal result.
        """
        with self._setup_lock:
            self._errors[component] = self._errors.get(component, 0) + 1
        if self._error_log_limit.allow(component):
            with contextlib.suppress(Exception):  # a broken log sink must not reach the engine
                _log.warning(
                    "instrumentation_error",
                    component=component,
                    error=repr(exc),
                    count=self._errors[component],
                )

    def snapshot(self) -> RecorderSnapshot:
        """Point-in-time copy of everything, for sinks and tests."""
        lookups = LookupSnapshot(
            self.lookups,
            self.lookup_tokens,
            self.gpu_hit_tokens,
            self.host_hit_tokens,
            self.disk_hit_tokens,
            tuple(self.miss_causes),
            self.miss_recoverable,
        )
        tally = self.relookups
        relookups = None if tally is None else LookupSnapshot(tally[0], tally[1], tally[2],
                                                              tally[3], tally[4])
        links = self.links
        cost = self.prefill_cost
        benefit = BenefitSnapshot(self.host_saved_s + cost.backlog_host_s,
                                  self.disk_saved_s + cost.backlog_disk_s,
                                  cost.seconds_per_token, cost.source, cost.relative_error)
        profile = self.reuse
        if profile is None and self.profile_reuse and self._tiers:
            # started at the first collection, before any keyed lookup: its counters are
            # exported from 0, so a rate() over the first scrapes sees every reference
            profile = self.start_reuse_profile()
        reuse = None if profile is None else ReuseSnapshot(
            profile.capacity_blocks, profile.rate, profile.total, tuple(profile.cumulative()),
            profile.forgotten, profile.tracking_rate, profile.exact_blocks)
        return RecorderSnapshot(
            self.engine,
            self.model,
            tuple(self._tiers[name].snapshot() for name in self.tier_names),
            tuple(link.snapshot() for link in links),
            lookups,
            self.thrash.snapshot(),
            dict(self._errors),
            sum(link.dropped_samples for link in links),
            benefit,
            reuse,
            relookups,
        )


def _check_count(field: str, value: int, tier: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{tier} tier: {field} must be a non-negative integer, got {value!r}")
