"""``kvobs fleet`` reading SGLang's own KV event publisher (``ZmqEventPublisher``, as
``--kv-events-config`` starts it; its host tier's medium is ``CPU_PINNED``) through a
fleet's faults (``tests/fleet/publisher_checks.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sglang.srt.disaggregation.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    ZmqEventPublisher,
)

from tests.fleet.publisher_checks import CHECKS, Engine, Kit

SGLANG = Kit(
    publisher=ZmqEventPublisher,
    stored=lambda hashes, medium: BlockStored(
        block_hashes=hashes, parent_block_hash=None, token_ids=[0] * 16 * len(hashes),
        block_size=16, lora_id=None, medium=medium),
    removed=lambda hashes, medium: BlockRemoved(block_hashes=hashes, medium=medium),
    cleared=AllBlocksCleared,
    batch=lambda events: KVEventBatch(ts=1.0, events=events),
    host="CPU_PINNED",
)


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__[len("check_"):])
def test_sglangs_publisher(check: Callable[[Kit, list[Engine]], Any],
                           engines: list[Engine]) -> None:
    check(SGLANG, engines)
