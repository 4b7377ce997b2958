"""Grafana unit ids as human-readable labels, for ``kvobs report`` and ``kvobs top``.

Bytes are IEC (``GiB``, as Grafana's ``bytes`` unit; byte axes tick at binary steps),
byte rates SI (``GB/s``, as Grafana's ``Bps``). Only the standard library.

Example:
    >>> format_value(3 * 1024**3, "bytes"), format_value(2.5e9, "Bps"), format_value(0.0042, "s")
    ('3 GiB', '2.5 GB/s', '4.2 ms')
    >>> format_value(0.873, "percentunit"), format_value(12_500, "short")
    ('87.3%', '12.5k')
    >>> [format_value(v, "bytes") for v in binary_ticks(0, 37 * 1024**3)]
    ['0 B', '8 GiB', '16 GiB', '24 GiB', '32 GiB', '40 GiB']
"""

from __future__ import annotations

import math

_IEC = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
_SI = ("", "k", "M", "G", "T", "P")


def _scaled(value: float, base: float, prefixes: tuple[str, ...]) -> tuple[float, str]:
    magnitude = abs(value)
    index = 0
    while magnitude >= base and index < len(prefixes) - 1:
        magnitude /= base
        index += 1
    return math.copysign(magnitude, value), prefixes[index]


def _number(value: float) -> str:
    return f"{value:.3g}"


def format_value(value: float, unit: str) -> str:
    """``value`` in ``unit`` (a Grafana unit id) as a short label."""
    if not math.isfinite(value):
        return str(value)
    if unit == "bytes":
        scaled, prefix = _scaled(value, 1024.0, _IEC)
        return f"{_number(scaled)} {prefix}"
    if unit == "Bps":
        scaled, prefix = _scaled(value, 1000.0, _SI)
        return f"{_number(scaled)} {prefix}B/s"
    if unit == "s":
        magnitude = abs(value)
        if magnitude == 0:
            return "0 s"
        if magnitude < 1e-3:
            return f"{_number(value * 1e6)} µs"
        if magnitude < 1:
            return f"{_number(value * 1e3)} ms"
        return f"{_number(value)} s"
    if unit == "percentunit":
        return f"{value * 100:.3g}%"
    scaled, prefix = _scaled(value, 1000.0, _SI)
    return f"{_number(scaled)}{prefix}"


#: Units whose axes tick at binary steps (Grafana's IEC ``bytes``).
BINARY_UNITS = frozenset({"bytes"})


def binary_ticks(vmin: float, vmax: float, nbins: int = 6) -> list[float]:
    """Ticks covering ``vmin``..``vmax`` at multiples of a power of two (at least 1), the
    smallest one that needs no more than ``nbins`` steps: IEC labels then read
    ``512 MiB``, ``1 GiB``, ``1.5 GiB`` instead of ``954 MiB``, ``1.86 GiB``."""
    if not (math.isfinite(vmin) and math.isfinite(vmax)) or vmax <= vmin:
        return [vmin] if math.isfinite(vmin) else []
    step = 2.0 ** max(0, math.ceil(math.log2((vmax - vmin) / nbins)))
    first = math.floor(vmin / step)
    last = math.ceil(vmax / step)
    return [i * step for i in range(first, last + 1)]


def describe(unit: str) -> str:
    """What the axis of a panel in ``unit`` measures, for its label."""
    return {"bytes": "bytes", "Bps": "bytes/s", "s": "seconds", "percentunit": "share",
            "short": ""}.get(unit, unit)
