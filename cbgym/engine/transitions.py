"""A request's moves between the queues: arrival, admission, preemption, shedding."""

from __future__ import annotations

import math

import numpy as np

from cbgym.engine.jit import no_alloc_kernel
from cbgym.engine.kutil import end, release, remove, report
from cbgym.engine.layout import (
    ARRIVAL,
    BLOCK_SIZE,
    BUDGET,
    CHANGED,
    CHUNKED,
    COMPUTED,
    FIRST_SCHEDULED,
    HOST_FREE,
    HOST_TOKENS,
    INBOX,
    INBOX_N,
    ITERATION,
    KEEP_KV,
    KV_BYTES,
    LOCAL,
    MAX_MODEL_LEN,
    N_RUN,
    N_WAIT,
    NEXT_ARRIVAL,
    NOW,
    NUM_BLOCKS,
    OUTPUT,
    PAPER,
    PENDING,
    PLAN_VALID,
    PLOG_N,
    PREEMPTED_NOW,
    PREEMPTIONS,
    PROMPT,
    R_PROMPT_BUDGET,
    R_PROMPT_KV,
    R_PROMPT_MML,
    R_RESERVATION,
    RECORD,
    REMOTE,
    RUN_Q,
    RUNNING,
    SHED,
    STATUS,
    SWAP,
    SWAP_BYTES,
    TOTAL_PREEMPT,
    WAIT_Q,
    WAITING,
    Params,
    State,
)


@no_alloc_kernel
def admit_arrivals(s: State, p: Params) -> None:
    """Move every request in the inbox that has arrived by now into the waiting queue, or
    shed it at once with the reason it can never be served by this engine."""
    # (closed-loop sessions' next turns were sent before: layout.TURNS_DUE)
    s.si[NEXT_ARRIVAL] = admit_due(s, p, s.si[NEXT_ARRIVAL], s.sf[NOW], p.ci[BLOCK_SIZE])


@no_alloc_kernel
def admit_due(s: State, p: Params, j: int, now: float, bs: int) -> int:
    """:func:`admit_arrivals`' pass over the inbox from position j; where it stopped."""
    si, ci = s.si, p.ci
    arrival, prompt, output = s.times[ARRIVAL], s.req[PROMPT], s.req[OUTPUT]
    inbox, remote = s.ids[INBOX], s.req[REMOTE]
    while j < si[INBOX_N] and arrival[inbox[j]] <= now:
        rid = inbox[j]
        code = np.int64(0)
        if ci[PAPER]:  # the study reserves KV for prompt + true output at admission
            if -(-(prompt[rid] + output[rid]) // bs) > ci[NUM_BLOCKS]:
                code = R_RESERVATION
        elif ci[MAX_MODEL_LEN] >= 0 and prompt[rid] >= ci[MAX_MODEL_LEN]:
            code = R_PROMPT_MML
        elif -(-prompt[rid] // bs) > ci[NUM_BLOCKS]:
            code = R_PROMPT_KV
        elif not ci[CHUNKED] and prompt[rid] > ci[BUDGET] and remote[rid] == LOCAL:
            code = R_PROMPT_BUDGET  # without chunking it could never be scheduled
        if s.req[STATUS, rid] != PENDING:
            j += 1  # (dropped by its cluster before it arrived here)
            continue
        if code:
            end(s, rid, SHED, arrival[rid], code)
            if remote[rid] != LOCAL or s.req[KEEP_KV, rid]:
                report(s, rid)  # its other instance has to know
        else:
            s.req[STATUS, rid] = WAITING
            s.ids[WAIT_Q, si[N_WAIT]] = rid
            si[N_WAIT] += 1
            si[CHANGED] = 1
        j += 1
    return j


@no_alloc_kernel
def start(s: State, p: Params, rid: int, computed: int) -> None:
    """Admit ``rid`` into the running batch with ``computed`` tokens of KV (swapped in, or
    received from a prefill instance)."""
    si = s.si
    if s.req[REMOTE, rid] != LOCAL:
        s.req[REMOTE, rid] = LOCAL  # its KV is local from now on (a preemption recomputes)
    elif s.req[HOST_TOKENS, rid]:  # swap-in: the KV crosses the host link back (a prefix
        # cache hit also starts with tokens computed, on blocks already here: no transfer)
        si[SWAP_BYTES] += computed * p.ci[KV_BYTES]
        si[HOST_FREE] += computed
        s.req[HOST_TOKENS, rid] = 0
    s.req[COMPUTED, rid] = computed
    s.req[STATUS, rid] = RUNNING
    if math.isnan(s.times[FIRST_SCHEDULED, rid]):
        s.times[FIRST_SCHEDULED, rid] = s.sf[NOW]
    s.ids[RUN_Q, si[N_RUN]] = rid
    si[N_RUN] += 1


@no_alloc_kernel
def preempt(s: State, p: Params, rid: int) -> None:
    """Evict ``rid`` (already out of the running queue): swap its KV to host if asked and
    there is room, else drop it for recomputation; re-queue it at the head, as vLLM does."""
    si, req = s.si, s.req
    computed = req[COMPUTED, rid]
    if p.ci[SWAP] and 0 < computed <= si[HOST_FREE]:
        req[HOST_TOKENS, rid] = computed
        si[HOST_FREE] -= computed
        si[SWAP_BYTES] += computed * p.ci[KV_BYTES]
    req[COMPUTED, rid] = 0
    release(s, rid)
    si[PLAN_VALID] = 0
    req[STATUS, rid] = WAITING
    req[PREEMPTIONS, rid] += 1
    si[TOTAL_PREEMPT] += 1
    si[PREEMPTED_NOW] += 1
    waiting = s.ids[WAIT_Q]
    for i in range(si[N_WAIT], 0, -1):
        waiting[i] = waiting[i - 1]
    waiting[0] = rid
    si[N_WAIT] += 1
    si[CHANGED] = 1
    if p.ci[RECORD]:
        s.plog[si[PLOG_N], 0] = si[ITERATION]
        s.plog[si[PLOG_N], 1] = rid
        si[PLOG_N] += 1


@no_alloc_kernel
def shed(s: State, rid: int, code: int) -> None:
    """Drop a waiting or running request now: it ends with status SHED and reason ``code``."""
    si, req = s.si, s.req
    if req[STATUS, rid] == RUNNING:
        remove(s.ids[RUN_Q], si[N_RUN], rid)
        si[N_RUN] -= 1
        si[PLAN_VALID] = 0
    elif req[STATUS, rid] == WAITING:
        remove(s.ids[WAIT_Q], si[N_WAIT], rid)
        si[N_WAIT] -= 1
    if req[HOST_TOKENS, rid]:
        si[HOST_FREE] += req[HOST_TOKENS, rid]
        req[HOST_TOKENS, rid] = 0
    release(s, rid)
    end(s, rid, SHED, s.sf[NOW], code)
    si[CHANGED] = 1
    if req[REMOTE, rid] != LOCAL or req[KEEP_KV, rid]:
        report(s, rid)  # its other instance (P holding its KV, D waiting for it) has to know
