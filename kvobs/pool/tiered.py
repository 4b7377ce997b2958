"""A paged KV block pool with a GPU tier and a host tier, instrumented with kvobs.

This is the pool ``kvobs demo`` runs; it is also the smallest complete example of an
adapter: every state change is reported to a :class:`~kvobs.recorder.Recorder`, and
blocks really move between the two tensors through :mod:`kvobs.kernels`.

* Prefix reuse: full blocks are registered under their prefix hash; a request takes
  the longest run of its hashes found on the GPU (GPU hit), then the following run found
  on the host (host hit: onloaded into fresh GPU blocks), and computes the rest (miss).
* Offload: when the GPU has no free block, the least recently used cached block is
  copied to the host tier (unless already there) and its GPU block reused.
* Reuse profile: each admission's prompt blocks are its lookup; at release the answer's
  full blocks (written during decode, cached from now on) are reported as ``written``.
* Host eviction: the host tier evicts its least recently used block to make room; a
  block about to be onloaded is never chosen. Without room the offload is dropped.

The GPU tier is a CUDA tensor when CUDA is present (the host tier is then pinned),
otherwise both live in CPU memory.

Example:
    >>> from kvobs.presets import preset_layout
    >>> from kvobs.recorder import Recorder
    >>> rec = Recorder()
    >>> layout = preset_layout("qwen2.5-0.5b")
    >>> pool = TieredKVPool(layout, gpu_blocks=8, host_blocks=16, recorder=rec)
    >>> alloc = pool.admit([("sys", 0, 64)], output_tokens=16)
    >>> pool.release(alloc, [("sys", 0, 64), ("turn", 1, 16)])
    >>> again = pool.admit([("sys", 0, 64)], output_tokens=16)
    >>> again.gpu_hit_blocks, rec.snapshot().tier("gpu").in_use_blocks
    (4, 5)
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvobs.errors import ConfigError
from kvobs.kernels import BlockMover
from kvobs.kernels.stream_mover import StreamMover
from kvobs.layout import KVLayout, dtype_bytes
from kvobs.pool.hashing import Segment, block_hashes
from kvobs.recorder import Recorder
from kvobs.tiers import GPU, HOST


@dataclass
class Allocation:
    """GPU blocks held by one admitted request, in token order."""

    blocks: list[int]
    prompt_tokens: int
    gpu_hit_blocks: int
    host_hit_blocks: int


class _Mover:
    """Batched copies in one direction, reported to a recorder link.

    On CPU the copy is synchronous. With a CUDA tier it is queued on the direction's own
    stream; the compute stream waits on its event (no host sync), and ``poll`` reports
    finished transfers with their device-timed durations.
    """

    def __init__(
        self, src: torch.Tensor, dst: torch.Tensor, recorder: Recorder, link: tuple[str, str]
    ):
        link_recorder = recorder.link(*link)
        self._host: BlockMover | None = None
        self._device: StreamMover | None = None
        if src.device.type == "cpu" and dst.device.type == "cpu":
            self._host = BlockMover(src, dst, link=link_recorder)
        else:
            self._device = StreamMover(src, dst, link=link_recorder)

    def copy(self, pairs: list[tuple[int, int]]) -> None:
        if not pairs:
            return
        if self._host is not None:
            self._host.copy(pairs)
        elif self._device is not None:
            self._device.submit(pairs).wait()
            self._device.poll()

    def poll(self) -> None:
        if self._device is not None:
            self._device.poll()


class TieredKVPool:
    """GPU + host block pool with prefix caching, LRU offload, onload and host eviction.

    Args:
        layout: KV layout; one block holds ``layout.bytes_per_block`` bytes.
        gpu_blocks: blocks in the GPU tier.
        host_blocks: blocks in the host tier (0 disables offloading).
        recorder: where events go; the tiers ``gpu`` and ``host`` are registered on it.
        device: where the GPU tier lives; default CUDA when available, else CPU.
    """

    def __init__(
        self,
        layout: KVLayout,
        gpu_blocks: int,
        host_blocks: int,
        recorder: Recorder,
        device: str | torch.device | None = None,
    ) -> None:
        if gpu_blocks <= 0:
            raise ConfigError(f"gpu_blocks must be > 0, got {gpu_blocks}: pass --gpu-blocks N")
        if host_blocks < 0:
            raise ConfigError(f"host_blocks must be >= 0, got {host_blocks}: pass --host-blocks N")
        self.layout = layout
        self.block_tokens = layout.block_tokens
        self.recorder = recorder
        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        dtype = torch.uint8 if dtype_bytes(layout.dtype) == 1 else torch.bfloat16
        elems = layout.bytes_per_block // dtype.itemsize
        self.gpu = torch.empty((gpu_blocks, elems), dtype=dtype, device=device)
        self.host = torch.empty((host_blocks, elems), dtype=dtype, pin_memory=device.type == "cuda")
        self._gpu = recorder.add_tier(GPU, gpu_blocks, layout.block_tokens, layout.bytes_per_block)
        self._host = recorder.add_tier(
            HOST, host_blocks, layout.block_tokens, layout.bytes_per_block
        )
        self._offload_link = recorder.link(GPU, HOST)
        self._offload = _Mover(self.gpu, self.host, recorder, (GPU, HOST))
        self._onload = _Mover(self.host, self.gpu, recorder, (HOST, GPU))
        self._gpu_free = list(range(gpu_blocks - 1, -1, -1))
        self._gpu_ref = [0] * gpu_blocks
        self._gpu_hash: list[int | None] = [None] * gpu_blocks
        self._gpu_by_hash: dict[int, int] = {}
        self._gpu_cached: OrderedDict[int, int] = OrderedDict()  # hash -> block, ref 0, LRU first
        self._host_free = list(range(host_blocks - 1, -1, -1))
        self._host_by_hash: OrderedDict[int, int] = OrderedDict()  # hash -> block, LRU first

    # ---- public API -------------------------------------------------------------------
    def admit(self, segments: Sequence[Segment], output_tokens: int) -> Allocation | None:
        """Reserve GPU blocks for a prompt plus its output; None if they do not fit now."""
        prompt_tokens = sum(seg[2] for seg in segments)
        hashes = block_hashes(segments, self.block_tokens)
        total_blocks = -(-(prompt_tokens + output_tokens) // self.block_tokens)
        gpu_hits = 0
        while gpu_hits < len(hashes) and hashes[gpu_hits] in self._gpu_by_hash:
            gpu_hits += 1
        host_hits = 0
        while (
            gpu_hits + host_hits < len(hashes)
            and hashes[gpu_hits + host_hits] in self._host_by_hash
        ):
            host_hits += 1
        hit_blocks = [self._gpu_by_hash[h] for h in hashes[:gpu_hits]]
        needed = total_blocks - gpu_hits
        idle_hits = sum(1 for b in hit_blocks if self._gpu_ref[b] == 0)
        if needed > len(self._gpu_free) + len(self._gpu_cached) - idle_hits:
            return None

        for block in hit_blocks:  # pin GPU hits before anything can evict them
            if self._gpu_ref[block] == 0:
                del self._gpu_cached[self._gpu_hash[block]]  # type: ignore[arg-type]
            self._gpu_ref[block] += 1
        self._gpu.reuse(idle_hits)

        onload_hashes = hashes[gpu_hits : gpu_hits + host_hits]
        onload_src = [self._host_by_hash[h] for h in onload_hashes]
        new_blocks = self._take_gpu_blocks(needed, pinned_host=set(onload_src))
        for block in new_blocks:
            self._gpu_ref[block] = 1
        self._gpu.allocate(needed, keys=hashes[gpu_hits:])

        if onload_src:
            for h in onload_hashes:
                self._host_by_hash.move_to_end(h)
            # A host hit reads cached host blocks (reuse) that stay cached once the
            # onload has copied them (free to cache): the same events as vLLM's loads.
            self._host.reuse(host_hits, keys=onload_hashes)
            self._onload.copy(list(zip(onload_src, new_blocks[:host_hits], strict=True)))
            self._host.free(host_hits, cached=True)
        # Output blocks come last and get no hash until release.
        for h, block in zip(hashes[gpu_hits:], new_blocks, strict=False):
            self._register(h, block)
        self.recorder.lookup(
            prompt_tokens,
            gpu_hit=gpu_hits * self.block_tokens,
            host_hit=host_hits * self.block_tokens,
            keys=hashes,
        )
        return Allocation(hit_blocks + new_blocks, prompt_tokens, gpu_hits, host_hits)

    def release(self, allocation: Allocation, segments: Sequence[Segment]) -> None:
        """Free a finished request's blocks; full blocks of ``segments`` stay cached."""
        hashes = block_hashes(segments, self.block_tokens)
        cached = emptied = 0
        for index, block in enumerate(allocation.blocks):
            self._gpu_ref[block] -= 1
            if self._gpu_ref[block]:
                continue
            if self._gpu_hash[block] is None and index < len(hashes):
                self._register(hashes[index], block)
            h = self._gpu_hash[block]
            if h is None:
                self._gpu_free.append(block)
                emptied += 1
            else:
                self._gpu_cached[h] = block
                cached += 1
        self._gpu.free(cached, cached=True)
        self._gpu.free(emptied, cached=False)
        written = hashes[allocation.prompt_tokens // self.block_tokens:len(allocation.blocks)]
        if written:  # the answer's full blocks, cached now: the next turn's prompt hits them
            self.recorder.written(written)

    def poll_transfers(self) -> None:
        """Report finished asynchronous (CUDA) transfers; a no-op on CPU."""
        self._offload.poll()
        self._onload.poll()

    def occupancy(self) -> dict[str, tuple[int, int]]:
        """Ground truth ``(in_use, cached)`` per tier, read from the pool's own structures."""
        in_use = sum(1 for ref in self._gpu_ref if ref)
        return {GPU: (in_use, len(self._gpu_cached)), HOST: (0, len(self._host_by_hash))}

    # ---- internals --------------------------------------------------------------------
    def _register(self, h: int, block: int) -> None:
        if h not in self._gpu_by_hash:  # a duplicate of a cached block stays unhashed
            self._gpu_hash[block] = h
            self._gpu_by_hash[h] = block

    def _take_gpu_blocks(self, count: int, pinned_host: set[int]) -> list[int]:
        taken = [self._gpu_free.pop() for _ in range(min(count, len(self._gpu_free)))]
        shortfall = count - len(taken)
        if shortfall <= 0:
            return taken
        victims = [self._gpu_cached.popitem(last=False) for _ in range(shortfall)]
        self._offload_victims(victims, pinned_host)
        for h, block in victims:
            del self._gpu_by_hash[h]
            self._gpu_hash[block] = None
            taken.append(block)
        self._gpu.evict(shortfall, "capacity", keys=[h for h, _ in victims])
        return taken

    def _offload_victims(self, victims: list[tuple[int, int]], pinned_host: set[int]) -> None:
        if not self.host.shape[0]:
            return  # no host tier: nothing is offloaded, so nothing is dropped either
        pairs: list[tuple[int, int]] = []
        offloaded: list[int] = []
        dropped = 0
        for h, gpu_block in victims:
            if h in self._host_by_hash:
                self._host_by_hash.move_to_end(h)
                continue
            host_block = self._host_slot(pinned_host)
            if host_block is None:
                dropped += 1
                continue
            self._host_by_hash[h] = host_block
            pairs.append((gpu_block, host_block))
            offloaded.append(h)
        if dropped:
            self._offload_link.drop(dropped)
        if pairs:
            self._offload.copy(pairs)
            self._host.store(len(pairs), keys=offloaded)

    def _host_slot(self, pinned: set[int]) -> int | None:
        if self._host_free:
            return self._host_free.pop()
        for h, block in self._host_by_hash.items():
            if block not in pinned:
                del self._host_by_hash[h]
                self._host.evict(1, "capacity", keys=(h,))
                return block
        return None
