"""The task registry: lookup, disjoint splits, and every task id built and stepped."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import cbgym  # noqa: F401  (registers the task ids)
from cbgym.tasks import TASKS, Task, get
from cbgym.workload import load_trace
from cbgym.workload.catalog import TraceNotFoundError


def test_lookup_and_unknown_names() -> None:
    assert TASKS and all(get(name) is task for name, task in TASKS.items())
    with pytest.raises(ValueError, match="unknown task 'nope'; known: "):
        get("nope")
    with pytest.raises(TypeError):
        TASKS["x"] = None  # type: ignore[index]  (read only)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_splits_are_disjoint_and_test_windows_stay_inside(name: str) -> None:
    task = get(name)
    for n in (2_000, 19_366, 100_000):
        r = task.ranges(n)
        assert r["train"][0] == 0 and r["test"][1] == n
        assert r["train"][1] == r["validation"][0] and r["validation"][1] == r["test"][0]
        lo, hi = r["test"]
        starts = task.starts(n)
        assert len(starts) == task.test_windows == len(set(starts))
        assert all(lo <= s and s + task.episode_requests <= hi for s in starts)
        assert task.env_kwargs(n)["window_start_range"] == r["train"]
        assert task.env_kwargs(n, "validation")["load"] == task.test_load


def test_impossible_tasks_are_refused() -> None:
    base = get(sorted(TASKS)[0])
    with pytest.raises(ValueError, match="splits"):
        Task(**{**base.__dict__, "splits": (0.7, 0.6)})
    with pytest.raises(ValueError, match="cannot hold"):
        base.starts(600)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_task_id_builds_and_steps(name: str) -> None:
    task = get(name)
    try:
        load_trace(task.trace)
    except TraceNotFoundError:
        pytest.skip(f"{task.trace} is not available here (CBGYM_TRACE_DIR)")
    for env_id in (task.env_id, task.masked_env_id):
        env = gym.make(env_id)
        env.reset(seed=0)
        env.step(env.action_space.sample())
        venv = gym.make_vec(env_id, num_envs=2)
        venv.reset(seed=0)
        actions = venv.unwrapped.action_masks().argmax(axis=1) if "Masked" in env_id else \
            np.zeros((2, env.action_space.shape[0]))
        venv.step(actions)
    u = gym.make(task.env_id).unwrapped
    assert u.window_start_range == task.ranges(len(u.base_trace))["train"]
