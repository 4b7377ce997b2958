"""Fixtures for the end-to-end tests: a real ``kvobs demo`` scraped by a real Prometheus."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.dashboards.prom_tools import find_prometheus_tool
from tests.e2e.e2e_servers import DEMO_ARGS, RULE_FILES, Server, start_demo, start_prometheus


@pytest.fixture(scope="session")
def prometheus_binary() -> Path:
    return find_prometheus_tool("prometheus")


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_demo(tmp_path_factory.mktemp("demo"), 240, *DEMO_ARGS)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def prometheus(prometheus_binary: Path, demo: Server,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    target = demo.url.removeprefix("http://")
    server = start_prometheus(prometheus_binary, tmp_path_factory.mktemp("prometheus"),
                              [target], RULE_FILES)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def bare_prometheus(prometheus_binary: Path,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A Prometheus that scrapes nothing: every kvobs query is empty."""
    server = start_prometheus(prometheus_binary, tmp_path_factory.mktemp("bare"), [], [])
    yield server
    server.stop()
