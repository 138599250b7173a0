"""Reward: goodput per step, plus optional shaping terms reported separately.

Components (``info["reward_components"]``, the same keys every step, signed as they enter the
reward):

* ``goodput`` (>= 0): requests that finished in the step meeting both their TTFT and TPOT SLO
  (the rule of :func:`cbgym.metrics.meets_slo`, evaluated as they finish).
* ``ttft_miss`` (<= 0): minus the requests whose TTFT deadline (arrival + TTFT target) passed in
  the step without a first token; counted at that moment, not at completion. A request shed
  before its deadline is not counted (``shed`` covers it).
* ``shed`` (<= 0): minus the requests that left the system unserved in the step (shed by the
  agent, or by the engine because they can never fit).
* ``latency`` (<= 0): minus the integral over the step of the number of requests in the system
  (request-seconds). By Little's law it sums over an episode to minus the total time requests
  spent in the system (sum of finish - arrival, shed requests included).

``reward = goodput + ttft_miss_weight * ttft_miss + shed_weight * shed
+ latency_weight * latency``; the weights default to 0 (pure goodput).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cbgym.engine.requests import RequestTable, Status
from cbgym.metrics import tpot

__all__ = ["COMPONENTS", "RewardTracker", "RewardWeights", "StepOutcome"]

COMPONENTS = ("goodput", "ttft_miss", "shed", "latency")


@dataclass(frozen=True, slots=True)
class RewardWeights:
    """Weights of the shaping components (goodput always has weight 1)."""

    ttft_miss: float = 0.0
    shed: float = 0.0
    latency: float = 0.0

    def __post_init__(self) -> None:
        for name in ("ttft_miss", "shed", "latency"):
            if not np.isfinite(getattr(self, name)):
                raise ValueError(f"reward weight {name} must be finite")

    def combine(self, c: dict[str, float]) -> float:
        """The scalar reward from a components dict."""
        return (c["goodput"] + self.ttft_miss * c["ttft_miss"] + self.shed * c["shed"]
                + self.latency * c["latency"])


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """What one env step produced."""

    reward: float
    components: dict[str, float]
    num_finished: int
    num_good: int
    num_shed: int
    sim_time_elapsed: float


class RewardTracker:
    """Accumulates per-step outcomes from the engine's request table.

    Every quantity is incremental: completions are read from the table's completion log, the
    TTFT deadlines from a per-episode sorted array, and the latency integral from prefix sums of
    arrival times, so a step costs O(requests that changed), not O(episode).
    """

    def __init__(self, weights: RewardWeights) -> None:
        self.weights = weights

    def start(self, req: RequestTable, ttft_target: np.ndarray, tpot_target: np.ndarray) -> None:
        """Begin an episode at simulated time 0 (the step after reset covers [0, t1])."""
        self.req = req
        self.ttft_target, self.tpot_target = ttft_target, tpot_target
        deadline = req.arrival_s + ttft_target
        self._dl_order = np.argsort(deadline, kind="stable")
        self._dl_sorted = deadline[self._dl_order]
        self._deadline = deadline
        self._arr_prefix = np.concatenate(([0.0], np.cumsum(req.arrival_s)))
        self._finished = 0
        self._ended = 0
        self._dl_next = 0
        self._sum_finish_fin = 0.0  # sum of finish times of finished requests
        self._sum_finish_shed = 0.0  # ... and of shed ones
        self._shed_seen = np.zeros(req.n, dtype=bool)
        self._now = 0.0
        self._area = 0.0  # integral of requests in system from 0 to _now

    def _area_until(self, t: float) -> float:
        """Integral of requests in system over [0, t], for t = the engine's current time."""
        a = int(np.searchsorted(self.req.arrival_s, t, side="right"))
        ended = self._ended
        return (a * t - float(self._arr_prefix[a])
                - (ended * t - self._sum_finish_fin - self._sum_finish_shed))

    def update(self, now: float) -> StepOutcome:
        """Account for everything that happened since the last update, up to ``now``."""
        req = self.req
        f0, f1 = self._finished, req.num_finished
        num_good = 0
        if f1 > f0:
            ids = req.finish_order[f0:f1]
            first, finish = req.first_token_s[ids], req.finish_s[ids]
            ttft = first - req.arrival_s[ids]
            ok = (ttft <= self.ttft_target[ids]) & (
                tpot(first, finish, req.generated[ids]) <= self.tpot_target[ids])
            num_good = int(ok.sum())
            # summed one by one in a fixed order (completion order here, request id order for
            # the shed below): the compiled backend adds them the same way, bit for bit
            for t in finish.tolist():
                self._sum_finish_fin += t
        num_shed = (req.num_ended - self._ended) - (f1 - f0)
        if num_shed:
            new = np.flatnonzero((req.status == Status.SHED) & ~self._shed_seen)
            self._shed_seen[new] = True
            for t in req.finish_s[new].tolist():
                self._sum_finish_shed += t
        self._finished, self._ended = f1, req.num_ended
        misses = self._ttft_misses(now)
        area = self._area_until(now)
        latency = area - self._area
        elapsed = now - self._now
        self._area, self._now = area, now
        # 0.0 - x rather than -x: no negative zeros in the reported components
        comp = {"goodput": float(num_good), "ttft_miss": 0.0 - misses,
                "shed": 0.0 - num_shed, "latency": 0.0 - latency}
        return StepOutcome(self.weights.combine(comp), comp, f1 - f0, num_good, num_shed,
                           elapsed)

    def _ttft_misses(self, now: float) -> int:
        j0 = self._dl_next
        j1 = int(np.searchsorted(self._dl_sorted, now, side="right"))
        if j1 <= j0:
            return 0
        self._dl_next = j1
        ids = self._dl_order[j0:j1]
        req, dl = self.req, self._deadline[ids]
        met = req.first_token_s[ids] <= dl
        shed_before = (req.status[ids] == Status.SHED) & (req.finish_s[ids] <= dl)
        return int((~met & ~shed_before).sum())
