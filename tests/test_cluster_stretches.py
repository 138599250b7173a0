"""Decode stretches on a cluster's instances change nothing: every request's times and every
instance's time series are bit for bit those of iterating one decode step at a time.

A decode instance's arrivals (requests whose KV a prefill instance sends) take blocks for
their prompt when they arrive and join the batch for their 1-token step once their KV has
landed; a stretch runs that iteration as its last step (``cbgym.engine.stretch_admit``)
instead of ending before it. These tests hold it to plain iteration over random P/D
clusters, traces, routes, links, local policies and batch limits (a full batch or token
budget stops admissions part-way).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cbgym import EngineConfig, LinearCostModel, Trace
from cbgym.cluster import ClusterConfig, LinkConfig, Pool, Route
from cbgym.cluster.cluster import Cluster
from cbgym.cluster.results import cluster_result
from cbgym.cluster.run import local_policies
from cbgym.engine.engine import EngineStuckError
from tests.test_cluster_ground_truth import Fixed


def engine(blocks: int, preset: bool, seqs: int = 256, budget: int = 4096) -> EngineConfig:
    if preset:  # a realistic cost model (the roofline's), its own KV size
        return EngineConfig(preset="llama-2-7b/a100-80gb", num_kv_blocks=blocks,
                            max_num_seqs=seqs, max_num_batched_tokens=budget)
    return EngineConfig(preset=None, cost_model=LinearCostModel(0.01, 1e-4, 2e-4),
                        num_kv_blocks=blocks, block_size=16, kv_bytes_per_token=1000,
                        max_num_batched_tokens=budget, max_num_seqs=seqs)


def both(tr: Trace, cfg: ClusterConfig, routes: list[Route],
         policy: str) -> list[tuple[pd.DataFrame, pd.DataFrame] | None]:
    """(requests, time series) with stretches and without; None for a run that stuck (a
    cluster whose instances all wait on each other's blocks: both must)."""
    out: list[tuple[pd.DataFrame, pd.DataFrame] | None] = []
    for stretches in (True, False):
        c = Cluster(tr, cfg, Fixed(routes), local_policies(policy, cfg.num_instances),
                    decode_stretches=stretches)
        try:
            c.run()
        except EngineStuckError:
            out.append(None)
            continue
        res = cluster_result(c, {})
        out.append((res.requests, res.timeseries))
    return out


def assert_same(runs: list[tuple[pd.DataFrame, pd.DataFrame] | None]) -> None:
    a, b = runs
    assert (a is None) == (b is None)
    if a is not None and b is not None:
        pd.testing.assert_frame_equal(a[0], b[0], check_exact=True)
        pd.testing.assert_frame_equal(a[1], b[1], check_exact=True)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), n_p=st.integers(1, 2), n_d=st.integers(1, 2),
       blocks=st.integers(120, 600), share=st.sampled_from([0.5, 0.9, 1.0]),
       setup=st.sampled_from([0.0, 1e-3]), mode=st.sampled_from(["bulk", "pipelined"]),
       policy=st.sampled_from(["fcfs", "sjf-ctx", "slo-edf"]),
       burst=st.booleans(), preset=st.booleans(),
       limits=st.sampled_from([(256, 4096), (6, 4096), (256, 24)]))
def test_stretches_on_a_cluster_are_plain_iteration(seed: int, n_p: int, n_d: int,
                                                    blocks: int, share: float, setup: float,
                                                    mode: str, policy: str, burst: bool,
                                                    preset: bool,
                                                    limits: tuple[int, int]) -> None:
    rng = np.random.default_rng(seed)
    n = 60
    # bursts: many requests on one instant, so several reach a decode instance together
    arrival = np.sort(rng.choice(np.linspace(0, 1, 4), n) if burst else rng.uniform(0, 3, n))
    tr = Trace.from_arrays(arrival, rng.integers(1, 900, n), rng.integers(1, 120, n),
                           name=f"random-{seed}")
    cfg = ClusterConfig((Pool("prefill", n_p, engine(blocks, preset)),
                         Pool("decode", n_d, engine(blocks, preset, *limits))),
                        LinkConfig(nic_gbps=2.0, setup_s=setup, mode=mode),
                        load_report_interval_s=0)
    routes = [Route.disaggregate(int(rng.integers(n_p)), n_p + int(rng.integers(n_d)))
              if rng.random() < share else Route.deflect(n_p + int(rng.integers(n_d)))
              for _ in range(n)]
    assert_same(both(tr, cfg, routes, policy))


def test_arrivals_on_a_decode_instance_join_a_stretch() -> None:
    """Two requests decode on D while others' KV arrives one by one, each in a stretch:
    the same results as plain iteration."""
    cfg = ClusterConfig((Pool("prefill", 1, engine(2000, False)),
                         Pool("decode", 1, engine(2000, False))),
                        LinkConfig(setup_s=1e-4), load_report_interval_s=0)
    n = 12
    arrival = np.concatenate([[0.0, 0.0], 0.5 + 0.2 * np.arange(n - 2)])
    tr = Trace.from_arrays(arrival, np.full(n, 64), np.concatenate([[400, 400],
                                                                   np.full(n - 2, 3)]),
                           name="joins")
    routes = [Route.deflect(1)] * 2 + [Route.disaggregate(0, 1)] * (n - 2)
    runs = both(tr, cfg, routes, "fcfs")
    assert_same(runs)
    assert runs[0] is not None
    assert (runs[0][0]["transfer_bytes"].iloc[2:] == 64 * 1000).all()


def test_a_remote_request_shed_on_arrival_ends_the_stretch() -> None:
    """D sheds an arriving remote request (its prompt reaches D's max_model_len) while its
    batch decodes: the cluster must hear of it after that iteration, as with plain
    iteration (found in review: the stretch ran on, and P, asleep waiting for the blocks
    the shed frees, heard of it 4.8 s late)."""

    def linear(blocks: int, mml: int | None = None) -> EngineConfig:
        return EngineConfig(preset=None, cost_model=LinearCostModel(0.01, 1e-4, 2e-4),
                            num_kv_blocks=blocks, block_size=16, kv_bytes_per_token=1000,
                            max_model_len=mml)

    cfg = ClusterConfig((Pool("prefill", 1, linear(50)), Pool("decode", 1, linear(2000, 500))),
                        LinkConfig(setup_s=0.0), load_report_interval_s=0)
    tr = Trace.from_arrays(np.array([0.0, 0.1, 0.11]), np.array([10, 600, 300]),
                           np.array([1000, 5, 5]), name="shed-in-stretch")
    routes = [Route.deflect(1), Route.disaggregate(0, 1), Route.disaggregate(0, 1)]
    runs = both(tr, cfg, routes, "fcfs")
    assert_same(runs)
    assert runs[0] is not None
    assert runs[0][0]["first_token_s"].iloc[2] < 0.5
