"""The instance-wrapping machinery every adapter uses (no engine needed)."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from kvobs.adapters import AdapterError, Instrumentation
from kvobs.adapters._hooks import MARKER, Hook, begin


class Allocator:
    def take(self, n):
        return list(range(n))

    def give(self, blocks):
        return len(blocks)


HOOKS = (Hook("take", ("n",)), Hook("give", ("blocks",)))


def start(obj, component="test.allocator"):
    return begin(obj, ("Allocator",), HOOKS, component,
                 lambda active: Instrumentation(obj, component, active))


def test_wrappers_shadow_one_instance_and_unwrap_restores_it():
    obj, other = Allocator(), Allocator()
    inst = start(obj)
    original = obj.take
    inst.install("take", lambda n: [*original(n), "kvobs"])
    assert obj.take(2) == [0, 1, "kvobs"]
    assert other.take(2) == [0, 1], "the class and other instances are untouched"
    inst.unwrap()
    inst.unwrap()
    assert obj.take.__func__ is Allocator.take
    assert not hasattr(obj, MARKER) and not inst.active


def test_an_attribute_the_instance_already_had_is_put_back():
    obj = Allocator()
    custom = lambda n: ["custom"]  # noqa: E731 - an engine-side instance override
    obj.take = custom
    inst = start(obj)
    inst.install("take", lambda n: [])
    inst.unwrap()
    assert obj.take is custom


def test_wrong_kind_twice_and_no_instance_attributes_are_clear_errors():
    with pytest.raises(AdapterError, match=r"Allocator, got builtins\.list"):
        start([])
    obj = Allocator()
    start(obj)
    with pytest.raises(AdapterError, match="already instrumented"):
        start(obj)

    class Slotted:
        __slots__ = ()

        def take(self, n):
            return []

        def give(self, blocks):
            return 0

    with pytest.raises(AdapterError, match="takes no instance attributes"):
        begin(Slotted(), ("Slotted",), HOOKS, "test.slotted",
              lambda active: Instrumentation(None, "test.slotted", active))


def test_changed_signatures_warn_once_and_install_nothing():
    class Allocator:  # another version of the engine's class
        def take(self, count):
            return []

    with capture_logs() as logs:
        insts = [start(Allocator(), "test.version") for _ in range(3)]
    assert [inst.active for inst in insts] == [False] * 3
    warnings = [e for e in logs if e["event"] == "kvobs_adapter_unsupported_version"]
    assert len(warnings) == 1
    assert warnings[0]["problems"] == ["Allocator.take(count) does not start with (n)",
                                       "Allocator.give is missing"]
