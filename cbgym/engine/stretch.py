"""Decode stretches: many iterations of an unchanged decode batch in one pass.

While every running request decodes one token, nobody can be admitted and nobody has to be
preempted, an iteration has nothing to decide and differs from the previous one only in its
clock and context lengths. :func:`decode_stretch` runs such iterations with per-step work
independent of the batch size (the clock is still summed one iteration at a time, so times
are bit for bit those of iterating), then updates each running request once. It stops before
the step at which the next request arrives (unless the policy's answer is known in the kernel
and the queue's head stays blocked: arrivals then queue up), memory would run short, or after
the step at which the first running request
finishes. ``tests/test_engine_invariants.py`` checks it
against plain iteration (``ci[STRETCH] = 0``).
"""

from __future__ import annotations

import numpy as np

from cbgym.engine import gaps, itl
from cbgym.engine.execute import add_gap, finished, record
from cbgym.engine.jit import no_alloc_kernel
from cbgym.engine.kutil import await_kv, grow_to
from cbgym.engine.layout import (
    ARRIVAL,
    BLOCK_SIZE,
    BUDGET,
    CHANGED,
    CHUNKED,
    COMPUTED,
    CONSULT,
    COST_KIND,
    EVERY_ITERATION,
    FREE,
    GAP_MIN,
    GAP_TOP,
    GENERATED,
    HELD,
    HOST_TOKENS,
    IDLE_TICKS,
    INBOX,
    INBOX_N,
    ITERATION,
    ITL,
    KEYED,
    LAST_DT,
    LAST_TOKEN,
    MAX_SEQS,
    N_RUN,
    N_WAIT,
    NEVER,
    NEXT_ARRIVAL,
    NO,
    NOW,
    NUM_BLOCKS,
    ON_COMPLETION,
    ORDER,
    OUTPUT,
    P99_ON,
    PAPER,
    PLAN_CTX,
    PLAN_DECODING,
    PLAN_LEFT,
    PLAN_TOTAL,
    PLAN_VALID,
    PREEMPTED_NOW,
    PREFIX,
    PROMPT,
    REC_N,
    RECORD,
    REMOTE,
    REMOTE_NEW,
    REMOTE_PENDING,
    REMOTE_READY,
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
from cbgym.engine.step_vllm import admission_candidates, rank_by_key
from cbgym.engine.transitions import admit_arrivals


@no_alloc_kernel
def head_blocked(s: State, p: Params, need: int) -> bool:
    """Whether the standing order's first waiting request cannot be admitted at an iteration
    whose running batch takes ``need`` new blocks, and stays so while the batch only decodes
    (memory only shrinks, the batch does not change)."""
    si, ci = s.si, p.ci
    if si[N_WAIT] == 0:
        return True
    if si[N_RUN] >= ci[MAX_SEQS]:
        return True
    k = admission_candidates(s)
    order, remote = s.ids[ORDER], s.req[REMOTE]
    first = 0
    while first < k and remote[order[first]] == REMOTE_PENDING:
        first += 1  # skipped until its KV lands (an event of its cluster)
    if first == k:
        return True  # everything waiting is held back
    head, bs = order[first], ci[BLOCK_SIZE]
    if ci[PAPER]:
        return -(-(s.req[PROMPT, head] + s.req[OUTPUT, head]) // bs) > si[FREE]
    total = s.req[TOKENS, head]
    if remote[head] == REMOTE_NEW:  # takes blocks for its prompt, nothing else
        return si[N_RUN] >= ci[BUDGET] or -(-total // bs) > si[FREE] - need
    if remote[head] == REMOTE_READY:
        return False  # its 1-token step is admitted at the next iteration
    new = total - s.req[HOST_TOKENS, head]
    if -(-total // bs) > ci[NUM_BLOCKS] or (not ci[CHUNKED] and new > ci[BUDGET]):
        return False  # the next iteration sheds it and tries the next one
    left = ci[BUDGET] - si[N_RUN]
    if left <= 0 or (not ci[CHUNKED] and new > left):
        return True
    return -(-total // bs) > si[FREE] - need


@no_alloc_kernel
def remote_takes(s: State, p: Params, need: int) -> int:
    """How many requests whose KV a prefill instance sends get their prompt's blocks at a
    decode-only iteration whose running batch takes ``need`` new blocks, when that is all
    the iteration admits (as :func:`~cbgym.engine.step_vllm.admit` does it: in the standing
    order, those with KV in flight skipped, until one does not fit); 0 when it gives none,
    or would also admit a request into the batch (KV landed, or a local prompt): the batch
    then changes, and plain iteration runs it."""
    si, ci = s.si, p.ci
    if ci[PAPER] or ci[PREFIX] or si[N_RUN] >= ci[MAX_SEQS] or si[N_RUN] >= ci[BUDGET]:
        return 0
    k = admission_candidates(s)
    order, remote, tokens, held = s.ids[ORDER], s.req[REMOTE], s.req[TOKENS], s.req[HELD]
    bs, free, count = ci[BLOCK_SIZE], si[FREE] - need, np.int64(0)
    for j in range(k):
        rid = order[j]
        if remote[rid] == REMOTE_PENDING:
            continue
        if remote[rid] != REMOTE_NEW:
            return 0
        blocks = max(-(-tokens[rid] // bs) - held[rid], 0)
        if blocks > free:
            break  # it waits at the head for blocks, and the queue behind it
        free -= blocks
        count += 1
    return count


@no_alloc_kernel
def give_remote(s: State, p: Params, count: int) -> None:
    """The blocks :func:`remote_takes` counted, to its ``count`` requests (the running
    batch's own taken first); their transfers start now."""
    k = admission_candidates(s)
    order, remote = s.ids[ORDER], s.req[REMOTE]
    for j in range(k):
        if count == 0:
            break
        rid = order[j]
        if remote[rid] == REMOTE_NEW:
            grow_to(s, p.ci[BLOCK_SIZE], rid, s.req[TOKENS, rid])
            await_kv(s, rid)
            count -= 1


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
    """Run a stretch of at least two decode-only iterations if one starts now (the running
    plan is current and nothing needs deciding); False, doing nothing, otherwise. Never with
    named blocks (prefix caching: the engine turns stretches off)."""
    si, ci, sf = s.si, p.ci, s.sf
    n = si[N_RUN]
    if ci[RECORD] or not si[PLAN_DECODING] or n > ci[BUDGET] or si[SHORTFALL] > 0:
        return False
    if ci[PREFIX]:
        return False  # (named blocks: the engine turns stretches off; never run one here)
    # requests whose KV a prefill instance sends, given their blocks at the first step (a
    # decode instance's arrivals: they hold blocks, not a place in the batch)
    take = np.int64(0)
    if si[N_WAIT] > 0 and (ci[CONSULT] >= EVERY_ITERATION
                           or not head_blocked(s, p, si[PLAN_TOTAL])):
        if ci[CONSULT] >= EVERY_ITERATION:
            return False
        take = remote_takes(s, p, si[PLAN_TOTAL])
        if take == 0:
            return False
    running = s.ids[RUN_Q]
    computed, generated, tokens = s.req[COMPUTED], s.req[GENERATED], s.req[TOKENS]
    bs = ci[BLOCK_SIZE]
    # steps until the first completion (or max_model_len), and the batch's context
    k, ctx = si[PLAN_LEFT], si[PLAN_CTX]
    if k < 2:
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
    dt = 0.0
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
            nxt = si[NEXT_ARRIVAL]
            next_at = arrival[inbox[nxt]] if nxt < si[INBOX_N] else np.inf
            if keyed and si[CHANGED]:
                rank_by_key(s)
            if head_blocked(s, p, need):
                take = np.int64(0)
            else:
                take = remote_takes(s, p, need)
                if take == 0:
                    break  # the next iteration admits
        if need > free:
            break  # memory runs short: the next iteration preempts
        if take:  # after the running batch's new blocks, as an iteration takes them
            si[FREE] = free - need
            give_remote(s, p, take)
            free = si[FREE] + need
        dt = price(ci[COST_KIND], p.cost, n, np.int64(0), n, n, ctx + n * steps, n,
                   ctx + n * (steps + 1), np.int64(0))
        before = t
        t += dt
        free -= need
        if steps > 0:  # (the gap as plain iteration measures it)
            sn = gaps.push(buf, 0, sn, top, t - before)
            if pooled:
                itl.add(s.sf, ITL, t - before, n)
        steps += 1
        seg_steps += 1
        if take:
            break  # the transfers start: its cluster moves before this instance goes on
    end_segment(s, p, free, t, seg_begin, seg_steps, dt)
    si[ITERATION] += steps
    if steps == 0:
        return False
    held = s.req[HELD]
    last = steps == k  # somebody finishes (or reaches max_model_len) at the last step
    m = 0  # the running queue, compacted in place as requests finish
    last_token, gap_min = s.times[LAST_TOKEN], s.times[GAP_MIN]
    # the first step's end, as the loop summed it (a request whose last token came before
    # the stretch began, after an idle tick, has a longer first gap)
    first_end = begin + price(ci[COST_KIND], p.cost, n, np.int64(0), n, n, ctx, n, ctx + n,
                              np.int64(0))
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
                add_gap(s, rid, first)
            for j in range(sn):
                if buf[j] <= gap_min[rid]:
                    break
                add_gap(s, rid, buf[j])
        last_token[rid] = t
        if not ci[PAPER]:  # a decoding request holds exactly the blocks its tokens need
            held[rid] = -(-computed[rid] // bs)
        if last and finished(s, p, rid, NO):
            continue
        running[m] = rid
        m += 1
    if same:
        itl.add(s.sf, ITL, first_end - begin, same)
    si[N_RUN] = m
    if m < n and ci[CONSULT] == ON_COMPLETION:
        si[CHANGED] = 1
    si[IDLE_TICKS] = 0
    sf[LAST_DT] = dt
    si[PLAN_VALID] = 0
    return True
