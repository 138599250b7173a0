"""VTC, the Virtual Token Counter (Sheng et al., "Fairness in Serving Large Language Models",
OSDI'24): fair service between tenants by counting the tokens each has received.

| rule | what VTC does |
|---|---|
| counter | one per tenant: ``w_in / weight`` per prompt token admitted, ``w_out / weight`` |
|  | per output token received (defaults 1 and 2) |
| selection | repeatedly the backlogged tenant with the smallest counter, its oldest waiting |
|  | request (its counter raised by that prompt), until one does not fit |
| lift | a tenant whose queue goes from empty to non-empty starts at least at the smallest |
|  | counter of those already backlogged: idle time earns no credit |
| victims | vLLM's default (the last admitted) |

The engine asks it at every iteration with something to decide; between two asks it reads,
from the decision point's columns, what each request it is tracking has received (requests
admitted and not yet finished, and those finished since). ``service`` holds each tenant's
received service (unweighted, without lifts) and ``history`` its values at every ask, for
the paper's bound: two tenants backlogged over an interval receive services that differ by
at most about 2 max(w_in L_in, w_out M), L_in the longest prompt, M the most tokens a batch
holds (``tests/test_fairness.py``).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping

import numpy as np

from cbgym.agents.service import ServiceMeter, check_costs, tenant_queues
from cbgym.engine.decision import Decision, DecisionPoint, Policy, PolicyContext


class VTC(Policy):
    """Virtual Token Counter (module docstring). Not privileged.

    Args:
        w_in / w_out: cost of a prompt / output token (the paper's 1 and 2).
        weights: tenant id -> weight (default 1 each): a tenant of weight 2 is due twice
            the service.
    """

    name = "vtc"
    consult = "every_iteration"

    def __init__(self, w_in: float = 1.0, w_out: float = 2.0,
                 weights: Mapping[int, float] | None = None) -> None:
        if isinstance(w_in, str) and "=" in w_in and weights is None:  # "vtc:0=2,1=1"
            w_in, weights = 1.0, w_in
        self.weights = check_costs("VTC", w_in, w_out, weights)
        self.w_in, self.w_out = float(w_in), float(w_out)

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)
        self.counter: dict[int, float] = {}
        self.meter = ServiceMeter(ctx.num_requests, self.w_in, self.w_out, self._count)
        # (time, service so far per tenant, backlogged tenants) at every ask
        self.history: list[tuple[float, dict[int, float], frozenset[int]]] = []
        self._backlogged: dict[int, set[int]] = {}  # tenant -> its waiting ids at the last ask

    @property
    def service(self) -> dict[int, float]:
        return self.meter.service

    def _weight(self, tenant: int) -> float:
        return float(self.weights.get(tenant, 1.0))

    def _count(self, tenant: int, cost: float) -> None:
        self.counter[tenant] = self.counter.get(tenant, 0.0) + cost / self._weight(tenant)

    def decide(self, dp: DecisionPoint) -> Decision:
        self.meter.read(dp)
        waiting = dp.waiting
        queues = tenant_queues(dp)
        now = set(queues)
        # backlogged throughout: some request it had waiting at the last ask still waits; any
        # other tenant with requests now has had its queue empty since (all admitted, or none
        # yet) and is lifted, in order of its oldest waiting request, each against those
        # backlogged before it (the artifact's lift on a queue going from empty to non-empty)
        waiting_now = set(waiting.tolist())
        steady = {t for t, ids in self._backlogged.items() if not ids.isdisjoint(waiting_now)}
        fresh = sorted((t for t in queues if t not in steady),
                       key=lambda t: (float(dp.arrival_s[queues[t]].min()), t))
        basis = [self.counter.setdefault(t, 0.0) for t in steady]
        for t in fresh:
            c = self.counter.setdefault(t, 0.0)
            if basis:
                self.counter[t] = c = max(c, min(basis))
            basis.append(c)
        self._backlogged = {t: set(q) for t, q in queues.items()}
        self.history.append((dp.now, dict(self.service), frozenset(now)))
        # at most max_num_seqs admissions an iteration: rank that many
        room = dp.config.max_num_seqs
        heap = [(self.counter[t], t) for t in sorted(queues)]
        heapq.heapify(heap)
        order: list[int] = []
        pos = dict.fromkeys(queues, 0)
        while heap and len(order) < room:
            c, t = heapq.heappop(heap)
            rid = queues[t][pos[t]]
            order.append(rid)
            pos[t] += 1
            if pos[t] < len(queues[t]):
                cost = self.w_in * int(dp.prompt_tokens[rid]) / self._weight(t)
                heapq.heappush(heap, (c + cost, t))
        return Decision(order=np.array(order, np.int64))
