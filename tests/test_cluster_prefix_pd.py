"""Prefix caching on prefill/decode pools (bulk link): P computes what its cache leaves, D's
own cache shrinks the transfer, D registers received blocks when they land, and the
disaggregation rules decide on the uncached prompt; invariants under random traces."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cbgym import EngineConfig, LinearCostModel, Trace
from cbgym.agents.routing import make_router
from cbgym.cluster import ClusterConfig, LinkConfig, Pool, Route, Router
from cbgym.cluster.cluster import Cluster
from cbgym.cluster.run import local_policies, serve
from cbgym.engine import layout as L
from tests.test_prefix_cache import check_pool, shared_traces, trace_of

KV = 1000  # KV bytes per token


def engine(blocks: int = 400, caching: bool = True) -> EngineConfig:
    return EngineConfig(preset=None, cost_model=LinearCostModel(0.01, 1e-4, 2e-4),
                        num_kv_blocks=blocks, block_size=16, max_num_batched_tokens=256,
                        kv_bytes_per_token=KV, enable_prefix_caching=caching)


def pools(p: int = 1, d: int = 1, blocks: int = 400, caching: bool = True,
          mode: str = "bulk") -> ClusterConfig:
    return ClusterConfig((Pool("prefill", p, engine(blocks, caching)),
                          Pool("decode", d, engine(blocks, caching))),
                         LinkConfig(nic_gbps=2.0, setup_s=1e-3, mode=mode),
                         load_report_interval_s=0)


class Fixed(Router):
    """Routes request i by ``routes[i]``."""

    name = "fixed"

    def __init__(self, routes: list[Route]) -> None:
        self.routes = routes

    def route(self, rp):  # type: ignore[no-untyped-def]
        return self.routes[rp.request_id]


class Then(Router):
    """Request 0 disaggregated to (0, 1), the others by rule ``spec`` (at the door)."""

    name = "then"

    def __init__(self, spec: str) -> None:
        self.rule = make_router(spec)

    def reset(self, ctx):  # type: ignore[no-untyped-def]
        super().reset(ctx)
        self.rule.reset(ctx)

    def route(self, rp):  # type: ignore[no-untyped-def]
        return Route.disaggregate(0, 1) if rp.request_id == 0 else self.rule.route(rp)


SHARED = tuple(range(20))  # a 320-token prefix


def test_prefill_instance_computes_what_its_cache_leaves() -> None:
    # two requests of one family, one after the other, both prefilled on P0
    rows = [(0.0, 330, 3, (*SHARED, 500)), (5.0, 340, 3, (*SHARED, 501, 502))]
    res = serve(trace_of(rows), pools(), Fixed([Route.disaggregate(0, 1)] * 2))
    req = res.requests
    assert req["cached_tokens"].tolist() == [0, 320]  # P's hit: the shared prefix
    # D held the first request's prompt blocks (registered when its KV landed): the second
    # transfer moves only the tokens D lacks
    assert req["transfer_bytes"].tolist() == [330 * KV, (340 - 320) * KV]
    assert (req["status"] == "finished").all()
    off = serve(trace_of(rows), pools(caching=False), Fixed([Route.disaggregate(0, 1)] * 2))
    assert off.requests["transfer_bytes"].tolist() == [330 * KV, 340 * KV]
    assert off.requests["cached_tokens"].tolist() == [0, 0]
    assert req["ttft_s"].iloc[1] < off.requests["ttft_s"].iloc[1]


def test_decode_cache_counts_what_a_deflection_finds() -> None:
    # the first request disaggregated to D (its prompt cached there on landing); the second
    # deflected to that D finds the prefix; a third on P1/D2 finds nothing
    rows = [(0.0, 330, 3, (*SHARED, 500)), (5.0, 340, 3, (*SHARED, 501, 502)),
            (10.0, 340, 3, (*SHARED, 503, 504))]
    routes = [Route.disaggregate(0, 2), Route.deflect(2), Route.disaggregate(1, 3)]
    req = serve(trace_of(rows), pools(2, 2), Fixed(routes)).requests
    assert req["cached_tokens"].tolist() == [0, 320, 0]
    assert req["transfer_bytes"].tolist()[0] == 330 * KV
    assert req["transfer_bytes"].tolist()[2] == 340 * KV


def test_received_blocks_are_registered_only_when_the_kv_lands() -> None:
    """vLLM caches a remote request's blocks once its KV is received: a request deflected to
    D while a same-prefix transfer into D is in flight finds nothing."""
    # a slow link (1 MB/s): the first transfer takes ~0.33 s; the deflected request
    # arrives meanwhile
    cfg = replace(pools(), link=LinkConfig(nic_gbps=0.008, setup_s=1e-3))
    rows = [(0.0, 330, 3, (*SHARED, 500)), (0.2, 340, 3, (*SHARED, 501, 502)),
            (5.0, 340, 3, (*SHARED, 503, 504))]
    routes = [Route.disaggregate(0, 1), Route.deflect(1), Route.deflect(1)]
    req = serve(trace_of(rows), cfg, Fixed(routes)).requests
    t0 = req.iloc[0]
    assert t0["transfer_end_s"] > 0.2 + 0.05  # (still in flight at the second arrival)
    assert req["cached_tokens"].tolist() == [0, 0, 320]


@pytest.mark.parametrize("spec", ["llm-d:100", "dynamo:100:100"])
def test_disaggregation_rules_decide_on_the_uncached_prompt(spec: str) -> None:
    # one decode instance whose cache holds the family's 320-token prefix: a 340-token
    # request of that family has 20 tokens to prefill there (<= 100: deflected), one of
    # another family all 340 (disaggregated); without caching both are disaggregated
    rows = [(0.0, 330, 3, (*SHARED, 500)), (5.0, 340, 3, (*SHARED, 501, 502)),
            (10.0, 340, 3, tuple(range(1000, 1022)))]
    for caching, want in ((True, [False, True, False]), (False, [False, False, False])):
        req = serve(trace_of(rows), pools(caching=caching), Then(spec)).requests
        assert req["deflected"].tolist() == want, (spec, caching)
    # the rule compiled in the cluster loop decides the same (a long prompt first, so the
    # rule itself disaggregates it and D caches it)
    rows[0] = (0.0, 330, 3, (*SHARED, 500))
    compiled = serve(trace_of(rows), pools(), spec).requests["deflected"].tolist()
    assert compiled == [False, True, False]


def test_kairos_prices_what_the_caches_leave() -> None:
    from cbgym.agents.routing.kairos import Kairos
    from cbgym.cluster.routing import Loads, RoutingPoint

    cfg = ClusterConfig((Pool("prefill", 1, engine()), Pool("decode", 1, engine())),
                        LinkConfig(nic_gbps=2.0, setup_s=1e-3))
    k = Kairos()
    zeros = np.zeros(2, np.int64)
    loads = Loads(report_s=0.0, num_waiting=zeros, waiting_prefill_tokens=zeros,
                  num_running=zeros, decode_batch=zeros, decode_context_tokens=zeros,
                  running_prefill_tokens=zeros, kv_usage=np.zeros(2), free_blocks=zeros + 400,
                  transfers_in=zeros, transfers_out=zeros, incoming=zeros,
                  kv_held_for_transfer=zeros, local_prefills=zeros,
                  last_iteration_s=np.zeros(2))

    def point(cached: list[int] | None) -> RoutingPoint:
        return RoutingPoint(request_id=0, now=0.0, prompt_tokens=2000, waited_s=0.0,
                            ttft_target_s=2.0, tpot_target_s=0.1, role=np.array([1, 2]),
                            loads=loads, config=cfg,
                            cached_tokens=None if cached is None else np.array(cached))

    p_none, d_none, _ = k.estimates(point(None))
    p_cached, _, _ = k.estimates(point([1600, 0]))
    _, d_cached, _ = k.estimates(point([0, 1600]))
    assert p_cached[0] < p_none[0] and d_cached[0] < d_none[0]
    np.testing.assert_array_equal(k.estimates(point([0, 0]))[0], p_none)


def test_pipelined_link_with_prefix_caching_is_refused() -> None:
    with pytest.raises(ValueError, match="bulk"):
        pools(mode="pipelined")
    assert pools().disaggregated  # bulk: allowed
    assert all(e.enable_prefix_caching for e in ClusterConfig.preset(
        "1p1d:llama-3.1-8b/h100-80gb").with_prefix_caching().engines)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=st.composite(shared_traces)(), p=st.integers(1, 2), d=st.integers(1, 2),
       blocks=st.integers(30, 90),
       spec=st.sampled_from(["always-disaggregate", "never-disaggregate", "llm-d:64",
                             "dynamo:64:4", "kairos", "kairos-transfer", "round-robin"]))
def test_invariants_on_pools_with_prefix_caching(trace: Trace, p: int, d: int, blocks: int,
                                                 spec: str) -> None:
    """Random shared-prefix traces on random P/D pools and rules, every transfer audited
    (D holds the whole prompt's blocks, P its copy, at each start and landing): every
    request ends once, every instance's named pool is consistent and all its blocks come
    back, and the same inputs give the same result."""
    cfg = pools(p, d, blocks)

    def run() -> Cluster:
        c = Cluster(trace, cfg, make_router(spec), local_policies("fcfs", p + d), audit=True)
        c.run()
        return c

    c = run()
    for eng in c.engines:
        check_pool(eng)
        assert eng.kv.free == eng.config.num_kv_blocks
        assert (eng.state.req[L.HELD] == 0).all()
    from cbgym.cluster.results import cluster_result

    a, b = cluster_result(c, {}).requests, cluster_result(run(), {}).requests
    assert len(a) == len(trace) and set(a["status"]) <= {"finished", "shed"}
    pd.testing.assert_frame_equal(a, b)
