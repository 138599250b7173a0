"""The engine's scheduling loop compiled with numba, for the Gymnasium env's hot path.

This is a line-by-line port of :class:`cbgym.engine.Engine` (vLLM v1 and paper modes,
chunked or not, recompute or swap preemption, ``max_model_len``) for the consult modes the
environment uses (``"every_iteration"`` and ``"always"``), with the linear and roofline cost
models. ``engine.py`` stays the readable reference: ``tests/test_kernel.py`` replays random
traces and random decisions through both and requires identical results, bit for bit.

Why a port: one env step covers about six engine iterations plus observation and reward, and
in Python that is ~200 us of small numpy calls. Compiled, it is a few microseconds, so the env
runs at the speed of Gymnasium's own overhead.

State lives in numpy arrays so that the Python side can read (and sync into an
:class:`~cbgym.engine.Engine`) at any time. The request columns are *the same arrays* as the
engine's :class:`~cbgym.engine.requests.RequestTable` and ``BlockManager.held``; the queues are
arrays with their lengths in ``si``. One decode stretch is simply iterated here (no vectorised
fast-forward needed), which is exactly what the reference's fast-forward reproduces.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numba
import numpy as np
from numba import njit

# ---------------------------------------------------------------- layout of the state arrays
# si (int64 scalars)
N_RUN, N_WAIT, NEXT_ARRIVAL, FREE, ITERATION, TOTAL_PREEMPT, NUM_FINISHED, NUM_ENDED, \
    IDLE_TICKS, HOST_FREE, SWAP_BYTES, PREEMPTED_NOW, REC_N, CHANGED, SHORTFALL, \
    PLAN_TOTAL, PLAN_DECODING = range(17)
NUM_SI = 17
# sf (float64 scalars)
NOW, LAST_DT = range(2)
NUM_SF = 2
# ci (int64 static configuration)
PAPER, BUDGET, MAX_SEQS, BLOCK_SIZE, NUM_BLOCKS, CHUNKED, MAX_MODEL_LEN, SWAP, \
    KV_BYTES, CONSULT_ALWAYS, COST_KIND = range(11)
NUM_CI = 11
COST_ROOFLINE, COST_LINEAR = 0, 1
# return codes
AT_DECISION, DRAINED, NEED_ROOM, TOO_MANY_IDLE_TICKS = range(4)
# request status codes (cbgym.engine.requests.Status)
PENDING, WAITING, RUNNING, FINISHED, SHED = range(5)
# why a request ended; 0 = plain "finished" (the reference's RequestTable.reason omits it)
REASONS = ("", "kv_reservation_exceeds_capacity", "prompt_exceeds_max_model_len",
           "prompt_exceeds_kv_capacity", "prompt_exceeds_token_budget", "kv_capacity_exceeded",
           "max_model_len", "shed_by_agent")
R_RESERVATION, R_PROMPT_MML, R_PROMPT_KV, R_PROMPT_BUDGET, R_KV_EXCEEDED, R_MML, \
    R_AGENT = range(1, 8)
REC_COLUMNS = 9  # one time-series row per iteration (cbgym.engine.recorder.TIMESERIES_COLUMNS)
IDLE_TICK_S = 0.01  # as cbgym.engine.engine
MAX_IDLE_TICKS = 100_000


class State(NamedTuple):
    """Everything the kernel reads and writes (arrays: mutated in place)."""

    arrival_s: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    tokens: np.ndarray
    computed: np.ndarray
    generated: np.ndarray
    host_tokens: np.ndarray
    preemptions: np.ndarray
    status: np.ndarray
    first_scheduled_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    finish_order: np.ndarray
    reason: np.ndarray  # int8 codes into REASONS
    held: np.ndarray  # KV blocks per request
    running: np.ndarray  # ids, admission order; first si[N_RUN] valid
    waiting: np.ndarray  # ids, queue order; first si[N_WAIT] valid
    si: np.ndarray
    sf: np.ndarray
    ci: np.ndarray
    cost: np.ndarray  # cost-model parameters (see cost_params)
    rec: np.ndarray  # (capacity, REC_COLUMNS) time-series rows; first si[REC_N] valid
    # scratch, one slot per request
    plan_tokens: np.ndarray
    plan_need: np.ndarray
    sched_ids: np.ndarray
    sched_tokens: np.ndarray
    order: np.ndarray
    sampled: np.ndarray  # bool


# ---------------------------------------------------------------- small helpers
@njit(cache=True)
def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@njit(cache=True)
def _end(s: State, rid: int, status: int, t: float, code: int) -> None:
    s.status[rid] = status
    s.finish_s[rid] = t
    s.reason[rid] = code
    if status == FINISHED:
        s.finish_order[s.si[NUM_FINISHED]] = rid
        s.si[NUM_FINISHED] += 1
    s.si[NUM_ENDED] += 1


@njit(cache=True)
def _free_request(s: State, rid: int) -> None:
    s.si[FREE] += s.held[rid]
    s.held[rid] = 0


@njit(cache=True)
def _grow_to(s: State, rid: int, num_tokens: int) -> bool:
    need = _cdiv(num_tokens, s.ci[BLOCK_SIZE]) - s.held[rid]
    if need > s.si[FREE]:
        return False
    if need > 0:
        s.held[rid] += need
        s.si[FREE] -= need
    return True


@njit(cache=True)
def _remove(queue: np.ndarray, n: int, rid: int) -> int:
    """Remove ``rid`` from the first n entries of ``queue``, keeping order; returns its position."""
    pos = 0
    while queue[pos] != rid:
        pos += 1
    for i in range(pos, n - 1):
        queue[i] = queue[i + 1]
    return pos


@njit(cache=True)
def _keep_status(queue: np.ndarray, n: int, status: np.ndarray, keep: int) -> int:
    """Drop entries whose status is not ``keep``, keeping order; returns the new length."""
    m = 0
    for i in range(n):
        rid = queue[i]
        if status[rid] == keep:
            queue[m] = rid
            m += 1
    return m


# ---------------------------------------------------------------- arrivals
@njit(cache=True)
def _never_fits(s: State, rid: int) -> int:
    ci = s.ci
    if ci[PAPER]:
        if _cdiv(s.prompt[rid] + s.output[rid], ci[BLOCK_SIZE]) > ci[NUM_BLOCKS]:
            return R_RESERVATION
        return 0
    if ci[MAX_MODEL_LEN] >= 0 and s.prompt[rid] >= ci[MAX_MODEL_LEN]:
        return R_PROMPT_MML
    if _cdiv(s.prompt[rid], ci[BLOCK_SIZE]) > ci[NUM_BLOCKS]:
        return R_PROMPT_KV
    if not ci[CHUNKED] and s.prompt[rid] > ci[BUDGET]:
        return R_PROMPT_BUDGET
    return 0


@njit(cache=True)
def _admit_arrivals(s: State) -> None:
    si, now, n = s.si, s.sf[NOW], len(s.arrival_s)
    j = si[NEXT_ARRIVAL]
    while j < n and s.arrival_s[j] <= now:
        code = _never_fits(s, j)
        if code:
            _end(s, j, SHED, s.arrival_s[j], code)
        else:
            s.status[j] = WAITING
            s.waiting[si[N_WAIT]] = j
            si[N_WAIT] += 1
            si[CHANGED] = 1
        j += 1
    si[NEXT_ARRIVAL] = j


# ---------------------------------------------------------------- the running plan
@njit(cache=True)
def running_plan(s: State) -> tuple[int, int, bool]:
    """vLLM's running loop as planned: plan_tokens / plan_need per running slot.

    Returns (blocks needed in total, shortfall, whether the batch is a pure decode batch).
    """
    si, ci = s.si, s.ci
    n = si[N_RUN]
    max_rem, min_gen = 0, 1
    for i in range(n):
        rid = s.running[i]
        rem = s.tokens[rid] - s.computed[rid]
        max_rem = max(max_rem, rem) if i else rem
        min_gen = min(min_gen, s.generated[rid]) if i else s.generated[rid]
    decoding = n > 0 and max_rem == 1 and min_gen > 0
    bs, budget = ci[BLOCK_SIZE], ci[BUDGET]
    total = 0
    before = 0
    for i in range(n):
        rid = s.running[i]
        c = s.computed[rid]
        rem = s.tokens[rid] - c
        if ci[PAPER]:
            tok, need = rem, 0
        elif decoding and n <= budget:
            tok, need = rem, 1 if c % bs == 0 else 0
        else:
            tok = min(rem, max(budget - before, 0))
            before += rem
            need = max(_cdiv(c + tok, bs) - s.held[rid], 0)
        s.plan_tokens[i] = tok
        s.plan_need[i] = need
        total += need
    si[PLAN_TOTAL], si[PLAN_DECODING] = total, decoding
    si[SHORTFALL] = max(total - si[FREE], 0)
    return total, si[SHORTFALL], decoding


# ---------------------------------------------------------------- one iteration
@njit(cache=True)
def _start(s: State, rid: int, computed: int) -> None:
    si = s.si
    if computed:  # swap-in: the KV crosses the host link back
        si[SWAP_BYTES] += computed * s.ci[KV_BYTES]
        si[HOST_FREE] += computed
        s.host_tokens[rid] = 0
    s.computed[rid] = computed
    s.status[rid] = RUNNING
    if math.isnan(s.first_scheduled_s[rid]):
        s.first_scheduled_s[rid] = s.sf[NOW]
    s.running[si[N_RUN]] = rid
    si[N_RUN] += 1


@njit(cache=True)
def _preempt(s: State, rid: int) -> None:
    """Evict (already removed from ``running``): swap to host if asked and room, else recompute."""
    si = s.si
    computed = s.computed[rid]
    if s.ci[SWAP] and 0 < computed <= si[HOST_FREE]:
        s.host_tokens[rid] = computed
        si[HOST_FREE] -= computed
        si[SWAP_BYTES] += computed * s.ci[KV_BYTES]
    s.computed[rid] = 0
    _free_request(s, rid)
    s.status[rid] = WAITING
    s.preemptions[rid] += 1
    si[TOTAL_PREEMPT] += 1
    si[PREEMPTED_NOW] += 1
    for i in range(si[N_WAIT], 0, -1):  # re-queued at the head, as vLLM does
        s.waiting[i] = s.waiting[i - 1]
    s.waiting[0] = rid
    si[N_WAIT] += 1
    si[CHANGED] = 1


@njit(cache=True)
def shed(s: State, rid: int, code: int) -> None:
    """Drop a waiting or running request now (it ends with status SHED)."""
    si = s.si
    if s.status[rid] == RUNNING:
        _remove(s.running, si[N_RUN], rid)
        si[N_RUN] -= 1
    elif s.status[rid] == WAITING:
        _remove(s.waiting, si[N_WAIT], rid)
        si[N_WAIT] -= 1
    if s.host_tokens[rid]:
        si[HOST_FREE] += s.host_tokens[rid]
        s.host_tokens[rid] = 0
    _free_request(s, rid)
    _end(s, rid, SHED, s.sf[NOW], code)
    si[CHANGED] = 1


@njit(cache=True)
def _admission_order(s: State, order: np.ndarray, has_order: bool) -> int:
    """Fill s.order with the ids to try, in order; returns how many."""
    m = 0
    if not has_order:
        for i in range(s.si[N_WAIT]):
            s.order[m] = s.waiting[i]
            m += 1
        return m
    for rid in order:
        if s.status[rid] == WAITING:
            s.order[m] = rid
            m += 1
    return m


@njit(cache=True)
def _admit(s: State, order: np.ndarray, has_order: bool, m: int, budget: int) -> int:
    """Admit waiting requests in order until one does not fit; returns the scheduled count."""
    si, ci = s.si, s.ci
    bs, chunked = ci[BLOCK_SIZE], ci[CHUNKED]
    k = _admission_order(s, order, has_order)
    admitted = 0
    n_never = 0
    never = np.empty(k, np.int64)
    for j in range(k):
        rid = s.order[j]
        if si[N_RUN] >= ci[MAX_SEQS] or budget <= 0:
            break
        total = s.tokens[rid]
        computed = s.host_tokens[rid]  # swapped-out KV comes back; else recompute
        new = total - computed
        blocks = _cdiv(total, bs)
        if blocks > ci[NUM_BLOCKS] or (not chunked and new > ci[BUDGET]):
            never[n_never] = rid
            n_never += 1
            continue
        if not chunked and new > budget:
            break
        tok = min(new, budget)
        if blocks > si[FREE]:
            break
        _grow_to(s, rid, computed + tok)
        _start(s, rid, computed)
        s.sched_ids[m] = rid
        s.sched_tokens[m] = tok
        m += 1
        admitted += 1
        budget -= tok
    if admitted:
        si[N_WAIT] = _keep_status(s.waiting, si[N_WAIT], s.status, WAITING)
        si[CHANGED] = 1
    for j in range(n_never):
        shed(s, never[j], R_KV_EXCEEDED)
    assert budget >= 0
    return m


@njit(cache=True)
def _pick_victim(s: State, victims: np.ndarray, vi: int) -> tuple[int, int]:
    """The decision's next victim still running, else vLLM's default: the last admitted."""
    while vi < len(victims):
        rid = victims[vi]
        vi += 1
        if s.status[rid] == RUNNING:
            return rid, vi
    return s.running[s.si[N_RUN] - 1], vi


@njit(cache=True)
def _schedule_running_slow(s: State, victims: np.ndarray, budget: int) -> tuple[int, int, bool]:
    """vLLM's running loop one request at a time, preempting when blocks run out."""
    si, bs = s.si, s.ci[BLOCK_SIZE]
    m = 0
    vi = 0
    preempted = False
    i = 0
    while i < si[N_RUN] and budget > 0:
        rid = s.running[i]
        tok = min(s.tokens[rid] - s.computed[rid], budget)
        if _cdiv(s.computed[rid] + tok, bs) > s.ci[NUM_BLOCKS]:
            shed(s, rid, R_KV_EXCEEDED)  # could never run, even alone
            continue
        scheduled = True
        while not _grow_to(s, rid, s.computed[rid] + tok):
            victim, vi = _pick_victim(s, victims, vi)
            pos = _remove(s.running, si[N_RUN], victim)
            si[N_RUN] -= 1
            for j in range(m):  # give back what it was granted
                if s.sched_ids[j] == victim:
                    budget += s.sched_tokens[j]
                    for t in range(j, m - 1):
                        s.sched_ids[t] = s.sched_ids[t + 1]
                        s.sched_tokens[t] = s.sched_tokens[t + 1]
                    m -= 1
                    break
            _preempt(s, victim)
            preempted = True
            if pos < i:
                i -= 1
            if victim == rid:
                scheduled = False
                break
        if scheduled:
            s.sched_ids[m] = rid
            s.sched_tokens[m] = tok
            m += 1
            budget -= tok
            i += 1
    return m, budget, preempted


