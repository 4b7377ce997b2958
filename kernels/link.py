"""What a transfer reports to: the recorder's per-direction link, or anything shaped like it.

The kernels never import the recorder. Anything with ``completed`` and ``failed`` (the
kvobs ``LinkRecorder`` from ``rec.link("gpu", "host")``, a test double, an engine's own
sink) can receive transfer reports.
"""

from __future__ import annotations

import logging
from typing import Protocol, runtime_checkable

_log = logging.getLogger(__name__)


@runtime_checkable
class TransferLink(Protocol):
    """Receives one report per finished transfer in one direction (source -> destination tier).

    Example:
        >>> class Printer:
        ...     def completed(self, blocks: int, nbytes: int, seconds: float) -> None:
        ...         print(blocks, nbytes)
        ...     def failed(self, blocks: int, nbytes: int = 0) -> None:
        ...         print("failed", blocks)
        >>> isinstance(Printer(), TransferLink)
        True
    """

    def completed(self, blocks: int, nbytes: int, seconds: float) -> None:
        """Count a transfer of ``blocks`` blocks and ``nbytes`` bytes that took ``seconds``."""

    def failed(self, blocks: int, nbytes: int = 0) -> None:
        """Count a transfer of ``blocks`` blocks that did not complete."""


def report_completed(link: TransferLink | None, blocks: int, nbytes: int, seconds: float) -> None:
    """Hand a completed transfer to ``link``; a broken sink is logged, never raised."""
    if link is None:
        return
    try:
        link.completed(blocks, nbytes, seconds)
    except Exception:  # instrumentation must never break the copy path
        _log.exception("kvobs.kernels: link.completed raised; transfer report dropped")


def report_failed(link: TransferLink | None, blocks: int, nbytes: int) -> None:
    """Hand a failed transfer to ``link``; a broken sink is logged, never raised."""
    if link is None:
        return
    try:
        link.failed(blocks, nbytes)
    except Exception:  # instrumentation must never break the copy path
        _log.exception("kvobs.kernels: link.failed raised; failure report dropped")
