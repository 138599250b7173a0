"""The compiled kernel against the Python reference (property tests).

The numba kernel (:mod:`cbgym.engine.kernel`, :mod:`cbgym.env.kernel_ops`) is a port of the
engine, the observation encoder and the reward tracker. These tests drive both with the same
random traces, configurations and decisions and require the same results:

1. engine level: at every decision point the same time, queue and batch; at the end the same
   per-request columns, end reasons and per-iteration time series, bit for bit;
2. env level, both action variants: the same rewards and reward components, the same info and
   episode ends, and the same observations (exactly, except that the vectorised ``log2`` numpy
   uses for the reference's slot features may differ from libm's in the last bit, so slot
   features are compared to one float32 ulp).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cbgym.engine import Decision, Engine, EngineConfig
from cbgym.engine import compiled as compiled_mod
from cbgym.engine.compiled import CompiledEngine, supports
from cbgym.engine.cost_model import BatchStats
from cbgym.engine.decision import DecisionPoint
from cbgym.env import SchedulingEnv, SchedulingMaskedEnv
from cbgym.workload.trace import Trace
from tests.conftest import make_config, random_trace
from tests.test_engine_invariants import build, configs, traces
from tests.test_engine_invariants import random_decision as any_decision

kernel_configs = st.tuples(configs, st.sampled_from([None, None, 200, 420])).map(
    lambda c: {**c[0], "max_model_len": c[1]})


def random_decision(dp: DecisionPoint, rng: np.random.Generator) -> Decision:
    """Orders (or none: FCFS), holds, sheds and victims: what the env can express."""
    d = any_decision(dp, rng)
    return Decision(order=d.order if rng.random() < 0.8 else None, shed=d.shed,
                    shed_reason="shed_by_agent", victims=d.victims)


def assert_same_engine(ref: Engine, got: Engine) -> None:
    for col in ("computed", "generated", "tokens", "host_tokens", "preemptions", "status",
                "first_scheduled_s", "first_token_s", "finish_s"):
        np.testing.assert_array_equal(getattr(got.req, col), getattr(ref.req, col), col)
    n = ref.req.num_finished
    assert got.req.num_finished == n and got.req.num_ended == ref.req.num_ended
    np.testing.assert_array_equal(got.req.finish_order[:n], ref.req.finish_order[:n])
    assert got.req.reason == ref.req.reason
    assert (got.now, got.iteration, got.total_preemptions) == (
        ref.now, ref.iteration, ref.total_preemptions)
    assert got.kv.free == ref.kv.free and got.host_free_tokens == ref.host_free_tokens
    np.testing.assert_array_equal(got.kv.held, ref.kv.held)
    np.testing.assert_array_equal(got.recorder.timeseries(), ref.recorder.timeseries())


def _config(cfg: dict) -> EngineConfig:
    try:
        return make_config(**cfg)
    except ValueError:  # e.g. max_model_len beyond what the preset allows
        return make_config(**{**cfg, "max_model_len": None})


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces, cfg=kernel_configs, seed=st.integers(0, 2**16),
       consult=st.sampled_from(["every_iteration", "always"]))
def test_compiled_engine_matches_reference(trace, cfg, seed, consult) -> None:
    config = _config(cfg)
    tr = build(*trace)
    ref = Engine(tr, config, consult=consult)
    ce = CompiledEngine(tr, config, consult=consult)
    rng = np.random.default_rng(seed)
    while (dp := ref.next_decision()) is not None:
        assert not ce.drained
        assert ce.now == dp.now
        assert ce.waiting.tolist() == dp.waiting.tolist()
        assert ce.running.tolist() == dp.running.tolist()
        d = random_decision(dp, rng)
        ref.decide(d)
        ce.decide(d)
    assert ce.drained
    assert_same_engine(ref, ce.sync())


def test_synced_engine_presents_the_same_decision_point() -> None:
    config = make_config(num_kv_blocks=40, block_size=4, max_num_seqs=4)
    tr = random_trace(np.random.default_rng(1), 60, rate=20.0, max_prompt=100, max_output=40)
    ref, ce = Engine(tr, config, consult="every_iteration"), CompiledEngine(tr, config)
    for _ in range(25):
        dp, got = ref.next_decision(), ce.decision_point()
        assert dp is not None and got is not None
        for field in ("now", "iteration", "shortfall_blocks", "free_blocks",
                      "last_iteration_s", "total_preemptions"):
            assert getattr(got, field) == getattr(dp, field), field
        for field in ("waiting", "running", "running_need_blocks", "finished"):
            np.testing.assert_array_equal(getattr(got, field), getattr(dp, field))
        ref.decide(Decision())
        ce.decide(Decision())


def test_row_buffer_refills(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel stops when its time-series buffer fills; nothing is lost or repeated."""
    monkeypatch.setattr(compiled_mod, "_REC_ROWS", 3)
    config = make_config(num_kv_blocks=60, block_size=4, max_num_seqs=3)
    tr = random_trace(np.random.default_rng(2), 40, rate=4.0, max_prompt=80, max_output=60)
    ref, ce = Engine(tr, config, consult="every_iteration"), CompiledEngine(tr, config)
    while ref.next_decision() is not None:
        ref.decide(Decision())
        ce.decide(Decision())
    assert ce.drained
    assert_same_engine(ref, ce.sync())


# ---------------------------------------------------------------- the environment
def _env_pair(cls: type, trace: Trace, config: EngineConfig, **kw: object) -> tuple:
    common = dict(trace=trace, load=None, engine=config, episode_requests=len(trace), **kw)
    return cls(backend="python", **common), cls(backend="compiled", **common)


