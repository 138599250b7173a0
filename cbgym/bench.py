"""The sweep runner behind ``cbgym bench``: policies x loads x traces x engines x windows x seeds.

How a sweep runs:

1. Each trace is cut into ``windows`` windows of ``window_requests`` consecutive requests.
   Window starts are evenly spaced over the trace (``round(linspace(0, n - M, N))``), so the
   windows are disjoint whenever ``N * M <= n`` and overlap evenly otherwise; a window longer
   than the trace is the whole trace. Placement is deterministic: no seed is involved.
2. The capacity mu of every (window, engine) pair is measured once, by saturation (the
   window's first ``capacity_sample`` requests released at t=0 under FCFS), in the worker
   pool; with ``capacity="per-trace"`` once per (trace, engine), on the trace's first
   ``capacity_sample`` requests, and used for every window of the trace, as the study
   measures it once per trace.
3. Every cell (policy, load, window, engine, seed) replays the same window, rescaled to the same
   arrivals with that one mu (common random numbers: differences are the policies'), in
   parallel worker processes. The seed reaches only randomised policies (``random``,
   ``noisy-oracle``); the engine is deterministic.
4. The parent adds the study's comparisons (:mod:`cbgym.study`), aggregates over windows and
   seeds, and :func:`write_outputs` writes ``results.csv``, ``summary.csv``,
   ``accountings.csv``, ``cdf.csv``, ``config.json`` and the plots.
"""

from __future__ import annotations

import multiprocessing
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, Future, ProcessPoolExecutor, as_completed
from dataclasses import asdict
from typing import Any

import numpy as np
import pandas as pd
from tqdm import tqdm

from cbgym import study
from cbgym.bench_cells import (
    CDF_LEVELS,
    Cell,
    CellOutput,
    CellSettings,
    _init_worker,
    capacity_task,
    run_cell,
)
from cbgym.bench_config import BenchConfig  # (re-exported: callers import it from here)
from cbgym.bench_inputs import (
    CAPACITY_MODES,
    check_policy,
    check_policy_windows,
    engine_overrides,
    resolve_engine,
    resolve_trace,
    scalable,
    window_span,
    window_starts,
)
from cbgym.bench_output import (
    TABLE_COLUMNS,
    BenchResult,
    format_table,
    read_outputs,
    write_outputs,
)
from cbgym.engine.config import EngineConfig
from cbgym.metrics import config_dict
from cbgym.workload.trace import Trace

# Columns that identify a row of results.csv; the rest are measurements.
ID_COLUMNS = ["trace", "engine", "policy", "load", "window", "window_start", "window_requests",
              "seed", "capacity_rps", "offered_rps"]


# ---------------------------------------------------------------- the parent side


def run_bench(cfg: BenchConfig, progress: bool = True,
              log: Callable[[str], None] | None = None, backend: str = "process",
              address: str | None = None) -> BenchResult:
    """Run a sweep and return its tables (nothing is written; see :func:`write_outputs`).

    Args:
        cfg: the sweep.
        progress: show tqdm progress bars (on stderr).
        log: where to send one-line notes (e.g. ``print``); None: nowhere.
        backend: ``"process"`` (worker processes on this machine) or ``"ray"`` (Ray tasks:
            :mod:`cbgym.bench_ray`; the same results).
        address: with ``backend="ray"``, the Ray cluster to join (None: a local one of
            ``cfg.workers`` CPUs, or the one this process has already joined).

    Raises:
        ValueError: a trace, engine or policy that cannot be resolved (one-line message).
    """
    if backend not in ("process", "ray"):
        raise ValueError(f"backend={backend!r}: expected 'process' or 'ray'")
    if address is not None and backend != "ray":
        raise ValueError("address= is for backend='ray'")
    if backend == "ray":
        from cbgym.bench_ray import ray_module

        ray_module()  # (a missing extra fails before any work)
    started = time.perf_counter()
    say = log or (lambda _msg: None)
    for spec in cfg.policies:
        check_policy(spec)
    engines = {p: resolve_engine(p, cfg.engine_overrides()) for p in cfg.engines}
    traces = {name: resolve_trace(name, cfg.download) for name in cfg.traces}
    windows, starts, notes = _cut_windows(traces, cfg)
    check_policy_windows(cfg.policies, list(windows.values()))
    for note in notes:
        say(note)
    workers = cfg.workers if cfg.workers is not None else (os.cpu_count() or 1)
    # per trace: mu from the trace's first capacity_sample requests (a window of its own,
    # numbered -1, sent with the windows but never run)
    sample = {(name, -1): tr.window(0, min(cfg.capacity_sample, len(tr)))
              for name, tr in traces.items()} if cfg.capacity == "per-trace" else {}
    with _executor(workers, {**windows, **sample}, engines, backend, address) as pool:
        capacity = _measure_capacities(pool, windows, engines, cfg, progress)
        cells = _plan_cells(cfg, windows, engines, capacity)
        outputs = _run_cells(pool, cells, cfg, progress)
    results = study.add_relative_metrics(
        pd.DataFrame([o.row for o in outputs]), [o.waits for o in outputs],
        cfg.starvation_multiple)
    results = _order_columns(_with_window_info(results, starts, windows))
    table = _in_sweep_order(study.aggregate(results), cfg)
    elapsed = time.perf_counter() - started
    # (the study's headline averages over loads 0.85, 0.92, 0.98: no rates)
    headline = study.headline_gain(table if cfg.axis == "rho" else table.iloc[:0])
    return BenchResult(
        results=results, table=table, headline=headline,
        accountings=_accountings(results, windows, engines, cfg),
        cdf=_cdf_frame(outputs), elapsed_s=elapsed, notes=notes,
        config=_config_json(cfg, engines, traces, starts, capacity, workers, elapsed),
    )


