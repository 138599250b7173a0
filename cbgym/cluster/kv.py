"""The KV handoff between a prefill instance P and a decode instance D, in both link modes.

* ``bulk`` (vLLM's NixlConnector): P computes the whole prompt; D receives the request then,
  allocates blocks for the prompt when its scheduler reaches it, and one transfer moves the
  whole prompt's KV.
* ``pipelined`` (per-chunk transfers, as the open layer-/chunk-wise pull requests of vLLM and
  TensorRT-LLM do): D receives the request when it is routed and allocates its blocks then;
  each prompt chunk P computes is sent as soon as D has blocks for it, overlapping P's next
  chunk, so only the last chunk's transfer follows the prefill.

Either way P keeps its blocks until every transfer has landed; D's 1-token step then samples
the first token. A request one side sheds is ended on the other (P's copy freed once nothing
is in flight). Compiled: the cluster loop (:mod:`cbgym.cluster.loop`) calls these on its
events; per-request state is the ``ClusterState.req`` rows of :mod:`cbgym.cluster.state`.
"""

from __future__ import annotations

import numpy as np

from cbgym.cluster import link_ops
from cbgym.cluster.state import (
    ACTIVE,
    ALLOCATED,
    AUDIT,
    BLOCK,
    BYTES,
    DECODE_I,
    DROPPED,
    INCOMING,
    INFLIGHT,
    KV_BYTES,
    KV_OUT,
    LANDS,
    LAST_TID,
    P_DONE,
    P_SHED_N,
    PIPELINED,
    PREFILL_DONE,
    PREFILL_I,
    READY,
    SENT,
    STARTS,
    T_END,
    T_START,
    ClusterState,
    instance,
)
from cbgym.engine import handoff
from cbgym.engine import layout as L
from cbgym.engine.jit import no_alloc_kernel
from cbgym.engine.layout import State


@no_alloc_kernel
def give(C: ClusterState, S: State, i: int, rid: int, t: float, out: int, keep: int,
         remote: int, cap: int, rank: int) -> None:
    """Deliver ``rid`` to instance ``i`` at ``t`` (:func:`cbgym.engine.handoff.deliver`;
    ``rank`` 0 for an event's delivery, 1 for an arrival's: events of one instant first)."""
    handoff.deliver(instance(S, i), rid, t, out, keep, remote, cap, rank)
    C.inst[ACTIVE, i] = 1


# ------------------------------------------------------------------ from P
@no_alloc_kernel
def prefill_progress(C: ClusterState, S: State, rid: int, t: float, computed: int,
                     done: bool) -> None:
    """P computed a chunk of ``rid``'s prompt (``done``: its last one) at ``t``."""
    r = C.req
    p, d = r[PREFILL_I, rid], r[DECODE_I, rid]
    if done:
        r[P_DONE, rid] = 1
        C.times[PREFILL_DONE, rid] = t
        C.inst[KV_OUT, p] += 1
    r[READY, rid] = computed
    if r[DROPPED, rid] or S.req[p, L.STATUS, rid] == L.SHED:  # (shed by the edge, P_SHED pending)
        if done and r[INFLIGHT, rid] == 0:
            free_prefill(C, S, rid)
        return
    if not C.ci[PIPELINED]:
        if done:  # D takes it now, its KV still on P
            C.inst[INCOMING, d] -= 1
            give(C, S, d, rid, t, C.output[rid], L.NO_KEEP, L.REMOTE_NEW, L.NO_CAP, L.EVENT_RANK)
        return
    if r[ALLOCATED, rid]:
        send(C, S, rid, t)


@no_alloc_kernel
def prefill_shed(C: ClusterState, S: State, rid: int, t: float) -> None:
    """P shed ``rid`` (it never fits there): a pipelined D drops its copy (the instances of
    a cluster share their shed-reason codes); a bulk D no longer expects it."""
    C.req[DROPPED, rid] = 1
    if not C.ci[PIPELINED]:
        C.inst[INCOMING, C.req[DECODE_I, rid]] -= 1
        C.si[P_SHED_N] += 1
    else:
        p, d = C.req[PREFILL_I, rid], C.req[DECODE_I, rid]
        handoff.drop(instance(S, d), rid, t, S.req[p, L.REASON, rid])
        C.inst[ACTIVE, d] = 1


