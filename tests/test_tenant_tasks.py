"""The multi-tenant and overload pieces of the suite: tenant counters in the observation, the
overload cluster task's env (retries as steps, goodput as clients see it), the in-flight cap
router, SLO maps as data."""

from __future__ import annotations

import numpy as np
import pytest

from cbgym import SLO, ClientModel, Trace
from cbgym.agents.routing import make_router
from cbgym.cluster.run import serve
from cbgym.env.cluster_env import ClusterEnv
from cbgym.env.scheduling_env import SchedulingEnv
from cbgym.env.tenant_obs import KEY, tenant_obs
from cbgym.metrics import slo_from_dict, slo_to_dict
from cbgym.workload.synthetic import synthetic_trace
from cbgym.workload.tenants import Tenant, assign_tenants, tier_slos


def two_tenants() -> Trace:
    tr = synthetic_trace("conv", 1500, seed=4)
    return assign_tenants(tr, [Tenant("a", 0.6, tier="interactive"),
                               Tenant("b", 0.4, tier="batch")], seed=1)


def test_tenant_counters_are_vtc_s_service_shares_and_backlogs() -> None:
    env = SchedulingEnv(trace=two_tenants(), load=1.3, slo=tier_slos(), tenant_features=2)
    assert env.observation_space[KEY].shape == (6,)
    obs, _ = env.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(200):
        obs, _, done, _, _ = env.step(rng.uniform(-1, 1, env.action_space.shape).astype(
            np.float32))
        assert env.observation_space.contains(obs)
        if done:
            break
    s, tenant = env.engine.state, env.episode_trace.tenant
    got = obs[KEY].reshape(2, 3)
    from cbgym.engine import layout as L

    started = ~np.isnan(s.times[L.FIRST_SCHEDULED])
    service = np.array([(s.req[L.PROMPT] * started + 2 * s.req[L.GENERATED])[tenant == t].sum()
                        for t in (0, 1)], float)
    np.testing.assert_allclose(got[:, 0], service / service.sum(), rtol=1e-6)
    waiting = tenant[s.ids[L.WAIT_Q, : s.si[L.N_WAIT]]]
    if len(waiting):
        np.testing.assert_allclose(got[:, 1], np.bincount(waiting, minlength=2) / len(waiting),
                                   rtol=1e-6)
    assert np.allclose(tenant_obs(s, tenant, 2), obs[KEY])


def test_tenant_features_are_checked() -> None:
    with pytest.raises(ValueError, match="tenant_features"):
        SchedulingEnv(tenant_features=-1)
    with pytest.raises(NotImplementedError, match="SyncVectorEnv"):
        from cbgym.env.vector import SchedulingVectorEnv

        SchedulingVectorEnv(num_envs=2, tenant_features=2)


def test_the_cluster_env_with_clients_counts_goodput_as_clients_see_it() -> None:
    tr = synthetic_trace("conv", 400, seed=2)
    client = ClientModel(timeout_s=3.0, max_retries=2, on_abandon="leave")
    env = ClusterEnv(cluster="1x:llama-3.1-8b/a100-80gb", trace=tr, episode_requests=300,
                     load=2.0, slo=SLO(2.0, 0.1), client=client, train_fraction=1.0)
    obs, info = env.reset(seed=0, options={"start": 0, "load": 2.0})
    steps, ret, done = 0, 0.0, False
    while not done:
        obs, r, done, _, info = env.step(0)  # always admit
        steps, ret = steps + 1, ret + r
    c = env.cluster
    assert c is not None and steps > c.num_offered  # retries were steps too
    from cbgym.cluster.results import cluster_result

    res = cluster_result(c, {})
    assert ret == res.summary()["good"] == info["num_good"]
    # the same window through serve(), by the one-replica rule: the same run
    again = serve(c.trace.window(0, c.num_offered), c.config, "round-robin", slo=SLO(2.0, 0.1),
                  client=client)
    assert again.summary()["good"] == ret


def test_inflight_cap_sheds_with_429_once_the_replicas_hold_n() -> None:
    from cbgym.cluster.config import ClusterConfig

    tr = Trace.from_arrays(np.array([0.0, 0.5, 1.0]), np.full(3, 100), np.full(3, 400),
                           name="three")
    cfg = ClusterConfig.preset("1x:llama-3.1-8b/a100-80gb", load_report_interval_s=0)
    res = serve(tr, cfg, make_router("inflight-cap:1"), client=ClientModel(max_retries=0))
    assert res.clients["outcome"].tolist()[1:] == ["shed", "shed"]
    assert (res.requests["reason"].iloc[1:] == "admission_cap").all()


def test_slo_maps_round_trip_as_data() -> None:
    for slo in (SLO(1.0, 0.1), SLO(2.0, 0.2, tbt_s=0.5), tier_slos()):
        assert slo_from_dict(slo_to_dict(slo)) == slo
    with pytest.raises(ValueError, match="SLO data"):
        slo_from_dict({"ttft": 1.0})


