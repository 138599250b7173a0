"""``cbgym/Cluster-v0``'s compiled parts: its one observation encoder, its goodput count, and
the batched step of :class:`~cbgym.env.cluster_vector.ClusterVectorEnv`.

:func:`encode_into` is the only encoder of the cluster env's observation: ``ClusterEnv``
(through :func:`cbgym.env.cluster_env.encode`, as learned routers do) and the vector env's
kernel both call it, so the two agree bit for bit. :func:`step_batch` steps N clusters in
one call, numba's threads over envs: each env applies its route (``loop.place``, or a shed
marked here, as ``Cluster.route`` does), runs its own cluster loop (``loop.run``) to its next
routing point, then counts its good requests (``ClusterEnv._count_good``'s rule, kept
incrementally) and encodes its observation. An env whose loop stops for Python (a buffer to
grow, a local policy to ask, a time-series buffer to empty) is left at that stop, with its
code in ``Batch.g[e, STOP]``; Python serves it and calls again with that env resuming.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numba
import numpy as np
from numba.typed import List

from cbgym.cluster import loop
from cbgym.cluster.routing import LOAD_FIELDS, ROLE_CODES
from cbgym.cluster.state import (
    CL_AT_ROUTE,
    CL_DRAINED,
    DECODE_I,
    INTERVAL,
    NEXT,
    PREFILL_I,
    PROBE,
    REPORT_S,
    ROLE,
    ROUTED,
    ClusterState,
    probe_each,
)
from cbgym.engine import layout as L
from cbgym.engine.jit import kernel, no_alloc_kernel, parallel_kernel
from cbgym.engine.layout import Params, State

# per-instance features (rows of obs["instances"]), scaled as the single env scales them
INSTANCE_FEATURES = (
    ("unified", "flag"), ("prefill", "flag"), ("decode", "flag"),
    ("num_waiting", "count"), ("waiting_prefill_tokens", "count"), ("num_running", "count"),
    ("decode_batch", "count"), ("decode_context_tokens", "count"),
    ("running_prefill_tokens", "count"), ("kv_usage", "fraction"), ("free_blocks", "count"),
    ("transfers_in", "count"), ("transfers_out", "count"), ("incoming", "count"),
    ("kv_held_for_transfer", "count"), ("local_prefills", "count"),
    ("last_iteration_s", "time"))
# with prefix caching, three more per instance (after INSTANCE_FEATURES), what the
# cache-aware routers read: the tokens of the arriving request's prompt that instance's cache
# holds now (live, as RoutingPoint.cached_tokens, not as of the load report), their share of
# the prompt, and the requests routed there since the load report (their in-flight
# accounting: requests arriving at one instant all see one report)
PREFIX_FEATURES = (("cached_tokens", "count"), ("cached_fraction", "fraction"),
                   ("routed_since_report", "count"))
REQUEST_FEATURES = (("prompt_tokens", "count"), ("ttft_target_s", "time"),
                    ("tpot_target_s", "time"), ("report_age_s", "time"))

# the encoder's table: per instance feature, its kind and what it reads (a flag: the role
# code it tests; else its row in a load report, routing.LOAD_FIELDS)
FLAG, COUNT, TIME, FRACTION = L._codes(4)
_KIND_CODES = {"flag": FLAG, "count": COUNT, "time": TIME, "fraction": FRACTION}
FEATURE_KIND = np.array([_KIND_CODES[k] for _, k in INSTANCE_FEATURES], np.int64)
FEATURE_ARG = np.array([ROLE_CODES[f] if k == "flag" else LOAD_FIELDS.index(f)
                        for f, k in INSTANCE_FEATURES], np.int64)
NUM_FEATURES = np.int64(len(INSTANCE_FEATURES))
_COUNT_SPAN = 24.0  # as cbgym.env.observation's count_scale and time_scale
_TIME_SPAN = 32.0

# Batch.act: what an env does in a call (nothing; route its pending request, then run; run
# on: an episode's start, or after Python served a stop)
IDLE, ROUTE, RESUME = L._codes(3)
# Batch.g columns (int64): LO: requests below it have ended (their verdict is final);
# BELOW: of them, those that met the SLO; GOOD: the good count at the last step (the reward
# is its change); STOP: the code of a loop stop Python must serve (-1: none); HAS_TBT: the
# SLO sets a worst gap between tokens (tbt_targets is not None)
LO, BELOW, GOOD, STOP, HAS_TBT = L._codes(5)
NUM_G = 5
# how a request stands in the merged request table
OPEN, ENDED, MET = L._codes(3)


class Batch(NamedTuple):
    """The call's inputs and each env's counters, one row per env."""

    routes: np.ndarray  # (A, 3) int64: the route table: prefill (-1: none), decode (-1:
    # shed), chunk cap
    act: np.ndarray  # (E,) int64: IDLE, ROUTE or RESUME
    actions: np.ndarray  # (E,) int64: route indices (checked by Python)
    g: np.ndarray  # (E, NUM_G) int64
    tbt: np.ndarray  # (E, n) float64: each request's TBT target (inf: none)
    shed: np.ndarray  # (E, n) int8: requests the agent shed (Cluster.router_shed's)


class Out(NamedTuple):
    """What a step writes, one row per env; an env that drained keeps its last
    observation, as ``ClusterEnv`` returns it."""

    request: np.ndarray  # (E, 4) float32
    instances: np.ndarray  # (E, N, F) float32 (F: INSTANCE_FEATURES, then PREFIX_FEATURES
    # with prefix caching)
    reward: np.ndarray  # (E,) float64
    terminated: np.ndarray  # (E,) bool


# ------------------------------------------------------------------ the encoder
@no_alloc_kernel
def count_scaled(x: float) -> float:
    """observation.count_scale: ``log2(1 + x) / 24``, at most 1."""
    v = math.log2(1.0 + x) * (1.0 / _COUNT_SPAN)
    return 1.0 if v > 1.0 else v


@no_alloc_kernel
def time_scaled(t: float) -> float:
    """observation.time_scale: ``log2(1 + t / 1 ms) / 32`` (t clipped at 0), at most 1."""
    ms = (0.0 if t < 0.0 else t) * 1000.0  # (NaN stays NaN, as np.maximum keeps it)
    v = math.log2(1.0 + ms) * (1.0 / _TIME_SPAN)
    return 1.0 if v > 1.0 else v


@no_alloc_kernel
def encode_into(loads: np.ndarray, report_s: float, role: np.ndarray, prompt: int,
                ttft: float, tpot: float, now: float, cached: np.ndarray, routed: np.ndarray,
                req: np.ndarray, inst: np.ndarray) -> None:
    """The observation of a request arriving at ``now`` under the report ``loads`` (rows:
    LOAD_FIELDS) taken at ``report_s``: ``request`` into ``req``, ``instances`` into
    ``inst`` (float32, every instance feature clipped to [0, 1]); where ``inst`` has the
    PREFIX_FEATURES columns, they come from ``cached`` (per instance, the prompt's tokens its
    cache holds) and ``routed`` (requests routed there since the report)."""
    prefix = inst.shape[1] > NUM_FEATURES
    for i in range(len(role)):
        if prefix:
            inst[i, NUM_FEATURES] = np.float32(count_scaled(cached[i]))
            inst[i, NUM_FEATURES + 1] = np.float32(cached[i] / prompt if prompt > 0 else 0.0)
            inst[i, NUM_FEATURES + 2] = np.float32(count_scaled(routed[i]))
        for f in range(NUM_FEATURES):
            kind, arg = FEATURE_KIND[f], FEATURE_ARG[f]
            if kind == FLAG:
                x = 1.0 if role[i] == arg else 0.0
            elif kind == COUNT:
                x = count_scaled(loads[arg, i])
            elif kind == TIME:
                x = time_scaled(loads[arg, i])
            else:
                x = loads[arg, i]
            inst[i, f] = np.float32(0.0 if x < 0.0 else 1.0 if x > 1.0 else x)
    age = now - report_s
    req[0] = np.float32(count_scaled(prompt))
    req[1] = np.float32(time_scaled(ttft))
    req[2] = np.float32(time_scaled(tpot))
    req[3] = np.float32(time_scaled(age if age > 0.0 else 0.0))


@no_alloc_kernel
def observe(C: ClusterState, S: State, P: Params, req: np.ndarray, inst: np.ndarray) -> None:
    """The observation of the request waiting at the door (``Cluster.routing_point``'s loads:
    the last report, or live ones with ``load_report_interval_s=0``; with prefix caching,
    each instance's cache now, ``Cluster.cached_on_each``'s probe)."""
    rid = C.si[NEXT]
    now = C.arrival[rid]
    loads, report_s = C.loads, C.sf[REPORT_S]
    if C.cf[INTERVAL] == 0:
        loop.take_loads(C, S, P, C.live)
        loads, report_s = C.live, now
    if P.ci[0, L.PREFIX]:
        probe_each(S, rid, P.ci[0, L.BLOCK_SIZE], C.inst[PROBE])
    encode_into(loads, report_s, C.inst[ROLE], C.prompt[rid], C.ttft[rid], C.tpot[rid], now,
                C.inst[PROBE], C.inst[ROUTED], req, inst)


# ------------------------------------------------------------------ the goodput count
@no_alloc_kernel
def standing(C: ClusterState, S: State, rid: int, tbt: np.ndarray, has_tbt: int) -> int:
    """MET, ENDED or OPEN: request ``rid`` (placed or shed at the door) as
    ``results.merged_table`` and ``ClusterEnv._count_good`` judge it: its status from the
    instance that ends it (D once delivered there), done on P alone not yet finished; met:
    finished, TTFT and TPOT within targets, and the worst gap within ``tbt`` if set."""
    p, d = C.req[PREFILL_I, rid], C.req[DECODE_I, rid]
    first = p if p >= 0 else d
    if first < 0:
        return ENDED  # shed at the door
    on_d = d >= 0 and S.req[d, L.STATUS, rid] != L.PENDING
    last = d if on_d else first
    status = S.req[last, L.STATUS, rid]
    if status == L.SHED:
        return ENDED
    if status != L.FINISHED or (p >= 0 and not on_d):
        return OPEN
    first_token, finish = S.times[last, L.FIRST_TOKEN, rid], S.times[last, L.FINISH, rid]
    generated = S.req[last, L.GENERATED, rid]
    tpot = (finish - first_token) / max(generated - 1, 1) if generated > 1 else 0.0
    ok = first_token - C.arrival[rid] <= C.ttft[rid] and tpot <= C.tpot[rid]
    if has_tbt:
        ok = ok and S.times[last, L.ITL_MAX, rid] <= tbt[rid]
    return MET if ok else ENDED


@no_alloc_kernel
def count_good(C: ClusterState, S: State, g: np.ndarray, tbt: np.ndarray) -> int:
    """Requests that have ended meeting the SLO so far. An ended request's verdict never
    changes, so the prefix of ended requests is judged once (``g[LO]``, ``g[BELOW]``); the
    rest up to the door are judged again (requests not yet at the door have not ended)."""
    lo, door, has_tbt = g[LO], C.si[NEXT], g[HAS_TBT]
    while lo < door:
        k = standing(C, S, lo, tbt, has_tbt)
        if k == OPEN:
            break
        g[BELOW] += k == MET
        lo += 1
    g[LO] = lo
    good = g[BELOW]
    for rid in range(lo + 1, door):
        good += standing(C, S, rid, tbt, has_tbt) == MET
    return good


# ------------------------------------------------------------------ the step
@no_alloc_kernel
def step_env(C: ClusterState, S: State, P: Params, b: Batch, out: Out, e: int) -> None:
    """Env e: apply its route (``Cluster.route``), run its loop to the next routing point
    (``Cluster.next_routing_point``), score and observe; or stop for Python."""
    if b.act[e] == ROUTE:
        rid, a = C.si[NEXT], b.actions[e]
        decode = b.routes[a, 1]
        if decode < 0:
            b.shed[e, rid] = 1
        else:
            loop.place(C, S, rid, C.arrival[rid], b.routes[a, 0], decode, b.routes[a, 2])
        C.si[NEXT] = rid + 1
    code = loop.run(C, S, P)
    if code != CL_AT_ROUTE and code != CL_DRAINED:
        b.g[e, STOP] = code
        return
    good = count_good(C, S, b.g[e], b.tbt[e])
    out.reward[e] = np.float64(good - b.g[e, GOOD])
    b.g[e, GOOD] = good
    out.terminated[e] = code == CL_DRAINED
    if code == CL_AT_ROUTE:
        observe(C, S, P, out.request[e], out.instances[e])


@no_alloc_kernel
def first_bad(actions: np.ndarray, skip: np.ndarray, allowed: np.ndarray) -> int:
    """The first env whose action is not an allowed route index (an env in ``skip``, about
    to start an episode, ignores its own); -1 if none."""
    for e in range(len(actions)):
        a = actions[e]
        if not skip[e] and (a < 0 or a >= len(allowed) or not allowed[a]):
            return e
    return -1


@parallel_kernel
def step_batch(states: List, b: Batch, out: Out) -> int:
    """Step every env whose ``b.act`` is not IDLE, on numba's threads (each touches only its
    own cluster and rows); how many stopped for Python."""
    for e in numba.prange(len(b.act)):
        if b.act[e] != IDLE:
            run_env(states, np.int64(e), b, out)
    stops = 0
    for e in range(len(b.act)):
        stops += b.g[e, STOP] >= 0
    return stops


@kernel
def run_env(states: List, e: int, b: Batch, out: Out) -> None:
    C, S, P = states[e]
    step_env(C, S, P, b, out, e)


# ------------------------------------------------------------------ the clusters' list
@kernel
def new_states(C: ClusterState, S: State, P: Params, count: int) -> List:
    """A typed list of ``count`` clusters, each (C, S, P) (placeholders: env e's own comes
    with its first episode, :func:`put`)."""
    states = List()
    for _ in range(count):
        states.append((C, S, P))
    return states


@kernel
def put(states: List, e: int, C: ClusterState, S: State, P: Params) -> None:
    states[e] = (C, S, P)
