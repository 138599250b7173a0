"""The Gymnasium environment: API conformance, determinism, content-blindness, actions, masks,
reward accounting, rendering and the observation encoding."""

from __future__ import annotations

import doctest
import pickle
import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.error import InvalidAction, ResetNeeded

import cbgym
from cbgym.engine import EngineConfig, LinearCostModel
from cbgym.env import scheduling_env, wrappers
from cbgym.env.action import InvalidActionError
from cbgym.env.observation import (
    COUNT_EXACT_BELOW,
    GLOBAL_FEATURES,
    SLOT_FEATURES,
    count_scale,
    count_unscale,
    decode_slots,
    global_index,
)
from cbgym.env.scheduling_env import SchedulingEnv
from cbgym.env.wrappers import FlattenSchedulingObservation, ReweightReward
from cbgym.metrics import SLO, meets_slo
from cbgym.workload.trace import Trace

IDS = {False: "cbgym/Scheduling-v0", True: "cbgym/SchedulingMasked-v0"}


def small_config(num_kv_blocks: int = 400, **kw: Any) -> EngineConfig:
    return EngineConfig(preset=None, cost_model=LinearCostModel(), num_kv_blocks=num_kv_blocks,
                        **kw)


def small_trace(n: int = 300, seed: int = 0, output: np.ndarray | None = None) -> Trace:
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(0.2, n))
    prompt = rng.integers(20, 1500, n)
    out = rng.integers(2, 200, n) if output is None else output
    return Trace.from_arrays(arrival, prompt, out, name=f"small-{seed}")


def make(masked: bool = False, **kw: Any) -> gym.Env:
    kw.setdefault("trace", small_trace())
    kw.setdefault("engine", small_config())
    kw.setdefault("episode_requests", 64)
    kw.setdefault("load", 1.0)
    if not masked:  # the env's own action layout (the default task appends a cap score)
        kw.setdefault("admission_cap", False)
    return gym.make(IDS[masked], **kw)


def first_allowed(env: gym.Env) -> int:
    return int(np.flatnonzero(env.unwrapped.action_masks())[0])


def fcfs_action(env: gym.Env) -> Any:
    """Admit everything visible in slot order; vLLM's default victims."""
    u = env.unwrapped
    if u.masked:
        return first_allowed(env)
    a = np.zeros(u.K + u.R, np.float32)
    a[: u.K] = np.linspace(1.0, 0.0, u.K)
    a[u.K:] = np.linspace(1.0, -0.9, u.R)
    return a


def rollout(env: gym.Env, seed: int, policy: str = "random", max_steps: int = 10_000,
            options: dict | None = None) -> list[tuple]:
    obs, info = env.reset(seed=seed, options=options)
    env.action_space.seed(seed)
    out = [(obs, 0.0, False, False, info)]
    for _ in range(max_steps):
        if policy == "random":
            a = (env.action_space.sample(mask=env.unwrapped.action_masks())
                 if env.unwrapped.masked else env.action_space.sample())
        else:
            a = fcfs_action(env)
        step = env.step(a)
        out.append(step)
        if step[2] or step[3]:
            break
    return out


def assert_same(x: Any, y: Any) -> None:
    if isinstance(x, dict):
        assert x.keys() == y.keys()
        for k in x:
            assert_same(x[k], y[k])
    elif isinstance(x, tuple | list):
        assert len(x) == len(y)
        for a, b in zip(x, y, strict=True):
            assert_same(a, b)
    elif isinstance(x, np.ndarray):
        np.testing.assert_array_equal(x, y)
    else:
        assert x == y


# ---------------------------------------------------------------------------- API conformance


@pytest.mark.parametrize("masked", [False, True])
def test_gymnasium_check_env_without_warnings(masked: bool) -> None:
    from gymnasium.utils.env_checker import check_env

    # the checkers sample actions without masks: masked indices act as STOP by default
    env = make(masked)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)


