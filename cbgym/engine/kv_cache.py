"""What an engine's paged KV cache looks like from outside: blocks held, free, in use.

The kernel counts blocks (``cbgym.engine.kutil``); this is the read-only view the Python side
shows (``Engine.kv``). The invariant: ``0 <= free <= num_blocks``,
``free + held.sum() == num_blocks`` (with prefix caching, blocks are shared: ``free`` + the
blocks anybody holds ``== num_blocks``, ``cbgym.engine.prefix_cache``).
"""

from __future__ import annotations

import numpy as np

from cbgym.engine import layout as L


class KVCacheView:
    """The KV cache of one engine: ``held[i]`` blocks are request i's."""

    def __init__(self, s: L.State, num_blocks: int, block_size: int) -> None:
        self._s = s
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.held: np.ndarray = s.req[L.HELD]

    @property
    def free(self) -> int:
        return int(self._s.si[L.FREE])

    @property
    def used(self) -> int:
        return self.num_blocks - self.free

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, as vLLM's ``vllm:kv_cache_usage_perc`` (0-1)."""
        return self.used / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold the KV of ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)
