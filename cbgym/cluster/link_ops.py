"""The link's kernels: max-min fair NIC sharing of KV transfers (the model is
:mod:`cbgym.cluster.link`'s docstring; :class:`~cbgym.cluster.link.Link` is their Python door).

State is a :class:`~cbgym.cluster.state.LinkState`: the transfers in flight as parallel rows
sorted by tid (so the water-filling order, and even its rounding, depend only on the set of
transfers), each row's first ``si[LN]`` columns in use.
"""

from __future__ import annotations

import numpy as np

from cbgym.cluster.state import (
    CACHED,
    CACHED_OK,
    DST,
    JOIN,
    JOINED,
    LEFT,
    LN,
    NOW,
    PEND_N,
    RATE,
    SETUP_S,
    SRC,
    TID,
    LinkState,
)
from cbgym.engine.jit import no_alloc_kernel

# Remaining time, relative to the time a transfer has shared so far, under which it has landed.
REL_TOL = 1e-12
# ... plus this many ulps of the clock: the rounding of the event times themselves.
CLOCK_ULPS = 4.0


@no_alloc_kernel
def next_event_time(lk: LinkState) -> float:
    """Earliest time a setup ends or a transfer lands under current shares; inf if none.
    The clock itself while landings seen by :func:`start` await the next :func:`advance`."""
    if lk.si[PEND_N] > 0:
        return lk.sf[NOW]
    if lk.si[CACHED_OK] == 0:  # (the loop asks far more often than the link changes)
        lk.sf[CACHED] = next_change(lk)
        lk.si[CACHED_OK] = 1
    return lk.sf[CACHED]


@no_alloc_kernel
def next_change(lk: LinkState) -> float:
    """The next join or landing, ignoring landings already awaiting :func:`advance`."""
    t = np.inf
    now, left, join, rate, joined = lk.sf[NOW], lk.f[LEFT], lk.f[JOIN], lk.f[RATE], lk.i[JOINED]
    for k in range(lk.si[LN]):
        if joined[k] == 0:
            t = min(t, join[k])
    for k in range(lk.si[LN]):
        if joined[k] != 0 and rate[k] > 0:
            # the same expression as move's `due`, so the transfer defining the event lands
            t = min(t, now + left[k] / rate[k])
    return t


@no_alloc_kernel
def start(lk: LinkState, tid: int, src: int, dst: int, nbytes: float, now: float) -> None:
    """Start a transfer at ``now`` (>= the clock; the clock is moved there first, and
    transfers landing on the way are returned by the next :func:`advance`). The caller
    checked the arguments and that a row is free."""
    lk.si[CACHED_OK] = 0
    if now > lk.sf[NOW]:
        lk.si[PEND_N] = run_until(lk, now, lk.pend, lk.si[PEND_N])
    n = lk.si[LN]
    assert n < lk.i.shape[1], "link: no free row (the cluster grows it first)"
    tids = lk.i[TID]
    pos = n
    while pos > 0 and tids[pos - 1] > tid:
        pos -= 1
    assert pos == 0 or tids[pos - 1] != tid, "link: a tid already in flight"
    for k in range(n, pos, -1):
        for r in range(lk.i.shape[0]):
            lk.i[r, k] = lk.i[r, k - 1]
        for r in range(lk.f.shape[0]):
            lk.f[r, k] = lk.f[r, k - 1]
    join = now + lk.sf[SETUP_S]
    joined = join <= now  # setup 0 (or below the clock's resolution): shares at once
    lk.i[TID, pos], lk.i[SRC, pos], lk.i[DST, pos], lk.i[JOINED, pos] = tid, src, dst, joined
    lk.f[LEFT, pos], lk.f[JOIN, pos], lk.f[RATE, pos] = nbytes, join, 0.0
    lk.si[LN] = n + 1
    if joined:
        reshare(lk)


@no_alloc_kernel
def advance(lk: LinkState, t: float) -> int:
    """Move the clock to ``t``, processing every join and landing on the way in order and
    re-sharing at each; the tids landed at or before ``t`` are ``lk.out[:returned]`` (time
    order, ties by tid)."""
    lk.si[CACHED_OK] = 0
    k = lk.si[PEND_N]
    for j in range(k):
        lk.out[j] = lk.pend[j]
    lk.si[PEND_N] = 0
    return run_until(lk, t, lk.out, k)


