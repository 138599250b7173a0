"""The compiled cluster's data: its instances batched, the link, the event heap, per-request
handoff rows (gymnax's split: what a run mutates, as arrays).

Every instance's engine :class:`~cbgym.engine.layout.State` is row ``i`` of batched arrays
(``CartPoleVectorEnv``'s style, as :mod:`cbgym.env.vector_ops` batches envs), padded to the
largest instance; :func:`instance` returns instance i's views, the very arrays the Python
:class:`~cbgym.engine.Engine` of that instance reads. Scalars live in small arrays under the
names below, because a numba tuple is immutable and its arrays are not.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from cbgym.engine import layout as L
from cbgym.engine import prefix_cache as pc
from cbgym.engine.jit import no_alloc_kernel
from cbgym.engine.layout import Params, State

_codes = L._codes

# ---------------------------------------------------------------- ClusterState.ci (static)
# ROUTER: a compiled rule (cbgym.cluster.route_ops) or DOOR (a Python router answers at the
# door); READS_LOADS: whether load reports are taken; AUDIT: check every transfer's blocks;
# EAGER: route an arrival as soon as the load report it reads is taken (module cluster);
# LOCK_STEP: every instance bounded by every other (the time-order tests' reference);
# the edge (cbgym.cluster.edge): EDGE (admission control or a client model is on), N_ORIG
# (requests in the trace; slot k * N_ORIG + j is attempt k of request j), MAX_WAIT /
# MAX_FLIGHT (caps, -1: none), CAP_SCOPE (0: the whole cluster, 1: the routed instance),
# MAX_RETRIES, RETRY_MASK (bits: 1 rejected, 2 expired, 4 timed out), ABORT (an abandoned
# request is aborted on the server), ON_FINISH (the client times the whole response, not
# its first token)
(N_INST, ROUTER, READS_LOADS, PIPELINED, AUDIT, EAGER, LOCK_STEP, EDGE, N_ORIG, MAX_WAIT,
 MAX_FLIGHT, CAP_SCOPE, MAX_RETRIES, RETRY_MASK, ABORT, ON_FINISH) = _codes(16)
NUM_CCI = 16
# ---------------------------------------------------------------- ClusterState.cf (static)
# INTERVAL: load_report_interval_s; NIC / SETUP: the link config (Kairos-transfer's term);
# ALPHA, BETA (Kairos), LENGTH, QUEUE (Dynamo), THRESHOLD (llm-d); the edge's TTL (queue
# TTL), CLIENT_TIMEOUT (the client's), B_BASE / B_MULT / B_CAP / JITTER (its backoff), all
# inf or 0 when off. (Not TIMEOUT: that is an event kind below, and the two once shared a
# name, so the client's timeout went into THRESHOLD's slot and llm-d never disaggregated)
(INTERVAL, NIC, SETUP, ALPHA, BETA, LENGTH, QUEUE, THRESHOLD, TTL, CLIENT_TIMEOUT, B_BASE,
 B_MULT, B_CAP, JITTER) = _codes(14)
NUM_CCF = 14
# ---------------------------------------------------------------- ClusterState.si
# NEXT: next arrival to route; HEAP_N / SEQ: the event heap; LAST_TID: last transfer id;
# STOPPED: the instance a call stopped in (-1: none), resumed by the next call;
# HAVE_REPORT: a load report was taken; REPORTS: how many; COUNT: routes so far
# (round-robin); ADVANCES: instance kernel calls; STARTS / LANDS: audited transfers;
# BAD: the instance a compiled route could not use (code CL_BAD_ROUTE); ROUTE_RID: the
# request a CL_AT_ROUTE stop asks about (an arrival, si[NEXT], or a client's retry);
# P_SHED_N: requests a prefill instance shed (bulk: they never reach D); ROUTED_N: placed
(NEXT, HEAP_N, SEQ, LAST_TID, STOPPED, HAVE_REPORT, REPORTS, COUNT, ADVANCES, STARTS, LANDS,
 BAD, ROUTE_RID, P_SHED_N, ROUTED_N) = _codes(15)
NUM_CSI = 15
REPORT_S = np.int64(0)  # ClusterState.sf: when the last load report was taken
NUM_CSF = 1

# ---------------------------------------------------------------- per request (int64 rows)
# PREFILL_I / DECODE_I: where it went (-1: not routed); DEFLECTED; CAP: its chunk cap;
# SENT: prompt tokens whose KV is sent or in flight; READY: prompt tokens P has computed
# (pipelined); INFLIGHT: its transfers in flight; ALLOCATED: D holds blocks for the prompt;
# P_DONE: P computed its prompt; DROPPED: ended on one side (no KV needed any more);
# BYTES: KV bytes sent; ATTEMPT: which attempt of its request (0: the first); OUTCOME: how
# the edge ended it (O_* below; 0: it ran on the server to its end)
(PREFILL_I, DECODE_I, DEFLECTED, CAP, SENT, READY, INFLIGHT, ALLOCATED, P_DONE, DROPPED,
 BYTES, ATTEMPT, OUTCOME) = _codes(13)
NUM_CREQ = 13
# ---------------------------------------------------------------- per request (float64 rows)
# SENT_S: when the client sent it (NaN: a retry never sent); CLIENT_END: when the client
# had its answer from the edge (a 429 or 503, or it gave up)
PREFILL_DONE, T_START, T_END, SENT_S, CLIENT_END = _codes(5)
NUM_CTIME = 5
# OUTCOME codes: rejected at admission (HTTP 429), expired in the queue (503), abandoned by
# its client (timed out)
O_NONE, O_REJECTED, O_EXPIRED, O_ABANDONED = _codes(4)
# ---------------------------------------------------------------- per instance (int64 rows)
# ROLE (routing.ROLE_CODES); ACTIVE (may act: something was delivered since it drained);
# KV_OUT: requests whose KV a prefill instance still holds; INCOMING: routed to a decode
# instance, prefilling elsewhere; KEYED: its local policy is decided in the kernel;
# BUDGET / BLOCK / SEQS / KV_BYTES / CHUNKED / COST_KIND: its EngineConfig's, as routers
# read them (max_num_batched_tokens, block_size, max_num_seqs, kv_bytes_per_token,
# chunked_prefill, the cost model's kind; its coefficients are the batched Params.cost);
# ROUTED: requests routed here since the last load report (what a router keeping its own
# in-flight accounting adds to a stale report; 0 with live loads); PROBE (prefix caching):
# the tokens of the request being routed each instance's cache holds now (probe_each)
(ROLE, ACTIVE, KV_OUT, INCOMING, KEYED, BUDGET, BLOCK, SEQS, KV_BYTES, CHUNKED,
 COST_KIND, ROUTED, PROBE) = _codes(13)
NUM_CINST = 13
# event kinds, in the order events of one instant are handled: a prompt chunk done on P, P's
# last chunk, P shed it, D allocated its blocks, D shed it; then the edge's: a queue TTL
# runs out, a client's timeout, a client's retry (routed as an arrival)
CHUNK, DONE, P_SHED, ALLOC, D_SHED, EXPIRE, TIMEOUT, RETRY = _codes(9)[1:]
# heap rows (int64); the time is ClusterState.heap_t
H_KIND, H_SEQ, H_RID, H_COMPUTED = _codes(4)
# what a cluster kernel call stopped at
CL_DRAINED, CL_AT_ROUTE, CL_AT_DECISION, CL_NEED_ROOM, CL_STUCK, CL_GROW, CL_BAD_ROUTE = (
    _codes(7))
# ROLE codes (as cbgym.cluster.routing.ROLE_CODES)
UNIFIED, PREFILL, DECODE = _codes(3)
ROUTE_FIELDS = 3  # ClusterState.route: prefill (-1: none), decode, chunk cap
HEAP_MARGIN = 8  # heap entries one pass of the loop may add besides an instance's outbox


class LinkState(NamedTuple):
    """The NICs and the transfers in flight (:mod:`cbgym.cluster.link_ops`)."""

    i: np.ndarray  # (NUM_LKI, cap) int64: TID, SRC, DST, JOINED, sorted by tid
    f: np.ndarray  # (NUM_LKF, cap) float64: LEFT (bytes), JOIN (setup ends), RATE (B/s)
    cap: np.ndarray  # (2N,) capacity: egress 0..N-1, ingress N..2N-1
    si: np.ndarray  # LN (in flight), PEND_N (landed while a start moved the clock), CACHED_OK
    sf: np.ndarray  # NOW, SETUP, CACHED (the next event time while CACHED_OK)
    pend: np.ndarray  # (cap,) tids landed while a start moved the clock
    out: np.ndarray  # (cap,) tids an advance landed, first its return value
    scr: np.ndarray  # (4, 2N) float64 water-filling scratch
    fr: np.ndarray  # (2, cap) int64 water-filling scratch


TID, SRC, DST, JOINED = _codes(4)
NUM_LKI = 4
LEFT, JOIN, RATE = _codes(3)
NUM_LKF = 3
LN, PEND_N, CACHED_OK = _codes(3)
NOW, SETUP_S, CACHED = _codes(3)


class ClusterState(NamedTuple):
    """One cluster run (see the names above); ``link`` is nested."""

    ci: np.ndarray
    cf: np.ndarray
    si: np.ndarray
    sf: np.ndarray
    arrival: np.ndarray  # (N_ORIG,) trace arrivals (the rows below: n slots, retries after)
    prompt: np.ndarray  # (n,)
    output: np.ndarray  # (n,) true output lengths (delivered to D; never routed on)
    ttft: np.ndarray  # (n,) SLO targets
    tpot: np.ndarray
    req: np.ndarray  # (NUM_CREQ, n) int64
    times: np.ndarray  # (NUM_CTIME, n) float64
    inst: np.ndarray  # (NUM_CINST, N) int64
    peer: np.ndarray  # (N, N) int64: peer[i, j] = 1 if j's clock bounds i's
    heap_t: np.ndarray  # (hcap,) event times
    heap: np.ndarray  # (4, hcap) int64: H_KIND, H_SEQ, H_RID, H_COMPUTED
    tid_rid: np.ndarray  # (tcap,) the request of each transfer id
    loads: np.ndarray  # (len(LOAD_FIELDS), N) the last load report
    live: np.ndarray  # (len(LOAD_FIELDS), N) scratch: loads taken now
    route: np.ndarray  # (ROUTE_FIELDS,) the last compiled route
    jitter: np.ndarray  # (n,) a uniform draw in [0, 1) per request slot: its retry's jitter
    link: LinkState


def own_inputs(C: ClusterState) -> ClusterState:
    """``C`` with the trace's columns as writable arrays of its own. numba types a read-only
    array apart from a writable one (``jit.frozen``), and the cluster env's typed list of
    states holds writable ones: one type keeps every cluster run on one compiled loop."""
    f64, i64 = np.float64, np.int64
    return C._replace(arrival=np.array(C.arrival, f64), prompt=np.array(C.prompt, i64),
                      output=np.array(C.output, i64), ttft=np.array(C.ttft, f64),
                      tpot=np.array(C.tpot, f64))


def new_link(nic: np.ndarray, setup_s: float, cap: int = 64) -> LinkState:
    n2 = 2 * len(nic)
    return LinkState(np.zeros((NUM_LKI, cap), np.int64), np.zeros((NUM_LKF, cap)),
                     np.concatenate([nic, nic]).astype(np.float64), np.zeros(3, np.int64),
                     np.array([0.0, setup_s, np.inf]), np.zeros(cap, np.int64),
                     np.zeros(cap, np.int64), np.zeros((4, n2)), np.zeros((2, cap), np.int64))


def grow_link(lk: LinkState) -> LinkState:
    """``lk`` with twice the room for transfers (same contents)."""
    cap = 2 * lk.i.shape[1]
    i, f = np.zeros((NUM_LKI, cap), np.int64), np.zeros((NUM_LKF, cap))
    i[:, : lk.i.shape[1]], f[:, : lk.f.shape[1]] = lk.i, lk.f
    pend, out = np.zeros(cap, np.int64), np.zeros(cap, np.int64)
    pend[: len(lk.pend)] = lk.pend
    return lk._replace(i=i, f=f, pend=pend, out=out, fr=np.zeros((2, cap), np.int64))


def grow(a: np.ndarray) -> np.ndarray:
    """``a`` with its last axis twice as long (same contents first)."""
    out = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
    out[..., : a.shape[-1]] = a
    return out


def batched_states(N: int, n: int, block_size: int, log_rows: int, gap_slots: int) -> State:
    """Empty engine states for N instances of n requests, instance by leading row
    (``gap_slots``: ``cbgym.engine.gaps.slots`` of their output lengths)."""
    return State(np.zeros((N, L.NUM_REQ_ROWS, n), np.int64), np.zeros((N, L.NUM_TIME_ROWS, n)),
                 np.zeros((N, L.NUM_ID_ROWS, n), np.int64), np.zeros((N, L.NUM_SI), np.int64),
                 np.zeros((N, L.NUM_SF)), np.zeros((N, L.REC_ROWS, len(L.REC_COLUMNS))),
                 np.zeros((N, log_rows, 3), np.int64), np.zeros((N, log_rows, 2), np.int64),
                 np.zeros((N, block_size), np.int64), np.zeros((N, gap_slots)),
                 *(np.zeros((N, *a.shape), np.int64) for a in pc.no_pool()))


def batched_params(params: list[Params]) -> Params:
    """The instances' static parameters, instance by row (cost vectors zero-padded)."""
    k = max(len(p.cost) for p in params)
    cost = np.zeros((len(params), k))
    for i, p in enumerate(params):
        cost[i, : len(p.cost)] = p.cost
    return Params(np.stack([p.ci for p in params]), cost)


def view(S: State, i: int) -> State:
    """Instance i's state, as views (Python side: what its Engine holds)."""
    return State(*(a[i] for a in S))


@no_alloc_kernel
def instance(S: State, i: int) -> State:
    """Instance i's state (views into the batched arrays). ``cbgym.env.vector_ops.engine_at``
    is its twin compiled with reference counting: a view returned by a kernel compiled
    without it must not reach one compiled with it (it would be released once too often)."""
    return State(S.req[i], S.times[i], S.ids[i], S.si[i], S.sf[i], S.rec[i], S.blog[i],
                 S.plog[i], S.slots[i], S.gaps[i], S.blocks[i], S.cache[i], S.tables[i])


@no_alloc_kernel
def params_at(P: Params, i: int) -> Params:
    return Params(P.ci[i], P.cost[i])


@no_alloc_kernel
def probe_each(S: State, rid: int, block_size: int, out: np.ndarray) -> None:
    """``out[i]``: the tokens of ``rid``'s prompt instance i's prefix cache holds now."""
    for i in range(len(out)):
        out[i] = pc.probe(instance(S, i), rid, block_size)
