"""Tenants and fair service: workloads by share and by mixing, per-tenant figures, Jain's
index, and VTC's counters against the paper's bound."""

from __future__ import annotations

import numpy as np
import pytest

import cbgym
from cbgym import SLO, LinearCostModel, Trace
from cbgym.agents import VTC
from cbgym.fairness import (
    jain_index,
    max_service_difference,
    service_over_time,
    tenant_table,
)
from cbgym.workload.tenants import Tenant, assign_tenants, mix_tenants, tier_slos
from tests.conftest import make_config

BLOCKS, BS = 200, 16
CFG = make_config(cost_model=LinearCostModel(0.01, 1e-4, 2e-4), num_kv_blocks=BLOCKS,
                  block_size=BS, max_num_batched_tokens=1024, max_num_seqs=16)


def two_tenants(n_a: int, n_b: int, b_at: float = 0.0) -> Trace:
    """Tenant 0 sends ``n_a`` and tenant 1 ``n_b`` requests of 256 / 256 tokens (the paper's
    overload workload), tenant 0's first, interleaved three to one."""
    arr = np.concatenate([np.zeros(n_a), np.full(n_b, b_at)])
    who = np.concatenate([np.zeros(n_a, np.int32), np.ones(n_b, np.int32)])
    key = np.concatenate([np.arange(n_a) / 3.0, np.arange(n_b)])  # (3 of A per B at t=0)
    order = np.lexsort((key, arr))
    n = n_a + n_b
    return Trace.from_arrays(arr[order], np.full(n, 256), np.full(n, 256), tenant=who[order],
                             rebase=False)


def backlogged_gap(vtc: VTC) -> float:
    """The largest service difference between the two tenants over the asks at which both
    had been backlogged throughout."""
    worst = 0.0
    base = None
    for _, service, backlogged in vtc.history:
        if backlogged != {0, 1}:
            if base is not None:
                break
            continue
        if base is None:
            base = (service.get(0, 0.0), service.get(1, 0.0))
        worst = max(worst, abs((service.get(0, 0.0) - base[0])
                               - (service.get(1, 0.0) - base[1])))
    assert base is not None, "both tenants should be backlogged at some ask"
    return worst


def test_vtc_keeps_two_backlogged_tenants_within_the_papers_bound() -> None:
    tr = two_tenants(300, 100)
    vtc = VTC()
    res = cbgym.simulate(tr, policy=vtc, engine=CFG)
    # 2 max(w_in L_in, w_out M): L_in = 256 prompt tokens, M = the KV pool in tokens
    bound = 2 * max(1.0 * 256, 2.0 * BLOCKS * BS)
    assert backlogged_gap(vtc) <= bound
    # FCFS (three of A per B) lets A pull ahead by far more
    service = service_over_time(cbgym.simulate(tr, policy="fcfs", engine=CFG), 1.0)
    assert max_service_difference(service) > 2 * bound
    assert (res.requests["status"] == "finished").all()


def test_vtc_weights_set_the_shares() -> None:
    tr = two_tenants(300, 300)
    vtc = VTC(weights={0: 2.0})
    cbgym.simulate(tr, policy=vtc, engine=CFG)
    # while both are backlogged, tenant 0 (weight 2) gets about twice tenant 1's service
    both = [(s.get(0, 0.0), s.get(1, 0.0)) for _, s, b in vtc.history if b == {0, 1}]
    a, b = both[-1][0] - both[0][0], both[-1][1] - both[0][1]
    assert 1.7 < a / b < 2.3


def test_vtc_lifts_a_newly_backlogged_tenants_counter() -> None:
    """Tenant 1 arrives after tenant 0 has been served alone: lifted to tenant 0's counter it
    shares from then on, instead of taking everything until its counter catches up."""
    tr = two_tenants(400, 200, b_at=20.0)
    vtc = VTC()
    cbgym.simulate(tr, policy=vtc, engine=CFG)
    both = [(s.get(0, 0.0), s.get(1, 0.0)) for _, s, b in vtc.history if b == {0, 1}]
    a, b = both[-1][0] - both[0][0], both[-1][1] - both[0][1]
    assert 0.7 < a / b < 1.4


def test_vtc_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="w_out"):
        VTC(w_out=-1.0)
    with pytest.raises(ValueError, match=r"weights\[3\]"):
        VTC(weights={3: 0.0})
    from cbgym.agents import DRR, WFQ

    with pytest.raises(ValueError, match="DRR quantum"):
        DRR(quantum=0)
    with pytest.raises(ValueError, match=r"WFQ weights\[0\]"):
        WFQ(weights={0: -1.0})


