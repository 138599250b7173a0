"""The cluster loop, compiled: instances of the one engine advanced in global time order.

:func:`run` is :class:`~cbgym.cluster.Cluster`'s engine room, as :func:`cbgym.engine.loop
.advance` is an engine's: it routes each arrival (with a compiled rule,
:mod:`cbgym.cluster.route_ops`, or by stopping at the door for a Python router), delivers
requests, advances each instance through the engine's own kernel up to the horizon the time
order allows, turns instances' outboxes into events, carries KV over the link
(:mod:`cbgym.cluster.kv`, :mod:`cbgym.cluster.link_ops`) and takes load reports. It returns
when the door needs Python (a routing point, an instance's local policy to ask, a buffer to
empty or grow, a stuck run) or when the cluster drained; the next call resumes where it
stopped. The time-order rule is :mod:`cbgym.cluster.order`'s docstring.
"""

from __future__ import annotations

import numpy as np

from cbgym.cluster import edge_ops, kv, link_ops, order
from cbgym.cluster import route_ops as ro
from cbgym.cluster.events import pop, read_outbox
from cbgym.cluster.state import (
    ACTIVE,
    ADVANCES,
    ALLOC,
    BAD,
    CAP,
    CHUNK,
    CHUNKED,
    CL_AT_DECISION,
    CL_AT_ROUTE,
    CL_BAD_ROUTE,
    CL_DRAINED,
    CL_GROW,
    CL_NEED_ROOM,
    CL_STUCK,
    COUNT,
    D_SHED,
    DECODE,
    DECODE_I,
    DEFLECTED,
    DONE,
    EAGER,
    EDGE,
    EXPIRE,
    H_COMPUTED,
    H_KIND,
    H_RID,
    HAVE_REPORT,
    HEAP_MARGIN,
    HEAP_N,
    INCOMING,
    INTERVAL,
    KV_OUT,
    LAST_TID,
    LN,
    N_INST,
    N_ORIG,
    NEXT,
    P_SHED,
    PIPELINED,
    PREFILL_I,
    PROBE,
    READS_LOADS,
    REPORT_S,
    REPORTS,
    RETRY,
    ROLE,
    ROUTE_RID,
    ROUTED,
    ROUTER,
    SENT_S,
    STOPPED,
    ClusterState,
    instance,
    params_at,
    probe_each,
)
from cbgym.engine import handoff
from cbgym.engine import layout as L
from cbgym.engine.jit import no_alloc_kernel
from cbgym.engine.layout import Params, State
from cbgym.engine.loop import advance


# ------------------------------------------------------------------ what routers see
@no_alloc_kernel
def take_loads(C: ClusterState, S: State, P: Params, out: np.ndarray) -> None:
    """Every instance's load signals now into ``out`` (rows: routing.LOAD_FIELDS)."""
    lk = C.link
    for i in range(C.ci[N_INST]):
        for r in range(out.shape[0]):
            out[r, i] = 0.0
    for j in range(lk.si[LN]):
        out[ro.T_OUT, lk.i[1, j]] += 1.0
        out[ro.T_IN, lk.i[2, j]] += 1.0
    for i in range(C.ci[N_INST]):
        s = instance(S, i)
        prompt, computed, tokens = s.req[L.PROMPT], s.req[L.COMPUTED], s.req[L.TOKENS]
        host, remote = s.req[L.HOST_TOKENS], s.req[L.REMOTE]
        deflected = C.req[DEFLECTED]
        decode = C.inst[ROLE, i] == DECODE
        out[ro.INCOMING_N, i] = C.inst[INCOMING, i]
        out[ro.HELD_OUT, i] = C.inst[KV_OUT, i]
        nw, nr = s.si[L.N_WAIT], s.si[L.N_RUN]
        w_tok, local = 0, 0
        for k in range(nw):
            rid = s.ids[L.WAIT_Q, k]
            if remote[rid] == L.LOCAL:
                w_tok += tokens[rid] - host[rid]
                local += deflected[rid]
        batch, ctx, r_tok = 0, 0, 0
        for k in range(nr):
            rid = s.ids[L.RUN_Q, k]
            left = max(prompt[rid] - computed[rid], 0)
            if left == 0:
                batch += 1
                ctx += computed[rid]
            else:
                r_tok += left
                local += deflected[rid]
        out[ro.W_N, i], out[ro.W_TOK, i], out[ro.R_N, i] = nw, w_tok, nr
        out[ro.D_BATCH, i], out[ro.D_CTX, i], out[ro.R_TOK, i] = batch, ctx, r_tok
        out[ro.FREE_B, i] = s.si[L.FREE]
        out[ro.KV_USE, i] = 1.0 - s.si[L.FREE] / P.ci[i, L.NUM_BLOCKS]
        out[ro.LOCAL_P, i] = local if decode else 0
        out[ro.LAST_DT, i] = s.sf[L.LAST_DT]


