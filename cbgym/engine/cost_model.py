"""Iteration cost models: how long one engine iteration takes, given what it computes.

Every model maps a :class:`BatchStats` (sufficient statistics of one iteration's batch) to
seconds. A model is data: its ``kernel_params()`` are what the engine's compiled kernel reads,
and its ``iteration_time`` evaluates the same formula (:func:`cbgym.engine.pricing.price`), on
numbers or elementwise on equal-length numpy arrays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real
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
    """What the engine prices iterations with: coefficients for the compiled formula."""

    def kernel_params(self) -> tuple[int, np.ndarray]:
        """(kind, coefficients): see :mod:`cbgym.engine.pricing`."""
        ...

    def iteration_time(self, stats: BatchStats) -> Number:
        """Seconds the iteration takes (an array if the stats hold arrays)."""
        ...


def check_coefficient(owner: str, name: str, value: object, bound: str = ">= 0") -> None:
    """Raise ValueError unless ``value`` is a finite real number satisfying ``bound``.

    ``bound`` is ">= 0" (costs), "> 0" (bandwidths) or "" (any finite number). bool and str
    are rejected: True would price as 1 s and "0.01" would fail only inside iteration_time.
    """
    x = math.nan  # anything that is not a real number fails the finiteness test below
    if isinstance(value, Real) and not isinstance(value, bool | np.bool_):
        try:
            x = float(value)
        except OverflowError:  # an int too large for a float
            x = math.inf
    ok = math.isfinite(x) and (x >= 0 if bound == ">= 0" else x > 0 if bound == "> 0" else True)
    if not ok:
        shown = f" {bound}" if bound else ""
        raise ValueError(f"{owner}.{name} must be a finite number{shown}, got {value!r}")


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
            check_coefficient("LinearCostModel", name, getattr(self, name))
        if self.prefill_base_s is not None:
            check_coefficient("LinearCostModel", "prefill_base_s", self.prefill_base_s)
        check_coefficient("LinearCostModel", "host_link_bytes_per_s", self.host_link_bytes_per_s,
                          "> 0")

    def kernel_params(self) -> tuple[int, np.ndarray]:
        """(kind, coefficients) the engine's kernel prices with (cbgym.engine.pricing)."""
        from cbgym.engine.pricing import LINEAR

        pb = np.nan if self.prefill_base_s is None else self.prefill_base_s
        return LINEAR, np.array([self.base_s, self.prefill_per_token_s, self.decode_per_seq_s,
                                 pb, self.host_link_bytes_per_s], dtype=np.float64)

    def iteration_time(self, stats: BatchStats) -> Number:
        """Seconds for one iteration (an array when the stats hold arrays)."""
        from cbgym.engine.pricing import iteration_time

        return iteration_time(*self.kernel_params(), stats)
