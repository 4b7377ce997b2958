"""A fleet's curves from Prometheus's answers (:func:`kvobs.whatif.curves_from_prometheus`),
with a test double of :class:`kvobs.report.prometheus_api.PrometheusClient` that answers
the exact PromQL queries with fixed series: which queries are asked, how engines are
grouped by capacity and summed (SHARDS-adj, each engine's sampled counts over its own
rate), which engines are left out, and each error's words. The slow
``test_whatif_prometheus.py`` checks the same against a real Prometheus."""

from __future__ import annotations

import pytest

from kvobs.errors import ConfigError
from kvobs.report.prometheus_api import Series
from kvobs.whatif import curve_from_prometheus, curves_from_prometheus

WINDOW, WHERE = "10m", '{model="m"}'


class FakePrometheus:
    """Answers each exact query with its series (none for any other); records the queries."""

    def __init__(self, answers: dict[str, list[Series]],
                 base_url: str | None = "http://prom:9090") -> None:
        self.answers, self.asked = answers, []  # type: list[str]
        if base_url is not None:
            self.base_url = base_url

    def query(self, expr: str) -> list[Series]:
        self.asked.append(expr)
        return self.answers.get(expr, [])


def engine(name: str, **extra: str) -> dict[str, str]:
    return {"engine": name, "model": "m", **extra}


def series(labels: dict[str, str], *values: float) -> Series:
    """A series whose samples end with the last of ``values`` (the one read)."""
    return Series(labels, [(1000.0 + i, v) for i, v in enumerate(values)])


def queries(where: str = WHERE, window: str = WINDOW) -> dict[str, str]:
    return {
        "sampled": f"increase(kvobs_reuse_sampled_references_total{where}[{window}])",
        "references": f"increase(kvobs_reuse_references_total{where}[{window}])",
        "rate": f"last_over_time(kvobs_reuse_sample_rate{where}[{window}])",
        "capacity": f"last_over_time(kvobs_reuse_capacity_blocks{where}[{window}])",
        "tracking": f"min_over_time(kvobs_reuse_tracking_rate{where}[{window}])",
        "exact": f"min_over_time(kvobs_reuse_exact_blocks{where}[{window}])",
    }


# engine: (capacity, rate, references, sampled by bound)
ENGINES: dict[str, tuple[float, float, float, dict[str, float]]] = {
    "a": (64, 1.0, 1000, {"8": 300, "16": 500, "64": 800, "+Inf": 1000}),
    "b": (64, 0.5, 2000, {"8": 150, "16": 250, "32": 350, "+Inf": 1100}),  # 100 extra
    "c": (200, 1.0, 500, {"25": 100, "+Inf": 500}),
}


def fleet(where: str = WHERE, window: str = WINDOW) -> dict[str, list[Series]]:
    q = queries(where, window)
    answers: dict[str, list[Series]] = {key: [] for key in q.values()}
    for name, (capacity, rate, references, sampled) in ENGINES.items():
        labels = engine(name)
        answers[q["references"]].append(series(labels, 0, references))
        answers[q["rate"]].append(series({**labels, "__name__": "kvobs_reuse_sample_rate"},
                                         9.0, rate))
        answers[q["capacity"]].append(series(labels, capacity))
        for le, count in sampled.items():
            answers[q["sampled"]].append(series(engine(name, le=le), count))
    answers[q["tracking"]] += [series(engine("a"), 1.0), series(engine("b"), 0.5),
                               series(engine("c"), 1.0), series(engine("z"), 0.1)]
    answers[q["exact"]] += [series(engine("a"), 4096), series(engine("c"), 2048),
                            series(engine("c", shard="x"), 1)]
    return answers


def test_it_asks_for_each_series_over_the_window_within_the_selector() -> None:
    client = FakePrometheus(fleet())
    curves_from_prometheus(client, WINDOW, 'model="m"')
    assert client.asked == list(queries().values())
    bare = FakePrometheus(fleet("", "1h"))
    assert len(curves_from_prometheus(bare)) == 2
    assert bare.asked == list(queries("", "1h").values())


