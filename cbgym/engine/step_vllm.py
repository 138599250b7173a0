"""One vLLM v1 scheduling pass, read as a token-budget loop.

NOTE on the algorithm (vLLM v1's ``Scheduler.schedule``): there is no prefill phase and no
decode phase. Every request has ``computed`` tokens catching up with its tokens (prompt +
generated output); an iteration hands out a token budget, RUNNING requests first (in
admission order), then WAITING ones (in the decision's order). A decode is a request one
token behind; a long prompt is caught up in chunks. When the running loop runs out of KV
blocks it preempts (the decision's victims first, else the most recently admitted) and that
iteration admits nobody.
"""

from __future__ import annotations

import numpy as np

from cbgym.engine import prefix_cache as pc
from cbgym.engine.jit import no_alloc_inline_kernel, no_alloc_kernel
from cbgym.engine.kutil import (
    await_kv,
    copy_ids,
    grow_named,
    grow_to,
    keep_status,
    remove,
    sort_by_key,
)
from cbgym.engine.layout import (
    BLOCK_SIZE,
    BUDGET,
    CHANGED,
    CHUNK_CAP,
    CHUNKED,
    COMPUTED,
    FREE,
    GENERATED,
    HELD,
    HOST_TOKENS,
    KEY,
    LOCAL,
    MAX_MODEL_LEN,
    MAX_SEQS,
    N_RUN,
    N_WAIT,
    NEVER_FIT,
    NUM_BLOCKS,
    ORDER,
    OUTPUT,
    PAPER,
    PLAN_CTX,
    PLAN_DECODING,
    PLAN_LEFT,
    PLAN_NEED,
    PLAN_TOKENS,
    PLAN_TOTAL,
    PLAN_VALID,
    PREFIX,
    R_KV_EXCEEDED,
    REMOTE,
    REMOTE_NEW,
    REMOTE_PENDING,
    REMOTE_READY,
    RUN_Q,
    RUNNING,
    SCHED_IDS,
    SCHED_TOKENS,
    SCRATCH,
    SHORTFALL,
    STAND_HAS,
    STAND_N,
    STAND_ORDER,
    STAND_VICTIMS,
    STATUS,
    TOKENS,
    VICT_HAS,
    VICT_N,
    VICTIM_BY_KEY,
    WAIT_Q,
    WAITING,
    Params,
    State,
)
from cbgym.engine.step_prefix import name_running, receive_cached, take_cached
from cbgym.engine.transitions import preempt, shed, start


