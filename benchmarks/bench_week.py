"""The study's scale: both 2024 weeks (44.1M requests) through the study's engine.

The study says its 44.1M-request analysis reproduces in a few minutes on CPU. This runs the
conversation week (27,303,999 requests) and the code week (16,803,695) of ``cbgym.week``
(the real ``azure-*-2024`` files when found, else the synthetic weeks at their scale) under
FCFS on the study's engine (``cbsjf-paper``) at offered load ``--load``, in bounded memory
(segments ending at idle points), and prints per week: requests, simulated days, wall
seconds, microseconds per request, peak resident memory of the process that ran it, and the
study's accountings. The reference, measured in the same run: one ``cbgym.simulate`` call on
the first ``--reference`` requests of the conversation week (one engine, no segments), in
microseconds per request.

``--backend serial`` runs the weeks one after the other in this process; ``process`` in two
worker processes; ``ray`` as two Ray tasks on a local Ray (the ``ray`` extra) or the cluster
at ``--address``. Goal: both weeks within 5 minutes on this machine.

    python benchmarks/bench_week.py [--backend serial|process|ray] [--requests N] [--load 0.9]
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import Executor, ProcessPoolExecutor
from typing import Any

import numpy as np

import cbgym
from cbgym.week import run_week, week_source


def one_week(kind: str, requests: int | None, load: float, policy: str) -> dict[str, Any]:
    """A week's run in this process (a worker's task): its summary row."""
    return run_week(week_source(kind, requests), policy=policy, load=load).summary()


def reference(requests: int, load: float) -> float:
    """Microseconds per request of one plain run on the conversation week's first requests."""
    src = week_source("conv", requests)
    arrival, prompt, output = (np.concatenate(c) for c in zip(*src.chunks(), strict=True))
    trace = cbgym.Trace.from_arrays(arrival, prompt, output, name="week-head")
    cbgym.simulate(trace.window(0, 2000), engine="cbsjf-paper", load=load)  # (compiled)
    t = time.perf_counter()
    cbgym.simulate(trace, engine="cbsjf-paper", load=load)
    return (time.perf_counter() - t) / requests * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=("serial", "process", "ray"), default="serial")
    ap.add_argument("--address", default=None, help="with --backend ray: the cluster to join")
    ap.add_argument("--requests", type=int, default=None,
                    help="only each week's first N requests (default: all)")
    ap.add_argument("--load", type=float, default=0.9)
    ap.add_argument("--policy", default="fcfs")
    ap.add_argument("--reference", type=int, default=200_000,
                    help="requests of the reference run")
    args = ap.parse_args()
    if not args.load > 0:
        ap.error("--load: expected > 0")
    if args.requests is not None and args.requests < 4000:
        ap.error("--requests: expected at least 4000 (the capacity sample)")
    if args.address is not None and args.backend != "ray":
        ap.error("--address: only with --backend ray")
    ref_us = reference(args.reference, args.load)
    print(f"reference: one run of {args.reference:,} requests, {ref_us:.2f} us/request")
    kinds = ("conv", "code")
    started = time.perf_counter()
    if args.backend == "serial":
        rows = [one_week(k, args.requests, args.load, args.policy) for k in kinds]
    else:
        pool: Executor
        if args.backend == "ray":
            from cbgym.bench_ray import RayExecutor

            pool = RayExecutor({}, {}, len(kinds), args.address)
        else:
            pool = ProcessPoolExecutor(len(kinds))
        with pool:
            futures = [pool.submit(one_week, k, args.requests, args.load, args.policy)
                       for k in kinds]
            rows = [f.result() for f in futures]
    wall = time.perf_counter() - started
    total = sum(r["num_requests"] for r in rows)
    print(f"{'week':<44} {'requests':>11} {'days':>6} {'wall s':>7} {'us/req':>7} "
          f"{'peak MiB':>8} {'norm ms':>8} {'prefill work %':>14} {'engine %':>8}")
    for r in rows:
        print(f"{r['source']:<44} {r['num_requests']:>11,} {r['sim_days']:>6.0f} "
              f"{r['wall_s']:>7.1f} {r['wall_s'] / r['num_requests'] * 1e6:>7.2f} "
              f"{r['peak_rss_mib']:>8.0f} {r['mean_norm_latency_ms']:>8.0f} "
              f"{r['marginal_work_share_pct']:>14.1f} {r['engine_time_share_pct']:>8.1f}")
    print(f"both weeks: {total:,} requests in {wall:.1f} s wall ({args.backend}; goal 300 s), "
          f"{wall / total * 1e6:.2f} us/request against the reference's {ref_us:.2f}")


if __name__ == "__main__":
    main()