@pytest.mark.parametrize("masked", [False, True])
def test_sb3_check_env_without_warnings(masked: bool) -> None:
    from stable_baselines3.common.env_checker import check_env

    env = make(masked).unwrapped
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env, warn=True)


def test_registered_after_import_and_by_module_prefix() -> None:
    assert "cbgym/Scheduling-v0" in gym.registry and "cbgym/SchedulingMasked-v0" in gym.registry
    env = gym.make("cbgym:cbgym/Scheduling-v0", trace=small_trace(), engine=small_config(),
                   episode_requests=32)
    assert isinstance(env.unwrapped, cbgym.SchedulingEnv)
    cbgym.register_envs()  # idempotent, no override warning
    masked = gym.make("cbgym/SchedulingMasked-v0", trace=small_trace(), engine=small_config())
    assert isinstance(masked.action_space, gym.spaces.Discrete)


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("masked", [False, True])
def test_make_vec(mode: str, masked: bool) -> None:
    envs = gym.make_vec(IDS[masked], num_envs=2, vectorization_mode=mode, trace=small_trace(),
                        engine=small_config(), episode_requests=16, capacity_rps=4.0)
    try:
        obs, info = envs.reset(seed=3)
        assert obs["waiting"].shape == (2, 16 * len(SLOT_FEATURES))
        for _ in range(40):
            if masked:
                masks = np.stack(info["action_mask"]).astype(bool)
                action = np.array([np.flatnonzero(m)[-1] for m in masks])
            else:
                action = envs.action_space.sample()
            obs, reward, term, trunc, info = envs.step(action)
            assert reward.shape == (2,) and set(info["reward_components"]) >= {"goodput"}
    finally:
        envs.close()


@pytest.mark.parametrize("masked", [False, True])
def test_pickle_mid_episode_continues_identically(masked: bool) -> None:
    env = make(masked)
    rollout(env, seed=1, max_steps=20)
    clone = pickle.loads(pickle.dumps(env))
    for _ in range(10):
        a = fcfs_action(env)
        assert_same(env.step(a), clone.step(a))


@pytest.mark.parametrize("masked", [False, True])
def test_same_seed_same_actions_same_episode(masked: bool) -> None:
    a = rollout(make(masked, load=(0.6, 1.4)), seed=7)
    b = rollout(make(masked, load=(0.6, 1.4)), seed=7)
    assert len(a) == len(b) > 5
    for x, y in zip(a, b, strict=True):
        assert_same(x, y)


def test_reset_options_give_common_random_numbers() -> None:
    env = make()
    env.reset(seed=1, options={"start": 40, "load": 0.8})
    t1 = env.unwrapped.episode_trace
    env.reset(seed=999, options={"start": 40, "load": 0.8})
    t2 = env.unwrapped.episode_trace
    np.testing.assert_array_equal(t1.arrival_s, t2.arrival_s)
    np.testing.assert_array_equal(t1.output_tokens, t2.output_tokens)
    starts = set()
    for seed in range(5):
        env.reset(seed=seed)
        starts.add(env.unwrapped.episode_start)
    assert len(starts) > 1
    with pytest.raises(ValueError, match="unknown keys"):
        env.reset(options={"begin": 3})
    with pytest.raises(ValueError, match="start"):
        env.reset(options={"start": 10_000})


def test_options_trace_and_window_start_range() -> None:
    other = small_trace(n=80, seed=5)
    env = make(window_start_range=(100, 200))
    env.reset(seed=0, options={"trace": other, "start": 0, "load": None})
    np.testing.assert_array_equal(env.unwrapped.episode_trace.prompt_tokens,
                                  other.prompt_tokens[:64])
    for seed in range(10):
        env.reset(seed=seed)
        assert 100 <= env.unwrapped.episode_start <= 200 - 64


