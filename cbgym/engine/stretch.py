"""Decode stretches: many iterations of an unchanged decode batch in one pass.

While every running request decodes one token, nobody can be admitted and nobody has to be
preempted, an iteration has nothing to decide and differs from the previous one only in its
clock and context lengths. :func:`decode_stretch` runs such iterations with per-step work
independent of the batch size (the clock is still summed one iteration at a time, so times
are bit for bit those of iterating), then updates each running request once. It stops before
the step at which the next request arrives (unless the policy's answer is known in the kernel
and the queue's head stays blocked: arrivals then queue up), memory would run short, or after
the step at which the first running request finishes; on a cluster's instance also at its
horizon (the cluster's next event) and after an arrival shed there (its cluster hears of it
first). On a decode instance of a cluster, an
iteration that admits only requests whose prompt a prefill instance computed (blocks for an
arriving transfer, the 1-token step of landed KV) is the stretch's last step instead
(:mod:`cbgym.engine.stretch_admit`). ``tests/test_engine_fixes.py`` and
``tests/test_cluster_stretches.py`` check it against plain iteration (``ci[STRETCH] = 0``).
"""

from __future__ import annotations

import numpy as np

from cbgym.engine import gaps, itl
from cbgym.engine.execute import add_gap, at_end, finished, record
from cbgym.engine.jit import no_alloc_kernel
from cbgym.engine.layout import (
    ARRIVAL,
    BLOCK_SIZE,
    BUDGET,
    CHANGED,
    COMPUTED,
    CONSULT,
    COST_KIND,
    EVERY_ITERATION,
    FIRST_TOKEN,
    FREE,
    GAP,
    GAP_MIN,
    GAP_TOP,
    GENERATED,
    HELD,
    IDLE_TICKS,
    INBOX,
    INBOX_N,
    ITERATION,
    ITL,
    KEYED,
    LAST_DT,
    LAST_TOKEN,
    MAX_MODEL_LEN,
    N_RUN,
    N_WAIT,
    NEVER,
    NEXT_ARRIVAL,
    NO,
    NOW,
    ON_COMPLETION,
    OUTBOX_N,
    P99_ON,
    PAPER,
    PLAN_CTX,
    PLAN_DECODING,
    PLAN_LEFT,
    PLAN_TOTAL,
    PLAN_VALID,
    PREEMPTED_NOW,
    PREFIX,
    REC_N,
    RECORD,
    RUN_Q,
    SHORTFALL,
    SWAP_BYTES,
    TOKENS,
    TURNS_N,
    UNTIL,
    Params,
    State,
)
from cbgym.engine.pricing import price
from cbgym.engine.step_vllm import rank_by_key
from cbgym.engine.stretch_admit import admit_last_step, head_blocked, last_step_admits
from cbgym.engine.transitions import admit_arrivals


@no_alloc_kernel
def end_segment(s: State, p: Params, free: int, t: float, begin: float, steps: int,
                dt: float) -> None:
    """Bring the state's clock and free blocks up to ``t`` and write the time-series row of
    the ``steps`` decode iterations since ``begin`` (the last one lasting ``dt``)."""
    s.si[FREE] = free
    s.sf[NOW] = t
    if steps:
        n = s.si[N_RUN]
        record(s, p, begin, dt if steps == 1 else t - begin, n, np.int64(0), n, steps)


