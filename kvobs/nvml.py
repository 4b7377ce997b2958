"""GPU memory and PCIe link facts from NVML, exported next to the recorder's series.

With a GPU and the ``nvml`` extra (``nvidia-ml-py``), every collection reads device
memory total/used and the current PCIe link, and derives the link's peak bandwidth per
direction. Without them, :func:`nvml_source` logs one info line and returns None: no
series are exported rather than zeros that would look like a real, empty GPU.

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


def pcie_peak_bytes_per_second(generation: int, width: int) -> int:
    """Raw peak bandwidth of a PCIe link in one direction, in bytes per second."""
    gt_per_s, efficiency = _PCIE_LANE.get(generation, (0.0, 0.0))
    return int(gt_per_s * 1e9 * efficiency / 8 * width)


class NvmlSource:
    """Reads NVML at collection time; one instance per process."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._handles = [
            nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())
        ]

    def __call__(self) -> Mapping[str, list[tuple[Labels, float]]]:
        nvml = self._nvml
        series: dict[str, list[tuple[Labels, float]]] = {}
        for index, handle in enumerate(self._handles):
            device = {"device": str(index)}
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            generation = nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle)
            width = nvml.nvmlDeviceGetCurrPcieLinkWidth(handle)
            for name, value in (
                ("kvobs_gpu_memory_total_bytes", memory.total),
                ("kvobs_gpu_memory_used_bytes", memory.used),
                ("kvobs_pcie_link_generation", generation),
                ("kvobs_pcie_link_width", width),
                (
                    "kvobs_pcie_peak_bandwidth_bytes_per_second",
                    pcie_peak_bytes_per_second(generation, width),
                ),
            ):
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