@no_alloc_kernel
def report_due(C: ClusterState, t_arr: float) -> float:
    """When the next load report a router will read is taken: the last report at or before
    the next arrival, unless taken already (reports no arrival reads are skipped: nothing
    could tell). inf when routers read live load or none."""
    interval = C.cf[INTERVAL]
    if interval == 0 or not C.ci[READS_LOADS] or t_arr == np.inf:
        return np.inf
    r = min(np.floor(t_arr / interval) * interval, t_arr)  # (rounding)
    return r if not C.si[HAVE_REPORT] or r > C.sf[REPORT_S] else np.inf


# ------------------------------------------------------------------ placing a request
@no_alloc_kernel
def place(C: ClusterState, S: State, rid: int, t: float, prefill: int, decode: int,
          cap: int) -> None:
    """Place ``rid`` arriving at ``t``: on ``decode`` alone (prefill -1: a unified instance,
    or a deflected prefill on a decode one, at most ``cap`` prompt tokens an iteration), or
    prefilled on ``prefill`` with its KV sent to ``decode``. The route was checked."""
    C.req[DECODE_I, rid] = decode
    out = C.output[rid]
    if C.cf[INTERVAL] > 0:
        C.inst[ROUTED, decode] += 1
        if prefill >= 0:
            C.inst[ROUTED, prefill] += 1
    if prefill < 0:
        C.req[DEFLECTED, rid] = C.inst[ROLE, decode] == DECODE
        C.req[CAP, rid] = cap
        kv.give(C, S, decode, rid, t, out, L.NO_KEEP, L.LOCAL, cap, L.ARRIVAL_RANK)
        return
    C.req[PREFILL_I, rid] = prefill
    keep = L.PIPELINED if C.ci[PIPELINED] else L.BULK
    kv.give(C, S, prefill, rid, t, np.int64(1), keep, L.LOCAL, cap, L.ARRIVAL_RANK)
    if C.ci[PIPELINED]:  # D takes it at once, to hold blocks for each chunk
        kv.give(C, S, decode, rid, t, out, L.NO_KEEP, L.REMOTE_NEW, L.NO_CAP, L.ARRIVAL_RANK)
    else:
        C.inst[INCOMING, decode] += 1


@no_alloc_kernel
def route_here(C: ClusterState, S: State, P: Params, rid: int, t: float) -> bool:
    """Route ``rid`` with the cluster's compiled rule; False if the route is unusable
    (``si[BAD]`` names the instance)."""
    loads = C.loads
    if C.cf[INTERVAL] == 0 and C.ci[READS_LOADS]:
        take_loads(C, S, P, C.live)
        loads = C.live
    C.si[COUNT] += 1
    out = C.route
    if P.ci[0, L.PREFIX]:  # each instance's cache, now (zeros stay without caching)
        probe_each(S, rid, P.ci[0, L.BLOCK_SIZE], C.inst[PROBE])
    ok = ro.route_rule(C.ci[ROUTER], C.cf, C.inst, P.cost, loads, C.prompt[rid],
                       C.inst[PROBE], C.ttft[rid], C.tpot[rid], C.si[COUNT], out)
    target = out[1] if out[0] < 0 else out[0]
    if not ok or (out[2] > 0 and not C.inst[CHUNKED, target]):
        C.si[BAD] = target
        return False
    commit(C, S, rid, t, out[0], out[1], out[2])
    return True


