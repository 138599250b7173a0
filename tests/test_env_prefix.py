"""The scheduling env's prefix-cache observation (``prefix_features``): its space, its values
against the engine's DecisionPoint, Gymnasium's checker, the env agents' cache-aware
policies against the fast path, and the configurations it refuses."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest

import cbgym
from cbgym.agents.base import view_from_decision_point
from cbgym.engine import EngineConfig, LinearCostModel
from cbgym.env import SchedulingEnv
from cbgym.env.agents import EnvAgent, run_episode
from cbgym.env.prefix_obs import KEY, decode_prefix
from cbgym.env.sync_vector import SyncTaskVectorEnv
from cbgym.workload.trace import Trace
from tests.conftest import UNIT_COST, make_config
from tests.test_prefix_cache import BS, trace_of


def config(**kw: object) -> EngineConfig:
    # a small cache: prefixes are evicted as well as hit, and running requests preempted
    kw.setdefault("num_kv_blocks", 250)
    kw.setdefault("enable_prefix_caching", True)
    return EngineConfig(preset=None, cost_model=LinearCostModel(), block_size=BS,
                        max_num_seqs=16, **kw)  # type: ignore[arg-type]


def shared_trace(n: int = 220, seed: int = 5) -> Trace:
    """Requests behind one of four system prompts, half of them continuing an earlier
    request's conversation (its ids, then new ones): prefixes shared while waiting, and
    found cached at admission."""
    rng = np.random.default_rng(seed)
    rows: list[tuple[float, int, int, tuple[int, ...]]] = []
    t, fresh = 0.0, 10_000
    for i in range(n):
        t += float(rng.exponential(0.15))
        if i and rng.random() < 0.5:
            ids = rows[int(rng.integers(max(0, i - 30), i))][3]
        else:
            ids = tuple(1000 * int(rng.integers(4)) + j for j in range(int(rng.integers(2, 8))))
        tail = int(rng.integers(1, 12))
        ids, fresh = ids + tuple(range(fresh, fresh + tail)), fresh + tail
        rows.append((t, BS * len(ids) - int(rng.integers(0, BS)), int(rng.integers(2, 150)),
                     ids))
    return trace_of(rows)


def make_env(masked: bool = False, **kw: object) -> gym.Env:
    kw.setdefault("engine", config())
    kw.setdefault("load", 2.5)  # (queues of up to some 30 requests: the order matters)
    kw.setdefault("K", 100)
    kw.setdefault("R", 16)
    kw.setdefault("prefix_features", True)
    env_id = "cbgym/SchedulingMasked-v0" if masked else "cbgym/Scheduling-v0"
    return gym.make(env_id, trace=shared_trace(), episode_requests=100, **kw)


def test_the_key_is_there_only_when_asked() -> None:
    tr, cfg = shared_trace(), config()
    plain = SchedulingEnv(trace=tr, engine=cfg, K=8, R=4)
    assert KEY not in plain.observation_space.spaces
    assert sorted(plain.reset(seed=0)[0]) == sorted(SchedulingEnv(K=8, R=4).observation_space)
    env = SchedulingEnv(trace=tr, engine=cfg, K=8, R=4, prefix_features=True)
    assert list(env.observation_space.spaces)[-1] == KEY  # sorts last: the flat layout grows
    assert env.observation_space[KEY].shape == (8 * 3 + 1,)
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs)


def test_hand_made_values() -> None:
    """Three requests at once (two share two blocks), then one continuing request 0 alone."""
    rows = [(0, 64, 4, (1, 2, 3, 4)), (0, 64, 4, (1, 2, 7, 8)), (0, 40, 4, (5, 6, 9)),
            (20, 70, 2, (1, 2, 3, 4, 11))]
    cfg = make_config(cost_model=UNIT_COST, num_kv_blocks=200, block_size=BS,
                      enable_prefix_caching=True)
    env = SchedulingEnv(trace=trace_of(rows), engine=cfg, load=None, episode_requests=4, K=4,
                        R=4, prefix_features=True)
    obs, _ = env.reset(seed=0)
    slots, rate = decode_prefix(obs[KEY], obs["waiting_mask"])
    assert slots["cached_tokens"].tolist() == [0, 0, 0]
    assert slots["uncached_tokens"].tolist() == [64, 64, 40]
    assert slots["shared_blocks"].tolist() == [2, 2, 0]
    assert rate == 0.0  # no query yet (the DecisionPoint's NaN)
    assert np.isnan(env.decision_point.prefix_cache_hit_rate)
    while env.visible_waiting_ids.tolist() != [3]:
        obs, *_ = env.step(np.ones(env.action_space.shape, np.float32))
    slots, rate = decode_prefix(obs[KEY], obs["waiting_mask"])
    assert slots["cached_tokens"].tolist() == [64]  # request 0's four blocks (at most 69)
    assert slots["uncached_tokens"].tolist() == [6]
    assert slots["shared_blocks"].tolist() == [0]
    stats = env.engine.prefix_cache_stats
    assert 0 < rate == pytest.approx(stats["hits"] / stats["queries"])


@pytest.mark.parametrize("rule", ["oldest", "smallest_prompt"])
def test_values_are_the_decision_point_s(rule: str) -> None:
    """At every step the slots read the DecisionPoint's cached tokens, uncached prefill and
    shared blocks (over the whole queue, hidden requests included) and its hit rate."""
    env = SchedulingEnv(trace=shared_trace(), engine=config(num_kv_blocks=250), load=1.6,
                        episode_requests=150, K=6, R=16, window_rule=rule,
                        prefix_features=True)
    obs, _ = env.reset(seed=1)
    rng = np.random.default_rng(0)
    seen = {"cached": 0, "shared": 0, "hidden": 0, "rate": 0}
    terminated = truncated = False
    while not (terminated or truncated):
        dp = env.decision_point
        w = env.visible_waiting_ids
        slots, rate = decode_prefix(obs[KEY], obs["waiting_mask"])
        assert len(slots["cached_tokens"]) == len(w)
        cached = np.asarray(dp.cached_tokens)[w]
        np.testing.assert_array_equal(slots["cached_tokens"], cached)
        np.testing.assert_array_equal(slots["uncached_tokens"],
                                      dp.prompt_tokens[w] + dp.num_generated[w] - cached)
        shared = dict(zip(dp.waiting.tolist(), dp.shared_prefix_blocks(dp.waiting).tolist(),
                          strict=True))
        assert slots["shared_blocks"].tolist() == [shared[i] for i in w.tolist()]
        expect = 0.0 if np.isnan(dp.prefix_cache_hit_rate) else dp.prefix_cache_hit_rate
        assert rate == pytest.approx(expect, rel=1e-6)
        seen["cached"] += int((cached > 0).any())
        seen["shared"] += int((slots["shared_blocks"] > 0).any())
        seen["hidden"] += int(len(dp.waiting) > len(w))
        seen["rate"] += int(rate > 0)
        assert env.observation_space.contains(obs)
        action = rng.uniform(-0.6, 1.0, env.action_space.shape).astype(np.float32)
        obs, _, terminated, truncated, _ = env.step(action)
    assert min(seen.values()) > 5, seen  # not vacuous: hits, sharing, a hidden queue
    assert env.observation_space.contains(obs)
    assert obs[KEY][:-1].max() == 0.0 and obs[KEY][-1] > 0  # ended: the final hit rate


@pytest.mark.parametrize("masked", [False, True])
def test_gymnasium_check_env(masked: bool) -> None:
    from gymnasium.utils.env_checker import check_env

    env = make_env(masked, K=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)


@pytest.mark.parametrize("masked", [False, True], ids=["box", "masked"])
@pytest.mark.parametrize("name", ["shortest-uncached-first", "k-lpm:3", "hrrn-uncached",
                                  "cb-sjf-work-uncached", "oracle-work-uncached"])
def test_env_agent_reproduces_fast_path(name: str, masked: bool) -> None:
    env = make_env(masked)
    agent = EnvAgent(name, env, seed=0)
    out = run_episode(env, agent, seed=0, options={"start": 40})
    assert out["terminated"] == 1.0
    u = env.unwrapped
    assert u.engine.recorder.timeseries()[:, 2].max() <= u.K, "the queue must fit in K"
    assert u.engine.recorder.timeseries()[:, 2].max() > 10
    got = u.episode_result().requests
    fast = cbgym.simulate(u.episode_trace, name, engine=u.config, seed=0, slo=u.slo).requests
    assert fast["cached_tokens"].sum() > 0 and fast["preemptions"].sum() > 0
    for col in ("first_scheduled_s", "first_token_s", "finish_s", "preemptions", "status",
                "cached_tokens"):
        np.testing.assert_array_equal(got[col].to_numpy(), fast[col].to_numpy(), err_msg=col)


def test_without_the_key_the_agent_plays_cache_blind() -> None:
    """Guard against a vacuous equivalence: without ``waiting_prefix`` the agent has no
    cached tokens (shortest-uncached-first is then SJF on the context), and schedules
    otherwise."""
    finish = {}
    for features in (True, False):
        env = make_env(prefix_features=features)
        run_episode(env, EnvAgent("shortest-uncached-first", env), seed=0,
                    options={"start": 40})
        finish[features] = env.unwrapped.episode_result().requests["finish_s"].to_numpy()
    assert not np.array_equal(finish[True], finish[False])


def test_rebuilt_view_matches_fast_path_view() -> None:
    env = make_env()
    agent = EnvAgent("shortest-uncached-first", env, seed=0)
    obs, info = env.reset(seed=0, options={"start": 40})
    agent.reset()
    checked = 0
    while True:
        mine = agent.view(obs, info)
        ref = view_from_decision_point(env.unwrapped.decision_point, None)
        assert mine.cached_tokens is not None and ref.cached_tokens is not None
        assert mine.cached_tokens.dtype == ref.cached_tokens.dtype
        np.testing.assert_array_equal(mine.cached_tokens, ref.cached_tokens)
        np.testing.assert_array_equal(mine.uncached_tokens(), ref.uncached_tokens())
        checked += 1
        obs, _, terminated, _, info = env.step(agent.act(obs, info))
        if terminated:
            break
    assert checked > 50


def test_bad_configurations_are_clear_errors() -> None:
    tr = shared_trace(40)
    with pytest.raises(ValueError, match="prefix_features=True needs an engine"):
        SchedulingEnv(trace=tr, engine=config(enable_prefix_caching=False),
                      prefix_features=True)
    with pytest.raises(ValueError, match="prefix_features=True needs an engine"):
        SchedulingEnv(trace=tr, prefix_features=True)  # EngineConfig(): off by default
    with pytest.raises(ValueError, match="prefix_features"):
        SchedulingEnv(trace=tr, engine=config(), prefix_features=1)  # type: ignore[arg-type]
    blind = Trace.from_arrays(np.arange(40) * 0.1, [100] * 40, [10] * 40, name="no-ids")
    with pytest.raises(ValueError, match="prefix_features=True needs a trace with block ids"):
        SchedulingEnv(trace=blind, engine=config(), prefix_features=True)
    env = SchedulingEnv(trace=tr, engine=config(), episode_requests=20, load=None,
                        prefix_features=True)
    with pytest.raises(ValueError, match="prefix_features=True needs a trace with block ids"):
        env.reset(seed=0, options={"trace": blind})


@pytest.mark.parametrize("masked", [False, True], ids=["box", "masked"])
def test_the_native_vector_env_caches_prefixes_as_single_envs(masked: bool) -> None:
    """With prefix caching (no prefix_features), env i of the compiled batch follows a single
    env step for step across episodes: the same hits, evictions and preemptions, so the
    same observations and rewards (its window's hashes are a slice of the whole trace's)."""
    from cbgym.engine import layout as L
    from cbgym.env import SchedulingMaskedEnv
    from cbgym.env.vector import SchedulingMaskedVectorEnv, SchedulingVectorEnv

    kw = {"trace": shared_trace(), "engine": config(), "episode_requests": 100, "K": 16,
          "R": 8, "load": 2.5, "admission_cap": not masked, "shed_rule": "unreachable",
          "slo": cbgym.SLO(2.0, 0.2)}
    n = 3
    venv = (SchedulingMaskedVectorEnv if masked else SchedulingVectorEnv)(num_envs=n, **kw)
    envs = [(SchedulingMaskedEnv if masked else SchedulingEnv)(**kw) for _ in range(n)]
    obs, _ = venv.reset(seed=3)
    for i, env in enumerate(envs):
        single, _ = env.reset(seed=3 + i)
        assert all(np.array_equal(single[k], obs[k][i]) for k in single)
    rng = np.random.default_rng(0)
    ended, episodes, t = [False] * n, 0, 0
    while episodes < n and t < 20_000:  # (a masked decision takes a pick per admission)
        t += 1
        if masked:
            masks = venv.action_masks()
            actions = np.array([rng.choice(np.flatnonzero(m)) for m in masks])
        else:
            actions = rng.uniform(-1, 1, (n, venv.single_action_space.shape[0]))
        obs, reward, term, trunc, _ = venv.step(actions)
        for i, env in enumerate(envs):
            if ended[i]:  # next-step autoreset: the single env resets itself, unseeded
                single, r, flags = env.reset()[0], 0.0, (False, False)
            else:
                single, r, te, tr, _ = env.step(actions[i])
                flags = (te, tr)
            ended[i] = any(flags)
            assert all(np.array_equal(single[k], obs[k][i]) for k in single), (t, i)
            assert (r, *flags) == (reward[i], term[i], trunc[i]), (t, i)
        episodes += int((term | trunc).sum())
    assert episodes >= n
    hits = venv.S.si[:, L.PC_HITS] + venv.S.si[:, L.PC_PRE_HITS]
    assert (hits > 0).all() and (venv.S.si[:, L.PC_EVICTED] > 0).any()


def test_vector_envs_refuse_prefix_features_and_make_vec_falls_back() -> None:
    from cbgym.env.vector import SchedulingMaskedVectorEnv, SchedulingVectorEnv

    tr = shared_trace(60)
    for cls in (SchedulingVectorEnv, SchedulingMaskedVectorEnv):
        with pytest.raises(NotImplementedError, match="no prefix_features"):
            cls(num_envs=2, trace=tr, engine=config(), episode_requests=20,
                prefix_features=True)
    for masked, features in ((False, True), (True, True), (True, False)):
        env_id = "cbgym/SchedulingMasked-v0" if masked else "cbgym/Scheduling-v0"
        venv = gym.make_vec(env_id, num_envs=2, trace=tr, engine=config(),
                            episode_requests=20, K=8, R=4, prefix_features=features)
        # (the cache's observation is the single env's; the cache alone runs compiled)
        assert isinstance(venv, SyncTaskVectorEnv) == features
        assert isinstance(venv.unwrapped, SchedulingVectorEnv) != features
        obs, _ = venv.reset(seed=0)
        assert (KEY in obs) == features
        if features:
            assert obs[KEY].shape == (2, 8 * 3 + 1)
        venv.step(venv.action_space.sample())
        venv.close()


@pytest.mark.parametrize("masked", [False, True], ids=["box", "masked"])
def test_a_learned_policy_with_prefix_features_replays_the_env_exactly(masked: bool) -> None:
    """The fast path rebuilds ``waiting_prefix`` for a model trained with it (an MLP reads
    every key), decision for decision; without prefix caching it is a clear error."""
    pytest.importorskip("stable_baselines3")
    from sb3_contrib import MaskablePPO
    from stable_baselines3 import PPO

    from cbgym.agents.learned import LearnedPolicy
    from cbgym.env import SchedulingMaskedEnv

    # (the env's own defaults: what LearnedPolicy decodes a model without settings with)
    cls = SchedulingMaskedEnv if masked else SchedulingEnv
    env = cls(trace=shared_trace(), engine=config(), load=2.5, episode_requests=100, K=16,
              R=16, prefix_features=True)
    model = (MaskablePPO if masked else PPO)("MultiInputPolicy", env, seed=3, device="cpu")
    for p in model.policy.action_net.parameters():  # (an untrained head is nearly constant)
        p.data.normal_(0.0, 0.3)
    obs, info = env.reset(seed=0, options={"start": 40})
    done = False
    while not done:
        kw = {"action_masks": info["action_mask"]} if masked else {}
        action, _ = model.predict(obs, deterministic=True, **kw)
        obs, _, done, truncated, info = env.step(action)
        done = done or truncated
    got = env.episode_result().requests
    fast = cbgym.simulate(env.episode_trace, LearnedPolicy(model), engine=env.config,
                          slo=env.slo).requests
    assert got["cached_tokens"].sum() > 0
    for col in ("first_token_s", "finish_s", "status", "cached_tokens"):
        np.testing.assert_array_equal(got[col].to_numpy(), fast[col].to_numpy(), err_msg=col)
    with pytest.raises(ValueError, match="prefix_features"):
        cbgym.simulate(env.episode_trace, LearnedPolicy(model), engine=config(
            enable_prefix_caching=False))
