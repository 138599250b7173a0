"""Prefix caching: the CB-SJF-Work study's open problem measured, and the cache's cost.

1. Speed: all of the Mooncake conversation trace (12,031 requests, 12k-token prompts) under
   FCFS on one engine, prefix caching off and on (the reference is the same run with it off):
   wall seconds, iterations per second, the token hit rate.
2. The open problem, on traces with block ids: for each trace, windows of its requests at
   the given loads (relative to the capacity measured with caching on), the policies'
   goodput, mean normalised latency (E2E / output tokens) and the share of the oracle's gain
   over FCFS they recover, ``100 x (FCFS - P) / (FCFS - Oracle)`` on mean normalised latency
   (the study's metric), with the cache-aware oracle (``oracle-work-uncached``: true output,
   prefill priced on uncached tokens) as the oracle; the token hit rate of each run.

    python benchmarks/bench_prefix.py [--traces mooncake-conversation,...] [--preset P]
        [--loads 0.8,0.9] [--windows 3] [--window-requests 2000] [--workers 2]
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pandas as pd

import cbgym
from cbgym.capacity import measure_capacity, scale_to_load
from cbgym.workload import load_trace

POLICIES = ("fcfs", "sjf-ctx", "cb-sjf-work", "shortest-uncached-first", "hrrn-uncached",
            "cb-sjf-work-uncached", "k-lpm:4", "oracle-work", "oracle-work-uncached")
ORACLE = "oracle-work-uncached"


def speed(preset: str) -> None:
    trace = load_trace("mooncake-conversation")
    rows = []
    for caching in (False, True):
        eng = cbgym.EngineConfig(preset=preset, enable_prefix_caching=caching)
        mu = measure_capacity(trace, eng)
        tr = scale_to_load(trace, 0.9, eng, capacity_rps=mu)
        best, res = np.inf, None
        for _ in range(2):
            t = time.perf_counter()
            res = cbgym.simulate(tr, engine=eng, policy="fcfs")
            best = min(best, time.perf_counter() - t)
        s = res.summary()
        rate = s["prefix_cache_hits"] / s["prefix_cache_queries"] if caching else 0.0
        rows.append((caching, best, s["iterations"], rate))
    ref = rows[0][1]
    print(f"1. mooncake-conversation, {preset}, rho 0.9, fcfs (best of 2)")
    for caching, wall, iters, rate in rows:
        print(f"   caching {'on ' if caching else 'off'}  {wall:7.2f} s  {iters / wall:10,.0f} "
              f"iterations/s  hit rate {rate:6.1%}  x{wall / ref:.2f} of caching off")


def cell(args: tuple[str, str, int, int, float, str]) -> dict:
    name, preset, start, count, load, policy = args
    trace = load_trace(name).window(start, count)
    eng = cbgym.EngineConfig(preset=preset, enable_prefix_caching=True)
    mu = measure_capacity(trace, eng)
    tr = scale_to_load(trace, load, eng, capacity_rps=mu)
    s = cbgym.simulate(tr, engine=eng, policy=policy).summary(warmup=0.1)
    return {"trace": name, "window": start, "load": load, "policy": policy,
            "goodput_rps": s["goodput_rps"], "norm_latency_ms": 1e3 * s["norm_latency_mean"],
            "ttft_p99_s": s["ttft_p99"],
            "hit_rate": s["prefix_cache_hits"] / max(s["prefix_cache_queries"], 1.0)}


def study(traces: list[str], preset: str, loads: list[float], windows: int, size: int,
          workers: int) -> pd.DataFrame:
    jobs = []
    for name in traces:
        n = len(load_trace(name))
        count = min(size, n)
        starts = np.linspace(0, n - count, windows).astype(int) if windows > 1 else [0]
        jobs += [(name, preset, int(w), count, x, p) for w in starts for x in loads
                 for p in POLICIES]
    with ProcessPoolExecutor(workers) as pool:
        frame = pd.DataFrame(list(pool.map(cell, jobs)))
    mean = frame.groupby(["trace", "load", "policy"], sort=False).mean(numeric_only=True)
    mean = mean.drop(columns="window")
    fcfs = mean.xs("fcfs", level="policy")["norm_latency_ms"]
    oracle = mean.xs(ORACLE, level="policy")["norm_latency_ms"]
    key = mean.index.droplevel("policy")
    mean["gain_pct"] = (100 * (fcfs.reindex(key).to_numpy() - mean["norm_latency_ms"])
                        / (fcfs - oracle).reindex(key).to_numpy())
    return mean


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default="mooncake-conversation,mooncake-synthetic,"
                    "agent-sessions,synthetic-sessions")
    ap.add_argument("--preset", default="llama-3.1-8b/h100-80gb")
    ap.add_argument("--loads", default="0.8,0.9")
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--window-requests", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--skip-speed", action="store_true")
    args = ap.parse_args()
    try:
        loads = [float(x) for x in args.loads.split(",")]
    except ValueError:
        ap.error(f"--loads {args.loads!r}: expected comma-separated numbers")
    if not all(x > 0 for x in loads) or args.windows < 1 or args.window_requests < 2:
        ap.error("--loads > 0, --windows >= 1 and --window-requests >= 2")
    traces = args.traces.split(",")
    for name in traces:
        try:
            load_trace(name)
        except (FileNotFoundError, ValueError) as exc:
            ap.error(f"--traces: {name}: {exc}")
    if not args.skip_speed:
        speed(args.preset)
    table = study(traces, args.preset, loads, args.windows, args.window_requests, args.workers)
    print(f"2. {args.preset}, prefix caching on, {args.windows} windows of "
          f"{args.window_requests} requests; gain % of {ORACLE}'s over FCFS (mean ms/token)")
    with pd.option_context("display.width", 140, "display.max_rows", 200):
        print(table.round({"goodput_rps": 3, "norm_latency_ms": 1, "ttft_p99_s": 2,
                           "hit_rate": 3, "gain_pct": 1}).to_string())


if __name__ == "__main__":
    main()