def test_one_curve_per_capacity_smallest_first_summed_over_its_engines() -> None:
    curves = curves_from_prometheus(FakePrometheus(fleet()), WINDOW, 'model="m"')
    assert [(c.capacity_blocks, c.engines, c.references) for c in curves] == [
        (64, 2, 3000), (200, 1, 500)]
    assert [(c.exact, c.source) for c in curves] == [(False, "http://prom:9090")] * 2


def test_the_engines_sampled_counts_are_scaled_by_their_own_rates() -> None:
    """a + b: every sampled reference 1000 + 1100 / 0.5 = 3200, 200 over the 3000 counted;
    at each bound the hits (b's over its rate; a bound one lacks counts 0 there) less
    those 200, over 3000. The bounds go in numeric order (8 before 16, not after 64)."""
    small, large = curves_from_prometheus(FakePrometheus(fleet()), WINDOW, 'model="m"')
    assert [bound for bound, _ in small._points] == [8.0, 16.0, 32.0, 64.0]
    assert [ratio for _, ratio in small._points] == pytest.approx(
        [400 / 3000, 800 / 3000, 500 / 3000, 600 / 3000])
    assert small.hit_ratio(12) == pytest.approx(600 / 3000)  # between 8 and 16
    assert small.hit_ratio(4) == pytest.approx(200 / 3000)  # from 0 below the first
    assert large._points == ((25.0, pytest.approx(0.2)),)
    assert large.hit_ratio(200) == pytest.approx(0.2)


def test_the_lowest_tracking_rate_and_exact_bound_of_a_curves_engines() -> None:
    """Only engines in the curve count (not z); one engine without the series: None."""
    small, large = curves_from_prometheus(FakePrometheus(fleet()), WINDOW, 'model="m"')
    assert (small.tracking_rate, small.exact_blocks) == (0.5, None)
    assert (large.tracking_rate, large.exact_blocks) == (1.0, 2048)


def test_older_kvobs_without_the_optional_series_leave_them_unknown() -> None:
    answers = fleet()
    q = queries()
    del answers[q["tracking"]], answers[q["exact"]]
    curves = curves_from_prometheus(FakePrometheus(answers), WINDOW, 'model="m"')
    assert [(c.tracking_rate, c.exact_blocks) for c in curves] == [(None, None)] * 2


def test_engines_lacking_a_series_a_rate_or_the_total_bucket_are_left_out() -> None:
    answers, q = fleet(), queries()
    answers[q["references"]] += [series(engine("no-capacity"), 50),
                                 series(engine("zero-rate"), 50),
                                 series(engine("no-inf"), 50)]
    answers[q["rate"]] += [series(engine("no-capacity"), 1.0), series(engine("zero-rate"), 0.0),
                           series(engine("no-inf"), 1.0), series(engine("no-samples"))]
    answers[q["capacity"]] += [series(engine("zero-rate"), 64), series(engine("no-inf"), 64),
                               Series(engine("no-samples"), []), series(engine("no-refs"), 64)]
    answers[q["sampled"]] += [series(engine(n, le="+Inf"), 50)
                              for n in ("no-capacity", "zero-rate", "no-refs")]
    answers[q["sampled"]] += [series(engine("no-inf", le="8"), 50),
                              series(engine("stranger", le="+Inf"), 50),
                              Series(engine("a", le="8"), []),  # no sample: a keeps its 300
                              series(engine("b"), 999)]  # no le: not a bucket
    curves = curves_from_prometheus(FakePrometheus(answers), WINDOW, 'model="m"')
    assert [(c.capacity_blocks, c.engines, c.references) for c in curves] == [
        (64, 2, 3000), (200, 1, 500)]
    assert curves[0]._points[0] == (8.0, pytest.approx(400 / 3000))


def test_a_fleet_of_no_references_reads_zero_everywhere() -> None:
    q = queries("", "1h")
    answers = {q["references"]: [series(engine("a"), 0)], q["rate"]: [series(engine("a"), 1)],
               q["capacity"]: [series(engine("a"), 8)],
               q["sampled"]: [series(engine("a", le="2"), 0), series(engine("a", le="+Inf"), 0)]}
    (curve,) = curves_from_prometheus(FakePrometheus(answers))
    assert curve._points == ((2.0, 0.0),) and curve.references == 0


