"""A small model of what Grafana does with an XY chart panel's JSON, for the tests.

There is no Grafana here; these are the facts the what-if panel relies on, as Grafana's
source has them (written anew, not copied):

* Prometheus instant queries in table format come back as one frame per query: a
  ``Time`` column, one string column per label (sorted by name), then the value column,
  named ``Value``, or ``Value #<refId>`` when the panel has several queries
  (``transformDFToTable`` in the Prometheus data source).
* Transformations run in order: ``convertFieldType`` turns a column into numbers,
  ``sortBy`` sorts the rows of each frame that has the column, ``organize`` drops
  columns.
* Field config: the panel defaults, then each override in order whose matcher matches,
  later properties winning: ``byName`` (the field's name or display name), ``byRegexp``
  (the display name, the pattern anchored at both ends), ``byFrameRefID`` (every field of
  that query's frame).
* The XY chart's manual series (``prepSeries``): the frame by index; x is the first
  number or time field the x matcher matches; y the first other number field the y
  matcher matches; series without both are not drawn. Then every name loses the words
  shared at its start or end (``autoNameSeries``, quirks included).

Example:
    >>> shortened_names(["hit ratio", "GPU", "GPU + host"])
    ['', '', '+']
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: One Prometheus answer row: its labels and its value.
Row = tuple[Mapping[str, str], float]


@dataclass
class Field:
    """A column of a frame, with the config Grafana applied to it."""

    name: str
    type: str  # "time", "string" or "number"
    values: list[Any]
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def display_name(self) -> str:
        return str(self.config.get("displayName", self.name))


@dataclass
class Frame:
    """The table one query returned."""

    ref_id: str
    fields: list[Field]

    def column(self, name: str) -> Field | None:
        return next((f for f in self.fields if f.display_name == name), None)


@dataclass(frozen=True)
class Drawn:
    """One series the XY chart draws."""

    name: str
    x: Field
    y: Field


def table_frames(ref_ids: Sequence[str], answers: Mapping[str, Sequence[Row]]) -> list[Frame]:
    """The frames Grafana makes of instant table queries ``ref_ids`` answering ``answers``
    (an empty answer still gives a frame: time and value columns, no rows)."""
    frames = []
    for ref in ref_ids:
        rows = answers.get(ref, [])
        labels = sorted({name for row_labels, _value in rows for name in row_labels})
        value = f"Value #{ref}" if len(ref_ids) > 1 else "Value"
        frames.append(Frame(ref, [
            Field("Time", "time", [0] * len(rows)),
            *(Field(name, "string", [row_labels.get(name, "") for row_labels, _v in rows])
              for name in labels),
            Field(value, "number", [v for _labels, v in rows])]))
    return frames


def _to_number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def transform(frames: list[Frame], transformations: Sequence[Mapping[str, Any]]) -> list[Frame]:
    """``frames`` after the panel's transformations (the ones this model knows)."""
    frames = copy.deepcopy(frames)
    for step in transformations:
        options = step["options"]
        for frame in frames:
            if step["id"] == "convertFieldType":
                for conversion in options["conversions"]:
                    assert conversion["destinationType"] == "number", conversion
                    column = frame.column(conversion["targetField"])
                    if column is not None:
                        column.type = "number"
                        column.values = [_to_number(v) for v in column.values]
            elif step["id"] == "sortBy":
                (by,) = options["sort"]
                column = frame.column(by["field"])
                if column is not None:
                    order = sorted(range(len(column.values)), key=column.values.__getitem__,
                                   reverse=by.get("desc", False))
                    for f in frame.fields:
                        f.values = [f.values[i] for i in order]
            elif step["id"] == "organize":
                dropped = {name for name, drop in options["excludeByName"].items() if drop}
                frame.fields = [f for f in frame.fields if f.display_name not in dropped]
            else:
                raise AssertionError(f"transformation {step['id']!r} is not modelled")
    return frames


def matches(matcher: Mapping[str, Any], column: Field, frame: Frame) -> bool:
    """Whether a Grafana field matcher picks ``column`` of ``frame``."""
    kind, options = matcher["id"], matcher.get("options")
    if kind == "byName":
        return options in (column.name, column.display_name)
    if kind == "byRegexp":
        return re.fullmatch(options, column.display_name) is not None
    if kind == "byFrameRefID":
        return bool(frame.ref_id == options)
    if kind == "byType":
        return bool(column.type == options)
    raise AssertionError(f"matcher {kind!r} is not modelled")


def _set(config: dict[str, Any], prop_id: str, value: Any) -> None:
    if prop_id.startswith("custom."):
        config.setdefault("custom", {})[prop_id.removeprefix("custom.")] = value
    else:
        config[prop_id] = value


def apply_field_config(frames: list[Frame], field_config: Mapping[str, Any]) -> None:
    """Give every field the panel defaults, then the matching overrides, in order."""
    for frame in frames:
        for column in frame.fields:
            config = copy.deepcopy(dict(field_config["defaults"]))
            for override in field_config["overrides"]:
                if matches(override["matcher"], column, frame):
                    for prop in override["properties"]:
                        _set(config, prop["id"], prop["value"])
            column.config = config


def drawn_series(options: Mapping[str, Any], frames: Sequence[Frame]) -> list[Drawn]:
    """The series a manual XY chart draws from ``frames``."""
    assert options["mapping"] == "manual"
    found = []
    for series in options["series"]:
        frame_matcher = series["frame"]["matcher"]
        assert frame_matcher["id"] == "byIndex", "Grafana matches series frames by index only"
        if frame_matcher["options"] >= len(frames):
            continue
        frame = frames[frame_matcher["options"]]
        x = next((f for f in frame.fields if f.type in ("number", "time")
                  and matches(series["x"]["matcher"], f, frame)), None)
        y = next((f for f in frame.fields if f.type == "number" and f is not x
                  and matches(series["y"]["matcher"], f, frame)), None)
        if x is not None and y is not None:
            found.append(Drawn(series["name"]["fixed"], x, y))
    names = shortened_names([s.name for s in found])
    return [Drawn(name, s.x, s.y) for name, s in zip(names, found, strict=True)]


def shortened_names(names: Sequence[str]) -> list[str]:
    """Series names as Grafana's XY chart shows them: it strips the number of words all
    names share at the start and at the end, comparing each name, except the first, with
    the first shortest one, word by word from the start (also for the end)."""
    words = [name.split() for name in names]
    if not words:
        return []
    shortest = words[0]
    for w in words[1:]:
        if len(w) < len(shortest):
            shortest = w
    prefix = suffix = math.inf
    for w in words[1:]:
        if w is shortest:
            continue
        prefix = min(prefix, _shared(w, shortest, range(len(shortest))))
        suffix = min(suffix, _shared(w, shortest, range(len(shortest) - 1, -1, -1)))
    if prefix == math.inf and suffix == math.inf:
        return list(names)
    start, end = int(prefix), int(suffix)
    return [" ".join(w[start:len(w) - end]) for w in words]


def _shared(words: Sequence[str], shortest: Sequence[str], positions: range) -> int:
    count = 0
    for j in positions:
        if j < len(words) and words[j] == shortest[j]:
            count += 1
        else:
            break
    return count