@no_alloc_kernel
def run_until(lk: LinkState, t: float, out: np.ndarray, k: int) -> int:
    # Each pass joins or lands at least one transfer, so this ends within 2n passes.
    while True:
        te = next_change(lk)
        if te > t:
            break
        k = move(lk, te, out, k)
    return move(lk, t, out, k)


@no_alloc_kernel
def move(lk: LinkState, t: float, out: np.ndarray, k: int) -> int:
    """Progress to ``t`` (no event strictly before it), then join and land what is due,
    appending landed tids to ``out`` from ``k``; the new count."""
    n = lk.si[LN]
    now = lk.sf[NOW]
    left, join, rate, joined = lk.f[LEFT], lk.f[JOIN], lk.f[RATE], lk.i[JOINED]
    clock = np.abs(now) if np.abs(now) > np.abs(t) else np.abs(t)
    ulp = np.nextafter(clock, np.inf) - clock
    land = lk.fr[0]
    any_land, any_join = False, False
    for j in range(n):
        due = joined[j] != 0 and rate[j] > 0 and now + left[j] / rate[j] <= t
        left[j] -= rate[j] * (t - now)  # rate is 0 in setup: only sharing transfers progress
        left[j] = max(left[j], 0.0)
        tol = REL_TOL * (t - join[j]) + CLOCK_ULPS * ulp
        if joined[j] == 0 and join[j] <= t:
            joined[j] = 1
            any_join = True
        # a just-joined transfer has rate 0 here, so only a zero-byte one lands at its join
        land[j] = joined[j] != 0 and (due or left[j] <= rate[j] * tol)
        any_land = any_land or land[j] != 0
    lk.sf[NOW] = t
    if any_land:
        w = 0
        for j in range(n):
            if land[j]:
                out[k] = lk.i[TID, j]
                k += 1
                continue
            for r in range(lk.i.shape[0]):
                lk.i[r, w] = lk.i[r, j]
            for r in range(lk.f.shape[0]):
                lk.f[r, w] = lk.f[r, j]
            w += 1
        lk.si[LN] = w
    if any_land or any_join:
        reshare(lk)
    return k


@no_alloc_kernel
def reshare(lk: LinkState) -> None:
    """Max-min fair rates by progressive filling: repeatedly find the resource with the
    smallest fair share (capacity left / unfrozen users), freeze its users at that share."""
    n, n2 = lk.si[LN], len(lk.cap)
    half = n2 // 2
    src, dst, joined, rate = lk.i[SRC], lk.i[DST], lk.i[JOINED], lk.f[RATE]
    cap, users, share, cnt = lk.scr[0], lk.scr[1], lk.scr[2], lk.scr[3]
    free, frz = lk.fr[0], lk.fr[1]
    nfree = 0
    for j in range(n):
        rate[j] = 0.0
        free[j] = joined[j] != 0
        nfree += free[j]
    for r in range(n2):
        cap[r] = lk.cap[r]
    while nfree > 0:
        for r in range(n2):
            users[r] = 0.0
            cnt[r] = 0.0
        for j in range(n):
            if free[j]:
                users[src[j]] += 1.0
                users[dst[j] + half] += 1.0
        f = np.inf
        for r in range(n2):
            share[r] = cap[r] / users[r] if users[r] > 0 else np.inf
            f = min(f, share[r])
        for j in range(n):
            frz[j] = free[j] != 0 and (share[src[j]] == f or share[dst[j] + half] == f)
            if frz[j]:
                rate[j] = f
                cnt[src[j]] += 1.0
                cnt[dst[j] + half] += 1.0
                free[j] = 0
                nfree -= 1
        # one multiply per resource (not k subtractions): the leftover capacity rounds once
        for r in range(n2):
            cap[r] = max(cap[r] - cnt[r] * f, 0.0)


@no_alloc_kernel
def in_flight(lk: LinkState, i: int) -> tuple[int, int]:
    """(transfers out of, transfers into) instance ``i`` in flight, in setup included."""
    out, inn = 0, 0
    for j in range(lk.si[LN]):
        out += lk.i[SRC, j] == i
        inn += lk.i[DST, j] == i
    return out, inn
