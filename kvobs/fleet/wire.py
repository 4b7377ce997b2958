"""The KV cache events vLLM and SGLang publish, read without either installed.

Both engines publish the same documented format over ZeroMQ (``--kv-events-config``): a
multipart message ``(topic, sequence number, payload)`` whose payload is a msgpack array
``[ts, events, data_parallel_rank]``; each event a map tagged by ``type``:

* ``BlockStored``: ``block_hashes`` (64-bit integers, or bytes when vLLM publishes raw
  hashes), ``block_size`` tokens a block (0 where vLLM's offloading connector publishes a
  placeholder without the block's metadata), ``medium`` (the tier: ``GPU`` when absent);
* ``BlockRemoved``: ``block_hashes``, ``medium``;
* ``AllBlocksCleared``: the engine dropped its prefix cache (its GPU pool, or the
  ``medium`` named).

Fields this reader does not know are ignored (both engines add optional fields from
release to release and omit those left at their default); an event of a type it does not
know, or one missing a field it needs, is counted and skipped, never fatal.

Example:
    >>> import msgspec
    >>> payload = msgspec.msgpack.encode([1.5, [
    ...     {"type": "BlockStored", "block_hashes": [7, -1], "block_size": 16,
    ...      "medium": "CPU", "parent_block_hash": None, "token_ids": [], "lora_id": None},
    ...     {"type": "Renamed"}], 0])
    >>> batch = decode_batch(payload)
    >>> batch.events, batch.unknown
    ([('stored', 'host', [7, 18446744073709551615], 16)], 1)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from kvobs.fleet.index import CLEARED, REMOTE, REMOVED, STORED, Event
from kvobs.tiers import DISK, GPU, HOST

#: Each engine's medium names (vLLM: GPU, CPU, STORAGE; SGLang: GPU, CPU_PINNED, DISK,
#: EXTERNAL) and the tier kvobs calls it.
MEDIUM_TIERS: dict[str | None, str] = {
    None: GPU, "GPU": GPU, "CPU": HOST, "CPU_PINNED": HOST, "STORAGE": DISK, "DISK": DISK,
    "EXTERNAL": REMOTE,
}
#: What a reader returns for an event it skips.
MALFORMED, UNKNOWN = "malformed", "unknown"
_M64 = (1 << 64) - 1
_GROUP_MIX = 0x9E3779B97F4A7C15


class MalformedBatch(ValueError):
    """A payload that is not an event batch at all."""


@dataclass
class Batch:
    """One decoded payload: its events in order, and those skipped."""

    ts: float
    events: list[Event] = field(default_factory=list)
    unknown: int = 0     # events of a type, or naming a medium, this reader does not know
    malformed: int = 0   # events missing a field, or with one of the wrong type


class _Stored(msgspec.Struct, tag="BlockStored"):
    block_hashes: list[int]
    block_size: int
    medium: str | None = None
    group_idx: int | None = None


class _Removed(msgspec.Struct, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None = None
    group_idx: int | None = None


class _Cleared(msgspec.Struct, tag="AllBlocksCleared"):
    medium: str | None = None


class _Batch(msgspec.Struct, array_like=True):
    ts: float
    events: list[_Stored | _Removed | _Cleared]


_decode = msgspec.msgpack.Decoder().decode
_decode_typed = msgspec.msgpack.Decoder(_Batch).decode


def decode_batch(payload: bytes) -> Batch:
    """The events of one payload: decoded straight into the known events' fields (the
    usual batch: integer hashes, known types), else read field by field.

    Raises:
        MalformedBatch: ``payload`` is not msgpack, or not ``[ts, events, ...]``.
    """
    try:
        typed = _decode_typed(payload)
    except (msgspec.ValidationError, OverflowError):
        pass  # an unknown type, raw hash bytes, a missing field: the careful reader
    except msgspec.DecodeError as exc:
        raise MalformedBatch(f"not msgpack: {exc}") from None
    else:
        batch = Batch(typed.ts)
        for event in typed.events:
            tier = MEDIUM_TIERS.get(event.medium)
            if tier is None:
                batch.unknown += 1
            elif isinstance(event, _Cleared):
                batch.events.append((CLEARED, tier, [], 0))
            elif event.group_idx or (event.block_hashes and min(event.block_hashes) < 0):
                # signed hashes or a KV cache group: reread key by key
                return _decode_careful(payload)
            elif isinstance(event, _Stored):
                if event.block_size < 0:
                    batch.malformed += 1
                else:
                    batch.events.append((STORED, tier, event.block_hashes, event.block_size))
            else:
                batch.events.append((REMOVED, tier, event.block_hashes, 0))
        return batch
    return _decode_careful(payload)


def _decode_careful(payload: bytes) -> Batch:
    try:
        raw = _decode(payload)
    except msgspec.DecodeError as exc:
        raise MalformedBatch(f"not msgpack: {exc}") from None
    if not (isinstance(raw, list) and len(raw) >= 2 and isinstance(raw[0], int | float)
            and isinstance(raw[1], list)):
        raise MalformedBatch("not an event batch [ts, events, ...]")
    batch = Batch(float(raw[0]))
    for item in raw[1]:
        kind = item.get("type") if isinstance(item, dict) else None
        reader = _READERS.get(kind) if isinstance(kind, str) else None
        if reader is None:
            if isinstance(kind, str):
                batch.unknown += 1
            else:
                batch.malformed += 1
            continue
        event = reader(item)
        if event is MALFORMED:
            batch.malformed += 1
        elif event is UNKNOWN:
            batch.unknown += 1
        else:
            batch.events.append(event)  # type: ignore[arg-type]
    return batch


def block_key(block_hash: Any, group: Any = None) -> int | None:
    """A block hash as the index keys it: a 64-bit integer (signed ones wrapped, raw hash
    bytes read by their first 8), told apart per KV cache group."""
    if isinstance(block_hash, bool):
        return None
    if isinstance(block_hash, int):
        key = block_hash & _M64
    elif isinstance(block_hash, bytes) and block_hash:
        key = int.from_bytes(block_hash[:8], "big")
    else:
        return None
    if isinstance(group, int) and group:
        key ^= (group * _GROUP_MIX) & _M64
    return key


def _keys(item: dict[str, Any]) -> list[int] | None:
    hashes = item.get("block_hashes")
    if not isinstance(hashes, list):
        return None
    group = item.get("group_idx")
    if not group:
        try:  # the usual case, integers: one pass, no call per hash
            return [h & _M64 for h in hashes]
        except TypeError:  # raw hash bytes, or a malformed hash: one at a time below
            pass
    keys = [block_key(h, group) for h in hashes]
    return None if None in keys else keys  # type: ignore[return-value]


def _tier(item: dict[str, Any]) -> str:
    medium = item.get("medium")
    if medium is not None and not isinstance(medium, str):
        return MALFORMED
    return MEDIUM_TIERS.get(medium, UNKNOWN)


def _stored(item: dict[str, Any]) -> Event | str:
    keys, tier, size = _keys(item), _tier(item), item.get("block_size")
    if keys is None or not isinstance(size, int) or isinstance(size, bool) or size < 0:
        return MALFORMED
    return tier if tier in (MALFORMED, UNKNOWN) else (STORED, tier, keys, size)


def _removed(item: dict[str, Any]) -> Event | str:
    keys, tier = _keys(item), _tier(item)
    if keys is None:
        return MALFORMED
    return tier if tier in (MALFORMED, UNKNOWN) else (REMOVED, tier, keys, 0)


def _cleared(item: dict[str, Any]) -> Event | str:
    tier = _tier(item)
    return tier if tier in (MALFORMED, UNKNOWN) else (CLEARED, tier, [], 0)


_READERS = {"BlockStored": _stored, "BlockRemoved": _removed, "AllBlocksCleared": _cleared}
