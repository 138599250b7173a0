"""Wrappers for the scheduling environment.

* :class:`FlattenSchedulingObservation`: the ``Dict`` observation as one float32 vector (for
  MLP policies, RLlib, cleanrl), with the slice of each key in ``layout``.
* :class:`ReweightReward`: recombine ``info["reward_components"]`` with other shaping weights.
* :class:`ActionMaskObservation`: RLlib's masking convention for ``SchedulingMasked-v0``:
  ``{"observations": flat vector, "action_mask": mask}``.
"""

from __future__ import annotations

from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from cbgym.env.reward import RewardWeights

__all__ = ["ActionMaskObservation", "FlattenSchedulingObservation", "ReweightReward"]


class FlattenSchedulingObservation(gym.ObservationWrapper):
    """Flatten the observation into one float32 vector.

    The order is Gymnasium's (``spaces.flatten``: keys sorted, so ``global``, ``running``,
    ``running_mask``, ``waiting``, ``waiting_mask``), identical to
    ``gymnasium.wrappers.FlattenObservation``; ``layout[key]`` is each key's slice.

    Example:
        >>> import gymnasium as gym, numpy as np
        >>> import cbgym
        >>> from cbgym.env.wrappers import FlattenSchedulingObservation
        >>> trace = cbgym.Trace.from_arrays(np.arange(32) * 0.1, [100] * 32, [10] * 32)
        >>> cfg = cbgym.EngineConfig(preset=None, cost_model=cbgym.LinearCostModel(),
        ...                          num_kv_blocks=256)
        >>> env = FlattenSchedulingObservation(
        ...     gym.make("cbgym/Scheduling-v0", trace=trace, engine=cfg, episode_requests=16))
        >>> env.observation_space.shape
        (468,)
        >>> env.layout["waiting_mask"]
        slice(452, 468, None)

    Change logs:
        v0.1.0 - Initially added.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        space = env.observation_space
        assert isinstance(space, spaces.Dict), "expects the Dict observation of SchedulingEnv"
        self.layout: dict[str, slice] = {}
        start = 0
        for key, sub in space.spaces.items():
            assert isinstance(sub, spaces.Box) and len(sub.shape) == 1
            self.layout[key] = slice(start, start + sub.shape[0])
            start += sub.shape[0]
        self._keys = tuple(space.spaces)
        self.observation_space = spaces.flatten_space(space)

    def observation(self, observation: dict[str, np.ndarray]) -> np.ndarray:
        return np.concatenate([observation[k] for k in self._keys]).astype(np.float32, copy=False)


class ReweightReward(gym.Wrapper):
    """Replace the reward by ``goodput + sum(weight x component)`` with new weights.

    Example:
        >>> # env = ReweightReward(gym.make("cbgym/Scheduling-v0"), latency=0.01)

    Change logs:
        v0.1.0 - Initially added.
    """

    def __init__(self, env: gym.Env, ttft_miss: float = 0.0, shed: float = 0.0,
                 latency: float = 0.0) -> None:
        super().__init__(env)
        self.weights = RewardWeights(ttft_miss, shed, latency)

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, _, terminated, truncated, info = self.env.step(action)
        return obs, self.weights.combine(info["reward_components"]), terminated, truncated, info


class ActionMaskObservation(gym.ObservationWrapper):
    """RLlib's masking convention: ``{"observations": flat, "action_mask": mask}``.

    For ``cbgym/SchedulingMasked-v0``; the mask is the env's ``action_masks()`` as float32.

    Change logs:
        v0.1.0 - Initially added.
    """

    def __init__(self, env: gym.Env) -> None:
        flat = FlattenSchedulingObservation(env)
        super().__init__(flat)
        n = int(env.action_space.n)  # type: ignore[attr-defined]
        self.observation_space = spaces.Dict({
            "observations": flat.observation_space,
            "action_mask": spaces.Box(0.0, 1.0, (n,), np.float32),
        })

    def observation(self, observation: np.ndarray) -> dict[str, np.ndarray]:
        mask = self.env.unwrapped.action_masks().astype(np.float32)  # type: ignore[attr-defined]
        return {"observations": observation, "action_mask": mask}
