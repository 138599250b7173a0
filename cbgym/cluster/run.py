"""``cbgym.simulate(trace, cluster=..., router=...)``: a trace served by a cluster."""

from __future__ import annotations

import copy
import time
from functools import lru_cache

import numpy as np

from cbgym.cluster.cluster import Cluster
from cbgym.cluster.config import ClusterConfig
from cbgym.cluster.edge import AdmissionConfig, ClientModel
from cbgym.cluster.results import ClusterResult, cluster_result
from cbgym.cluster.routing import Router
from cbgym.engine.decision import Policy
from cbgym.engine.engine import EngineStuckError
from cbgym.metrics import SLOSpec
from cbgym.workload.trace import Trace

CAPACITY_SAMPLE = 4000  # as cbgym.capacity: requests released at t=0


def local_policies(policy: str | Policy | type[Policy], count: int) -> list[Policy]:
    """One local policy object per instance (a given object is copied: policies keep
    per-run state)."""
    from cbgym.simulate import resolve_policy

    if isinstance(policy, Policy):
        return [copy.deepcopy(policy) for _ in range(count)]
    return [resolve_policy(policy) for _ in range(count)]


def resolve_cluster(cluster: ClusterConfig | str) -> ClusterConfig:
    if isinstance(cluster, ClusterConfig):
        return cluster
    if isinstance(cluster, str):
        return ClusterConfig.preset(cluster)
    raise TypeError(f"cluster: expected a ClusterConfig or a preset name such as "
                    f"'2p2d:deepseek-v2-lite/a100-80gb', got {type(cluster).__name__}")


def serve(trace: Trace, cluster: ClusterConfig, router: str | Router,
          policy: str | Policy | type[Policy] = "fcfs", seed: int = 0,
          slo: SLOSpec | None = None, record_iterations: bool = False,
          meta: dict | None = None, admission: AdmissionConfig | None = None,
          client: ClientModel | None = None) -> ClusterResult:
    """Run ``trace`` through ``cluster`` (no load scaling): the cluster loop and its result
    (``admission`` / ``client``: the edge, :mod:`cbgym.cluster.edge`)."""
    from cbgym.agents.routing import make_router

    if record_iterations:
        raise ValueError("record_iterations=True is not supported on a cluster yet (each "
                         "instance's time series is in ClusterResult.instances)")
    rt = make_router(router)
    c = Cluster(trace, cluster, rt, local_policies(policy, cluster.num_instances), slo=slo,
                seed=seed, record_iterations=record_iterations, admission=admission,
                client=client)
    wall = time.perf_counter()
    try:
        c.run()
    except EngineStuckError as exc:
        raise EngineStuckError(f"cluster run: {exc}") from None
    info = {"router": getattr(rt, "label", rt.name), "trace": trace.name, "seed": seed,
            "wall_seconds": time.perf_counter() - wall,
            "cluster": {"roles": list(cluster.roles),
                        "engines": [e.preset for e in cluster.engines]},
            **({"admission": repr(admission)} if admission else {}),
            **({"client": repr(client)} if client else {})}
    if c.engines[0].prefix_caching:  # vLLM's counters, summed over the instances
        stats = [e.prefix_cache_stats for e in c.engines]
        info["prefix_cache"] = {k: sum(s[k] for s in stats) for k in stats[0]}
    return cluster_result(c, {**info, **(meta or {})})


def cluster_capacity(trace: Trace, cluster: ClusterConfig, router: str | Router,
                     sample: int = CAPACITY_SAMPLE) -> float:
    """Requests/s the cluster sustains on this mix under ``router`` (FCFS on every
    instance): the first ``sample`` requests released at t=0, k / makespan (as
    :func:`cbgym.measure_capacity` measures one engine)."""
    k = min(sample, len(trace))
    if k == 0:
        raise ValueError("cluster_capacity: empty trace")
    spec = router if isinstance(router, str) else None
    if spec is None:  # a router object: not cacheable
        return _measure(trace.prompt_tokens[:k], trace.output_tokens[:k], cluster, router)
    return _cached(trace.prompt_tokens[:k].tobytes(), trace.output_tokens[:k].tobytes(),
                   cluster, spec)


@lru_cache(maxsize=64)
def _cached(prompt: bytes, output: bytes, cluster: ClusterConfig, router: str) -> float:
    return _measure(np.frombuffer(prompt, np.int64), np.frombuffer(output, np.int64),
                    cluster, router)


def _measure(prompt: np.ndarray, output: np.ndarray, cluster: ClusterConfig,
             router: str | Router) -> float:
    burst = Trace.from_arrays(np.zeros(len(prompt)), prompt, output, name="capacity-burst")
    span = serve(burst, cluster, router).sim_seconds
    if span <= 0:
        raise ValueError("cluster_capacity: zero makespan")
    return len(prompt) / span
