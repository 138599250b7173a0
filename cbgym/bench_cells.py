"""The worker side of ``cbgym bench``: one cell (a policy on one window at one load or rate,
on one engine, with one seed) simulated and reduced to its ``results.csv`` row, and the
per-process state the cells read (the windows and engines, sent once per worker)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from cbgym import study
from cbgym.capacity import measure_capacity
from cbgym.engine.config import EngineConfig
from cbgym.metrics import SLO
from cbgym.workload.trace import Trace

# Quantile levels of normalised latency kept per run at the CDF load (for the CDF plot).
CDF_LEVELS = np.round(np.concatenate([np.linspace(0, 0.99, 100), np.linspace(0.991, 1, 10)]), 4)


@dataclass(frozen=True)
class Cell:
    """One simulation: a policy on one window of one trace, at one load, on one engine."""

    trace: str
    window: int
    engine: str
    policy: str
    load: float
    seed: int
    capacity_rps: float


@dataclass(frozen=True)
class CellSettings:
    """What every cell of a sweep shares."""

    ttft_s: float
    tpot_s: float
    warmup: float
    cdf_load: float
    burstiness: float | None = None  # a request-rate sweep's (None: cells are loads)


@dataclass
class CellOutput:
    """A finished cell: its results.csv row, waiting times (for starvation), CDF quantiles."""

    row: dict[str, Any]
    waits: np.ndarray
    cdf: np.ndarray | None


# Set in each worker by _init_worker (and in the parent when workers == 1): the windows and
# engines are sent once per process rather than once per cell.
_WINDOWS: dict[tuple[str, int], Trace] = {}
_ENGINES: dict[str, EngineConfig] = {}


def _init_worker(windows: dict[tuple[str, int], Trace], engines: dict[str, EngineConfig]) -> None:
    _WINDOWS.clear()
    _WINDOWS.update(windows)
    _ENGINES.clear()
    _ENGINES.update(engines)


def capacity_task(trace: str, window: int, engine: str, sample: int) -> float:
    """Requests/s of ``engine`` on one window (saturation), in a worker."""
    return measure_capacity(_WINDOWS[(trace, window)], _ENGINES[engine], sample=sample)


def run_cell(cell: Cell, settings: CellSettings) -> CellOutput:
    """Simulate one cell and reduce it to a row, its waiting times and (maybe) CDF quantiles."""
    from cbgym.simulate import simulate

    window = _WINDOWS[(cell.trace, cell.window)]
    engine = _ENGINES[cell.engine]
    slo = SLO(ttft_s=settings.ttft_s, tpot_s=settings.tpot_s)
    row: dict[str, Any] = asdict(cell)
    if settings.burstiness is None:
        res = simulate(window, cell.policy, engine, load=cell.load, seed=cell.seed, slo=slo,
                       capacity_rps=cell.capacity_rps)
        row["offered_rps"] = cell.load * cell.capacity_rps
    else:  # the cell's load is a request rate
        res = simulate(window, cell.policy, engine, request_rate=cell.load,
                       burstiness=settings.burstiness, seed=cell.seed, slo=slo)
        row["offered_rps"] = cell.load
        row["rho"] = cell.load / cell.capacity_rps
    row.update(res.summary(warmup=settings.warmup))
    row.update(study.latency_stats(res.requests, settings.warmup))
    prefill_s, busy_s = study.prefill_engine_time(res.timeseries, engine)
    row.update(prefill_engine_s=prefill_s, busy_s=busy_s,
               prefill_time_share=prefill_s / busy_s if busy_s > 0 else float("nan"))
    cdf = None
    if np.isclose(cell.load, settings.cdf_load):
        norm = study.normalised_latency_ms(study.after_warmup(res.requests, settings.warmup))
        cdf = np.quantile(norm, CDF_LEVELS) if norm.size else None
    waits = study.waiting_times(res.requests, settings.warmup).astype(np.float32)
    return CellOutput(row=row, waits=waits, cdf=cdf)


__all__ = ["CDF_LEVELS", "Cell", "CellOutput", "CellSettings", "capacity_task", "run_cell"]
