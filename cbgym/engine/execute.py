"""Running a scheduled batch: price it, advance the clock, produce tokens, retire, record."""

from __future__ import annotations

import numpy as np

from cbgym.engine import gaps, itl
from cbgym.engine.jit import no_alloc_inline_kernel, no_alloc_kernel
from cbgym.engine.kutil import end, keep_status, named, release_as, report
from cbgym.engine.layout import (
    ARRIVAL,
    AT_DECISION,
    BLOG_N,
    CHANGED,
    COMPUTED,
    CONSULT,
    COST_KIND,
    FINISHED,
    FIRST_TOKEN,
    FREE,
    GAP,
    GAP_MIN,
    GENERATED,
    IDLE_TICK_S,
    IDLE_TICKS,
    IDLED,
    INBOX,
    INBOX_N,
    ITERATION,
    ITL,
    ITL_MAX,
    ITL_P99,
    KEEP_KV,
    KERNEL_POLICY,
    LAST_DT,
    LAST_TOKEN,
    MAX_IDLE_TICKS,
    MAX_MODEL_LEN,
    N_RUN,
    N_WAIT,
    NEXT_ARRIVAL,
    NOW,
    NUM_BLOCKS,
    ON_COMPLETION,
    OUTBOX_N,
    OUTPUT,
    P99_ON,
    PIPELINED,
    PREEMPTED_NOW,
    R_MML,
    REC_N,
    RECORD,
    REMOTE,
    REMOTE_NEW,
    REMOTE_PENDING,
    ROW_OPEN,
    RUN_Q,
    RUNNING,
    SAMPLED,
    SCHED_IDS,
    SCHED_TOKENS,
    STATUS,
    SWAP_BYTES,
    TOKENS,
    TOO_MANY_IDLE_TICKS,
    TURNS_IDLE,
    TURNS_N,
    UNTIL,
    WAIT_Q,
    Params,
    State,
)
from cbgym.engine.pricing import price


@no_alloc_kernel
def record(s: State, p: Params, start: float, dt: float, tokens: int, prefill: int,
           decodes: int, count: int) -> None:
    """Write the time-series row of ``count`` equal iterations from ``start`` lasting ``dt``
    in all: gauges as vLLM reports them, after scheduling and before finished requests are
    freed.

    Without a batch log, an iteration that repeats the previous row's pure decode batch
    (same queue, batch and tokens, no preemption) extends that row instead: a long decode
    costs one row, not one per token, so memory is bounded by the workload's events, not by
    output lengths. ``num_iterations`` says how many iterations a row covers.
    """
    si = s.si
    kv_used = p.ci[NUM_BLOCKS] - si[FREE]
    n = si[REC_N]
    if n and si[ROW_OPEN] and not p.ci[RECORD] and prefill == 0 and si[PREEMPTED_NOW] == 0:
        last = s.rec[n - 1]
        if (last[6] == 0 and last[8] == 0 and last[2] == si[N_WAIT] and last[3] == si[N_RUN]
                and last[5] == tokens and last[7] == decodes):
            last[1] = s.sf[NOW] - last[0]
            last[4] = kv_used
            last[9] += count
            return
    row = s.rec[n]
    row[0], row[1], row[2], row[3] = start, dt, si[N_WAIT], si[N_RUN]
    row[4], row[5], row[6], row[7] = kv_used, tokens, prefill, decodes
    row[8], row[9] = si[PREEMPTED_NOW], count
    si[REC_N] = n + 1
    si[ROW_OPEN] = 1


# (Per-request loops call leaves that take the rows they need, and call what takes the whole
# state only once a cheap test has passed: cbgym.engine.jit's note on inlining.)


@no_alloc_kernel
def add_gap(g: np.ndarray, packed: np.ndarray, gap_min: np.ndarray, rid: int,
            gap: float) -> None:
    """A gap between two of ``rid``'s tokens, into its run of largest ones (gaps.py) if it
    can enter (the caller checked ``gap > gap_min[rid]``, one cache line per token).
    ``g``, ``packed``, ``gap_min``: the state's ``gaps``, ``req[GAP]`` and ``times[GAP_MIN]``."""
    packed[rid], gap_min[rid] = gaps.offer(g, packed[rid], gap)


@no_alloc_kernel
def at_end(req: np.ndarray, mml: int, rid: int) -> bool:
    """Whether ``rid`` has produced its last token or reached max_model_len (``mml`` < 0:
    none); ``req``: the state's request rows. :func:`finished`'s test, for its callers."""
    return req[GENERATED, rid] >= req[OUTPUT, rid] or (mml >= 0 and req[TOKENS, rid] >= mml)


