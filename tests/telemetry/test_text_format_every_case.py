"""kvobs's Prometheus text format (:mod:`kvobs.telemetry.text`) against prometheus_client's
``generate_latest`` one case at a time: each metric type's ``# TYPE``, each value kind
(the whole numbers it formats itself and the bounds where Go's format takes over), each
character a label value or help text escapes, timestamps, OpenMetrics-only samples, and
the bounded cache of rendered label sets."""

from __future__ import annotations

import math
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric

from kvobs.telemetry import text
from kvobs.telemetry.text import render


@pytest.fixture(autouse=True)
def _empty_label_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each case renders its label sets itself, not from an earlier test's cache."""
    monkeypatch.setattr(text, "_LABELS", {})


def _expected(*families: Metric) -> bytes:
    class Fixed:
        def collect(self):  # type: ignore[no-untyped-def]
            return list(families)

    registry = CollectorRegistry()
    registry.register(Fixed())  # type: ignore[arg-type]
    return generate_latest(registry)


def _family(kind: str, name: str = "m", samples: tuple[str, ...] = ("",)) -> Metric:
    family = Metric(name, "Help.", kind)
    for suffix in samples:
        family.add_sample(name + suffix, {"a": "1"}, 2)
    return family


@pytest.mark.parametrize(("kind", "sample", "shown_as"), [
    ("counter", "_total", "m_total counter"),
    ("gauge", "", "m gauge"),
    ("histogram", "_bucket", "m histogram"),
    ("summary", "_sum", "m summary"),
    ("info", "_info", "m_info gauge"),
    ("stateset", "", "m gauge"),
    ("gaugehistogram", "_bucket", "m histogram"),
    ("unknown", "", "m untyped"),
])
def test_each_metric_type_is_typed_as_prometheus_reads_it(
        kind: str, sample: str, shown_as: str) -> None:
    family = _family(kind, samples=(sample,))
    rendered = render([family])
    assert rendered == _expected(family)
    assert f"# TYPE {shown_as}\n".encode() in rendered
    assert rendered.startswith(f"# HELP {shown_as.split()[0]} Help.\n".encode())


@pytest.mark.parametrize("value", [
    0, 1, -1, 7, 999_999, -999_999, 10**6, -10**6, 10**6 + 1, 10**17, -(10**17),
    True, False, 0.0, -0.0, 1.5, 2.0, 1e-7, 1e21, 123456789.0, math.inf, -math.inf, math.nan,
])
def test_every_kind_of_value_reads_as_prometheus_client_writes_it(value: float) -> None:
    family = Metric("m", "Help.", "gauge")
    family.add_sample("m", {}, value)
    assert render([family]) == _expected(family)


def test_whole_numbers_keep_a_decimal_point_and_large_ones_go_to_gos_exponent() -> None:
    family = Metric("m", "Help.", "gauge")
    for value in (5, -5, 999_999, 10**6, 10**17):
        family.add_sample("m", {"v": str(value)}, value)
    lines = render([family]).decode().splitlines()[2:]
    assert [line.split()[-1] for line in lines] == [
        "5.0", "-5.0", "999999.0", "1e+06", "1e+17"]


@pytest.mark.parametrize("timestamp", [None, 0, 12.5, 1.7e9 + 0.123])
def test_timestamps_are_whole_milliseconds(timestamp: float | None) -> None:
    family = Metric("m", "Help.", "gauge")
    family.add_sample("m", {"a": "1"}, 3, timestamp=timestamp)
    rendered = render([family])
    assert rendered == _expected(family)
    if timestamp is not None:
        assert rendered.endswith(f" 3.0 {int(timestamp * 1000)}\n".encode())


@pytest.mark.parametrize(("value", "escaped"), [
    ("plain", "plain"), ("back\\slash", "back\\\\slash"), ("new\nline", "new\\nline"),
    ('quo"te', 'quo\\"te'), ('all\\\n"', 'all\\\\\\n\\"'), ("", ""),
])
def test_label_values_escape_backslashes_newlines_and_quotes(value: str, escaped: str) -> None:
    family = Metric("m", "Help.", "gauge")
    family.add_sample("m", {"v": value}, 1)
    rendered = render([family])
    assert rendered == _expected(family)
    assert f'm{{v="{escaped}"}} 1.0\n'.encode() in rendered


def test_help_text_escapes_backslashes_and_newlines_not_quotes() -> None:
    family = Metric("jobs", 'Done \\ "all"\nnext.', "counter")
    family.add_sample("jobs_total", {}, 1)
    family.add_sample("jobs_created", {}, 2)
    rendered = render([family])
    assert rendered == _expected(family)
    assert rendered.count(b'Done \\\\ "all"\\nnext.\n') == 2


