"""The edge, compiled: admission caps, queue TTLs, clients' timeouts and retries.

The cluster loop (:mod:`cbgym.cluster.loop`) calls these at an arrival (a cap may reject it:
429), after it places a request (its TTL and its client's timeout are timed as events of the
heap), on those events, and when a failed attempt's client retries (a ``RETRY`` event: a new
arrival in the slot ``rid + N_ORIG`` with the same work). Handled in the global time order:
when an event at ``t`` is handled every instance that may act has run the iterations that
start before ``t``, so "still waiting" and "no first token yet" are read as of ``t``. What
the server does to a request (expire it, abort it) happens at its instance's clock, the
next iteration boundary, as vLLM aborts between steps.
"""

from __future__ import annotations

import math

import numpy as np

from cbgym.cluster.events import outbox_event, push
from cbgym.cluster.state import (
    ABORT,
    ACTIVE,
    ATTEMPT,
    B_BASE,
    B_CAP,
    B_MULT,
    CAP_SCOPE,
    CLIENT_END,
    CLIENT_TIMEOUT,
    DECODE,
    DECODE_I,
    DROPPED,
    EXPIRE,
    INCOMING,
    JITTER,
    MAX_FLIGHT,
    MAX_RETRIES,
    MAX_WAIT,
    N_INST,
    N_ORIG,
    O_ABANDONED,
    O_EXPIRED,
    O_NONE,
    O_REJECTED,
    ON_FINISH,
    OUTCOME,
    P_DONE,
    P_SHED_N,
    PIPELINED,
    PREFILL,
    PREFILL_I,
    RETRY,
    RETRY_MASK,
    ROLE,
    ROUTED_N,
    TIMEOUT,  # (the event kind; the client's seconds are CLIENT_TIMEOUT)
    TTL,
    ClusterState,
    instance,
)
from cbgym.engine import handoff
from cbgym.engine import layout as L
from cbgym.engine.jit import no_alloc_kernel
from cbgym.engine.kutil import end, release, report
from cbgym.engine.layout import State
from cbgym.engine.transitions import shed


# ------------------------------------------------------------------ admission caps
@no_alloc_kernel
def over_cap(C: ClusterState, S: State, i: int) -> bool:
    """Whether one more request would pass a cap: the whole cluster's (``i`` -1, scope
    "cluster") or instance ``i``'s (scope "instance"); False in the other scope."""
    per_instance = C.ci[CAP_SCOPE] == 1
    if per_instance != (i >= 0) or (C.ci[MAX_WAIT] < 0 and C.ci[MAX_FLIGHT] < 0):
        return False
    waiting, flight = 0, 0
    if per_instance:
        s = instance(S, i)
        waiting = s.si[L.N_WAIT] + s.si[L.INBOX_N] - s.si[L.NEXT_ARRIVAL]
        flight = s.si[L.INBOX_N] - s.si[L.NUM_ENDED]
    else:
        ended = 0
        for j in range(C.ci[N_INST]):
            s = instance(S, j)
            if C.inst[ROLE, j] != DECODE:
                waiting += s.si[L.N_WAIT] + s.si[L.INBOX_N] - s.si[L.NEXT_ARRIVAL]
            if C.inst[ROLE, j] != PREFILL:
                ended += s.si[L.NUM_ENDED]
        # (a request ends on its last instance; one its prefill instance dropped, in bulk
        # mode, never reached a decode instance)
        flight = C.si[ROUTED_N] - ended - (0 if C.ci[PIPELINED] else C.si[P_SHED_N])
    return ((C.ci[MAX_WAIT] >= 0 and waiting >= C.ci[MAX_WAIT])
            or (C.ci[MAX_FLIGHT] >= 0 and flight >= C.ci[MAX_FLIGHT]))


# ------------------------------------------------------------------ clients
@no_alloc_kernel
def retry(C: ClusterState, rid: int, t: float) -> None:
    """``rid`` failed at ``t`` (its OUTCOME says how): its client sends it again after its
    backoff, unless its retries are spent or it does not retry this failure."""
    k = C.req[ATTEMPT, rid]
    if k >= C.ci[MAX_RETRIES] or not (C.ci[RETRY_MASK] >> (C.req[OUTCOME, rid] - 1)) & 1:
        return
    wait = min(C.cf[B_CAP], C.cf[B_BASE] * C.cf[B_MULT] ** k)
    wait *= 1.0 + C.cf[JITTER] * (2.0 * C.jitter[rid] - 1.0)
    push(C, t + wait, RETRY, rid + C.ci[N_ORIG], 0)


@no_alloc_kernel
def reject(C: ClusterState, rid: int, t: float) -> None:
    """Answer ``rid`` with 429 at ``t`` (a cap, or a router's or agent's shed)."""
    C.req[OUTCOME, rid] = O_REJECTED
    C.times[CLIENT_END, rid] = t
    retry(C, rid, t)


@no_alloc_kernel
def placed(C: ClusterState, rid: int, t: float) -> None:
    """``rid`` was placed at ``t``: time its queue TTL and its client's timeout."""
    C.si[ROUTED_N] += 1
    if C.cf[TTL] < np.inf:
        push(C, t + C.cf[TTL], EXPIRE, rid, 0)
    if C.cf[CLIENT_TIMEOUT] < np.inf:
        push(C, t + C.cf[CLIENT_TIMEOUT], TIMEOUT, rid, 0)


