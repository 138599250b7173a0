"""``cbgym.simulate``: replay a trace through one engine under one policy."""

from __future__ import annotations

import time

import pandas as pd

from cbgym.engine.config import EngineConfig
from cbgym.engine.decision import Policy, PolicyContext
from cbgym.engine.engine import Engine
from cbgym.metrics import (
    SLO,
    SimulationResult,
    SLOSpec,
    config_dict,
    requests_frame,
    timeseries_frame,
)
from cbgym.workload.trace import Trace


def resolve_policy(policy: str | Policy) -> Policy:
    """A policy object from a policy or a name such as ``"fcfs"`` or ``"noisy-oracle:0.8"``."""
    if isinstance(policy, Policy):
        return policy
    from cbgym.agents import make_policy

    return make_policy(policy)


def run_engine(engine: Engine, policy: Policy) -> None:
    """The one loop: ask the engine what to decide, let the policy decide, repeat."""
    while (dp := engine.next_decision()) is not None:
        engine.decide(policy.decide(dp))


def simulate(
    trace: Trace,
    policy: str | Policy = "fcfs",
    engine: EngineConfig | None = None,
    load: float | None = None,
    seed: int = 0,
    slo: SLOSpec | None = None,
    record_iterations: bool = False,
    capacity_rps: float | None = None,
) -> SimulationResult:
    """Simulate ``trace`` on one serving instance under ``policy``.

    Args:
        trace: the requests (see :func:`cbgym.load_trace`).
        policy: a :class:`cbgym.engine.Policy` or a registered name (``cbgym.agents.POLICIES``).
        engine: engine configuration; default ``EngineConfig()`` (llama-2-7b on an A100-80GB).
        load: if given, rescale arrival times to this offered load rho = lambda / mu for this
            engine (mu measured by saturation, see :func:`cbgym.workload.scaling.scale_to_load`).
        seed: seed handed to the policy (e.g. ``random``); the engine itself is deterministic.
        slo: TTFT/TPOT targets for goodput (default TTFT <= 2 s, TPOT <= 0.1 s), or a mapping
            from SLO class to SLO.
        record_iterations: keep the per-iteration batch log (``.iterations``).
        capacity_rps: mu to use with ``load`` instead of measuring it.

    Returns:
        A :class:`cbgym.metrics.SimulationResult`.
    """
    cfg = engine or EngineConfig()
    slo = slo or SLO()
    if load is not None:
        from cbgym.workload.scaling import scale_to_load

        trace = scale_to_load(trace, load, cfg, capacity_rps=capacity_rps)
    pol = resolve_policy(policy)
    eng = Engine(trace, cfg, consult=pol.consult, record_iterations=record_iterations)
    pol.reset(PolicyContext(
        config=cfg, num_requests=len(trace), seed=seed,
        true_output_tokens=trace.output_tokens if pol.privileged else None,
    ))
    wall = time.perf_counter()
    run_engine(eng, pol)
    wall = time.perf_counter() - wall
    return collect(eng, slo, meta={
        "policy": getattr(pol, "label", pol.name), "trace": trace.name, "load": load,
        "seed": seed, "wall_seconds": wall, "engine": config_dict(cfg),
    })


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
        meta=meta,
    )


__all__ = ["simulate", "run_engine", "resolve_policy", "collect"]