def test_default_trace_resolves_lazily() -> None:
    env = SchedulingEnv(engine=small_config(num_kv_blocks=4000), episode_requests=16,
                        capacity_rps=5.0)
    assert env._base is None
    env.reset(seed=0)
    assert env.base_trace.name == "synthetic-conv"


# ---------------------------------------------------------------------------- content blindness
@pytest.mark.parametrize("masked", [False, True])
def test_observations_are_content_blind(masked: bool) -> None:
    """Traces differing only in output lengths look identical until the first completion."""
    n = 300
    rng = np.random.default_rng(11)
    short = rng.integers(150, 200, n)
    long = short + rng.integers(1, 400, n)
    envs = [make(masked, trace=small_trace(n, seed=3, output=o), capacity_rps=2.0)
            for o in (short, long)]
    (oa, ia), (ob, ib) = (e.reset(seed=0, options={"start": 0}) for e in envs)
    steps = 0
    while True:
        assert_same(oa, ob)
        assert_same(ia, ib)
        a = fcfs_action(envs[0])
        oa, _, _, _, ia = envs[0].step(a)
        ob, _, _, _, ib = envs[1].step(a)
        steps += 1
        if ia["num_finished"] or ib["num_finished"]:
            break
    assert steps > 10
    assert not any("output" in k for k in ia)


# ---------------------------------------------------------------------------- actions
def test_invalid_box_actions_raise() -> None:
    env = make()
    with pytest.raises(ResetNeeded):
        env.unwrapped.step(np.zeros(48, np.float32))
    env.reset(seed=0)
    u = env.unwrapped
    good = np.zeros(48, np.float32)
    for bad, match in [(np.zeros(47), "shape"), (np.zeros((2, 48)), "shape"),
                       (np.full(48, np.nan), "finite"), (np.full(48, 1.5), r"\[-1, 1\]"),
                       ("abc", "float array")]:
        with pytest.raises(InvalidActionError, match=match) as err:
            u.step(bad)
        assert isinstance(err.value, ValueError) and isinstance(err.value, InvalidAction)
    u.step(good)  # the env is intact after the errors


def test_invalid_discrete_actions_raise() -> None:
    env = make(True, invalid_action="raise")
    env.reset(seed=0)
    u = env.unwrapped
    mask = u.action_masks()
    empty = int(np.flatnonzero(mask[: u.K] == 0)[0])
    with pytest.raises(InvalidActionError, match=f"action {empty} is masked"):
        u.step(empty)
    with pytest.raises(InvalidActionError, match="outside"):
        u.step(u.K + u.R + 1)
    with pytest.raises(InvalidActionError, match="integer"):
        u.step(1.0)
    with pytest.raises(InvalidActionError, match="no memory shortfall"):
        u.step(u.K)
    u.step(np.int64(u.STOP))


def test_scores_order_hold_and_admit() -> None:
    """Descending score order, ties in slot order, below the threshold held."""
    burst = Trace.from_arrays(np.zeros(6), [100] * 6, [50] * 6)
    env = make(trace=burst, episode_requests=6, load=None)
    env.reset(seed=0)
    u = env.unwrapped
    a = np.zeros(48, np.float32)
    a[:6] = [0.1, 0.9, -0.6, 0.5, 0.5, -1.0]
    env.step(a)
    req = u.engine.req
    admitted = np.flatnonzero(~np.isnan(req.first_scheduled_s))
    assert sorted(admitted.tolist()) == [0, 1, 3, 4]
    assert u.engine.waiting == [2, 5]  # held back; not late, so not shed either


