"""What an adapter reads itself, outside a Hook (LMCache's layerwise generators, wrapped
rather than read; the drops it reads in LMCache's store on a refused allocation), goes
through ``guarded``: a failure is counted under the component, logged, never raised, and
the engine's generator or call goes on with its own values."""

from __future__ import annotations

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


def test_drops_kvobs_cannot_count_are_counted_and_the_store_goes_on() -> None:
    """An allocation refused inside the engine's ``store``: kvobs reads the call's
    drops there (its backend's refusal hook calls ``count_drops``); an engine it cannot
    read (no ``token_database`` here) is counted under ``lmcache.engine`` and the store
    goes on."""
    class LMCacheEngine:
        config = SimpleNamespace(chunk_size=16)
        use_layerwise, num_layers = False, 2
        storage_manager = SimpleNamespace(allocator_backend="cpu")

        def store(self, tokens: Any = None, hashes: Any = None, offsets: Any = None,
                  mask: Any = None, **kwargs: Any) -> str:
            memory_objs: list[Any] = []
            inst.count_drops()                     # its allocate returned None here
            return f"stored {len(memory_objs)}"

    rec, engine = Recorder(), LMCacheEngine()
    inst = lmcache.LMCacheEngineInstrumentation(engine, rec, True, "host", None)
    inst.backend = SimpleNamespace(target="cpu")  # type: ignore[assignment]
    with capture_logs() as logs:
        assert engine.store([1, 2, 3]) == "stored 0"
    assert rec.snapshot().errors == {"lmcache.engine": 1}
    assert [e["event"] for e in logs] == ["instrumentation_error"]
    assert rec.snapshot().link("gpu", "host").drops == 0
