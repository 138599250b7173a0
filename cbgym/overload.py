"""Goodput under overload, with and without admission control (``cbgym bench --overload``).

The second seed's curve: past capacity, a server that accepts everything lets its queues
grow; clients time out and retry, the retries add load, and goodput collapses while the
GPUs stay busy. Admission control answers the excess at once (429) and keeps goodput flat.
Each window of a trace is offered at each load (relative to the cluster's capacity ``mu``
on that window, measured by saturation) under three edges, all with the same clients
(:class:`~cbgym.cluster.edge.ClientModel`):

| mode | admission control |
|---|---|
| ``none`` | none: every request is accepted |
| ``queue-cap`` | ``ceil(mu x TTFT target)`` waiting: a queue drained at ``mu`` waits one target |
| ``in-flight-cap`` | Little's law: ``ceil(mu x W)`` in flight, W the mean latency at load 0.8 |

(W: the mean end-to-end latency of a run at load 0.8 with no edge.)

One row per run: the edge's totals (offered, attempts, good, late, shed, expired,
abandoned), goodput and SLO attainment as clients see them (TTFT from the first send), and
the tokens the instances computed per second (busy GPUs, useful or not).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from cbgym.capacity import scale_to_load
from cbgym.cluster.config import ClusterConfig
from cbgym.cluster.edge import AdmissionConfig, ClientModel
from cbgym.cluster.edge_results import edge_totals
from cbgym.cluster.run import cluster_capacity, serve
from cbgym.cluster.sweep import reference_router, window_plan
from cbgym.metrics import SLO
from cbgym.workload.trace import Trace

MODES = ("none", "queue-cap", "in-flight-cap")
LOADS = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0)
CALIBRATION_LOAD = 0.8


def edges(window: Trace, cluster: ClusterConfig, router: str, mu: float, slo: SLO,
          policy: str = "fcfs") -> dict[str, AdmissionConfig | None]:
    """The three modes' admission control on this window (module docstring)."""
    calm = serve(scale_to_load(window, CALIBRATION_LOAD, cluster.engines[0], capacity_rps=mu),
                 cluster, router, policy=policy, slo=slo).requests
    w = float(calm.loc[calm["status"] == "finished", "e2e_s"].mean())
    return {"none": None,
            "queue-cap": AdmissionConfig(max_waiting=max(1, math.ceil(mu * slo.ttft_s))),
            "in-flight-cap": AdmissionConfig.littles_law(mu, w)}


def run_row(tr: Trace, cluster: ClusterConfig, router: str, admission: AdmissionConfig | None,
            client: ClientModel, slo: SLO, seed: int, policy: str) -> dict[str, float]:
    res = serve(tr, cluster, router, policy=policy, seed=seed, slo=slo, admission=admission,
                client=client)
    s, totals = res.summary(), edge_totals(res)
    ts = res.timeseries
    span = res.sim_seconds
    computed = float((ts["num_tokens"] * ts["num_iterations"]).sum())
    return {**{k: float(v) for k, v in totals.items()},
            "goodput_rps": s["goodput_rps"], "slo_attainment": s["slo_attainment"],
            "offered_rps": len(tr) / max(tr.duration_s, 1e-9),
            "tokens_per_s": computed / span if span > 0 else 0.0,
            "max_waiting": -1 if admission is None or admission.max_waiting is None
            else admission.max_waiting,
            "max_in_flight": -1 if admission is None or admission.max_in_flight is None
            else admission.max_in_flight,
            "wall_s": float(res.meta["wall_seconds"])}


