"""What the compiled cluster reads, built from Python objects: the instances' static rows and
cost coefficients, a rule's settings, and load reports as arrays (and back)."""

from __future__ import annotations

import numpy as np

from cbgym.cluster import state as K
from cbgym.cluster.config import ClusterConfig
from cbgym.cluster.routing import LOAD_FIELDS, ROLE_CODES, Loads


def static_tables(config: ClusterConfig) -> tuple[np.ndarray, np.ndarray]:
    """The instances' rows routers read (``state.ROLE`` .. ``COST_KIND``; the dynamic rows
    zero) and their cost coefficients, zero-padded: what a compiled rule is handed."""
    from cbgym.engine.pricing import cost_params

    N = config.num_instances
    inst = np.zeros((K.NUM_CINST, N), np.int64)
    costs = []
    for i, (role, e) in enumerate(zip(config.roles, config.engines, strict=True)):
        kind, coef = cost_params(e.cost_model)
        inst[K.ROLE, i], inst[K.COST_KIND, i] = ROLE_CODES[role], kind
        inst[K.BUDGET, i], inst[K.BLOCK, i] = e.max_num_batched_tokens, e.block_size
        inst[K.SEQS, i], inst[K.KV_BYTES, i] = e.max_num_seqs, e.kv_bytes_per_token or 0
        inst[K.CHUNKED, i] = e.chunked_prefill
        costs.append(coef)
    coefs = np.zeros((N, max(len(c) for c in costs)))
    for i, c in enumerate(costs):
        coefs[i, : len(c)] = c
    return inst, coefs


def rule_settings(config: ClusterConfig, params: dict[int, float]) -> np.ndarray:
    """``ClusterState.cf``: the load report interval, the link, a rule's parameters."""
    cf = np.zeros(K.NUM_CCF)
    cf[K.INTERVAL] = config.load_report_interval_s
    cf[K.NIC], cf[K.SETUP] = config.link.nic_bytes_per_s, config.link.setup_s
    for k, v in params.items():
        cf[k] = v
    return cf


def loads_array(loads: Loads) -> np.ndarray:
    """A report's signals as the kernels read them (rows: ``LOAD_FIELDS``)."""
    return np.stack([np.asarray(getattr(loads, f), np.float64) for f in LOAD_FIELDS])


def loads_of(a: np.ndarray, t: float) -> Loads:
    """The :class:`Loads` of a kernel's report array (copied)."""
    cols = dict(zip(LOAD_FIELDS, a.copy(), strict=True))
    ints = {k: v.astype(np.int64) for k, v in cols.items()
            if k not in ("kv_usage", "last_iteration_s")}
    return Loads(report_s=float(t), kv_usage=cols["kv_usage"],
                 last_iteration_s=cols["last_iteration_s"], **ints)