@no_alloc_inline_kernel
def running_plan(s: State, p: Params) -> None:
    """What serving the running batch would take this iteration (vLLM's running loop).

    Fills PLAN_TOKENS / PLAN_NEED per running slot and sets PLAN_TOTAL (new blocks),
    SHORTFALL (blocks missing; 0 = everyone fits) and PLAN_DECODING (a pure decode batch);
    for a decode stretch, also PLAN_LEFT (tokens until the first request finishes or reaches
    max_model_len) and PLAN_CTX (the batch's computed tokens). In the study's mode only the
    batch-wide figures are set.
    """
    si, ci = s.si, p.ci
    running, plan_tokens, plan_need = s.ids[RUN_Q], s.ids[PLAN_TOKENS], s.ids[PLAN_NEED]
    tokens, computed, generated, held = (s.req[TOKENS], s.req[COMPUTED], s.req[GENERATED],
                                         s.req[HELD])
    output, mml, cap = s.req[OUTPUT], ci[MAX_MODEL_LEN], s.req[CHUNK_CAP]
    n = si[N_RUN]
    max_rem, min_gen = 0, 1
    left, ctx = np.int64(1 << 62), np.int64(0)
    for i in range(n):
        rid = running[i]
        rem = tokens[rid] - computed[rid]
        max_rem = max(max_rem, rem) if i else rem
        min_gen = min(min_gen, generated[rid]) if i else generated[rid]
        left = min(left, output[rid] - generated[rid])
        if mml >= 0:
            left = min(left, mml - tokens[rid])
        ctx += computed[rid]
    si[PLAN_LEFT], si[PLAN_CTX] = left, ctx
    # a request one token behind that has output is decoding; else it is (re)prefilling
    decoding = n > 0 and max_rem == 1 and min_gen > 0
    si[PLAN_DECODING], si[PLAN_VALID] = decoding, 1
    if ci[PAPER]:
        # The study's decode step serves every running request, its KV reserved at
        # admission: no slot needs a block (PLAN_NEED stays zero, as new_state made it).
        si[PLAN_TOTAL], si[SHORTFALL] = 0, 0
        return
    bs, budget = ci[BLOCK_SIZE], ci[BUDGET]
    total = before = np.int64(0)
    for i in range(n):
        rid = running[i]
        c = computed[rid]
        rem = tokens[rid] - c
        if decoding and n <= budget:
            # a decoding request holds exactly ceil(computed / block_size) blocks, so its
            # next token needs a new block exactly when its last block is full
            tok, need = rem, 1 if c % bs == 0 else 0
        else:
            tok = min(rem, max(budget - before, 0))
            if cap[rid] > 0:
                tok = min(tok, cap[rid])
            before += tok
            need = max(-(-(c + tok) // bs) - held[rid], 0)
        plan_tokens[i] = tok
        plan_need[i] = need
        total += need
    si[PLAN_TOTAL] = total
    si[SHORTFALL] = max(total - si[FREE], 0)


@no_alloc_kernel
def largest_key(ids: np.ndarray, n: int, key: np.ndarray) -> int:
    """The first of ``ids[:n]`` with the largest key (Python's ``max``: vLLM's priority
    victim, ``max(running, key=(priority, arrival))``)."""
    best = ids[0]
    for i in range(1, n):
        if key[ids[i]] > key[best]:
            best = ids[i]
    return best


@no_alloc_kernel
def schedule_running_slow(s: State, p: Params, budget: int) -> tuple[int, int, bool]:
    """vLLM's running loop one request at a time, preempting when blocks run out.

    Victims are the standing decision's, in its order (those still running), then vLLM's
    default: the most recently admitted (with ``VICTIM_BY_KEY``, the largest static key).
    Returns (batch size, budget left, preempted?).
    """
    si, bs = s.si, p.ci[BLOCK_SIZE]
    running, victims = s.ids[RUN_Q], s.ids[STAND_VICTIMS]
    sched_ids, sched_tokens = s.ids[SCHED_IDS], s.ids[SCHED_TOKENS]
    tokens, computed, status = s.req[TOKENS], s.req[COMPUTED], s.req[STATUS]
    m = vi = i = np.int64(0)
    preempted = False
    while i < si[N_RUN] and budget > 0:
        rid = running[i]
        tok = min(tokens[rid] - computed[rid], budget)
        if s.req[CHUNK_CAP, rid] > 0:
            tok = min(tok, s.req[CHUNK_CAP, rid])
        if -(-(computed[rid] + tok) // bs) > p.ci[NUM_BLOCKS]:
            shed(s, rid, R_KV_EXCEEDED)  # could never run, even alone
            continue
        scheduled = True
        while not (grow_named(s, bs, rid, computed[rid] + tok) if p.ci[PREFIX]
                   else grow_to(s, bs, rid, computed[rid] + tok)):
            victim = running[si[N_RUN] - 1]  # vLLM's default
            if p.ci[VICTIM_BY_KEY]:
                victim = largest_key(running, si[N_RUN], s.times[KEY])
            while si[VICT_HAS] and vi < si[VICT_N]:
                vi += 1
                if status[victims[vi - 1]] == RUNNING:
                    victim = victims[vi - 1]
                    break
            pos = remove(running, si[N_RUN], victim)
            si[N_RUN] -= 1
            for j in range(m):  # give back what the victim was granted
                if sched_ids[j] == victim:
                    budget += sched_tokens[j]
                    for t in range(j, m - 1):
                        sched_ids[t] = sched_ids[t + 1]
                        sched_tokens[t] = sched_tokens[t + 1]
                    m -= 1
                    break
            preempt(s, p, victim)
            preempted = True
            if pos < i:
                i -= 1
            if victim == rid:
                scheduled = False
                break
        if not scheduled:
            break  # it preempted itself: the running loop ends, as vLLM's (nothing after it)
        if p.ci[PREFIX]:
            pc.cache_full(s, rid, min(computed[rid] + tok, tokens[rid]), bs)
        sched_ids[m] = rid
        sched_tokens[m] = tok
        m += 1
        budget -= tok
        i += 1
    return m, budget, preempted


@no_alloc_kernel
def admission_candidates(s: State) -> int:
    """Fill ORDER with the waiting ids to try, in the standing order; how many.

    The standing order may name requests that left the queue since it was decided: only
    those still waiting count. Without one, the queue order (FCFS).
    """
    order, status = s.ids[ORDER], s.req[STATUS]
    if not s.si[STAND_HAS]:
        n = s.si[N_WAIT]
        copy_ids(order, s.ids[WAIT_Q], n)
        return n
    stand = s.ids[STAND_ORDER]
    m = np.int64(0)
    for i in range(s.si[STAND_N]):
        if status[stand[i]] == WAITING:
            order[m] = stand[i]
            m += 1
    return m


@no_alloc_kernel
def rank_by_key(s: State) -> None:
    """A static-key policy's decision: the waiting queue sorted by key (ties: queue order),
    default victims. Exactly what the policy returns through the door."""
    si = s.si
    n = si[N_WAIT]
    si[STAND_HAS] = n > 0
    si[STAND_N] = n
    stand = s.ids[STAND_ORDER]
    copy_ids(stand, s.ids[WAIT_Q], n)
    sort_by_key(stand, n, s.times[KEY], s.ids[SCRATCH])
    si[VICT_HAS] = 0
    si[CHANGED] = 0


@no_alloc_kernel
def stalled_here(s: State) -> bool:
    """Whether a head that cannot get its blocks would wait forever: nothing runs (so no
    block will be freed) and the blocks are held by received KV waiting behind it. vLLM
    hangs there; the engine admits the received KV past the head instead (a decode instance
    only: nowhere else do waiting requests hold blocks)."""
    if s.si[N_RUN] > 0:
        return False
    remote, waiting = s.req[REMOTE], s.ids[WAIT_Q]
    for i in range(s.si[N_WAIT]):
        if remote[waiting[i]] == REMOTE_READY:
            return True
    return False


@no_alloc_kernel
def admit(s: State, p: Params, m: int, budget: int) -> int:
    """Admit waiting requests in order until one does not fit; the new batch size.

    A request whose prompt a prefill instance computes (``REMOTE``, vLLM's KV consumer) first
    takes blocks for its whole prompt, without budget or a running slot, and waits for its
    KV (short of blocks, it blocks the queue behind it, as any admission does); while the KV
    is in flight it is skipped; once landed it is admitted with all but its last prompt
    token computed, and that 1-token step samples its first token. One departure from vLLM:
    :func:`stalled_here`.
    """
    si, ci = s.si, p.ci
    bs, chunked = ci[BLOCK_SIZE], ci[CHUNKED]
    order, never = s.ids[ORDER], s.ids[NEVER_FIT]
    sched_ids, sched_tokens = s.ids[SCHED_IDS], s.ids[SCHED_TOKENS]
    tokens, host_tokens, held = s.req[TOKENS], s.req[HOST_TOKENS], s.req[HELD]
    remote, cap = s.req[REMOTE], s.req[CHUNK_CAP]
    k = admission_candidates(s)
    admitted = n_never = np.int64(0)
    stalled = False  # see below: only received KV is admitted past this point
    for j in range(k):
        rid = order[j]
        if si[N_RUN] >= ci[MAX_SEQS] or budget <= 0:
            break
        total = tokens[rid]
        blocks = -(-total // bs)
        if remote[rid] == REMOTE_PENDING or (stalled and remote[rid] != REMOTE_READY):
            continue  # its KV is in flight: skipped, kept in place
        if remote[rid] == REMOTE_NEW:
            if not (receive_cached(s, rid, total, bs) if ci[PREFIX]
                    else grow_to(s, bs, rid, total)):
                if stalled_here(s):
                    stalled = True
                    continue
                break
            await_kv(s, rid)
            continue
        # swapped-out KV comes back; received KV is held already; else recompute, from
        # the leading blocks the prefix cache has (at most total - 1 tokens: the last one
        # is computed for its logits)
        computed = total - 1 if remote[rid] == REMOTE_READY else host_tokens[rid]
        hits = hit_free = np.int64(0)
        if ci[PREFIX] and remote[rid] == LOCAL:
            hits, hit_free = pc.lookup(s, rid, total - 1, bs)
            computed = hits * bs
        new = total - computed
        if blocks > ci[NUM_BLOCKS] or (not chunked and new > ci[BUDGET]):
            never[n_never] = rid  # prompt + output so far outgrew the cache or the budget
            n_never += 1
            continue
        if not chunked and new > budget:
            break
        tok = min(new, budget)
        if cap[rid] > 0:
            tok = min(tok, cap[rid])
        # The whole sequence must fit before a request is admitted (no partial reservation
        # of a prompt that could then stall), but only the scheduled chunk is allocated.
        # (A waiting request holds no blocks, preemption and swap-out free them all, except
        # received KV.)
        # (Cached blocks nobody holds leave the free queue when taken: they count.)
        if blocks - held[rid] - hits + hit_free > si[FREE]:
            if stalled_here(s):
                stalled = True
                continue
            break
        if ci[PREFIX] and remote[rid] == LOCAL:
            take_cached(s, rid, hits, computed + tok, total, bs)
        else:
            grow_to(s, bs, rid, computed + tok)
        start(s, p, rid, computed)
        sched_ids[m] = rid
        sched_tokens[m] = tok
        m += 1
        admitted += 1
        budget -= tok
    if admitted:
        si[N_WAIT] = keep_status(s.ids[WAIT_Q], si[N_WAIT], s.req[STATUS], WAITING)
        si[CHANGED] = 1
    for j in range(n_never):
        shed(s, never[j], R_KV_EXCEEDED)
    assert budget >= 0, "token budget over-spent"
    return m


@no_alloc_inline_kernel
def schedule(s: State, p: Params) -> int:
    """One vLLM v1 scheduling pass: running first, then waiting. The batch size."""
    si, ci = s.si, p.ci
    running, plan_tokens, plan_need = s.ids[RUN_Q], s.ids[PLAN_TOKENS], s.ids[PLAN_NEED]
    computed, held = s.req[COMPUTED], s.req[HELD]
    budget = ci[BUDGET]
    if not si[PLAN_VALID]:
        running_plan(s, p)
    n = si[N_RUN]
    too_long = False
    if ci[MAX_MODEL_LEN] >= 0:
        for i in range(n):
            if computed[running[i]] + plan_tokens[i] > ci[MAX_MODEL_LEN]:
                too_long = True
    # First, schedule the RUNNING requests: all at once when memory lasts.
    if si[SHORTFALL] == 0 and not too_long:
        sched_ids, sched_tokens = s.ids[SCHED_IDS], s.ids[SCHED_TOKENS]
        every_decode = si[PLAN_DECODING] != 0 and n <= budget  # everyone, one token
        m = np.int64(0)
        assert si[PLAN_TOTAL] <= si[FREE], "KV blocks over-committed"
        for i in range(n):
            rid = running[i]
            if plan_tokens[i] > 0 or every_decode:
                sched_ids[m] = rid
                sched_tokens[m] = plan_tokens[i]
                m += 1
                budget -= plan_tokens[i]
        if ci[PREFIX]:  # the new blocks by name (a separate loop: inlined into the one
            name_running(s, p, n)  # above it slowed every run measurably)
        else:
            for i in range(n):
                held[running[i]] += plan_need[i]
            si[FREE] -= si[PLAN_TOTAL]
        preempted = False
    else:
        m, budget, preempted = schedule_running_slow(s, p, budget)
    # Next, schedule the WAITING requests, unless this iteration had to preempt.
    if not preempted:
        m = admit(s, p, m, budget)
    assert si[N_RUN] <= ci[MAX_SEQS], "max_num_seqs exceeded"
    return m