@njit(cache=True)
def _schedule(s: State, order: np.ndarray, has_order: bool, victims: np.ndarray,
              planned: bool) -> int:
    """One vLLM v1 scheduling pass: running first, then waiting. Returns the scheduled count.

    ``planned``: the running plan in ``s`` is current (nothing changed since it was made).
    """
    si, ci = s.si, s.ci
    budget = ci[BUDGET]
    if planned:
        total, shortfall, decoding = si[PLAN_TOTAL], si[SHORTFALL], si[PLAN_DECODING] != 0
    else:
        total, shortfall, decoding = running_plan(s)
    n = si[N_RUN]
    too_long = False
    if ci[MAX_MODEL_LEN] >= 0:
        for i in range(n):
            if s.computed[s.running[i]] + s.plan_tokens[i] > ci[MAX_MODEL_LEN]:
                too_long = True
    if shortfall == 0 and not too_long:
        m = 0
        for i in range(n):
            rid = s.running[i]
            if s.plan_tokens[i] > 0 or (decoding and n <= budget):
                s.sched_ids[m] = rid
                s.sched_tokens[m] = s.plan_tokens[i]
                m += 1
            s.held[rid] += s.plan_need[i]
        for i in range(m):
            budget -= s.sched_tokens[i]
        assert total <= si[FREE], "KV blocks over-committed"
        si[FREE] -= total
        preempted = False
    else:
        m, budget, preempted = _schedule_running_slow(s, victims, budget)
    if not preempted:
        m = _admit(s, order, has_order, m, budget)
    assert si[N_RUN] <= ci[MAX_SEQS]
    return m


