"""What a run takes from its trace beyond token counts: block hashes for prefix caching and
the sessions of a closed-loop replay (the Engine's setup, in Python)."""

from __future__ import annotations

import numpy as np

from cbgym.engine import layout as L
from cbgym.engine.config import EngineConfig
from cbgym.engine.prefix_hashes import block_hashes
from cbgym.workload.trace import Trace

__all__ = ["SESSION_KEYS", "caches_prefixes", "has_sessions", "start_sessions",
           "trace_block_hashes"]


def caches_prefixes(trace: Trace, config: EngineConfig) -> bool:
    """Whether a run of ``trace`` on ``config`` names its blocks: prefix caching on, and block
    ids to hash (without them no two requests share a block: nothing to find)."""
    return bool(config.enable_prefix_caching and "hash_ids" in trace.extra)


def trace_block_hashes(trace: Trace, config: EngineConfig) -> np.ndarray:
    """The engine-block hashes of ``trace``'s requests from its block ids
    (:func:`cbgym.engine.prefix_hashes.block_hashes`)."""
    assert config.block_size is not None
    ids = trace.extra["hash_ids"]
    tokens = trace.extra.get("hash_block_tokens")
    if tokens is None:
        raise ValueError(f"trace {trace.name!r}: extra['hash_ids'] without "
                         "extra['hash_block_tokens'] (the tokens each block id stands for)")
    return block_hashes(trace.prompt_tokens, trace.output_tokens, config.block_size, ids,
                        tokens, trace.tenant if config.cache_salt_by_tenant else None,
                        next_turn_donors(trace) if has_sessions(trace) else None)


def next_turn_donors(trace: Trace) -> np.ndarray:
    """Per request, its session's next turn if that turn's prompt extends this one's (its
    ids start with this prompt's full-block ids, at the same block size), else -1: the
    next turn names the blocks this one's response fills."""
    from cbgym.workload.sessions import previous_in_session

    prev = previous_in_session(trace)
    ids, big = trace.extra["hash_ids"], np.asarray(trace.extra["hash_block_tokens"])
    donor = np.full(len(trace), -1, np.int64)
    for nxt in np.flatnonzero(prev >= 0):
        r = prev[nxt]
        full = int(trace.prompt_tokens[r] // big[r]) if big[r] > 0 else 0
        if big[nxt] == big[r] and tuple(ids[nxt][:full]) == tuple(ids[r][:full]):
            donor[r] = nxt
    return donor


SESSION_KEYS = ("session", "turn", "think_time_s")


def has_sessions(trace: Trace) -> bool:
    """Whether ``trace`` says which requests are a session's turns (closed-loop replay)."""
    return all(k in trace.extra for k in SESSION_KEYS)


def start_sessions(s: L.State, trace: Trace) -> None:
    """Make a run closed-loop: only first turns (in the trace: a turn whose predecessor is
    outside a window starts its session) are in the inbox; each request names its next
    turn, sent when it ends (:func:`cbgym.engine.kutil.send_turns`)."""
    from cbgym.workload.sessions import previous_in_session

    missing = [k for k in SESSION_KEYS if k not in trace.extra]
    if missing:
        raise ValueError(f"closed_loop=True: trace {trace.name!r} has no extra {missing} "
                         "(a session trace: load_agent_sessions, synthetic_sessions)")
    prev = previous_in_session(trace)
    think = np.asarray(trace.extra["think_time_s"], np.float64)
    if not (np.isfinite(think) & (think >= 0)).all():
        raise ValueError(f"trace {trace.name!r}: think_time_s must be finite and >= 0")
    later = prev >= 0
    s.req[L.NEXT_TURN, prev[later]] = np.flatnonzero(later)
    s.times[L.THINK] = think
    s.times[L.ARRIVAL, later] = np.inf  # (sent when their previous turn ends)
    roots = np.flatnonzero(~later)
    s.ids[L.INBOX, : len(roots)] = roots
    s.si[L.INBOX_N] = len(roots)
