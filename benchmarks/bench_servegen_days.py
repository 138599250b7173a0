"""tenants-servegen replicated on later days of ServeGen's description, which the task never drew.

    python benchmarks/bench_servegen_days.py                 # days [3, 6), [6, 9), [9, 12)
    python benchmarks/bench_servegen_days.py --start-days 3 --seeds 0 --protocols 8

The task ``tenants-servegen`` draws the first three of the 14 days its client descriptions
cover (``cbgym.workload.servegen.servegen_tenants``). Each replica draws another span of the
same description the same way (seed 0, one request a second on average over the span, the
tiers by client id), measures its own capacity, and plays the task's settings on its test
range (the last 30%): every reference, random actions and the shipped ``learned:`` policy.
Two protocols: every non-overlapping window of the test range (``all``: the task's test) and
8 evenly spaced windows (``8``: its first look's). Nothing of these spans was used to design,
tune or train anything (docs/benchmark.md, under tenants-servegen, declared the protocol
before it first ran). Each replica prints the task's table (``bench_tasks.report``); the
``all`` protocol adds the intervals over means of 13 neighbouring windows, as the task's
headline. A summary line per replica and protocol closes the run.
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from dataclasses import replace
from pathlib import Path

from cbgym.tasks import get
from cbgym.tasks.evaluate import Evaluation, evaluate
from cbgym.workload.catalog import find_trace
from cbgym.workload.servegen import SERVEGEN_DAYS, SERVEGEN_DESCRIBED_DAYS, servegen_tenants

TASK = "tenants-servegen"
BATCH = 13  # the headline's batch of neighbouring windows (docs/benchmark.md)

# the task tables' format, from the script beside this one (run as a script or loaded by path)
_spec = importlib.util.spec_from_file_location("bench_tasks",
                                               Path(__file__).with_name("bench_tasks.py"))
assert _spec is not None and _spec.loader is not None
bench_tasks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_tasks)


def replica(start_day: float, seeds: tuple[int, ...], protocol: str, folder: Path
            ) -> Evaluation:
    """The task on ``SERVEGEN_DAYS`` days of the description from ``start_day``: every
    non-overlapping window of its test range (``protocol="all"``) or ``int(protocol)``
    evenly spaced ones."""
    trace = servegen_tenants(folder, start_day=start_day)
    task = get(TASK)
    lo, hi = task.ranges(len(trace))["test"]
    count = (hi - lo) // task.episode_requests if protocol == "all" else int(protocol)
    return evaluate(replace(task, test_windows=count), f"learned:{TASK}", seeds=seeds,
                    trace=trace)


def summary(ev: Evaluation, label: str, batch: int = 1) -> str:
    """One line: random actions' share of the best reference, FCFS normalized, and the
    evaluated policy minus the best content-blind heuristic (over means of ``batch``
    neighbouring windows, else by window)."""
    bar = ev.best_heuristic
    over = f"over means of {batch}" if batch > 1 else "by window"
    return (f"{label}: random actions / best reference ({ev.best_reference}) "
            f"{ev.random_share:.3f}; "
            f"FCFS normalized {ev.score('fcfs').mean:.2f}; {ev.policy} minus {bar} "
            f"{bench_tasks.said(ev.versus(bar, batch))} {over}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--start-days", nargs="+", type=float, default=[3.0, 6.0, 9.0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--protocols", nargs="+", default=["all", "8"], choices=["all", "8"])
    args = parser.parse_args()
    last = SERVEGEN_DESCRIBED_DAYS - SERVEGEN_DAYS
    for d in args.start_days:
        if not 0 <= d <= last:
            parser.error(f"--start-days {d:g}: expected a day in [0, {last}] (the description "
                         f"covers {SERVEGEN_DESCRIBED_DAYS} days and a replica spans "
                         f"{SERVEGEN_DAYS})")
        if d < SERVEGEN_DAYS:
            print(f"(--start-days {d:g} overlaps the task's own days [0, {SERVEGEN_DAYS}))")
    folder = find_trace("tenants-servegen-language")
    if folder is None:
        parser.error("ServeGen's client descriptions (servegen/language/m-small) were not "
                     "found: set CBGYM_TRACE_DIR to the folder holding servegen/")
    lines: list[str] = []
    for d in args.start_days:
        for protocol in args.protocols:
            t0 = time.perf_counter()
            ev = replica(d, tuple(args.seeds), protocol, Path(folder))
            label = f"days [{d:g}, {d + SERVEGEN_DAYS:g})"
            batch = BATCH if protocol == "all" else 1
            print(bench_tasks.report(ev, len(args.seeds), "test", batch, title=f"{TASK}, {label}"))
            print(f"({time.perf_counter() - t0:.0f} s)\n", flush=True)
            lines.append(summary(ev, f"{label}, {len(ev.starts)} windows", batch))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
