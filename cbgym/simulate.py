"""``cbgym.simulate``: replay a trace through one engine under one policy."""

from __future__ import annotations

import inspect
import math
import os
import time
from numbers import Integral, Real
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from cbgym.engine import layout as L
from cbgym.engine.config import EngineConfig
from cbgym.engine.decision import Policy, PolicyContext
from cbgym.engine.engine import Engine, EngineStuckError
from cbgym.metrics import (
    SLO,
    SimulationResult,
    SLOSpec,
    config_dict,
    requests_frame,
    slo_arrays,
    timeseries_frame,
)
from cbgym.workload import load_trace
from cbgym.workload.trace import Trace

if TYPE_CHECKING:
    from cbgym.cluster.config import ClusterConfig
    from cbgym.cluster.edge import AdmissionConfig, ClientModel
    from cbgym.cluster.routing import Router


def _given(value: object) -> str:
    """``value`` for an error message: its type and (shortened) repr."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 80 else text[:77] + '...'}"


def resolve_trace(trace: Trace | str | os.PathLike[str]) -> Trace:
    """A trace from a :class:`Trace`, or a trace name or path (see :func:`cbgym.load_trace`)."""
    if isinstance(trace, Trace):
        return trace
    if isinstance(trace, str | os.PathLike):
        return load_trace(trace)
    raise TypeError(f"trace: expected a Trace, a trace name or a path "
                    f"(str or os.PathLike), got {_given(trace)}")


def resolve_engine(engine: EngineConfig | str | None) -> EngineConfig:
    """An engine config from a config, None (``EngineConfig()``) or a preset name.

    Preset names are those of ``EngineConfig(preset=...)``: ``"cbsjf-paper"``,
    ``"llama-2-7b/a100-80gb"``, ``"llama-2-70b/a100-80gb/tp4"``, ...
    """
    if isinstance(engine, EngineConfig):
        return engine
    if engine is None:
        return EngineConfig()
    if isinstance(engine, str):
        try:
            return EngineConfig(preset=engine)
        except ValueError as exc:
            raise ValueError(f"engine={engine!r}: not a usable preset: {exc}") from exc
    raise TypeError(f"engine: expected an EngineConfig, None or a preset name "
                    f"such as 'llama-2-7b/a100-80gb' or 'cbsjf-paper', got {_given(engine)}")


def resolve_policy(policy: str | Policy | type[Policy]) -> Policy:
    """A policy object from a policy, a policy class (built with no arguments) or a spec.

    A spec is a registered name, optionally with an argument: ``"fcfs"``,
    ``"noisy-oracle:0.8"`` (see :func:`cbgym.agents.make_policy`).
    """
    if isinstance(policy, Policy):
        return policy
    if isinstance(policy, type) and issubclass(policy, Policy):
        try:
            inspect.signature(policy).bind()
        except TypeError as exc:
            raise TypeError(f"policy={policy.__name__}: a policy class must be "
                            f"buildable without arguments ({exc}); pass an instance or a spec "
                            "string such as 'noisy-oracle:0.8'") from None
        return policy()
    if isinstance(policy, str):
        from cbgym.agents import make_policy

        try:
            return make_policy(policy)
        except ValueError as exc:
            raise ValueError(f"policy={policy!r}: {exc}") from exc
    raise TypeError(f"policy: expected a Policy, a Policy subclass or a spec "
                    f"string such as 'fcfs' or 'noisy-oracle:0.8', got {_given(policy)}")


def _positive(name: str, value: float | None) -> float | None:
    """``value`` as a float, checked to be None or a finite number > 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name}: expected None or a number > 0, "
                        f"got {_given(value)}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name}={value!r}: expected None or a finite number > 0")
    return float(value)


def _seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, Integral):
        raise TypeError(f"seed: expected an int, got {_given(seed)}")
    return int(seed)


def run_engine(engine: Engine, policy: Policy) -> None:
    """The one loop: ask the engine what to decide, let the policy decide, repeat."""
    while (dp := engine.next_decision()) is not None:
        engine.decide(policy.decide(dp))



