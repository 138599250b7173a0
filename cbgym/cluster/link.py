"""KV-cache transfers between instances of a disaggregated cluster, sharing NICs max-min fairly.

After a prefill, the decode instance pulls the request's KV cache in one bulk read (vLLM's
``NixlConnector``, ``vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py``). This
module times those transfers. Each instance has one full-duplex NIC: an egress and an ingress
resource of the same capacity. A transfer ``src -> dst`` first waits a constant ``setup_s``
(handshake, descriptor preparation; no bandwidth used), then joins the sharing: all transfers
past their setup split the NICs by max-min fairness (water-filling over the resources
``src``-egress and ``dst``-ingress), re-shared whenever a transfer joins or lands. A transfer
therefore takes ``setup_s + nbytes / min(nic[src], nic[dst])`` alone, longer under contention.

BLIS (inference-sim/inference-sim, ``--pd-transfer-contention``, issue #634 / PR #639,
``sim/cluster/pd_events.go``) divides a single total bandwidth by the number of active
transfers once, when a transfer starts, and never revisits it: a transfer that starts alone
keeps the full bandwidth even after others join, and one started in a burst stays slow after
the burst drains. This model re-shares at every join and landing and tracks per-NIC bottlenecks.

## Model quantities

| Quantity                 | Name                 | Unit | Typical          | Source / meaning     |
|--------------------------|----------------------|------|------------------|----------------------|
| NIC bandwidth, each way  | `nic_bytes_per_s[i]` | B/s  | 25e9             | IB HDR 200 Gb/s      |
| ... as measured via NIXL | `nic_bytes_per_s[i]` | B/s  | ~12e9            | NIXL, one rail (1)   |
| Setup latency            | `setup_s`            | s    | 1e-4 .. 1e-3     | calibration input    |
| Transfer size            | `nbytes`             | B    | KV B/token x len | one bulk read (2)    |
| Rate of a transfer       | `rate(tid)`          | B/s  | <= min NIC       | max-min fair share   |
| Bytes still to move      | `bytes_left(tid)`    | B    | nbytes .. 0      | progressed per event |
| Transfers in flight      | `in_flight(i)`       | -    | (out, in)        | setup included       |

(1) Measured through NVIDIA NIXL (github.com/ai-dynamo/nixl) on one rail: ~12 GB/s, about half
the InfiniBand HDR line rate of 200 Gb/s = 25 GB/s per NIC. (2) One bulk read of the whole prompt's
KV blocks after the prefill (vLLM ``NixlConnector``), so one transfer per request.

Numerics: bytes are progressed at the current rates between events. A transfer lands when the
event clock reaches its computed landing time, or when its remaining time is within ``1e-12``
of its sharing time so far plus 4 ulps of the clock: rounding in ``bytes -= rate * dt`` is of
that size, so float error never leaves a 1e-300-byte straggler alive, nor lands a transfer
measurably early (a scale of the clock alone would land a 4 ns transfer early at t = 1e4 s).
Results depend only on the set of transfers, not on the order of ``start`` calls at one
instant: state is kept sorted by tid, so even the rounding is the same.

Complexity, with ``n`` transfers in flight and ``N`` instances: ``start`` O(n) plus a
re-share; a re-share is O(min(n, 2N) * (n + N)) (each water-filling round saturates at least
one of the 2N resources and freezes at least one transfer); ``advance`` does one re-share per
join or landing it passes; ``next_event_time``, ``bytes_left``, ``rate`` and ``load`` are O(n).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

# Remaining time, relative to the time a transfer has shared so far, under which it has landed.
_REL_TOL = 1e-12
# ... plus this many ulps of the clock: the rounding of the event times themselves.
_CLOCK_ULPS = 4.0


class LinkLoad(NamedTuple):
    """Per-instance load snapshot (read-only arrays of length N), for load reports."""

    out_bytes_left: np.ndarray  # bytes still to send, transfers in setup included
    in_bytes_left: np.ndarray  # bytes still to receive
    out_rate: np.ndarray  # summed egress rate, B/s
    in_rate: np.ndarray  # summed ingress rate, B/s
    n_out: np.ndarray  # transfers out in flight (in setup included)
    n_in: np.ndarray  # transfers in in flight


def _frozen(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


class Link:
    """The NICs of a cluster and the KV transfers in flight on them (see the module docstring)."""

    def __init__(self, nic_bytes_per_s: Sequence[float], setup_s: float) -> None:
        nic = np.asarray(nic_bytes_per_s, dtype=np.float64)
        if nic.ndim != 1 or nic.size == 0:
            raise ValueError(f"nic_bytes_per_s: expected a non-empty 1-D sequence, got {nic!r}")
        if not (np.isfinite(nic).all() and (nic > 0).all()):
            raise ValueError(f"nic_bytes_per_s: expected finite values > 0, got {nic.tolist()}")
        setup = float(setup_s)
        if not (math.isfinite(setup) and setup >= 0):
            raise ValueError(f"setup_s: expected a finite value >= 0, got {setup_s!r}")
        self._n = int(nic.size)
        self._nic = _frozen(nic.copy())
        self._cap = np.concatenate([nic, nic])  # resources: egress 0..N-1, ingress N..2N-1
        self._setup = setup
        self._now = 0.0
        self._pending: list[int] = []  # landed while start() moved the clock; next advance()
        self._cached: float | None = None  # next_event_time until the link next changes
        # In-flight transfers, parallel arrays sorted by tid (deterministic water-filling order).
        self._tid = np.zeros(0, np.int64)
        self._src = np.zeros(0, np.intp)
        self._dst = np.zeros(0, np.intp)
        self._left = np.zeros(0, np.float64)
        self._join = np.zeros(0, np.float64)  # time its setup ends
        self._rate = np.zeros(0, np.float64)  # 0 while in setup
        self._joined = np.zeros(0, bool)

    # -- read-only state ----------------------------------------------------------------------
    @property
    def now(self) -> float:
        return self._now

    @property
    def num_instances(self) -> int:
        return self._n

    @property
    def setup_s(self) -> float:
        return self._setup

    @property
    def nic_bytes_per_s(self) -> np.ndarray:
        return self._nic

    def __len__(self) -> int:
        return int(self._tid.size)

    def __contains__(self, tid: object) -> bool:
        return isinstance(tid, int | np.integer) and self._find(int(tid)) >= 0

    def tids(self) -> tuple[int, ...]:
        """Transfers in flight, by tid."""
        return tuple(self._tid.tolist())

    def bytes_left(self, tid: int) -> float:
        return float(self._left[self._index(tid)])

    def rate(self, tid: int) -> float:
        return float(self._rate[self._index(tid)])

    def in_flight(self, instance: int) -> tuple[int, int]:
        """(transfers out of, transfers into) ``instance`` in flight, in setup included."""
        i = self._instance(instance, "instance")
        return int(np.count_nonzero(self._src == i)), int(np.count_nonzero(self._dst == i))

    def load(self) -> LinkLoad:
        n, s, d = self._n, self._src, self._dst
        return LinkLoad(
            _frozen(np.bincount(s, self._left, n)),
            _frozen(np.bincount(d, self._left, n)),
            _frozen(np.bincount(s, self._rate, n)),
            _frozen(np.bincount(d, self._rate, n)),
            _frozen(np.bincount(s, minlength=n)),
            _frozen(np.bincount(d, minlength=n)),
        )

    def next_event_time(self) -> float:
        """Earliest time a setup ends or a transfer lands under current shares; inf if none.
        The clock itself while landings seen by ``start`` await the next ``advance``, so an
        event loop keyed on this time never strands them."""
        if self._pending:
            return self._now
        if self._cached is None:  # (the loop asks far more often than the link changes)
            self._cached = self._next_change() if self._tid.size else math.inf
        return self._cached

    def _next_change(self) -> float:
        """The next join or landing, ignoring landings already awaiting ``advance``."""
        t = math.inf
        j = self._joined
        if not j.all():
            t = float(self._join[~j].min())
        r = self._rate[j]
        if (r > 0).any():
            # Same expression as _move's `due`, so the transfer defining the event lands there.
            t = min(t, float((self._now + self._left[j][r > 0] / r[r > 0]).min()))
        return t

    # -- mutation -----------------------------------------------------------------------------
    def start(self, tid: int, src: int, dst: int, nbytes: float, now: float) -> None:
        """Start a transfer at ``now`` (>= the clock; the clock is moved there first, and
        transfers landing on the way are returned by the next ``advance``)."""
        self._cached = None
        tid = operator.index(tid)
        s = self._instance(src, "src")
        d = self._instance(dst, "dst")
        if s == d:
            raise ValueError(f"src, dst: expected different instances, got {s} for both")
        b = float(nbytes)
        if not (math.isfinite(b) and b >= 0):
            raise ValueError(f"nbytes: expected a finite value >= 0, got {nbytes!r}")
        now = self._time(now, "now")
        if now > self._now:
            self._pending += self._run_until(now)
        pos = int(np.searchsorted(self._tid, tid))
        if pos < self._tid.size and self._tid[pos] == tid:
            raise ValueError(f"tid: expected a tid not in flight, got {tid} (already in flight)")
        join = now + self._setup
        joined = join <= now  # setup 0 (or below the clock's resolution): shares at once
        self._tid = np.insert(self._tid, pos, tid)
        self._src = np.insert(self._src, pos, s)
        self._dst = np.insert(self._dst, pos, d)
        self._left = np.insert(self._left, pos, b)
        self._join = np.insert(self._join, pos, join)
        self._rate = np.insert(self._rate, pos, 0.0)
        self._joined = np.insert(self._joined, pos, joined)
        if joined:
            self._reshare()

    def advance(self, t: float) -> list[int]:
        """Move the clock to ``t``, processing every join and landing on the way in order and
        re-sharing at each; return the tids landed at or before ``t`` (time order, ties by tid)."""
        self._cached = None
        t = self._time(t, "t")
        landed, self._pending = self._pending, []
        return landed + self._run_until(t)

    # -- internals ----------------------------------------------------------------------------
    def _run_until(self, t: float) -> list[int]:
        landed: list[int] = []
        # Each pass joins or lands at least one transfer, so this ends within 2n passes.
        while (te := self._next_change()) <= t:
            landed += self._move(te)
        return landed + self._move(t)

    def _move(self, t: float) -> list[int]:
        """Progress to ``t`` (no event strictly before it), then join and land what is due."""
        j, r, left = self._joined, self._rate, self._left
        with np.errstate(divide="ignore", invalid="ignore"):
            due = j & (r > 0) & (self._now + left / r <= t)
        left -= r * (t - self._now)  # rate is 0 in setup, so only sharing transfers progress
        np.maximum(left, 0.0, out=left)
        tol = _REL_TOL * (t - self._join) + _CLOCK_ULPS * math.ulp(max(abs(self._now), abs(t)))
        self._now = t
        joins = ~j & (self._join <= t)
        j |= joins
        # A just-joined transfer has rate 0 here, so only a zero-byte one lands at its join.
        land = j & (due | (left <= r * tol))
        out: list[int] = []
        if land.any():
            out = self._tid[land].tolist()
            keep = ~land
            self._tid, self._src, self._dst = self._tid[keep], self._src[keep], self._dst[keep]
            self._left, self._join, self._rate = left[keep], self._join[keep], r[keep]
            self._joined = j[keep]
        if out or joins.any():
            self._reshare()
        return out

    def _reshare(self) -> None:
        """Max-min fair rates by progressive filling: repeatedly find the resource with the
        smallest fair share (capacity left / unfrozen users), freeze its users at that share."""
        n2 = 2 * self._n
        idx = np.flatnonzero(self._joined)
        rate = np.zeros(self._tid.size)
        src, dst = self._src[idx], self._dst[idx] + self._n
        cap = self._cap.copy()
        r = np.zeros(idx.size)
        free = np.ones(idx.size, bool)
        while free.any():
            users = np.bincount(np.concatenate([src[free], dst[free]]), minlength=n2)
            share = np.full(n2, math.inf)
            np.divide(cap, users, out=share, where=users > 0)
            f = share.min()
            tight = share == f
            frz = free & (tight[src] | tight[dst])
            r[frz] = f
            # One multiply per resource (not k subtractions): the leftover capacity rounds once.
            k = np.bincount(np.concatenate([src[frz], dst[frz]]), minlength=n2)
            cap = np.maximum(cap - k * f, 0.0)
            free &= ~frz
        rate[idx] = r
        self._rate = rate

    def _find(self, tid: int) -> int:
        pos = int(np.searchsorted(self._tid, tid))
        return pos if pos < self._tid.size and self._tid[pos] == tid else -1

    def _index(self, tid: int) -> int:
        pos = self._find(operator.index(tid))
        if pos < 0:
            raise KeyError(f"tid {tid} is not in flight (never started, or already landed)")
        return pos

    def _instance(self, i: int, name: str) -> int:
        i = operator.index(i)
        if not 0 <= i < self._n:
            raise ValueError(f"{name}: expected an instance in 0..{self._n - 1}, got {i}")
        return i

    def _time(self, t: float, name: str) -> float:
        t = float(t)
        if not math.isfinite(t):
            raise ValueError(f"{name}: expected a finite time, got {t!r}")
        if t < self._now:
            raise ValueError(f"{name}: expected a time >= the clock {self._now!r}, got {t!r}")
        return t
