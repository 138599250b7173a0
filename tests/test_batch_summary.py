"""The slot scorer's running-batch summary (``batch_summary=True``): a residual that starts at
its prior, reads the running slots as a set, saves, and is searched by the ES population."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")
th = pytest.importorskip("torch")

import cbgym  # noqa: E402
from cbgym.agents.evolution import Population  # noqa: E402
from cbgym.agents.slot_prior import as_numpy, spec_dict  # noqa: E402
from cbgym.env.observation import SLOT_FEATURES  # noqa: E402
from cbgym.env.vector import SchedulingVectorEnv  # noqa: E402
from tests.test_evolution import _kwargs  # noqa: E402
from tests.test_slot_prior import _prior  # noqa: E402

F = len(SLOT_FEATURES)


def _model(env: cbgym.SchedulingEnv, prior: bool = True):
    from stable_baselines3 import PPO

    from cbgym.agents.slot_net import SlotPolicy

    kwargs = {"net_arch": [8], "batch_summary": True}
    if prior:
        kwargs["prior"] = spec_dict(_prior(env, "cb-sjf-work-shed:6").spec)
    return PPO(SlotPolicy, env, n_steps=8, batch_size=8, device="cpu", seed=0,
               policy_kwargs=kwargs)


def _busy_obs(env: cbgym.SchedulingEnv, steps: int = 40) -> dict[str, np.ndarray]:
    """An observation with at least two running requests."""
    obs, _ = env.reset(seed=1)
    for _ in range(steps):
        obs, *_ = env.step(np.ones(env.action_space.shape, np.float32))
        if obs["running_mask"].sum() >= 2 and obs["waiting_mask"].sum() >= 1:
            return obs
    raise AssertionError("no busy decision point")


def _randomise_outputs(model) -> None:
    """Small non-zero output layers: the residual then depends on the summary."""
    gen = th.Generator().manual_seed(3)
    with th.no_grad():
        for layer in model.policy.mlp_extractor.output_layers():
            layer.weight.copy_(0.1 * th.randn(layer.weight.shape, generator=gen))


def _raw(model, obs: dict[str, np.ndarray], network_only: bool = False) -> np.ndarray:
    """The scores before clipping (``predict`` clips them to [-1, 1], where differences
    vanish): the network's part alone with ``network_only``."""
    policy = model.policy
    tensor, _ = policy.obs_to_tensor(obs)
    with th.no_grad():
        features = policy.extract_features(tensor)
        scorer = policy.mlp_extractor
        out = scorer.network_scores(features) if network_only else scorer.forward_actor(features)
    return out.numpy()[0]


def test_it_starts_as_its_prior_and_saves(tmp_path) -> None:
    from stable_baselines3 import PPO

    env = cbgym.SchedulingEnv(**_kwargs())
    model = _model(env)
    obs = _busy_obs(env)
    mean, _ = model.predict(obs, deterministic=True)
    prior = model.policy.mlp_extractor.prior
    np.testing.assert_allclose(mean, np.clip(as_numpy(prior, obs), -1, 1), atol=1e-6)
    assert not _raw(model, obs, network_only=True).any()  # a zero residual, exactly
    _randomise_outputs(model)
    moved, _ = model.predict(obs, deterministic=True)
    assert _raw(model, obs, network_only=True).any()
    model.save(tmp_path / "m.zip")
    again = PPO.load(tmp_path / "m.zip", device="cpu")
    assert again.policy.mlp_extractor.batch_pool is not None
    np.testing.assert_allclose(again.predict(obs, deterministic=True)[0], moved)


def test_it_reads_the_running_slots_as_a_set() -> None:
    env = cbgym.SchedulingEnv(**_kwargs())
    model = _model(env, prior=False)
    _randomise_outputs(model)
    obs = _busy_obs(env)
    R, K = len(obs["running_mask"]), len(obs["waiting_mask"])
    n = int(obs["running_mask"].sum())
    base = _raw(model, obs)
    occupied = np.flatnonzero(np.concatenate((obs["waiting_mask"], obs["running_mask"], [1])))
    assert np.abs(base[occupied]).max() < 1.0  # (unclipped: every comparison below counts)

    # the occupied running slots in another order: the same waiting scores and cap (the
    # running scores follow their slots)
    order = np.arange(R)
    order[:n] = order[:n][::-1]
    swapped = dict(obs)
    swapped["running"] = obs["running"].reshape(R, F)[order].reshape(-1)
    again = _raw(model, swapped)
    np.testing.assert_allclose(again[:K], base[:K], atol=1e-6)
    np.testing.assert_allclose(again[-1], base[-1], atol=1e-6)
    np.testing.assert_allclose(again[K:K + R][order], base[K:K + R], atol=1e-6)

    # an empty slot's features are ignored
    ghost = dict(obs)
    rows = obs["running"].reshape(R, F).copy()
    rows[n:] = 0.7
    ghost["running"] = rows.reshape(-1)
    seen = _raw(model, ghost)
    np.testing.assert_allclose(seen[:K], base[:K], atol=1e-6)
    np.testing.assert_allclose(seen[-1], base[-1], atol=1e-6)

    # a member of the batch changes the waiting scores and the cap
    changed = dict(obs)
    rows = obs["running"].reshape(R, F).copy()
    rows[0] = np.clip(rows[0] + 0.2, 0.0, 1.0)
    changed["running"] = rows.reshape(-1)
    moved = _raw(model, changed)
    assert np.abs(moved[:K] - base[:K])[obs["waiting_mask"] > 0.5].min() > 1e-6
    assert abs(moved[-1] - base[-1]) > 1e-6


def test_the_search_covers_the_summary() -> None:
    env = cbgym.SchedulingEnv(**_kwargs())
    model = _model(env)
    pop = Population(model.policy)
    pool = sum(p.numel() for p in model.policy.mlp_extractor.batch_pool.parameters())
    assert pool > 0
    assert pop.dim == sum(p.numel() for n, p in model.policy.mlp_extractor.named_parameters()
                          if not n.startswith("critic"))
    x0 = pop.get()
    X = x0 + 0.3 * np.random.default_rng(7).standard_normal((2, pop.dim))
    venv = SchedulingVectorEnv(num_envs=4, **_kwargs())
    obs, _ = venv.reset(seed=3)
    for _ in range(20):
        obs, *_ = venv.step(venv.action_space.sample() * 0.5)
    batched = pop.scores(X, obs)
    for p in range(2):
        pop.set(X[p])
        one = {k: v[2 * p: 2 * p + 2] for k, v in obs.items()}
        np.testing.assert_allclose(batched[2 * p: 2 * p + 2],
                                   model.predict(one, deterministic=True)[0], atol=1e-6)
    pop.set(x0)


def test_train_refuses_a_summary_it_would_not_build(capsys: pytest.CaptureFixture[str]) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import train

    assert train.parse_args(["--batch-summary"]).batch_summary
    for bad in (["--batch-summary", "--policy", "mlp"],
                ["--batch-summary", "--resume-from", "run.zip"]):
        with pytest.raises(SystemExit):
            train.parse_args(bad)
        assert "--batch-summary" in capsys.readouterr().err
