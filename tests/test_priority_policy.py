"""vLLM's priority policy (``cbgym.agents.Priority``): order, victims, inputs.

Its decisions are replayed against vLLM's own scheduler in ``tests/test_vllm_conformance.py``
(the ``priority_*`` golden files); these tests pin the rules on small hand-made cases."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import cbgym
from cbgym import LinearCostModel, Trace
from cbgym.agents import Priority, make_policy
from cbgym.engine.decision import PolicyContext
from tests.conftest import make_config

CFG = make_config(cost_model=LinearCostModel(0.01, 1e-4, 2e-4), num_kv_blocks=400,
                  block_size=16, max_num_batched_tokens=256, max_num_seqs=2)


def run(tr: Trace, policy: object = "priority", cfg=CFG) -> pd.DataFrame:
    return cbgym.simulate(tr, policy=policy, engine=cfg).requests


def test_admits_by_priority_then_arrival() -> None:
    # six requests at once, two slots: (priority, arrival) decides who goes first
    prio = [2, 0, 1, 0, 2, 1]
    tr = Trace.from_arrays(np.zeros(6), np.full(6, 50), np.full(6, 20), rebase=False,
                           extra={"priority": prio})
    first = run(tr)["first_scheduled_s"].to_numpy()
    order = np.argsort(first, kind="stable")
    assert order.tolist() == [1, 3, 2, 5, 0, 4]


def test_priorities_default_to_the_slo_class() -> None:
    tr = Trace.from_arrays(np.zeros(4), np.full(4, 50), np.full(4, 20), rebase=False,
                           slo_class=[1, 1, 0, 0])
    first = run(tr)["first_scheduled_s"].to_numpy()
    assert first[2] < first[0] and first[3] < first[1]
    assert np.array_equal(tr.priority, [1, 1, 0, 0])


def test_victim_is_the_largest_priority_not_the_last_admitted() -> None:
    """Two requests decode in 3 blocks of 16 tokens; the low-priority one (value 5) was
    admitted first. When blocks run out, vLLM's priority policy evicts it, FCFS the other."""
    cfg = make_config(cost_model=LinearCostModel(0.01, 1e-4, 2e-4), num_kv_blocks=3,
                      block_size=16, max_num_batched_tokens=256, max_num_seqs=2)
    tr = Trace.from_arrays(np.array([0.0, 0.005]), np.array([15, 15]), np.array([20, 20]),
                           rebase=False, extra={"priority": [5, 0]})
    prio, fcfs = run(tr, cfg=cfg), run(tr, "fcfs", cfg)
    assert prio["preemptions"].tolist() == [1, 0]
    assert fcfs["preemptions"].tolist() == [0, 1]


def test_kernel_and_door_agree() -> None:
    """The compiled path (static keys) and the door (decide, which names its victims by the
    same key) make the same decisions, preemptions included."""

    class AtTheDoor(Priority):
        def static_keys(self) -> None:  # type: ignore[override]
            return None

    rng = np.random.default_rng(3)
    n = 60
    tr = Trace.from_arrays(np.sort(rng.uniform(0, 3, n)), rng.integers(10, 400, n),
                           rng.integers(1, 80, n), rebase=False,
                           extra={"priority": rng.integers(0, 4, n)})
    for blocks in (5000, 60):
        cfg = make_config(cost_model=LinearCostModel(0.01, 1e-4, 2e-4), num_kv_blocks=blocks,
                          block_size=16, max_num_batched_tokens=256, max_num_seqs=4)
        a, b = run(tr, cfg=cfg), run(tr, AtTheDoor(), cfg)
        assert (a["preemptions"].sum() == 0) == (blocks == 5000)
        pd.testing.assert_frame_equal(a, b, check_exact=True)


def test_bad_priorities_are_rejected() -> None:
    pol = make_policy("priority")
    with pytest.raises(ValueError, match="expected 3 priorities"):
        pol.reset(PolicyContext(config=CFG, num_requests=3, seed=0, priority=np.zeros(2)))
    with pytest.raises(ValueError, match="too far apart"):
        pol.reset(PolicyContext(config=CFG, num_requests=3, seed=0,
                                priority=np.array([0, 2**60, 1])))


def test_strict_tiers_serve_the_interactive_class_first() -> None:
    tr = Trace.from_arrays(np.zeros(5), np.full(5, 50), np.full(5, 20), rebase=False,
                           slo_class=[2, 1, 0, 2, 0])
    first = run(tr, "strict-tiers")["first_scheduled_s"].to_numpy()
    assert np.argsort(first, kind="stable").tolist() == [2, 4, 0, 1, 3]


def test_least_slack_orders_by_ttft_deadline() -> None:
    # class 1 has a 5 s target, class 0 a 0.5 s one: a later class-0 arrival goes first
    tr = Trace.from_arrays(np.array([0.0, 0.0, 0.0, 0.2]), np.full(4, 50),
                           np.array([40, 80, 40, 40]), rebase=False, slo_class=[1, 1, 1, 0])
    slo = {0: cbgym.SLO(0.5, 0.1), 1: cbgym.SLO(5.0, 0.1)}
    for policy, later in (("least-slack", 2), ("fcfs", 3)):
        first = cbgym.simulate(tr, policy=policy, engine=CFG, slo=slo).requests[
            "first_scheduled_s"].to_numpy()
        # the first slot to free (request 0's) goes to the tighter deadline, not the arrival
        assert first[later] > first[5 - later]
