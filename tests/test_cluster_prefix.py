"""Prefix caching on a cluster of unified replicas: the ground truths of the cluster hold with
it on, routers see each instance's cached prefix, and the cache-aware routers use it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cbgym
from cbgym import EngineConfig, LinearCostModel, Trace
from cbgym.agents.routing import make_router
from cbgym.cluster import ClusterConfig, Pool, Route, Router
from cbgym.cluster.cluster import Cluster
from cbgym.cluster.run import local_policies, serve
from cbgym.cluster.state import view
from cbgym.engine import layout as L
from tests.test_prefix_cache import check_pool, shared_traces, trace_of

COLS = ["first_scheduled_s", "first_token_s", "finish_s", "preemptions", "status", "reason",
        "cached_tokens"]


def engine(blocks: int = 400) -> EngineConfig:
    return EngineConfig(preset=None, cost_model=LinearCostModel(0.01, 1e-4, 2e-4),
                        num_kv_blocks=blocks, block_size=16, max_num_batched_tokens=256,
                        enable_prefix_caching=True)


def replicas(n: int, blocks: int = 400, interval: float = 0.0) -> ClusterConfig:
    return ClusterConfig((Pool("unified", n, engine(blocks)),), load_report_interval_s=interval)


def families(n: int = 120, seed: int = 0) -> Trace:
    rng = np.random.default_rng(seed)
    rows = []
    for i, t in enumerate(np.sort(rng.uniform(0, 6, n))):
        prompt = int(rng.integers(40, 400))
        fam, shared = int(rng.integers(3)), int(rng.integers(0, 12))
        ids = tuple(fam * 100 + j if j < shared else 10_000 + 100 * i + j
                    for j in range(-(-prompt // 16)))
        rows.append((float(t), prompt, int(rng.integers(1, 40)), ids))
    return trace_of(rows)


def test_one_replica_is_the_single_engine() -> None:
    tr = families()
    one = cbgym.simulate(tr, engine=engine())
    c = serve(tr, replicas(1), "round-robin")
    pd.testing.assert_frame_equal(one.requests[COLS], c.requests[COLS], check_exact=True)
    assert one.summary()["prefix_cache_hits"] == c.summary()["prefix_cache_hits"] > 0


def test_round_robin_replicas_are_independent_engines_each_with_its_cache() -> None:
    tr = families(150, seed=1)
    N = 3
    c = serve(tr, replicas(N), "round-robin")
    for i in range(N):
        ids = np.arange(i, len(tr), N)
        part = Trace.from_arrays(tr.arrival_s[ids], tr.prompt_tokens[ids],
                                 tr.output_tokens[ids], name="part", rebase=False,
                                 extra={k: v[ids] for k, v in tr.extra.items()})
        alone = cbgym.simulate(part, engine=engine()).requests
        mine = c.requests.iloc[ids]
        for col in COLS:  # bit for bit
            np.testing.assert_array_equal(alone[col].to_numpy(), mine[col].to_numpy())


class Recorder(Router):
    """Sends request i to instance i % N and keeps what each routing point showed."""

    name = "recorder"

    def reset(self, ctx) -> None:  # type: ignore[no-untyped-def]
        super().reset(ctx)
        self.seen: dict[int, list[int]] = {}

    def route(self, rp) -> Route:  # type: ignore[no-untyped-def]
        self.seen[rp.request_id] = rp.cached_tokens.tolist()
        return Route.to(0 if rp.request_id < 2 else 1)


def test_routing_point_shows_each_instances_cached_prefix() -> None:
    rows = [(0, 64, 1, (1, 2, 3, 4)), (1, 40, 1, (7, 8, 9)), (5, 70, 1, (1, 2, 3, 5, 6)),
            (6, 70, 1, (1, 2, 3, 5, 6))]
    r = Recorder()
    serve(trace_of(rows), replicas(2), r)
    assert r.seen == {0: [0, 0], 1: [0, 0], 2: [48, 0], 3: [48, 64]}


@pytest.mark.parametrize("spec", ["dynamo-kv", "llm-d-prefix", "cache-affinity:32:0.5"])
def test_cache_aware_routers_follow_the_prefix(spec: str) -> None:
    # a long shared prefix first lands on some instance; later requests of that family
    # go where it is cached (the load stays light and balanced)
    rows = [(0.0, 320, 2, tuple(range(20)))]
    rows += [(2.0 * k, 330, 2, tuple(range(20)) + (500 + k,)) for k in range(1, 6)]
    res = serve(trace_of(rows), replicas(4), spec)
    d = res.requests["decode_instance"].to_numpy()
    assert (d[1:] == d[0]).all(), d
    assert (res.requests["cached_tokens"].to_numpy()[1:] == 320).all()


def test_routers_count_what_they_sent_since_the_report() -> None:
    # ten requests at one instant, nothing cached: spread, not herded onto one instance
    rows = [(0.0, 64, 5, (1000 + 10 * i, 1001 + 10 * i, 1002 + 10 * i, 1003 + 10 * i))
            for i in range(8)]
    for spec in ("dynamo-kv", "llm-d-prefix", "cache-affinity"):
        d = serve(trace_of(rows), replicas(4, interval=0.05), spec).requests["decode_instance"]
        assert np.bincount(d.to_numpy(), minlength=4).tolist() == [2, 2, 2, 2], spec


def test_bad_configurations() -> None:
    eng = engine()
    with pytest.raises(ValueError, match="same on every"):
        ClusterConfig((Pool("unified", 1, eng),
                       Pool("unified", 1, EngineConfig(preset="llama-2-7b/a100-80gb"))))
    pd_cfg = ClusterConfig.preset("1p1d:llama-3.1-8b/h100-80gb")
    with pytest.raises(ValueError, match="unified"):
        serve(families(10), pd_cfg, "dynamo-kv")
    on = ClusterConfig.preset("2x:llama-3.1-8b/h100-80gb").with_prefix_caching()
    assert all(e.enable_prefix_caching for e in on.engines)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=st.composite(shared_traces)(), n=st.integers(1, 3), blocks=st.integers(20, 80),
       spec=st.sampled_from(["round-robin", "least-outstanding", "dynamo-kv", "llm-d-prefix",
                             "cache-affinity"]))
def test_cluster_invariants_with_prefix_caching(trace: Trace, n: int, blocks: int,
                                                 spec: str) -> None:
    """Random shared-prefix traces on random replica counts and routers: every request ends
    once, every instance's named pool is consistent and all its blocks come back, and the
    same inputs give the same result."""
    def run() -> Cluster:
        c = Cluster(trace, replicas(n, blocks), make_router(spec), local_policies("fcfs", n))
        c.run()
        return c

    c = run()
    for i, eng in enumerate(c.engines):
        assert eng.state.blocks is not None and eng.state.blocks.base is not None
        check_pool(eng)
        assert eng.kv.free == blocks and (view(c.S, i).req[L.HELD] == 0).all()
    res = serve(trace, replicas(n, blocks), spec)
    assert len(res.requests) == len(trace)
    assert set(res.requests["status"]) <= {"finished", "shed"}
    again = serve(trace, replicas(n, blocks), spec)
    pd.testing.assert_frame_equal(res.requests[COLS], again.requests[COLS])


@pytest.mark.parametrize("spec", ["dynamo-kv", "cache-affinity:32:0.3", "llm-d-prefix"])
def test_routing_ahead_of_time_never_changes_what_a_cache_router_sees(spec: str) -> None:
    """Found in review: with load reports every 50 ms the cluster routed arrivals ahead of
    time, when the instances' caches were still at an earlier time."""
    tr = families(200)
    cfg = replicas(3, interval=0.05)

    def run(eager: bool) -> pd.DataFrame:
        c = Cluster(tr, cfg, make_router(spec), local_policies("fcfs", 3), eager=eager)
        c.run()
        from cbgym.cluster.results import cluster_result

        return cluster_result(c, {}).requests

    pd.testing.assert_frame_equal(run(True), run(False))