def assert_same_observation(ref: dict, got: dict) -> None:
    assert ref.keys() == got.keys()
    for key in ("global", "waiting_mask", "running_mask"):
        np.testing.assert_array_equal(got[key], ref[key], key)
    for key in ("waiting", "running"):  # numpy's log2 vs libm's: at most one float32 ulp
        np.testing.assert_allclose(got[key], ref[key], rtol=2.4e-7, atol=0, err_msg=key)
        assert got[key].dtype == ref[key].dtype == np.float32


def assert_same_info(ref: dict, got: dict) -> None:
    assert ref.keys() == got.keys()
    for key, value in ref.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(got[key], value, key)
        else:
            assert got[key] == value, key


env_args = st.fixed_dictionaries({
    "K": st.integers(1, 5), "R": st.integers(1, 5),
    "window_rule": st.sampled_from(["oldest", "smallest_prompt"]),
    "skip_trivial": st.booleans(),
    "shed_threshold": st.sampled_from([None, -0.99, -0.7]),
    "slo": st.sampled_from([None, {"ttft_s": 0.5, "tpot_s": 0.05}]),
    "latency_weight": st.sampled_from([0.0, 0.1]),
})


def _env_kwargs(args: dict) -> dict:
    from cbgym.metrics import SLO

    kw = dict(args)
    kw["slo"] = None if kw["slo"] is None else SLO(**kw["slo"])
    return kw


def play_both(ref: SchedulingEnv, got: SchedulingEnv, act: object) -> None:
    """Step both envs with the same actions to the episode's end, comparing every step."""
    o1, i1 = ref.reset(seed=0)
    o2, i2 = got.reset(seed=0)
    done = False
    while True:
        assert_same_observation(o1, o2)
        assert_same_info(i1, i2)
        np.testing.assert_array_equal(got.visible_waiting_ids, ref.visible_waiting_ids)
        if done:
            break
        action = act(ref, i1)  # type: ignore[operator]
        o1, r1, t1, tr1, i1 = ref.step(action)
        o2, r2, t2, tr2, i2 = got.step(action)
        assert (r1, t1, tr1) == (r2, t2, tr2)
        done = t1 or tr1
    pd.testing.assert_frame_equal(got.episode_result().requests, ref.episode_result().requests)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces.filter(lambda t: len(t[0]) >= 2), cfg=kernel_configs, args=env_args,
       seed=st.integers(0, 2**16))
def test_compiled_env_matches_reference(trace, cfg, args, seed) -> None:
    rng = np.random.default_rng(seed)
    play_both(*_env_pair(SchedulingEnv, build(*trace), _config(cfg), **_env_kwargs(args)),
              lambda env, info: rng.uniform(-1, 1, env.action_space.shape).astype(np.float32))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces.filter(lambda t: len(t[0]) >= 2), cfg=kernel_configs, args=env_args,
       seed=st.integers(0, 2**16))
def test_compiled_masked_env_matches_reference(trace, cfg, args, seed) -> None:
    args = {k: v for k, v in args.items() if k != "shed_threshold"}
    rng = np.random.default_rng(seed)
    play_both(*_env_pair(SchedulingMaskedEnv, build(*trace), _config(cfg), **_env_kwargs(args)),
              lambda env, info: int(rng.choice(np.flatnonzero(info["action_mask"]))))


def test_env_row_buffer_refills(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step whose iterations overflow the kernel's row buffer finishes in Python, the same."""
    monkeypatch.setattr(compiled_mod, "_REC_ROWS", 2)
    tr = random_trace(np.random.default_rng(5), 30, rate=3.0, max_prompt=60, max_output=50)
    rng = np.random.default_rng(5)
    for cls in (SchedulingEnv, SchedulingMaskedEnv):
        pair = _env_pair(cls, tr, make_config(num_kv_blocks=50, block_size=4, max_num_seqs=3))
        if cls is SchedulingEnv:
            play_both(*pair, lambda env, info: rng.uniform(-1, 1, env.action_space.shape))
        else:
            play_both(*pair, lambda env, info: int(np.flatnonzero(info["action_mask"])[0]))


# ---------------------------------------------------------------- choosing the backend
@dataclass(frozen=True)
class FlatCost:
    """A user-defined cost model: the kernel cannot compile it."""

    def iteration_time(self, stats: BatchStats) -> float:
        return 0.01 + 0.0 * stats.num_seqs


def test_backend_choice() -> None:
    tr = random_trace(np.random.default_rng(3), 20)
    linear = make_config()
    custom = make_config(cost_model=FlatCost())
    assert supports(linear) and not supports(custom)
    kw = dict(trace=tr, load=None, episode_requests=20)
    assert SchedulingEnv(engine=linear, **kw).backend == "compiled"
    assert SchedulingEnv(engine=custom, **kw).backend == "python"
    assert SchedulingEnv(engine=linear, backend="python", **kw).backend == "python"
    with pytest.raises(ValueError, match="FlatCost"):
        SchedulingEnv(engine=custom, backend="compiled", **kw)
    with pytest.raises(ValueError, match="backend="):
        SchedulingEnv(engine=linear, backend="fast", **kw)  # type: ignore[arg-type]


def test_compiled_env_holding_everything_forever_raises() -> None:
    tr = random_trace(np.random.default_rng(4), 10)
    env = SchedulingEnv(trace=tr, load=None, engine=make_config(), episode_requests=10)
    env.reset(seed=0)
    hold = np.full(env.action_space.shape, -0.7, np.float32)  # hold, never shed
    with pytest.raises(RuntimeError, match="idle ticks"):
        while True:
            env.step(hold)
