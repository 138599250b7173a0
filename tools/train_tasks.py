"""Train the shipped ``learned:<task>`` policies: one recipe for every benchmark task.

    python tools/train_tasks.py                      # every task, into runs/tasks/<task>
    python tools/train_tasks.py conv-study-overload --ship

The recipe (docs/benchmark.md, "Learned policies", says what else was tried): PPO on the
task's native vector env, warm-started by behaviour cloning (``--imitate``) of the task's best
content-blind heuristic (chosen on its validation windows; demonstrated on its train windows),
then fine-tuned with a small learning
rate, a long horizon and narrow exploration. ``--ship`` copies each run into the package
(``tools/ship_checkpoint.py``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # train.py, tools/

import train  # noqa: E402
from cbgym.tasks import TASKS, get  # noqa: E402

RECIPE = ["--imitate-epochs", "15", "--learning-rate", "5e-5", "--gamma", "0.999",
          "--log-std-init", "-2.5", "--cap-log-std-init", "-3.5", "--total-timesteps",
          "500000", "--eval-freq", "0", "--no-progress-bar"]


# what a task's run adds to the recipe: the noisy neighbour's queue holds hundreds of
# requests, and the 16 oldest are not where its capped reference picks from (validation:
# 601 with the oldest, 711 with the smallest prompts visible)
EXTRA = {"tenants-noisy-neighbour": ["--window-rule", "smallest_prompt"]}


def imitated(task: str) -> str:
    """The heuristic a task's policy starts from: its tuned reference, or cb-sjf-work-shed
    (the best content-blind reference on every task's validation windows)."""
    refs = get(task).references
    return refs[0] if refs else "cb-sjf-work-shed"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("tasks", nargs="*", metavar="TASK", help=f"default: {', '.join(TASKS)}")
    parser.add_argument("--ship", action="store_true", help="ship each run as learned:<task>")
    parser.add_argument("--out", type=Path, default=Path("runs/tasks"))
    args = parser.parse_args()
    for task in args.tasks or list(TASKS):
        if task not in TASKS:
            parser.error(f"unknown task {task!r}; known: {', '.join(TASKS)}")
    for task in args.tasks or list(TASKS):
        argv = ["--task", task, "--imitate", imitated(task), "--output-dir",
                str(args.out / task), *RECIPE, *EXTRA.get(task, [])]
        print("python train.py " + " ".join(argv), flush=True)
        train.main(argv)
        if args.ship:
            from ship_checkpoint import main as ship

            ship([task, str(args.out / task), "--description",
                  f"PPO on {task}'s train windows, warm-started by behaviour cloning of "
                  f"{imitated(task)} (tools/train_tasks.py)"])


if __name__ == "__main__":
    main()
