"""Fair queueing between tenants: deficit round robin and weighted fair queueing.

Both charge a request its prompt, ``w_in`` per token (what is known at admission; output
lengths are not), and share admissions between backlogged tenants by weight.

| policy | rule |
|---|---|
| ``drr`` | Shreedhar & Varghese's deficit round robin: the backlogged tenants in a round; each |
|  | visit adds ``quantum x weight`` to the tenant's deficit and admits its oldest requests |
|  | while their cost fits the deficit; an emptied queue forfeits its deficit |
| ``wfq`` | self-clocked weighted fair queueing: a request seen waiting is tagged |
|  | F = max(V, F of the tenant's previous request) + cost / weight, the smallest tag first; |
|  | V is the tag of the last request admitted |

The engine asks them at every iteration with something to decide. A decision's order is a
plan; the engine admits a prefix of it (admission stops at the first request that does not
fit, or skips one that cannot start), so DRR keeps its state after each planned admission
and, at the next ask, keeps the one after the last planned request now running or done
(a skipped one's cost back in its tenant's deficit). WFQ's virtual
time follows the requests admitted for the first time
(:class:`~cbgym.agents.service.ServiceMeter`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from cbgym.agents.service import ServiceMeter, check_costs, number, tenant_queues
from cbgym.engine.decision import Decision, DecisionPoint, Policy, PolicyContext


class DRR(Policy):
    """Deficit round robin (module docstring). ``quantum``: cost units a visit adds (one
    per prompt token with ``w_in=1``); ``weights``: tenant id -> weight (default 1)."""

    name = "drr"
    consult = "every_iteration"

    def __init__(self, quantum: float = 512.0, weights: Mapping[int, float] | None = None,
                 w_in: float = 1.0) -> None:
        if isinstance(quantum, str) and "=" in quantum and weights is None:  # "drr:0=2,1=1"
            quantum, weights = 512.0, quantum
        quantum = number("DRR", "quantum", quantum, positive=True)
        self.weights = check_costs("DRR", w_in, 0.0, weights)
        self.quantum, self.w_in = float(quantum), float(w_in)

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)
        self.meter = ServiceMeter(ctx.num_requests, self.w_in, 0.0)
        # the round: tenants in visiting order, the next to visit, whether its quantum
        # was added already (a visit cut short by a full batch goes on at the next ask)
        self.state: tuple[dict[int, float], list[int], int, bool] = ({}, [], 0, False)
        self._plan: list[int] = []
        self._after: list[tuple[dict[int, float], list[int], int, bool]] = []
        self._costs: list[tuple[int, float]] = []  # each planned request's tenant and cost

    def decide(self, dp: DecisionPoint) -> Decision:
        self.meter.read(dp)
        # the plan's prefix the engine admitted: running now, or done already (a preempted
        # request re-admitted counts too: it cost the tenant its deficit again)
        admitted = self.meter.started(dp)
        # the round as after the last planned request the engine admitted; a planned request
        # it passed over before that one (it may skip one that cannot start, e.g. KV still in
        # transfer) keeps its cost in its tenant's deficit
        last = max((j for j, rid in enumerate(self._plan) if rid in admitted), default=-1)
        if last >= 0:
            deficit, ring, pos, in_visit = self._after[last]
            deficit = dict(deficit)
            for rid, (t, cost) in zip(self._plan[:last], self._costs[:last], strict=True):
                if rid not in admitted and t in deficit:
                    deficit[t] += cost
            self.state = (deficit, ring, pos, in_visit)
        queues = tenant_queues(dp)
        deficit, ring, pos, in_visit = self.state
        deficit, ring = dict(deficit), list(ring)
        # tenants whose queue emptied leave the round (their deficit forfeited); new ones
        # join at its tail, just before the next to visit, oldest waiting request first
        keep = [t for t in ring if t in queues]
        if pos < len(ring) and ring[pos] not in queues:
            in_visit = False
        pos = sum(1 for t in ring[:pos] if t in queues)
        new = sorted((t for t in queues if t not in keep),
                     key=lambda t: (float(dp.arrival_s[queues[t]].min()), t))
        ring = keep[:pos] + new + keep[pos:]
        pos += len(new)  # (keep[pos] stays the next to visit, or the one in its visit)
        for t in list(deficit):
            if t not in queues:
                del deficit[t]
        plan, after, costs = [], [], []
        heads = dict.fromkeys(queues, 0)
        room = dp.config.max_num_seqs
        while ring and len(plan) < room:
            pos %= len(ring)
            t = ring[pos]
            if not in_visit:
                deficit[t] = deficit.get(t, 0.0) + self.quantum * self.weights.get(t, 1.0)
                in_visit = True
            q = queues[t]
            cost = self.w_in * int(dp.prompt_tokens[q[heads[t]]])
            if cost <= deficit[t]:
                plan.append(q[heads[t]])
                costs.append((t, cost))
                deficit[t] -= cost
                heads[t] += 1
                if heads[t] == len(q):  # emptied: out of the round, deficit forfeited
                    del deficit[t]
                    ring.pop(pos)
                    in_visit = False
                elif self.w_in * int(dp.prompt_tokens[q[heads[t]]]) > deficit[t]:
                    pos, in_visit = pos + 1, False  # its visit ends with this one
                after.append((dict(deficit), list(ring), pos, in_visit))
                continue
            pos, in_visit = pos + 1, False
        # (committed at the next ask, as far as the engine admitted; nothing admitted: no
        # visit took place, the round stands)
        self._plan, self._after, self._costs = plan, after, costs
        return Decision(order=np.array(plan, np.int64))


class WFQ(Policy):
    """Self-clocked weighted fair queueing (module docstring); ``weights``: tenant id ->
    weight (default 1)."""

    name = "wfq"
    consult = "every_iteration"

    def __init__(self, weights: Mapping[int, float] | None = None, w_in: float = 1.0) -> None:
        self.weights = check_costs("WFQ", w_in, 0.0, weights)
        self.w_in = float(w_in)

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)
        self.meter = ServiceMeter(ctx.num_requests, self.w_in, 0.0)
        self.tag = np.full(ctx.num_requests, np.nan)
        self._last: dict[int, float] = {}
        self.virtual = 0.0

    def decide(self, dp: DecisionPoint) -> Decision:
        for rid in self.meter.read(dp):
            self.virtual = max(self.virtual, float(self.tag[rid]))
        waiting = dp.waiting
        for rid in waiting.tolist():
            if np.isnan(self.tag[rid]):
                t = int(dp.tenant[rid])
                cost = self.w_in * int(dp.prompt_tokens[rid]) / self.weights.get(t, 1.0)
                self.tag[rid] = self._last[t] = max(self.virtual, self._last.get(t, 0.0)) + cost
        order = waiting[np.lexsort((waiting, self.tag[waiting]))]
        return Decision(order=order)
