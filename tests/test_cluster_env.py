"""``cbgym/Cluster-v0``: Gymnasium's checker, masks, determinism, the door."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import cbgym  # noqa: F401  (registers the ids)
from cbgym.env.action import InvalidActionError
from cbgym.env.cluster_env import ClusterEnv

SMALL = {"cluster": "2p2d:llama-2-7b/a100-80gb", "episode_requests": 40}


def test_checker_is_clean_with_default_arguments() -> None:
    env = gym.make("cbgym/Cluster-v0")
    check_env(env.unwrapped)


def play(env: ClusterEnv, seed: int, rule: str = "random") -> tuple[float, int]:
    _, info = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    ret, steps, done = 0.0, 0, False
    while not done:
        allowed = np.flatnonzero(info["action_mask"])
        a = int(rng.choice(allowed)) if rule == "random" else int(allowed[0])
        _, r, done, trunc, info = env.step(a)
        assert not trunc
        ret += r
        steps += 1
    return ret, steps


def test_an_episode_routes_every_request_and_returns_its_goodput() -> None:
    env = ClusterEnv(**SMALL)
    ret, steps = play(env, 0)
    assert steps == 40
    res = env.cluster
    assert res is not None
    from cbgym.cluster.results import cluster_result

    req = cluster_result(res, {}).requests
    from cbgym.metrics import meets_slo

    assert ret == meets_slo(req, env.slo).sum()


def test_same_seed_same_episode() -> None:
    a, b = ClusterEnv(**SMALL), ClusterEnv(**SMALL)
    assert play(a, 3) == play(b, 3)


def test_bad_actions_raise() -> None:
    env = ClusterEnv(**SMALL)
    env.reset(seed=0)
    with pytest.raises(InvalidActionError):
        env.step(env.action_space.n)
    with pytest.raises(InvalidActionError):
        env.step("x")  # type: ignore[arg-type]


def test_routes_cover_the_cluster() -> None:
    env = ClusterEnv(**SMALL)
    # 2 x 2 disaggregated pairs, 2 deflections, shed
    assert env.action_space.n == 7
    env = ClusterEnv(cluster="3x:llama-2-7b/a100-80gb", episode_requests=20, allow_shed=False)
    assert env.action_space.n == 3


def test_vector_env() -> None:
    envs = gym.make_vec("cbgym/Cluster-v0", num_envs=2, vectorization_mode="sync",
                        episode_requests=20, cluster="1p1d:llama-2-7b/a100-80gb")
    obs, _ = envs.reset(seed=0)
    assert obs["instances"].shape == (2, 2, 17)
    envs.step(np.array([0, 1]))
    envs.close()
