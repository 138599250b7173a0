"""Per-tenant token buckets: a rate limit on the prompt tokens each tenant has admitted.

A tenant's bucket holds at most ``depth`` tokens and refills at ``rate`` prompt tokens per
second; a waiting request is admitted (in queue order, FCFS otherwise) only if its tenant's
bucket holds its prompt, which the admission takes out; a tenant's requests stay in their
order (one held holds the tenant's later ones). A prompt larger than the bucket goes once the
bucket is full, leaving it in debt. Requests of a tenant without a bucket are never held.
Over any interval of length T a tenant is admitted at most ``depth + rate T`` prompt tokens
(plus one prompt's excess over the depth; ``tests/test_fairness.py``); held requests wait
(shedding them with a 429 is admission control's job).

The engine asks at every iteration with something to decide; the order is a plan of which
the engine admits a prefix, so the buckets are charged at the next ask for what was admitted
(the plan's requests now running or done).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from cbgym.agents.service import ServiceMeter
from cbgym.engine.decision import Decision, DecisionPoint, Policy, PolicyContext


class TokenBucket(Policy):
    """Per-tenant token buckets (module docstring).

    Args:
        rates: tenant id -> prompt tokens per second.
        depths: tenant id -> bucket size in tokens (default: one second of its rate).
    """

    name = "token-bucket"
    consult = "every_iteration"

    def __init__(self, rates: Mapping[int, float] | None = None,
                 depths: Mapping[int, float] | None = None) -> None:
        self.rates = dict(rates or {})
        self.depths = dict(depths or {})
        for label, table in (("rates", self.rates), ("depths", self.depths)):
            for t, v in table.items():
                if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < np.inf:
                    raise ValueError(f"token-bucket {label}[{t!r}]={v!r}: expected tokens > 0")
        unknown = set(self.depths) - set(self.rates)
        if unknown:
            raise ValueError(f"token-bucket depths for tenants without a rate: {sorted(unknown)}")

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)
        self.meter = ServiceMeter(ctx.num_requests, 1.0, 0.0)
        self.level = {t: self.depth(t) for t in self.rates}
        self._at = 0.0
        self._plan: list[int] = []

    def depth(self, tenant: int) -> float:
        return float(self.depths.get(tenant, self.rates[tenant]))

    def decide(self, dp: DecisionPoint) -> Decision:
        self.meter.read(dp)
        admitted = self.meter.started(dp)
        for rid in self._plan:  # charge what the engine admitted of the last plan
            if rid not in admitted:
                break
            t = int(dp.tenant[rid])
            if t in self.level:
                self.level[t] -= int(dp.prompt_tokens[rid])
        dt, self._at = dp.now - self._at, dp.now
        for t in self.level:
            self.level[t] = min(self.depth(t), self.level[t] + self.rates[t] * dt)
        left = dict(self.level)
        held: set[int] = set()
        plan: list[int] = []
        for rid in dp.waiting.tolist():
            t = int(dp.tenant[rid])
            need = int(dp.prompt_tokens[rid])
            if t in left:
                full = left[t] >= self.depth(t)  # (a prompt larger than the bucket: when full)
                if t in held or (need > left[t] and not full):
                    held.add(t)  # held, and the tenant's later requests behind it
                    continue
                left[t] -= need
            plan.append(rid)
        self._plan = plan
        return Decision(order=np.array(plan, np.int64))
