"""Iteration cost models: how long one engine iteration takes, given what it computes.

Every model maps a :class:`BatchStats` (sufficient statistics of one iteration's batch) to
seconds. The fields are plain numbers *or* equal-length numpy arrays, and every model is written
with elementwise numpy operations, so the engine can price a whole stretch of decode-only
iterations in one call (``iteration_time`` then returns an array).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

Number = float | int | np.ndarray


# not frozen: one is built per iteration or stretch, and a frozen __init__ is 6x slower
@dataclass(slots=True)
class BatchStats:
    """What one iteration computes, summed over its scheduled requests.

    For request i let q_i be the tokens it computes this iteration and c_i the tokens whose KV
    it already holds (its context before the iteration).
    """

    # number of scheduled requests
    num_seqs: Number
    # tokens computed for requests still in their prompt (prefill / chunked-prefill tokens)
    prefill_tokens: Number
    # requests computing exactly one token past their prompt (decodes)
    decode_seqs: Number
    # rows that produce a token this iteration (decodes + requests finishing their prompt): LM head
    sampled_seqs: Number
    # sum_i q_i * c_i  (attention of new tokens over the cached context)
    attn_q_ctx: Number
    # sum_i q_i * (q_i + 1) / 2  (causal attention among the new tokens themselves)
    attn_q_sq: Number
    # sum_i (c_i + q_i): KV tokens read by attention
    kv_tokens: Number
    # bytes moved over the host link this iteration (swap-out + swap-in); 0 without swapping
    swap_bytes: Number = 0

    @property
    def total_tokens(self) -> Number:
        """sum_i q_i: prefill tokens plus one per decode."""
        return self.prefill_tokens + self.decode_seqs


@runtime_checkable
class CostModel(Protocol):
    """Anything that prices an iteration. Must be a pure, elementwise function of the stats."""

    def iteration_time(self, stats: BatchStats) -> Number:
        """Seconds the iteration takes (an array if the stats hold arrays)."""
        ...


@dataclass(frozen=True, slots=True)
class LinearCostModel:
    """Iteration time = base + prefill_per_token x prefill tokens + decode_per_seq x decodes.

    ``prefill_base_s`` is the fixed cost of an iteration that computes only prefill tokens; the
    CB-SJF-Work study charges 8 ms there and 12 ms for decode iterations. It defaults to
    ``base_s``. ``host_link_bytes_per_s`` prices swap traffic (vLLM v0 swap over PCIe).
    """

    base_s: float = 0.012
    prefill_per_token_s: float = 0.00028
    decode_per_seq_s: float = 0.00042
    prefill_base_s: float | None = None
    host_link_bytes_per_s: float = 25e9

    def __post_init__(self) -> None:
        for name in ("base_s", "prefill_per_token_s", "decode_per_seq_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"LinearCostModel.{name} must be >= 0, got {getattr(self, name)}")
        if self.prefill_base_s is not None and self.prefill_base_s < 0:
            raise ValueError(
                f"LinearCostModel.prefill_base_s must be >= 0, got {self.prefill_base_s}"
            )
        if self.host_link_bytes_per_s <= 0:
            raise ValueError("LinearCostModel.host_link_bytes_per_s must be > 0")

    def iteration_time(self, stats: BatchStats) -> Number:
        base: Number = self.base_s
        if self.prefill_base_s is not None:
            prefill_only = np.logical_and(stats.decode_seqs == 0, stats.prefill_tokens > 0)
            base = np.where(prefill_only, self.prefill_base_s, self.base_s)
            if np.ndim(base) == 0:
                base = float(base)
        return (
            base
            + self.prefill_per_token_s * stats.prefill_tokens
            + self.decode_per_seq_s * stats.decode_seqs
            + stats.swap_bytes / self.host_link_bytes_per_s
        )
