"""What a decode stretch may admit: nothing that changes the batch before its last step.

:func:`head_blocked` says whether the standing order's first waiting request stays out
while the batch only decodes (the stretch goes on). On a decode instance of a cluster the
arrivals are requests whose prompt a prefill instance computes: one takes blocks for its
prompt when it arrives (its KV transfer starts) and joins the batch for its 1-token step
once its KV has landed. A stretch runs the iteration that admits only such requests as its
last step (:func:`last_step_admits`, :func:`admit_last_step`), as
:func:`cbgym.engine.step_vllm.admit` would admit them, instead of ending before it.
"""

from __future__ import annotations

import numpy as np

from cbgym.engine.jit import no_alloc_kernel
from cbgym.engine.kutil import await_kv, grow_to, keep_status
from cbgym.engine.layout import (
    BLOCK_SIZE,
    BUDGET,
    CHANGED,
    CHUNKED,
    FREE,
    HELD,
    HOST_TOKENS,
    MAX_SEQS,
    N_RUN,
    N_WAIT,
    NUM_BLOCKS,
    ORDER,
    OUTPUT,
    PAPER,
    PREFIX,
    PROMPT,
    REMOTE,
    REMOTE_NEW,
    REMOTE_PENDING,
    REMOTE_READY,
    STATUS,
    TOKENS,
    WAIT_Q,
    WAITING,
    Params,
    State,
)
from cbgym.engine.step_vllm import admission_candidates
from cbgym.engine.transitions import start


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
def last_step_admits(s: State, p: Params, need: int) -> tuple[int, int]:
    """What a decode-only iteration whose running batch takes ``need`` new blocks admits,
    when it admits only requests whose prompt a prefill instance computed (in the standing
    order, those with KV in flight skipped, until one does not fit or the batch is full):
    (how many take their prompt's blocks, how many join the batch with their KV landed).
    (0, 0) when it admits nothing, or a local prompt too: plain iteration runs that one."""
    si, ci = s.si, p.ci
    if ci[PAPER] or ci[PREFIX]:
        return 0, 0
    k = admission_candidates(s)
    order, remote, tokens, held = s.ids[ORDER], s.req[REMOTE], s.req[TOKENS], s.req[HELD]
    bs, free = ci[BLOCK_SIZE], si[FREE] - need
    running, budget = si[N_RUN], ci[BUDGET] - si[N_RUN]  # (every decode takes one token)
    takes = joins = np.int64(0)
    for j in range(k):
        if running >= ci[MAX_SEQS] or budget <= 0:
            break
        rid = order[j]
        if remote[rid] == REMOTE_PENDING:
            continue
        if remote[rid] != REMOTE_NEW and remote[rid] != REMOTE_READY:
            return 0, 0
        blocks = -(-tokens[rid] // bs) - held[rid]  # (landed KV holds its blocks: 0)
        if blocks > free:
            break  # it waits at the head for blocks, and the queue behind it
        free -= max(blocks, 0)
        if remote[rid] == REMOTE_NEW:
            takes += 1
        else:  # its 1-token step: the last prompt token, which samples its first
            running += 1
            budget -= 1
            joins += 1
    return takes, joins


@no_alloc_kernel
def admit_last_step(s: State, p: Params, takes: int, joins: int) -> None:
    """Admit what :func:`last_step_admits` counted (the running batch's new blocks taken
    already): the ``takes`` get their blocks (their transfers start now), the ``joins``
    enter the running queue after the batch, each with all but its last prompt token
    computed."""
    si = s.si
    k = admission_candidates(s)
    order, remote, tokens = s.ids[ORDER], s.req[REMOTE], s.req[TOKENS]
    joined = joins > 0
    for j in range(k):
        if takes == 0 and joins == 0:
            break
        rid = order[j]
        if remote[rid] == REMOTE_NEW and takes > 0:
            grow_to(s, p.ci[BLOCK_SIZE], rid, tokens[rid])
            await_kv(s, rid)
            takes -= 1
        elif remote[rid] == REMOTE_READY and joins > 0:
            grow_to(s, p.ci[BLOCK_SIZE], rid, tokens[rid])
            start(s, p, rid, tokens[rid] - 1)
            joins -= 1
    if joined:
        si[N_WAIT] = keep_status(s.ids[WAIT_Q], si[N_WAIT], s.req[STATUS], WAITING)
        si[CHANGED] = 1
