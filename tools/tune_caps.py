"""Tune the running cap of ``cb-sjf-work-shed:CAP`` for each benchmark task, on its
validation windows only (never its test windows).

    python tools/tune_caps.py                      # every task
    python tools/tune_caps.py conv-study-overload  # one
    python tools/tune_caps.py --policy cb-sjf-work-fit conv-study-overload

Prints the mean validation goodput of each cap of :data:`CAPS` (and of no cap beyond the
engine's) and the best one: what ``Task.references`` records in ``cbgym/tasks/registry.py``.
"""

from __future__ import annotations

import argparse

from cbgym.agents.slo_edf import CAPPED_RULES
from cbgym.tasks import TASKS
from cbgym.tasks.evaluate import evaluate

CAPS = (4, 6, 8, 10, 12, 16, 20, 24, 28, 32, 48, 64, 96, 128)


POLICIES = tuple(CAPPED_RULES)  # the capped rules


def tune(task: str, policy: str = POLICIES[0]) -> tuple[str, dict[str, float]]:
    """(best spec, mean validation goodput per spec) for ``task``."""
    specs = (policy, *(f"{policy}:{c}" for c in CAPS))
    ev = evaluate(task, specs[0], references=specs[1:], split="validation")
    means = {s: float(ev.goodput[s].mean()) for s in specs}
    return max(specs, key=lambda s: means[s]), means  # ties: the first (no cap, then smaller)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("tasks", nargs="*", choices=[[], *TASKS], metavar="TASK",
                        help=f"tasks to tune (default: all of {', '.join(TASKS)})")
    parser.add_argument("--policy", choices=POLICIES, default=POLICIES[0],
                        help="the rule whose cap is tuned")
    args = parser.parse_args()
    for task in args.tasks or list(TASKS):
        best, means = tune(task, args.policy)
        row = " ".join(f"{s.partition(':')[2] or 'none'}={g:.1f}" for s, g in means.items())
        print(f"{task}: {row}\n  best: {best}", flush=True)


if __name__ == "__main__":
    main()
