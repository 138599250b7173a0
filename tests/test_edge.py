"""The cluster's edge: admission caps (429), queue TTL (503), clients' timeouts and retries.

Hand-computed timelines on a one-slot engine whose iterations take 10 ms each, equivalence
with no edge, conservation over random clusters, loads and settings, and bad input."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cbgym import AdmissionConfig, ClientModel, EngineConfig, LinearCostModel, Trace
from cbgym.cluster import ClusterConfig, LinkConfig, Pool, Route, Router
from cbgym.cluster.cluster import Cluster
from cbgym.cluster.edge_results import OUTCOMES, edge_totals
from cbgym.cluster.results import cluster_result
from cbgym.cluster.run import local_policies, serve
from cbgym.engine import layout as L
from cbgym.simulate import simulate

TICK = 0.01  # every iteration of the one-slot engine


def one_slot(seqs: int = 1, blocks: int = 1000) -> ClusterConfig:
    eng = EngineConfig(preset=None, cost_model=LinearCostModel(TICK, 0.0, 0.0),
                       num_kv_blocks=blocks, block_size=16, kv_bytes_per_token=1000,
                       max_num_batched_tokens=100_000, max_num_seqs=seqs)
    return ClusterConfig((Pool("unified", 1, eng),), load_report_interval_s=0)


def two(output0: int = 200, output1: int = 5) -> Trace:
    """Request 0 at 0 s runs ``output0`` iterations (until 2 s); request 1 comes at 0.1 s."""
    return Trace.from_arrays(np.array([0.0, 0.1]), np.array([16, 16]),
                             np.array([output0, output1]), name="two")


def backoff(**kw: object) -> ClientModel:
    return ClientModel(jitter=0.0, backoff_base_s=0.2, backoff_multiplier=2.0, **kw)  # type: ignore[arg-type]


def test_a_rejected_request_retries_on_its_backoff_until_its_retries_run_out() -> None:
    res = serve(two(), one_slot(), "round-robin", admission=AdmissionConfig(max_in_flight=1),
                client=backoff(max_retries=3))
    req = res.requests
    mine = req[req["request"] == 1]
    # rejected at 0.1; retried 0.2, 0.4, 0.8 s later, each rejected while request 0 runs
    np.testing.assert_allclose(mine["arrival_s"], [0.1, 0.3, 0.7, 1.5], rtol=1e-12)
    assert mine["attempt"].tolist() == [0, 1, 2, 3]
    assert (mine["outcome"] == "shed").all() and (mine["reason"] == "rejected_429").all()
    np.testing.assert_allclose(mine["client_end_s"], mine["arrival_s"])
    assert res.clients.loc[1, "outcome"] == "shed" and res.clients.loc[1, "attempts"] == 4
    assert res.clients.loc[0, "outcome"] == "good"
    totals = edge_totals(res)
    assert totals == {**totals, "offered": 2, "attempts": 5, "retried": 3, "accepted": 1,
                      "good": 1, "shed": 1, "shed_attempts": 4}


def test_a_retry_after_the_server_frees_up_is_served() -> None:
    res = serve(two(), one_slot(), "round-robin", admission=AdmissionConfig(max_in_flight=1),
                client=backoff(max_retries=4))
    last = res.requests.loc[res.clients.loc[1, "final_attempt"]]
    assert last["arrival_s"] == pytest.approx(3.1, rel=1e-12)  # 1.5 + 1.6: request 0 done at 2
    assert last["outcome"] == "good"  # its own TTFT: one 10 ms iteration
    assert last["ttft_s"] == pytest.approx(TICK, rel=1e-9)
    # the client waited 3 s for its first token: late as its client sees it
    assert res.clients.loc[1, "outcome"] == "late"
    assert res.clients.loc[1, "ttft_s"] == pytest.approx(3.1 + TICK - 0.1, rel=1e-9)


def test_a_timed_out_request_is_aborted_and_retried() -> None:
    res = serve(two(), one_slot(), "round-robin", client=backoff(timeout_s=0.5, max_retries=1))
    req = res.requests
    mine = req[req["request"] == 1]
    np.testing.assert_allclose(mine["arrival_s"], [0.1, 0.8], rtol=1e-12)  # 0.1 + 0.5 + 0.2
    np.testing.assert_allclose(mine["client_end_s"], [0.6, 1.3], rtol=1e-12)
    assert (mine["status"] == "abandoned").all() and (mine["outcome"] == "abandoned").all()
    assert (mine["reason"] == "aborted_client_timeout").all()
    # the server aborts it at the next iteration boundary after the client left
    assert ((mine["finish_s"] >= mine["client_end_s"])
            & (mine["finish_s"] < mine["client_end_s"] + TICK + 1e-9)).all()
    assert req.loc[0, "finish_s"] == pytest.approx(200 * TICK)  # never slowed down
    t = edge_totals(res)
    assert (t["abandoned"], t["abandoned_attempts"], t["good"]) == (1, 2, 1)


def test_an_abandoned_request_left_running_wastes_the_server() -> None:
    res = serve(two(), one_slot(), "round-robin",
                client=backoff(timeout_s=0.5, max_retries=1, on_abandon="leave"))
    mine = res.requests[res.requests["request"] == 1]
    # both attempts wait for request 0 (until 2 s), then run 5 iterations each, in order
    np.testing.assert_allclose(mine["first_token_s"], [2.0 + TICK, 2.05 + TICK], rtol=1e-9)
    np.testing.assert_allclose(mine["finish_s"], [2.05, 2.10], rtol=1e-9)
    assert (mine["status"] == "abandoned").all()  # served, but nobody was there
    assert res.clients.loc[1, "outcome"] == "abandoned"


def test_timeout_on_completion() -> None:
    client = backoff(timeout_s=1.0, max_retries=0, timeout_on="completion")
    res = serve(two(output0=50, output1=100), one_slot(seqs=2), "round-robin", client=client)
    # request 1 runs beside request 0 from 0.1 s: its 100 tokens take until 1.1 s > 0.1 + 1
    assert res.clients["outcome"].tolist() == ["good", "abandoned"]


def test_a_request_waiting_past_its_queue_ttl_expires_with_503() -> None:
    res = serve(two(), one_slot(), "round-robin", admission=AdmissionConfig(queue_ttl_s=0.5),
                client=backoff(max_retries=1))
    mine = res.requests[res.requests["request"] == 1]
    np.testing.assert_allclose(mine["arrival_s"], [0.1, 0.8], rtol=1e-12)
    assert (mine["outcome"] == "expired").all()
    assert (mine["reason"] == "expired_queue_ttl").all()
    assert res.clients.loc[1, "outcome"] == "expired"
    # a request already running never expires
    assert res.requests.loc[0, "outcome"] == "good"


def test_a_waiting_cap_counts_the_queue_only() -> None:
    tr = Trace.from_arrays(np.array([0.0, 0.1, 0.2, 0.3]), np.full(4, 16), np.full(4, 50),
                           name="four")
    res = serve(tr, one_slot(), "round-robin", admission=AdmissionConfig(max_waiting=1),
                client=ClientModel(max_retries=0))
    # request 0 runs, 1 waits, 2 and 3 find one waiting: 429
    assert res.clients["outcome"].tolist() == ["good", "good", "shed", "shed"]


def test_instance_scope_caps_the_routed_instance() -> None:
    eng = one_slot().engines[0]
    cfg = ClusterConfig((Pool("unified", 2, eng),), load_report_interval_s=0)
    tr = Trace.from_arrays(np.array([0.0, 0.1, 0.2]), np.full(3, 16), np.full(3, 100),
                           name="three")
    adm = AdmissionConfig(max_in_flight=1, scope="instance")
    res = serve(tr, cfg, "round-robin", admission=adm, client=ClientModel(max_retries=0))
    # round-robin: 0 -> instance 0, 1 -> instance 1, 2 -> instance 0 (busy): 429
    assert res.clients["outcome"].tolist() == ["good", "good", "shed"]
    cluster_wide = serve(tr, cfg, "round-robin", admission=AdmissionConfig(max_in_flight=2),
                         client=ClientModel(max_retries=0))
    assert cluster_wide.clients["outcome"].tolist() == ["good", "good", "shed"]


def random_trace(seed: int, n: int, span: float) -> Trace:
    rng = np.random.default_rng(seed)
    return Trace.from_arrays(np.sort(rng.uniform(0, span, n)), rng.integers(1, 1500, n),
                             rng.integers(1, 200, n), name=f"random-{seed}")


COLS = ["first_scheduled_s", "first_token_s", "finish_s", "preemptions", "status", "reason"]


def test_an_edge_that_does_nothing_changes_nothing() -> None:
    tr = random_trace(3, 300, 5.0)
    for spec in ("2x:llama-2-7b/a100-80gb", "1p1d:llama-2-7b/a100-80gb"):
        cfg = ClusterConfig.preset(spec)
        plain = serve(tr, cfg, "round-robin" if "x" in spec else "always-disaggregate")
        edged = serve(tr, cfg, "round-robin" if "x" in spec else "always-disaggregate",
                      admission=AdmissionConfig(), client=ClientModel(max_retries=2))
        assert len(edged.requests) == len(tr)
        pd.testing.assert_frame_equal(plain.requests[COLS], edged.requests[COLS],
                                      check_exact=True)


class ShedFirstTries(Router):
    """A Python router (at the door) that sheds every first attempt."""

    name = "shed-first"
    reads_loads = False

    def reset(self, ctx):  # type: ignore[no-untyped-def]
        super().reset(ctx)
        self.seen: list[int] = []

    def route(self, rp):  # type: ignore[no-untyped-def]
        self.seen.append(rp.request_id)
        return Route.shed("busy") if rp.request_id < 3 else Route.to(0)


def test_a_door_router_sees_retries_as_arrivals() -> None:
    tr = Trace.from_arrays(np.array([0.0, 1.0, 2.0]), np.full(3, 16), np.full(3, 5),
                           name="three")
    router = ShedFirstTries()
    res = serve(tr, one_slot(), router, client=backoff(max_retries=1))
    assert router.seen == [0, 3, 1, 4, 2, 5]  # each retry 0.2 s after its 429
    assert (res.clients["outcome"] == "good").all()
    assert (res.clients["attempts"] == 2).all()
    np.testing.assert_allclose(res.requests["arrival_s"].to_numpy()[3:], [0.2, 1.2, 2.2])
    assert res.requests["reason"].tolist()[:3] == ["busy"] * 3


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), disagg=st.booleans(), pipelined=st.booleans(),
       span=st.sampled_from([0.5, 2.0, 8.0]), cap=st.sampled_from([None, 1, 4, 16]),
       waiting=st.sampled_from([None, 0, 3]), scope=st.sampled_from(["cluster", "instance"]),
       ttl=st.sampled_from([None, 0.05, 0.5]), timeout=st.sampled_from([None, 0.02, 0.3, 2.0]),
       retries=st.integers(0, 3), leave=st.booleans(), on_finish=st.booleans(),
       blocks=st.integers(60, 400))
def test_conservation_and_invariants_over_random_edges(
        seed: int, disagg: bool, pipelined: bool, span: float, cap: int | None,
        waiting: int | None, scope: str, ttl: float | None, timeout: float | None,
        retries: int, leave: bool, on_finish: bool, blocks: int) -> None:
    """offered = good + late + shed + expired + abandoned; every attempt sent ends once on
    the server; KV all back on every instance; retries after their failure; same seed,
    same result."""
    eng = EngineConfig(preset=None, cost_model=LinearCostModel(0.01, 1e-4, 2e-4),
                       num_kv_blocks=blocks, block_size=16, kv_bytes_per_token=1000,
                       max_num_batched_tokens=2048)
    pools = ((Pool("prefill", 1, eng), Pool("decode", 2, eng)) if disagg
             else (Pool("unified", 2, eng),))
    cfg = ClusterConfig(pools, LinkConfig(nic_gbps=1.0, mode="pipelined" if pipelined
                                          else "bulk"), load_report_interval_s=0)
    router = "always-disaggregate" if disagg else "least-outstanding"
    adm = AdmissionConfig(max_in_flight=cap, max_waiting=waiting, scope=scope,  # type: ignore[arg-type]
                          queue_ttl_s=ttl)
    client = ClientModel(timeout_s=timeout, max_retries=retries, backoff_base_s=0.05,
                         on_abandon="leave" if leave else "abort",
                         timeout_on="completion" if on_finish else "first_token")
    tr = random_trace(seed, 60, span)
    from cbgym.agents.routing import make_router

    c = Cluster(tr, cfg, make_router(router), local_policies("fcfs", cfg.num_instances),
                seed=seed, admission=adm, client=client)
    c.run()
    for e in c.engines:
        assert e.state.si[L.FREE] == e.kv.num_blocks and (e.state.req[L.HELD] == 0).all()
    res = cluster_result(c, {})
    req, cl = res.requests, res.clients
    assert res.clients is not None and len(cl) == len(tr)
    assert req["status"].isin(["finished", "shed", "abandoned"]).all()
    assert (req["outcome"].isin(OUTCOMES)).all()
    t = edge_totals(res)
    assert t["offered"] == sum(t[k] for k in OUTCOMES)
    assert t["attempts"] == len(tr) + t["retried"] and (cl["attempts"] <= 1 + retries).all()
    # attempt k + 1 is sent after attempt k's client had its answer
    nxt = req[req["attempt"] > 0]
    prev = req.loc[nxt.index - len(tr)]
    assert (nxt["arrival_s"].to_numpy() > prev["client_end_s"].to_numpy()).all()
    assert (prev["outcome"].isin(["shed", "expired", "abandoned"])).all()
    fin = req[req["status"] == "finished"]
    assert (fin["first_token_s"] >= fin["arrival_s"]).all()
    again = serve(tr, cfg, router, seed=seed, admission=adm, client=client)
    pd.testing.assert_frame_equal(again.requests, req, check_exact=True)


def test_jitter_spreads_retries_within_its_band() -> None:
    tr = Trace.from_arrays(np.concatenate([[0.0], np.full(200, 0.1)]),
                           np.full(201, 16), np.concatenate([[200], np.full(200, 5)]),
                           name="herd")
    res = serve(tr, one_slot(), "round-robin", admission=AdmissionConfig(max_in_flight=1),
                client=ClientModel(max_retries=1, backoff_base_s=0.2, jitter=0.25))
    waits = res.requests[res.requests["attempt"] == 1]["arrival_s"].to_numpy() - 0.1
    assert waits.min() >= 0.2 * 0.75 and waits.max() < 0.2 * 1.25
    assert waits.std() > 0.02  # spread, not a thundering herd


def test_bad_edge_settings_are_rejected() -> None:
    with pytest.raises(ValueError, match="max_waiting"):
        AdmissionConfig(max_waiting=-1)
    with pytest.raises(ValueError, match="max_in_flight"):
        AdmissionConfig(max_in_flight=0)
    with pytest.raises(ValueError, match="queue_ttl_s"):
        AdmissionConfig(queue_ttl_s=0)
    with pytest.raises(ValueError, match="scope"):
        AdmissionConfig(scope="pool")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout_s"):
        ClientModel(timeout_s=-1.0)
    with pytest.raises(ValueError, match="max_retries"):
        ClientModel(max_retries=-1)
    with pytest.raises(ValueError, match="jitter"):
        ClientModel(jitter=1.0)
    with pytest.raises(ValueError, match="backoff_multiplier"):
        ClientModel(backoff_multiplier=0.5)
    with pytest.raises(ValueError, match="retry_on"):
        ClientModel(retry_on=("429",))
    with pytest.raises(ValueError, match="on_abandon"):
        ClientModel(on_abandon="drop")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rate_rps"):
        AdmissionConfig.littles_law(0.0, 2.0)
    with pytest.raises(TypeError, match="admission"):
        serve(two(), one_slot(), "round-robin", admission={"max_waiting": 3})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cluster="):
        simulate(two(), admission=AdmissionConfig(max_waiting=3))


def test_littles_law_cap() -> None:
    assert AdmissionConfig.littles_law(7.5, 2.0).max_in_flight == 15
    assert AdmissionConfig.littles_law(0.1, 0.5).max_in_flight == 1
    assert ClientModel(jitter=0.0).backoff_s(3) == pytest.approx(1.6)
    assert ClientModel().backoff_s(20) == pytest.approx(30.0)  # capped


# ------------------------------------------------------------------ disaggregated aborts
class Fixed(Router):
    """Request i takes routes[i % len(routes)] (at the door)."""

    name, reads_loads = "fixed", False

    def __init__(self, routes: list[Route]) -> None:
        self.routes = routes

    def route(self, rp):  # type: ignore[no-untyped-def]
        return self.routes[rp.request_id % len(self.routes)]


def tick_engine(tick: float, budget: int = 4096) -> EngineConfig:
    return EngineConfig(preset=None, cost_model=LinearCostModel(tick, 0.0, 0.0),
                        num_kv_blocks=1000, block_size=16, kv_bytes_per_token=1000,
                        max_num_batched_tokens=budget, max_num_seqs=8)


def drained_clean(c: Cluster) -> None:
    for e in c.engines:
        assert e.state.si[L.FREE] == e.kv.num_blocks and (e.state.req[L.HELD] == 0).all()
    assert (c.kv_out == 0).all() and (c.incoming == 0).all()


def test_an_abort_after_p_finished_frees_p_s_copy_once() -> None:
    """Pipelined: A's client leaves while P's iteration finishing A's prefill runs; then B,
    deflected on D, times out before D steps: P's copy of A is freed exactly once."""
    cfg = ClusterConfig((Pool("prefill", 1, tick_engine(0.05)), Pool("decode", 1,
                                                                      tick_engine(0.1))),
                        LinkConfig(nic_gbps=10.0, mode="pipelined"), load_report_interval_s=0)
    tr = Trace.from_arrays(np.array([0.0, 0.001]), np.array([160, 16]), np.array([50, 1000]),
                           name="df")
    c = Cluster(tr, cfg, Fixed([Route.disaggregate(0, 1), Route.deflect(1)]),
                local_policies("fcfs", 2), audit=True,
                client=ClientModel(timeout_s=0.04, timeout_on="completion", max_retries=0))
    c.run()
    drained_clean(c)


