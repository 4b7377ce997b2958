"""The parsers behind the ``KVOBS_*`` / ``OTEL_*`` settings (:mod:`kvobs.telemetry.settings`):
their bounds and the fix each error names. Each case is one a mutant of the module got past
the older tests."""

from __future__ import annotations

import re

import pytest

from kvobs.telemetry.settings import (
    FROM_ENV,
    TelemetrySettings,
    address,
    http_url,
    log_format,
    milliseconds_as_seconds,
    positive_int,
    seconds,
)


def test_milliseconds_are_read_as_seconds_above_zero() -> None:
    assert milliseconds_as_seconds("1500") == 1.5
    with pytest.raises(ValueError, match=re.escape(
            "'soon' is not a number: pass milliseconds, e.g. 10000")):
        milliseconds_as_seconds("soon")
    with pytest.raises(ValueError, match=re.escape(
            "'-5' must be a finite number >= 0: pass milliseconds, e.g. 10000")):
        milliseconds_as_seconds("-5")
    with pytest.raises(ValueError, match=re.escape("'0' must be > 0")):
        milliseconds_as_seconds("0")


@pytest.mark.parametrize("text,value", [("1", 1), ("268435456", 268435456)])
def test_a_positive_whole_number_is_read(text: str, value: int) -> None:
    assert positive_int(text) == value


@pytest.mark.parametrize("text", ["0", "00", "-1", "1.5", "", "1e6"])
def test_zero_or_anything_but_digits_is_not_a_positive_whole_number(text: str) -> None:
    with pytest.raises(ValueError, match=re.escape(
            f"{text!r} is not a whole number > 0: pass bytes, e.g. 268435456")):
        positive_int(text)


def test_a_bad_address_names_the_fix() -> None:
    assert address("127.0.0.1:9464") == "127.0.0.1:9464"
    with pytest.raises(ValueError) as caught:
        address("nowhere")
    assert str(caught.value) == ("'nowhere' is not HOST:PORT: pass e.g. 127.0.0.1:9464 "
                                 "(0.0.0.0:9464 inside a pod; empty: no /metrics)")


@pytest.mark.parametrize("url", ["http://127.0.0.1:4318", "https://collector:4318"])
def test_http_and_https_urls_with_a_host_are_taken(url: str) -> None:
    assert http_url(url) == url


@pytest.mark.parametrize("url", ["ftp://collector:4318", "collector:4318", "http://:4318"])
def test_another_scheme_or_no_host_is_not_an_http_url(url: str) -> None:
    with pytest.raises(ValueError, match=re.escape(
            f"{url!r} is not an http(s) URL: pass e.g. http://127.0.0.1:4318")):
        http_url(url)


def test_a_log_format_outside_the_three_lists_them() -> None:
    assert log_format("json") == "json"
    with pytest.raises(ValueError) as caught:
        log_format("xml")
    assert str(caught.value) == "'xml' is not a log format: use auto, json, console"


def test_the_from_env_default_reads_as_from_env() -> None:
    assert repr(FROM_ENV) == "FROM_ENV"


def test_a_seconds_parsers_errors_end_with_its_fix() -> None:
    parse = seconds("pass seconds, e.g. 60 (0: off)")
    assert parse("2.5") == 2.5
    with pytest.raises(ValueError, match=re.escape(
            "'6O' is not a number: pass seconds, e.g. 60 (0: off)")):
        parse("6O")
    with pytest.raises(ValueError, match=re.escape(
            "'inf' must be a finite number >= 0: pass seconds, e.g. 60 (0: off)")):
        parse("inf")


def test_unknown_explicit_settings_are_all_named_sorted() -> None:
    with pytest.raises(TypeError) as raised:
        TelemetrySettings.from_env({}, metrics_adr="x", nvlm=False, nvml=False)
    assert str(raised.value) == "unknown telemetry setting(s): metrics_adr, nvlm"
