"""The prefix cache's part of a vLLM scheduling pass (:mod:`cbgym.engine.step_vllm`): an
admission onto cached blocks, and the running batch's blocks taken by name."""

from __future__ import annotations

from cbgym.engine import prefix_cache as pc
from cbgym.engine.jit import no_alloc_kernel
from cbgym.engine.kutil import grow_to
from cbgym.engine.layout import (
    BLOCK_SIZE,
    CACHED,
    COMPUTED,
    PC_HITS,
    PC_PRE_HITS,
    PC_PRE_QUERIES,
    PC_QUERIES,
    PLAN_NEED,
    PLAN_TOKENS,
    PREEMPTIONS,
    RUN_Q,
    TOKENS,
    Params,
    State,
)


@no_alloc_kernel
def take_cached(s: State, rid: int, hits: int, upto: int, total: int, bs: int) -> None:
    """Admit ``rid`` onto its ``hits`` cached blocks: take them, new blocks for the tokens up
    to ``upto``, register the blocks those fill, and count the lookup as vLLM's
    PrefixCacheStats do (a preempted request's own line)."""
    pc.adopt(s, rid, hits)
    grow_to(s, bs, rid, upto)
    pc.cache_full(s, rid, upto, bs)
    si, req = s.si, s.req
    if req[PREEMPTIONS, rid]:
        si[PC_PRE_QUERIES] += total
        si[PC_PRE_HITS] += hits * bs
    else:
        si[PC_QUERIES] += total
        si[PC_HITS] += hits * bs
        req[CACHED, rid] = hits * bs



@no_alloc_kernel
def name_running(s: State, p: Params, n: int) -> None:
    """The running batch's planned new blocks, taken by name in running order (as vLLM
    allocates), and the blocks its scheduled tokens fill registered."""
    running, plan_tokens, plan_need = s.ids[RUN_Q], s.ids[PLAN_TOKENS], s.ids[PLAN_NEED]
    computed, tokens = s.req[COMPUTED], s.req[TOKENS]
    for i in range(n):
        rid = running[i]
        pc.take(s, rid, plan_need[i])
        pc.cache_full(s, rid, min(computed[rid] + plan_tokens[i], tokens[rid]),
                      p.ci[BLOCK_SIZE])