@no_alloc_kernel
def close_gaps(s: State, rid: int) -> None:
    """``rid`` ended: its worst gap and the p99 of its gaps from its run."""
    off, _, n = gaps.unpack(s.req[GAP, rid])
    s.times[ITL_P99, rid] = (gaps.p99(s.gaps, off, n, s.req[GENERATED, rid] - 1)
                             if s.si[P99_ON] else np.nan)
    s.times[ITL_MAX, rid] = s.gaps[off + n - 1] if n > 0 else 0.0


@no_alloc_kernel
def finished(s: State, p: Params, rid: int, by_name: bool) -> bool:
    """End ``rid`` if it just produced its last token (or reached max_model_len);
    ``by_name``: its blocks are named (:func:`cbgym.engine.kutil.release_as`)."""
    if not at_end(s.req, p.ci[MAX_MODEL_LEN], rid):
        return False
    capped = s.req[GENERATED, rid] < s.req[OUTPUT, rid]  # (at max_model_len first)
    close_gaps(s, rid)
    end(s, rid, FINISHED, s.sf[NOW], R_MML if capped else 0)
    if s.req[KEEP_KV, rid]:
        report(s, rid)  # a prefill instance keeps the blocks until its KV has been sent
    else:
        release_as(s, rid, by_name)
    return True


@no_alloc_kernel
def retire(s: State, p: Params, m: int) -> None:
    """End the batch's requests that produced their last token (or reached max_model_len)."""
    sched_ids, sampled = s.ids[SCHED_IDS], s.ids[SAMPLED]
    req, mml = s.req, p.ci[MAX_MODEL_LEN]
    ended = False
    by_name = named(s)
    for j in range(m):
        rid = sched_ids[j]
        if sampled[j] and at_end(req, mml, rid) and finished(s, p, rid, by_name):
            ended = True
    if ended:
        s.si[N_RUN] = keep_status(s.ids[RUN_Q], s.si[N_RUN], s.req[STATUS], RUNNING)
        if p.ci[CONSULT] == ON_COMPLETION:
            s.si[CHANGED] = 1


@no_alloc_kernel
def remote_blocked(s: State) -> bool:
    """Whether a waiting request waits on its cluster: KV in flight, or blocks for a remote
    prompt that only a landing transfer (or a finishing request) can free."""
    remote, waiting = s.req[REMOTE], s.ids[WAIT_Q]
    for i in range(s.si[N_WAIT]):
        if remote[waiting[i]] == REMOTE_PENDING or remote[waiting[i]] == REMOTE_NEW:
            return True
    return False


@no_alloc_kernel
def s_keyed(s: State) -> bool:
    """Whether this instance's policy is known in the kernel (set by the cluster: the
    instance's standing order is its queue order or a static key)."""
    return s.si[KERNEL_POLICY] != 0


@no_alloc_kernel
def idle(s: State) -> int:
    """Nothing was scheduled (every waiting request held back, or waiting on its cluster):
    let time pass, to the next arrival or by one idle tick, never past the horizon."""
    si, sf, arrival, inbox = s.si, s.sf, s.times[ARRIVAL], s.ids[INBOX]
    si[CHANGED] = 1  # a standing hold must not outlive an idle tick: ask again
    si[ROW_OPEN] = 0
    si[IDLED] = 1
    if si[OUTBOX_N] > 0:
        return AT_DECISION  # a transfer starts now: its cluster moves before time does
    if si[TURNS_N]:  # a turn shed this iteration: its session's next one is sent before
        return TURNS_IDLE  # time passes (by the caller; then idle_after_turns)
    if sf[UNTIL] < np.inf and (remote_blocked(s) or s_keyed(s)):
        # a cluster's instance with nothing it can do (its policy is decided here, or it
        # waits on KV): nothing changes before its cluster's next event or its next
        # delivery (a cluster may deliver ahead of time)
        nxt = si[NEXT_ARRIVAL]
        wake = arrival[inbox[nxt]] if nxt < si[INBOX_N] else np.inf
        sf[NOW] = max(sf[NOW], min(sf[UNTIL], wake))
        return AT_DECISION
    nxt = si[NEXT_ARRIVAL]
    if nxt < si[INBOX_N] and arrival[inbox[nxt]] > sf[NOW]:
        t = arrival[inbox[nxt]]
    else:
        t = sf[NOW] + IDLE_TICK_S
    if t <= sf[UNTIL]:  # (a tick cut short by the cluster's next event is not counted)
        si[IDLE_TICKS] += 1
        if si[IDLE_TICKS] > MAX_IDLE_TICKS:
            return TOO_MANY_IDLE_TICKS
    sf[NOW] = min(t, sf[UNTIL])  # the horizon is later than now: an iteration started
    return AT_DECISION


