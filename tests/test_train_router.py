"""``tools/train_router.py``'s behaviour clone: demonstrations with their returns, and a
clone that fits both the rule's routes and, for PPO's first advantages, its values."""

from __future__ import annotations

import numpy as np
import pytest

from cbgym.env.cluster_env import ClusterEnv
from tests.conftest import load_script


def _tool():  # type: ignore[no-untyped-def]
    return load_script("tools/train_router.py")


def test_demonstrations_carry_each_episodes_discounted_returns() -> None:
    tool = _tool()
    env = ClusterEnv(cluster="2p2d:llama-2-7b/a100-80gb", episode_requests=30, load=0.8)
    obs, acts, ret = tool.demonstrate(env, "kairos", 50, seed=0, gamma=0.9)
    assert len(acts) == len(ret) == len(obs["request"]) >= 50  # whole episodes
    # replay the first episode: each return is its reward plus the discounted next return
    env.reset(seed=0)
    rewards, done = [], False
    for a in acts:
        _, r, done, _, _ = env.step(int(a))
        rewards.append(r)
        if done:
            break
    n = len(rewards)
    assert ret[n - 1] == pytest.approx(rewards[-1])
    expect = np.array(rewards[:-1]) + 0.9 * ret[1:n]
    np.testing.assert_allclose(ret[: n - 1], expect, rtol=1e-5, atol=1e-5)
    assert ret[0] > 0  # some request of the window is good


def test_the_clone_fits_the_routes_and_the_values() -> None:
    sb3 = pytest.importorskip("sb3_contrib")
    import torch as th

    tool = _tool()
    env = ClusterEnv(cluster="2p2d:llama-2-7b/a100-80gb", episode_requests=30, load=0.8)
    obs, acts, ret = tool.demonstrate(env, "kairos", 300, seed=0, gamma=0.99)
    model = sb3.MaskablePPO("MultiInputPolicy", env, n_steps=64, batch_size=32, seed=0)

    def value_error() -> float:
        with th.no_grad():
            v = model.policy.predict_values({k: th.as_tensor(x) for k, x in obs.items()})
        return float(((v.squeeze(-1).numpy() - ret) ** 2).mean())

    before = value_error()
    _, agree = tool.clone(model.policy, obs, acts, ret, epochs=30, seed=0, batch=32)
    assert agree > 0.5  # (an untrained policy: about one route in 15)
    assert value_error() < 0.25 * before