@no_alloc_kernel
def decode_stretch(s: State, p: Params) -> bool:
    """Run a stretch of decode-only iterations if one starts now (the running plan is
    current and nothing needs deciding; at least two, unless the first admits remote
    requests); False, doing nothing, otherwise. Never with named blocks (prefix caching: the
    engine turns stretches off)."""
    si, ci, sf = s.si, p.ci, s.sf
    n = si[N_RUN]
    if ci[RECORD] or not si[PLAN_DECODING] or n > ci[BUDGET] or si[SHORTFALL] > 0:
        return False
    if ci[PREFIX]:
        return False  # (named blocks: the engine turns stretches off; never run one here)
    if si[OUTBOX_N] > 0:
        return False  # an arrival shed just now: its cluster acts after this iteration
    # a decode instance's arrivals admitted at the first step, which is then the last
    # (stretch_admit's docstring)
    takes = joins = np.int64(0)
    if si[N_WAIT] > 0 and (ci[CONSULT] >= EVERY_ITERATION
                           or not head_blocked(s, p, si[PLAN_TOTAL])):
        if ci[CONSULT] >= EVERY_ITERATION:
            return False
        takes, joins = last_step_admits(s, p, si[PLAN_TOTAL])
        if takes == 0 and joins == 0:
            return False
    running = s.ids[RUN_Q]
    computed, generated, tokens = s.req[COMPUTED], s.req[GENERATED], s.req[TOKENS]
    bs = ci[BLOCK_SIZE]
    # steps until the first completion (or max_model_len), and the batch's context
    k, ctx = si[PLAN_LEFT], si[PLAN_CTX]
    if k < 1 or (k < 2 and takes == 0 and joins == 0):
        return False
    slack = s.slots  # requests by free slots left in their last block (vLLM mode)
    if not ci[PAPER]:
        for r in range(bs):
            slack[r] = 0
        for i in range(n):
            slack[(-computed[running[i]]) % bs] += 1
    # a request whose last block has r free slots needs a new block at steps r+1, r+1+bs, ...
    arrival, inbox, nxt = s.times[ARRIVAL], s.ids[INBOX], si[NEXT_ARRIVAL]
    keyed = ci[KEYED] != 0 and ci[CONSULT] < EVERY_ITERATION
    if si[REC_N] >= len(s.rec):
        return False  # the time-series buffer is full: the loop empties it first
    t, free, steps = sf[NOW], si[FREE], np.int64(0)
    begin = t
    si[SWAP_BYTES] = 0
    si[PREEMPTED_NOW] = 0
    # The iterations between two arrivals have equal gauges: one time-series row (a
    # segment) each, written when the segment ends rather than once per iteration.
    seg_begin, seg_steps = t, np.int64(0)
    dt, first_end, before = 0.0, t, t
    joined = np.int64(0)  # requests that joined the batch at the last step
    # the gaps of the steps after the first (the same for every running request; each one's
    # first gap depends on its last token): the largest ones, for the requests' p99s
    buf, top, sn = s.gaps, si[GAP_TOP], np.int64(0)
    pooled, same = si[P99_ON], np.int64(0)  # (the run's histogram: cbgym.engine.itl)
    until = sf[UNTIL]
    next_at = arrival[inbox[nxt]] if nxt < si[INBOX_N] else np.inf
    while steps < k:
        need = 0 if ci[PAPER] else slack[steps % bs]
        if t >= until:
            break  # a cluster's event comes first
        if t >= next_at:
            # Arrivals join the queue here, as at the next iteration's start. The stretch
            # goes on when the policy's answer is known in the kernel (FCFS, or a static key)
            # and the queue's head still cannot be admitted.
            if ci[CONSULT] != NEVER and not keyed:
                break  # the policy is asked about the arrival
            end_segment(s, p, free, t, seg_begin, seg_steps, dt)
            seg_begin, seg_steps = t, np.int64(0)
            if si[REC_N] >= len(s.rec):
                break  # the time-series buffer is full: the loop empties it first
            admit_arrivals(s, p)
            if si[TURNS_N]:
                break  # a turn shed on arrival: its session's next one is sent first
            if si[OUTBOX_N] > 0:
                break  # an arrival shed (its KV held by a prefill instance): its cluster first
            nxt = si[NEXT_ARRIVAL]
            next_at = arrival[inbox[nxt]] if nxt < si[INBOX_N] else np.inf
            if keyed and si[CHANGED]:
                rank_by_key(s)
            takes = joins = np.int64(0)
            if not head_blocked(s, p, need):
                takes, joins = last_step_admits(s, p, need)
                if takes == 0 and joins == 0:
                    break  # the next iteration admits
        if need > free:
            break  # memory runs short: the next iteration preempts
        jc = np.int64(0)  # the joining requests' context (their prompts but the last token)
        if takes or joins:  # after the running batch's new blocks, as an iteration does
            si[FREE] = free - need
            admit_last_step(s, p, takes, joins)
            free = si[FREE] + need
            joined = joins
            for j in range(joins):
                jc += computed[running[n + j]]
        # (with no joins: n decodes; each joining request adds a prompt token)
        dt = price(ci[COST_KIND], p.cost, n + joins, joins, n, n + joins,
                   ctx + n * steps + jc, n + joins, ctx + n * (steps + 1) + jc + joins,
                   np.int64(0))
        before = t
        t += dt
        free -= need
        if steps == 0:
            first_end = t
        if steps > 0:  # (the gap as plain iteration measures it)
            sn = gaps.push(buf, 0, sn, top, t - before)
            if pooled:
                itl.add(s.sf, ITL, t - before, n)
        steps += 1
        seg_steps += 1
        if takes or joins:
            break  # the batch changes, or its cluster starts the transfers first
    if joined:  # that step's own row (after admission, before anyone finishes)
        end_segment(s, p, free, t, seg_begin, np.int64(0), dt)
        record(s, p, before, dt, n + joined, joined, n, np.int64(1))
    else:
        end_segment(s, p, free, t, seg_begin, seg_steps, dt)
    si[ITERATION] += steps
    if steps == 0:
        return False
    held = s.req[HELD]
    last = steps == k  # somebody finishes (or reaches max_model_len) at the last step
    m = 0  # the running queue, compacted in place as requests finish
    last_token, gap_min, packed = s.times[LAST_TOKEN], s.times[GAP_MIN], s.req[GAP]
    req, mml = s.req, ci[MAX_MODEL_LEN]
    # (first_end: the first step's end, as the loop summed it; a request whose last token
    # came before the stretch began, after an idle tick, has a longer first gap)
    gaps.sort_desc(buf, 0, sn)
    top_gap = buf[0] if sn > 0 else -np.inf
    for i in range(n):
        rid = running[i]
        computed[rid] += steps
        generated[rid] += steps
        tokens[rid] += steps
        # its gaps: from its last token to the first step's end, then each step's (largest
        # first, while they can enter its run; usually none can: one cache line)
        first = first_end - last_token[rid]
        if pooled:
            if last_token[rid] == begin:
                same += 1
            else:
                itl.add(s.sf, ITL, first, 1)
        if max(first, top_gap) > gap_min[rid]:
            if first > gap_min[rid]:
                add_gap(s.gaps, packed, gap_min, rid, first)
            for j in range(sn):
                if buf[j] <= gap_min[rid]:
                    break
                add_gap(s.gaps, packed, gap_min, rid, buf[j])
        last_token[rid] = t
        if not ci[PAPER]:  # a decoding request holds exactly the blocks its tokens need
            held[rid] = -(-computed[rid] // bs)
        if last and at_end(req, mml, rid) and finished(s, p, rid, NO):
            continue
        running[m] = rid
        m += 1
    first_token = s.times[FIRST_TOKEN]
    for j in range(joined):  # their 1-token step sampled their first token
        rid = running[n + j]
        computed[rid] += 1
        generated[rid] += 1
        tokens[rid] += 1
        first_token[rid] = t
        last_token[rid] = t
        if at_end(req, mml, rid) and finished(s, p, rid, NO):
            continue
        running[m] = rid
        m += 1
    if same:
        itl.add(s.sf, ITL, first_end - begin, same)
    si[N_RUN] = m
    if m < n + joined and ci[CONSULT] == ON_COMPLETION:
        si[CHANGED] = 1
    si[IDLE_TICKS] = 0
    sf[LAST_DT] = dt
    si[PLAN_VALID] = 0
    return True
