"""``jsq-time``: the shortest queue by estimated prefill time, each instance on its own cost
model. Expectations from the cost models' iteration times, computed here."""

from __future__ import annotations

import numpy as np
import pytest

import cbgym
from cbgym import Trace
from cbgym.agents.routing import make_router
from cbgym.cluster.config import ClusterConfig
from cbgym.cluster.routing import LOAD_FIELDS, ROLE_CODES, Loads, Route, RouterContext, RoutingPoint
from cbgym.engine.config import EngineConfig
from cbgym.engine.cost_model import BatchStats
from cbgym.workload import synthetic_trace

HETERO_SPEC = "2x:llama-3.1-8b/a100-80gb+2x:llama-3.1-8b/h100-80gb"
HETERO = ClusterConfig.preset(HETERO_SPEC)


def point(cfg: ClusterConfig, prompt: int, cached: list[int] | None = None,
          routed: list[int] | None = None, **loads: list) -> RoutingPoint:
    n = len(cfg.roles)
    cols = {f: np.zeros(n, np.float64 if f in ("kv_usage", "last_iteration_s") else np.int64)
            for f in LOAD_FIELDS}
    for name, values in loads.items():
        cols[name] = np.asarray(values, cols[name].dtype)
    role = np.array([ROLE_CODES[r] for r in cfg.roles], np.int64)
    return RoutingPoint(request_id=0, now=0.0, prompt_tokens=prompt, waited_s=0.0,
                        ttft_target_s=0.5, tpot_target_s=0.05, role=role,
                        loads=Loads(report_s=0.0, **cols), config=cfg,
                        cached_tokens=None if cached is None else np.array(cached, np.int64),
                        routed_since_report=None if routed is None else np.array(routed))


