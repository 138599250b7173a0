"""First come, first served: vLLM's default queue order."""

from __future__ import annotations

from cbgym.engine.decision import FCFS_DECISION, Decision, DecisionPoint, Policy


class FCFS(Policy):
    """Admit in arrival order (re-queued preempted requests first); vLLM's default victims."""

    name = "fcfs"

    def decide(self, dp: DecisionPoint) -> Decision:
        return FCFS_DECISION
