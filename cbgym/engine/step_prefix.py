"""The prefix cache's part of a vLLM scheduling pass (:mod:`cbgym.engine.step_vllm`): an
admission onto cached blocks, and the running batch's blocks taken by name."""

from __future__ import annotations

from cbgym.engine import prefix_cache as pc
from cbgym.engine.jit import no_alloc_kernel
from cbgym.engine.kutil import grow_named
from cbgym.engine.layout import (
    BLOCK_SIZE,
    CACHED,
    COMPUTED,
    FREE,
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
    grow_named(s, bs, rid, upto)
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
def receive_cached(s: State, rid: int, total: int, bs: int) -> bool:
    """A decode instance's blocks for remote ``rid``'s prompt (vLLM's KV consumer with prefix
    caching): its own cache's leading run first, counted as any lookup; the transfer then
    moves only the rest (``CACHED``: the tokens it skips). Its blocks are registered when the
    KV lands (:func:`cbgym.engine.handoff.kv_landed`), as vLLM caches a remote request's
    blocks once it has received them. False (nothing taken) if the blocks do not fit."""
    hits, hit_free = pc.lookup(s, rid, total - 1, bs)
    if -(-total // bs) - hits + hit_free > s.si[FREE]:
        return False
    pc.adopt(s, rid, hits)
    grow_named(s, bs, rid, total)
    s.si[PC_QUERIES] += total
    s.si[PC_HITS] += hits * bs
    s.req[CACHED, rid] = hits * bs
    return True


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