@no_alloc_kernel
def commit(C: ClusterState, S: State, rid: int, t: float, prefill: int, decode: int,
           cap: int) -> None:
    """Apply a checked route to the pending request ``rid`` (:func:`place`), unless the
    routed instance is over its admission cap (429); the next arrival is next."""
    if C.ci[EDGE] and edge_ops.over_cap(C, S, prefill if prefill >= 0 else decode):
        edge_ops.reject(C, rid, t)
    else:
        place(C, S, rid, t, prefill, decode, cap)
        if C.ci[EDGE]:
            edge_ops.placed(C, rid, t)
    moved_on(C, rid)


@no_alloc_kernel
def door_shed(C: ClusterState, rid: int, t: float) -> None:
    """The router (or the env's agent) sheds the pending request ``rid``: a 429."""
    edge_ops.reject(C, rid, t)
    moved_on(C, rid)


@no_alloc_kernel
def moved_on(C: ClusterState, rid: int) -> None:
    if rid < C.ci[N_ORIG]:  # (a retry is not one of the trace's arrivals)
        C.si[NEXT] = rid + 1


# ------------------------------------------------------------------ events
@no_alloc_kernel
def handle(C: ClusterState, S: State, P: Params, t: float, t_link: float,
           t_heap: float) -> None:
    """Handle an event at time ``t``: landings, then deliveries and transfer starts, then a
    load report (arrivals and retries, after them, are routed by the caller: a retry at
    the top of the heap is passed as ``t_heap`` inf)."""
    if t_link == t:
        for k in range(link_ops.advance(C.link, t)):
            kv.landed(C, S, C.link.out[k], t)
    elif t_heap == t:
        kind, rid, computed = C.heap[H_KIND, 0], C.heap[H_RID, 0], C.heap[H_COMPUTED, 0]
        pop(C)
        if kind == CHUNK or kind == DONE:
            kv.prefill_progress(C, S, rid, t, computed, kind == DONE)
        elif kind == P_SHED:
            kv.prefill_shed(C, S, rid, t)
        elif kind == ALLOC:
            kv.allocated_on_decode(C, S, rid, t)
        elif kind == D_SHED:
            kv.decode_shed(C, S, rid)
        elif kind == EXPIRE:
            edge_ops.on_expire(C, S, rid, t)
        else:
            edge_ops.on_timeout(C, S, rid, t)
    else:
        take_loads(C, S, P, C.loads)
        C.inst[ROUTED] = 0
        C.sf[REPORT_S] = t
        C.si[HAVE_REPORT] = 1
        C.si[REPORTS] += 1


@no_alloc_kernel
def earliest_active(C: ClusterState, S: State) -> int:
    best, t = -1, np.inf
    for i in range(C.ci[N_INST]):
        if C.inst[ACTIVE, i] and S.sf[i, L.NOW] < t:
            best, t = i, S.sf[i, L.NOW]
    return best


@no_alloc_kernel
def room(C: ClusterState) -> bool:
    """The link and the transfer ids have room for what one pass may add (one transfer
    start at most), the heap for the edge's events of one pass (timers, a retry, an
    aborted request's outbox; an instance's own outbox is checked before it is read,
    :func:`finish_advance`)."""
    return (C.link.si[LN] + 2 <= C.link.i.shape[1]
            and C.si[LAST_TID] + 2 < len(C.tid_rid)
            and (not C.ci[EDGE] or C.si[HEAP_N] + HEAP_MARGIN <= len(C.heap_t)))


@no_alloc_kernel
def finish_advance(C: ClusterState, S: State, i: int, code: int) -> int:
    """After instance i's kernel returned ``code``: a code for the door if Python must act
    (the call resumes i), else -1 with i's outbox read."""
    if code == L.AT_DECISION or code == L.NEED_ROOM or code == L.TOO_MANY_IDLE_TICKS:
        C.si[STOPPED] = i
        return (CL_AT_DECISION if code == L.AT_DECISION else
                CL_NEED_ROOM if code == L.NEED_ROOM else CL_STUCK)
    if C.si[HEAP_N] + S.si[i, L.OUTBOX_N] > len(C.heap_t):
        C.si[STOPPED] = i  # (resumed, the instance returns at once with its outbox)
        return CL_GROW
    read_outbox(C, instance(S, i), i)
    if code == L.DRAINED:
        C.inst[ACTIVE, i] = 0
    return -1


