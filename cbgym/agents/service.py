"""What each tenant has received, read from decision points: the fair policies' one meter.

Between two asks a request may have been admitted, produced tokens or finished; the meter
reads it from the decision point's columns for the requests it tracks (admitted and not yet
finished, and those finished since), so its cost per ask is the batch's size, not the
trace's. Service is VTC's cost-weighted tokens: ``w_in`` per prompt token admitted (once,
at the first admission), ``w_out`` per output token received.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from cbgym.engine.decision import DecisionPoint


class ServiceMeter:
    """Per-tenant service so far (``service``), and a callback for each charge."""

    def __init__(self, num_requests: int, w_in: float, w_out: float,
                 on_charge: Callable[[int, float], None] | None = None) -> None:
        self.w_in, self.w_out = w_in, w_out
        self.service: dict[int, float] = {}
        self._on_charge = on_charge
        self._seen = np.zeros(num_requests, np.int64)  # output tokens counted so far
        self._tracked: set[int] = set()  # admitted, not yet finished
        self._done = 0  # finished requests accounted for
        self.finished_since: list[int] = []  # finished between the last two reads

    def _charge(self, tenant: int, cost: float) -> None:
        self.service[tenant] = self.service.get(tenant, 0.0) + cost
        if self._on_charge is not None:
            self._on_charge(tenant, cost)

    def read(self, dp: DecisionPoint) -> list[int]:
        """Account for what happened since the last ask; the ids admitted since (running
        now, or finished, for the first time), in running order then completion order."""
        fresh = [int(r) for r in dp.running if int(r) not in self._tracked]
        done = [int(r) for r in dp.finished[self._done:]]
        self._done = len(dp.finished)
        self.finished_since = done
        admitted = fresh + [r for r in done if r not in self._tracked and r not in fresh]
        for rid in admitted:
            self._tracked.add(rid)
            self._charge(int(dp.tenant[rid]), self.w_in * int(dp.prompt_tokens[rid]))
        for rid in list(self._tracked):
            got = int(dp.num_generated[rid]) - self._seen[rid]
            if got:
                self._seen[rid] += got
                self._charge(int(dp.tenant[rid]), self.w_out * got)
        self._tracked.difference_update(done)
        return admitted

    def started(self, dp: DecisionPoint) -> set[int]:
        """Ids running now or finished since the last read (call after :meth:`read`): what a
        plan handed to the engine at the last ask may have had admitted."""
        return set(dp.running.tolist()) | set(self.finished_since)


def tenant_queues(dp: DecisionPoint) -> dict[int, list[int]]:
    """The waiting ids of each tenant, in queue order."""
    queues: dict[int, list[int]] = {}
    for rid in dp.waiting.tolist():
        queues.setdefault(int(dp.tenant[rid]), []).append(rid)
    return queues


def number(owner: str, label: str, v: object, positive: bool) -> float:
    """A finite number (a spec's string converted) >= 0, or > 0 with ``positive``."""
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            raise ValueError(f"{owner} {label}={v!r}: expected a number") from None
    if isinstance(v, bool) or not isinstance(v, int | float | np.number) or not (
            (0 < v if positive else 0 <= v) and v < np.inf):
        raise ValueError(f"{owner} {label}={v!r}: expected a finite number "
                         f"{'> 0' if positive else '>= 0'}")
    return float(v)


def tenant_map(owner: str, label: str, value: object, positive: bool = True
               ) -> dict[int, float]:
    """A per-tenant table: a mapping {tenant id: number}, or a spec's string ``"0=2,1=1"``
    (tenant ids ints >= 0, as ``Trace.tenant``); a bad entry is a clear error naming it."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        items = []
        for item in (x.strip() for x in value.split(",")):
            t, sep, v = item.partition("=")
            if not sep:
                raise ValueError(f"{owner} {label}: {item!r} is not TENANT=VALUE (e.g. "
                                 "'0=2,1=1')")
            items.append((t.strip(), v.strip()))
    elif isinstance(value, Mapping):
        items = list(value.items())
    else:
        raise TypeError(f"{owner} {label}: expected a mapping {{tenant: value}} or "
                        f"'TENANT=VALUE,...', got {type(value).__name__}")
    out: dict[int, float] = {}
    for t, v in items:
        integral = isinstance(t, int | np.integer) and not isinstance(t, bool)
        try:
            tenant = int(t.strip()) if isinstance(t, str) else int(t) if integral else -1
        except ValueError:
            raise ValueError(f"{owner} {label}: tenant {t!r} is not an int id") from None
        if tenant < 0:
            raise ValueError(f"{owner} {label}: tenant {t!r} is not an int id >= 0")
        if tenant in out:
            raise ValueError(f"{owner} {label}: tenant {tenant} given twice")
        out[tenant] = number(owner, f"{label}[{tenant}]", v, positive)
    return out


def check_costs(owner: str, w_in: object, w_out: object,
                weights: object) -> dict[int, float]:
    """Validate a fair policy's token costs and tenant weights (a clear error naming them);
    returns the weights as {tenant: weight > 0}."""
    number(owner, "w_in", w_in, False)
    number(owner, "w_out", w_out, False)
    return tenant_map(owner, "weights", weights)
