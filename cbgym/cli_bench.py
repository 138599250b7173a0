"""``cbgym bench``: the sweep's options, their checks, and its tables.

The options are checked (and the sweep's configuration built) before any run starts; the
cluster, overload and noisy-neighbour variants hand over to their own modules
(:mod:`cbgym.cluster.cli_bench`, :mod:`cbgym.cli_tenants`).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from cbgym import cli_types as T
from cbgym.cli import (
    DEFAULT_LOADS,
    DEFAULT_TRACE,
    FALLBACK_TRACE,
    _add_engine_options,
    _add_slo_options,
    _default_trace,
    _engine_overrides,
    _HelpFormatter,
    _or_fail,
)

DEFAULT_POLICIES = "fcfs,cb-sjf-work,oracle-work"

BENCH_DESCRIPTION = """\
Sweep scheduling policies x offered loads x traces x engines x windows x seeds, and report the
CB-SJF-Work study's metrics: mean normalised latency (E2E / output tokens, ms per token, after
a warm-up discard), oracle gain recovered (100 x mean_w(FCFS - P) / mean_w(FCFS - Oracle-Work);
needs fcfs and oracle-work in --policies), p99 ratio to FCFS (mean over windows of the p99
normalised-latency ratio), a starvation count, goodput, and the two accountings of the prefill
share (marginal work; simulated engine time under FCFS).

Every policy replays the same windows with the same arrivals: capacity mu is measured once per
(window, engine) by saturation (the window's first --capacity-sample requests at t=0 under
FCFS; --capacity per-trace: once per trace, on its first requests, as the study does) and
arrivals are affinely rescaled to rho = lambda / mu. Windows are consecutive requests,
evenly spaced over the trace (disjoint when windows x window-requests <= trace length).

With no options: a short benchmark of fcfs, cb-sjf-work and oracle-work at rho = 0.9 on
azure-conv-2023 if its file is found locally ($CBGYM_TRACE_DIR or the user cache), else on the
offline synthetic-conv workload."""

BENCH_EPILOG = """\
outputs (with --out DIR):
  results.csv      one row per policy x load x trace x engine x window x seed
  summary.csv      the study's table, aggregated over windows and seeds
  headline.csv     oracle gain recovered averaged over rho in {0.85, 0.92, 0.98}
  accountings.csv  prefill share: marginal work and FCFS engine time, per trace/engine/load
  cdf.csv          normalised-latency quantiles per run at the CDF load
  config.json      the full configuration, measured capacities and versions
  *.png            mean / p99 latency vs load, goodput vs load, latency CDFs

