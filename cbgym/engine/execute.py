"""Running a scheduled batch: price it, advance the clock, produce tokens, retire, record."""

from __future__ import annotations

import numpy as np

from cbgym.engine.jit import no_alloc_kernel
from cbgym.engine.kutil import end, keep_status, release
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
    GENERATED,
    IDLE_TICK_S,
    IDLE_TICKS,
    ITERATION,
    LAST_DT,
    MAX_IDLE_TICKS,
    MAX_MODEL_LEN,
    N_RUN,
    N_WAIT,
    NEXT_ARRIVAL,
    NOW,
    NUM_BLOCKS,
    ON_COMPLETION,
    OUTPUT,
    PREEMPTED_NOW,
    R_MML,
    REC_N,
    RECORD,
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


@no_alloc_kernel
def finished(s: State, p: Params, rid: int) -> bool:
    """End ``rid`` if it just produced its last token (or reached max_model_len)."""
    mml = p.ci[MAX_MODEL_LEN]
    generated, output, tokens = s.req[GENERATED], s.req[OUTPUT], s.req[TOKENS]
    full = generated[rid] >= output[rid]
    capped = mml >= 0 and tokens[rid] >= mml and not full
    if not (full or capped):
        return False
    end(s, rid, FINISHED, s.sf[NOW], R_MML if capped else 0)
    release(s, rid)
    return True


@no_alloc_kernel
def retire(s: State, p: Params, m: int) -> None:
    """End the batch's requests that produced their last token (or reached max_model_len)."""
    sched_ids, sampled = s.ids[SCHED_IDS], s.ids[SAMPLED]
    ended = False
    for j in range(m):
        if sampled[j] and finished(s, p, sched_ids[j]):
            ended = True
    if ended:
        s.si[N_RUN] = keep_status(s.ids[RUN_Q], s.si[N_RUN], s.req[STATUS], RUNNING)
        if p.ci[CONSULT] == ON_COMPLETION:
            s.si[CHANGED] = 1


@no_alloc_kernel
def idle(s: State) -> int:
    """Nothing was scheduled (every waiting request held back): let time pass."""
    si, sf, arrival = s.si, s.sf, s.times[ARRIVAL]
    si[IDLE_TICKS] += 1
    si[CHANGED] = 1  # a standing hold must not outlive an idle tick: ask again
    si[ROW_OPEN] = 0
    if si[IDLE_TICKS] > MAX_IDLE_TICKS:
        return TOO_MANY_IDLE_TICKS
    nxt = si[NEXT_ARRIVAL]
    if nxt < len(arrival) and arrival[nxt] > sf[NOW]:
        sf[NOW] = arrival[nxt]
    else:
        sf[NOW] = sf[NOW] + IDLE_TICK_S
    return AT_DECISION


@no_alloc_kernel
def execute(s: State, p: Params, m: int) -> int:
    """Price the batch of ``m`` requests, advance the clock, produce tokens, retire."""
    si, sf = s.si, s.sf
    if m == 0 and si[SWAP_BYTES] == 0 and si[PREEMPTED_NOW] == 0:
        return idle(s)
    si[IDLE_TICKS] = 0
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
    first_token = s.times[FIRST_TOKEN]
    for j in range(m):
        rid = sched_ids[j]
        computed[rid] += sched_tokens[j]
        if sampled[j]:
            generated[rid] += 1
            tokens[rid] += 1
            if generated[rid] == 1:
                first_token[rid] = sf[NOW]
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
