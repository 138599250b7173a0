"""``cbgym evaluate``: a policy on a task's test windows, scored against its references."""

from __future__ import annotations

import argparse
import json

from cbgym.tasks.registry import TASKS

DESCRIPTION = """\
Run a policy on a task's test windows (never used for training or tuning) beside random
actions and the task's reference policies, on the same windows. Prints goodput (requests of a
window meeting both SLOs) with its 95% interval, SLO attainment, p99 TTFT, the normalized score
(0 = random actions, 1 = the best reference) and the paired difference of the policy against
each row."""

COLUMNS = ["goodput", "goodput_low", "goodput_high", "slo_attainment", "ttft_p99_s", "score",
           "score_low", "score_high", "diff_vs", "wins", "ties", "losses"]


def add_parser(sub: argparse._SubParsersAction, formatter: type) -> argparse.ArgumentParser:
    p = sub.add_parser("evaluate", help="score a policy on a benchmark task",
                       description=DESCRIPTION, formatter_class=formatter)
    from cbgym.tasks.cluster_tasks import CLUSTER_TASKS

    names = sorted([*TASKS, *CLUSTER_TASKS])
    p.add_argument("--task", required=True, choices=names, metavar="T",
                   help=f"one of: {', '.join(names)}")
    p.add_argument("--policy", required=True, metavar="P",
                   help="policy spec (cbgym.agents.POLICIES, learned:PATH); on a cluster task "
                        "a router spec (cbgym.agents.routing.ROUTERS, learned-router:NAME)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], metavar="S",
                   help="seeds (randomised policies and random actions); a window's result is "
                        "its mean over them")
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    p.set_defaults(handler=run, subparser=p)
    return p


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from cbgym.bench import check_policy
    from cbgym.tasks.cluster_tasks import CLUSTER_TASKS, evaluate_cluster
    from cbgym.tasks.evaluate import evaluate

    cluster = args.task in CLUSTER_TASKS
    try:
        if cluster:
            from cbgym.agents.routing import make_router
            from cbgym.cluster.routing import RouterContext

            make_router(args.policy).reset(RouterContext(
                config=CLUSTER_TASKS[args.task].cluster_config()))
        else:
            check_policy(args.policy)
    except (ValueError, TypeError, ImportError) as exc:
        parser.error(f"--policy: {exc}")
    if any(s < 0 for s in args.seeds):
        parser.error("--seeds must be integers >= 0")
    score_it = evaluate_cluster if cluster else evaluate
    ev = score_it(args.task, args.policy, seeds=tuple(args.seeds))
    table = ev.table[COLUMNS]
    if args.json:
        print(json.dumps({"task": args.task, "policy": args.policy, "seeds": args.seeds,
                          "best_reference": ev.best_reference,
                          "best_heuristic": ev.best_heuristic,
                          "rows": table.reset_index().to_dict(orient="records")}, indent=1))
        return 0
    score, best = ev.score(), ev.best_heuristic
    d = ev.versus(best).difference
    print(f"task {args.task}: {len(ev.starts)} test windows x {len(args.seeds)} seed(s), "
          f"load {ev.task.test_load}; best reference {ev.best_reference}")
    print(table.round(3).to_string())
    print(f"{args.policy}: normalized score {score.mean:.3f} "
          f"[{score.low:.3f}, {score.high:.3f}] (95%); diff_vs = {args.policy} minus the row")
    what = "rule" if cluster else "content-blind heuristic"
    print(f"{args.policy} minus the best {what} ({best}): {d.mean:+.1f} "
          f"[{d.low:+.1f}, {d.high:+.1f}] goodput per window (95%)")
    return 0
