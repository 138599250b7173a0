"""What a cluster does to one of its instances: deliver a request, release sent KV, land KV.

A standalone engine never calls these. An instance of a cluster (``layout.new_state(...,
routed=True)``) starts with an empty inbox; its cluster delivers each request it routes
there (:func:`deliver`), in time order, and acts on the instance's outbox: a prefill
instance reports each request whose prompt it computed (the KV is sent; :func:`release_kv`
frees the blocks once the transfer has landed), a decode instance reports each remote
request it has just allocated blocks for (the transfer into them starts; :func:`kv_landed`
when it lands). vLLM's disaggregated prefill: ``../shared/reference/cluster-disaggregation.md``.
"""

from __future__ import annotations

from cbgym.engine import prefix_cache as pc
from cbgym.engine.jit import no_alloc_kernel
from cbgym.engine.kutil import end, named, release
from cbgym.engine.layout import (
    ARRIVAL,
    CHANGED,
    CHUNK_CAP,
    IDLED,
    INBOX,
    INBOX_N,
    KEEP_KV,
    KERNEL_POLICY,
    NEXT_ARRIVAL,
    OUTBOX_N,
    OUTPUT,
    PENDING,
    PLAN_VALID,
    RANK,
    REMOTE,
    REMOTE_READY,
    SHED,
    STATUS,
    TOKENS,
    UNTIL,
    WAITING,
    State,
)
from cbgym.engine.transitions import shed


@no_alloc_kernel
def deliver(s: State, rid: int, t: float, output: int, keep_kv: bool, remote: int,
            chunk_cap: int, rank: int) -> None:
    """``rid`` arrives here at ``t``, to produce ``output`` tokens (1 on a prefill instance:
    vLLM's proxy sends it with max_tokens=1), keeping its blocks when it ends (``keep_kv``),
    its prompt's KV computed here or remote (``layout.LOCAL`` / ``REMOTE_NEW``), at most
    ``chunk_cap`` prompt tokens an iteration (0: the token budget's).

    The inbox stays in arrival order: a delivery later than requests already delivered but
    not yet arrived (a cluster routes arrivals ahead of time) goes before them; among
    deliveries of one instant, by ``rank`` (0 first: its cluster's events before
    arrivals), then in delivery order. It never goes before a request that has arrived."""
    assert s.req[STATUS, rid] == PENDING, "a request delivered twice to one instance"
    arrival, inbox, rank_of = s.times[ARRIVAL], s.ids[INBOX], s.req[RANK]
    n = s.si[INBOX_N]
    pos = n
    while pos > s.si[NEXT_ARRIVAL] and (
            arrival[inbox[pos - 1]] > t
            or (arrival[inbox[pos - 1]] == t and rank_of[inbox[pos - 1]] > rank)):
        inbox[pos] = inbox[pos - 1]
        pos -= 1
    assert pos == 0 or arrival[inbox[pos - 1]] <= t, "a delivery before an arrived request"
    arrival[rid] = t
    s.req[OUTPUT, rid] = output
    s.req[KEEP_KV, rid] = keep_kv
    s.req[REMOTE, rid] = remote
    s.req[CHUNK_CAP, rid] = chunk_cap
    rank_of[rid] = rank
    inbox[pos] = rid
    s.si[INBOX_N] = n + 1
    s.si[IDLED] = 0


@no_alloc_kernel
def release_kv(s: State, rid: int) -> None:
    """The KV of ``rid`` (a prefill instance's, ended) has been read: free its blocks."""
    release(s, rid)
    s.si[PLAN_VALID] = 0
    s.si[CHANGED] = 1
    s.si[IDLED] = 0


@no_alloc_kernel
def kv_landed(s: State, rid: int, block_size: int) -> None:
    """The KV of ``rid`` (waiting here for it) has landed: its 1-token step can be admitted.
    With prefix caching its prompt's full blocks are registered now (vLLM caches a received
    request's blocks then, all but the last token, whose block, if full, it registers when
    the 1-token step is scheduled: here at once)."""
    if s.req[STATUS, rid] == WAITING:  # (it may have been shed meanwhile)
        if named(s):
            pc.cache_full(s, rid, s.req[TOKENS, rid], block_size)
        s.req[REMOTE, rid] = REMOTE_READY
        s.si[CHANGED] = 1
        s.si[IDLED] = 0


@no_alloc_kernel
def drop(s: State, rid: int, t: float, code: int) -> None:
    """``rid`` was shed on its other instance (a pipelined prefill instance): end it here too,
    whether it waits here or has not arrived yet; its blocks come back."""
    if s.req[STATUS, rid] == PENDING:
        release(s, rid)
        end(s, rid, SHED, t, code)
    elif s.req[STATUS, rid] == WAITING:
        shed(s, rid, code)
    s.si[CHANGED] = 1
    s.si[IDLED] = 0


@no_alloc_kernel
def decided_in_kernel(s: State, flag: bool) -> None:
    """Mark the instance's local policy as decided in the kernel (``layout.KERNEL_POLICY``)."""
    s.si[KERNEL_POLICY] = flag


@no_alloc_kernel
def set_horizon(s: State, until: float) -> None:
    """Stop before any iteration that would start at or after ``until``; empty the outbox
    (its events have been read)."""
    s.sf[UNTIL] = until
    s.si[OUTBOX_N] = 0


__all__ = ["decided_in_kernel", "deliver", "drop", "kv_landed", "release_kv", "set_horizon"]