def test_a_window_of_under_two_references_still_reads_its_hits() -> None:
    """increase() extrapolates: a window's counts are fractions, one reference or less."""
    q = queries("", "1h")
    answers = {q["references"]: [series(engine("a"), 0.8)], q["rate"]: [series(engine("a"), 1)],
               q["capacity"]: [series(engine("a"), 8)],
               q["sampled"]: [series(engine("a", le="2"), 0.4),
                              series(engine("a", le="+Inf"), 0.8)]}
    (curve,) = curves_from_prometheus(FakePrometheus(answers))
    assert curve._points == ((2.0, pytest.approx(0.5)),)


def test_one_curve_reads_the_last_hour_of_every_engine_by_default() -> None:
    one = fleet("", "1h")
    for expr in one:
        one[expr] = [s for s in one[expr] if s.labels["engine"] != "c"]
    client = FakePrometheus(one)
    assert curve_from_prometheus(client).engines == 2
    assert client.asked == list(queries("", "1h").values())


def test_a_client_without_a_base_url_is_named_prometheus() -> None:
    curves = curves_from_prometheus(FakePrometheus(fleet(), base_url=None), WINDOW, 'model="m"')
    assert {c.source for c in curves} == {"prometheus"}


def test_no_data_at_all_says_so_with_the_window_and_selector() -> None:
    with pytest.raises(ConfigError) as raised:
        curves_from_prometheus(FakePrometheus({}), WINDOW, 'model="m"')
    assert str(raised.value) == (
        'no kvobs_reuse_* data in the last 10m for model="m": is a kvobs engine with prefix '
        "lookups scraped by this Prometheus?")
    with pytest.raises(ConfigError, match=r"in the last 1h: is a kvobs"):
        curves_from_prometheus(FakePrometheus({}))


@pytest.mark.parametrize("gone", ["sampled", "references", "rate", "capacity"])
def test_a_missing_series_is_named_alone(gone: str) -> None:
    answers = fleet()
    answers[queries()[gone]] = []
    name = queries()[gone].split("(")[1].split("{")[0]
    with pytest.raises(ConfigError) as raised:
        curves_from_prometheus(FakePrometheus(answers), WINDOW, 'model="m"')
    assert str(raised.value) == (
        f'Prometheus has no {name} in the last 10m for model="m" (the other kvobs_reuse_* '
        "series are there): scrape a kvobs version that exports every reuse series, or "
        "widen --window")


def test_two_missing_series_are_both_named_in_order() -> None:
    answers, q = fleet("", "1h"), queries("", "1h")
    answers[q["rate"]] = answers[q["sampled"]] = []
    with pytest.raises(ConfigError, match=r"^Prometheus has no kvobs_reuse_sampled_references_"
                                          r"total, kvobs_reuse_sample_rate in the last 1h \("):
        curves_from_prometheus(FakePrometheus(answers))


def scattered(where: str, window: str) -> dict[str, list[Series]]:
    """Every series present, but each of another engine."""
    q = queries(where, window)
    return {q["references"]: [series(engine("a"), 10)], q["rate"]: [series(engine("b"), 1)],
            q["capacity"]: [series(engine("c"), 8)],
            q["sampled"]: [series(engine("a", le="+Inf"), 1)]}


def test_series_each_of_another_engine_make_no_engine() -> None:
    with pytest.raises(ConfigError) as raised:
        curves_from_prometheus(FakePrometheus(scattered("", "1h")))
    assert str(raised.value) == ("no engine has every kvobs_reuse_* series in the last 1h: "
                                 "is its /metrics scraped whole?")
    with pytest.raises(ConfigError, match=r"in the last 10m for model=\"m\": is its"):
        curves_from_prometheus(FakePrometheus(scattered(WHERE, WINDOW)), WINDOW, 'model="m"')


def test_one_curve_is_the_fleets_and_several_capacities_are_refused() -> None:
    with pytest.raises(ConfigError) as raised:
        curve_from_prometheus(FakePrometheus(fleet()), WINDOW, 'model="m"')
    assert str(raised.value) == ("the selected engines have 2 capacities (64, 200 blocks): "
                                 "their curves do not add up; narrow --selector")
    answers = fleet()
    for expr in answers:
        answers[expr] = [s for s in answers[expr] if s.labels["engine"] != "c"]
    curve = curve_from_prometheus(FakePrometheus(answers), WINDOW, 'model="m"')
    assert (curve.capacity_blocks, curve.engines) == (64, 2)
