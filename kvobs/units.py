"""Grafana unit ids as human-readable labels, for ``kvobs report`` and ``kvobs top``.

Bytes are IEC (``GiB``, as Grafana's ``bytes`` unit; byte axes tick at binary steps),
byte rates SI (``GB/s``, as Grafana's ``Bps``). Each label takes the prefix that keeps its
number below the base (1024 or 1000), in three significant digits, whole with thousands
separators from 1,000 (``1,010 KiB``, then ``1 MiB``): never an exponent. Only the
standard library.

Example:
    >>> format_value(3 * 1024**3, "bytes"), format_value(2.5e9, "Bps"), format_value(0.0042, "s")
    ('3 GiB', '2.5 GB/s', '4.2 ms')
    >>> format_value(0.873, "percentunit"), format_value(12_500, "short")
    ('87.3%', '12.5k')
    >>> format_value(1010 * 1024, "bytes"), format_value(1_048_575, "bytes")
    ('1,010 KiB', '1 MiB')
    >>> [format_value(v, "bytes") for v in binary_ticks(0, 37 * 1024**3)]
    ['0 B', '8 GiB', '16 GiB', '24 GiB', '32 GiB', '40 GiB']
"""

from __future__ import annotations

import math

_IEC = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
_SI = ("", "k", "M", "G", "T", "P")


def _shown(magnitude: float) -> float:
    """``magnitude`` (>= 0) as its label shows it: three significant digits, or the
    whole number from 1,000 up."""
    rounded = float(f"{magnitude:.3g}")
    return rounded if rounded < 1000 else float(round(magnitude))


def _scaled(value: float, base: float, prefixes: tuple[str, ...]) -> tuple[float, str]:
    """``value`` in the largest prefix that shows it as at least 1, so its label reads
    below ``base`` (``1,023 KiB``, then ``1 MiB``; the last prefix has no ceiling)."""
    magnitude = abs(value)
    index = 0
    while _shown(magnitude) >= base and index < len(prefixes) - 1:
        magnitude /= base
        index += 1
    return math.copysign(magnitude, value), prefixes[index]


def _number(value: float) -> str:
    """Three significant digits (``1.01``, ``977``), whole with thousands separators
    from 1,000 (``1,010``): never an exponent such as ``1.01e+03``."""
    if _shown(abs(value)) < 1000:
        return f"{value:.3g}"
    return f"{value:,.0f}"


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
        if _shown(magnitude * 1e6) < 1000:
            return f"{_number(value * 1e6)} µs"
        if _shown(magnitude * 1e3) < 1000:
            return f"{_number(value * 1e3)} ms"
        return f"{_number(value)} s"
    if unit == "percentunit":
        return f"{_number(value * 100)}%"
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