def test_shedding_rule_sheds_only_late_requests() -> None:
    burst = Trace.from_arrays(np.zeros(6), [100] * 6, [50] * 6)
    env = make(trace=burst, episode_requests=6, load=None, slo=SLO(ttft_s=0.05, tpot_s=1.0),
               shed_rule="late")
    env.reset(seed=0)
    u = env.unwrapped
    a = np.full(48, -1.0, np.float32)
    a[0] = 1.0
    _, _, _, _, info = env.step(a)  # nobody is late yet at t=0: only held
    assert info["num_shed"] == 0 and u.engine.req.num_ended == 0
    while u.decision_point.now <= 0.05:
        env.step(a)
    _, _, _, _, info = env.step(a)
    assert info["num_shed"] > 0
    assert set(u.engine.req.reason.values()) == {"shed_by_agent"}


@pytest.mark.parametrize("rule", ["late", "unreachable"])
def test_unreachable_requests_are_sheddable_before_their_deadline(rule: str) -> None:
    """"unreachable": waited + own prefill at the linear cost (12 ms + 0.28 ms per token) past
    the target. At t=0 with a 100 ms target, 1,000-token prompts (292 ms) are unreachable,
    100-token ones (40 ms) are not; "late" sheds nobody before the deadline."""
    from cbgym.agents.work import shed_lead

    burst = Trace.from_arrays(np.zeros(6), [100, 1000, 100, 1000, 100, 1000], [50] * 6)
    env = make(trace=burst, episode_requests=6, load=None, slo=SLO(ttft_s=0.1, tpot_s=1.0),
               shed_rule=rule, engine=small_config(max_num_seqs=1))
    env.reset(seed=0)
    u = env.unwrapped
    assert u.shed_lead == shed_lead(rule, u.config) == (
        (0.0, 0.0) if rule == "late" else (0.012, 0.00028))
    a = np.full(48, -1.0, np.float32)
    a[0] = 1.0  # admit slot 0 (request 0), shed score everywhere else
    _, _, _, _, info = env.step(a)
    req = u.engine.req
    shed = sorted(r for r in range(6) if req.reason.get(r) == "shed_by_agent")
    assert shed == ([] if rule == "late" else [1, 3, 5]) and info["num_shed"] == len(shed)
    assert u.engine.waiting == ([1, 2, 3, 4, 5] if rule == "late" else [2, 4])


def test_admission_cap_score_caps_the_running_batch() -> None:
    from cbgym.env.kernel_ops import running_cap

    assert [running_cap(x, 256) for x in (-1.0, -0.5, 0.0, 1.0)] == [1, 4, 16, 256]
    assert running_cap(1.0, 24) == 24 and running_cap(-1.0, 24) == 1
    burst = Trace.from_arrays(np.zeros(40), [50] * 40, [30] * 40)
    env = make(trace=burst, episode_requests=40, load=None, admission_cap=True)
    u = env.unwrapped
    assert env.action_space.shape == (u.K + u.R + 1,) and u.layout.size == u.K + u.R + 1
    env.reset(seed=0)
    a = np.ones(u.layout.size, np.float32)
    a[-1] = -0.5  # cap 4 (max_num_seqs 256)
    most = 0
    for _ in range(30):
        env.step(a)
        most = max(most, len(u.engine.running))
    assert most == 4
    a[-1] = 1.0  # the engine's own cap: the rest is admitted at once
    env.step(a)
    assert len(u.engine.running) > 4
    with pytest.raises(InvalidActionError, match="expected"):
        env.step(np.ones(u.K + u.R, np.float32))
    with pytest.raises(ValueError, match="masked variant"):
        make(True, admission_cap=True)


def test_env_agent_ignores_the_cap_score() -> None:
    """A baseline on an env with the cap score admits as it would without it."""
    from cbgym.env.agents import EnvAgent, run_episode

    finish = []
    for cap in (False, True):
        env = make(admission_cap=cap)
        run_episode(env, EnvAgent("sjf-ctx", env), seed=0, options={"start": 10})
        finish.append(env.unwrapped.episode_result().requests["finish_s"].to_numpy())
    np.testing.assert_array_equal(*finish)


def test_shed_rule_is_checked() -> None:
    with pytest.raises(ValueError, match="shed_rule='soon'"):
        make(shed_rule="soon")


