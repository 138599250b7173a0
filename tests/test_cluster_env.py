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
    """One episode; every step's reward is the goodput of the requests that ended since the
    previous step (never negative: a request done on its prefill instance is not yet done)."""
    from cbgym.cluster.results import cluster_result
    from cbgym.metrics import meets_slo

    _, info = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    ret, steps, done = 0.0, 0, False
    while not done:
        allowed = np.flatnonzero(info["action_mask"])
        a = int(rng.choice(allowed)) if rule == "random" else int(allowed[0])
        _, r, done, trunc, info = env.step(np.int64(a))
        assert not trunc and r >= 0
        ret += r
        steps += 1
        if steps % 10 == 0 and not done:  # so far: the requests ended meeting the SLO
            req = cluster_result(env.cluster, {}).requests  # type: ignore[arg-type]
            ended = req["finish_s"].notna() & req["status"].isin(["finished", "shed"])
            assert ret == meets_slo(req[ended], env.slo).sum()
    return ret, steps


def test_an_episode_routes_every_request_and_returns_its_goodput() -> None:
    env = ClusterEnv(**SMALL, load=1.5)
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


def test_bad_actions_and_arguments_raise() -> None:
    env = ClusterEnv(**SMALL)
    env.reset(seed=0)
    for bad in (env.action_space.n, "x", 2.7, True):
        with pytest.raises(InvalidActionError):
            env.step(bad)  # type: ignore[arg-type]
    for kwargs, match in (({"window_start_range": (0, 10**6)}, "window_start_range"),
                          ({"window_start_range": (300, 100)}, "window_start_range"),
                          ({"episode_requests": 10**6, "window_start_range": (0, 100)},
                           "window_start_range"),
                          ({"load": "1"}, "load"), ({"load": True}, "load"),
                          ({"capacity_rps": 0}, "capacity_rps")):
        with pytest.raises(ValueError, match=match):
            ClusterEnv(**{**SMALL, **kwargs})


CACHED = {"cluster": cbgym.ClusterConfig.preset("3x:llama-2-7b/a100-80gb").with_prefix_caching(),
          "trace": "synthetic-sessions", "episode_requests": 60}


@pytest.mark.parametrize("kw", [SMALL, CACHED], ids=["disaggregated", "prefix-caching"])
def test_the_router_sees_what_the_env_shows(kw: dict) -> None:
    """Replaying an episode's actions through ``serve``, a recording router sees the same
    observation, step for step (the one encoder); with prefix caching, each instance's
    cache columns are the routing point's cached tokens."""
    from cbgym.cluster.routing import Router
    from cbgym.cluster.run import serve
    from cbgym.env.cluster_env import encode
    from cbgym.env.cluster_vector_ops import INSTANCE_FEATURES, count_scaled

    env = ClusterEnv(**kw, load=1.2)
    obs, info = env.reset(seed=2)
    rng = np.random.default_rng(2)
    shown, actions, done = [obs], [], False
    while not done:
        a = int(rng.choice(np.flatnonzero(info["action_mask"])))
        actions.append(a)
        obs, _, done, _, info = env.step(a)
        shown.append(obs)

    class Replay(Router):
        name = "replay"

        def reset(self, ctx):  # type: ignore[no-untyped-def]
            self.k, self.seen, self.cached = 0, [], []

        def route(self, rp):  # type: ignore[no-untyped-def]
            self.seen.append(encode(rp, env.prefix))
            if env.prefix:
                self.cached.append(rp.cached_tokens / rp.prompt_tokens)
                np.testing.assert_allclose(self.seen[-1]["instances"][:, F],
                                           [count_scaled(c) for c in rp.cached_tokens],
                                           rtol=1e-6)
            self.k += 1
            return env.routes[actions[self.k - 1]]

    F = len(INSTANCE_FEATURES)
    assert obs["instances"].shape[1] == F + 3 * env.prefix
    rt = Replay()
    serve(env.cluster.trace, env.config, rt, slo=env.slo)  # type: ignore[union-attr]
    assert len(rt.seen) == len(actions)
    if env.prefix:  # (sessions' later turns find their prefix on some instance)
        share = np.array(rt.cached)
        assert share.max() > 0.5
        np.testing.assert_allclose(np.stack([o["instances"][:, F + 1] for o in shown[:-1]]),
                                   share, rtol=1e-6)
    for a, b in zip(rt.seen, shown[:-1], strict=True):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])


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
        assert len(t.starts(n, "validation")) == t.test_windows  # (Task.starts' default)
    small = ClusterTask("tiny", "azure-code-2023", "1p1d:llama-2-7b/a100-80gb", (0.4, 0.8),
                        0.6, cbgym.SLO(2.0, 0.1), episode_requests=40, test_windows=2)
    ev = evaluate_cluster(small, "kairos", references=("always-disaggregate",))
    table = ev.table
    assert set(table.index) == {"kairos", "always-disaggregate", "random actions"}
    assert ev.best_heuristic in ("kairos", "always-disaggregate")
    assert np.isfinite(ev.score().mean)
    val = evaluate_cluster(small, "kairos", references=("always-disaggregate",),
                           split="validation")
    assert len(val.starts) == 2 and not set(val.starts) & set(ev.starts)


