"""What each tenant has received, read from decision points: the fair policies' one meter.

Between two asks a request may have been admitted, produced tokens or finished; the meter
reads it from the decision point's columns for the requests it tracks (admitted and not yet
finished, and those finished since), so its cost per ask is the batch's size, not the
trace's. Service is VTC's cost-weighted tokens: ``w_in`` per prompt token admitted (once,
at the first admission), ``w_out`` per output token received.
"""

from __future__ import annotations

from collections.abc import Callable

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


def check_costs(owner: str, w_in: float, w_out: float,
                weights: dict[int, float] | None) -> dict[int, float]:
    """Validate a fair policy's token costs and tenant weights (a clear error naming them)."""
    for label, v in (("w_in", w_in), ("w_out", w_out)):
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < np.inf:
            raise ValueError(f"{owner} {label}={v!r}: expected a cost >= 0")
    weights = dict(weights or {})
    for t, w in weights.items():
        if isinstance(w, bool) or not isinstance(w, int | float) or not 0 < w < np.inf:
            raise ValueError(f"{owner} weights[{t!r}]={w!r}: expected a weight > 0")
    return weights
