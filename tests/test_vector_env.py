"""The native vector env: one compiled call steps N envs, each exactly a single env.

1. ``gymnasium.make_vec`` builds it by default, with batched spaces;
2. env i of ``reset(seed=s)`` follows a single env reset with s + i, step for step and across
   episodes, for any N and thread count, in the three autoreset modes;
3. the flat observation is the Dict's ``spaces.flatten``;
4. bad actions and options are refused with a message, nothing stepped;
5. pickling, reset masks, options, and the sheds before the first decision.
"""

from __future__ import annotations

import pickle

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.error import ResetNeeded
from gymnasium.vector import AutoresetMode

import cbgym
from cbgym.env.action import InvalidActionError
from cbgym.env.vector import SchedulingVectorEnv

ID = "cbgym/Scheduling-v0"
# the env's own layout on the offline trace (the default task appends a cap score)
FAST = {"episode_requests": 24, "load": (0.8, 1.4), "trace": "synthetic-conv",
        "admission_cap": False}


def single_runs(n: int, seed: int, actions: np.ndarray, **kw) -> list[list[tuple]]:
    """Each env's (obs, reward, terminated, truncated) per step, from single envs that reset
    themselves (without a seed) after an episode ends, as next-step autoreset does."""
    runs = []
    for i in range(n):
        env = gym.make(ID, **{**FAST, **kw}).unwrapped
        obs, _ = env.reset(seed=seed + i)
        steps, ended = [(obs, 0.0, False, False)], False
        for a in actions[:, i]:
            if ended:
                obs, _ = env.reset()
                steps.append((obs, 0.0, False, False))
                ended = False
                continue
            obs, r, te, tr, _ = env.step(a)
            steps.append((obs, r, te, tr))
            ended = te or tr
        runs.append(steps)
    return runs


def same(obs_a: dict, obs_b: dict, i: int) -> bool:
    return all(np.array_equal(obs_a[k], obs_b[k][i]) for k in obs_a)


def random_actions(steps: int, n: int, seed: int = 0, size: int = 48) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, (steps, n, size))


def test_make_vec_builds_the_native_vector_env() -> None:
    venv = gym.make_vec(ID, num_envs=3, **FAST)
    assert isinstance(venv.unwrapped, SchedulingVectorEnv)
    assert venv.action_space.shape == (3, 48)
    assert venv.observation_space["waiting"].shape == (3, 128)
    obs, info = venv.reset(seed=0)
    assert venv.observation_space.contains(obs)
    assert info["num_shed"].shape == (3,) and info["_num_shed"].all()


@pytest.mark.parametrize(("n", "threads"), [(1, 1), (3, 1), (3, 2)])
def test_env_i_is_a_single_env_seeded_s_plus_i(n: int, threads: int) -> None:
    actions = random_actions(160, n)
    expected = single_runs(n, 7, actions)
    venv = gym.make_vec(ID, num_envs=n, num_threads=threads, **FAST)
    obs, _ = venv.reset(seed=7)
    episodes = 0
    for i in range(n):
        assert same(expected[i][0][0], obs, i)
    for t, a in enumerate(actions, start=1):
        obs, r, te, tr, _ = venv.step(a)
        for i in range(n):
            e_obs, e_r, e_te, e_tr = expected[i][t]
            assert same(e_obs, obs, i), (t, i)
            assert (e_r, e_te, e_tr) == (r[i], te[i], tr[i]), (t, i)
        episodes += int((te | tr).sum())
    assert episodes >= n  # the run crossed episode boundaries


def test_the_task_env_settings_batch_as_single_envs() -> None:
    """The cap score and the unreachable shed rule (the tasks' env) decode alike in both."""
    kw = {**FAST, "admission_cap": True, "shed_rule": "unreachable", "load": 1.6,
          "slo": cbgym.SLO(0.3, 0.1)}
    actions = random_actions(200, 2, seed=3, size=49)
    actions[..., :16] = np.where(actions[..., :16] < -0.9, -1.0, actions[..., :16])  # sheds
    expected = single_runs(2, 5, actions, **kw)
    venv = gym.make_vec(ID, num_envs=2, **kw)
    obs, _ = venv.reset(seed=5)
    shed = 0
    for t, a in enumerate(actions, start=1):
        obs, r, te, tr, info = venv.step(a)
        shed += int(info["num_shed"].sum())
        for i in range(2):
            e_obs, e_r, e_te, e_tr = expected[i][t]
            assert same(e_obs, obs, i), (t, i)
            assert (e_r, e_te, e_tr) == (r[i], te[i], tr[i]), (t, i)
    assert shed > 0