@pytest.mark.parametrize("kw", [SMALL, CACHED, {**SMALL, "prefix_features": True}],
                         ids=["disaggregated", "prefix-caching", "prefix-features"])
def test_a_learned_router_acts_as_on_the_env(kw: dict) -> None:
    """The router's deterministic routes through ``serve`` equal the env episode played with
    the model's deterministic actions (one encoder, one route table; with prefix caching
    the model reads the cache columns)."""
    sb3 = pytest.importorskip("sb3_contrib")
    from cbgym.agents.routing.learned import LearnedRouter
    from cbgym.cluster.run import serve

    env = ClusterEnv(**kw, load=0.8)
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
    # (the env keeps only each request's worst gap: no p99 gap there)
    assert played["itl_p99_s"].isna().all()
    pd.testing.assert_frame_equal(res.drop(columns="itl_p99_s"),
                                  played.drop(columns="itl_p99_s"), check_exact=True)


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


def test_every_cluster_task_ships_a_router_for_its_own_env() -> None:
    """Each task's learned router: a card naming the task, and a model whose spaces are the
    task env's (what ``cbgym evaluate --policy learned-router:<task>`` replays)."""
    pytest.importorskip("sb3_contrib")
    import json

    from sb3_contrib import MaskablePPO

    from cbgym.agents.routing.learned import CHECKPOINTS
    from cbgym.tasks.cluster_tasks import CLUSTER_TASKS

    for name, t in CLUSTER_TASKS.items():
        zip_path = CHECKPOINTS / f"router-{name}.zip"
        card = json.loads(zip_path.with_suffix(".json").read_text())
        assert card["task"] == name and "validation_goodput" in card
        model = MaskablePPO.load(zip_path, device="cpu")
        env = gym.make(t.env_id).unwrapped
        assert model.action_space == env.action_space, name
        assert model.observation_space == env.observation_space, name


def test_prefix_features_without_caching_observe_what_was_routed_since_the_report() -> None:
    """``prefix_features=True`` on a cluster without prefix caching: the three columns, the
    cache's two zero, the third the routes this episode sent to each instance after the
    load report it sees (counted here from the actions, both instances of a disaggregated
    route), encoded as counts."""
    from cbgym.env.cluster_vector_ops import INSTANCE_FEATURES, count_scaled

    env = ClusterEnv(**SMALL, load=2.0, prefix_features=True)
    F = len(INSTANCE_FEATURES)
    assert env.observation_space["instances"].shape == (4, F + 3)
    obs, _ = env.reset(seed=2)
    sent: list[tuple[float, list[int]]] = []  # (arrival, instances) of each route taken
    seen = 0
    for _ in range(40):
        rp = env._rp
        assert rp is not None and rp.loads is not None
        assert (obs["instances"][:, F:F + 2] == 0).all()
        want = np.zeros(4)
        for t, where in sent:
            if t >= rp.loads.report_s:
                want[where] += 1
        np.testing.assert_allclose(obs["instances"][:, F + 2],
                                   [count_scaled(x) for x in want], rtol=1e-6)
        seen += int(want.sum() > 0)
        a = int(np.flatnonzero(env.action_masks())[0])
        route = env.routes[a]
        sent.append((rp.now, [i for i in (route.prefill, route.decode) if i is not None]))
        obs, _, done, _, _ = env.step(a)
        if done:
            break
    assert seen > 0
    assert ClusterEnv(**SMALL).observation_space["instances"].shape == (4, F)
    with pytest.raises(ValueError, match="prefix_features=1"):
        ClusterEnv(**SMALL, prefix_features=1)  # type: ignore[arg-type]
