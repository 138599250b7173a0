"""``cbgym/Cluster-v0``: Gymnasium's checker, masks, determinism, the door."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import cbgym
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
    # 2 x 2 disaggregated pairs, 2 x 5 deflections (chunk caps), shed
    assert env.action_space.n == 15
    env = ClusterEnv(cluster="3x:llama-2-7b/a100-80gb", episode_requests=20, allow_shed=False)
    assert env.action_space.n == 3


def test_vector_env() -> None:
    envs = gym.make_vec("cbgym/Cluster-v0", num_envs=2, vectorization_mode="sync",
                        episode_requests=20,
                        cluster=cbgym.ClusterConfig.preset("1p1d:llama-2-7b/a100-80gb"))
    obs, _ = envs.reset(seed=0)
    assert obs["instances"].shape == (2, 2, 17)
    envs.step(np.array([0, 1]))
    envs.close()


def test_cluster_task_ids_and_evaluation() -> None:
    from cbgym.tasks.cluster_tasks import CLUSTER_TASKS, ClusterTask, evaluate_cluster

    from cbgym.workload import load_trace

    for t in CLUSTER_TASKS.values():  # training episodes never reach validation or test
        env = gym.make(t.env_id)
        n = len(load_trace(t.trace))
        assert env.unwrapped.window_range == t.ranges(n)["train"] == (0, int(n * 0.6))
        assert min(t.starts(n, "test")) >= int(n * 0.7)
    small = ClusterTask("tiny", "azure-code-2023", "1p1d:llama-2-7b/a100-80gb", (0.4, 0.8),
                        0.6, cbgym.SLO(2.0, 0.1), episode_requests=40, test_windows=2)
    ev = evaluate_cluster(small, "kairos", references=("always-disaggregate",))
    table = ev.table
    assert set(table.index) == {"kairos", "always-disaggregate", "random actions"}
    assert ev.best_heuristic in ("kairos", "always-disaggregate")
    assert np.isfinite(ev.score().mean)


def test_a_learned_router_acts_as_on_the_env() -> None:
    """The router's deterministic routes through ``serve`` equal the env episode played with
    the model's deterministic actions (one encoder, one route table)."""
    sb3 = pytest.importorskip("sb3_contrib")
    from cbgym.agents.routing.learned import LearnedRouter
    from cbgym.cluster.run import serve

    env = ClusterEnv(**SMALL, load=0.8)
    model = sb3.MaskablePPO("MultiInputPolicy", env, n_steps=64, batch_size=32, seed=0)
    model.learn(64)
    obs, info = env.reset(seed=5)
    done = False
    while not done:
        a, _ = model.predict(obs, deterministic=True, action_masks=info["action_mask"])
        obs, _, done, _, info = env.step(int(a))
    cluster = env.cluster
    assert cluster is not None
    res = serve(cluster.trace, env.config, LearnedRouter(model, deterministic=True),
                slo=env.slo).requests
    from cbgym.cluster.results import cluster_result

    played = cluster_result(cluster, {}).requests
    pd = pytest.importorskip("pandas")
    pd.testing.assert_frame_equal(res, played, check_exact=True)


def test_a_sampling_learned_router_reproduces_with_its_seed() -> None:
    sb3 = pytest.importorskip("sb3_contrib")
    from cbgym.agents.routing.learned import LearnedRouter
    from cbgym.cluster.run import serve

    env = ClusterEnv(**SMALL, load=0.8)
    model = sb3.MaskablePPO("MultiInputPolicy", env, n_steps=64, batch_size=32, seed=0)
    env.reset(seed=1)
    tr = env.cluster.trace  # type: ignore[union-attr]
    a = serve(tr, env.config, LearnedRouter(model), seed=3).requests
    b = serve(tr, env.config, LearnedRouter(model), seed=3).requests
    assert a.equals(b)
    assert {2, 3} <= set(a["decode_instance"])  # an untrained policy spreads its draws


def test_the_shipped_learned_router_loads_and_routes() -> None:
    pytest.importorskip("sb3_contrib")
    from cbgym.agents.routing import make_router
    from cbgym.cluster.run import serve

    env = gym.make("cbgym/Cluster-v0").unwrapped
    env.reset(seed=0)
    tr = env.cluster.trace.window(0, 60)
    for spec in ("learned-router:code-2p2d-deflection",
                 "learned-router:code-2p2d-deflection:deterministic"):
        res = serve(tr, env.config, make_router(spec), slo=env.slo)
        assert res.summary()["num_requests"] == 60
    with pytest.raises(ValueError, match="deterministic"):
        make_router("learned-router:code-2p2d-deflection:maybe")
