"""A Gymnasium ``SyncVectorEnv`` with the native vector envs' ``action_masks()``.

What ``gym.make_vec`` builds for a task whose env has a feature the native vector envs'
compiled step lacks (a cluster's edge, the tenants' counters, prefix caching): one env
after another in Python, the same observations, rewards and masks as the native ones would
give.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class SyncTaskVectorEnv(gym.vector.SyncVectorEnv):
    """``SyncVectorEnv`` plus ``action_masks()``: each env's mask, stacked (N, A)."""

    def action_masks(self) -> np.ndarray:
        return np.stack([np.asarray(env.unwrapped.action_masks()) for env in self.envs])


__all__ = ["SyncTaskVectorEnv"]
