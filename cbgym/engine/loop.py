"""The engine's loop and its two entry points: :func:`advance` and :func:`decide`.

:func:`advance` runs iterations that have nothing to decide (nobody waits and memory lasts,
or the standing decision still holds) and stops at the next decision point, when the run
drained, or when the time-series buffer needs emptying. :func:`decide` applies a decision at
a decision point, runs that iteration and advances to the next point. A run whose policy is a
static key (``ci[KEYED]``: one number per request, lower admitted first) never stops: the
kernel ranks the queue itself wherever the policy would have been asked.
"""

from __future__ import annotations

import numpy as np

from cbgym.engine.execute import execute
from cbgym.engine.jit import no_alloc_kernel
from cbgym.engine.kutil import copy_ids, remove
from cbgym.engine.layout import (
    ALWAYS,
    ARRIVAL,
    AT_DECISION,
    AT_HORIZON,
    BLOG_N,
    CHANGED,
    CONSULT,
    DRAINED,
    EVERY_ITERATION,
    INBOX,
    INBOX_N,
    KEYED,
    MAX_SEQS,
    N_RUN,
    N_WAIT,
    NEED_ROOM,
    NEVER,
    NEXT_ARRIVAL,
    NOW,
    OUTBOX_N,
    PAPER,
    PLAN_VALID,
    PLOG_N,
    PREEMPTED_NOW,
    REC_N,
    RECORD,
    RUN_Q,
    SCRATCH,
    SHORTFALL,
    STAND_HAS,
    STAND_N,
    STAND_ORDER,
    STAND_VICTIMS,
    STRETCH,
    SWAP_BYTES,
    TURNS_DUE,
    TURNS_N,
    UNTIL,
    VICT_HAS,
    VICT_N,
    Params,
    State,
)
from cbgym.engine.step_study import schedule_study
from cbgym.engine.step_vllm import rank_by_key, running_plan, schedule
from cbgym.engine.stretch import decode_stretch
from cbgym.engine.transitions import admit_arrivals, preempt, shed


@no_alloc_kernel
def iterate(s: State, p: Params, evict: np.ndarray) -> int:
    """Schedule and run one iteration under the standing decision, after evicting
    ``evict`` (running ids preempted voluntarily, e.g. by SRPT)."""
    si = s.si
    si[SWAP_BYTES] = 0
    si[PREEMPTED_NOW] = 0
    for rid in evict:
        remove(s.ids[RUN_Q], si[N_RUN], rid)
        si[N_RUN] -= 1
        preempt(s, p, rid)
    m = schedule_study(s, p) if p.ci[PAPER] else schedule(s, p)
    si[PLAN_VALID] = 0
    return execute(s, p, m)


@no_alloc_kernel
def has_room(s: State, p: Params) -> bool:
    """Whether the output buffers hold one more iteration."""
    si = s.si
    if si[REC_N] >= len(s.rec):
        return False
    if p.ci[RECORD]:
        rows = p.ci[MAX_SEQS]  # an iteration schedules (and preempts) at most this many
        return si[BLOG_N] + rows <= len(s.blog) and si[PLOG_N] + rows <= len(s.plog)
    return True


@no_alloc_kernel
def advance(s: State, p: Params) -> int:
    """Run iterations with nothing to decide; stop at a decision point, drained or full,
    or (an instance of a cluster) at the horizon or with outbox events."""
    si, ci = s.si, p.ci
    none = s.ids[SCRATCH, :0]  # no evictions
    while True:
        if s.sf[NOW] >= s.sf[UNTIL] or si[OUTBOX_N] > 0:
            return AT_HORIZON  # a cluster's instance: its cluster moves first
        if si[TURNS_N]:
            return TURNS_DUE  # sessions' next turns are sent first (by the caller)
        admit_arrivals(s, p)
        if si[TURNS_N]:
            return TURNS_DUE  # a turn shed on arrival: its next one may be due now
        if si[N_RUN] == 0 and si[N_WAIT] == 0:
            if si[NEXT_ARRIVAL] >= si[INBOX_N]:
                si[SHORTFALL] = 0
                return DRAINED  # (an instance of a cluster: idle until a delivery)
            # (never past the horizon: a cluster may deliver something earlier meanwhile)
            s.sf[NOW] = max(s.sf[NOW], min(s.times[ARRIVAL, s.ids[INBOX, si[NEXT_ARRIVAL]]],
                                           s.sf[UNTIL]))
            continue
        if not has_room(s, p):
            return NEED_ROOM
        running_plan(s, p)
        consult = ci[CONSULT]
        asks = consult == ALWAYS or (
            si[N_WAIT] > 0 and (consult >= EVERY_ITERATION or si[CHANGED] != 0))
        if (si[SHORTFALL] > 0 or asks) and consult != NEVER:
            if not ci[KEYED]:
                return AT_DECISION  # the plan in s is this point's plan
            rank_by_key(s)
        if ci[STRETCH] and decode_stretch(s, p):
            continue
        code = iterate(s, p, none)
        if code != AT_DECISION:
            return code


@no_alloc_kernel
def decide(s: State, p: Params, order: np.ndarray, has_order: bool, shed_ids: np.ndarray,
           shed_code: int, victims: np.ndarray, has_victims: bool, evict: np.ndarray,
           then_advance: bool) -> int:
    """Apply a decision at a decision point, run that iteration, and (``then_advance``)
    advance to the next point in the same call.

    Args:
        order: waiting ids in the order to try admitting them (``has_order``; else the
            queue order). Waiting requests left out are held back.
        shed_ids: waiting ids to drop now, with reason ``shed_code``.
        victims: running ids in the order to preempt them when memory runs short
            (``has_victims``; else the most recently admitted first).
        evict: running ids to preempt before the iteration.

    The order and victims stand until the policy is asked again. The output buffers have
    room for this iteration: :func:`advance` checks :func:`has_room` before it stops at a
    decision point, so a decision point always has it.
    """
    si = s.si
    for rid in shed_ids:
        shed(s, rid, shed_code)
    n, k = len(order), len(victims)
    copy_ids(s.ids[STAND_ORDER], order, n)
    si[STAND_N], si[STAND_HAS] = n, has_order
    copy_ids(s.ids[STAND_VICTIMS], victims, k)
    si[VICT_N], si[VICT_HAS] = k, has_victims
    si[CHANGED] = 0
    code = iterate(s, p, evict)
    if code != AT_DECISION or not then_advance:
        return code
    return advance(s, p)