@njit(cache=True)
def _schedule_paper(s: State, order: np.ndarray, has_order: bool) -> int:
    """The CB-SJF-Work study's step: a prefill step for admissions, else a decode step."""
    si, ci = s.si, s.ci
    k = _admission_order(s, order, has_order)
    m = 0
    for j in range(k):
        rid = s.order[j]
        if si[N_RUN] >= ci[MAX_SEQS]:
            break
        # KV for prompt + true output is reserved at admission: a memory oracle for all
        if not _grow_to(s, rid, s.prompt[rid] + s.output[rid]):
            break
        _start(s, rid, 0)
        s.sched_ids[m] = rid
        m += 1
    if m:
        for j in range(m):
            s.sched_tokens[j] = s.tokens[s.sched_ids[j]]
        si[N_WAIT] = _keep_status(s.waiting, si[N_WAIT], s.status, WAITING)
        si[CHANGED] = 1
        return m
    for i in range(si[N_RUN]):
        s.sched_ids[i] = s.running[i]
        s.sched_tokens[i] = 1
    return si[N_RUN]


@njit(cache=True)
def iteration_time(cost: np.ndarray, kind: int, num_seqs: int, prefill_tokens: int,
                   decode_seqs: int, sampled_seqs: int, attn_q_ctx: int, attn_q_sq: int,
                   kv_tokens: int, swap_bytes: int) -> float:
    """The cost models' iteration_time, the same float operations in the same order."""
    if kind == COST_LINEAR:
        base = cost[0]
        if not math.isnan(cost[3]) and decode_seqs == 0 and prefill_tokens > 0:
            base = cost[3]
        return (base + cost[1] * prefill_tokens + cost[2] * decode_seqs
                + swap_bytes / cost[4])
    tokens = prefill_tokens + decode_seqs
    rows = sampled_seqs
    pairs = attn_q_ctx + attn_q_sq
    a, b = cost[0] * tokens, cost[1]
    lin = a if a >= b else b
    a, b = cost[2] * rows, cost[3] * min(rows, 1)
    lm = a if a >= b else b
    a, b = cost[4] * tokens, cost[5]
    elem = a if a >= b else b
    a, b = cost[11] * pairs, cost[12] * kv_tokens
    att = a if a >= b else b
    return (lin + lm + elem + cost[6] + cost[7] * tokens + cost[8] + cost[9] * num_seqs
            + cost[10] * swap_bytes + att)