@pytest.mark.parametrize("mode", ["pipelined", "bulk"])
def test_an_aborted_request_moves_no_kv(mode: str) -> None:
    """Killed on P mid-prefill (pipelined: the chunk of that iteration sends nothing), or on
    D with its transfer in flight (bulk: the landing frees P's copy, D keeps nothing)."""
    if mode == "pipelined":
        cfg = ClusterConfig((Pool("prefill", 1, tick_engine(0.05, 1024)),
                             Pool("decode", 1, tick_engine(0.1))),
                            LinkConfig(nic_gbps=1.0, mode="pipelined"), load_report_interval_s=0)
        tr = Trace.from_arrays(np.array([0.0]), np.array([3000]), np.array([50]), name="ph")
        routes, timeout = [Route.disaggregate(0, 1)], 0.04
    else:
        cfg = ClusterConfig((Pool("prefill", 1, tick_engine(0.01)),
                             Pool("decode", 1, tick_engine(0.1))),
                            LinkConfig(nic_gbps=1.0, setup_s=0.0), load_report_interval_s=0)
        tr = Trace.from_arrays(np.array([0.0, 0.0]), np.array([16, 160]), np.array([1000, 50]),
                               name="d")
        routes, timeout = [Route.deflect(1), Route.disaggregate(0, 1)], 0.1005
    c = Cluster(tr, cfg, Fixed(routes), local_policies("fcfs", 2), audit=True,
                client=ClientModel(timeout_s=timeout, max_retries=0))
    c.run()
    drained_clean(c)
    if mode == "pipelined":
        assert c.transfer_bytes[0] == 0


def test_a_queue_ttl_still_expires_a_request_its_client_left_running() -> None:
    adm = AdmissionConfig(queue_ttl_s=0.5)
    client = backoff(timeout_s=0.1, max_retries=0, on_abandon="leave")
    req = serve(two(), one_slot(), "round-robin", admission=adm, client=client).requests
    late = req.loc[1]
    assert late["outcome"] == "abandoned" and late["reason"] == "expired_queue_ttl"
    assert 0.6 <= late["finish_s"] < 0.6 + TICK + 1e-9 and np.isnan(late["first_scheduled_s"])


@pytest.mark.parametrize("policy", ["least-slack", "sjf-ctx-aging:1", "oracle-sjf-aging:1"])
def test_static_keys_rank_a_retry_by_its_request_s_first_send(policy: str) -> None:
    res = serve(two(), one_slot(), "round-robin", policy=policy,
                admission=AdmissionConfig(max_in_flight=1), client=backoff(max_retries=4))
    assert res.clients["outcome"].tolist() == ["good", "late"]
