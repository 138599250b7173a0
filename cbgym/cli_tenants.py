"""``cbgym bench --overload`` and ``cbgym bench --noisy-neighbour``: the second seed's two
experiments (``docs/overload.md``), their arguments checked before any work."""

from __future__ import annotations

import argparse
import sys

from cbgym import cli_types as T
from cbgym.cluster.cli_bench import fail_on, out_dir

OVERLOAD_CLUSTER = "1x:llama-3.1-8b/a100-80gb"
NOISY_ENGINE = "llama-3.1-8b/a100-80gb"
NOISY_TRACES = (("azure-conv-2023", "azure-code-2023"), ("synthetic-conv", "synthetic-code"))


def add_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("tenants and overload (docs/overload.md)")
    which = g.add_mutually_exclusive_group()
    which.add_argument("--overload", action="store_true",
                       help="goodput against offered load with and without admission control, "
                            "clients timing out and retrying (on --cluster, default "
                            f"{OVERLOAD_CLUSTER}; --loads default 0.5 to 3)")
    which.add_argument("--noisy-neighbour", action="store_true",
                       help="an interactive tenant beside a long-prompt batch tenant on one "
                            "engine, per-tenant figures under fair policies (--trace "
                            "INTERACTIVE,BATCH; one --loads value, default 1)")
    g.add_argument("--timeout", type=float, default=10.0, metavar="S",
                   help="--overload: a client gives up when no first token came in S s")
    g.add_argument("--retries", type=int, default=3, metavar="N",
                   help="--overload: retries per request (429, 503, timeout)")
    g.add_argument("--abandon", choices=("leave", "abort"), default="leave",
                   help="--overload: a timed-out request is left running or aborted")
    g.add_argument("--share", type=float, default=0.7, metavar="F",
                   help="--noisy-neighbour: the interactive tenant's share of requests")


def _reject(args: argparse.Namespace, parser: argparse.ArgumentParser, mode: str,
            options: tuple[str, ...]) -> None:
    used = [opt for opt in options if T.given(args, parser, opt.lstrip("-").replace("-", "_"))]
    if used:
        parser.error(f"{', '.join(used)}: not used with {mode}")


def cmd_overload(args: argparse.Namespace, parser: argparse.ArgumentParser,
                 chosen: str | None) -> int:
    from cbgym.bench import check_policy, resolve_trace
    from cbgym.cluster.config import ClusterConfig
    from cbgym.metrics import SLO
    from cbgym.overload import LOADS, client_model, format_table, overload_sweep, plot_collapse

    _reject(args, parser, "--overload", ("--routers", "--share", "--capacity-sample",
                                         "--cdf-load", "--starvation-multiple", "--workers",
                                         "--engine", "--max-num-seqs", "--preemption",
                                         "--max-num-batched-tokens", "--no-chunked-prefill",
                                         "--backend", "--address", "--capacity",
                                         "--request-rate", "--burstiness"))
    if not args.timeout > 0:
        parser.error(f"--timeout: {args.timeout!r}, expected seconds > 0")
    if args.retries < 0:
        parser.error(f"--retries: {args.retries!r}, expected an int >= 0")
    name = args.cluster or OVERLOAD_CLUSTER
    cluster = fail_on(parser, "--cluster", lambda: ClusterConfig.preset(name))
    policies = args.policies if T.given(args, parser, "policies") else ("fcfs",)
    if len(policies) != 1:
        parser.error("--policies: with --overload give one local policy (every instance's)")
    fail_on(parser, "--policies", lambda: check_policy(policies[0]))
    loads = args.loads if T.given(args, parser, "loads") else LOADS
    client = fail_on(parser, "--timeout", lambda: client_model(args.timeout, args.retries,
                                                             args.abandon))
    out = out_dir(args, parser)
    traces = {n: fail_on(parser, "--trace", lambda n=n: resolve_trace(n, args.download))
              for n in args.trace}
    if chosen:
        print(chosen)
    log = None if args.quiet else (lambda msg: print(msg, file=sys.stderr))
    results = overload_sweep(traces, cluster, name, loads, args.windows, args.window_requests,
                             args.seeds, client, slo=SLO(args.ttft, args.tpot, tbt_s=args.tbt),
                             policy=policies[0], progress=not args.quiet, log=log)
    print(f"{name}, clients: {client}")
    print(format_table(results))
    if out is not None:
        results.to_csv(out / "overload_results.csv", index=False)
        written = ["overload_results.csv"]
        if not args.no_plots:
            plot_collapse(results, str(out / "overload_goodput.png"))
            written.append("overload_goodput.png")
        print(f"wrote {', '.join(written)} to {out}")
    print(f"{len(results)} runs in {results['wall_s'].sum():.1f} s of simulation")
    return 0


def cmd_noisy_neighbour(args: argparse.Namespace, parser: argparse.ArgumentParser,
                        given_trace: bool) -> int:
    from cbgym.bench import check_policy, resolve_trace
    from cbgym.engine.config import EngineConfig
    from cbgym.noisy_neighbour import (
        POLICIES,
        format_table,
        noisy_neighbour_mix,
        noisy_neighbour_table,
    )
    from cbgym.workload.catalog import find_trace

    _reject(args, parser, "--noisy-neighbour", (
        "--cluster", "--routers", "--timeout", "--retries", "--abandon", "--windows",
        "--seeds", "--capacity-sample", "--cdf-load", "--starvation-multiple", "--workers",
        "--ttft", "--tpot", "--tbt", "--backend", "--address", "--capacity",
        "--request-rate", "--burstiness"))
    if not 0 < args.share < 1:
        parser.error(f"--share: {args.share!r}, expected in (0, 1)")
    policies = args.policies if T.given(args, parser, "policies") else POLICIES
    for spec in policies:
        fail_on(parser, "--policies", lambda s=spec: check_policy(s))
    loads = args.loads if T.given(args, parser, "loads") else (1.0,)
    if len(loads) != 1:
        parser.error("--loads: --noisy-neighbour takes one load")
    engine_name = args.engine if T.given(args, parser, "engine") else NOISY_ENGINE
    engine = fail_on(parser, "--engine", lambda: EngineConfig(preset=engine_name))
    if given_trace:
        if len(args.trace) != 2:
            parser.error("--trace: --noisy-neighbour takes two traces, INTERACTIVE,BATCH")
        names = tuple(args.trace)
    else:
        # the 2023 traces where they are found, else the embedded synthetic workloads
        real = NOISY_TRACES[0]
        names = real if all(find_trace(n) for n in real) else NOISY_TRACES[1]
        print(f"traces: {names[0]} (interactive), {names[1]} (batch)")
    chat, batch = (fail_on(parser, "--trace", lambda n=n: resolve_trace(n, args.download))
                   for n in names)
    out = out_dir(args, parser)
    mixed, mu = fail_on(parser, "--window-requests", lambda: noisy_neighbour_mix(
        chat, batch, args.window_requests, args.share, loads[0], engine))
    n_chat = int((mixed.tenant == 0).sum())
    print(f"{len(mixed)} requests ({n_chat} interactive, {len(mixed) - n_chat} batch), "
          f"{engine_name}, load {loads[0]:g} of {mu:.2f} req/s")
    table = noisy_neighbour_table(mixed, engine, policies)
    print(format_table(table))
    if out is not None:
        table.to_csv(out / "noisy_neighbour.csv", index=False)
        print(f"wrote noisy_neighbour.csv to {out}")
    return 0
