"""What an adapter reads itself, outside a Hook (LMCache's layerwise generators, wrapped
rather than read), goes through ``guarded``: a failure is counted under the component,
logged, never raised, and the engine's generator goes on with its own values."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

from structlog.testing import capture_logs

from kvobs.adapters.lmcache import engine as lmcache
from kvobs.recorder import Recorder


class Obj:
    """A memory object; ``size=None`` is one kvobs cannot read."""

    def __init__(self, size: int | None = 64) -> None:
        self.size = size

    def get_size(self) -> int:
        if self.size is None:
            raise AttributeError("get_size: a MemoryObj of another LMCache")
        return self.size


def copy_in() -> Any:
    """A layerwise ``batched_to_gpu``: each step copies the layer it is sent."""
    step = 0
    while True:
        yield step
        step += 1


def test_a_layer_kvobs_cannot_read_is_counted_and_the_copies_go_on() -> None:
    rec = Recorder()
    inst = lmcache._LinkInstrumentation(None, lmcache.CONNECTOR_COMPONENT, True, rec, "host")
    moves = lmcache.LayerCopies(copy_in(), inst)
    assert next(moves) == 0
    with capture_logs() as logs:
        assert moves.send([Obj(None)]) == 1          # the engine's value, unchanged
    assert moves.send([Obj(), Obj()]) == 2           # the next layer still counts
    snap = rec.snapshot()
    assert snap.errors == {"lmcache.gpu_connector": 1}
    assert [e["event"] for e in logs] == ["instrumentation_error"]
    assert snap.link("host", "gpu").blocks == 2


def test_store_layer_drops_kvobs_cannot_count_are_counted_and_the_store_goes_on() -> None:
    rec = Recorder()
    engine = SimpleNamespace()                     # no storage_manager: unreadable
    inst = lmcache.LMCacheEngineInstrumentation(engine, rec, False, "host", None)
    backend = inst.backend = SimpleNamespace(refusals=0, refused_in={})

    def store_layer() -> Any:                      # its first step refuses an allocation
        backend.refusals += 1
        backend.refused_in[threading.get_ident()] = backend.refusals
        yield "layer 0"
        yield "layer 1"

    steps = lmcache._StoreLayerSteps(store_layer(), inst, ([1, 2, 3], None, None))
    assert next(steps) == "layer 0"
    assert next(steps) == "layer 1"
    assert rec.snapshot().errors == {"lmcache.engine": 1}


def test_a_copy_note_kvobs_cannot_make_is_counted_and_the_copy_goes_on() -> None:
    class GPUConnectorInterface:
        def batched_from_gpu(self, memory_objs: Any, starts: Any, ends: Any) -> Any:
            yield from memory_objs

        def batched_to_gpu(self, starts: Any, ends: Any) -> Any:
            yield from copy_in()

    def copy_seen(backend: Any, copied: int) -> None:
        raise RuntimeError("kvobs's note broken")

    engine = SimpleNamespace(layer_drops=True, copy_seen=copy_seen,
                             backend=SimpleNamespace(refused_in={1: 1}))
    rec, connector = Recorder(), GPUConnectorInterface()
    inst = lmcache.instrument_layer_copies(connector, rec, engine=engine)
    layers = [[Obj()], [Obj()]]
    assert list(connector.batched_from_gpu(layers, [0], [16])) == layers
    snap = rec.snapshot()
    assert snap.errors == {"lmcache.gpu_connector": 1}
    assert snap.link("gpu", "host").blocks == 2      # the layers copied still count
    inst.unwrap()