def prefill_s(engine: EngineConfig, total: int) -> float:
    """``total`` tokens as one sequence in chunks of the token budget, on ``engine``."""
    budget, done, t = engine.max_num_batched_tokens, 0, 0.0
    while done < total:
        q = min(budget, total - done)
        t += float(engine.cost_model.iteration_time(BatchStats(
            num_seqs=1, prefill_tokens=q, decode_seqs=0, sampled_seqs=int(done + q == total),
            attn_q_ctx=q * done, attn_q_sq=q * (q + 1) // 2, kv_tokens=done + q)))
        done += q
    return t


def route(spec: str, rp: RoutingPoint) -> Route:
    r = make_router(spec)
    r.reset(RouterContext(config=rp.config))
    return r.route(rp)


def test_equal_token_queues_go_to_the_faster_gpu() -> None:
    # instances 0, 1: A100; 2, 3: H100. The same 6,000 tokens queued everywhere: jsq-tokens
    # takes the first instance, jsq-time the first H100
    rp = point(HETERO, 1000, waiting_prefill_tokens=[6000] * 4)
    assert route("jsq-tokens", rp) == Route.to(0)
    assert route("jsq-time", rp) == Route.to(2)


@pytest.mark.parametrize("a100, h100", [(0, 4000), (2000, 9000), (5000, 20000), (100, 100),
                                        (2000, 3000), (0, 1200)])
def test_pick_is_the_least_estimated_prefill_time(a100: int, h100: int) -> None:
    rp = point(HETERO, 700, waiting_prefill_tokens=[a100, a100 + 50, h100, h100 + 50],
               running_prefill_tokens=[300, 0, 0, 300])
    work = rp.loads.waiting_prefill_tokens + rp.loads.running_prefill_tokens + 700
    est = [prefill_s(HETERO.engines[i], int(work[i])) for i in range(4)]
    assert route("jsq-time", rp) == Route.to(int(np.argmin(est)))


def test_an_h100_with_more_tokens_queued_can_be_sooner() -> None:
    # 2,000 tokens queued on each A100 against 3,000 on each H100: jsq-tokens takes an A100,
    # jsq-time the H100 its estimate finds sooner (checked against the cost models here)
    rp = point(HETERO, 500, waiting_prefill_tokens=[2000, 2000, 3000, 3000])
    assert prefill_s(HETERO.engines[2], 3500) < prefill_s(HETERO.engines[0], 2500)
    assert route("jsq-tokens", rp) == Route.to(0)
    assert route("jsq-time", rp) == Route.to(2)


def test_ties_go_to_fewer_requests_then_the_lowest_index() -> None:
    rp = point(HETERO, 500, num_running=[3, 3, 5, 2])
    assert route("jsq-time", rp) == Route.to(3)  # idle everywhere: H100s tie, 3 holds less
    rp = point(HETERO, 500, num_running=[3, 3, 2, 2])
    assert route("jsq-time", rp) == Route.to(2)


def test_requests_routed_since_the_report_count_as_this_prompt() -> None:
    # both H100s idle at the report; three requests went to instance 2 since: 3 x 700
    # tokens pending there, so instance 3
    rp = point(HETERO, 700, routed=[0, 0, 3, 0], waiting_prefill_tokens=[4000, 4000, 0, 0])
    assert route("jsq-time", rp) == Route.to(3)
    # twelve to each H100 since the report: 12 x 1,300 + 1,300 there against an A100's
    # 4,000 + 1,300; the reported loads alone would pick an H100
    rp = point(HETERO, 1300, routed=[0, 0, 12, 12], waiting_prefill_tokens=[4000, 4000, 0, 0])
    a100 = prefill_s(HETERO.engines[0], 5300)
    h100 = prefill_s(HETERO.engines[2], 16900)
    assert a100 < h100
    assert route("jsq-time", rp) == Route.to(0)
    assert route("jsq-time", point(HETERO, 1300, waiting_prefill_tokens=[4000, 4000, 0, 0])
                 ) == Route.to(2)


def test_decode_instances_count_the_requests_routed_since_the_report() -> None:
    cfg = ClusterConfig.preset("2p2d:llama-2-7b/a100-80gb")  # 0, 1: P; 2, 3: D
    rp = point(cfg, 900, num_running=[0, 0, 1, 3])
    assert route("jsq-time", rp) == Route.disaggregate(0, 2)
    rp = point(cfg, 900, routed=[1, 0, 3, 0], num_running=[0, 0, 1, 3])
    assert route("jsq-time", rp) == Route.disaggregate(1, 3)


def test_same_instant_arrivals_spread_between_reports() -> None:
    # sixteen requests at one instant, all reading one report (100 ms): the kernel's own
    # count spreads them where the report alone would send every one to the same H100
    cfg = ClusterConfig.preset(HETERO_SPEC, load_report_interval_s=0.1)
    n = 16
    tr = Trace(arrival_s=np.r_[0.0, np.full(n, 0.5)], prompt_tokens=np.full(n + 1, 800),
               output_tokens=np.full(n + 1, 20), tenant=np.zeros(n + 1, np.int32),
               slo_class=np.zeros(n + 1, np.int16))
    placed = cbgym.simulate(tr, cluster=cfg, router="jsq-time").requests["decode_instance"]
    counts = np.bincount(placed.to_numpy()[1:].astype(int), minlength=4)
    assert counts.max() < n // 2 and counts[2:].sum() > counts[:2].sum()  # H100s take more


def test_prefix_cache_hits_count_off_the_prompt() -> None:
    # instance 3 holds 3,000 of the prompt's 3,200 tokens: its estimate is for 200 + queue
    rp = point(HETERO, 3200, cached=[0, 0, 0, 3000], waiting_prefill_tokens=[0, 0, 0, 800])
    assert route("jsq-time", rp) == Route.to(3)


def test_disaggregated_cluster_prefills_by_time_and_decodes_by_requests_held() -> None:
    cfg = ClusterConfig.preset("2p2d:llama-2-7b/a100-80gb")  # 0, 1: P; 2, 3: D
    rp = point(cfg, 900, waiting_prefill_tokens=[5000, 1000, 0, 0],
               num_running=[0, 0, 7, 4])
    assert route("jsq-time", rp) == Route.disaggregate(1, 3)


def test_on_gpus_of_one_kind_it_routes_as_jsq_tokens() -> None:
    # a token of queue costs the same everywhere: the same order, request for request (with
    # live loads the in-flight count stays zero: the two rules then read the same loads)
    tr = synthetic_trace("conv").window(0, 600)
    cfg = ClusterConfig.preset("4x:llama-3.1-8b/h100-80gb", load_report_interval_s=0.0)
    a = cbgym.simulate(tr, cluster=cfg, router="jsq-tokens", load=1.5).requests
    b = cbgym.simulate(tr, cluster=cfg, router="jsq-time", load=1.5).requests
    assert (a["decode_instance"].to_numpy() == b["decode_instance"].to_numpy()).all()
    assert len(set(a["decode_instance"])) == 4
