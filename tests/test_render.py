"""The ``rgb_array`` view (cbgym.env.render.render_rgb): a fixed-shape uint8 frame before
reset, mid-episode and after the episode ended, that follows the state; Gymnasium's checker
and SB3's vectorised envs and video recorder accept it."""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import cbgym  # registers the ids
from cbgym.engine import EngineConfig, LinearCostModel
from cbgym.env.render import RGB_SHAPE
from cbgym.workload.trace import Trace

IDS = {False: "cbgym/Scheduling-v0", True: "cbgym/SchedulingMasked-v0"}
TRACK = 48  # the grey of an empty strip (render.py's _EMPTY)


def make(masked: bool = False, **kw: Any) -> gym.Env:
    rng = np.random.default_rng(0)
    kw.setdefault("trace", Trace.from_arrays(np.cumsum(rng.exponential(0.2, 300)),
                                             rng.integers(20, 1500, 300),
                                             rng.integers(2, 200, 300), name="small-0"))
    kw.setdefault("engine", EngineConfig(preset=None, cost_model=LinearCostModel(),
                                         num_kv_blocks=400))
    kw.setdefault("episode_requests", 64)
    kw.setdefault("load", 1.0)
    kw.setdefault("render_mode", "rgb_array")
    return gym.make(IDS[masked], **kw)


def act(env: gym.Env, masked: bool) -> Any:
    """Admit everyone: the first allowed micro-step (slot order), or scores of 0."""
    if masked:
        return int(np.flatnonzero(env.unwrapped.action_masks())[0])
    return np.zeros(env.action_space.shape, np.float32)


def check_frame(frame: Any) -> np.ndarray:
    assert isinstance(frame, np.ndarray)
    assert frame.shape == RGB_SHAPE == (96, 192, 3) and frame.dtype == np.uint8
    return frame


@pytest.mark.parametrize("masked", [False, True])
def test_fixed_shape_before_during_and_after_the_episode(masked: bool) -> None:
    env = make(masked)
    before = check_frame(env.unwrapped.render())  # the OrderEnforcing wrapper wants reset
    env.reset(seed=0)
    frames = [check_frame(env.render())]
    for _ in range(100_000):
        _, _, terminated, truncated, _ = env.step(act(env, masked))
        frames.append(check_frame(env.render()))
        if terminated or truncated:
            break
    assert terminated
    after = check_frame(env.render())
    assert (after[10:90] == 16).all()  # no slots drawn once done: background only
    assert (after[92:96] != TRACK).all()  # every request ended: the progress strip is full
    assert not np.array_equal(before, frames[0])
    env.reset(seed=1)  # a fresh episode renders again
    check_frame(env.render())


def test_frame_follows_the_state() -> None:
    env = make()
    env.reset(seed=0)
    u = env.unwrapped
    frames = [env.render()]
    for _ in range(10):
        env.step(act(env, False))
        frame = env.render()
        frames.append(frame)
        # KV strip: the drawn length is the fraction of blocks in use
        assert (frame[0, :160] != TRACK).any(axis=-1).sum() == round(160 * u.engine.kv.usage)
        # one 5-row slot per visible waiting request (K=16: 80 // 16), 4 bar rows + gap
        n_wait = len(u.visible_waiting_ids)
        drawn = (frame[10:90:5, 0] != 16).any(axis=-1)
        assert drawn.sum() == n_wait and drawn[:n_wait].all()
        # R=32: 2-row running slots; the upper row's bar starts at column 98
        n_run = len(u.visible_running_ids)
        assert (frame[10:90:2, 98] != 16).any(axis=-1).sum() == n_run
    assert len({f.tobytes() for f in frames}) > 1
    assert not np.shares_memory(frames[-1], env.render())  # a new array every call


def test_shortfall_strip_and_other_modes() -> None:
    env = make(engine=EngineConfig(preset=None, cost_model=LinearCostModel(), num_kv_blocks=40))
    env.reset(seed=0)
    u = env.unwrapped
    seen = False
    for _ in range(500):
        frame = env.render()
        red = bool((frame[0:8, 164:192] == (230, 40, 40)).all())
        assert red == bool(u._sim.shortfall)
        seen |= red
        _, _, terminated, truncated, _ = env.step(act(env, False))
        if terminated or truncated:
            break
    assert seen, "the small KV cache should run short at least once"
    assert make(render_mode=None).unwrapped.render() is None
    assert isinstance(make(render_mode="ansi").unwrapped.render(), str)
    with pytest.raises(ValueError, match="render_mode"):
        cbgym.SchedulingEnv(render_mode="human")


def test_render_is_cheap() -> None:
    env = make()
    env.reset(seed=0)
    for _ in range(5):
        env.step(act(env, False))
    u = env.unwrapped
    u.render()
    t = time.perf_counter()
    for _ in range(200):
        u.render()
    assert (time.perf_counter() - t) / 200 < 1e-3


def test_gymnasium_check_env_accepts_rgb_array() -> None:
    from gymnasium.utils.env_checker import check_env

    env = gym.make("cbgym/Scheduling-v0", render_mode="rgb_array", episode_requests=64,
                   trace="synthetic-conv")  # offline: the default task's settings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env.unwrapped)
    assert not [w for w in caught if "render" in str(w.message).lower()], caught
    assert not caught, [str(w.message) for w in caught]


@pytest.mark.parametrize("env_id", ["cbgym/Scheduling-v0", "cbgym/SchedulingMasked-v0"])
def test_sb3_vec_env_and_video_recorder(tmp_path: Path, env_id: str) -> None:
    from stable_baselines3.common.env_util import make_vec_env

    vec = make_vec_env(env_id, n_envs=2,
                       env_kwargs=dict(render_mode="rgb_array", episode_requests=64,
                                       trace="synthetic-conv"))
    assert vec.render_mode == "rgb_array"
    vec.reset()
    for _ in range(3):
        vec.step(np.stack([vec.action_space.sample() for _ in range(2)]))
    images = vec.get_images()
    assert len(images) == 2 and all(check_frame(i) is i for i in images)
    tiled = vec.render()
    assert isinstance(tiled, np.ndarray) and tiled.dtype == np.uint8 and tiled.ndim == 3
    vec.close()

    pytest.importorskip("moviepy")  # VecVideoRecorder needs it (the dev extra has it)
    from stable_baselines3.common.vec_env import VecVideoRecorder

    vec = make_vec_env(env_id, n_envs=2,
                       env_kwargs=dict(render_mode="rgb_array", episode_requests=64,
                                       trace="synthetic-conv"))
    rec = VecVideoRecorder(vec, str(tmp_path), record_video_trigger=lambda step: step == 0,
                           video_length=4, name_prefix="cbgym")
    rec.reset()
    for _ in range(3):
        rec.step(np.stack([vec.action_space.sample() for _ in range(2)]))
    assert len(rec.recorded_frames) == 4
    assert all(f.dtype == np.uint8 and f.ndim == 3 for f in rec.recorded_frames)
    for _ in range(2):  # the fifth frame passes video_length: the video is written
        rec.step(np.stack([vec.action_space.sample() for _ in range(2)]))
    rec.close()
    videos = list(tmp_path.glob("cbgym-*.mp4"))
    assert len(videos) == 1 and videos[0].stat().st_size > 0