@pytest.mark.parametrize("spec, message", [
    ("vtc:0=0", r"VTC weights\[0\]=0.0: expected a finite number > 0"),
    ("vtc:-1", "VTC w_in=-1.0"),
    ("drr:0=2,1=x", r"DRR weights\[1\]='x': expected a number"),
    ("drr:0", "DRR quantum"),
    ("wfq:a=1", "tenant 'a' is not an int id"),
    ("wfq:-1=2", "not an int id >= 0"),
    ("token-bucket:0=0", r"rates\[0\]=0.0"),
    ("token-bucket:0=100/0", r"depths\[0\]=0.0"),
    ("token-bucket:0", "is not TENANT=VALUE"),
])
def test_bad_tenant_tables_are_clear_errors(spec: str, message: str) -> None:
    from cbgym.agents import make_policy

    with pytest.raises(ValueError, match=message):
        make_policy(spec)


def test_specs_carry_tenant_tables() -> None:
    from cbgym.agents import make_policy

    assert make_policy("vtc:0=3,1=1").weights == {0: 3.0, 1: 1.0}  # type: ignore[attr-defined]
    tb = make_policy("token-bucket:0=100/500,1=50")
    assert tb.rates == {0: 100.0, 1: 50.0} and tb.depths == {0: 500.0}  # type: ignore[attr-defined]


@pytest.mark.parametrize("slo, error, message", [
    ({0: SLO(), 1: SLO()}, ValueError, "no entry for SLO class 2"),
    ({0: "x"}, TypeError, r"slo\[0\]='x': expected an SLO"),
    ({-1: SLO()}, ValueError, r"slo\[-1\]: SLO classes are ints"),
    ("fast", TypeError, "expected an SLO or a mapping"),
])
def test_bad_slo_maps_are_clear_errors(slo: object, error: type, message: str) -> None:
    from cbgym.simulate import simulate

    tr = Trace.from_arrays(np.arange(5.0), np.full(5, 100), np.full(5, 10),
                           slo_class=np.array([0, 0, 1, 2, 2]), name="t")
    with pytest.raises(error, match=message):
        simulate(tr, slo=slo)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tier"):
        Tenant("x", 0.5, tier="gold")


def test_a_learned_policy_with_tenant_counters_replays_the_env_exactly() -> None:
    """The fast path rebuilds the tenants' counters the slot scorer reads (each slot its own
    tenant's row), decision for decision."""
    pytest.importorskip("stable_baselines3")
    from stable_baselines3 import PPO

    import cbgym
    from cbgym.agents.learned import LearnedPolicy
    from cbgym.agents.slot_net import SlotPolicy
    from cbgym.engine.config import EngineConfig

    paper = EngineConfig(preset="cbsjf-paper")
    slo = tier_slos()
    env = SchedulingEnv(trace=two_tenants(), engine=paper, load=1.2, episode_requests=96, K=4,
                        R=8, window_rule="smallest_prompt", slo=slo, tenant_features=2)
    model = PPO(SlotPolicy, env, seed=3, device="cpu", policy_kwargs={"tenant_inputs": True})
    scorer = model.policy.mlp_extractor
    assert scorer.T == 2
    for layer in scorer.output_layers():  # (an untrained scorer is nearly constant)
        layer.weight.data.normal_(0.0, 0.05)
        layer.bias.data.fill_(0.5)
    model.cbgym = {"algo": "ppo", "window_rule": "smallest_prompt", "hold_threshold": -0.5,
                   "shed_threshold": -0.99, "slo": slo_to_dict(slo)}
    obs, _ = env.reset(seed=0, options={"start": 200})
    done = False
    while not done:
        action, _ = model.predict(obs, deterministic=True)
        obs, _, done, truncated, _ = env.step(action)
        done = done or truncated
    got = env.episode_result().requests
    fast = cbgym.simulate(env.episode_trace, LearnedPolicy(model), engine=paper, slo=slo).requests
    for col in ("first_token_s", "finish_s", "status"):
        np.testing.assert_array_equal(got[col].to_numpy(), fast[col].to_numpy(), err_msg=col)


