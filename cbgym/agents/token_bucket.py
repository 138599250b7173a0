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

from cbgym.agents.service import ServiceMeter, tenant_map
from cbgym.engine.decision import Decision, DecisionPoint, Policy, PolicyContext


class TokenBucket(Policy):
    """Per-tenant token buckets (module docstring).

    Args:
        rates: tenant id -> prompt tokens per second (a spec: ``"token-bucket:0=RATE[/DEPTH],
            1=RATE"``).
        depths: tenant id -> bucket size in tokens (default: one second of its rate).
    """

    name = "token-bucket"
    consult = "every_iteration"

    def __init__(self, rates: Mapping[int, float] | None = None,
                 depths: Mapping[int, float] | None = None) -> None:
        if isinstance(rates, str) and depths is None:  # a spec: "0=RATE[/DEPTH],1=RATE"
            pairs = [item.partition("=") for item in rates.split(",")]
            rates = ",".join(f"{t}{eq}{v.partition('/')[0]}" for t, eq, v in pairs)
            depths = ",".join(f"{t}{eq}{v.partition('/')[2]}" for t, eq, v in pairs
                              if v.partition("/")[2])
        self.rates = tenant_map("token-bucket", "rates", rates)
        self.depths = tenant_map("token-bucket", "depths", depths)
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
