"""The slot scorer's heuristic prior (residual policy learning): it plays the heuristic."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("torch")
pytest.importorskip("stable_baselines3")

import cbgym  # noqa: E402
from cbgym.agents.slot_prior import HeuristicPrior, as_numpy, prior_spec  # noqa: E402
from cbgym.engine import EngineConfig, LinearCostModel  # noqa: E402
from tests.test_imitation import overload_env  # noqa: E402


def _prior(env: cbgym.SchedulingEnv, policy: str) -> HeuristicPrior:
    from stable_baselines3.common.preprocessing import get_flattened_obs_dim

    slices, start = {}, 0
    for key, sub in env.observation_space.spaces.items():
        size = get_flattened_obs_dim(sub)
        slices[key] = slice(start, start + size)
        start += size
    spec = prior_spec(policy, env.config, env.slo, env.hold_threshold, env.admission_cap)
    return HeuristicPrior(spec, slices, env.K, env.R, 8)


def _played(env: cbgym.SchedulingEnv, prior: HeuristicPrior) -> pd.DataFrame:
    """One episode from seed 0 played by the prior's scores alone: its request table."""
    obs, _ = env.reset(seed=0)
    done = False
    while not done:
        obs, _, te, tr, _ = env.step(np.clip(as_numpy(prior, obs), -1.0, 1.0))
        done = te or tr
    return env.episode_result().requests


def test_the_prior_alone_plays_the_heuristic_request_for_request() -> None:
    """While the queue fits the visible window, the prior's scores (read from the observation
    alone) make the env take cb-sjf-work-shed:6's decisions: admissions, sheds and the cap."""
    env = overload_env(K=64)
    played = _played(env, _prior(env, "cb-sjf-work-shed:6"))
    fast = cbgym.simulate(env.episode_trace, "cb-sjf-work-shed:6", engine=env.config,
                          slo=env.slo).requests
    assert (played["status"] == "shed").sum() > 0
    for col in ("first_scheduled_s", "finish_s", "status"):
        np.testing.assert_array_equal(played[col].to_numpy(), fast[col].to_numpy(), err_msg=col)


@pytest.mark.parametrize(("policy", "shed"), [("cb-sjf-work-fit:6", -0.51),
                                              ("cb-sjf-work-fit", -0.99)])
def test_the_fit_prior_alone_plays_cb_sjf_work_fit_request_for_request(policy: str,
                                                                       shed: float) -> None:
    """The same for cb-sjf-work-fit: its held requests (the batch would make one of them miss
    the TTFT target) included."""
    env = overload_env(K=64, shed_threshold=shed)
    prior = _prior(env, policy)
    obs, _ = env.reset(seed=0)
    done, held = False, 0
    while not done:
        scores = np.clip(as_numpy(prior, obs), -1.0, 1.0)
        held += int(np.sum((scores[: env.K] > -0.99) & (scores[: env.K] < env.hold_threshold)))
        obs, _, te, tr, _ = env.step(scores)
        done = te or tr
    played = env.episode_result().requests
    fast = cbgym.simulate(env.episode_trace, policy, engine=env.config,
                          slo=env.slo).requests
    assert held > 0 and (played["status"] == "shed").sum() > 0
    for col in ("first_scheduled_s", "finish_s", "status"):
        np.testing.assert_array_equal(played[col].to_numpy(), fast[col].to_numpy(), err_msg=col)


@pytest.mark.parametrize("policy", ["cb-sjf-work-fit-tiers:6", "cb-sjf-work-fit-tiers"])
def test_the_tiers_prior_alone_plays_cb_sjf_work_fit_tiers_request_for_request(
        policy: str) -> None:
    """The same for cb-sjf-work-fit-tiers on two SLO tiers (the tight one admitted first)."""
    rng = np.random.default_rng(4)
    n = 300
    trace = cbgym.Trace.from_arrays(np.cumsum(rng.exponential(0.02, n)),
                                    rng.integers(20, 1500, n), rng.integers(2, 200, n),
                                    slo_class=rng.integers(0, 2, n))
    env = overload_env(K=64, trace=trace, slo={0: cbgym.SLO(0.5, 0.05), 1: cbgym.SLO(5.0, 0.1)})
    played = _played(env, _prior(env, policy))
    fast = cbgym.simulate(env.episode_trace, policy, engine=env.config, slo=env.slo).requests
    plain = cbgym.simulate(env.episode_trace, policy.replace("-tiers", ""), engine=env.config,
                           slo=env.slo).requests
    assert not plain["first_scheduled_s"].equals(fast["first_scheduled_s"])  # tiers matter
    for col in ("first_scheduled_s", "finish_s", "status"):
        np.testing.assert_array_equal(played[col].to_numpy(), fast[col].to_numpy(), err_msg=col)