def test_labels_are_sorted_whatever_order_they_came_in_and_none_means_no_braces() -> None:
    family = Metric("m", "Help.", "gauge")
    family.add_sample("m", {"b": "2", "a": "1", "c": "3"}, 1)
    family.add_sample("m", {"c": "3", "a": "1", "b": "2"}, 2)
    family.add_sample("m", {}, 3)
    rendered = render([family])
    assert rendered == _expected(family)
    assert rendered.decode().splitlines()[2:] == [
        'm{a="1",b="2",c="3"} 1.0', 'm{a="1",b="2",c="3"} 2.0', "m 3.0"]


def test_openmetrics_only_samples_go_last_each_under_its_own_gauge() -> None:
    family = Metric("h", "Help.", "gaugehistogram")
    family.add_sample("h_gcount", {}, 4)
    family.add_sample("h_bucket", {"le": "+Inf"}, 4)
    family.add_sample("h_gsum", {}, 9)
    family.add_sample("h_created", {}, 1.5)
    family.add_sample("h_bucket", {"le": "1.0"}, 1)
    rendered = render([family])
    assert rendered == _expected(family)
    assert rendered.decode().splitlines() == [
        "# HELP h Help.", "# TYPE h histogram",
        'h_bucket{le="+Inf"} 4.0', 'h_bucket{le="1.0"} 1.0',
        "# HELP h_created Help.", "# TYPE h_created gauge", "h_created 1.5",
        "# HELP h_gcount Help.", "# TYPE h_gcount gauge", "h_gcount 4.0",
        "# HELP h_gsum Help.", "# TYPE h_gsum gauge", "h_gsum 9.0",
    ]


def test_a_sample_only_ending_like_an_openmetrics_one_stays_in_place() -> None:
    """``xobs_created`` is as long as ``jobs`` plus ``_created`` but is not jobs'."""
    family = Metric("jobs", "Help.", "gauge")
    family.add_sample("xobs_created", {}, 1)
    family.add_sample("jobs", {}, 2)
    rendered = render([family])
    assert rendered == _expected(family)
    assert rendered.decode().splitlines()[2:] == ["xobs_created 1.0", "jobs 2.0"]


def test_several_families_render_in_order() -> None:
    first, second = _family("counter", "a", ("_total",)), _family("gauge", "b")
    assert render([first, second]) == _expected(first, second)
    assert render([]) == b""


def test_the_label_cache_is_cleared_when_full_and_still_renders_right(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(text, "_LABELS_LIMIT", 2)
    family = Metric("m", "Help.", "gauge")
    for i in range(3):
        family.add_sample("m", {"i": str(i)}, i)
    assert render([family]) == _expected(family)
    assert text._LABELS == {(("i", "2"),): '{i="2"}'}
    assert render([family]) == _expected(family)
    assert len(text._LABELS) == 2


def spy(monkeypatch: pytest.MonkeyPatch, name: str) -> list[Any]:
    """The arguments ``text.<name>`` is called with from now on (it still does its work)."""
    calls: list[Any] = []
    real = getattr(text, name)

    def counting(value: Any) -> str:
        calls.append(value)
        return str(real(value))

    monkeypatch.setattr(text, name, counting)
    return calls


def test_a_label_set_is_rendered_once_then_read_from_the_cache(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls = spy(monkeypatch, "_escape")
    family = Metric("m", "Help.", "gauge")
    family.add_sample("m", {"a": "x"}, 1)
    family.add_sample("m", {"a": "x"}, 2)
    assert render([family]) == _expected(family)
    assert calls == ["x"]
    assert text._LABELS == {(("a", "x"),): '{a="x"}'}


def test_the_content_type_is_the_text_format_0_0_4() -> None:
    assert text.CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"


def test_whole_numbers_below_a_million_skip_gos_float_formatting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path (the module's reason to be): Go's formatting only where it may
    differ from Python's (prometheus_client's: a million reads 1e+06, minus one -1000000.0)."""
    formatted = spy(monkeypatch, "_go_float")
    family = Metric("m", "Help.", "gauge")
    for value in (0, 7, -999_999, 999_999, 10**6, -(10**6), 2.0, True):
        family.add_sample("m", {}, value)
    assert render([family]).decode().splitlines()[2:] == [
        "m 0.0", "m 7.0", "m -999999.0", "m 999999.0", "m 1e+06", "m -1000000.0", "m 2.0", "m 1.0"]
    assert formatted == [10**6, -(10**6), 2.0, True]
