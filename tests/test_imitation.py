"""Demonstrations for the behaviour-cloning warm start: a heuristic's decisions as env scores."""

from __future__ import annotations

import numpy as np
import pytest

import cbgym
from cbgym.agents import make_policy
from cbgym.agents.imitation import cap_score, demonstrate
from cbgym.engine import EngineConfig, LinearCostModel
from cbgym.env.kernel_ops import running_cap


def overload_env(**kw: object) -> cbgym.SchedulingEnv:
    rng = np.random.default_rng(4)
    n = 300
    trace = cbgym.Trace.from_arrays(np.cumsum(rng.exponential(0.02, n)),
                                    rng.integers(20, 1500, n), rng.integers(2, 200, n))
    cfg = EngineConfig(preset=None, cost_model=LinearCostModel(), num_kv_blocks=400)
    kw = {"trace": trace, "engine": cfg, "episode_requests": 120, "load": None,
          "slo": cbgym.SLO(0.5, 0.05), "shed_rule": "unreachable", "shed_threshold": -0.51,
          "admission_cap": True, **kw}
    return cbgym.SchedulingEnv(**kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("max_seqs", [24, 256])
def test_cap_score_inverts_running_cap(max_seqs: int) -> None:
    for cap in (1, 2, 7, 10, 16, 23):
        assert running_cap(cap_score(cap, max_seqs), max_seqs) == cap
    assert cap_score(max_seqs, max_seqs) == cap_score(10**6, max_seqs) == 1.0


def test_replaying_the_demonstrated_scores_reproduces_the_heuristic_on_the_env() -> None:
    """While the whole queue fits the visible window, the translated scores make the env take
    the heuristic's decisions: an episode played from them is the fast path's, request for
    request (admissions, sheds and the running cap)."""
    env = overload_env(K=64)
    demos = demonstrate(env, make_policy("cb-sjf-work-shed:6"), steps=1, gamma=0.99)
    assert demos.episodes == 1 and len(demos.actions) == len(demos.returns)
    assert demos.actions.shape[1] == env.K + env.R + 1
    played = env.episode_result().requests
    fast = cbgym.simulate(env.episode_trace, "cb-sjf-work-shed:6", engine=env.config,
                          slo=env.slo).requests
    assert (played["status"] == "shed").sum() > 0
    assert env.engine.recorder.timeseries()[:, 2].max() <= env.K, "the queue must fit in K"
    for col in ("first_scheduled_s", "finish_s", "status"):
        np.testing.assert_array_equal(played[col].to_numpy(), fast[col].to_numpy(), err_msg=col)
    summary = env.episode_result().summary()
    assert demos.goodput == round(summary["slo_attainment"] * summary["num_requests"])
    # discounted returns of goodput rewards: never negative, and the first one holds a
    # discounted share of every good request of the episode
    assert (demos.returns >= 0).all() and 0 < demos.returns[0] <= demos.goodput
