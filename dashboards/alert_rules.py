"""Prometheus alerts for tiered KV caches, each with a runbook-style description.

Thresholds are module constants: change them here and run ``kvobs dashboards
--regenerate`` to regenerate the rule files and their Helm chart copies. Every alert carries a
``severity`` label and ``summary``/``description`` annotations; the description says what
happened, what it costs, how to confirm it on the dashboards and what to do.

Example:
    >>> [rule["alert"] for rule in groups()[0]["rules"]][:2]
    ['KvobsHostPoolThrashing', 'KvobsTierFullWithEvictions']
"""

from __future__ import annotations

from typing import Any

from .recording_rules import INSTANCE

#: Share of onloaded blocks that bounced back within the thrash window.
THRASH_RATIO = 0.5
#: Onloaded blocks per second below which thrash is not worth paging on.
THRASH_MIN_ONLOADS_PER_S = 1
#: Occupancy (resident / capacity) from which a tier counts as full.
FULL_OCCUPANCY = 0.95
#: p99 of one transfer batch, seconds.
TRANSFER_P99_S = 0.05
#: How long the host pool may cost more onload time than the prefill it saves.
NET_LOSS_FOR = "15m"

_WHERE = "{{ $labels.instance }} ({{ $labels.model }})"
_DIRECTION = "{{ $labels.src_tier }} → {{ $labels.dst_tier }}"


def _alert(name: str, expr: str, for_: str, severity: str, summary: str,
           description: str) -> dict[str, Any]:
    return {
        "alert": name,
        "expr": expr,
        "for": for_,
        "labels": {"severity": severity},
        "annotations": {"summary": summary, "description": description},
    }


