"""First come, first served: vLLM's default queue order."""

from __future__ import annotations

import numpy as np

from cbgym.agents.base import KeyPolicy, QueueView
from cbgym.engine.decision import FCFS_DECISION, Decision, DecisionPoint


class FCFS(KeyPolicy):
    """Admit in queue order (re-queued preempted requests first, then by arrival).

    Uses ``queue_pos`` only; not privileged. The fast path skips the view and returns the
    engine's default decision (queue order, vLLM's default victims).
    """

    name = "fcfs"
    # its decision is always the engine's default, so the engine never needs to ask
    consult = "never"

    def keys(self, view: QueueView) -> np.ndarray:
        return view.queue_pos.astype(np.float64)

    def decide(self, dp: DecisionPoint) -> Decision:
        return FCFS_DECISION
