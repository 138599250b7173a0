"""The one implementation of iteration pricing: cost models are data the kernel reads.

Each cost model compiles to a kind and a coefficient vector (:func:`cost_params`), and
:func:`price` turns one iteration's batch statistics into seconds. The engine calls it
compiled; the models' own ``iteration_time`` calls the same function, uncompiled over numpy
arrays when the statistics are arrays (a whole sweep of batches at once), so there is no
second formula to drift.

Bring your own cost model as data:

* :class:`~cbgym.engine.table_cost.TableCostModel`: fitted to a profiling CSV of your GPU
  (``TableCostModel.from_csv``), or built from coefficients you measured;
* :class:`~cbgym.engine.cost_model.LinearCostModel`: the study's three constants;
* :class:`~cbgym.engine.roofline.RooflineCostModel`: a model and GPU spec of your own
  (``cbgym.engine.hardware.ModelSpec`` / ``GpuSpec``) and efficiency factors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from cbgym.engine.jit import no_alloc_kernel

if TYPE_CHECKING:
    from cbgym.engine.cost_model import BatchStats, Number

LINEAR, ROOFLINE, TABLE = range(3)
COST_KINDS = ("linear", "roofline", "table")


@no_alloc_kernel
def price(kind: int, c: np.ndarray, num_seqs: int, prefill_tokens: int, decode_seqs: int,
          sampled_seqs: int, attn_q_ctx: int, attn_q_sq: int, kv_tokens: int,
          swap_bytes: int) -> float:
    """Seconds one iteration takes (see :class:`~cbgym.engine.cost_model.BatchStats`).

    Written with ``np.maximum`` and index arithmetic so that, uncompiled, it also prices arrays of
    batches elementwise, in the same float operations and order as the compiled scalar path.
    """
    if kind == LINEAR:
        # c: base, per prefill token, per decode, prefill-only base (NaN: none), link bytes/s
        base = c[0]
        if not np.isnan(c[3]):  # the study charges prefill-only iterations less: index 3
            base = c[3 * ((decode_seqs == 0) & (prefill_tokens > 0))]
        return (base + c[1] * prefill_tokens + c[2] * decode_seqs + swap_bytes / c[4])
    if kind == TABLE:
        # c: intercept, per prefill token, per decode, per KV token, per attn_q_sq, link
        return (c[0] + c[1] * prefill_tokens + c[2] * decode_seqs + c[3] * kv_tokens
                + c[4] * attn_q_sq + swap_bytes / c[5])
    # ROOFLINE (cbgym.engine.roofline): every operator takes the longer of compute and memory
    tokens = prefill_tokens + decode_seqs
    pairs = attn_q_ctx + attn_q_sq
    return (np.maximum(c[0] * tokens, c[1])  # linear layers
            + np.maximum(c[2] * sampled_seqs, c[3] * np.minimum(sampled_seqs, 1))  # LM head
            + np.maximum(c[4] * tokens, c[5])  # elementwise kernels
            + c[6] + c[7] * tokens  # tensor-parallel all-reduce
            + c[8] + c[9] * num_seqs  # host overhead
            + c[10] * swap_bytes
            # attention last: in a decode sweep it is the only term that varies
            + np.maximum(c[11] * pairs, c[12] * kv_tokens))


def iteration_time(kind: int, coef: np.ndarray, stats: BatchStats) -> Number:
    """:func:`price` of ``stats``: compiled for numbers, elementwise numpy for arrays."""
    args = (stats.num_seqs, stats.prefill_tokens, stats.decode_seqs, stats.sampled_seqs,
            stats.attn_q_ctx, stats.attn_q_sq, stats.kv_tokens, stats.swap_bytes)
    if any(isinstance(a, np.ndarray) for a in args):
        fn = getattr(price, "py_func", price)
        out = fn(kind, coef, *(np.asarray(a) for a in args))
        return np.asarray(out, dtype=np.float64)
    return float(price(kind, coef, *(int(a) for a in args)))


def cost_params(model: object) -> tuple[int, np.ndarray]:
    """(kind, coefficients) of a cost model, or a ValueError saying how to bring one."""
    params = getattr(model, "kernel_params", None)
    if params is None:
        raise ValueError(
            f"cost model {type(model).__name__} is not one the engine compiles: use "
            "LinearCostModel, RooflineCostModel or TableCostModel (fit one to your own "
            "profiling table with TableCostModel.from_csv, or give its coefficients)")
    kind, coef = params()
    return int(kind), np.ascontiguousarray(coef, dtype=np.float64)
