"""``cbgym bench --cluster PRESET --routers ...``: routers x loads x windows x seeds on a cluster.

Each trace is cut into windows as ``cbgym bench`` cuts them (:func:`cbgym.bench.window_starts`);
the cluster's capacity on a window is measured once, by saturation under the reference router
(``always-disaggregate`` on a disaggregated cluster, ``round-robin`` otherwise), so that every
router replays the same window at the same arrival times. One row per run: goodput, SLO
attainment, TTFT quantiles and parts, the worst gap between tokens, deflection and transfers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from cbgym.capacity import scale_to_load
from cbgym.cluster.config import ClusterConfig
from cbgym.cluster.run import cluster_capacity, serve
from cbgym.metrics import SLO
from cbgym.workload.trace import Trace

ID_COLUMNS = ["trace", "cluster", "router", "load", "window", "window_start", "seed"]


def reference_router(cluster: ClusterConfig) -> str:
    return "always-disaggregate" if cluster.disaggregated else "round-robin"


def run_row(window: Trace, cluster: ClusterConfig, router: str, load: float, mu: float,
            seed: int, policy: str, slo: SLO) -> dict[str, float]:
    """One run's figures."""
    tr = scale_to_load(window, load, cluster.engines[0], capacity_rps=mu)
    res = serve(tr, cluster, router, policy=policy, seed=seed, slo=slo)
    s = res.summary()
    req = res.requests
    fin = req[req["status"] == "finished"]
    row = {k: s[k] for k in ("num_requests", "num_finished", "num_shed", "goodput_rps",
                             "slo_attainment", "ttft_p50", "ttft_p99", "tpot_p50")}
    row["ttft_p95"] = float(fin["ttft_s"].quantile(0.95)) if len(fin) else np.nan
    row["itl_max_p99"] = float(fin["itl_max_s"].quantile(0.99)) if len(fin) else np.nan
    for part in ("queue", "prefill", "decode_wait", "transfer", "first_step"):
        row[f"ttft_{part}_mean_s"] = float(fin[f"ttft_{part}_s"].mean())
    row["deflected"] = float(req["deflected"].mean())
    row["transfer_gb"] = float(req["transfer_bytes"].sum() / 1e9)
    row["wall_s"] = float(res.meta["wall_seconds"])
    return row


def window_plan(traces: dict[str, Trace], windows: int, window_requests: int
                ) -> list[tuple[str, int, int, Trace]]:
    """(trace name, window index, start, window) of each trace's windows, as ``cbgym bench``
    cuts them (:func:`cbgym.bench.window_starts`)."""
    from cbgym.bench import window_starts

    plan = []
    for tname, trace in traces.items():
        count = min(window_requests, len(trace))
        for w, start in enumerate(window_starts(len(trace), windows, count)):
            plan.append((tname, w, start, trace.window(start, count)))
    return plan


def cluster_sweep(traces: dict[str, Trace], cluster: ClusterConfig, name: str,
                  routers: Sequence[str], loads: Sequence[float], windows: int,
                  window_requests: int, seeds: Sequence[int], policy: str = "fcfs",
                  slo: SLO | None = None, progress: bool = True,
                  log: Callable[[str], None] | None = None) -> pd.DataFrame:
    """Every (trace, window, router, load, seed) run, one row each (module docstring)."""
    from tqdm.auto import tqdm

    slo = slo or SLO()
    plan = window_plan(traces, windows, window_requests)
    rows = []
    total = len(plan) * len(routers) * len(loads) * len(seeds)
    bar = tqdm(total=total, disable=not progress, desc="cluster runs", unit="run")
    for tname, w, start, window in plan:
        t = time.perf_counter()
        mu = cluster_capacity(window, cluster, reference_router(cluster))
        if log:
            log(f"{tname} window {w}: capacity {mu:.2f} req/s under "
                f"{reference_router(cluster)} ({time.perf_counter() - t:.1f} s)")
        for router in routers:
            for load in loads:
                for seed in seeds:
                    row = run_row(window, cluster, router, load, mu, seed, policy, slo)
                    rows.append({"trace": tname, "cluster": name, "router": router,
                                 "load": load, "window": w, "window_start": start,
                                 "seed": seed, "capacity_rps": mu, **row})
                    bar.update()
    bar.close()
    return pd.DataFrame(rows)


def format_table(results: pd.DataFrame) -> str:
    """Means over windows and seeds, per trace, load and router, as a markdown table."""
    cols = ["goodput_rps", "slo_attainment", "ttft_p95", "ttft_p99", "itl_max_p99",
            "deflected"]
    agg = results.groupby(["trace", "load", "router"], sort=False)[cols].mean().reset_index()
    lines = ["| trace | load | router | goodput (req/s) | SLO attainment | P95 TTFT (s) | "
             "P99 TTFT (s) | P99 worst gap (s) | deflected |", "|---" * 9 + "|"]
    for r in agg.itertuples(index=False):
        lines.append(f"| {r.trace} | {r.load:g} | {r.router} | {r.goodput_rps:.2f} | "
                     f"{r.slo_attainment:.3f} | {r.ttft_p95:.3f} | {r.ttft_p99:.3f} | "
                     f"{r.itl_max_p99:.3f} | {r.deflected:.2f} |")
    return "\n".join(lines)
