"""cbgym.env.sb3: Gymnasium VectorEnv -> stable-baselines3 VecEnv adapter."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.wrappers.vector import RecordEpisodeStatistics
from sb3_contrib import MaskablePPO
from sb3_contrib.common.maskable.utils import get_action_masks, is_masking_supported
from stable_baselines3 import PPO
from stable_baselines3.common.vec_env import VecEnv, VecMonitor

import cbgym  # noqa: F401  (registers the ids)
from cbgym.env.sb3 import SB3VecEnv, make_sb3_vec_env

BOX, MASKED = "cbgym/Scheduling-v0", "cbgym/SchedulingMasked-v0"
FAST: dict[str, Any] = {"episode_requests": 64}
SAME = {"autoreset_mode": AutoresetMode.SAME_STEP}


def raw_vec(env_id: str, n: int, **kw: Any) -> gym.vector.VectorEnv:
    return gym.make_vec(env_id, num_envs=n, vectorization_mode="sync", vector_kwargs=SAME,
                        **FAST, **kw)


def random_actions(env: VecEnv, rng: np.random.Generator) -> np.ndarray:
    space = env.action_space
    if isinstance(space, gym.spaces.Discrete):  # a random allowed action per env
        return np.array([rng.choice(np.flatnonzero(m)) for m in get_action_masks(env)])
    return rng.uniform(-1, 1, (env.num_envs, *space.shape)).astype(np.float32)


def assert_batch(obs: Any, space: gym.spaces.Dict, n: int) -> None:
    assert isinstance(obs, dict) and set(obs) == set(space.spaces)
    for key, sub in space.spaces.items():
        assert obs[key].shape == (n, *sub.shape) and obs[key].dtype == sub.dtype
        assert all(sub.contains(row) for row in obs[key])


@pytest.mark.parametrize("env_id", [BOX, MASKED])
def test_api_shapes_and_dtypes(env_id: str) -> None:
    env = make_sb3_vec_env(env_id, 3, seed=0, **FAST)
    assert isinstance(env, VecEnv) and env.num_envs == 3
    assert env.observation_space == gym.spec(env_id).make(**FAST).observation_space
    obs = env.reset()
    assert_batch(obs, env.observation_space, 3)
    assert len(env.reset_infos) == 3 and "sim_time_s" in env.reset_infos[0]
    rng = np.random.default_rng(0)
    for _ in range(3):
        obs, rewards, dones, infos = env.step(random_actions(env, rng))
        assert_batch(obs, env.observation_space, 3)
        assert rewards.shape == (3,) and rewards.dtype == np.float32
        assert dones.shape == (3,) and dones.dtype == np.bool_
        assert isinstance(infos, list) and len(infos) == 3
        assert all(isinstance(i, dict) and "num_finished" in i for i in infos)
        assert isinstance(infos[0]["reward_components"], dict)  # nested infos unbatched too
    env.close()


def test_rejects_other_autoreset_modes() -> None:
    venv = gym.make_vec(BOX, num_envs=2, vectorization_mode="sync", **FAST)  # NEXT_STEP
    with pytest.raises(ValueError, match="NEXT_STEP.*SAME_STEP"):
        SB3VecEnv(venv)


def test_terminal_observation_exactly_when_an_episode_ends() -> None:
    """max_steps=5: every env truncates at step 5; the adapter agrees with the raw vector env.

    Both sides carry Gymnasium's vector ``RecordEpisodeStatistics``: the adapter passes its
    per-env statistics through unchanged (before gymnasium 1.4 that wrapper assumes next-step
    autoreset and counts a same-step episode after the first one step short, so the count
    itself is checked with SB3's ``VecMonitor`` below).
    """
    env = SB3VecEnv(RecordEpisodeStatistics(raw_vec(BOX, 2, max_steps=5)))
    twin = RecordEpisodeStatistics(raw_vec(BOX, 2, max_steps=5))
    env.seed(3)
    obs = env.reset()
    twin_obs, _ = twin.reset(seed=3)
    env.reset_infos = [{}, {}]  # refilled from the autoreset's info when an episode ends
    rng = np.random.default_rng(0)
    for t in range(1, 12):
        actions = random_actions(env, rng)
        obs, _, dones, infos = env.step(actions)
        twin_obs, _, term, trunc, twin_info = twin.step(actions)
        np.testing.assert_array_equal(obs["global"], twin_obs["global"])
        ended = t % 5 == 0
        assert list(dones) == [ended, ended]
        for i, info in enumerate(infos):
            assert ("terminal_observation" in info) == ended
            assert ("TimeLimit.truncated" in info) == ended
            if not ended:
                continue
            assert info["TimeLimit.truncated"] is True and trunc[i] and not term[i]
            final = twin_info["final_obs"][i]
            for key, value in info["terminal_observation"].items():
                assert value.shape == env.observation_space[key].shape
                np.testing.assert_array_equal(value, final[key])
            # the ended episode's final info (not the reset's) plus the episode statistics
            assert info["sim_time_s"] == twin_info["final_info"]["sim_time_s"][i]
            assert env.reset_infos[i]["sim_time_s"] == twin_info["sim_time_s"][i]
            stats = twin_info["episode"]
            assert info["episode"] == {k: stats[k][i] for k in ("r", "l")} | {
                "t": info["episode"]["t"]}
    env.close()


def test_vec_monitor_counts_same_step_episodes_exactly() -> None:
    """SB3's VecMonitor over the adapter: every episode 5 steps, its return the rewards' sum."""
    env = VecMonitor(make_sb3_vec_env(BOX, 2, seed=3, max_steps=5, **FAST))
    env.reset()
    rng = np.random.default_rng(0)
    sums = np.zeros(2)
    for t in range(1, 16):
        _, rewards, dones, infos = env.step(random_actions(env, rng))
        sums += rewards
        for i, info in enumerate(infos):
            assert dones[i] == (t % 5 == 0)
            if dones[i]:
                assert info["episode"]["l"] == 5
                assert info["episode"]["r"] == pytest.approx(sums[i], abs=1e-5)
                sums[i] = 0.0


def test_natural_termination_is_not_a_time_limit() -> None:
    env = make_sb3_vec_env(MASKED, 2, seed=1, **FAST)
    env.reset()
    rng = np.random.default_rng(1)
    ends: list[dict[str, Any]] = []
    for _ in range(2000):
        _, _, dones, infos = env.step(random_actions(env, rng))
        ends += [info for info, done in zip(infos, dones, strict=True) if done]
        assert all(("terminal_observation" in i) == d for i, d in zip(infos, dones, strict=True))
        if len(ends) >= 2:
            break
    assert ends and any(not e["TimeLimit.truncated"] for e in ends)
    assert all(env.observation_space.contains(e["terminal_observation"]) for e in ends)


def test_seeding_reproduces_first_observations() -> None:
    first = []
    for _ in range(2):
        env = make_sb3_vec_env(BOX, 2, seed=11, **FAST)
        first.append(env.reset())
    twin_obs, _ = raw_vec(BOX, 2).reset(seed=11)  # env i gets seed + i
    for key in first[0]:
        np.testing.assert_array_equal(first[0][key], first[1][key])
        np.testing.assert_array_equal(first[0][key], twin_obs[key])
    assert env._seeds == [None, None]  # seeds are used once
    assert env.seed(5) == [5, 6]


def test_options_reach_the_next_reset() -> None:
    env = make_sb3_vec_env(BOX, 2, **FAST)
    env.set_options({"start": 0, "load": 0.5})  # same window and load in both envs
    obs = env.reset()
    for value in obs.values():
        np.testing.assert_array_equal(value[0], value[1])
    env.set_options({"bogus": 1})
    with pytest.raises(ValueError, match="unknown keys"):
        env.reset()


def test_attributes_methods_and_render() -> None:
    env = make_sb3_vec_env(MASKED, 2, seed=0, render_mode="ansi", **FAST)
    env.reset()
    assert env.get_attr("K") == [16, 16] and env.get_attr("K", indices=1) == [16]
    assert env.get_attr("render_mode") == ["ansi", "ansi"]  # the vector env's own attribute
    env.set_attr("hold_threshold", -0.25, indices=[1])
    assert env.get_attr("hold_threshold") == [-0.5, -0.25]
    assert not env.has_attr("no_such_attribute") and is_masking_supported(env)
    masks = env.env_method("action_masks")
    assert len(masks) == 2 and masks[0].shape == (env.action_space.n,)
    assert env.env_is_wrapped(gym.Wrapper) == [True, True]
    rendered = env.render()
    assert rendered is not None and isinstance(rendered[0], str)


class BatchedMasks(SyncVectorEnv):
    """Stands in for a native vector env: a batched ``action_masks()`` of shape (N, n)."""

    calls = 0

    def action_masks(self) -> np.ndarray:
        BatchedMasks.calls += 1
        return np.stack(self.call("action_masks"))


def native(num_envs: int, autoreset_mode: AutoresetMode = AutoresetMode.NEXT_STEP,
           **kwargs: Any) -> BatchedMasks:
    return BatchedMasks([lambda: gym.make(MASKED, **kwargs) for _ in range(num_envs)],
                        autoreset_mode=autoreset_mode)


@pytest.fixture
def native_id() -> Iterator[str]:
    env_id = "cbgym-test/NativeMasked-v0"
    gym.register(env_id, entry_point="cbgym.env.scheduling_env:SchedulingMaskedEnv",
                 vector_entry_point=native)
    yield env_id
    del gym.registry[env_id]


def test_vector_entry_point_and_batched_masks(native_id: str) -> None:
    env = make_sb3_vec_env(native_id, 3, seed=0, **FAST)
    assert isinstance(env.venv, BatchedMasks)
    env.reset()
    before = BatchedMasks.calls
    masks = get_action_masks(env)  # stacks env_method("action_masks")
    assert masks.shape == (3, env.action_space.n) and BatchedMasks.calls == before + 1
    assert len(env.env_method("action_masks", indices=[2])) == 1
    env.step(random_actions(env, np.random.default_rng(0)))


def test_ppo_trains_on_scheduling() -> None:
    env = VecMonitor(make_sb3_vec_env(BOX, 2, seed=0, max_steps=40, **FAST))
    model = PPO("MultiInputPolicy", env, n_steps=256, batch_size=128, n_epochs=2,
                device="cpu", seed=0)
    model.learn(2000)  # the 40-step truncations bootstrap from the dict terminal_observation
    assert model.num_timesteps >= 2000 and any(e["l"] == 40 for e in model.ep_info_buffer)


def test_maskable_ppo_trains_with_masks_from_env_method() -> None:
    env = VecMonitor(make_sb3_vec_env(MASKED, 2, seed=0, **FAST))
    model = MaskablePPO("MultiInputPolicy", env, n_steps=256, batch_size=128, n_epochs=2,
                        device="cpu", seed=0)
    model.learn(2000)  # the default invalid_action="raise" would fail on a masked action
    assert model.num_timesteps >= 2000 and len(model.ep_info_buffer) > 0
