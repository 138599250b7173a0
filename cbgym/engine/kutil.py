"""Small pieces the engine kernels share: KV blocks, queues, request ends, sorting.

Paged KV accounting counts blocks rather than naming them (without prefix caching which
physical block a request holds never changes a decision, as in Vidur). The invariant the
engine keeps: ``0 <= free <= num_blocks`` and ``free + sum(held) == num_blocks``. With prefix
caching blocks are named and shared (:mod:`cbgym.engine.prefix_cache`, whose state has more
than one column): ``free`` + the blocks anybody holds ``== num_blocks``.
"""

from __future__ import annotations

import numpy as np

from cbgym.engine import prefix_cache as pc
from cbgym.engine.jit import no_alloc_kernel
from cbgym.engine.layout import (
    ARRIVAL,
    FINISH,
    FINISH_ORDER,
    FINISHED,
    FREE,
    HELD,
    INBOX,
    INBOX_N,
    KV_EVENT,
    NEXT_ARRIVAL,
    NEXT_TURN,
    NOW,
    NUM_ENDED,
    NUM_FINISHED,
    OUTBOX,
    OUTBOX_N,
    REASON,
    REMOTE,
    REMOTE_PENDING,
    STATUS,
    THINK,
    TURNS,
    TURNS_N,
    State,
)