def overload_sweep(traces: dict[str, Trace], cluster: ClusterConfig, name: str,
                   loads: Sequence[float], windows: int, window_requests: int,
                   seeds: Sequence[int], client: ClientModel, modes: Sequence[str] = MODES,
                   slo: SLO | None = None, policy: str = "fcfs", progress: bool = True,
                   log: Callable[[str], None] | None = None) -> pd.DataFrame:
    """Every (trace, window, load, mode, seed) run, one row each (module docstring)."""
    from tqdm.auto import tqdm

    bad = [m for m in modes if m not in MODES]
    if bad:
        raise ValueError(f"overload_sweep modes {bad}: expected some of {MODES}")
    slo = slo or SLO()
    router = reference_router(cluster)
    plan = window_plan(traces, windows, window_requests)
    rows = []
    bar = tqdm(total=len(plan) * len(loads) * len(modes) * len(seeds), disable=not progress,
               desc="overload runs", unit="run")
    for tname, w, start, window in plan:
        t = time.perf_counter()
        mu = cluster_capacity(window, cluster, router)
        edge = edges(window, cluster, router, mu, slo, policy)
        if log:
            caps = ", ".join(f"{m}: {edge[m]}" for m in modes if edge[m] is not None)
            log(f"{tname} window {w}: capacity {mu:.2f} req/s under {router}; {caps} "
                f"({time.perf_counter() - t:.1f} s)")
        for load in loads:
            tr = scale_to_load(window, load, cluster.engines[0], capacity_rps=mu)
            for mode in modes:
                for seed in seeds:
                    row = run_row(tr, cluster, router, edge[mode], client, slo, seed, policy)
                    rows.append({"trace": tname, "cluster": name, "load": load, "mode": mode,
                                 "window": w, "window_start": start, "seed": seed,
                                 "capacity_rps": mu, **row})
                    bar.update()
    bar.close()
    return pd.DataFrame(rows)


def format_table(results: pd.DataFrame) -> str:
    """Means over windows and seeds per trace, load and mode, as a markdown table."""
    df = results.assign(
        retried_per_req=results["retried"] / results["offered"],
        shed_frac=results["shed"] / results["offered"],
        abandoned_frac=results["abandoned"] / results["offered"],
        goodput_frac=results["goodput_rps"] / results["capacity_rps"])
    cols = ["goodput_rps", "goodput_frac", "slo_attainment", "retried_per_req", "shed_frac",
            "abandoned_frac", "tokens_per_s"]
    agg = df.groupby(["trace", "load", "mode"], sort=False)[cols].mean().reset_index()
    lines = ["| trace | load | mode | goodput (req/s) | goodput / capacity | SLO attainment | "
             "retries per request | shed | abandoned | tokens computed /s |",
             "|---" * 10 + "|"]
    for r in agg.itertuples(index=False):
        lines.append(f"| {r.trace} | {r.load:g} | {r.mode} | {r.goodput_rps:.2f} | "
                     f"{r.goodput_frac:.2f} | {r.slo_attainment:.3f} | "
                     f"{r.retried_per_req:.2f} | {r.shed_frac:.2f} | {r.abandoned_frac:.2f} | "
                     f"{r.tokens_per_s:,.0f} |")
    return "\n".join(lines)


def plot_collapse(results: pd.DataFrame, path: str) -> None:
    """Goodput / capacity against offered load, one line per mode (mean over windows, with
    the windows' range shaded), and the tokens computed per second beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4))
    df = results.assign(frac=results["goodput_rps"] / results["capacity_rps"])
    for mode, part in df.groupby("mode", sort=False):
        g = part.groupby("load")["frac"]
        x = np.array(sorted(part["load"].unique()))
        ax.plot(x, g.mean().loc[x], marker="o", label=str(mode))
        ax.fill_between(x, g.min().loc[x], g.max().loc[x], alpha=0.15)
        bx.plot(x, part.groupby("load")["tokens_per_s"].mean().loc[x], marker="o",
                label=str(mode))
    ax.set(xlabel="offered load (x capacity)", ylabel="goodput / capacity",
           title="goodput under overload")
    bx.set(xlabel="offered load (x capacity)", ylabel="tokens computed per second",
           title="what the GPUs did")
    ax.legend()
    ax.grid(alpha=0.3)
    bx.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def client_model(timeout_s: float, retries: int, abandon: str) -> ClientModel:
    """The bench's clients: OpenAI-SDK-like retries with the reference's backoff."""
    return ClientModel(timeout_s=timeout_s, max_retries=retries,
                       on_abandon=abandon)  # type: ignore[arg-type]


__all__ = ["LOADS", "MODES", "client_model", "edges", "format_table", "overload_sweep",
           "plot_collapse"]