def shortfall_env(masked: bool) -> gym.Env:
    """Eight long generations that outgrow a small KV cache."""
    trace = Trace.from_arrays(np.zeros(8), [200] * 8, [400] * 8)
    return make(masked, trace=trace, episode_requests=8, load=None,
                engine=small_config(num_kv_blocks=100))


def advance_to_shortfall(env: gym.Env) -> dict:
    obs, _ = env.reset(seed=0)
    while obs["global"][global_index("shortfall_phase")] == 0:
        obs, *_ = env.step(fcfs_action(env))
    return obs


def test_running_scores_pick_the_victim() -> None:
    env = shortfall_env(False)
    advance_to_shortfall(env)
    u = env.unwrapped
    running = u.visible_running_ids
    a = np.ones(48, np.float32)
    a[u.K] = -1.0  # the oldest running request goes first
    env.step(a)
    assert u.engine.req.preemptions[running[0]] == 1
    assert u.engine.req.preemptions[running[1:]].sum() == 0


def test_noop_mode_leaves_state_unchanged_on_masked_actions() -> None:
    env = make(True, invalid_action="noop")
    obs, info = env.reset(seed=0)
    assert info["invalid_action"] is False
    masked_index = int(np.flatnonzero(info["action_mask"] == 0)[0])
    obs2, reward, terminated, _, info2 = env.step(masked_index)
    assert info2["invalid_action"] is True and reward == 0.0 and not terminated
    assert info2["engine_iterations"] == 0
    assert_same(obs, obs2)
    with pytest.raises(ValueError, match="invalid_action"):
        make(True, invalid_action="clip")


def test_a_masked_action_acts_as_stop_by_default() -> None:
    env, twin = make(True), make(True)
    _, info = env.reset(seed=0)
    twin.reset(seed=0)
    masked_index = int(np.flatnonzero(info["action_mask"] == 0)[0])
    obs, reward, _, _, info2 = env.step(masked_index)
    obs_t, reward_t, _, _, info_t = twin.step(twin.unwrapped.STOP)
    assert info2["invalid_action"] is True and info_t["invalid_action"] is False
    assert reward == reward_t and info2["sim_time_s"] == info_t["sim_time_s"] > 0
    assert_same(obs, obs_t)
    strict = make(True, invalid_action="raise")
    strict.reset(seed=0)
    with pytest.raises(InvalidActionError, match="masked"):
        strict.step(masked_index)


def test_masks_and_shortfall_phase() -> None:
    env = shortfall_env(True)
    u = env.unwrapped
    before = u.action_masks()
    assert before.dtype == np.int8 and before.tolist() == [0] * (u.K + u.R) + [1]
    obs, info = env.reset(seed=0)
    assert info["action_mask"][u.STOP] == 1
    np.testing.assert_array_equal(info["action_mask"], u.action_masks())
    obs = advance_to_shortfall(env)
    mask = u.action_masks()
    assert mask[: u.K].sum() == 0 and mask[u.STOP] == 0
    assert mask[u.K:u.STOP].sum() == obs["running_mask"].sum() > 0
    victim = int(np.flatnonzero(mask)[0])  # the oldest: not vLLM's default choice
    rid = u.visible_running_ids[victim - u.K]
    total = 0
    while u.action_masks()[u.STOP] == 0 and u.decision_point.shortfall_blocks:
        obs, _, _, _, info = env.step(int(np.flatnonzero(u.action_masks())[0]))
        total += info["engine_iterations"]
    assert u.engine.req.preemptions[rid] == 1 and total >= 1


