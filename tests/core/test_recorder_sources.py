"""Series sources an adapter adds to the recorder are exported with its series, in the
order added, until the adapter removes them."""

from __future__ import annotations

from collections.abc import Mapping

from kvobs.recorder import Recorder
from kvobs.telemetry.series import recorder_series

Values = Mapping[str, list[tuple[dict[str, str], float]]]


def hot_buffer() -> Values:
    return {"kvobs_test_hot_blocks": [({"tier": "gpu"}, 3.0)]}


def cold_buffer() -> Values:
    return {"kvobs_test_hot_blocks": [({"tier": "host"}, 5.0)]}


def test_added_sources_are_exported_until_removed() -> None:
    rec = Recorder()
    rec.add_source(hot_buffer)
    rec.add_source(cold_buffer)
    assert list(rec.sources) == [hot_buffer, cold_buffer]
    assert recorder_series(rec)["kvobs_test_hot_blocks"] == [({"tier": "gpu"}, 3.0),
                                                             ({"tier": "host"}, 5.0)]
    rec.remove_source(hot_buffer)
    assert list(rec.sources) == [cold_buffer]
    assert recorder_series(rec)["kvobs_test_hot_blocks"] == [({"tier": "host"}, 5.0)]
    rec.remove_source(cold_buffer)
    assert "kvobs_test_hot_blocks" not in recorder_series(rec)