example:
  cbgym bench --trace azure-conv-2023 --engine cbsjf-paper \\
      --policies fcfs,cb-sjf-work,oracle-work,ljf-work,random \\
      --loads 0.6,0.75,0.85,0.92,0.98 --windows 5 --window-requests 3800 --out results/"""


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("bench", help="sweep policies x loads x traces and report the study",
                       description=BENCH_DESCRIPTION, epilog=BENCH_EPILOG,
                       formatter_class=_HelpFormatter)
    sweep = p.add_argument_group("sweep")
    sweep.add_argument(
        "--trace", type=T.traces, default=None,
        metavar="NAME[,NAME...]",
        help="traces: catalogue names (azure-conv-2023, azure-code-2023, azure-conv-2024, "
             "azure-code-2024, synthetic-conv, synthetic-code) or file paths; default "
             f"{DEFAULT_TRACE} if found locally, else {FALLBACK_TRACE}")
    sweep.add_argument("--policies", type=T.listed(str, "policies"), default=DEFAULT_POLICIES,
                       metavar="P[,P...]",
                       help="policy specs (see cbgym.agents.POLICIES), e.g. fcfs, sjf-ctx, "
                            "cb-sjf-work, oracle-work, oracle-sjf, ljf-work, random, "
                            "noisy-oracle:0.8, cb-sjf-work-aging:0.05")
    sweep.add_argument("--loads", type=T.listed(T.load, "loads"), default=None,
                       metavar="RHO[,RHO...]",
                       help=f"offered loads rho = lambda / mu, each > 0 (default {DEFAULT_LOADS})")
    sweep.add_argument("--request-rate", type=T.listed(T.positive_float, "request rates"),
                       default=None, metavar="R[,R...]",
                       help="instead of --loads: send each window at these rates (req/s) as "
                            "vLLM's benchmark does (Gamma gaps, shape --burstiness, drawn "
                            "with the seed); tables and plots are then by rate")
    sweep.add_argument("--burstiness", type=T.positive_float, default=1.0, metavar="B",
                       help="with --request-rate: vLLM's burstiness (1 = Poisson, lower = "
                            "burstier)")
    sweep.add_argument("--windows", type=T.int_at_least(1), default=2, metavar="N",
                       help="windows per trace")
    sweep.add_argument("--window-requests", type=T.int_at_least(2), default=4000, metavar="M",
                       help="requests per window (the study uses 20,000; clipped to the trace)")
    sweep.add_argument("--window-range", type=T.span, default=(0.0, 1.0), metavar="LO:HI",
                       help="draw the windows from this part of each trace, as fractions of "
                            "its requests (e.g. 0.4:1: after a predictor's training split)")
    sweep.add_argument("--seeds", type=T.listed(T.seed, "integer seeds"), default="0",
                       metavar="S[,S...]", help="seeds for randomised policies")
    sweep.add_argument("--capacity-sample", type=T.int_at_least(2), default=4000, metavar="K",
                       help="requests released at t=0 to measure capacity (the study: 4,000)")
    sweep.add_argument("--capacity", choices=("per-window", "per-trace"), default="per-window",
                       help="measure mu on each window, or once per trace on its first "
                            "--capacity-sample requests (the study's)")
    sweep.add_argument("--download", action="store_true",
                       help="download missing catalogue traces into the user cache")
    _add_engine_options(p, plural=True)
    met = _add_slo_options(p)
    met.add_argument("--starvation-multiple", type=T.positive_float, default=10.0, metavar="K",
                     help="a request starves if its wait exceeds K x the FCFS median wait of "
                          "the same window (results.csv also counts waits beyond the longest "
                          "FCFS wait: starved_beyond_fcfs_max)")
    met.add_argument("--cdf-load", type=T.load, default=None, metavar="RHO|R",
                     help="load (or --request-rate) whose latency CDFs are kept and plotted "
                          "(default: the highest)")
    clu = p.add_argument_group("cluster (docs/cluster.md)")
    clu.add_argument("--cluster", default=None, metavar="PRESET",
                     help="sweep routers on a cluster instead: 'Nx:MODEL/GPU' or "
                          "'XpYd:MODEL/GPU' (e.g. 2p2d:deepseek-v2-lite/a100-80gb); --policies "
                          "then names the one local policy of every instance")
    clu.add_argument("--routers", type=T.listed(str, "routers"), default=None,
                     metavar="R[,R...]", help="router specs (cbgym.agents.routing.ROUTERS); "
                     "default round-robin,least-outstanding,jsq-tokens,jsq-time, or on a "
                     "disaggregated cluster always-disaggregate,dynamo,kairos")
    clu.add_argument("--tbt", type=T.positive_float, default=None, metavar="S",
                     help="also require each request's worst gap between tokens <= S")
    from cbgym.cli_tenants import add_options

    add_options(p)
    run = p.add_argument_group("run and output")
    run.add_argument("--workers", type=T.int_at_least(1), default=None, metavar="N",
                     help="worker processes; 1 runs everything in this process (default: "
                          f"os.cpu_count(), {os.cpu_count()} here)")
    run.add_argument("--backend", choices=("process", "ray"), default="process",
                     help="worker processes here, or Ray tasks (pip install 'cbgym[ray]')")
    run.add_argument("--address", default=None, metavar="ADDR",
                     help="with --backend ray: the Ray cluster to join (default: a local one)")
    run.add_argument("--out", default=None, metavar="DIR",
                     help="write CSVs, config.json and PNGs here (default: print only)")
    run.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    run.add_argument("--from", dest="from_dir", default=None, metavar="DIR",
                     help="instead of a sweep: print the tables of one saved with --out (and "
                          "with --out, write its files and plots again there)")
    run.add_argument("--quiet", action="store_true", help="no progress bar or notes")
    p.set_defaults(handler=cmd_bench, subparser=p)
    return p


def _bench_config(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Any:
    from cbgym.bench import BenchConfig, check_policy, resolve_engine, resolve_trace, scalable

    for spec in args.policies:
        _or_fail(parser, "--policies", lambda s=spec: check_policy(s))
    engines = tuple(e.strip() for e in args.engine.split(",") if e.strip())
    if not engines:
        parser.error("--engine: expected at least one preset")
    for preset in engines:
        _or_fail(parser, "--engine", lambda e=preset: resolve_engine(e, _engine_overrides(args)))
    rates = tuple(args.request_rate or ())
    if rates and args.loads is not None:
        parser.error("--request-rate: give --loads or --request-rate, not both")
    if args.burstiness != 1.0 and not rates:
        parser.error("--burstiness: shapes --request-rate's arrivals; give --request-rate")
    loads = () if rates else tuple(args.loads or T.listed(T.load, "loads")(DEFAULT_LOADS))
    for name in args.trace:
        trace = _or_fail(parser, "--trace", lambda n=name: resolve_trace(n, args.download))
        if not rates:  # (a rate replaces the arrivals: one instant is fine)
            _or_fail(parser, "--trace", lambda n=name, t=trace: scalable(n, t))
    if args.cdf_load is not None and args.cdf_load not in (rates or loads):
        parser.error(f"--cdf-load: {args.cdf_load:g} is not one of "
                     + ("--request-rate" if rates else "--loads"))
    over = _engine_overrides(args)
    return _or_fail(parser, "bench", lambda: BenchConfig(
        traces=tuple(args.trace), policies=tuple(args.policies), loads=loads,
        request_rates=rates, burstiness=args.burstiness,
        engines=engines, windows=args.windows, window_requests=args.window_requests,
        window_range=args.window_range, seeds=tuple(args.seeds),
        max_num_seqs=over.get("max_num_seqs"),
        max_num_batched_tokens=over.get("max_num_batched_tokens"),
        preemption=over.get("preemption"), chunked_prefill=over.get("chunked_prefill", True),
        prefix_caching=over.get("enable_prefix_caching", False),
        ttft_s=args.ttft, tpot_s=args.tpot, warmup=args.warmup,
        starvation_multiple=args.starvation_multiple, cdf_load=args.cdf_load,
        capacity_sample=args.capacity_sample, capacity=args.capacity,
        workers=args.workers or os.cpu_count() or 1,
        download=args.download))


def cmd_bench(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from cbgym.bench import format_table, run_bench, write_outputs

    chosen = None
    if args.from_dir is not None:
        return _saved_bench(args, parser)
    if args.address is not None and args.backend != "ray":
        parser.error("--address: only with --backend ray")
    if args.out:
        T.out_dir(parser, args.out)
    if args.noisy_neighbour:
        from cbgym.cli_tenants import cmd_noisy_neighbour

        return cmd_noisy_neighbour(args, parser, given_trace=args.trace is not None)
    if args.trace is None:
        name, chosen = _default_trace(args.download)
        args.trace = (name,)
    if args.overload:
        from cbgym.cli_tenants import cmd_overload

        return cmd_overload(args, parser, chosen)
    if args.cluster is not None or args.routers is not None:
        from cbgym.cluster.cli_bench import cmd_cluster_bench

        if args.loads is None:
            args.loads = T.listed(T.load, "loads")(DEFAULT_LOADS)
        return cmd_cluster_bench(args, parser, chosen)
    cfg = _bench_config(args, parser)
    if chosen:
        print(chosen)
    log = None if args.quiet else (lambda msg: print(msg, file=sys.stderr))
    if args.backend == "ray":
        from cbgym.bench_ray import ray_module

        _or_fail(parser, "--backend", ray_module)
    from cbgym.bench_inputs import PolicyTraceError
    from cbgym.bench_ray import RayStartError

    try:
        result = run_bench(cfg, progress=not args.quiet, log=log, backend=args.backend,
                           address=args.address)
    except RayStartError as exc:
        parser.error(f"--backend ray: {exc}")
    except PolicyTraceError as exc:
        parser.error(f"--policies: {exc}")
    print(format_table(result))
    _print_headline(result)
    if args.out:
        written = write_outputs(result, args.out, plots=not args.no_plots)
        print(f"wrote {len(written)} files to {args.out}: "
              + ", ".join(p.name for p in written))
    elif not args.quiet:
        print("(pass --out DIR to write results.csv, summary.csv, accountings.csv and plots)")
    print(f"{len(result.results)} runs in {result.elapsed_s:.1f} s on {cfg.workers} worker(s)")
    return 0


def _saved_bench(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``cbgym bench --from DIR``: a saved sweep's tables (and files, with ``--out``)."""
    from cbgym.bench import format_table, read_outputs, write_outputs

    kept = {"from_dir", "out", "no_plots", "quiet", "help"}
    used = [a.option_strings[-1] for a in parser._actions if a.option_strings
            and a.dest not in kept and T.given(args, parser, a.dest)]
    if used:
        parser.error(f"{', '.join(used)}: not used with --from (the saved sweep's settings "
                     "are in its config.json)")
    if args.out:
        T.out_dir(parser, args.out)
    result = _or_fail(parser, "--from", lambda: read_outputs(args.from_dir))
    print(format_table(result))
    _print_headline(result)
    if args.out:
        written = write_outputs(result, args.out, plots=not args.no_plots)
        print(f"wrote {len(written)} files to {args.out}")
    return 0


def _print_headline(result: Any) -> None:
    head = result.headline.dropna(subset=["headline_gain_pct"])
    head = head[~head["policy"].isin(["fcfs", "oracle-work"])]
    if len(head):
        print("\noracle gain recovered, mean over rho in {0.85, 0.92, 0.98} present:")
        print(head.to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    acc = result.accountings
    if len(acc):
        print("\nprefill share (%): marginal work vs simulated engine time under FCFS")
        axis = "req/s" if result.config["bench"].get("axis") == "request_rate" else "load"
        shown = acc.drop(columns=["fcfs_runs"]).rename(columns={
            "marginal_work_share_pct": "marginal work %", "load": axis,
            "engine_time_share_pct": "engine time % (FCFS)"})
        print(shown.to_string(index=False, formatters={
            axis: "{:g}".format, "marginal work %": "{:.1f}".format,
            "engine time % (FCFS)": "{:.1f}".format}))