@njit(cache=True)
def _retire(s: State, m: int, sampled: np.ndarray) -> None:
    """End requests that produced their last token (or reached max_model_len)."""
    mml = s.ci[MAX_MODEL_LEN]
    ended = False
    for j in range(m):
        if not sampled[j]:
            continue
        rid = s.sched_ids[j]
        full = s.generated[rid] >= s.output[rid]
        capped = mml >= 0 and s.tokens[rid] >= mml and not full
        if full or capped:
            _end(s, rid, FINISHED, s.sf[NOW], R_MML if capped else 0)
            _free_request(s, rid)
            ended = True
    if ended:
        s.si[N_RUN] = _keep_status(s.running, s.si[N_RUN], s.status, RUNNING)


@njit(cache=True)
def _idle(s: State) -> int:
    """Nothing was scheduled (every waiting request held back): let time pass."""
    si, sf = s.si, s.sf
    si[IDLE_TICKS] += 1
    si[CHANGED] = 1
    if si[IDLE_TICKS] > MAX_IDLE_TICKS:
        return TOO_MANY_IDLE_TICKS
    nxt = si[NEXT_ARRIVAL]
    if nxt < len(s.arrival_s) and s.arrival_s[nxt] > sf[NOW]:
        sf[NOW] = s.arrival_s[nxt]
    else:
        sf[NOW] = sf[NOW] + IDLE_TICK_S
    return AT_DECISION


