"""Aging scaled to the SLO horizon: W seconds of work forgiven per TTFT target waited."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from cbgym import SLO, EngineConfig, Trace
from cbgym.agents import make_policy
from cbgym.agents.base import _NO_STATS, QueueView
from cbgym.engine.decision import PolicyContext
from cbgym.simulate import simulate
from cbgym.workload.synthetic import synthetic_trace


def view(prompt: list[int], waited: list[float], cls: list[int]) -> QueueView:
    n = len(prompt)
    z = np.zeros(n, np.int64)
    return QueueView(queue_pos=np.arange(n), prompt_tokens=np.array(prompt), num_computed=z,
                     num_generated=z, num_preemptions=z, waited_s=np.array(waited),
                     tenant=z, slo_class=np.array(cls), now=100.0,
                     recent_output_by_bucket=_NO_STATS, recent_output_mean=float("nan"))


def test_a_tight_target_ages_faster() -> None:
    pol = make_policy("sjf-ctx-slo-aging:1000")
    pol.reset(PolicyContext(config=EngineConfig(), num_requests=2, seed=0,
                            ttft_target_s=np.array([0.5, 30.0]), slo_class=np.array([0, 1])))
    # same prompt, same wait: the interactive one (0.5 s target) has aged 60x as much
    keys = pol.keys(view([1000, 1000], [1.0, 1.0], [0, 1]))
    work = 1000 * pol.key_unit_s()
    assert keys[0] == pytest.approx(work - 1000 * 1.0 / 0.5)
    assert keys[1] == pytest.approx(work - 1000 * 1.0 / 30.0)
    assert not pol.static_key and pol.static_keys() is None


def test_one_class_is_plain_aging_with_the_weight_over_its_target() -> None:
    tr = synthetic_trace("conv", 600, seed=3)
    slo = SLO(2.0, 0.1)
    a = simulate(tr, policy="cb-sjf-work-slo-aging:0.5", load=1.1, slo=slo).requests
    b = simulate(tr, policy="cb-sjf-work-aging:0.25", load=1.1, slo=slo).requests
    cols = ["first_scheduled_s", "finish_s", "status"]
    pd.testing.assert_frame_equal(a[cols], b[cols], check_exact=False, rtol=1e-9)


def test_without_targets_it_says_what_it_needs() -> None:
    pol = make_policy("sjf-ctx-slo-aging:1")
    with pytest.raises(ValueError, match="TTFT target"):
        pol.reset(PolicyContext(config=EngineConfig(), num_requests=1, seed=0))
    pol.reset(PolicyContext(config=EngineConfig(), num_requests=1, seed=0,
                            ttft_target_s=np.array([1.0]), slo_class=np.array([0])))
    with pytest.raises(ValueError, match="SLO class 7"):
        pol.keys(view([10], [1.0], [7]))


def test_it_runs_on_tiers() -> None:
    tr = synthetic_trace("conv", 400, seed=1)
    tr = Trace.from_arrays(tr.arrival_s, tr.prompt_tokens, tr.output_tokens,
                           slo_class=np.arange(len(tr)) % 3, name="tiers")
    from cbgym.workload.tenants import tier_slos

    req = simulate(tr, policy="cb-sjf-work-slo-aging:0.1", load=1.0, slo=tier_slos()).requests
    ended = req[req["status"] != "finished"]
    assert (ended["reason"] == "prompt_exceeds_max_model_len").all()
    wait = req.groupby("slo_class")["queue_s"].mean()
    assert wait[0] < wait[2]  # the interactive class ages 66x faster than the batch one
