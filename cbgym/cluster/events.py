"""The cluster's event heap and what feeds it: instances' outboxes, the edge's timers.

Events are ordered by time, then kind (``cbgym.cluster.state``'s event kinds: one instant's
prompt chunks, prefills done, sheds and allocations before the edge's timers and retries),
then push order, so a run is the same whatever order the loop found them in.
"""

from __future__ import annotations

from cbgym.cluster.state import (
    ALLOC,
    CHUNK,
    D_SHED,
    DONE,
    H_COMPUTED,
    H_KIND,
    H_RID,
    H_SEQ,
    HEAP_N,
    P_SHED,
    PREFILL,
    ROLE,
    SEQ,
    ClusterState,
)
from cbgym.engine import layout as L
from cbgym.engine.jit import no_alloc_kernel
from cbgym.engine.layout import State


@no_alloc_kernel
def before(C: ClusterState, a: int, b: int) -> bool:
    """Heap entry a comes first: by time, then kind, then push order."""
    ta, tb = C.heap_t[a], C.heap_t[b]
    if ta != tb:
        return ta < tb
    ka, kb = C.heap[H_KIND, a], C.heap[H_KIND, b]
    return ka < kb if ka != kb else C.heap[H_SEQ, a] < C.heap[H_SEQ, b]


@no_alloc_kernel
def swap(C: ClusterState, a: int, b: int) -> None:
    C.heap_t[a], C.heap_t[b] = C.heap_t[b], C.heap_t[a]
    for r in range(C.heap.shape[0]):
        C.heap[r, a], C.heap[r, b] = C.heap[r, b], C.heap[r, a]


@no_alloc_kernel
def push(C: ClusterState, t: float, kind: int, rid: int, computed: int) -> None:
    k = C.si[HEAP_N]
    C.heap_t[k] = t
    C.heap[H_KIND, k], C.heap[H_SEQ, k], C.heap[H_RID, k] = kind, C.si[SEQ], rid
    C.heap[H_COMPUTED, k] = computed
    C.si[SEQ] += 1
    C.si[HEAP_N] = k + 1
    while k > 0 and before(C, k, (k - 1) // 2):
        swap(C, k, (k - 1) // 2)
        k = (k - 1) // 2


@no_alloc_kernel
def pop(C: ClusterState) -> None:
    """Remove the first entry (read it at index 0 before)."""
    n = C.si[HEAP_N] - 1
    C.si[HEAP_N] = n
    swap(C, 0, n)
    k = 0
    while True:
        c = 2 * k + 1
        if c >= n:
            break
        if c + 1 < n and before(C, c + 1, c):
            c += 1
        if not before(C, c, k):
            break
        swap(C, k, c)
        k = c


@no_alloc_kernel
def outbox_event(C: ClusterState, s: State, i: int, rid: int) -> None:
    """Push the event instance i's outbox entry for ``rid`` stands for, at its time."""
    t = s.times[L.KV_EVENT, rid]
    status = s.req[L.STATUS, rid]
    if C.inst[ROLE, i] == PREFILL:
        kind = P_SHED if status == L.SHED else DONE if status == L.FINISHED else CHUNK
        push(C, t, kind, rid, s.req[L.COMPUTED, rid])
    else:
        push(C, t, D_SHED if status == L.SHED else ALLOC, rid, 0)


@no_alloc_kernel
def read_outbox(C: ClusterState, s: State, i: int) -> None:
    """Turn instance i's outbox into events at the times they happened."""
    for k in range(s.si[L.OUTBOX_N]):
        outbox_event(C, s, i, s.ids[L.OUTBOX, k])
    s.si[L.OUTBOX_N] = 0
