"""Registration of the environment ids with Gymnasium (called when ``cbgym`` is imported).

``cbgym/Scheduling-v0`` and ``cbgym/SchedulingMasked-v0`` build the default benchmark task
(``cbgym.tasks.DEFAULT_TASK``); ``cbgym/Scheduling-<task>-v0`` and its masked twin build each
task. Keyword arguments of ``gym.make`` replace the task's (``trace=`` keeps the task's other
settings on another trace). :class:`cbgym.env.SchedulingEnv` itself keeps neutral defaults.

Gymnasium 1.x ignores plugin entry points, so ``cbgym/__init__.py`` calls :func:`register_envs`;
``gymnasium.make("cbgym:cbgym/Scheduling-v0")`` imports ``cbgym`` first and works in fresh
processes (async vector workers) too.
"""

from __future__ import annotations

import gymnasium as gym

__all__ = ["ENV_IDS", "register_envs"]

# the default ids and whether they are masked; gymnasium.make_vec(id, num_envs=N) builds the
# native vector env by default (one compiled call per step)
ENV_IDS = {"cbgym/Scheduling-v0": False, "cbgym/SchedulingMasked-v0": True}


def register_envs() -> None:
    """Register every cbgym environment id (idempotent).

    No ``max_episode_steps`` is registered: episodes end when the trace window drains; pass
    ``max_steps=`` (the env's own truncation) or ``gym.make(..., max_episode_steps=N)``.
    """
    from cbgym.tasks.registry import DEFAULT_TASK, TASKS

    ids = [(env_id, DEFAULT_TASK, masked) for env_id, masked in ENV_IDS.items()]
    for task in TASKS.values():  # each task's ids build its env with no arguments
        ids += [(task.env_id, task.name, False), (task.masked_env_id, task.name, True)]
    from cbgym.env.cluster_env import register_cluster_env

    register_cluster_env()
    for env_id, name, masked in ids:
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point="cbgym.tasks.registry:make_env",
                         vector_entry_point="cbgym.tasks.registry:make_vector_env",
                         kwargs={"task": name, "masked": masked})
