"""`kvobs whatif --prometheus` against a real Prometheus scraping three kvobs endpoints.

Two engines of 64 blocks and one of 200 export their reuse profiles; Prometheus scrapes
them every second. The answer must sum only engines of one capacity (their bucket
bounds are the same), give one curve per capacity, and equal an exact LRU replay of what
each engine was fed (the fleet's hit ratio at a size: the engines' exact hits added,
over their references added). A Prometheus that lacks one series is named, exit 2.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import pytest

import kvobs
from tests.e2e.e2e_servers import poll, start_prometheus
from tests.lru_oracle import exact_lru_hit_ratio, zipf
from tests.required import find_tool

ENGINES = {"a": (64, 1), "b": (64, 2), "c": (200, 3)}  # engine: (capacity, seed)


def feed(capacity: int, seed: int) -> list[int]:
    """What engine (capacity, seed) looks up: 6,000 references to 800 keys."""
    return zipf(6000, 800, 0.9, seed=seed)


def kvobs_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvobs", *args], capture_output=True,
                          text=True, timeout=120, check=False)


def query(url: str, expr: str) -> list:
    body = urllib.parse.urlencode({"query": expr}).encode()
    with urllib.request.urlopen(url + "/api/v1/query", data=body, timeout=5) as response:
        return json.loads(response.read())["data"]["result"]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = find_tool("prometheus", "scripts/deps/prometheus.sh")
    recorders, servers = {}, []
    for name, (capacity, _) in ENGINES.items():
        rec = kvobs.Recorder(engine=name, model="m")
        rec.add_tier("gpu", capacity, 16, 1024)
        rec.start_reuse_profile()
        recorders[name] = rec
        servers.append(kvobs.start_telemetry(rec, metrics_addr="127.0.0.1:0"))
    targets = [s.metrics_url.removeprefix("http://").removesuffix("/metrics") for s in servers]
    prometheus = start_prometheus(binary, tmp_path_factory.mktemp("prometheus"), targets, [])
    try:
        def scraped(expected: float) -> bool | None:
            found = query(prometheus.url, "sum(kvobs_reuse_references_total)")
            return True if found and float(found[0]["value"][1]) == expected \
                and len(query(prometheus.url, "kvobs_reuse_references_total")) == 3 else None

        poll("three engines scraped", lambda: scraped(0), 60)
        time.sleep(2.5)  # a few samples at zero before the references arrive
        for name, (capacity, seed) in ENGINES.items():
            keys = feed(capacity, seed)
            for start in range(0, len(keys), 32):
                recorders[name].lookup(16 * 32, keys=keys[start:start + 32])
        poll("references scraped", lambda: scraped(3 * 6000), 60)
        time.sleep(2.5)
        yield prometheus.url
    finally:
        prometheus.stop()
        for server in servers:
            server.close()


def exact_fleet(names: list[str], size: int) -> float:
    hits = sum(exact_lru_hit_ratio(feed(*ENGINES[n]), size) * 6000 for n in names)
    return hits / (6000 * len(names))


def test_one_curve_per_capacity_equal_to_exact_lru(fleet: str) -> None:
    result = kvobs_cli("whatif", "--prometheus", fleet, "--window", "10m", "--json")
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    curves = answer["curves"]
    assert [(c["capacity_blocks"], c["engines"]) for c in curves] == [(64, 2), (200, 1)]
    assert [c["tracking_rate"] for c in curves] == [1.0, 1.0]  # every block tracked
    assert [c["exact_blocks"] for c in curves] == [131072, 131072]  # the default bound
    for curve, names in zip(curves, (["a", "b"], ["c"]), strict=True):
        bounds = [row["blocks"] for row in curve["sizes"]]
        assert bounds[0] == max(1, round(curve["capacity_blocks"] / 8))
        for row in curve["sizes"]:
            # increase() extrapolates each engine's window alike; the sum's weights move
            # by a few percent at most
            assert row["hit_ratio"] == pytest.approx(exact_fleet(names, int(row["blocks"])),
                                                     abs=0.01), (names, row)
    table = kvobs_cli("whatif", "--prometheus", fleet, "--window", "10m", "--sizes", "64")
    assert "2 engines of 64 blocks" in table.stdout and "1 engine of 200 blocks" in table.stdout
    assert table.stdout.count("every block tracked: exact at the bucket bounds") == 2


def test_a_missing_series_is_named(fleet: str) -> None:
    gone = "kvobs_reuse_sample_rate"
    result = kvobs_cli("whatif", "--prometheus", fleet, "--window", "10m",
                       "--selector", 'engine="a"', "--sizes", "64")
    assert result.returncode == 0, result.stderr
    # A selector that drops exactly one series, as a Prometheus missing it would look.
    result = kvobs_cli("whatif", "--prometheus", fleet, "--window", "10m", "--selector",
                       f'engine="a",__name__!="{gone}"')
    assert result.returncode == 2
    assert gone in result.stderr and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1
    none = kvobs_cli("whatif", "--prometheus", fleet, "--selector", 'engine="nobody"')
    assert none.returncode == 2 and "no kvobs_reuse_* data" in none.stderr


def test_help_says_sums_stay_within_one_capacity() -> None:
    text = kvobs_cli("whatif", "--help").stdout
    assert "one curve per" in " ".join(text.split())


def test_one_capacity_keeps_the_trace_shaped_json(fleet: str) -> None:
    result = kvobs_cli("whatif", "--prometheus", fleet, "--window", "10m", "--selector",
                       'engine="c"', "--sizes", "25,200", "--json")
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["capacity_blocks"] == 200 and answer["curves"][0]["sizes"] == answer["sizes"]
    assert [row["blocks"] for row in answer["sizes"]] == [25, 200]
