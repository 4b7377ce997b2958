"""GPU memory and PCIe link facts from NVML, exported next to the recorder's series.

With a GPU and the ``nvml`` extra (``nvidia-ml-py``), every collection reads device
memory total/used and the current PCIe link, and derives the link's peak bandwidth per
direction from its *maximum* generation and width: an idle GPU downshifts its link
(often to Gen1), so the current generation would make the "peak" line drop whenever the
GPU rests. Without NVML, :func:`nvml_source` logs one info line and returns None: no
series are exported rather than zeros that would look like a real, empty GPU. Likewise
a value NVML does not know (a query that is not supported, an unknown generation) gives
no series for that device rather than a 0.

Example:
    >>> pcie_peak_bytes_per_second(generation=4, width=16)
    31507692307
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvobs.telemetry.series import Labels, SeriesSource

#: Per-lane transfer rate (GT/s) and line-code efficiency of each PCIe generation.
_PCIE_LANE = {
    1: (2.5, 8 / 10),
    2: (5.0, 8 / 10),
    3: (8.0, 128 / 130),
    4: (16.0, 128 / 130),
    5: (32.0, 128 / 130),
    6: (64.0, 242 / 256),
}


#: NVML answers 0xFFFFFFFF (or 0) where it cannot tell.
_UNKNOWN = (0, 0xFFFFFFFF)


def pcie_peak_bytes_per_second(generation: int, width: int) -> int | None:
    """Raw peak bandwidth of a PCIe link in one direction, in bytes per second.

    None for a generation or width that is not known (not 0, which reads as a real link).
    """
    lane = _PCIE_LANE.get(generation)
    if lane is None or width in _UNKNOWN or width < 0:
        return None
    gt_per_s, efficiency = lane
    return int(gt_per_s * 1e9 * efficiency / 8 * width)


def _known(read: Any, handle: Any) -> int | None:
    """``read(handle)``, or None when NVML cannot tell (not supported, unknown value)."""
    try:
        value = int(read(handle))
    except Exception:  # NVMLError_NotSupported (C2C-attached GPUs, some VMs)...
        return None
    return None if value in _UNKNOWN or value < 0 else value


class NvmlSource:
    """Reads NVML at collection time; one instance per process."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._handles = [
            nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())
        ]
        self._peak: dict[int, int] = {}

    def __call__(self) -> Mapping[str, list[tuple[Labels, float]]]:
        nvml = self._nvml
        series: dict[str, list[tuple[Labels, float]]] = {}
        for index, handle in enumerate(self._handles):
            device = {"device": str(index)}
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            peak = self._peak.get(index)
            if peak is None:  # the maximum link never changes: read it until known
                generation = _known(nvml.nvmlDeviceGetMaxPcieLinkGeneration, handle)
                width = _known(nvml.nvmlDeviceGetMaxPcieLinkWidth, handle)
                if generation is not None and width is not None:
                    peak = pcie_peak_bytes_per_second(generation, width)
                    if peak is not None:
                        self._peak[index] = peak
            for name, value in (
                ("kvobs_gpu_memory_total_bytes", memory.total),
                ("kvobs_gpu_memory_used_bytes", memory.used),
                ("kvobs_pcie_link_generation",
                 _known(nvml.nvmlDeviceGetCurrPcieLinkGeneration, handle)),
                ("kvobs_pcie_link_width", _known(nvml.nvmlDeviceGetCurrPcieLinkWidth, handle)),
                ("kvobs_pcie_peak_bandwidth_bytes_per_second", peak),
            ):
                if value is not None:
                    series.setdefault(name, []).append((device, value))
        return series


def nvml_source(logger: Any) -> SeriesSource | None:
    """An NVML series source, or None (logged once at info level) when NVML is absent."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return NvmlSource(pynvml)
    except ImportError:
        reason = "nvidia-ml-py is not installed (pip install 'kvobs[nvml]')"
    except Exception as exc:  # NVMLError_LibraryNotFound, driver not loaded, no GPU...
        reason = f"NVML unavailable: {exc}"
    logger.info("nvml_unavailable", reason=reason, exported="no GPU memory or PCIe metrics")
    return None
