"""The residency tracker's sampling: the C extension's ``sample_bits`` picks exactly the
keys (and values) the Python line picks, whatever collection the adapter passes."""

from __future__ import annotations

import random

import pytest

from kvobs import residency
from kvobs.kernels._ext import native
from kvobs.residency import ResidencyTracker

pytestmark = pytest.mark.skipif(native is None, reason="the C extension is not built here")


def python_sampled(keys: object, rate: float) -> list[int]:
    threshold = max(1, round(rate * (1 << 16)))
    return [b for key in keys if (b := hash((key,))) & 0xFFFF < threshold]  # type: ignore[attr-defined]


@pytest.mark.parametrize("shape", [list, tuple, set, frozenset, iter])
def test_c_sampling_equals_python_for_every_collection(shape) -> None:
    rnd = random.Random(4)
    keys = [rnd.randbytes(36) for _ in range(4000)] + list(range(-50, 4000)) + ["a", "b"]
    tracker = ResidencyTracker(rate=1 / 16)
    assert residency._sample_bits is not None and residency._pick is residency._sample_bits
    expected = python_sampled(shape(keys), 1 / 16)
    assert residency._pick(tracker._threshold, 0xFFFF, shape(keys)) == expected
    assert tracker.sample(shape(keys)) == expected
    assert 0.03 < len(expected) / len(keys) < 0.10  # about 1 in 16


def test_an_unhashable_key_is_a_clean_error() -> None:
    with pytest.raises(TypeError):
        ResidencyTracker(rate=1.0).born([["unhashable"]])
