"""The cluster loop's time order: how far an instance may run before another could reach it.

A prefill or decode instance i is advanced only through iterations that start before its
*horizon* (:func:`horizon`): the next external event (a landing, a delivery, a load
report, an arrival not yet routed) and the clock of every other prefill or decode instance
that may act. An event can reach an instance through a chain (D2 starts a transfer; when it
lands P's blocks are freed; P admits and delivers to D1), and a new transfer can make
another land earlier, but everything an instance does happens no earlier than its own next
iteration starts, so each instance sees every event at the first iteration that starts
after it, as a real one would: results do not depend on how the loop interleaves instances
(tested against a lock-step loop, every instance bounded by every other).

An instance's clock, for this purpose, is when it may next act (:func:`acts_from`): now if
anything runs or waits there; if nothing does, not before its next delivered arrival (a
cluster routes arrivals ahead of time) or the next external event, so two empty instances
never bound each other into creeping one ulp at a time. An instance idle under a policy
decided in the kernel (it waits for blocks or KV) acts only after an event, or at its next
delivered arrival: that, not its clock, bounds the others (found in review: routed ahead of
time, such an arrival woke it after a peer had run past it). Unified replicas exchange
nothing and are bounded by external events only. Decode instances exchange nothing directly
either, only through a prefill instance with work (its queue, its KV held for a transfer and
the NICs those transfers share): while no prefill instance has any, a decode peer bounds a
decode instance no earlier than the next arrival delivered to a prefill instance
(:func:`relay_from`; with Kairos, which deflects most requests, the two decode instances no
longer step each other one iteration at a time).
"""

from __future__ import annotations

import numpy as np

from cbgym.cluster.state import (
    ACTIVE,
    DECODE,
    KEYED,
    KV_OUT,
    LOCK_STEP,
    N_INST,
    PREFILL,
    ROLE,
    ClusterState,
)
from cbgym.engine import layout as L
from cbgym.engine.jit import no_alloc_kernel
from cbgym.engine.layout import State


@no_alloc_kernel
def asleep(S: State, j: int) -> bool:
    """Instance j's last iteration scheduled nothing and nothing runs there. With a policy
    decided in the kernel only an event of the cluster can change that, no earlier than the
    event: it bounds nobody's clock (else two idle instances would bound each other's and
    creep forward one ulp at a time)."""
    return S.si[j, L.IDLED] != 0 and S.si[j, L.N_RUN] == 0


@no_alloc_kernel
def next_arrival(S: State, j: int) -> float:
    """When the next request delivered to instance j arrives there (inf: none)."""
    nxt = S.si[j, L.NEXT_ARRIVAL]
    return S.times[j, L.ARRIVAL, S.ids[j, L.INBOX, nxt]] if nxt < S.si[j, L.INBOX_N] else np.inf


@no_alloc_kernel
def acts_from(S: State, j: int, t_ext: float) -> float:
    """The earliest instance j may act: now, unless nothing runs or waits there; then its
    next delivered arrival or the next external event ``t_ext``, whichever comes first."""
    now = S.sf[j, L.NOW]
    if S.si[j, L.N_RUN] > 0 or S.si[j, L.N_WAIT] > 0:
        return now
    return max(now, min(next_arrival(S, j), t_ext))


@no_alloc_kernel
def relay_from(C: ClusterState, S: State) -> float:
    """The earliest a decode instance's action can reach another decode instance: through a
    prefill instance that holds work (queued, running, or KV held for a transfer), now
    (-inf); else not before the next arrival delivered to a prefill instance (inf: none)."""
    t = np.inf
    for k in range(C.ci[N_INST]):
        if C.inst[ROLE, k] != PREFILL:
            continue
        if S.si[k, L.N_RUN] > 0 or S.si[k, L.N_WAIT] > 0 or C.inst[KV_OUT, k] > 0:
            return -np.inf
        t = min(t, next_arrival(S, k))
    return t


@no_alloc_kernel
def horizon(C: ClusterState, S: State, i: int, t_ext: float) -> float:
    """How far instance i may run: before ``t_ext`` and, unless it idles under a policy
    asked outside the kernel, the clocks of the peers that may act (module docstring)."""
    until = t_ext
    if asleep(S, i) and not C.inst[KEYED, i]:
        # (an idle instance whose policy is asked outside the kernel re-checks its queue
        # every idle tick, up to the next external event: bounding it by its peers would
        # make two such instances creep forward one ulp at a time)
        return until
    # decode instances exchange nothing directly, only through a prefill instance with
    # work: a decode peer bounds a decode instance no earlier than relay (none if inf)
    decode = C.inst[ROLE, i] == DECODE and not C.ci[LOCK_STEP]
    relay = relay_from(C, S) if decode else -np.inf
    for j in range(C.ci[N_INST]):
        if not (C.peer[i, j] and C.inst[ACTIVE, j]):
            continue
        if C.inst[KEYED, j] and asleep(S, j):
            t = next_arrival(S, j)  # only an event (bounded by t_ext) or it wakes j
        else:
            t = acts_from(S, j, t_ext)
        if decode and C.inst[ROLE, j] == DECODE:
            if relay == np.inf:
                continue
            t = max(t, relay)
        until = min(until, np.nextafter(t, np.inf))
    return until
