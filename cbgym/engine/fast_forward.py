"""Advancing a stretch of decode-only iterations in one computation.

While every running request decodes one token, nobody can be admitted and nobody has to be
preempted, an iteration has nothing to decide. The engine then prices and applies the whole
stretch with vectorised numpy, up to the next arrival, completion or memory shortfall, and
produces exactly the iterations the one-at-a-time loop would (``test_fast_forward_is_exact``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from cbgym.engine.cost_model import BatchStats

if TYPE_CHECKING:
    from cbgym.engine.engine import Engine, RunningPlan


def advance_stretch(eng: Engine, plan: RunningPlan) -> bool:
    """Run a stretch of decode-only iterations with nothing to decide in one computation.

    Valid while every running request decodes one token, nobody can be admitted (the queue
    is empty or its head is blocked, which stays true as memory only shrinks), nobody
    finishes before the stretch's last iteration, no request arrives, and memory lasts.
    Produces exactly the iterations the one-at-a-time loop would.
    """
    req, kv = eng.req, eng.kv
    n = len(plan.ids)
    if not plan.decoding or n > eng.budget:
        return False
    if eng.waiting and not _head_blocked(eng, plan):
        return False
    k_finish = int((req.output[plan.ids] - req.generated[plan.ids]).min())
    k_max = k_finish
    if eng.config.max_model_len is not None:
        room = eng.config.max_model_len - req.tokens[plan.ids]
        k_max = min(k_max, int(room.min()))
    if k_max < 2:
        return False
    steps = np.arange(1, k_max + 1)
    need = (np.zeros(len(steps), np.int64) if eng.paper
            else stretch_blocks(plan.computed, steps, kv.block_size))
    k_max = int(np.searchsorted(need, kv.free, side="right"))
    if k_max < 2:
        return False
    k = np.arange(k_max)
    ctx = int(plan.computed.sum())
    stats = BatchStats(num_seqs=n, prefill_tokens=0, decode_seqs=n, sampled_seqs=n,
                       attn_q_ctx=ctx + n * k, attn_q_sq=n, kv_tokens=ctx + n * (k + 1))
    dt = eng.cost.iteration_time(stats)
    dt = dt if isinstance(dt, np.ndarray) else np.full(k_max, float(dt))
    # summed from `now` one iteration at a time, exactly as the one-at-a-time loop rounds
    clock = np.cumsum(np.concatenate([[eng.now], dt]))
    starts = clock[:-1]
    if eng._next_arrival < req.n:
        k_max = int(np.searchsorted(starts, req.arrival_s[eng._next_arrival], side="left"))
    if k_max < 2:
        return False
    _apply(eng, plan, k_max, starts[:k_max], dt[:k_max], need[:k_max])
    if k_max == k_finish or eng.config.max_model_len is not None:
        eng._retire(plan.ids)
    return True


def _head_blocked(eng: Engine, plan: RunningPlan) -> bool:
    """Whether the standing order's first waiting request cannot be admitted now."""
    if eng.consult_every_iteration or (eng._changed and not eng.consult_never):
        return False
    order = eng._admission_order(eng._standing)
    if not order:
        return True  # everything waiting is held back
    if len(eng.running) >= eng.config.max_num_seqs:
        return True
    head = order[0]
    if eng.paper:
        return eng.kv.blocks_for(int(eng.req.prompt[head] + eng.req.output[head])) > \
            eng.kv.free
    budget = eng.budget - len(plan.ids)
    total = eng.req.num_tokens(head)
    new = total - int(eng.req.host_tokens[head])
    if budget <= 0 or (not eng.config.chunked_prefill and new > budget):
        return True
    return eng.kv.blocks_for(total) > eng.kv.free - plan.need_total


def stretch_blocks(computed: np.ndarray, steps: np.ndarray, block_size: int) -> np.ndarray:
    """New blocks the batch needs to hold ``computed + s`` tokens each, for every s."""
    bs = block_size
    # Request i (r_i tokens of room left in its last block) needs its j-th new block at
    # step r_i + 1 + (j - 1) bs. Writing s - 1 = q bs + t, it holds q + [r_i <= t] new
    # blocks after s steps, so the batch needs n q + #{i: r_i <= t}.
    slack = (-computed) % bs
    at_most = np.cumsum(np.bincount(slack, minlength=bs))
    q, t = np.divmod(steps - 1, bs)
    return len(computed) * q + at_most[t]


def _apply(eng: Engine, plan: RunningPlan, k: int, starts: np.ndarray, dt: np.ndarray,
           need: np.ndarray) -> None:
    req, ids = eng.req, plan.ids
    used0 = eng.kv.used
    req.computed[ids] += k
    req.generated[ids] += k
    req.tokens[ids] += k
    if not eng.paper:  # decoding requests hold exactly the blocks their computed tokens need
        eng.kv.set_held(ids, -(-req.computed[ids] // eng.kv.block_size), int(need[-1]))
    eng.recorder.stretch(starts, dt, used0 + need, len(eng.waiting), len(ids))
    eng.recorder.batch_stretch(eng.iteration, k, ids)
    eng.iteration += k
    eng.now = float(starts[-1] + dt[-1])
    eng.last_iteration_s = float(dt[-1])
    eng._plan = None
