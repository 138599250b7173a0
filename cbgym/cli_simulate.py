"""``cbgym simulate``: one run of one policy on one window, its summary printed (and with
``--out``, written). Its defaults are ``cbgym bench``'s (:mod:`cbgym.cli`)."""

from __future__ import annotations

import argparse
import json
import sys

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

SIMULATE_DESCRIPTION = """\
Simulate one policy on one window of one trace and print the run's summary (latency
quantiles in seconds, goodput, throughput, engine counters) and the study's per-window
latency numbers. To re-run a row of a bench's results.csv, pass its trace, window_start,
window_requests, engine, policy, load, capacity_rps and seed."""


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("simulate", help="one run, printing its summary",
                       description=SIMULATE_DESCRIPTION, formatter_class=_HelpFormatter)
    run = p.add_argument_group("run")
    run.add_argument("--trace", default=None, metavar="NAME",
                     help="catalogue name or file path; default as cbgym bench's: "
                          f"{DEFAULT_TRACE} if found locally, else {FALLBACK_TRACE}")
    run.add_argument("--policy", default="fcfs", metavar="P", help="policy spec")
    run.add_argument("--load", type=T.load_or_recorded, default=None, metavar="RHO",
                     help=f"rescale arrivals to this offered load ('recorded': the trace's "
                          f"own times); default {DEFAULT_LOADS}, as cbgym bench's, unless "
                          "--request-rate is given")
    run.add_argument("--request-rate", type=T.positive_float, default=None, metavar="R",
                     help="instead of --load: send the requests at R req/s as vLLM's "
                          "benchmark does (Gamma gaps, shape --burstiness)")
    run.add_argument("--burstiness", type=T.positive_float, default=1.0, metavar="B",
                     help="with --request-rate: vLLM's burstiness (1 = Poisson, lower = "
                          "burstier)")
    run.add_argument("--capacity-rps", type=T.positive_float, default=None, metavar="MU",
                     help="capacity to scale with (default: measured on the window)")
    run.add_argument("--start", type=T.int_at_least(0), default=0, metavar="I",
                     help="first request of the window")
    run.add_argument("--requests", type=T.int_at_least(2), default=None, metavar="M",
                     help="requests in the window (default: to the end of the trace)")
    run.add_argument("--seed", type=T.seed, default=0, help="seed for randomised policies")
    run.add_argument("--download", action="store_true",
                     help="download a missing catalogue trace into the user cache")
    run.add_argument("--json", action="store_true", help="print the summary as JSON")
    run.add_argument("--out", default=None, metavar="DIR",
                     help="also write requests.csv (one row per request) and summary.json")
    _add_engine_options(p, plural=False)
    _add_slo_options(p)
    p.set_defaults(handler=cmd_simulate, subparser=p)
    return p


def cmd_simulate(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from cbgym import study
    from cbgym.bench import check_policy, resolve_engine, resolve_trace, scalable
    from cbgym.bench_inputs import check_policy_windows
    from cbgym.metrics import SLO
    from cbgym.simulate import simulate

    _or_fail(parser, "--policy", lambda: check_policy(args.policy))
    out = T.out_dir(parser, args.out) if args.out else None
    if args.trace is None:  # (as cbgym bench chooses; said on stderr: --json stays clean)
        args.trace, chosen = _default_trace(args.download)
        print(chosen, file=sys.stderr)
    if args.load is not None and args.request_rate is not None:
        parser.error("--request-rate: give --load or --request-rate, not both")
    if args.load is None:
        args.load = None if args.request_rate is not None else float(DEFAULT_LOADS)
    elif args.load == "recorded":
        args.load = None
    engine = _or_fail(parser, "--engine",
                      lambda: resolve_engine(args.engine, _engine_overrides(args)))
    trace = _or_fail(parser, "--trace", lambda: resolve_trace(args.trace, args.download))
    count = len(trace) - args.start if args.requests is None else args.requests
    window = _or_fail(parser, "--start/--requests", lambda: trace.window(args.start, count))
    if args.load is not None:
        _or_fail(parser, "--load", lambda: scalable(args.trace, window))
    if args.burstiness != 1.0 and args.request_rate is None:
        parser.error("--burstiness: shapes --request-rate's arrivals; give --request-rate")
    _or_fail(parser, "--policy", lambda: check_policy_windows((args.policy,), [window]))
    res = simulate(window, args.policy, engine, load=args.load, seed=args.seed,
                   slo=SLO(args.ttft, args.tpot), capacity_rps=args.capacity_rps,
                   request_rate=args.request_rate, burstiness=args.burstiness)
    summary = {**res.summary(warmup=args.warmup), **study.latency_stats(res.requests,
                                                                         args.warmup)}
    head = {"trace": args.trace, "start": args.start, "requests": count,
            "engine": args.engine, "policy": args.policy, "load": args.load, "seed": args.seed,
            "request_rate": args.request_rate, "burstiness": args.burstiness}
    if out is not None:
        res.requests.to_csv(out / "requests.csv")
        (out / "summary.json").write_text(json.dumps({**head, **summary}, indent=2) + "\n")
    if args.json:
        print(json.dumps({**head, **summary}, indent=2))
    else:
        width = max(map(len, [*head, *summary]))
        for key, value in {**head, **summary}.items():
            text = f"{value:.6g}" if isinstance(value, float) else str(value)
            print(f"{key:<{width}}  {text}")
    return 0
