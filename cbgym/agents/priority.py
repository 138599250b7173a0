"""vLLM's priority scheduling policy (``SchedulerConfig(policy="priority")``), exactly.

Waiting requests are admitted by (priority, arrival), lower first; a request's priority is
``Trace.priority`` (the trace's ``priority`` column, vLLM's ``Request.priority``, else its
SLO class). When KV
blocks run out, the victim is the running request with the largest (priority, arrival), not
the last admitted (vLLM's ``max(self.running, key=lambda r: (r.priority, r.arrival_time))``),
possibly one already scheduled in this iteration (its tokens are given back) or the request
being scheduled itself. A better arrival never preempts running work by itself, and waiting
requests are admitted only in an iteration that preempted nothing, as under FCFS.

The key is priority x n + trace position, so equal priorities go by arrival and requests
arriving at the same instant by trace order (vLLM breaks those ties by request id, and a
real server's clock rarely gives two the same arrival). It runs inside the compiled loop
(``static_keys``; the engine picks victims by the same key: ``Engine(victim_by_key=True)``).
Replayed against vLLM's own scheduler in ``tests/test_vllm_conformance.py``.
"""

from __future__ import annotations

import numpy as np

from cbgym.engine.decision import Decision, DecisionPoint, Policy, PolicyContext


class Priority(Policy):
    """vLLM's priority policy (module docstring). Not privileged."""

    name = "priority"
    consult = "on_change"
    victim_by_key = True

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)
        n = ctx.num_requests
        prio = ctx.priority if ctx.priority is not None else np.zeros(n, np.int64)
        prio = np.asarray(prio, np.int64)
        if prio.shape != (n,):
            raise ValueError(f"policy 'priority': expected {n} priorities, got {prio.shape}")
        lo, hi = (int(prio.min()), int(prio.max())) if n else (0, 0)
        if n and max(abs(lo), abs(hi)) * n >= 2**52:
            raise ValueError(f"policy 'priority': priorities in [{lo}, {hi}] are too far apart "
                             f"to rank {n} requests exactly")
        # exact in float64: integers below 2**53
        self._keys = prio.astype(np.float64) * n + np.arange(n, dtype=np.float64)

    def static_keys(self) -> np.ndarray:
        return self._keys

    def decide(self, dp: DecisionPoint) -> Decision:
        # at the door too: victims by the largest key (first of equals), as the kernel picks
        running = dp.running[np.argsort(-self._keys[dp.running], kind="stable")]
        return Decision(priority=self._keys[dp.waiting], victims=running)
