"""The vLLM ``cache_full_blocks`` reader in C counts what its Python reference counts.

The reader runs for every block a vLLM request fills: the C extension's
``cache_full_after`` must add the same gained hashes and report the same decode-written
block hashes as ``block_pool.python_cache_full_after``, for any window, block size, group,
before-count, and arguments by position or by keyword. (The real engine suites run the C
reader against vLLM's own counts; the mutation check runs the Python one.)
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from kvobs.adapters.vllm import block_pool
from kvobs.kernels._ext import native
from kvobs.recorder import WRITTEN_MAX, Recorder

pytestmark = pytest.mark.skipif(getattr(native, "cache_full_after", None) is None,
                                reason="the C extension is not built here")


class Block:
    __slots__ = ("_block_hash", "ref_cnt")

    def __init__(self, hashed: bool) -> None:
        self._block_hash = b"h" if hashed else None
        self.ref_cnt = 1


def state(rnd: random.Random, written: bool):
    hash_size = rnd.choice([16, 32])
    rec = Recorder()
    rec.written_pending.extend(f"w{i}".encode() for i in range(rnd.choice([0, 5, 4090])))
    inst = SimpleNamespace(hashes_gained=rnd.randrange(100), hash_size=hash_size, rec=rec,
                           written_to=rec.written_pending if written else None)
    blocks = [Block(rnd.random() < 0.7) for _ in range(rnd.randrange(0, 12))]
    request = SimpleNamespace(num_prompt_tokens=rnd.randrange(0, 400),
                              block_hashes=[f"k{i}".encode() for i in range(rnd.randrange(40))])
    return inst, blocks, request


@pytest.mark.parametrize("seed", range(5))
def test_the_c_reader_counts_and_reports_what_the_python_reader_does(seed):
    rnd = random.Random(seed)
    for case in range(400):
        written = rnd.random() < 0.8
        pair = [state(random.Random(seed * 1000 + case), written) for _copy in range(2)]
        before = rnd.choice([None, 0, 1, 2])
        cached, full = rnd.randrange(0, 14), rnd.randrange(0, 16)
        block_size, group = rnd.choice([0, 16, 32, 64]), rnd.choice([0, 0, 1])
        by_keyword = rnd.random() < 0.3
        for reader, (inst, blocks, request) in zip(
                (native.cache_full_after, block_pool.python_cache_full_after), pair,
                strict=True):
            if by_keyword:
                reader(inst, before, None, request=request, blocks=blocks,
                       num_cached_blocks=cached, num_full_blocks=full,
                       block_size=block_size, kv_cache_group_id=group, block_mask=None)
            else:
                reader(inst, before, None, request, blocks, cached, full, block_size, group,
                       None)
        (c_inst, _, _), (py_inst, _, _) = pair
        assert c_inst.hashes_gained == py_inst.hashes_gained
        assert c_inst.rec.written_pending == py_inst.rec.written_pending
        assert c_inst.rec.snapshot().reuse == py_inst.rec.snapshot().reuse  # flushed alike


def test_past_the_bound_the_c_reader_hands_the_keys_to_the_recorder_which_flushes():
    """The C reader appends in place only under ``WRITTEN_MAX``; past it, the recorder's
    own ``written`` flushes the waiting blocks into the profile, as the Python reader's
    call does."""
    rec = Recorder(profile_reuse=True)
    rec.add_tier("gpu", 1000, 16, 0)  # the profile tracks every block at this size
    rec.written_pending.extend(range(WRITTEN_MAX - 1))
    inst = SimpleNamespace(hashes_gained=0, hash_size=16, rec=rec, written_to=rec.written_pending)
    request = SimpleNamespace(num_prompt_tokens=0, block_hashes=[b"a", b"b", b"c"])
    native.cache_full_after(inst, None, None, request, [Block(True)] * 3, 0, 1, 16, 0)
    assert rec.written_pending == [*range(WRITTEN_MAX - 1), b"a"]  # in place: it fits
    native.cache_full_after(inst, None, None, request, [Block(True)] * 3, 1, 3, 16, 0)
    assert rec.written_pending == []  # 4,098 would wait: flushed
    assert rec.reuse is not None and rec.reuse.tracked == WRITTEN_MAX + 2


def test_the_c_reader_raises_where_the_python_reader_raises():
    rec = Recorder()
    inst = SimpleNamespace(hashes_gained=0, hash_size=16, rec=rec, written_to=rec.written_pending)
    request = SimpleNamespace(block_hashes=[b"a"])  # no num_prompt_tokens
    for reader in (native.cache_full_after, block_pool.python_cache_full_after):
        with pytest.raises(AttributeError, match="num_prompt_tokens"):
            reader(inst, None, None, request, [Block(True)], 0, 1, 16, 0)
    with pytest.raises(TypeError, match="missing num_full_blocks"):
        native.cache_full_after(inst, None, None, request, [], 0)
    for reader in (native.cache_full_after, block_pool.python_cache_full_after):
        with pytest.raises(TypeError, match="multiple values for argument 'request'"):
            reader(inst, None, None, request, [], 0, 1, request=request)
