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

The kernels are :mod:`cbgym.cluster.link_ops` (the compiled cluster loop calls them directly);
:class:`Link` is their Python door, for tests and for reading a link's state.

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

from cbgym.cluster import link_ops as ops
from cbgym.cluster.state import (
    DST,
    LEFT,
    LN,
    NOW,
    RATE,
    SRC,
    TID,
    LinkState,
    grow_link,
    new_link,
)
from cbgym.engine.jit import bind


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
        self._setup = setup
        self.state: LinkState = new_link(nic, setup)
        lk = self.state
        self._start = bind(ops.start, lk, 0, 0, 0, 0.0, 0.0)
        self._advance = bind(ops.advance, lk, 0.0)
        self._next = bind(ops.next_event_time, lk)

    # -- read-only state ----------------------------------------------------------------------
    def _col(self, row: np.ndarray) -> np.ndarray:
        return row[: self.state.si[LN]]

    @property
    def now(self) -> float:
        return float(self.state.sf[NOW])

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
        return int(self.state.si[LN])

    def __contains__(self, tid: object) -> bool:
        return isinstance(tid, int | np.integer) and self._find(int(tid)) >= 0

    def tids(self) -> tuple[int, ...]:
        """Transfers in flight, by tid."""
        return tuple(self._col(self.state.i[TID]).tolist())

    def bytes_left(self, tid: int) -> float:
        return float(self.state.f[LEFT, self._index(tid)])

    def rate(self, tid: int) -> float:
        return float(self.state.f[RATE, self._index(tid)])

    def in_flight(self, instance: int) -> tuple[int, int]:
        """(transfers out of, transfers into) ``instance`` in flight, in setup included."""
        i = self._instance(instance, "instance")
        src, dst = self._col(self.state.i[SRC]), self._col(self.state.i[DST])
        return int(np.count_nonzero(src == i)), int(np.count_nonzero(dst == i))

    def load(self) -> LinkLoad:
        n, lk = self._n, self.state
        s, d = self._col(lk.i[SRC]), self._col(lk.i[DST])
        left, rate = self._col(lk.f[LEFT]), self._col(lk.f[RATE])
        return LinkLoad(
            _frozen(np.bincount(s, left, n)),
            _frozen(np.bincount(d, left, n)),
            _frozen(np.bincount(s, rate, n)),
            _frozen(np.bincount(d, rate, n)),
            _frozen(np.bincount(s, minlength=n)),
            _frozen(np.bincount(d, minlength=n)),
        )

    def next_event_time(self) -> float:
        """Earliest time a setup ends or a transfer lands under current shares; inf if none.
        The clock itself while landings seen by ``start`` await the next ``advance``, so an
        event loop keyed on this time never strands them."""
        return float(self._next(self.state))

    # -- mutation -----------------------------------------------------------------------------
    def start(self, tid: int, src: int, dst: int, nbytes: float, now: float) -> None:
        """Start a transfer at ``now`` (>= the clock; the clock is moved there first, and
        transfers landing on the way are returned by the next ``advance``)."""
        tid = operator.index(tid)
        s = self._instance(src, "src")
        d = self._instance(dst, "dst")
        if s == d:
            raise ValueError(f"src, dst: expected different instances, got {s} for both")
        b = float(nbytes)
        if not (math.isfinite(b) and b >= 0):
            raise ValueError(f"nbytes: expected a finite value >= 0, got {nbytes!r}")
        now = self._time(now, "now")
        if tid in self:
            raise ValueError(f"tid: expected a tid not in flight, got {tid} (already in flight)")
        if len(self) + 1 >= self.state.i.shape[1]:
            self.state = grow_link(self.state)
        self._start(self.state, np.int64(tid), np.int64(s), np.int64(d), b, now)

    def advance(self, t: float) -> list[int]:
        """Move the clock to ``t``, processing every join and landing on the way in order and
        re-sharing at each; return the tids landed at or before ``t`` (time order, ties by tid)."""
        t = self._time(t, "t")
        k = self._advance(self.state, t)
        return self.state.out[:k].tolist()

    # -- internals ----------------------------------------------------------------------------
    def _find(self, tid: int) -> int:
        hit = np.flatnonzero(self._col(self.state.i[TID]) == tid)
        return int(hit[0]) if hit.size else -1

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
        if t < self.now:
            raise ValueError(f"{name}: expected a time >= the clock {self.now!r}, got {t!r}")
        return t