def _cut_windows(traces: dict[str, Trace], cfg: BenchConfig
                 ) -> tuple[dict[tuple[str, int], Trace], dict[tuple[str, int], int], list[str]]:
    windows: dict[tuple[str, int], Trace] = {}
    starts: dict[tuple[str, int], int] = {}
    notes: list[str] = []
    for name, trace in traces.items():
        first = window_starts(len(trace), cfg.windows, cfg.window_requests, cfg.window_range)
        lo, hi, count = window_span(len(trace), cfg.window_requests, cfg.window_range)
        overlap = len(first) * count > hi - lo
        notes.append(
            f"{name}: {len(trace)} requests -> {len(first)} window(s) of {count} starting at "
            f"{', '.join(map(str, first))}" + (" (overlapping)" if overlap else ""))
        for w, start in enumerate(first):
            windows[(name, w)] = trace.window(start, count)
            starts[(name, w)] = start
    return windows, starts, notes


class _InlineExecutor(Executor):
    """Runs submitted calls at once in this process (workers == 1: easy to profile/debug)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        fut: Future = Future()
        try:
            fut.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # handed to the caller through the future
            fut.set_exception(exc)
        return fut


def _executor(workers: int, windows: dict[tuple[str, int], Trace],
              engines: dict[str, EngineConfig], backend: str = "process",
              address: str | None = None) -> Executor:
    if backend == "ray":
        from cbgym.bench_ray import RayExecutor

        return RayExecutor(windows, engines, workers, address)
    if workers == 1:
        _init_worker(windows, engines)
        return _InlineExecutor()
    # forkserver/spawn: no inherited state from the parent (threads, caches); every task is a
    # top-level function and the windows travel once per worker through the initializer.
    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context(method),
                               initializer=_init_worker, initargs=(windows, engines))


def _measure_capacities(pool: Executor, windows: dict[tuple[str, int], Trace],
                        engines: dict[str, EngineConfig], cfg: BenchConfig, progress: bool
                        ) -> dict[tuple[str, int, str], float]:
    per_trace = cfg.capacity == "per-trace"
    measured = sorted({(t, -1) for t, _ in windows}) if per_trace else list(windows)
    jobs = {pool.submit(capacity_task, t, w, e, cfg.capacity_sample): (t, w, e)
            for (t, w) in measured for e in engines}
    capacity: dict[tuple[str, int, str], float] = {}
    bar = tqdm(total=len(jobs), desc="capacity", unit="window", disable=not progress,
               leave=False)
    for fut in as_completed(jobs):
        capacity[jobs[fut]] = fut.result()
        bar.update()
    bar.close()
    if per_trace:
        capacity = {(t, w, e): capacity[(t, -1, e)] for t, w in windows for e in engines}
    return capacity


def _plan_cells(cfg: BenchConfig, windows: dict[tuple[str, int], Trace],
                engines: dict[str, EngineConfig], capacity: dict[tuple[str, int, str], float]
                ) -> list[Cell]:
    cells = [
        Cell(t, w, e, p, load, seed, capacity[(t, w, e)])
        for (t, w) in windows for e in engines for load in cfg.points
        for p in cfg.policies for seed in cfg.seeds
    ]
    # Heaviest first (high load, long windows) so no worker is left with a long tail.
    return sorted(cells, key=lambda c: (-c.load, -len(windows[(c.trace, c.window)])))


def _run_cells(pool: Executor, cells: list[Cell], cfg: BenchConfig, progress: bool
               ) -> list[CellOutput]:
    settings = CellSettings(cfg.ttft_s, cfg.tpot_s, cfg.warmup, cfg.plot_load,
                            cfg.burstiness if cfg.request_rates else None)
    futures = {pool.submit(run_cell, cell, settings): i for i, cell in enumerate(cells)}
    outputs: list[CellOutput | None] = [None] * len(cells)
    with tqdm(total=len(cells), desc="bench", unit="run", disable=not progress) as bar:
        for fut in as_completed(futures):
            outputs[futures[fut]] = fut.result()
            bar.update()
    done = [o for o in outputs if o is not None]
    key = ("trace", "engine", "load", "window", "seed", "policy")
    order = {p: i for i, p in enumerate(cfg.policies)}
    return sorted(done, key=lambda o: tuple(
        order[o.row[k]] if k == "policy" else o.row[k] for k in key))


def _with_window_info(results: pd.DataFrame, starts: dict[tuple[str, int], int],
                      windows: dict[tuple[str, int], Trace]) -> pd.DataFrame:
    keys = list(zip(results["trace"], results["window"], strict=True))
    results["window_start"] = [starts[k] for k in keys]
    results["window_requests"] = [len(windows[k]) for k in keys]
    return results


def _order_columns(results: pd.DataFrame) -> pd.DataFrame:
    rest = [c for c in results.columns if c not in ID_COLUMNS]
    return results[ID_COLUMNS + rest]


def _in_sweep_order(table: pd.DataFrame, cfg: BenchConfig) -> pd.DataFrame:
    """Rows in the order the user listed traces, engines and policies (then by load)."""
    rank = {col: {v: i for i, v in enumerate(values)} for col, values in
            (("trace", cfg.traces), ("engine", cfg.engines), ("policy", cfg.policies))}
    keys = pd.DataFrame({col: table[col].map(order) for col, order in rank.items()})
    keys["load"] = table["load"]
    order = keys.sort_values(["trace", "engine", "policy", "load"], kind="stable").index
    return table.loc[order].reset_index(drop=True)


def _accountings(results: pd.DataFrame, windows: dict[tuple[str, int], Trace],
                 engines: dict[str, EngineConfig], cfg: BenchConfig) -> pd.DataFrame:
    """Marginal work share (token counts of the windows) and FCFS engine time share."""
    rows = []
    for trace in cfg.traces:
        parts = [w for (t, _), w in windows.items() if t == trace]
        prompt = np.concatenate([w.prompt_tokens for w in parts])
        output = np.concatenate([w.output_tokens for w in parts])
        for name, engine in engines.items():
            share = study.marginal_work_share(prompt, output, engine)
            for load in cfg.points:
                fcfs = results[(results["trace"] == trace) & (results["engine"] == name)
                               & (results["load"] == load) & (results["policy"] == study.FCFS)]
                busy = fcfs["busy_s"].sum()
                rows.append({
                    "trace": trace, "engine": name, "load": load,
                    "marginal_work_share_pct": 100.0 * share,
                    "engine_time_share_pct": (100.0 * fcfs["prefill_engine_s"].sum() / busy
                                              if busy > 0 else float("nan")),
                    "fcfs_runs": len(fcfs),
                })
    return pd.DataFrame(rows)


def _cdf_frame(outputs: Iterable[CellOutput]) -> pd.DataFrame:
    frames = []
    for out in outputs:
        if out.cdf is None:
            continue
        ids = {k: out.row[k] for k in ("trace", "engine", "load", "policy", "window", "seed")}
        frames.append(pd.DataFrame({**ids, "quantile": CDF_LEVELS, "norm_latency_ms": out.cdf}))
    cols = ["trace", "engine", "load", "policy", "window", "seed", "quantile", "norm_latency_ms"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)


def _config_json(cfg: BenchConfig, engines: dict[str, EngineConfig], traces: dict[str, Trace],
                 starts: dict[tuple[str, int], int], capacity: dict[tuple[str, int, str], float],
                 workers: int, elapsed: float) -> dict[str, Any]:
    import matplotlib

    import cbgym

    return {
        "cbgym_version": cbgym.__version__,
        "argv": sys.argv,
        "bench": {**asdict(cfg), "axis": cfg.axis},
        "engines": {name: config_dict(e) for name, e in engines.items()},
        "traces": {name: {"requests": len(t), "duration_s": t.duration_s, "source": t.name}
                   for name, t in traces.items()},
        "windows": [{"trace": t, "window": w, "start": s} for (t, w), s in starts.items()],
        "capacity_rps": [{"trace": t, "window": w, "engine": e, "capacity_rps": mu}
                         for (t, w, e), mu in capacity.items()],
        "trace_dir_env": os.environ.get("CBGYM_TRACE_DIR"),
        "workers": workers,
        "elapsed_s": elapsed,
        "versions": {"python": platform.python_version(), "numpy": np.__version__,
                     "pandas": pd.__version__, "matplotlib": matplotlib.__version__},
        "rerun": ("cbgym simulate --trace TRACE --start WINDOW_START --requests WINDOW_REQUESTS "
                  "--engine ENGINE --policy POLICY "
                  + ("--load LOAD --capacity-rps CAPACITY_RPS " if cfg.axis == "rho" else
                     f"--request-rate LOAD --burstiness {cfg.burstiness:g} ")
                  + "--seed SEED (values from a results.csv row, plus the engine overrides "
                  "above)"),
    }


__all__ = [
    "CAPACITY_MODES", "TABLE_COLUMNS", "BenchConfig", "BenchResult", "Cell", "CellOutput",
    "CellSettings", "check_policy", "engine_overrides", "format_table", "read_outputs",
    "resolve_engine", "resolve_trace", "run_bench", "run_cell", "scalable", "window_starts",
    "write_outputs",
]