@no_alloc_kernel
def step(C: ClusterState, S: State, P: Params, i: int) -> int:
    """Advance instance i to its horizon (:func:`finish_advance`'s code)."""
    C.si[ADVANCES] += 1
    return finish_advance(C, S, i, advance(instance(S, i), params_at(P, i)))


@no_alloc_kernel
def route_next(C: ClusterState, S: State, P: Params, rid: int, t: float) -> int:
    """Route ``rid`` arriving at ``t`` (an arrival of the trace, or a client's retry):
    ``CL_AT_ROUTE`` for a Python router at the door (``si[ROUTE_RID]`` names it),
    ``CL_BAD_ROUTE`` if the compiled rule's route cannot be applied, else -1 (placed, or
    rejected by the cluster's admission cap before any router sees it)."""
    C.si[ROUTE_RID] = rid
    if C.ci[EDGE]:
        C.times[SENT_S, rid] = t
        if edge_ops.over_cap(C, S, np.int64(-1)):
            door_shed(C, rid, t)
            return -1
    if C.ci[ROUTER] == ro.DOOR:
        return CL_AT_ROUTE
    if not route_here(C, S, P, rid, t):
        return CL_BAD_ROUTE
    return -1


@no_alloc_kernel
def run(C: ClusterState, S: State, P: Params) -> int:
    """Advance the cluster until the door needs Python or it drained (module docstring).
    ``CL_AT_ROUTE``: request ``si[ROUTE_RID]`` (the arrival ``si[NEXT]``, or a client's
    retry) waits for a route (Python applies it with :func:`commit` or :func:`door_shed`);
    ``CL_AT_DECISION`` / ``CL_NEED_ROOM`` / ``CL_STUCK``: instance
    ``si[STOPPED]``'s kernel returned that (ask its policy / empty its buffer / raise);
    ``CL_GROW``: a buffer of the cluster must grow; ``CL_BAD_ROUTE``: the compiled rule's
    route cannot be applied (instance ``si[BAD]``)."""
    i = C.si[STOPPED]
    if i >= 0:  # resume the instance the last call stopped in (its horizon stands)
        C.si[STOPPED] = -1
        code = step(C, S, P, i)
        if code >= 0:
            return code
    n = len(C.arrival)
    while True:
        if not room(C):
            return CL_GROW
        nxt = C.si[NEXT]
        t_arr = C.arrival[nxt] if nxt < n else np.inf
        t_rep = report_due(C, t_arr)
        if C.ci[EAGER] and nxt < n and t_rep == np.inf:
            # the report it reads is taken (or it reads none): route it now, ahead of its
            # time; its delivery waits in an inbox and bounds nobody else
            code = route_next(C, S, P, nxt, t_arr)
            if code >= 0:
                return code
            continue
        if C.ci[EAGER]:
            t_arr = np.inf
        t_heap = C.heap_t[0] if C.si[HEAP_N] > 0 else np.inf
        # a client's retry is an arrival: after the other events of its instant (the
        # last kind), it reads the last load report before it
        t_retry = t_heap if C.si[HEAP_N] > 0 and C.heap[H_KIND, 0] == RETRY else np.inf
        if C.ci[EDGE] and C.si[HEAP_N] > 0:
            t_rep = report_due(C, min(t_arr, t_heap))
        t_link = link_ops.next_event_time(C.link)
        t_ext = min(min(t_arr, t_heap), min(t_link, t_rep))
        i = earliest_active(C, S)
        if i < 0 and t_ext == np.inf:
            return CL_DRAINED
        if i < 0 or t_ext <= S.sf[i, L.NOW]:
            if t_arr == t_ext and t_ext != t_heap and t_ext != t_link and t_ext != t_rep:
                code = route_next(C, S, P, nxt, t_arr)
                if code >= 0:
                    return code
                continue
            if t_retry == t_ext and t_ext != t_link and t_ext != t_rep:
                rid = C.heap[H_RID, 0]
                pop(C)
                code = route_next(C, S, P, rid, t_retry)
                if code >= 0:
                    return code
                continue
            handle(C, S, P, t_ext, t_link, np.inf if t_retry == t_heap else t_heap)
            continue
        until = order.horizon(C, S, i, t_ext)
        handoff.set_horizon(instance(S, i), until)
        code = step(C, S, P, i)
        if code >= 0:
            return code
