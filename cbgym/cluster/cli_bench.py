"""The ``cbgym bench --cluster`` command: arguments checked first, then the sweep."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

UNIFIED_ROUTERS = ("round-robin", "least-outstanding", "jsq-tokens", "jsq-time")
DISAGG_ROUTERS = ("always-disaggregate", "dynamo", "kairos")


def fail_on(parser: argparse.ArgumentParser, option: str, call: Any) -> Any:
    """``call()``, a ValueError or TypeError turned into the parser's one-line error."""
    try:
        return call()
    except (ValueError, TypeError) as exc:
        parser.error(f"{option}: {exc}")


def out_dir(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Path | None:
    """``--out`` made (a directory) before any work, or None without it."""
    if not args.out:
        return None
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        parser.error(f"--out: {out} exists and is not a directory")
    fail_on(parser, "--out", lambda: out.mkdir(parents=True, exist_ok=True))
    return out


def cmd_cluster_bench(args: argparse.Namespace, parser: argparse.ArgumentParser,
                      chosen: str | None) -> int:
    from cbgym.agents.routing import make_router
    from cbgym.bench import check_policy, resolve_trace
    from cbgym.cluster.config import ClusterConfig
    from cbgym.cluster.sweep import cluster_sweep, format_table
    from cbgym.metrics import SLO

    if args.cluster is None:
        parser.error("--routers needs --cluster PRESET")
    if args.engine != parser.get_default("engine") or any(
            getattr(args, k) for k in ("max_num_seqs", "max_num_batched_tokens", "preemption",
                                       "no_chunked_prefill")):
        parser.error("--cluster names its engine (MODEL/GPU): the engine options do not apply")
    cluster = fail_on(parser, "--cluster", lambda: ClusterConfig.preset(args.cluster))
    default = parser.get_default("policies")
    if isinstance(default, str):  # (argparse converts a string default on parsing)
        default = tuple(x.strip() for x in default.split(",") if x.strip())
    given = tuple(args.policies) != tuple(default)
    if given and len(args.policies) != 1:
        parser.error("--policies: with --cluster give one local policy (every instance's)")
    policy = args.policies[0] if given else "fcfs"
    fail_on(parser, "--policies", lambda: check_policy(policy))
    ignored = [opt for opt, dest in (("--capacity-sample", "capacity_sample"),
                                     ("--warmup", "warmup"), ("--workers", "workers"),
                                     ("--cdf-load", "cdf_load"), ("--no-plots", "no_plots"),
                                     ("--starvation-multiple", "starvation_multiple"),
                                     ("--backend", "backend"), ("--address", "address"),
                                     ("--capacity", "capacity"), ("--request-rate", "request_rate"),
                                     ("--burstiness", "burstiness"))
               if getattr(args, dest) != parser.get_default(dest)]
    if ignored:
        parser.error(f"{', '.join(ignored)}: not used with --cluster (one process, no study "
                     "metrics or plots; the capacity is measured on the window's first 4,000 "
                     "requests under the reference router)")
    routers = args.routers or (DISAGG_ROUTERS if cluster.disaggregated else UNIFIED_ROUTERS)
    from cbgym.cluster.routing import RouterContext

    for spec in routers:  # a router that cannot serve this cluster fails here, not mid-sweep
        fail_on(parser, "--routers",
              lambda s=spec: make_router(s).reset(RouterContext(config=cluster)))
    out_dir(args, parser)
    traces = {n: fail_on(parser, "--trace", lambda n=n: resolve_trace(n, args.download))
              for n in args.trace}
    if chosen:
        print(chosen)
    log = None if args.quiet else (lambda msg: print(msg, file=sys.stderr))
    results = cluster_sweep(traces, cluster, args.cluster, routers, args.loads, args.windows,
                            args.window_requests, args.seeds, policy=policy,
                            slo=SLO(args.ttft, args.tpot, tbt_s=args.tbt),
                            progress=not args.quiet, log=log)
    print(format_table(results))
    if args.out:
        path = Path(args.out) / "cluster_results.csv"
        results.to_csv(path, index=False)
        print(f"wrote {path}")
    print(f"{len(results)} runs in {results['wall_s'].sum():.1f} s of simulation")
    return 0
