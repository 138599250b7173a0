"""Registration of the environment ids with Gymnasium (called when ``cbgym`` is imported).

Gymnasium 1.x ignores plugin entry points, so ``cbgym/__init__.py`` calls :func:`register_envs`;
``gymnasium.make("cbgym:cbgym/Scheduling-v0")`` imports ``cbgym`` first and works in fresh
processes (async vector workers) too.
"""

from __future__ import annotations

import gymnasium as gym

__all__ = ["ENV_IDS", "register_envs"]

ENV_IDS = {
    "cbgym/Scheduling-v0": "cbgym.env.scheduling_env:SchedulingEnv",
    "cbgym/SchedulingMasked-v0": "cbgym.env.scheduling_env:SchedulingMaskedEnv",
}
# gymnasium.make_vec(id, num_envs=N) builds these by default (one compiled call per step)
VECTOR_ENTRY_POINTS = {
    "cbgym/Scheduling-v0": "cbgym.env.vector:SchedulingVectorEnv",
    "cbgym/SchedulingMasked-v0": "cbgym.env.vector:SchedulingMaskedVectorEnv",
}


def register_envs() -> None:
    """Register every cbgym environment id (idempotent).

    No ``max_episode_steps`` is registered: episodes end when the trace window drains; pass
    ``max_steps=`` (the env's own truncation) or ``gym.make(..., max_episode_steps=N)``.
    """
    for env_id, entry_point in ENV_IDS.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point,
                         vector_entry_point=VECTOR_ENTRY_POINTS.get(env_id))
    from cbgym.tasks.registry import TASKS

    for task in TASKS.values():  # each task's ids build its env with no arguments
        for env_id, masked in ((task.env_id, False), (task.masked_env_id, True)):
            if env_id not in gym.registry:
                gym.register(id=env_id, entry_point="cbgym.tasks.registry:make_env",
                             vector_entry_point="cbgym.tasks.registry:make_vector_env",
                             kwargs={"task": task.name, "masked": masked})
