"""Offered load as in the CB-SJF-Work study: measure capacity, rescale arrivals.

This runs the engine (capacity is a makespan under FCFS), so it lives above both
:mod:`cbgym.workload` and :mod:`cbgym.engine`, next to :mod:`cbgym.simulate`.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from cbgym.engine.config import EngineConfig
from cbgym.simulate import simulate
from cbgym.workload.trace import Trace

# The study measures capacity on 4,000 requests released at t=0.
CAPACITY_SAMPLE = 4000


def measure_capacity(trace: Trace, engine: EngineConfig, sample: int = CAPACITY_SAMPLE) -> float:
    """Requests/s the engine sustains on this request mix: mu = k / makespan.

    The first ``sample`` requests are all released at t=0 and served FCFS: the batch saturates,
    so the makespan exposes the service rate including per-iteration overheads.
    """
    k = min(sample, len(trace))
    if k == 0:
        raise ValueError("measure_capacity: empty trace")
    return _capacity(trace.prompt_tokens[:k].tobytes(), trace.output_tokens[:k].tobytes(), engine)


@lru_cache(maxsize=256)
def _capacity(prompt: bytes, output: bytes, engine: EngineConfig) -> float:
    p = np.frombuffer(prompt, dtype=np.int64)
    o = np.frombuffer(output, dtype=np.int64)
    burst = Trace.from_arrays(np.zeros(len(p)), p, o, name="capacity-burst")
    res = simulate(burst, policy="fcfs", engine=engine)
    makespan = res.sim_seconds
    if makespan <= 0:
        raise ValueError("measure_capacity: zero makespan")
    return len(p) / makespan


def scale_to_load(
    trace: Trace, load: float, engine: EngineConfig, capacity_rps: float | None = None
) -> Trace:
    """Rescale arrival times affinely so the offered load is rho = lambda / mu = ``load``.

    The arrival pattern (burstiness, gaps) and the request mix are kept exactly; only the
    clock is stretched: the n requests span n / (rho * mu) seconds.
    """
    if not load > 0:
        raise ValueError(f"load must be > 0, got {load}")
    if len(trace) < 2 or trace.duration_s <= 0:
        raise ValueError("scale_to_load needs at least two requests with distinct arrival times")
    mu = capacity_rps if capacity_rps is not None else measure_capacity(trace, engine)
    span = len(trace) / (load * mu)
    arrival = (trace.arrival_s - trace.arrival_s[0]) * (span / trace.duration_s)
    return trace.with_arrivals(arrival, name=f"{trace.name}@rho={load:g}")