@njit(cache=True)
def _execute(s: State, m: int) -> int:
    """Price the iteration, advance the clock, produce tokens, retire finished requests."""
    si, sf = s.si, s.sf
    if m == 0 and si[SWAP_BYTES] == 0 and si[PREEMPTED_NOW] == 0:
        return _idle(s)
    si[IDLE_TICKS] = 0
    num_decode = num_tokens = num_sampled = q_ctx = q_sq = kv_tokens = 0
    sampled = s.sampled
    for j in range(m):
        rid, q = s.sched_ids[j], s.sched_tokens[j]
        c = s.computed[rid]
        sampled[j] = c + q == s.tokens[rid]
        if sampled[j]:
            num_sampled += 1
            if q == 1 and s.generated[rid] > 0:
                num_decode += 1
        num_tokens += q
        q_ctx += q * c
        q_sq += q * q
        kv_tokens += c + q
    dt = iteration_time(s.cost, s.ci[COST_KIND], m, num_tokens - num_decode, num_decode,
                        num_sampled, q_ctx, (q_sq + num_tokens) // 2, kv_tokens, si[SWAP_BYTES])
    start = sf[NOW]
    sf[NOW] = start + dt
    for j in range(m):
        rid = s.sched_ids[j]
        s.computed[rid] += s.sched_tokens[j]
        if sampled[j]:
            s.generated[rid] += 1
            s.tokens[rid] += 1
            if s.generated[rid] == 1:
                s.first_token_s[rid] = sf[NOW]
    # gauges as vLLM reports them: after scheduling, before finished requests are freed
    row = s.rec[si[REC_N]]
    row[0], row[1], row[2], row[3] = start, dt, si[N_WAIT], si[N_RUN]
    row[4], row[5], row[6] = s.ci[NUM_BLOCKS] - si[FREE], num_tokens, num_tokens - num_decode
    row[7], row[8] = num_decode, si[PREEMPTED_NOW]
    si[REC_N] += 1
    _retire(s, m, sampled)
    si[ITERATION] += 1
    sf[LAST_DT] = dt
    return AT_DECISION


@njit(cache=True)
def _iterate(s: State, order: np.ndarray, has_order: bool, victims: np.ndarray,
             planned: bool) -> int:
    s.si[SWAP_BYTES] = 0
    s.si[PREEMPTED_NOW] = 0
    if s.ci[PAPER]:
        m = _schedule_paper(s, order, has_order)
    else:
        m = _schedule(s, order, has_order, victims, planned)
    return _execute(s, m)


# ---------------------------------------------------------------- the door


@njit(cache=True)
def advance(s: State) -> int:
    """Run iterations with nothing to decide; stop at a decision point (or drained, or full)."""
    si, sf = s.si, s.sf
    n = len(s.arrival_s)
    empty = np.empty(0, np.int64)
    while True:
        _admit_arrivals(s)
        if si[N_RUN] == 0 and si[N_WAIT] == 0:
            if si[NEXT_ARRIVAL] >= n:
                si[SHORTFALL] = 0
                return DRAINED
            sf[NOW] = max(sf[NOW], s.arrival_s[si[NEXT_ARRIVAL]])
            continue
        _, shortfall, _ = running_plan(s)
        if shortfall > 0 or s.ci[CONSULT_ALWAYS] or si[N_WAIT] > 0:
            si[SHORTFALL] = shortfall  # plan_tokens / plan_need hold this point's plan
            return AT_DECISION
        if si[REC_N] >= len(s.rec):
            return NEED_ROOM
        # nothing waits and memory lasts: the standing order has nobody to admit
        code = _iterate(s, empty, False, empty, True)
        if code != AT_DECISION:
            return code


@njit(cache=True)
def decide(s: State, order: np.ndarray, has_order: bool, shed_ids: np.ndarray,
           victims: np.ndarray) -> int:
    """Apply a decision (sheds, then one iteration) at a decision point, then ``advance``.

    The caller guarantees one free time-series row (``si[REC_N] < len(rec)``).
    """
    for rid in shed_ids:
        shed(s, rid, R_AGENT)
    s.si[CHANGED] = 0
    # the plan made when advance() stopped here stands unless something was shed since
    code = _iterate(s, order, has_order, victims, len(shed_ids) == 0)
    if code != AT_DECISION:
        return code
    return advance(s)


_BOUND: dict[tuple, object] = {}


def _layout(x: object) -> object:
    """What numba's type of ``x`` depends on, cheaply (arrays: dtype, ndim, layout, flags)."""
    if isinstance(x, np.ndarray):
        f = x.flags
        return x.dtype.str, x.ndim, f.c_contiguous, f.f_contiguous, f.writeable, f.aligned
    if isinstance(x, tuple):
        return type(x), tuple(_layout(v) for v in x)
    return type(x)


def bind(fn: numba.core.registry.CPUDispatcher, *args: object) -> object:
    """``fn``'s compiled entry point for arguments of exactly these types.

    Calling it skips numba's per-call type dispatch, which for the state tuples costs more than
    a whole engine iteration (about 5 us of a 35 us env step). Valid only for arguments of the
    same types (array dtypes, dimensions and layouts included); callers bind once per episode
    to the state they built and pass per-step arrays made contiguous with a fixed dtype.
    """
    key = (fn, _layout(args))
    entry = _BOUND.get(key)
    if entry is None:
        sig = tuple(numba.typeof(x) for x in args)
        fn.compile(sig)  # a no-op once compiled (or loaded from the on-disk cache)
        entry = _BOUND[key] = fn.overloads[sig].entry_point
    return entry


def cost_params(cost_model: object) -> tuple[int, np.ndarray] | None:
    """(kind, parameters) for a cost model the kernel prices exactly; None for any other."""
    from cbgym.engine.cost_model import LinearCostModel
    from cbgym.engine.roofline import RooflineCostModel

    m = cost_model
    if type(m) is RooflineCostModel:
        return COST_ROOFLINE, np.array([
            m._lin_per_token, m._lin_weights, m._lm_per_row, m._lm_weights, m._elem_per_token,
            m._elem_floor, m._ar_fixed, m._ar_per_token, m.cpu_overhead_s, m.cpu_per_seq_s,
            m._swap_per_byte, m._att_per_pair, m._att_per_kv_token], dtype=np.float64)
    if type(m) is LinearCostModel:
        pb = np.nan if m.prefill_base_s is None else m.prefill_base_s
        return COST_LINEAR, np.array([m.base_s, m.prefill_per_token_s, m.decode_per_seq_s, pb,
                                      m.host_link_bytes_per_s], dtype=np.float64)
    return None
