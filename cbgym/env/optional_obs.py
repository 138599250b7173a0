"""The scheduling env's optional observation keys, each written in Python beside the compiled
encoder (:func:`cbgym.env.kernel_obs.observe`), which writes the rest:

| Argument | Key | Module |
|---|---|---|
| ``tenant_features=T`` | ``waiting_tenants`` | :mod:`cbgym.env.tenant_obs` |
| ``prefix_features=True`` | ``waiting_prefix`` | :mod:`cbgym.env.prefix_obs` |
| ``arrival_features=True`` | ``waiting_arrival`` | :mod:`cbgym.env.arrival_obs` |

``spaces.Dict`` sorts its keys by name, so in the flattened observation ``waiting_arrival``
lies between ``waiting`` and ``waiting_mask``, and the other two after ``waiting_mask``. The
native vector env writes none of them (``cbgym.env.vector_common.native_lacks``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from gymnasium import spaces

from cbgym.env.arrival_obs import KEY as ARRIVAL_KEY
from cbgym.env.arrival_obs import ArrivalFeatures, arrival_space, check_arrival_features
from cbgym.env.prefix_obs import KEY as PREFIX_KEY
from cbgym.env.prefix_obs import (
    check_prefix_features,
    check_prefix_trace,
    prefix_obs,
    prefix_space,
)
from cbgym.env.tenant_obs import KEY as TENANT_KEY
from cbgym.env.tenant_obs import check_tenant_features, tenant_obs, tenant_space

if TYPE_CHECKING:
    from cbgym.engine.config import EngineConfig
    from cbgym.env.episode import Episode
    from cbgym.workload.trace import Trace

__all__ = ["OptionalObs"]


class OptionalObs:
    """Which optional keys an env writes (its arguments, checked), their spaces, and their
    values at each observation."""

    def __init__(self, K: int, config: EngineConfig, base: Trace | None,
                 tenant_features: object, prefix_features: object,
                 arrival_features: object) -> None:
        self.K = K
        self.tenant_features = check_tenant_features(tenant_features)
        self.prefix_features = check_prefix_features(prefix_features, config)
        if self.prefix_features and base is not None:  # (a named trace: checked at reset)
            check_prefix_trace(base)
        self.arrival_features = check_arrival_features(arrival_features)
        self._arrivals: ArrivalFeatures | None = None
        self._tenant: np.ndarray | None = None

    def space(self, base: spaces.Dict) -> spaces.Dict:
        """``base`` with the optional keys appended."""
        extra: dict[str, spaces.Space] = {}
        if self.tenant_features:
            extra[TENANT_KEY] = tenant_space(self.tenant_features)
        if self.prefix_features:
            extra[PREFIX_KEY] = prefix_space(self.K)
        if self.arrival_features:
            extra[ARRIVAL_KEY] = arrival_space(self.K)
        return spaces.Dict({**base.spaces, **extra}) if extra else base

    def start(self, window: Trace) -> None:
        """A new episode on ``window``."""
        if self.prefix_features:
            check_prefix_trace(window)
        self._tenant = window.tenant
        self._arrivals = ArrivalFeatures(window) if self.arrival_features else None

    def encode(self, sim: Episode) -> dict[str, np.ndarray]:
        """The optional keys at the episode's current decision point (or its end)."""
        out: dict[str, np.ndarray] = {}
        if self.tenant_features:
            assert self._tenant is not None
            out[TENANT_KEY] = tenant_obs(sim.engine.state, self._tenant, self.tenant_features)
        if not (self.prefix_features or self._arrivals is not None):
            return out
        # the engine is at the env's decision point whenever the episode is not done (else
        # next_decision would advance past it)
        assert sim.done or sim.engine.at_point
        dp = None if sim.done else sim.engine.next_decision()
        if self.prefix_features:
            rate = float("nan")
            if dp is None:  # the episode's final hit rate
                stats = sim.engine.prefix_cache_stats
                rate = stats["hits"] / stats["queries"] if stats["queries"] else rate
            out[PREFIX_KEY] = prefix_obs(dp, sim.w_ids, self.K, rate)
        if self._arrivals is not None:
            out[ARRIVAL_KEY] = self._arrivals.obs(dp, sim.w_ids, self.K)
        return out