# ------------------------------------------------------------------ the server's side
@no_alloc_kernel
def holder(C: ClusterState, rid: int) -> int:
    """The instance serving ``rid`` now: its prefill instance until the prefill is done,
    then its decode (or only) instance."""
    p = C.req[PREFILL_I, rid]
    return p if p >= 0 and not C.req[P_DONE, rid] else C.req[DECODE_I, rid]


@no_alloc_kernel
def kill(C: ClusterState, S: State, i: int, rid: int, code: int) -> None:
    """End ``rid`` on instance ``i`` now (at i's clock) with reason ``code``; its other
    instance learns it through the event of i's outbox entry, pushed at once (only its own:
    entries the cluster left there after its own drops are never read)."""
    s = instance(S, i)
    status = s.req[L.STATUS, rid]
    before = s.si[L.OUTBOX_N]
    if status == L.PENDING:  # delivered, not yet taken into i's queue
        release(s, rid)
        end(s, rid, L.SHED, s.sf[L.NOW], code)
        if s.req[L.REMOTE, rid] != L.LOCAL or s.req[L.KEEP_KV, rid]:
            report(s, rid)
    elif status == L.WAITING or status == L.RUNNING:
        shed(s, rid, code)
    else:
        return
    s.si[L.PLAN_VALID] = 0
    s.si[L.IDLED] = 0
    C.inst[ACTIVE, i] = 1
    if s.si[L.OUTBOX_N] > before:  # (its entry, the last: handled now)
        outbox_event(C, s, i, rid)
        s.si[L.OUTBOX_N] = before


@no_alloc_kernel
def abort(C: ClusterState, S: State, rid: int, t: float) -> None:
    """The server stops ``rid``, whose client is gone."""
    i = holder(C, rid)
    if C.req[PREFILL_I, rid] == i and S.req[i, L.STATUS, rid] == L.FINISHED:
        # its prefill is computed, the event saying so not handled yet: D never gets it
        C.req[DROPPED, rid] = 1
        d = C.req[DECODE_I, rid]
        if C.ci[PIPELINED]:
            handoff.drop(instance(S, d), rid, t, L.R_ABORTED)
            C.inst[ACTIVE, d] = 1
        else:
            C.inst[INCOMING, d] -= 1
            C.si[P_SHED_N] += 1
        return
    kill(C, S, i, rid, L.R_ABORTED)


@no_alloc_kernel
def on_timeout(C: ClusterState, S: State, rid: int, t: float) -> None:
    """``rid``'s client times out at ``t`` unless what it waits for has arrived (or the
    server answered it with an error); abandoned, it is aborted (or left running) and
    retried."""
    if C.req[OUTCOME, rid] != O_NONE:
        return
    d0 = C.req[DECODE_I, rid]
    if C.req[PREFILL_I, rid] >= 0 and S.req[d0, L.STATUS, rid] == L.SHED:
        return  # D answered with an error already
    i = holder(C, rid)
    s = instance(S, i)
    status = s.req[L.STATUS, rid]
    last = i == C.req[DECODE_I, rid]  # (first token and finish happen there)
    if status == L.SHED:
        return  # the server answered (an error)
    if C.ci[ON_FINISH]:
        if last and status == L.FINISHED and s.times[L.FINISH, rid] <= t:
            return
    elif last and s.times[L.FIRST_TOKEN, rid] <= t:  # (NaN: none yet)
        return
    C.req[OUTCOME, rid] = O_ABANDONED
    C.times[CLIENT_END, rid] = t
    if C.ci[ABORT]:
        abort(C, S, rid, t)
    retry(C, rid, t)


@no_alloc_kernel
def on_expire(C: ClusterState, S: State, rid: int, t: float) -> None:
    """``rid``'s queue TTL runs out at ``t``: if it still waits for its first scheduling
    on the instance that computes its prompt, it expires (503) and its client may retry."""
    if C.req[OUTCOME, rid] == O_REJECTED or C.req[OUTCOME, rid] == O_EXPIRED:
        return
    p = C.req[PREFILL_I, rid]
    if p >= 0 and S.req[C.req[DECODE_I, rid], L.STATUS, rid] == L.SHED:
        return  # D answered with an error already
    i = p if p >= 0 else C.req[DECODE_I, rid]
    s = instance(S, i)
    status = s.req[L.STATUS, rid]
    if status != L.PENDING and not (
            status == L.WAITING and math.isnan(s.times[L.FIRST_SCHEDULED, rid])):
        return
    if C.req[OUTCOME, rid] == O_ABANDONED:  # (its client left it running: no one to answer)
        kill(C, S, i, rid, L.R_EXPIRED)
        return
    C.req[OUTCOME, rid] = O_EXPIRED
    C.times[CLIENT_END, rid] = t
    kill(C, S, i, rid, L.R_EXPIRED)
    retry(C, rid, t)


__all__ = ["on_expire", "on_timeout", "over_cap", "placed", "reject", "retry"]
