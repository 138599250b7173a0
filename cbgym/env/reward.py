"""Reward: goodput per step, plus optional shaping terms reported separately.

The one implementation is compiled (:func:`cbgym.env.kernel_obs.reward`: incremental, a step
costs what changed in it); this module defines the components and their weights.

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

__all__ = ["COMPONENTS", "RewardWeights", "StepOutcome"]

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
