"""What the compiled cluster reads, built from Python objects: its whole starting state, the
instances' static rows and cost coefficients, a rule's settings, and load reports as arrays
(and back)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from cbgym.cluster import state as K
from cbgym.cluster.config import ClusterConfig
from cbgym.cluster.edge import edge_settings
from cbgym.cluster.routing import LOAD_FIELDS, ROLE_CODES, Loads, Router
from cbgym.engine import gaps
from cbgym.engine import layout as L
from cbgym.engine import prefix_cache as pc
from cbgym.engine.trace_setup import caches_prefixes

if TYPE_CHECKING:
    from cbgym.cluster.cluster import Cluster
    from cbgym.workload.trace import Trace

NOT_ROUTED = -1


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


def cluster_state(c: Cluster, trace: Trace, router: Router | None, lock_step: bool,
                  audit: bool, seed: int) -> K.ClusterState:
    """The compiled state of cluster ``c`` starting on ``trace`` (its request slots)."""
    config = c.config
    n, N, n0 = len(trace), config.num_instances, c.num_offered
    inst, _ = static_tables(config)
    inst[K.KEYED] = c._keyed
    code, params = c.rule
    ci = np.zeros(K.NUM_CCI, np.int64)
    ci[K.N_INST], ci[K.ROUTER] = N, code
    ci[K.READS_LOADS] = router is None or router.reads_loads
    ci[K.PIPELINED] = config.link.mode == "pipelined"
    ci[K.AUDIT] = audit
    ci[K.LOCK_STEP] = lock_step
    si = np.zeros(K.NUM_CSI, np.int64)
    si[K.STOPPED] = -1
    # whose clock bounds each instance's: every other prefill or decode instance (an
    # event can reach an instance through a chain: D2 starts a transfer, P's blocks are
    # freed when it lands, P admits and delivers to D1; a new transfer can also make
    # another land earlier), none for a unified one
    pd = c.role != ROLE_CODES["unified"]
    peer = np.ones((N, N), np.int64) if lock_step else np.outer(pd, pd).astype(np.int64)
    np.fill_diagonal(peer, 0)
    req = np.zeros((K.NUM_CREQ, n), np.int64)
    req[K.PREFILL_I] = req[K.DECODE_I] = NOT_ROUTED
    req[K.ATTEMPT] = np.arange(n) // max(n0, 1)
    cf = rule_settings(config, params)
    edge_settings(ci, cf, n0, c.admission, c.client)
    jitter = np.random.default_rng(seed).random(n) if c.client else np.zeros(0)
    # (a few events per request are pending at once; _grow doubles it if ever short)
    hcap = 4 * n + N * max(e.max_num_seqs for e in config.engines) + 64
    nic = np.full(N, config.link.nic_bytes_per_s)
    return K.own_inputs(K.ClusterState(
        ci, cf, si, np.zeros(K.NUM_CSF), trace.arrival_s[:n0], trace.prompt_tokens,
        trace.output_tokens, c.ttft, c.tpot, req, c._times, inst,
        peer, np.zeros(hcap),
        np.zeros((4, hcap), np.int64), np.zeros(n + 64, np.int64),
        np.zeros((len(LOAD_FIELDS), N)), np.zeros((len(LOAD_FIELDS), N)),
        np.zeros(K.ROUTE_FIELDS, np.int64), jitter,
        K.new_link(nic, config.link.setup_s, cap=max(64, min(n, 4096) + 8))))


def batched_state(trace: Trace, config: ClusterConfig) -> L.State:
    """Every instance's engine state, instance by leading row; with prefix caching each
    instance its own named pool, one shape for all (the largest instance's)."""
    engines = config.engines
    block = max(int(e.block_size or 1) for e in engines)
    rows = max(max(L.LOG_ROWS, 4 * e.max_num_seqs) for e in engines)
    S = K.batched_states(config.num_instances, len(trace), block, rows,
                         gaps.slots(trace.output_tokens))
    if not caches_prefixes(trace, engines[0]):
        return S
    if len({e.block_size for e in engines}) > 1:
        raise ValueError("ClusterConfig: prefix caching needs one block size on every "
                         "instance")
    size = int(pc.table_offsets(trace.prompt_tokens, trace.output_tokens, block)[-1])
    blocks, cache, tables = pc.empty_pool(max(int(e.num_kv_blocks or 1) for e in engines),
                                          size)
    N = config.num_instances
    return S._replace(blocks=np.zeros((N, *blocks.shape), np.int64),
                      cache=np.zeros((N, *cache.shape), np.int64),
                      tables=np.zeros((N, *tables.shape), np.int64))