@no_alloc_kernel
def grow_to(s: State, block_size: int, rid: int, num_tokens: int) -> bool:
    """Make ``rid`` hold enough blocks for ``num_tokens``; False if memory is short. Blocks
    counted, not named: with prefix caching, :func:`grow_named` (a caller that may take
    named blocks says so; the named path reachable from every admission slowed every run)."""
    held = s.req[HELD]
    need = -(-num_tokens // block_size) - held[rid]
    if need > s.si[FREE]:
        return False
    if need > 0:
        held[rid] += need
        s.si[FREE] -= need
    return True


@no_alloc_kernel
def grow_named(s: State, block_size: int, rid: int, num_tokens: int) -> bool:
    """:func:`grow_to` on a named pool (prefix caching): new blocks taken by name."""
    need = -(-num_tokens // block_size) - s.req[HELD, rid]
    if need > s.si[FREE]:
        return False
    if need > 0:
        pc.take(s, rid, need)
    return True


@no_alloc_kernel
def named(s: State) -> bool:
    """Whether the state's blocks are named (prefix caching on)."""
    return s.blocks.shape[1] > 1


@no_alloc_kernel
def release(s: State, rid: int) -> None:
    """Free every block ``rid`` holds."""
    release_as(s, rid, named(s))


@no_alloc_kernel
def release_as(s: State, rid: int, by_name: bool) -> None:
    """:func:`release` where the caller knows whether blocks are named (a decode stretch,
    which never runs with them, passes False: the named path stays out of its loop, where it
    measurably slowed every run)."""
    if by_name:
        pc.give_back(s, rid)
        return
    held = s.req[HELD]
    s.si[FREE] += held[rid]
    held[rid] = 0


@no_alloc_kernel
def end(s: State, rid: int, status: int, t: float, code: int) -> None:
    """Record that a request left the system (exactly once)."""
    assert s.req[STATUS, rid] < FINISHED, "a request ended twice"
    s.req[STATUS, rid] = status
    s.req[REASON, rid] = code
    s.times[FINISH, rid] = t
    if status == FINISHED:
        s.ids[FINISH_ORDER, s.si[NUM_FINISHED]] = rid
        s.si[NUM_FINISHED] += 1
    s.si[NUM_ENDED] += 1
    if s.req[NEXT_TURN, rid] >= 0:  # a closed-loop session: its next turn is due (sent
        s.ids[TURNS, s.si[TURNS_N]] = rid  # at the next admission of arrivals: the loop
        s.si[TURNS_N] += 1  # that sends it, inlined here, slowed every run measurably)


@no_alloc_kernel
def send_turns(s: State) -> None:
    """Send the next turn of each session whose request ended: it arrives its think time
    after that end, into the inbox after the deliveries due no later."""
    arrival, inbox, ended = s.times[ARRIVAL], s.ids[INBOX], s.ids[TURNS]
    for k in range(s.si[TURNS_N]):
        rid = s.req[NEXT_TURN, ended[k]]
        at = s.times[FINISH, ended[k]] + s.times[THINK, rid]
        arrival[rid] = at
        pos = s.si[INBOX_N]
        while pos > s.si[NEXT_ARRIVAL] and arrival[inbox[pos - 1]] > at:
            inbox[pos] = inbox[pos - 1]
            pos -= 1
        inbox[pos] = rid
        s.si[INBOX_N] += 1
    s.si[TURNS_N] = 0


@no_alloc_kernel
def report(s: State, rid: int) -> None:
    """Put ``rid`` in the outbox, stamped now: its cluster has to act on it (send its KV, or
    start the transfer into the blocks just allocated)."""
    s.times[KV_EVENT, rid] = s.sf[NOW]
    s.ids[OUTBOX, s.si[OUTBOX_N]] = rid
    s.si[OUTBOX_N] += 1


@no_alloc_kernel
def await_kv(s: State, rid: int) -> None:
    """``rid`` (a decode instance's request whose prompt a prefill instance computed) holds
    the blocks for its prompt: its transfer starts now, and until the KV lands it waits,
    skipped by admissions."""
    s.req[REMOTE, rid] = REMOTE_PENDING
    report(s, rid)


@no_alloc_kernel
def copy_ids(dst: np.ndarray, src: np.ndarray, n: int) -> None:
    """``dst[:n] = src[:n]`` as a loop (numba's slice assignment drags in string formatting
    for its shape-mismatch error, which costs a second of compile time)."""
    for i in range(n):
        dst[i] = src[i]


@no_alloc_kernel
def remove(queue: np.ndarray, n: int, rid: int) -> int:
    """Remove ``rid`` from the first n entries of ``queue``, keeping order; its position."""
    pos = 0
    while queue[pos] != rid:
        pos += 1
    for i in range(pos, n - 1):
        queue[i] = queue[i + 1]
    return pos


@no_alloc_kernel
def keep_status(queue: np.ndarray, n: int, status: np.ndarray, keep: int) -> int:
    """Drop entries whose status is not ``keep``, keeping order; the new length."""
    m = 0
    for i in range(n):
        rid = queue[i]
        if status[rid] == keep:
            queue[m] = rid
            m += 1
    return m


@no_alloc_kernel
def sort_by_key(ids: np.ndarray, n: int, key: np.ndarray, tmp: np.ndarray) -> None:
    """Sort ``ids[:n]`` by ``key[id]`` ascending, stably (a bottom-up merge sort).

    Stable, so equal keys keep queue order, exactly as ``np.argsort(kind="stable")``.
    ``tmp`` is scratch of at least n slots.
    """
    width = 1
    src, dst = ids, tmp
    in_tmp = False  # which buffer holds the sorted runs
    while width < n:
        for lo in range(0, n, 2 * width):
            mid, hi = min(lo + width, n), min(lo + 2 * width, n)
            i, j, k = lo, mid, lo
            while i < mid and j < hi:
                if key[src[j]] < key[src[i]]:  # strict: ties take the left run first
                    dst[k] = src[j]
                    j += 1
                else:
                    dst[k] = src[i]
                    i += 1
                k += 1
            while i < mid:
                dst[k] = src[i]
                i += 1
                k += 1
            while j < hi:
                dst[k] = src[j]
                j += 1
                k += 1
        src, dst = dst, src
        in_tmp = not in_tmp
        width *= 2
    if in_tmp:
        copy_ids(ids, tmp, n)


@no_alloc_kernel
def count_at_most(sorted_values: np.ndarray, x: float) -> int:
    """How many of ``sorted_values`` are <= x (``searchsorted(side="right")``)."""
    lo, hi = 0, len(sorted_values)
    while lo < hi:
        mid = (lo + hi) // 2
        if sorted_values[mid] <= x:
            lo = mid + 1
        else:
            hi = mid
    return lo
