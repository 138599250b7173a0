"""The benchmark tasks' baseline tables, as docs/benchmark.md shows them (test windows).

    python benchmarks/bench_tasks.py                        # every task, seeds 0 1
    python benchmarks/bench_tasks.py --tasks conv-study-overload --seeds 0
    python benchmarks/bench_tasks.py --split validation     # what task design looked at
    python benchmarks/bench_tasks.py --tasks code-2p2d-deflection   # a cluster task
    python benchmarks/bench_tasks.py --tasks tenants-servegen --batch 6

Cluster tasks (``cbgym.tasks.cluster_tasks``) are scored the same way with routers: every
rule router, random routes (the env's action space, sampled) and the shipped learned router
(``learned-router:<task>``, where one is shipped).

For each task: goodput per window with its 95% interval, SLO attainment, p99 TTFT and the
normalized score of every reference, random actions and the task's shipped learned policy
(``learned:<task>``, where one is shipped), then whether decisions matter (random actions at
most 80% of the best reference, FCFS at most 0.8 normalized) and the learned policy minus the
best content-blind heuristic with its paired 95% interval. ``--batch K`` adds both over the
means of K neighbouring windows (``cbgym.tasks.scoring.batch_means``), for a task whose test
windows lie side by side and are correlated (tenants-servegen's 78).
"""

from __future__ import annotations

import argparse
import time

from cbgym.agents.learned import shipped_names
from cbgym.tasks import TASKS
from cbgym.tasks.evaluate import RANDOM, Evaluation, evaluate
from cbgym.tasks.scoring import PairedDifference, batch_means, mean_ci


def said(d: PairedDifference) -> str:
    """A paired difference as the tables print it: mean [interval] (wins, ties, losses)."""
    return (f"{d.difference.mean:+.1f} [{d.difference.low:+.1f}, {d.difference.high:+.1f}] "
            f"(wins {d.wins}, ties {d.ties}, losses {d.losses})")


def batched(ev: Evaluation, batch: int, versus: str | None, random: str = "random actions"
            ) -> list[str]:
    """Random actions' share of the best reference (the t interval of the per-batch ratios)
    and ``versus``'s paired difference, over the means of ``batch`` neighbouring windows."""
    if batch == 1:
        return []
    n, left = divmod(len(ev.starts), batch)
    if n < 2:
        return [f"(--batch {batch}: {len(ev.starts)} windows make fewer than 2 batches)"]
    best = ev.best_reference
    share = mean_ci(batch_means(ev.goodput[RANDOM], batch) / batch_means(ev.goodput[best], batch))
    where = f"over means of {batch} neighbouring windows ({n} batches" + (
        f"; the last {left} window{'s' * (left > 1)} left out)" if left else ")")
    lines = [f"{where}: {random} / best reference ({best}), the mean of the batches' ratios: "
             f"{share.mean:.2f} [{share.low:.2f}, {share.high:.2f}]"]
    if versus:
        d = ev.versus(versus, batch)
        lines.append(f"{where}: {ev.policy} minus {versus}: {said(d)}")
    return lines


def table(task: str, seeds: tuple[int, ...], split: str, batch: int = 1) -> str:
    learned = f"learned:{task}" if task in shipped_names() else None
    ev = evaluate(task, learned or "fcfs", seeds=seeds, split=split)
    return report(ev, len(seeds), split, batch)


def report(ev: Evaluation, n_seeds: int, split: str, batch: int = 1, title: str = "") -> str:
    """An evaluation as docs/benchmark.md shows it: the table, whether decisions matter, and
    the learned policy (``ev.policy``, when it is one) against the best content-blind
    heuristic and random actions."""
    task = ev.task.name
    learned = ev.policy if ev.policy.startswith("learned:") else None
    rows = ["| policy | goodput [95% CI] | SLO attainment | p99 TTFT (s) | score [95% CI] |",
            "|---|---|---|---|---|"]
    t = ev.table
    for name, r in t.iterrows():
        rows.append(f"| {name} | {r.goodput:.1f} [{r.goodput_low:.1f}, {r.goodput_high:.1f}] "
                    f"| {r.slo_attainment:.3f} | {r.ttft_p99_s:.1f} | {r.score:.2f} "
                    f"[{r.score_low:.2f}, {r.score_high:.2f}] |")
    lines = [f"### {title or task} ({split}: {len(ev.starts)} windows x {n_seeds} seeds)", "",
             *rows, "",
             f"random actions / best reference ({ev.best_reference}): {ev.random_share:.2f}; "
             f"FCFS normalized: {ev.score('fcfs').mean:.2f}"]
    if learned:
        for label, other in (("the best content-blind heuristic", ev.best_heuristic),
                             ("random actions", RANDOM)):
            d = ev.versus(other)
            lines.append(f"{learned} minus {label} ({other}): {said(d)}")
    lines += batched(ev, batch, ev.best_heuristic if learned else None)
    return "\n".join(lines)


def cluster_table(task: str, seeds: tuple[int, ...], split: str, batch: int = 1) -> str:
    from cbgym.agents.routing.learned import CHECKPOINTS
    from cbgym.tasks.cluster_tasks import evaluate_cluster

    shipped = (CHECKPOINTS / f"router-{task}.zip").is_file()
    learned = f"learned-router:{task}" if shipped else None
    ev = evaluate_cluster(task, learned or "kairos", seeds=seeds, split=split)
    rows = ["| router | goodput [95% CI] | SLO attainment | p99 TTFT (s) | score [95% CI] |",
            "|---|---|---|---|---|"]
    for name, r in ev.table.iterrows():
        rows.append(f"| {name} | {r.goodput:.1f} [{r.goodput_low:.1f}, {r.goodput_high:.1f}] "
                    f"| {r.slo_attainment:.3f} | {r.ttft_p99_s:.1f} | {r.score:.2f} "
                    f"[{r.score_low:.2f}, {r.score_high:.2f}] |")
    best = ev.best_reference
    g = {k: v.mean() for k, v in ev.goodput.items()}
    worst = min((k for k in g if k not in (RANDOM, ev.policy)), key=g.get)
    lines = [f"### {task} ({split}: {len(ev.starts)} windows x {len(seeds)} seeds)", "",
             *rows, "",
             f"random routes / best reference ({best}): {ev.random_share:.2f}; worst rule "
             f"({worst}) normalized: {ev.score(worst).mean:.2f}"]
    if learned:
        for label, other in (("the best rule", ev.best_heuristic), ("random routes", RANDOM)):
            d = ev.versus(other)
            lines.append(f"{learned} minus {label} ({other}): {said(d)}")
    lines += batched(ev, batch, ev.best_heuristic if learned else None, "random routes")
    return "\n".join(lines)


def main() -> None:
    from cbgym.tasks.cluster_tasks import CLUSTER_TASKS

    names = [*TASKS, *CLUSTER_TASKS]
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", nargs="+", default=names, choices=names)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--split", default="test", choices=["test", "validation"])
    parser.add_argument("--batch", type=int, default=1,
                        help="also score over the means of this many neighbouring windows")
    args = parser.parse_args()
    if args.batch < 1:
        parser.error(f"--batch {args.batch}: expected a positive number of windows")
    for task in args.tasks:
        t0 = time.perf_counter()
        make = cluster_table if task not in TASKS else table
        print(make(task, tuple(args.seeds), args.split, args.batch))
        print(f"({time.perf_counter() - t0:.0f} s)\n", flush=True)


if __name__ == "__main__":
    main()
