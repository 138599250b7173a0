"""Paged KV-cache accounting: how many fixed-size blocks each request holds.

Without prefix caching, which physical block a request holds never changes a scheduling
decision, so blocks are counted rather than named (vidur does the same). The invariant the rest
of the engine relies on: ``0 <= free <= num_blocks`` and ``free + sum(held) == num_blocks``.
"""

from __future__ import annotations

import numpy as np


def cdiv(a: int, b: int) -> int:
    """Ceiling division for non-negative ints."""
    return -(-a // b)


class BlockManager:
    """Counts the KV blocks of one instance; ``held[i]`` is what request i holds."""

    def __init__(self, num_blocks: int, block_size: int, num_requests: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free = num_blocks
        self.held = np.zeros(num_requests, dtype=np.int64)

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold the KV of ``num_tokens`` tokens."""
        return cdiv(num_tokens, self.block_size)

    def grow_to(self, rid: int, num_tokens: int) -> bool:
        """Make request ``rid`` hold enough blocks for ``num_tokens``; False if memory is short."""
        need = cdiv(num_tokens, self.block_size) - int(self.held[rid])
        if need > self.free:
            return False
        if need > 0:
            self.held[rid] += need
            self.free -= need
        return True

    def add(self, ids: np.ndarray, need: np.ndarray, total: int) -> None:
        """Give each request ``need`` more blocks, ``total`` in all (the caller checked)."""
        assert total <= self.free, "KV blocks over-committed"
        self.held[ids] += need
        self.free -= total

    def set_held(self, ids: np.ndarray, held: np.ndarray, added: int) -> None:
        """Requests ``ids`` now hold ``held`` blocks, ``added`` more than before in total."""
        assert added <= self.free, "KV blocks over-committed"
        self.held[ids] = held
        self.free -= added

    def free_request(self, rid: int) -> int:
        """Release everything ``rid`` holds; returns the number of blocks released."""
        n = int(self.held[rid])
        self.held[rid] = 0
        self.free += n
        return n

    @property
    def used(self) -> int:
        return self.num_blocks - self.free

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, as vLLM's ``vllm:kv_cache_usage_perc`` (0-1)."""
        return self.used / self.num_blocks
