"""Each request's p99 inter-token latency, exact, from the few largest gaps it needs.

The 99th percentile of a request's g gaps between tokens (numpy's default linear method,
as vLLM's benchmark computes it) reads only its order statistics at floor((g - 1) 0.99) and
the next one, so a request keeps its :func:`keep` largest gaps seen so far, as an ascending
run in ``State.gaps`` (where, how large and how full: ``req[GAP]``, packed by :func:`pack`;
``times[GAP_MIN]`` the least it keeps once full, so most gaps are turned away by one read):
two for up to 101 gaps, then about one per hundred tokens. The slots are sized from the true
output length once, when the run starts (the engine's own bookkeeping; policies never see
it). A decode stretch collects its iterations' gaps in a min-heap of its own (the first
``si[GAP_TOP]`` slots), sorts them once, and each running request takes from the top only
what can enter its run.
"""

from __future__ import annotations

import numpy as np

from cbgym.engine.jit import no_alloc_kernel

Q99 = 0.99  # np.percentile(x, 99) reads quantile 99 / 100


@no_alloc_kernel
def keep(output: int) -> int:
    """Heap slots for a request of ``output`` tokens (at most output - 1 gaps): the gaps
    above the p99's lower order statistic, at least one."""
    g = output - 1
    if g < 1:
        return 1
    return g - int(np.floor((g - 1) * Q99))


def _keeps(output: np.ndarray) -> np.ndarray:
    g = np.maximum(np.asarray(output, np.int64) - 1, 1)
    return g - np.floor((g - 1) * Q99).astype(np.int64)


def slots(output: np.ndarray) -> int:
    """The length of ``State.gaps`` for these requests: the largest run (a stretch's
    scratch) and one run per request."""
    k = _keeps(output)
    return int(k.max(initial=1) + k.sum())


def window_slots(output: np.ndarray, n: int) -> int:
    """The most :func:`slots` of any ``n`` consecutive requests (an env's episodes)."""
    k = _keeps(output)
    sums = np.convolve(k, np.ones(min(n, len(k)), np.int64), "valid")
    return int(k.max(initial=1) + sums.max(initial=0))


@no_alloc_kernel
def sift_down(buf: np.ndarray, off: int, k: int, n: int) -> None:
    """Restore the min-heap ``buf[off:off + n]`` below position k."""
    while True:
        c = 2 * k + 1
        if c >= n:
            return
        if c + 1 < n and buf[off + c + 1] < buf[off + c]:
            c += 1
        if buf[off + k] <= buf[off + c]:
            return
        buf[off + k], buf[off + c] = buf[off + c], buf[off + k]
        k = c


@no_alloc_kernel
def push(buf: np.ndarray, off: int, n: int, cap: int, x: float) -> int:
    """Offer ``x`` to the min-heap of the ``cap`` largest values ``buf[off:off + n]``; the
    new fill."""
    if n < cap:
        k = n
        buf[off + k] = x
        while k > 0 and buf[off + k] < buf[off + (k - 1) // 2]:
            p = (k - 1) // 2
            buf[off + k], buf[off + p] = buf[off + p], buf[off + k]
            k = p
        return n + 1
    if x > buf[off]:
        buf[off] = x
        sift_down(buf, off, 0, n)
    return n


# A request's run in one int64: offset << 34 | capacity << 17 | fill
# (17 bits: outputs up to 13M tokens; offsets below 2**29; fill_state checks both)
CAP_BITS = 17
MASK = (1 << CAP_BITS) - 1
MAX_OFFSET = 1 << (63 - 2 * CAP_BITS)


@no_alloc_kernel
def pack(off: int, cap: int, n: int) -> int:
    return (off << (2 * CAP_BITS)) | (cap << CAP_BITS) | n


@no_alloc_kernel
def unpack(meta: int) -> tuple[int, int, int]:
    """(offset, capacity, fill) of a packed run."""
    return meta >> (2 * CAP_BITS), (meta >> CAP_BITS) & MASK, meta & MASK


@no_alloc_kernel
def insert(buf: np.ndarray, off: int, n: int, cap: int, x: float) -> int:
    """Put ``x`` into the ascending run ``buf[off:off + n]`` of the ``cap`` largest values
    offered (dropping the least if full; the caller checked it is larger); the new fill.
    Sorted, not a heap: gaps mostly grow with the context, so ``x`` is usually the largest
    and the moves are predictable branches."""
    if n < cap:
        j = n
        while j > 0 and buf[off + j - 1] > x:
            buf[off + j] = buf[off + j - 1]
            j -= 1
        buf[off + j] = x
        return n + 1
    j = 0
    while j + 1 < cap and buf[off + j + 1] < x:
        buf[off + j] = buf[off + j + 1]
        j += 1
    buf[off + j] = x
    return n


@no_alloc_kernel
def offer(buf: np.ndarray, meta: int, x: float) -> tuple[int, float]:
    """Offer ``x`` to a request's packed run of largest gaps: its new packing, and the least
    value it keeps once full (-inf before: anything enters)."""
    off, cap, n = unpack(meta)
    n = insert(buf, off, n, cap, x)
    return (meta & ~MASK) | n, buf[off] if n == cap else -np.inf


@no_alloc_kernel
def sort_desc(buf: np.ndarray, off: int, n: int) -> None:
    """Sort the min-heap ``buf[off:off + n]`` in place, largest first (heapsort)."""
    for end in range(n - 1, 0, -1):
        buf[off], buf[off + end] = buf[off + end], buf[off]
        sift_down(buf, off, 0, end)


@no_alloc_kernel
def p99(buf: np.ndarray, off: int, n: int, g: int) -> float:
    """The p99 of a request's ``g`` gaps from the ascending run ``buf[off:off + n]`` of the
    largest (order statistics g - n ... g - 1); 0 without a gap."""
    if g < 1:
        return 0.0
    pos = (g - 1) * Q99
    lo = int(np.floor(pos))
    hi = min(lo + 1, g - 1)
    a, b = buf[off + lo - (g - n)], buf[off + hi - (g - n)]
    t = pos - lo
    d = b - a
    return b - d * (1.0 - t) if t >= 0.5 else a + d * t  # numpy's _lerp, bit for bit
