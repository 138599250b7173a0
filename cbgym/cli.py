"""The ``cbgym`` console command.

Subcommands:

* ``cbgym bench``: sweep policies x loads x traces x engines x windows x seeds, print the study's
  table, optionally write CSVs, ``config.json`` and plots (``--out``). With no options it is a
  short benchmark (seconds) of FCFS, CB-SJF-Work and Oracle-Work at rho = 0.9.
* ``cbgym simulate``: one run (one policy, one window, one load), printing its summary; any
  row of a bench's ``results.csv`` can be re-run with it.

Bad options print one line, ``cbgym <command>: error: ...``, on stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from cbgym import cli_types as T

DEFAULT_TRACE = "azure-conv-2023"
FALLBACK_TRACE = "synthetic-conv"
DEFAULT_POLICIES = "fcfs,cb-sjf-work,oracle-work"
DEFAULT_LOADS = "0.9"
DEFAULT_ENGINE = "cbsjf-paper"


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are a single line on stderr (exit status 2)."""

    def error(self, message: str) -> NoReturn:
        text = " ".join(str(message).split())  # one line, whatever the message held
        self.exit(2, f"{self.prog}: error: {text}\n")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter,
                     argparse.RawDescriptionHelpFormatter):
    """Defaults in the help text (unless None/False or already said), descriptions as written."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False) or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


# ---------------------------------------------------------------- shared options


def _add_engine_options(parser: argparse.ArgumentParser, plural: bool) -> None:
    group = parser.add_argument_group("engine")
    group.add_argument(
        "--engine", default=DEFAULT_ENGINE, metavar="PRESET" + ("[,PRESET...]" if plural else ""),
        help="engine preset: 'cbsjf-paper' (the study's engine: separate prefill/decode "
             "iterations, no chunking, no preemption) or a roofline preset 'model/gpu[/tpN]', "
             "e.g. 'llama-2-13b/a100-80gb' (vLLM-style chunked prefill and preemption)"
             + ("; comma-separated for several" if plural else ""))
    group.add_argument("--max-num-seqs", type=T.int_at_least(1), default=None, metavar="N",
                       help="override the cap on running requests (vLLM max_num_seqs)")
    group.add_argument("--max-num-batched-tokens", type=T.int_at_least(1), default=None,
                       metavar="N", help="override the per-iteration token budget")
    group.add_argument("--preemption", choices=("recompute", "swap"), default=None,
                       help="override what happens to a preempted request's KV")
    group.add_argument("--no-chunked-prefill", action="store_true",
                       help="turn chunked prefill off (roofline presets)")
    group.add_argument("--prefix-caching", action="store_true",
                       help="vLLM's automatic prefix caching, on traces with block ids "
                            "(mooncake-*, agent-sessions; docs/prefix-caching.md)")


def _add_slo_options(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    group = parser.add_argument_group("metrics")
    group.add_argument("--ttft", type=T.positive_float, default=2.0, metavar="S",
                       help="TTFT SLO in seconds (goodput counts requests meeting both SLOs)")
    group.add_argument("--tpot", type=T.positive_float, default=0.1, metavar="S",
                       help="TPOT SLO in seconds per output token")
    group.add_argument("--warmup", type=T.fraction, default=0.1, metavar="FRAC",
                       help="fraction of each window's earliest requests left out of latency "
                            "statistics (the study discards 10%%)")
    return group


def _engine_overrides(args: argparse.Namespace) -> dict[str, Any]:
    from cbgym.bench import engine_overrides

    return engine_overrides(args.max_num_seqs, args.max_num_batched_tokens, args.preemption,
                            not args.no_chunked_prefill, args.prefix_caching)


# ---------------------------------------------------------------- cbgym bench

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


def _bench_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
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
    p.set_defaults(handler=_cmd_bench, subparser=p)
    return p


def _default_trace(download: bool) -> tuple[str, str]:
    """The default trace and a sentence saying why it was chosen."""
    from cbgym.workload.catalog import find_trace

    found = find_trace(DEFAULT_TRACE)
    if found is not None:
        return DEFAULT_TRACE, f"trace: {DEFAULT_TRACE} (found at {found})"
    if download:
        return DEFAULT_TRACE, f"trace: {DEFAULT_TRACE} (downloading: --download)"
    return FALLBACK_TRACE, (
        f"trace: {FALLBACK_TRACE} (offline synthetic workload: {DEFAULT_TRACE} was not found "
        "locally; set CBGYM_TRACE_DIR or pass --download to use it)")


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


def _or_fail(parser: argparse.ArgumentParser, option: str, call: Callable[[], Any]) -> Any:
    """``call()``, turning a ValueError into the parser's one-line error for ``option``."""
    try:
        return call()
    except ValueError as exc:
        parser.error(f"{option}: {exc}")


def _cmd_bench(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
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


# ---------------------------------------------------------------- entry point


def build_parser() -> OneLineParser:
    """The ``cbgym`` argument parser with its subcommands."""
    parser = OneLineParser(prog="cbgym", description="cbgym: LLM-serving scheduler simulator.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _bench_parser(sub)
    from cbgym.cli_simulate import add_parser as simulate_parser

    simulate_parser(sub)
    from cbgym.tasks.cli import add_parser as evaluate_parser

    evaluate_parser(sub, _HelpFormatter)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``cbgym`` command; returns the exit status (errors raise SystemExit(2))."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.error("choose a command: bench, simulate or evaluate (see cbgym --help)")
    try:
        return int(args.handler(args, args.subparser))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
