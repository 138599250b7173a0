"""SLO-EDF: earliest TTFT deadline first, and no capacity spent on requests already lost."""

from __future__ import annotations

import numpy as np

from cbgym.engine.decision import Decision, DecisionPoint, Policy, PolicyContext

DEFAULT_TTFT_S = 2.0  # cbgym.metrics.SLO's default, when the run gives no targets


class SLOEarliestDeadline(Policy):
    """Admit waiting requests by TTFT deadline (arrival + the request's TTFT target), earliest
    first, ties in queue order; shed a waiting request once its deadline has passed without a
    first token: it can no longer count toward goodput but would still take capacity.

    Content-blind: it reads arrival times, the clock and the SLO targets, which a serving
    system knows (``PolicyContext.ttft_target_s``, filled by ``cbgym.simulate`` from its
    ``slo``; 2 s each when absent). Not privileged. The deadline order alone is a static key,
    but lateness changes with the clock alone, so the engine asks at every iteration with
    someone waiting. Sheds are recorded with reason ``slo_unreachable``. The strongest
    content-blind rule the CB-SJF-Work study's setting suggests is a different one (short
    requests first, then shed the late); this one is the SLO-aware reference of the benchmark.
    """

    name = "slo-edf"
    consult = "every_iteration"

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)
        ttft = ctx.ttft_target_s
        if ttft is None:
            ttft = np.full(ctx.num_requests, DEFAULT_TTFT_S)
        self.ttft = np.asarray(ttft, dtype=np.float64)
        if self.ttft.shape != (ctx.num_requests,) or not (self.ttft > 0).all():
            raise ValueError(f"slo-edf: ttft_target_s must hold {ctx.num_requests} positive "
                             f"targets, got shape {self.ttft.shape}")

    def decide(self, dp: DecisionPoint) -> Decision:
        waiting = dp.waiting
        deadline = dp.arrival_s[waiting] + self.ttft[waiting]
        late = dp.now - dp.arrival_s[waiting] > self.ttft[waiting]  # the env's shed rule
        keep = ~late
        order = waiting[keep][np.argsort(deadline[keep], kind="stable")]
        return Decision(order=order, shed=waiting[late].tolist(),
                        shed_reason="slo_unreachable")