def alerts() -> list[dict[str, Any]]:
    """Every kvobs alert."""
    return [
        _alert(
            "KvobsHostPoolThrashing",
            f"(instance:kvobs_thrash_ratio:rate5m > {THRASH_RATIO})\n"
            f"and on ({INSTANCE})\n"
            f"(sum by ({INSTANCE}) (rate(kvobs_thrash_onloads_total[5m])) "
            f"> {THRASH_MIN_ONLOADS_PER_S})",
            "15m", "warning",
            f"KV blocks thrash between the GPU and host tiers on {_WHERE}",
            "What: {{ $value | humanizePercentage }} of the blocks onloaded from the host tier "
            "went back to the GPU shortly after being offloaded.\n"
            "Impact: PCIe bandwidth and onload latency are spent moving the same blocks back "
            "and forth; time to first token rises.\n"
            "Check: 'Host pool health' dashboard, panel 'Re-onload (thrash) rate', and GPU "
            "occupancy on 'KV cache tiers'.\n"
            "Fix: the GPU tier is too small for the working set: raise gpu_memory_utilization, "
            "lower max_num_seqs, or route requests sharing a prefix to the same replica.",
        ),
        _alert(
            "KvobsTierFullWithEvictions",
            f"(instance:kvobs_tier_occupancy:ratio > {FULL_OCCUPANCY})\n"
            f"and on ({INSTANCE}, tier)\n"
            f"(sum by ({INSTANCE}, tier) "
            f'(rate(kvobs_block_evictions_total{{reason="capacity"}}[5m])) > 0)',
            "30m", "warning",
            f"The {{{{ $labels.tier }}}} KV tier of {_WHERE} is full and evicting",
            "What: the {{ $labels.tier }} tier has been over "
            f"{FULL_OCCUPANCY:.0%} occupied while evicting cached blocks for capacity for 30 "
            "minutes.\n"
            "Impact: reusable context is thrown away; later requests with the same prefix "
            "miss and recompute it.\n"
            "Check: 'KV cache tiers' dashboard, panels 'Resident occupancy of "
            "{{ $labels.tier }} (in use vs cached)' and 'Evictions per tier and reason'; "
            "'Hit ratio per tier' shows what it costs.\n"
            "Fix: add capacity to the tier (host pool size, GPU memory share), or add a "
            "lower tier so evicted blocks are offloaded instead of dropped.",
        ),
        _alert(
            "KvobsTransferLatencyHigh",
            f"instance:kvobs_transfer_duration_seconds:p99_rate5m > {TRANSFER_P99_S}",
            "10m", "warning",
            f"KV transfer p99 {_DIRECTION} above {TRANSFER_P99_S * 1000:g} ms on {_WHERE}",
            "What: the p99 duration of one {{ $labels.src_tier }} → {{ $labels.dst_tier }} "
            "transfer batch is {{ $value | humanizeDuration }}.\n"
            "Impact: host hits wait for their onload before prefill can skip them; a slow "
            "onload can cost more than recomputing the prefix.\n"
            "Check: 'KV cache tiers' dashboard, panels 'Transfer latency p50 / p99' and "
            "'Transfer latency heatmap'; compare throughput with the PCIe peak.\n"
            "Fix: look for PCIe contention (other copies, NCCL), pageable instead of pinned "
            "host memory, a NUMA-remote host pool, or batches too large for the link.",
        ),
        _alert(
            "KvobsHostPoolCostsMoreThanItSaves",
            "instance:kvobs_host_pool_net_benefit_seconds:rate5m < 0",
            NET_LOSS_FOR, "warning",
            f"The host pool of {_WHERE} costs more onload time than the prefill it saves",
            "What: the host pool's net benefit is {{ $value | humanize }} seconds of "
            "prefill per second (prefill its hits saved minus their onload time): onloading "
            "those tokens takes longer than recomputing them would.\n"
            "Impact: the host pool adds latency instead of removing it; PCIe bandwidth is "
            "spent for nothing.\n"
            "Check: 'Host pool health' dashboard, row 'Host pool verdict': saved vs onload "
            "seconds, onload latency, and the what-if curve (would a smaller GPU or host "
            "tier hit as often?). kvobs_prefill_cost_info says where the prefill cost comes "
            "from; a configured one may be stale.\n"
            "Fix: look for slow onloads (pageable memory, PCIe contention), offload only "
            "long prefixes, or turn the host pool off for this workload.",
        ),
        _alert(
            "KvobsOffloadDrops",
            f"sum by ({INSTANCE}, src_tier, dst_tier) "
            f"(rate(kvobs_transfer_drops_total[5m])) > 0",
            "15m", "warning",
            f"Offloads {_DIRECTION} dropped on {_WHERE}",
            "What: {{ $value | humanize }} blocks per second were not offloaded because the "
            "destination tier was full.\n"
            "Impact: those blocks are lost when the GPU evicts them; their prefixes will be "
            "recomputed.\n"
            "Check: 'KV cache tiers' dashboard, panel 'Drops and failures'; 'Host pool "
            "health', panel 'Host occupancy'.\n"
            "Fix: enlarge the destination tier or make it evict (LRU) instead of refusing "
            "new blocks.",
        ),
        _alert(
            "KvobsTransferFailures",
            f"sum by ({INSTANCE}, src_tier, dst_tier) "
            f"(rate(kvobs_transfer_failures_total[5m])) > 0",
            "5m", "critical",
            f"KV block transfers {_DIRECTION} fail on {_WHERE}",
            "What: {{ $value | humanize }} blocks per second failed to transfer.\n"
            "Impact: onload failures turn hits into recomputes; offload failures lose "
            "context. Repeated failures can point at a failing device or host memory "
            "pressure.\n"
            "Check: the engine's logs at the times of the failures, and 'KV cache tiers' "
            "dashboard, panel 'Drops and failures'.\n"
            "Fix: resolve the logged cause (CUDA errors, pinned memory allocation failures); "
            "restart the instance if the device is in an error state.",
        ),
        _alert(
            "KvobsInstrumentationErrors",
            "sum by (namespace, job, instance, component) "
            "(rate(kvobs_instrumentation_errors_total[5m])) > 0",
            "15m", "info",
            "kvobs instrumentation fails in {{ $labels.component }} on {{ $labels.instance }}",
            "What: a kvobs hook in {{ $labels.component }} raised; the engine call went on "
            "unaffected but the figures it feeds are incomplete.\n"
            "Check: kvobs log lines with event=instrumentation_error.\n"
            "Fix: usually an engine version kvobs does not know yet; report the logged "
            "exception with the engine version.",
        ),
        _alert(
            "KvobsTargetAbsent",
            "absent(kvobs_lookups_total)",
            "10m", "warning",
            "No kvobs metrics in Prometheus",
            "What: no series of kvobs_lookups_total has been scraped for 10 minutes.\n"
            "Impact: every kvobs dashboard and alert is blind.\n"
            "Check: Prometheus targets page for the kvobs job (up == 0?), the exporter "
            "address (default :9464/metrics) and the ServiceMonitor selector.\n"
            "Fix: start the exporter with the engine, or fix the scrape configuration.",
        ),
    ]


def groups() -> list[dict[str, Any]]:
    """The rule groups of ``kvobs-alerts.rules.yaml``."""
    return [{"name": "kvobs.alerts", "rules": alerts()}]