def test_masked_micro_steps_build_the_order() -> None:
    burst = Trace.from_arrays(np.zeros(5), [100] * 5, [50] * 5)
    env = make(True, trace=burst, episode_requests=5, load=None)
    obs, info = env.reset(seed=0)
    u = env.unwrapped
    chosen = global_index("num_chosen")
    for slot in (3, 1):
        obs, reward, _, _, info = env.step(slot)
        assert reward == 0.0 and info["engine_iterations"] == 0
        assert decode_slots(obs["waiting"], obs["waiting_mask"])["chosen"][slot]
    assert count_unscale(obs["global"][chosen]) == 2
    assert info["action_mask"][[1, 3]].tolist() == [0, 0]
    _, _, _, _, info = env.step(u.STOP)
    assert info["engine_iterations"] >= 1
    assert sorted(np.flatnonzero(~np.isnan(u.engine.req.first_scheduled_s)).tolist()) == [1, 3]


def test_skip_trivial_false_steps_every_iteration() -> None:
    results = {}
    for skip in (True, False):
        env = make(skip_trivial=skip)
        steps = rollout(env, seed=2, policy="fcfs", options={"start": 0})
        iters = [s[4]["engine_iterations"] for s in steps[1:]]
        if not skip:
            assert max(iters) == 1 and len(steps) - 1 >= env.unwrapped.engine.iteration
        results[skip] = env.unwrapped.episode_result().requests
    for col in ("first_token_s", "finish_s", "preemptions"):
        np.testing.assert_array_equal(results[True][col], results[False][col])


def test_smallest_prompt_window_rule() -> None:
    rng = np.random.default_rng(0)
    prompts = rng.permutation(np.arange(100, 4100, 100))
    burst = Trace.from_arrays(np.zeros(40), prompts, [50] * 40)
    env = make(trace=burst, episode_requests=40, load=None, K=8, window_rule="smallest_prompt")
    obs, _ = env.reset(seed=0)
    u = env.unwrapped
    waiting = u.decision_point.waiting
    expected = waiting[np.sort(np.argsort(prompts[waiting], kind="stable")[:8])]
    np.testing.assert_array_equal(u.visible_waiting_ids, expected)
    seen = decode_slots(obs["waiting"], obs["waiting_mask"])["prompt_tokens"]
    np.testing.assert_array_equal(seen, prompts[expected])
    assert count_unscale(obs["global"][global_index("num_waiting_hidden")]) == 32


def test_privileged_channel_is_not_in_obs_or_info() -> None:
    env = make()
    _, info = env.reset(seed=0)
    u = env.unwrapped
    true = u.privileged_true_output_tokens()
    n = len(u.visible_waiting_ids)
    np.testing.assert_array_equal(true[:n], u.episode_trace.output_tokens[u.visible_waiting_ids])
    assert np.isnan(true[n:]).all()
    assert not any("output" in k or "true" in k for k in info)


# ---------------------------------------------------------------------------- reward
@pytest.mark.parametrize("masked", [False, True])
def test_episode_reward_is_goodput(masked: bool) -> None:
    env = make(masked, slo=SLO(ttft_s=1.0, tpot_s=0.05))
    steps = rollout(env, seed=4)
    assert steps[-1][2]  # terminated
    res = env.unwrapped.episode_result()
    total = sum(s[1] for s in steps)
    assert total == meets_slo(res.requests, res.slo).sum() == sum(s[4]["num_good"] for s in steps)
    assert 0 < total < len(res.requests)


