"""SLO-tier policies: two-tier strict priority and least slack first.

| policy | admits first | victim when blocks run out |
|---|---|---|
| ``strict-tiers`` | the interactive tier (SLO class 0), then the rest, | the lower tier's |
|  | each by arrival | latest arrival |
| ``least-slack`` | the least slack to its TTFT target: arrival + target, | vLLM's default (the |
|  | earliest first | last admitted) |

Both rank by a key of the request's own (its SLO class, its arrival, its class's TTFT target),
so they run inside the compiled loop. ``strict-tiers`` is vLLM's priority policy
(:class:`~cbgym.agents.Priority`) with the priority "interactive or not"; ``least-slack``
orders as ``slo-edf`` does, without its shedding. A waiting request's slack is its deadline
minus now, the same for every request's ranking at a given time, so the deadline is the key.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from cbgym.agents.priority import Priority
from cbgym.engine.decision import Decision, DecisionPoint, Policy, PolicyContext


class StrictTiers(Priority):
    """Two-tier strict priority (module docstring); the tier from the SLO class, or from the
    trace's ``priority`` column (0 interactive, anything else lower)."""

    name = "strict-tiers"

    def reset(self, ctx: PolicyContext) -> None:
        tier = None if ctx.priority is None else (np.asarray(ctx.priority) > 0).astype(np.int64)
        super().reset(dataclasses.replace(ctx, priority=tier))


class LeastSlack(Policy):
    """Least slack to the TTFT target first (module docstring). Not privileged."""

    name = "least-slack"
    consult = "on_change"

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)
        if ctx.arrival_s is None or ctx.ttft_target_s is None:
            raise ValueError("policy 'least-slack' needs each request's arrival and TTFT "
                             "target (cbgym.simulate passes them)")
        self._keys = np.asarray(ctx.arrival_s, np.float64) + np.asarray(ctx.ttft_target_s)

    def static_keys(self) -> np.ndarray:
        return self._keys

    def decide(self, dp: DecisionPoint) -> Decision:
        return Decision(priority=self._keys[dp.waiting])
