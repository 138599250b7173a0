"""Random order: a control that leaves arrival order without using any request feature."""

from __future__ import annotations

import numpy as np

from cbgym.agents.base import QueueView
from cbgym.engine.decision import FCFS_DECISION, Decision, DecisionPoint, Policy, PolicyContext


class RandomOrder(Policy):
    """Admit waiting requests by a random priority drawn once per request.

    At reset the request ids get a random permutation (seeded by ``ctx.seed``) as fixed keys,
    so a request's rank never changes between consults and the same seed gives the same run.
    Uses no QueueView field; not privileged.

    NOTE: the keys are indexed by request id, which a :class:`QueueView` does not carry, so this
    is a fast-path policy. On the env, :meth:`keys` draws fresh i.i.d. scores at each call
    instead: every admission then picks uniformly among the waiting requests (random order
    of service). The two agree in distribution on each single pick, not per request nor on
    whole schedules (a fixed key makes a request that lost once likelier to lose again).
    """

    name = "random"

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)
        self._rng = np.random.default_rng(ctx.seed)
        self._key = self._rng.permutation(ctx.num_requests).astype(np.float64)

    def decide(self, dp: DecisionPoint) -> Decision:
        if len(dp.waiting) == 0:
            return FCFS_DECISION
        return Decision(priority=self._key[dp.waiting])

    def static_keys(self) -> np.ndarray:
        """The per-request permutation: ranked inside the engine's compiled loop."""
        return self._key

    def keys(self, view: QueueView) -> np.ndarray:
        """Env path: fresh uniform scores, one per waiting request (see the class note)."""
        return self._rng.random(len(view.queue_pos))
