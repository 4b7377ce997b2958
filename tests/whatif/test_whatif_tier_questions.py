"""The tier questions read off a curve (:func:`kvobs.whatif.host_hit_ratio`,
:func:`kvobs.whatif.table`): the host's hits are the hierarchy's at its effective size
(inclusive: the larger tier's blocks; exclusive: both tiers') less the GPU's."""

from __future__ import annotations

import pytest

from kvobs.whatif import Curve, host_hit_ratio, table

# hit ratio 0.1 at 10 blocks, 0.3 at 20, 0.6 at 40, flat beyond
CURVE = Curve(1000.0, False, "test", _points=((10.0, 0.1), (20.0, 0.3), (40.0, 0.6)))


def test_an_inclusive_host_holds_the_larger_tiers_blocks() -> None:
    assert host_hit_ratio(CURVE, gpu_blocks=10, host_blocks=40) == pytest.approx(0.5)
    assert host_hit_ratio(CURVE, 10, 40, inclusive=True) == pytest.approx(0.5)
    assert host_hit_ratio(CURVE, 20, 10, inclusive=True) == 0.0  # smaller: holds nothing new
    assert host_hit_ratio(CURVE, 20, 20) == 0.0  # inclusive unless told: copies of the GPU's


def test_an_exclusive_host_adds_its_blocks_to_the_gpus() -> None:
    assert host_hit_ratio(CURVE, 10, 10, inclusive=False) == pytest.approx(0.2)  # 20 - 10
    assert host_hit_ratio(CURVE, 20, 20, inclusive=False) == pytest.approx(0.3)  # 40 - 20
    assert host_hit_ratio(CURVE, 15, 15, inclusive=False) == pytest.approx(0.6 - 0.2 - 0.15)


def test_the_host_never_reads_negative() -> None:
    falling = Curve(10.0, False, "test", _points=((10.0, 0.5), (20.0, 0.2)))
    assert host_hit_ratio(falling, 10, 20) == 0.0
    assert host_hit_ratio(falling, 10, 10, inclusive=False) == 0.0


def test_the_table_has_a_row_per_size_in_order() -> None:
    assert table(CURVE, [40, 5, 15]) == [
        {"blocks": 40, "hit_ratio": pytest.approx(0.6)},
        {"blocks": 5, "hit_ratio": pytest.approx(0.05)},
        {"blocks": 15, "hit_ratio": pytest.approx(0.2)},
    ]
    assert table(CURVE, []) == []