def test_same_step_autoreset_reports_the_final_observation() -> None:
    n, actions = 2, random_actions(120, 2, seed=1)
    venv = gym.make_vec(ID, num_envs=n, autoreset_mode=AutoresetMode.SAME_STEP, **FAST)
    venv.reset(seed=3)
    envs = [gym.make(ID, **FAST).unwrapped for _ in range(n)]
    for i, env in enumerate(envs):
        env.reset(seed=3 + i)
    finals = 0
    for a in actions:
        obs, r, te, tr, info = venv.step(a)
        for i, env in enumerate(envs):
            e_obs, e_r, e_te, e_tr, _ = env.step(a[i])
            assert (e_r, e_te, e_tr) == (r[i], te[i], tr[i])
            if e_te or e_tr:  # the final observation in info, the next episode's in obs
                final = info["final_obs"][i]  # Gymnasium's object array of observations
                assert info["_final_obs"][i] and all(np.array_equal(e_obs[k], final[k])
                                                     for k in e_obs)
                assert info["_final_info"][i]
                e_obs, _ = env.reset()
                finals += 1
            else:
                assert not info.get("_final_obs", np.zeros(n, bool))[i]
            assert same(e_obs, obs, i)
    assert finals >= n


def test_disabled_autoreset_waits_for_a_reset_mask() -> None:
    venv = gym.make_vec(ID, num_envs=2, autoreset_mode=AutoresetMode.DISABLED, max_steps=3,
                        **FAST)
    venv.reset(seed=0)
    for _ in range(3):
        _, _, te, tr, _ = venv.step(np.zeros((2, 48)))
    assert (te | tr).all()
    with pytest.raises(ResetNeeded, match="reset_mask"):
        venv.step(np.zeros((2, 48)))
    obs, info = venv.reset(options={"reset_mask": np.array([True, False])})
    assert info["_num_shed"].tolist() == [True, False]
    with pytest.raises(ResetNeeded):
        venv.step(np.zeros((2, 48)))  # env 1 still ended
    venv.reset(options={"reset_mask": np.array([False, True])})
    venv.step(np.zeros((2, 48)))


def test_thread_counts_give_identical_batches() -> None:
    actions = random_actions(200, 6, seed=2)
    results = []
    for threads in (1, 2):
        venv = gym.make_vec(ID, num_envs=6, num_threads=threads, **FAST)
        obs, _ = venv.reset(seed=11)
        trace = [obs["global"].copy()]
        for a in actions:
            obs, r, te, tr, info = venv.step(a)
            trace += [obs["waiting"].copy(), r, te, tr, info["sim_time_s"]]
        results.append(trace)
    assert all(np.array_equal(x, y) for x, y in zip(*results, strict=True))


def test_flat_observation_is_the_flattened_dict() -> None:
    d = gym.make_vec(ID, num_envs=2, **FAST)
    f = gym.make_vec(ID, num_envs=2, observation="flat", **FAST)
    space = d.unwrapped.single_observation_space
    od, _ = d.reset(seed=5)
    of, _ = f.reset(seed=5)
    assert f.observation_space.shape == (2, spaces.flatdim(space))
    for _ in range(20):
        for i in range(2):
            one = {k: v[i] for k, v in od.items()}
            assert np.array_equal(spaces.flatten(space, one), of[i])
        a = np.random.default_rng(0).uniform(-1, 1, (2, 48))
        od, *_ = d.step(a)
        of, *_ = f.step(a)


def test_bad_actions_are_refused_and_nothing_steps() -> None:
    venv = gym.make_vec(ID, num_envs=2, **FAST)
    venv.reset(seed=0)
    now = venv.unwrapped.S.sf[:, 0].copy()
    bad = np.zeros((2, 48))
    bad[1, 5] = 1.5
    with pytest.raises(InvalidActionError, match=r"actions\[1, 5\] is 1.5"):
        venv.step(bad)
    bad[1, 5] = np.nan
    with pytest.raises(InvalidActionError, match=r"actions\[1, 5\]"):
        venv.step(bad)
    with pytest.raises(InvalidActionError, match="shape"):
        venv.step(np.zeros((3, 48)))
    assert np.array_equal(venv.unwrapped.S.sf[:, 0], now)
    with pytest.raises(ValueError, match="unknown keys"):
        venv.reset(options={"trace": None})
    with pytest.raises(ValueError, match="num_threads"):
        gym.make_vec(ID, num_envs=2, num_threads=0)


