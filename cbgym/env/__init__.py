"""The Gymnasium environment: ``cbgym/Scheduling-v0`` and ``cbgym/SchedulingMasked-v0``."""

from cbgym.env.action import InvalidActionError, ScoreLayout
from cbgym.env.observation import GLOBAL_FEATURES, SLOT_FEATURES
from cbgym.env.registration import ENV_IDS, register_envs
from cbgym.env.reward import COMPONENTS, RewardWeights
from cbgym.env.scheduling_env import SchedulingEnv, SchedulingMaskedEnv

__all__ = [
    "COMPONENTS", "ENV_IDS", "GLOBAL_FEATURES", "SLOT_FEATURES", "InvalidActionError",
    "RewardWeights", "SchedulingEnv", "SchedulingMaskedEnv", "ScoreLayout", "register_envs",
]