def test_shaping_components_sum_as_documented() -> None:
    weights = {"ttft_miss_weight": 0.5, "shed_weight": 2.0, "latency_weight": 0.1}
    slo = SLO(ttft_s=0.5, tpot_s=0.05)
    env = make(slo=slo, load=1.5, **weights)
    steps = rollout(env, seed=5)
    comps = {k: 0.0 for k in ("goodput", "ttft_miss", "shed", "latency")}
    for _, reward, _, _, info in steps[1:]:
        c = info["reward_components"]
        assert reward == pytest.approx(c["goodput"] + 0.5 * c["ttft_miss"] + 2.0 * c["shed"]
                                       + 0.1 * c["latency"], abs=1e-12)
        for k in comps:
            comps[k] += c[k]
    req = env.unwrapped.episode_result().requests
    assert comps["goodput"] == meets_slo(req, slo).sum()
    shed = (req["status"] == "shed").to_numpy()
    assert comps["shed"] == -shed.sum()
    latency = (req["finish_s"] - req["arrival_s"]).sum()
    assert comps["latency"] == pytest.approx(-latency, rel=1e-9)
    deadline = req["arrival_s"] + slo.ttft_s
    met = (req["first_token_s"] <= deadline).to_numpy()
    shed_early = shed & (req["finish_s"] <= deadline).to_numpy()
    assert comps["ttft_miss"] == -(~met & ~shed_early).sum() < 0


def test_reweight_wrapper_recombines_components() -> None:
    env = ReweightReward(make(), latency=1.0)
    env.reset(seed=0)
    _, reward, _, _, info = env.step(env.action_space.sample())
    c = info["reward_components"]
    assert reward == pytest.approx(c["goodput"] + c["latency"])


def test_info_counts_iterations_and_time() -> None:
    env = make()
    steps = rollout(env, seed=6, policy="fcfs")
    eng = env.unwrapped.engine
    assert sum(s[4]["engine_iterations"] for s in steps) == eng.iteration
    assert sum(s[4]["sim_time_elapsed"] for s in steps) == pytest.approx(eng.now)
    assert steps[-1][4]["sim_time_s"] == eng.now


def test_max_steps_truncates() -> None:
    env = make(max_steps=5)
    steps = rollout(env, seed=0)
    assert len(steps) == 6 and steps[-1][3] and not steps[-1][2]
    with pytest.raises(ResetNeeded):
        env.unwrapped.step(env.action_space.sample())


# ---------------------------------------------------------------------------- render, docs
def test_render_ansi() -> None:
    env = make(render_mode="ansi")
    assert "reset" in env.unwrapped.render()
    env.reset(seed=0)
    for _ in range(5):
        env.step(env.action_space.sample())
    text = env.render()
    assert isinstance(text, str) and "waiting" in text and "KV" in text


def test_class_docstring_doctest_and_tables() -> None:
    for module in (scheduling_env, wrappers):
        failures, tried = doctest.testmod(module, verbose=False, raise_on_error=False)
        assert tried > 0 and failures == 0, module.__name__
    doc = SchedulingEnv.__doc__ or ""
    for i, f in enumerate(GLOBAL_FEATURES[:18]):
        assert f"| {i:<3} | {f.name}" in doc or f"| {i}  | {f.name}" in doc, f.name
    for i, f in enumerate(SLOT_FEATURES):
        assert f"| {i}   | {f.name}" in doc, f.name
    assert f"``global`` ({len(GLOBAL_FEATURES)})" in doc


# ---------------------------------------------------------------------------- encoding
def test_count_scaling_is_exactly_invertible() -> None:
    x = np.arange(COUNT_EXACT_BELOW, dtype=np.int64)
    back = count_unscale(count_scale(x).astype(np.float32))
    np.testing.assert_array_equal(back, x)


def test_observation_bounds_hold_for_extreme_values() -> None:
    huge = Trace.from_arrays([0.0, 1e7], [2**30, 1], [2**30, 1])
    env = make(trace=huge, episode_requests=2, load=None,
               engine=small_config(num_kv_blocks=2**27))
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs)


def test_flatten_wrappers() -> None:
    env = FlattenSchedulingObservation(make())
    obs, _ = env.reset(seed=0)
    assert obs.dtype == np.float32 and env.observation_space.contains(obs)
    raw, _ = make().reset(seed=0)  # the same episode, unflattened
    for key, sl in env.layout.items():
        np.testing.assert_array_equal(obs[sl], raw[key])
    plain = gym.wrappers.FlattenObservation(make())
    assert plain.observation_space.shape == env.observation_space.shape
