"""Where each replica publishes its KV events: ``kvobs fleet --engine`` specs.

A spec is ``[NAME=]EVENTS[,replay=REPLAY][,topic=TOPIC][,model=MODEL]``: ``EVENTS`` and
``REPLAY`` are the ZeroMQ addresses the engine's ``--kv-events-config`` gives as
``endpoint`` and ``replay_endpoint`` (``tcp://HOST:PORT``, the engine's host in place of
``*``), ``TOPIC`` its ``topic``. ``NAME`` (the ``replica`` label) defaults to
``HOST:PORT``; ``MODEL`` to ``--model``.

Example:
    >>> spec = parse_endpoint("a=tcp://10.0.0.7:5557,replay=tcp://10.0.0.7:5558,topic=kv", "m")
    >>> spec.name, spec.events, spec.replay, spec.topic, spec.model
    ('a', 'tcp://10.0.0.7:5557', 'tcp://10.0.0.7:5558', 'kv', 'm')
    >>> parse_endpoint("tcp://node-b:5557", "m").name
    'node-b:5557'
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvobs.errors import ConfigError

_ADDRESS = re.compile(r"^(tcp://(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):\d{1,5}|ipc://\S+)$")
_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
_KEYS = ("replay", "topic", "model")


@dataclass(frozen=True)
class Endpoint:
    """One replica's publisher."""

    name: str
    events: str
    replay: str | None = None
    topic: str = ""
    model: str = ""


def _address(text: str, spec: str, what: str) -> str:
    if not _ADDRESS.match(text):
        raise ConfigError(
            f"--engine {spec!r}: {what} {text!r} is not a ZeroMQ address: use tcp://HOST:PORT "
            "(the engine's host, not *) or ipc://PATH")
    return text


def parse_endpoint(spec: str, model: str) -> Endpoint:
    """One ``--engine`` spec; ``model`` is the default model label."""
    head, *options = spec.split(",")
    name, sep, events = head.partition("=")
    if not sep:
        name, events = "", head
    events = _address(events.strip(), spec, "the events address")
    if not name:
        name = events.split("://", 1)[1].strip("[]")
    if not _NAME.match(name):
        raise ConfigError(f"--engine {spec!r}: replica name {name!r} is invalid: use 1-64 "
                          "letters, digits, '_', '.', ':' or '-'")
    values: dict[str, str] = {}
    for option in options:
        key, sep, value = option.partition("=")
        if not sep or key.strip() not in _KEYS:
            raise ConfigError(f"--engine {spec!r}: {option!r} is not an option: use "
                              "replay=ADDRESS, topic=TOPIC or model=MODEL after the address")
        values[key.strip()] = value.strip()
    replay = values.get("replay")
    if replay is not None:
        _address(replay, spec, "the replay address")
    chosen = values.get("model", model)
    if not chosen:
        raise ConfigError(f"--engine {spec!r}: no model: pass --model MODEL (or model= in "
                          "the spec): replicas are compared within one model")
    return Endpoint(name, events, replay, values.get("topic", ""), chosen)


def parse_endpoints(specs: list[str], model: str) -> list[Endpoint]:
    """Every spec; two replicas of one name are an error."""
    endpoints = [parse_endpoint(spec, model) for spec in specs]
    names = [e.name for e in endpoints]
    for name in names:
        if names.count(name) > 1:
            raise ConfigError(f"--engine: replica name {name!r} is given twice: name each "
                              "replica (NAME=tcp://HOST:PORT)")
    if not endpoints:
        raise ConfigError("kvobs fleet: no engine: pass --engine [NAME=]tcp://HOST:PORT for "
                          "each replica (or KVOBS_FLEET_ENGINES, comma-free specs separated "
                          "by spaces)")
    return endpoints