def test_a_batch_class_with_an_end_to_end_deadline() -> None:
    from cbgym.metrics import meets_slo
    from cbgym.simulate import simulate

    tr = Trace.from_arrays(np.array([0.0, 0.001]), np.array([100, 100]), np.array([50, 400]),
                           slo_class=np.array([2, 2]), name="two")
    loose = {2: SLO(30.0, 1.0)}
    deadline = {2: SLO(30.0, 1.0, e2e_s=2.0)}
    req = simulate(tr, engine="llama-3.1-8b/a100-80gb", slo=loose).requests
    assert meets_slo(req, loose).all()
    e2e = req["e2e_s"].to_numpy()
    assert e2e[0] < 2.0 < e2e[1]  # the long one misses its deadline
    assert meets_slo(req, deadline).tolist() == [True, False]
    assert slo_from_dict(slo_to_dict(deadline)) == deadline
    with pytest.raises(ValueError, match="e2e_s"):
        SLO(1.0, 0.1, e2e_s=0.0)
    with pytest.raises(ValueError, match="end-to-end"):
        SchedulingEnv(slo=deadline)
    env = ClusterEnv(cluster="1x:llama-3.1-8b/a100-80gb", trace=tr, episode_requests=2,
                     load=1.0, slo=deadline, train_fraction=1.0, capacity_rps=1.0)
    env.reset(seed=0, options={"start": 0, "load": 1.0})
    total, done = 0.0, False
    while not done:
        _, r, done, _, _ = env.step(0)
        total += r
    c = env.cluster
    assert c is not None
    from cbgym.cluster.results import cluster_result

    assert total == int(meets_slo(cluster_result(c, {}).requests, deadline).sum())


def test_review_fixes_of_the_tenant_tasks() -> None:
    """max_episode_steps through the fallback vector envs; negative tenant ids; duplicate
    tenants; the derived trace found and cached; per-SLO aging ranks every iteration."""
    import gymnasium as gym

    from cbgym.agents import make_policy
    from cbgym.tasks.cluster_tasks import make_cluster_vector_env

    with pytest.raises(ValueError, match="given twice"):
        make_policy("vtc:0=2,0=3")
    assert make_policy("vtc:00=2").weights == {0: 2.0}  # type: ignore[attr-defined]
    assert make_policy("sjf-ctx-slo-aging:1").consult == "every_iteration"
    with pytest.raises(ValueError, match="no step limit"):
        make_cluster_vector_env(2, "conv-2x-overload-retries", max_episode_steps=10)
    tr = Trace.from_arrays(np.arange(6.0), np.full(6, 100), np.full(6, 10),
                           tenant=np.array([-1, 0, 1, -1, 0, 1]), name="neg")
    env = SchedulingEnv(trace=tr, load=None, episode_requests=6, tenant_features=2)
    obs, _ = env.reset(seed=0)
    assert np.isfinite(obs[KEY]).all() and (obs[KEY] >= 0).all() and (obs[KEY] <= 1).all()
    from cbgym.workload.catalog import find_trace, load_trace

    if find_trace("azure-conv-2023") and find_trace("azure-code-2023"):
        assert find_trace("tenants-conv-code-2023") is not None
        assert load_trace("tenants-conv-code-2023") is load_trace("tenants-conv-code-2023")
        venv = gym.make_vec("cbgym/Scheduling-tenants-noisy-neighbour-v0", num_envs=2,
                            max_episode_steps=5)
        venv.reset(seed=0)
        ended = []
        for _ in range(6):
            *_, trunc, _ = venv.step(np.zeros((2, venv.single_action_space.shape[0])))
            ended.append(trunc.any())
        assert ended[4]  # the fifth step is the last


@pytest.mark.parametrize("timeout_on", ["completion", "first_token"])
def test_cluster_env_rewards_never_take_back_a_good_request(timeout_on: str) -> None:
    """An attempt the engine finished after its client's deadline is never counted good
    (found in review: it was, until its timeout event un-counted it: a -1 reward)."""
    from cbgym.cluster.edge_results import edge_totals
    from cbgym.cluster.results import cluster_result

    tr = synthetic_trace("conv", 600, seed=2)
    tr = Trace.from_arrays(tr.arrival_s, tr.prompt_tokens, tr.output_tokens,
                           slo_class=(np.arange(len(tr)) % 3).astype(np.int16), name="cls")
    slo = {0: SLO(0.8, 0.05, tbt_s=0.3), 1: SLO(2.0, 0.1), 2: SLO(30.0, 1.0, e2e_s=12.0)}
    client = ClientModel(timeout_s=6.0 if timeout_on == "completion" else 3.0,
                         timeout_on=timeout_on, max_retries=2, on_abandon="leave")
    env = ClusterEnv(cluster="2x:llama-3.1-8b/a100-80gb", trace=tr, episode_requests=500,
                     load=1.6, slo=slo, client=client, train_fraction=1.0)
    env.reset(seed=0, options={"start": 0})
    rng = np.random.default_rng(0)
    rewards, done = [], False
    while not done:
        _, r, done, _, _ = env.step(int(rng.choice(len(env.routes), p=[0.45, 0.45, 0.1])))
        rewards.append(r)
    assert min(rewards) >= 0
    assert env.cluster is not None
    assert sum(rewards) == edge_totals(cluster_result(env.cluster, {}))["good"]