# ------------------------------------------------------------------ from D
@no_alloc_kernel
def allocated_on_decode(C: ClusterState, S: State, rid: int, t: float) -> None:
    """D holds blocks for ``rid``'s prompt: what P has computed moves now, less what D's own
    prefix cache held (bulk: vLLM's NIXL connector pulls only the tokens D lacks)."""
    C.req[ALLOCATED, rid] = 1
    if not C.ci[PIPELINED]:  # (prefix caching is bulk-only: ClusterConfig)
        C.req[SENT, rid] = S.req[C.req[DECODE_I, rid], L.CACHED, rid]
    send(C, S, rid, t)


@no_alloc_kernel
def decode_shed(C: ClusterState, S: State, rid: int) -> None:
    """D shed ``rid``: P's copy is freed once its prefill is done and nothing is in flight
    (at once, unless its KV had landed already: P freed it then)."""
    if C.req[DROPPED, rid]:
        return  # (dropped already, from P's side: that side frees P's copy)
    C.req[DROPPED, rid] = 1
    if C.req[P_DONE, rid] and C.req[INFLIGHT, rid] == 0 and np.isnan(C.times[T_END, rid]):
        free_prefill(C, S, rid)


# ------------------------------------------------------------------ the link
@no_alloc_kernel
def send(C: ClusterState, S: State, rid: int, t: float) -> None:
    r = C.req
    p, d = r[PREFILL_I, rid], r[DECODE_I, rid]
    tokens = r[READY, rid] if C.ci[PIPELINED] else C.prompt[rid]
    tokens -= r[SENT, rid]
    if tokens <= 0:
        return
    if C.ci[AUDIT]:  # D holds blocks for the whole prompt, P still its copy of what moves
        assert S.req[d, L.HELD, rid] == -(-C.prompt[rid] // C.inst[BLOCK, d]), "audit: D"
        assert S.req[p, L.HELD, rid] >= -(-(r[SENT, rid] + tokens) // C.inst[BLOCK, p]), (
            "audit: P")
        C.si[STARTS] += 1
    nbytes = tokens * C.inst[KV_BYTES, p]
    if np.isnan(C.times[T_START, rid]):
        C.times[T_START, rid] = t
    r[BYTES, rid] += nbytes
    r[SENT, rid] += tokens
    r[INFLIGHT, rid] += 1
    C.si[LAST_TID] += 1
    C.tid_rid[C.si[LAST_TID]] = rid
    link_ops.start(C.link, C.si[LAST_TID], p, d, float(nbytes), t)


@no_alloc_kernel
def landed(C: ClusterState, S: State, tid: int, t: float) -> None:
    """Transfer ``tid`` landed at ``t``: once all of a request's KV is on D, P frees its
    copy and D admits the request's 1-token step."""
    r = C.req
    rid = C.tid_rid[tid]
    r[INFLIGHT, rid] -= 1
    complete = (r[P_DONE, rid] != 0 and r[INFLIGHT, rid] == 0
                and r[SENT, rid] == C.prompt[rid])
    if r[DROPPED, rid]:
        if r[P_DONE, rid] and r[INFLIGHT, rid] == 0:
            free_prefill(C, S, rid)
        return
    if not complete:
        return
    d = r[DECODE_I, rid]
    if S.req[d, L.STATUS, rid] == L.SHED:  # (killed by the edge, its D_SHED pending)
        free_prefill(C, S, rid)
        C.times[T_END, rid] = t
        return
    C.times[T_END, rid] = t
    if C.ci[AUDIT]:
        p = r[PREFILL_I, rid]
        held, free = S.req[p, L.HELD, rid], S.si[p, L.FREE]
        free_prefill(C, S, rid)
        # (a named block another request on P holds stays taken)
        assert S.req[p, L.HELD, rid] == 0 and (S.si[p, L.FREE] == free + held or (
            S.blocks.shape[2] > 1 and free <= S.si[p, L.FREE] <= free + held)), "audit: landing"
        assert S.req[d, L.HELD, rid] == -(-C.prompt[rid] // C.inst[BLOCK, d]), "audit: D kept"
        C.si[LANDS] += 1
    else:
        free_prefill(C, S, rid)
    handoff.kv_landed(instance(S, d), rid, C.inst[BLOCK, d])
    C.inst[ACTIVE, d] = 1


@no_alloc_kernel
def free_prefill(C: ClusterState, S: State, rid: int) -> None:
    p = C.req[PREFILL_I, rid]
    handoff.release_kv(instance(S, p), rid)
    C.inst[KV_OUT, p] -= 1
    assert C.inst[KV_OUT, p] >= 0, "a prefill instance's KV freed twice"
    C.inst[ACTIVE, p] = 1