def start_engine(trace: Trace, cfg: EngineConfig, pol: Policy, seed: int,
                 ttft_target_s: np.ndarray, **engine_kw: Any) -> Engine:
    """``pol`` reset for ``trace`` and the engine that serves it under ``pol``, ready to
    run (``engine_kw``: the rest of :class:`Engine`'s arguments)."""
    pol.reset(PolicyContext(
        config=cfg, num_requests=len(trace), seed=seed,
        true_output_tokens=trace.output_tokens if pol.privileged else None,
        prompt_tokens=trace.prompt_tokens, arrival_s=trace.arrival_s,
        ttft_target_s=ttft_target_s, priority=trace.priority, slo_class=trace.slo_class,
        trace_name=trace.name, clock_s=trace.extra.get("epoch_s")))
    # a static key runs inside the compiled loop: no Python call per decision
    keys = pol.static_keys()
    return Engine(trace, cfg, consult=pol.consult, keys=keys,
                  victim_by_key=pol.victim_by_key and keys is not None, **engine_kw)

def simulate(
    trace: Trace | str | os.PathLike[str],
    policy: str | Policy | type[Policy] = "fcfs",
    engine: EngineConfig | str | None = None,
    load: float | None = None,
    seed: int = 0,
    slo: SLOSpec | None = None,
    record_iterations: bool = False,
    capacity_rps: float | None = None,
    cluster: ClusterConfig | str | None = None,
    router: str | Router = "round-robin",
    admission: AdmissionConfig | None = None,
    client: ClientModel | None = None,
    closed_loop: bool | None = None,
    request_rate: float | None = None,
    burstiness: float = 1.0,
) -> SimulationResult:
    """Simulate ``trace`` on one serving instance under ``policy``, or on a ``cluster``.

    Args:
        trace: the requests: a :class:`cbgym.Trace`, or a trace name or path (str or
            ``os.PathLike``) loaded with :func:`cbgym.load_trace`.
        policy: a :class:`cbgym.engine.Policy`, a Policy subclass (built with no arguments) or
            a spec such as ``"fcfs"`` or ``"noisy-oracle:0.8"`` (``cbgym.agents.POLICIES``).
        engine: an :class:`cbgym.EngineConfig`, a preset name (``"cbsjf-paper"``,
            ``"llama-2-7b/a100-80gb"``: ``EngineConfig(preset=...)``), or None for
            ``EngineConfig()`` (llama-2-7b on an A100-80GB).
        load: if given (finite, > 0), rescale arrival times to this offered load
            rho = lambda / mu for this engine (mu measured by saturation, see
            :func:`cbgym.capacity.scale_to_load`).
        seed: int seed handed to the policy (e.g. ``random``); the engine is deterministic.
        slo: TTFT/TPOT targets for goodput (default TTFT <= 2 s, TPOT <= 0.1 s), or a mapping
            from SLO class to SLO.
        record_iterations: keep the per-iteration batch log (``.iterations``).
        capacity_rps: mu to use with ``load`` instead of measuring it (finite, > 0).
        cluster: serve on a cluster instead (a :class:`cbgym.cluster.ClusterConfig` or a
            preset such as ``"4x:llama-3-8b/h100-80gb"``, ``"2p2d:deepseek-v2-lite/a100-80gb"``);
            ``policy`` is then every instance's local policy, ``engine`` must be None, and
            ``load`` is relative to the cluster's capacity under ``router``
            (:func:`cbgym.cluster.run.cluster_capacity`).
        router: where each request runs (``cbgym.agents.routing.ROUTERS`` spec, or a
            :class:`cbgym.cluster.Router`); only with ``cluster``.
        admission: admission control (:class:`cbgym.AdmissionConfig`: queue and in-flight
            caps answered with 429, a queue TTL with 503); only with ``cluster`` (one
            instance: ``cluster="1x:MODEL/GPU"``).
        client: a client model (:class:`cbgym.ClientModel`: timeouts, retries with backoff
            and jitter, abandoned requests aborted or left running); only with ``cluster``.
            The result's ``requests`` then has a row per attempt, ``clients`` one per
            offered request.
        closed_loop: replay a session trace as closed loops (a session's next request sent
            its think time after the previous one ends); None: wherever the trace has
            sessions (:class:`cbgym.engine.Engine`). With ``load``, only first turns'
            arrivals are rescaled.
        request_rate: instead of ``load``, send the requests as vLLM's benchmark does at
            this rate (requests/s): Gamma inter-arrival times of shape ``burstiness`` (1:
            Poisson), drawn with ``seed`` (:func:`cbgym.workload.at_request_rate`).
        burstiness: vLLM's ``--burstiness`` (the Gamma shape; only with ``request_rate``).

    Returns:
        A :class:`cbgym.metrics.SimulationResult` (a :class:`cbgym.cluster.ClusterResult`
        with ``cluster``: per-request placement, transfers and TTFT parts; per-instance
        time series).

    Raises:
        TypeError: an argument of the wrong type (the message names it).
        ValueError: an unknown preset or policy, or a ``load``/``capacity_rps`` that is not a
            finite number > 0.
    """
    load, capacity_rps = _positive("load", load), _positive("capacity_rps", capacity_rps)
    seed = _seed(seed)
    if request_rate is not None:
        from cbgym.workload import at_request_rate

        if load is not None:
            raise ValueError("simulate: give load= or request_rate=, not both")
        trace = at_request_rate(resolve_trace(trace), request_rate, burstiness, seed)
    elif burstiness != 1.0:
        raise ValueError("simulate: burstiness= shapes request_rate= arrivals; give "
                         "request_rate= too")
    if cluster is not None:
        if engine is not None:
            raise ValueError("simulate: give engine= or cluster=, not both (a cluster's "
                             "pools name their engines)")
        if closed_loop:
            raise ValueError("simulate: closed_loop=True is not supported on a cluster yet")
        return _simulate_cluster(trace, policy, cluster, router, load, seed, slo,
                                 record_iterations, capacity_rps, admission, client)
    if admission is not None or client is not None:
        raise ValueError("simulate: admission= and client= act at a cluster's edge; give "
                         "cluster= too (one instance: cluster='1x:MODEL/GPU')")
    cfg = resolve_engine(engine)
    pol = resolve_policy(policy)
    trace = resolve_trace(trace)
    slo = slo or SLO()
    if load is not None:
        from cbgym.capacity import scale_to_load

        trace = scale_to_load(trace, load, cfg, capacity_rps=capacity_rps)
    wall = time.perf_counter()
    eng = start_engine(trace, cfg, pol, seed, slo_arrays(slo, trace.slo_class)[0],
                       record_iterations=record_iterations, closed_loop=closed_loop)
    try:
        run_engine(eng, pol)
    except EngineStuckError as exc:
        raise EngineStuckError(f"policy {getattr(pol, 'label', pol.name)!r}: {exc}") from None
    wall = time.perf_counter() - wall
    return collect(eng, slo, meta={
        "policy": getattr(pol, "label", pol.name), "trace": trace.name, "load": load,
        "seed": seed, "wall_seconds": wall, "engine": config_dict(cfg),
    })