@no_alloc_kernel
def idle_after_turns(s: State) -> int:
    """:func:`idle`'s rest once the turns it stopped for (``TURNS_IDLE``) are sent: no time
    passes if one is due now; else as idle (AT_DECISION: advance on)."""
    nxt = s.si[NEXT_ARRIVAL]
    if nxt < s.si[INBOX_N] and s.times[ARRIVAL, s.ids[INBOX, nxt]] <= s.sf[NOW]:
        return AT_DECISION
    return idle(s)


@no_alloc_inline_kernel
def execute(s: State, p: Params, m: int) -> int:
    """Price the batch of ``m`` requests, advance the clock, produce tokens, retire."""
    si, sf = s.si, s.sf
    if m == 0 and si[SWAP_BYTES] == 0 and si[PREEMPTED_NOW] == 0:
        return idle(s)
    si[IDLE_TICKS] = 0
    si[IDLED] = 0
    sched_ids, sched_tokens, sampled = s.ids[SCHED_IDS], s.ids[SCHED_TOKENS], s.ids[SAMPLED]
    computed, tokens, generated = s.req[COMPUTED], s.req[TOKENS], s.req[GENERATED]
    num_decode = num_tokens = num_sampled = q_ctx = q_sq = kv_tokens = np.int64(0)
    for j in range(m):
        rid, q = sched_ids[j], sched_tokens[j]
        c = computed[rid]
        sampled[j] = c + q == tokens[rid]  # caught up: it samples a token
        if sampled[j]:
            num_sampled += 1
            if q == 1 and generated[rid] > 0:  # a decode is one token past the prompt
                num_decode += 1
        num_tokens += q
        q_ctx += q * c
        q_sq += q * q
        kv_tokens += c + q
    # attn_q_sq is sum q (q + 1) / 2: exact in integers as (sum q^2 + sum q) / 2
    dt = price(p.ci[COST_KIND], p.cost, m, num_tokens - num_decode, num_decode, num_sampled,
               q_ctx, (q_sq + num_tokens) // 2, kv_tokens, si[SWAP_BYTES])
    begin = sf[NOW]
    sf[NOW] = begin + dt
    first_token, last_token, gap_min = s.times[FIRST_TOKEN], s.times[LAST_TOKEN], s.times[
        GAP_MIN]
    packed = s.req[GAP]
    for j in range(m):
        rid = sched_ids[j]
        computed[rid] += sched_tokens[j]
        if sampled[j]:
            generated[rid] += 1
            tokens[rid] += 1
            if generated[rid] == 1:
                first_token[rid] = sf[NOW]
        elif s.req[KEEP_KV, rid] == PIPELINED:
            report(s, rid)  # a prompt chunk done: its KV can be sent (pipelined link)
    pooled, same = si[P99_ON], np.int64(0)  # (the run's histogram: cbgym.engine.itl)
    for j in range(m):  # the gaps between tokens (a loop apart measured faster)
        if sampled[j]:
            rid = sched_ids[j]
            gap = sf[NOW] - last_token[rid]
            if generated[rid] > 1:
                if gap > gap_min[rid]:
                    add_gap(s.gaps, packed, gap_min, rid, gap)
                if pooled:
                    if last_token[rid] == begin:
                        same += 1  # sampled last iteration too: this iteration's duration
                    else:
                        itl.add(sf, ITL, gap, 1)
            last_token[rid] = sf[NOW]
    if same:
        itl.add(sf, ITL, sf[NOW] - begin, same)
    record(s, p, begin, dt, num_tokens, num_tokens - num_decode, num_decode, np.int64(1))
    if p.ci[RECORD]:
        for j in range(m):
            row = s.blog[si[BLOG_N] + j]
            row[0], row[1], row[2] = si[ITERATION], sched_ids[j], sched_tokens[j]
        si[BLOG_N] += m
    retire(s, p, m)
    si[ITERATION] += 1
    sf[LAST_DT] = dt
    return AT_DECISION