def test_options_fix_the_window_like_the_single_env() -> None:
    env = gym.make(ID, **FAST)
    venv = gym.make_vec(ID, num_envs=2, **FAST)
    o1, _ = env.reset(seed=0, options={"start": 40, "load": 1.1})
    ov, _ = venv.reset(seed=9, options={"start": 40, "load": 1.1})
    assert same(o1, ov, 0) and same(o1, ov, 1)
    with pytest.raises(ValueError, match="start"):
        venv.reset(options={"start": 10**9})


def test_pickled_vector_env_continues_identically() -> None:
    venv = gym.make_vec(ID, num_envs=3, **FAST).unwrapped
    venv.reset(seed=4)
    actions = random_actions(60, 3, seed=4)
    for a in actions[:30]:
        venv.step(a)
    twin = pickle.loads(pickle.dumps(venv))
    for a in actions[30:]:
        o1, r1, *_ = venv.step(a)
        o2, r2, *_ = twin.step(a)
        assert np.array_equal(r1, r2) and all(np.array_equal(o1[k], o2[k]) for k in o1)


def test_reset_info_counts_requests_shed_before_the_first_decision() -> None:
    prompts = [100] * 10 + [10**6] * 3  # three prompts can never fit
    trace = cbgym.Trace.from_arrays(np.arange(13) * 0.01, prompts, [5] * 13)
    cfg = cbgym.EngineConfig(preset=None, cost_model=cbgym.LinearCostModel(),
                             num_kv_blocks=64)
    env = gym.make(ID, trace=trace, engine=cfg, episode_requests=13, load=None,
                   admission_cap=False)
    venv = gym.make_vec(ID, num_envs=2, trace=trace, engine=cfg, episode_requests=13,
                        load=None, admission_cap=False)
    _, info = env.reset(seed=0)
    _, vinfo = venv.reset(seed=0)
    shed_later, ended = 0, False
    while not ended:
        _, _, te, tr, step_info = env.step(np.ones(48, np.float32))
        shed_later += step_info["num_shed"]
        ended = te or tr
    assert info["num_shed"] + shed_later == 3
    assert vinfo["num_shed"].tolist() == [info["num_shed"]] * 2


MASKED = "cbgym/SchedulingMasked-v0"


@pytest.mark.parametrize("threads", [1, 2])
def test_masked_env_i_is_a_single_masked_env(threads: int) -> None:
    n, steps = 3, 300
    rng = np.random.default_rng(5)
    venv = gym.make_vec(MASKED, num_envs=n, num_threads=threads, **FAST)
    envs = [gym.make(MASKED, **FAST).unwrapped for _ in range(n)]
    obs, info = venv.reset(seed=2)
    for i, env in enumerate(envs):
        e_obs, e_info = env.reset(seed=2 + i)
        assert same(e_obs, obs, i)
        assert np.array_equal(e_info["action_mask"], info["action_mask"][i])
    assert venv.action_masks().shape == (n, 16 + 32 + 1)
    ended = np.zeros(n, bool)
    invalid = 0
    for _ in range(steps):
        masks = venv.action_masks()
        # mostly allowed picks, sometimes a masked one (it acts as STOP in both)
        picks = np.array([rng.choice(np.flatnonzero(m)) if rng.random() < 0.9
                          else rng.integers(0, len(m)) for m in masks])
        obs, r, te, tr, info = venv.step(picks)
        for i, env in enumerate(envs):
            if ended[i]:
                e_obs, e_info = env.reset()
                e_r, e_te, e_tr = 0.0, False, False
            else:
                e_obs, e_r, e_te, e_tr, e_info = env.step(int(picks[i]))
                assert e_info["invalid_action"] == info["invalid_action"][i]
                invalid += e_info["invalid_action"]
            assert same(e_obs, obs, i) and (e_r, e_te, e_tr) == (r[i], te[i], tr[i])
            assert np.array_equal(env.action_masks(), venv.action_masks()[i])
        ended = te | tr
    assert invalid > 0


