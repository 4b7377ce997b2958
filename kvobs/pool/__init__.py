"""The reference tiered KV pool and the simulated serving loop that ``kvobs demo`` runs."""

from kvobs.pool.hashing import block_hashes
from kvobs.pool.serving import ServingConfig, ServingLoop
from kvobs.pool.tiered import Allocation, TieredKVPool

__all__ = ["Allocation", "ServingConfig", "ServingLoop", "TieredKVPool", "block_hashes"]
