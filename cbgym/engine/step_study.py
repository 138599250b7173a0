"""The CB-SJF-Work study's engine step: a prefill step for admissions, else a decode step.

The study's simulator admits waiting requests in the policy's order while a sequence slot is
free and the KV for prompt + true output can be reserved (a memory oracle every policy shares,
so nobody is ever preempted). An iteration that admits anyone prefills exactly those prompts;
otherwise every running request decodes one token.
"""

from __future__ import annotations

import numpy as np

from cbgym.engine.jit import no_alloc_kernel
from cbgym.engine.kutil import copy_ids, grow_to, keep_status
from cbgym.engine.layout import (
    BLOCK_SIZE,
    CHANGED,
    MAX_SEQS,
    N_RUN,
    N_WAIT,
    ORDER,
    OUTPUT,
    PROMPT,
    RUN_Q,
    SCHED_IDS,
    SCHED_TOKENS,
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
def schedule_study(s: State, p: Params) -> int:
    """One study iteration: admissions (a prefill step) or a decode step. The batch size."""
    si = s.si
    order, sched_ids, sched_tokens = s.ids[ORDER], s.ids[SCHED_IDS], s.ids[SCHED_TOKENS]
    prompt, output, tokens = s.req[PROMPT], s.req[OUTPUT], s.req[TOKENS]
    k = admission_candidates(s)
    m = np.int64(0)
    for j in range(k):
        rid = order[j]
        if si[N_RUN] >= p.ci[MAX_SEQS]:
            break
        # KV for prompt + true output is reserved at admission: a memory oracle for all
        if not grow_to(s, p.ci[BLOCK_SIZE], rid, prompt[rid] + output[rid]):
            break
        start(s, p, rid, np.int64(0))  # no KV to swap in
        sched_ids[m] = rid
        sched_tokens[m] = tokens[rid]  # prompt (+ generated, after an eviction)
        m += 1
    if m:
        si[N_WAIT] = keep_status(s.ids[WAIT_Q], si[N_WAIT], s.req[STATUS], WAITING)
        si[CHANGED] = 1
        return m
    n = si[N_RUN]
    copy_ids(sched_ids, s.ids[RUN_Q], n)
    for i in range(n):
        sched_tokens[i] = 1
    return n