def test_assign_and_mix_tenants() -> None:
    rng = np.random.default_rng(0)
    n = 4000
    base = Trace.from_arrays(np.sort(rng.uniform(0, 100, n)), rng.integers(1, 500, n),
                             rng.integers(1, 100, n))
    tr = assign_tenants(base, [Tenant("chat", 3.0, tier="interactive"),
                               Tenant("batch", 1.0, tier="batch")], seed=1)
    assert abs((tr.tenant == 0).mean() - 0.75) < 0.03
    assert np.array_equal(tr.slo_class, np.where(tr.tenant == 0, 0, 2))
    assert np.array_equal(tr.arrival_s, base.arrival_s)
    mixed = mix_tenants([(Tenant("a", 1.0), base), (Tenant("b", 3.0), base)], rate_rps=40.0)
    assert np.all(np.diff(mixed.arrival_s) >= 0) and len(mixed) == 2 * n
    # each tenant at its share of 40 req/s
    for t, rate in ((0, 10.0), (1, 30.0)):
        arr = mixed.arrival_s[mixed.tenant == t]
        assert abs(len(arr) / (arr[-1] - arr[0]) - rate) < 0.5
    assert set(tier_slos()) == {0, 1, 2}


@pytest.mark.parametrize("bad, match", [
    (lambda: Tenant("a", share=0.0), "share"),
    (lambda: Tenant("a", weight=-1.0), "weight"),
    (lambda: Tenant("a", tier="gold"), "tier"),
    (lambda: assign_tenants(Trace.from_arrays([0.0, 1.0], [1, 1], [1, 1]),
                            [Tenant("a"), Tenant("a")]), "unique"),
    (lambda: tier_slos({7: cbgym.SLO()}), "class 7"),
])
def test_bad_tenant_input_is_a_clear_error(bad, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        bad()


def test_tenant_table_and_jain_index() -> None:
    tr = two_tenants(60, 20)
    res = cbgym.simulate(tr, policy="fcfs", engine=CFG)
    table = tenant_table(res)
    assert table["requests"].tolist() == [60, 20]
    assert table["service"].sum() == pytest.approx((1 * 256 + 2 * 256) * 80)
    # every request is good, shed, late to its first token, or late after it: exactly one
    parts = table[["good", "shed", "ttft_missed", "late_after_first_token"]].sum(axis=1)
    assert (parts == table["requests"]).all()
    tight = tenant_table(res, SLO(ttft_s=1e-6, tpot_s=1.0))  # no first token that soon
    assert (tight["good"] == 0).all() and (tight["ttft_missed"] == tight["finished"]).all()
    slow = tenant_table(res, SLO(ttft_s=1e3, tpot_s=1e-9))  # first tokens met, TPOT never
    assert (slow["late_after_first_token"] == slow["finished"]).all()
    assert jain_index([1.0, 1.0, 1.0]) == 1.0
    assert jain_index([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="jain_index"):
        jain_index([1.0, -1.0])


# KV for every running request: no preemption (a re-admitted request costs DRR its prompt
# again, which would tilt the shares by who is preempted)
ROOMY = make_config(cost_model=LinearCostModel(0.01, 1e-4, 2e-4), num_kv_blocks=2000,
                    block_size=BS, max_num_batched_tokens=1024, max_num_seqs=16)


def admitted_shares(policy: object, weights: tuple[float, float]) -> float:
    """Tenant 1's admissions over tenant 0's while both are backlogged (equal requests, both
    sending 240 at once)."""
    tr = two_tenants(240, 240)
    res = cbgym.simulate(tr, policy=policy, engine=ROOMY).requests
    assert res["preemptions"].sum() == 0
    sched = res["first_scheduled_s"].to_numpy()
    who = res["tenant"].to_numpy()
    until = min(sched[who == 0].max(), sched[who == 1].max())  # both backlogged before it
    inside = sched < until
    return ((who == 1) & inside).sum() / ((who == 0) & inside).sum()


@pytest.mark.parametrize("make", [
    lambda w: __import__("cbgym.agents", fromlist=["DRR"]).DRR(quantum=256, weights=w),
    lambda w: __import__("cbgym.agents", fromlist=["WFQ"]).WFQ(weights=w),
    lambda w: VTC(weights=w),
], ids=["drr", "wfq", "vtc"])
def test_fair_queues_share_by_weight(make) -> None:
    assert admitted_shares(make({}), (1, 1)) == pytest.approx(1.0, abs=0.1)
    assert admitted_shares(make({1: 3.0}), (1, 3)) == pytest.approx(3.0, rel=0.12)


def test_fcfs_does_not_share() -> None:
    assert admitted_shares("fcfs", (1, 1)) < 0.5  # (three of tenant 0's per tenant 1's)


def test_token_buckets_hold_their_rates() -> None:
    """Tenant 0 floods (240 requests at once) under a bucket of 500 prompt tokens a second
    (depth 1,000: below what the engine could serve it); tenant 1 has no bucket. Tenant 0's
    admitted prompt tokens up to any time t stay within depth + rate t, and track it; tenant
    1 is never held."""
    from cbgym.agents import TokenBucket

    tr = two_tenants(240, 60)
    res = cbgym.simulate(tr, policy=TokenBucket(rates={0: 500.0}, depths={0: 1000.0}),
                         engine=ROOMY).requests
    a = res[res["tenant"] == 0].sort_values("first_scheduled_s")
    got = np.cumsum(a["prompt_tokens"].to_numpy())
    t = a["first_scheduled_s"].to_numpy()
    assert np.all(got <= 1000.0 + 500.0 * t + 1e-6)
    assert got[-1] / (1000.0 + 500.0 * t[-1]) > 0.9  # (and uses its rate)
    b = res[res["tenant"] == 1]
    assert b["first_scheduled_s"].max() < t[-1] / 4  # tenant 1 goes past the flood
    with pytest.raises(ValueError, match=r"rates\[0\]"):
        TokenBucket(rates={0: 0.0})
    with pytest.raises(ValueError, match="without a rate"):
        TokenBucket(rates={0: 1.0}, depths={1: 5.0})


def test_vtc_lifts_a_queue_that_emptied_between_two_asks() -> None:
    """Tenant 1's only waiting request is admitted at one ask and another arrives by the next:
    its queue went empty and non-empty, so it is lifted to tenant 0's counter (found in
    review: it used to count as backlogged throughout)."""
    from types import SimpleNamespace

    n = 10
    tenant = np.array([0, 0, 0, 0, 1, 1, 1, 1, 0, 1])
    gen = np.zeros(n, np.int64)

    def point(now: float, waiting: list[int], running: list[int]) -> SimpleNamespace:
        return SimpleNamespace(now=now, waiting=np.array(waiting, np.int64),
                               running=np.array(running, np.int64),
                               finished=np.zeros(0, np.int64), tenant=tenant,
                               prompt_tokens=np.full(n, 100), num_generated=gen,
                               arrival_s=np.arange(n, dtype=float), config=CFG)

    from cbgym.engine.decision import PolicyContext

    vtc = VTC()
    vtc.reset(PolicyContext(config=CFG, num_requests=n, seed=0))
    vtc.decide(point(0, [0, 1, 2], []))  # tenant 0 alone; all admitted
    gen[[0, 1, 2]] = 500
    vtc.decide(point(1, [3, 4], [0, 1, 2]))  # tenant 1 joins; the engine admits 4 only
    gen[[0, 1, 2]] = 1500  # tenant 0 keeps receiving output
    vtc.decide(point(2, [3, 5], [0, 1, 2, 4]))  # tenant 1's queue emptied and refilled
    assert vtc.counter[1] == vtc.counter[0] == 9300.0


def fake_points(tenant: np.ndarray):  # noqa: ANN201 (a DecisionPoint's fields a fair policy reads)
    from types import SimpleNamespace

    n = len(tenant)

    def point(waiting: list[int], running: list[int]) -> SimpleNamespace:
        return SimpleNamespace(now=0.0, waiting=np.array(waiting, np.int64),
                               running=np.array(running, np.int64),
                               finished=np.zeros(0, np.int64), tenant=tenant,
                               prompt_tokens=np.full(n, 100), num_generated=np.zeros(n, np.int64),
                               arrival_s=np.arange(n, dtype=float),
                               config=make_config(max_num_seqs=8))
    return point


def test_drr_round_order_and_commit() -> None:
    """Found in review: a tenant that starts waiting joins the round's tail (FIFO DRR), and a
    planned request the engine passed over keeps its cost in its tenant's deficit."""
    from cbgym.agents import DRR
    from cbgym.engine.decision import PolicyContext

    tenant = np.repeat(np.arange(4), 5)
    point = fake_points(tenant)

    def q(t: int, k: int = 0) -> list[int]:
        return list(range(5 * t + k, 5 * t + 5))

    drr = DRR(quantum=100)
    drr.reset(PolicyContext(config=make_config(), num_requests=20, seed=0))
    assert tenant[drr.decide(point(q(0) + q(1) + q(2), [])).order].tolist()[:3] == [0, 1, 2]
    # tenants 0 and 1 were served; tenant 3 starts waiting: it goes after 2, 0 and 1
    order = drr.decide(point(q(0, 1) + q(1, 1) + q(2) + q(3), [0, 5])).order
    assert tenant[order].tolist()[:4] == [2, 0, 1, 3]
    drr = DRR(quantum=100)
    drr.reset(PolicyContext(config=make_config(), num_requests=20, seed=0))
    assert drr.decide(point(q(0) + q(1), [])).order.tolist()[:2] == [0, 5]
    # the engine admitted 5 but not 0: tenant 0 keeps the 100 it did not spend
    drr.decide(point([0] + q(0, 1) + q(1, 1), [5]))
    assert drr.state[0][0] == 100.0