def test_masked_vector_env_can_raise_on_masked_picks() -> None:
    venv = gym.make_vec(MASKED, num_envs=2, invalid_action="raise", **FAST)
    _, info = venv.reset(seed=0)
    bad = int(np.flatnonzero(info["action_mask"][1] == 0)[0])
    with pytest.raises(InvalidActionError, match=r"actions\[1\]"):
        venv.step(np.array([venv.unwrapped.proto.STOP, bad]))
    with pytest.raises(InvalidActionError, match="one pick per env"):
        venv.step(np.zeros((2, 3)))
    with pytest.raises(InvalidActionError, match="integer picks"):
        venv.step(np.zeros(2))  # floats: malformed (acting as STOP under the default)


def test_reset_mask_views_and_refused_resets_leave_state_alone() -> None:
    venv = gym.make_vec(ID, num_envs=2, autoreset_mode=AutoresetMode.DISABLED, max_steps=2,
                        **FAST).unwrapped
    venv.reset(seed=0)
    for _ in range(2):
        venv.step(np.zeros((2, 48)))
    big = np.array([True, True, False, False])
    venv.reset(options={"reset_mask": big[::2]})  # a strided view: env 0 only
    assert venv.V[:, 0].tolist() == [0, 2]
    before = [venv.windows.start.copy(), [r.bit_generator.state for r in venv.draws.rngs]]
    with pytest.raises(ValueError, match="start"):
        venv.reset(options={"start": [5, 10**9]})
    with pytest.raises(ValueError, match="seed 1"):
        venv.reset(seed=[1, -5])
    assert np.array_equal(venv.windows.start, before[0])
    assert [r.bit_generator.state for r in venv.draws.rngs] == before[1]


def test_next_step_autoreset_ignores_the_resetting_envs_actions() -> None:
    venv = gym.make_vec(ID, num_envs=2, max_steps=1, **FAST)
    venv.reset(seed=0)
    venv.step(np.zeros((2, 48)))  # both truncate
    bad = np.full((2, 48), 7.0)  # ignored: both envs reset at this step
    obs, r, te, tr, _ = venv.step(bad)
    assert not (te | tr).any() and (r == 0).all()
    masked = gym.make_vec(MASKED, num_envs=2, max_steps=1, invalid_action="raise", **FAST)
    _, info = masked.reset(seed=0)
    masked.step(np.full(2, 48))
    masked.step(np.zeros(2, np.int64))  # would be masked, but the envs reset


def test_same_step_final_info_and_final_obs_follow_gymnasium() -> None:
    venv = gym.make_vec(MASKED, num_envs=2, autoreset_mode=AutoresetMode.SAME_STEP,
                        max_steps=2, **FAST)
    venv.reset(seed=0)
    venv.step(np.full(2, 48))
    _, _, _, tr, info = venv.step(np.full(2, 48))
    assert tr.all() and info["final_obs"].dtype == object
    assert set(info["final_obs"][1]) == set(venv.single_observation_space.spaces)
    stop_only = np.zeros(49, np.int8)
    stop_only[48] = 1
    assert all(np.array_equal(m, stop_only) for m in info["final_info"]["action_mask"])


def test_a_window_that_cannot_be_scaled_fails_when_it_would_start() -> None:
    arrival = np.concatenate([np.arange(24) * 0.1, np.full(24, 5.0)])
    trace = cbgym.Trace.from_arrays(arrival, [100] * 48, [5] * 48)
    kw = {"trace": trace, "episode_requests": 24, "load": 1.0, "capacity_rps": 5.0,
          "admission_cap": False}
    venv = gym.make_vec(ID, num_envs=1, **kw).unwrapped
    venv.reset(options={"start": 0})  # a good window now, whatever comes next
    venv.draws.set(0, 24, 1.0)  # the next one: 24 equal arrival times
    for _ in range(500):
        _, _, te, tr, _ = venv.step(np.ones((1, 48)))
        if te[0] or tr[0]:
            break
    with pytest.raises(ValueError, match="distinct arrival times"):
        venv.step(np.ones((1, 48)))  # the autoreset would start it: refused before stepping