def _simulate_cluster(trace: Trace | str | os.PathLike[str], policy: str | Policy | type[Policy],
                      cluster: ClusterConfig | str, router: str | Router, load: float | None,
                      seed: int, slo: SLOSpec | None, record_iterations: bool,
                      capacity_rps: float | None, admission: AdmissionConfig | None = None,
                      client: ClientModel | None = None) -> SimulationResult:
    from cbgym.agents.routing import make_router
    from cbgym.cluster.run import cluster_capacity, resolve_cluster, serve

    cfg = resolve_cluster(cluster)
    make_router(router)  # a bad spec fails before any work
    resolve_policy(policy)
    trace = resolve_trace(trace)
    if load is not None:
        from cbgym.capacity import scale_to_load

        mu = capacity_rps or cluster_capacity(trace, cfg, router)
        trace = scale_to_load(trace, load, cfg.engines[0], capacity_rps=mu)
    return serve(trace, cfg, router, policy=policy, seed=seed, slo=slo or SLO(),
                 record_iterations=record_iterations, admission=admission, client=client,
                 meta={"policy": policy if isinstance(policy, str) else
                       getattr(policy, "name", str(policy)), "load": load})


def collect(eng: Engine, slo: SLOSpec, meta: dict) -> SimulationResult:
    """Turn a drained engine into a SimulationResult."""
    assert eng.done, "collect() needs a drained engine"
    iterations = preemptions = None
    if eng.recorder.record_batches:
        log, pre = eng.recorder.batch_log()
        iterations = pd.DataFrame(log, columns=["iteration", "request_id", "num_tokens"])
        preemptions = pd.DataFrame(pre, columns=["iteration", "request_id"])
    return SimulationResult(
        requests=requests_frame(eng.req, slo),
        timeseries=timeseries_frame(eng.recorder.timeseries(), eng.kv.num_blocks),
        iterations=iterations,
        preemption_log=preemptions,
        slo=slo,
        meta={**meta, "prefix_cache": eng.prefix_cache_stats} if eng.prefix_caching else meta,
        itl_histogram=eng.state.sf[L.ITL:].copy() if eng.state.si[L.P99_ON] else None,
    )


__all__ = [
    "simulate", "run_engine", "resolve_trace", "resolve_engine", "resolve_policy", "collect",
]