def test_a_policy_with_a_prior_starts_as_the_prior_and_saves_it(tmp_path) -> None:
    import torch as th
    from stable_baselines3 import PPO

    from cbgym.agents.slot_net import SlotPolicy
    from cbgym.agents.slot_prior import spec_dict

    env = overload_env(K=16)
    prior = _prior(env, "cb-sjf-work-shed:6")
    model = PPO(SlotPolicy, env, n_steps=8, batch_size=8, device="cpu",
                policy_kwargs={"prior": spec_dict(prior.spec)})
    obs, _ = env.reset(seed=1)
    for _ in range(5):
        obs, *_ = env.step(env.action_space.sample())
    mean, _ = model.predict(obs, deterministic=True)
    np.testing.assert_allclose(mean, np.clip(as_numpy(prior, obs), -1, 1), atol=1e-6)
    model.save(tmp_path / "m.zip")
    again = PPO.load(tmp_path / "m.zip", device="cpu")
    assert again.policy.mlp_extractor.prior is not None
    with th.no_grad():
        np.testing.assert_allclose(again.predict(obs, deterministic=True)[0], mean)


def test_a_prior_names_what_it_cannot_play() -> None:
    env = overload_env()
    with pytest.raises(ValueError, match="expected one of cb-sjf-work-shed, cb-sjf-work-fit"):
        prior_spec("fcfs", env.config, env.slo, -0.5, True)
    with pytest.raises(ValueError, match="needs the env's cap score"):
        prior_spec("cb-sjf-work-shed:4", env.config, env.slo, -0.5, False)


@pytest.mark.parametrize("policy", ["cb-sjf-work-serial:6", "cb-sjf-work-serial"])
def test_the_serial_prior_alone_plays_cb_sjf_work_serial_request_for_request(
        policy: str) -> None:
    """The same for cb-sjf-work-serial on an engine whose prompts take several chunks: while
    a visible running request computes its prompt, nothing is admitted."""
    cfg = EngineConfig(preset=None, cost_model=LinearCostModel(), num_kv_blocks=400,
                       max_num_batched_tokens=256)
    env = overload_env(K=64, engine=cfg)
    played = _played(env, _prior(env, policy))
    fast = cbgym.simulate(env.episode_trace, policy, engine=env.config, slo=env.slo).requests
    shed = cbgym.simulate(env.episode_trace, policy.replace("-serial", "-shed"),
                          engine=env.config, slo=env.slo).requests
    assert not shed["first_scheduled_s"].equals(fast["first_scheduled_s"])  # serial matters
    for col in ("first_scheduled_s", "finish_s", "status"):
        np.testing.assert_array_equal(played[col].to_numpy(), fast[col].to_numpy(), err_msg=col)


def test_the_serial_tiers_prior_alone_plays_cb_sjf_work_serial_tiers_request_for_request(
        ) -> None:
    """The same for cb-sjf-work-serial-tiers on two SLO tiers."""
    rng = np.random.default_rng(4)
    n = 300
    trace = cbgym.Trace.from_arrays(np.cumsum(rng.exponential(0.02, n)),
                                    rng.integers(20, 1500, n), rng.integers(2, 200, n),
                                    slo_class=rng.integers(0, 2, n))
    cfg = EngineConfig(preset=None, cost_model=LinearCostModel(), num_kv_blocks=400,
                       max_num_batched_tokens=256)
    env = overload_env(K=64, trace=trace, engine=cfg,
                       slo={0: cbgym.SLO(0.5, 0.05), 1: cbgym.SLO(5.0, 0.1)})
    policy = "cb-sjf-work-serial-tiers:6"
    played = _played(env, _prior(env, policy))
    fast = cbgym.simulate(env.episode_trace, policy, engine=env.config, slo=env.slo).requests
    plain = cbgym.simulate(env.episode_trace, "cb-sjf-work-serial:6", engine=env.config,
                           slo=env.slo).requests
    assert not plain["first_scheduled_s"].equals(fast["first_scheduled_s"])  # tiers matter
    for col in ("first_scheduled_s", "finish_s", "status"):
        np.testing.assert_array_equal(played[col].to_numpy(), fast[col].to_numpy(), err_msg=col)
