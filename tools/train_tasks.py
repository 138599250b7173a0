"""Train the shipped ``learned:<task>`` policies: two recipes, each task's own.

    python tools/train_tasks.py                      # every task, into runs/tasks/<task>
    python tools/train_tasks.py conv-study-overload --ship
    python tools/train_tasks.py code-vllm-bursty --recipe ppo

The PPO recipe (docs/benchmark.md, "Learned policies", says what else was tried): PPO on the
task's native vector env, warm-started by behaviour cloning (``--imitate``) of the task's best
content-blind heuristic (chosen on its validation windows; demonstrated on its train windows),
then fine-tuned with a small learning
rate, a long horizon and narrow exploration. The ES recipe (``tools/train_es.py``): CMA-ES on
the deterministic policy's goodput from the residual prior of that heuristic. ``--recipe
shipped`` (the default) runs, per task, the one its shipped policy came from: the one that
scored higher on the task's validation windows. ``--ship`` copies each run into the package
(``tools/ship_checkpoint.py``). A task in ``PRIOR`` runs PPO from the residual prior of a
heuristic (``train.py --prior``) instead of a clone, with its own settings in place of the
recipe's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # train.py, tools/

import train  # noqa: E402
from cbgym.tasks import TASKS, get  # noqa: E402

RECIPE = {"--imitate-epochs": "15", "--learning-rate": "5e-5", "--gamma": "0.999",
          "--log-std-init": "-2.5", "--cap-log-std-init": "-3.5", "--total-timesteps": "500000",
          "--eval-freq": "0"}


# what a task's run adds to the recipe: the noisy neighbour's queue holds hundreds of
# requests, and the 16 oldest are not where its capped reference picks from (validation:
# 601 with the oldest, 711 with the smallest prompts visible)
EXTRA = {"tenants-noisy-neighbour": ["--window-rule", "smallest_prompt"],
         "tenants-servegen": ["--window-rule", "smallest_prompt"]}

# the tasks whose shipped policy came from the direct search, and its settings there (its
# validation beat the PPO recipe's on each: docs/benchmark.md, "Direct policy search";
# tenants-servegen: 985.6 against 939.9)
ES = {  # (its run stopped at the 55-minute budget after 63 generations; generation 40 chose)
      "tenants-noisy-neighbour": ["--prior", "cb-sjf-work-serial-tiers:24", "--generations",
                                  "100", "--time-budget-min", "55"],
      # (run s3: 16 generations in its 30-minute budget; generation 10 chose)
      "conv-study-overload": ["--prior", "cb-sjf-work-fit:32", "--generations", "16",
                              "--sigma", "0.06", "--seed", "3"],
      # (run s3: 55 generations in its 45-minute budget; the last chose)
      "conv-vllm-kv-pressure": ["--prior", "cb-sjf-work-fit", "--generations", "55",
                                "--sigma", "0.06", "--seed", "3",
                                "--window-rule", "smallest_prompt"],
      "code-vllm-overload": ["--generations", "150", "--windows", "32", "--select-loads",
                             "1.1", "1.3", "1.5", "--window-rule", "smallest_prompt",
                             "--sigma", "0.06", "--seed", "3"],
      "code-vllm-bursty": ["--generations", "100", "--windows", "32",
                           "--select-loads", "0.6", "0.8", "1.0"],
      # (run s3: 196 generations in its 75-minute budget, the cores shared; 180 chose)
      "tenants-servegen": ["--prior", "cb-sjf-work-fit-tiers:48", "--generations", "196",
                           "--sigma", "0.06", "--seed", "3"],
      # (run s3: 32 generations in its 95-minute budget; generation 30 chose)
      "prefix-conv-mooncake": ["--generations", "32", "--no-prefix-inputs", "--sigma", "0.06",
                               "--seed", "3", "--window-rule", "smallest_prompt"]}


# the tasks whose PPO run starts from a heuristic prior (residual, train.py --prior) instead
# of a clone, with what else their run changes: conv-study-interactive's prior is the
# stronger rule (cb-sjf-work-fit), which cloning then PPO had not reached (docs/benchmark.md)
PRIOR = {"conv-study-interactive": ("cb-sjf-work-fit", {"--target-kl": "0.002",
                                                        "--total-timesteps": "250000",
                                                        "--eval-freq": "50000"})}


def imitated(task: str) -> str:
    """The heuristic a task's policy starts from: its tuned reference, or cb-sjf-work-shed
    (the rule the shipped policies were searched from; cb-sjf-work-fit, added since, is
    stronger on the study engine's tasks: docs/benchmark.md)."""
    refs = get(task).references
    return refs[0] if refs else "cb-sjf-work-shed"


def ppo_argv(task: str) -> tuple[list[str], str]:
    """train.py's arguments for a task's PPO run (its output folder apart), and what the run
    is, for the shipped card: the recipe from a clone, or from a task's ``PRIOR`` with its own
    settings in place of the recipe's."""
    prior, own = PRIOR.get(task, ("", {}))
    start = ["--prior", prior] if prior else ["--imitate", imitated(task)]
    settings = [x for kv in {**RECIPE, **own}.items() for x in kv]
    what = (f"PPO on {task}'s train windows, from the residual prior of {prior}" if prior
            else f"PPO on {task}'s train windows, warm-started by behaviour cloning of "
            f"{imitated(task)}")
    return ["--task", task, *start, *settings, "--no-progress-bar"], what


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("tasks", nargs="*", metavar="TASK", help=f"default: {', '.join(TASKS)}")
    parser.add_argument("--ship", action="store_true", help="ship each run as learned:<task>")
    parser.add_argument("--out", type=Path, default=Path("runs/tasks"))
    parser.add_argument("--recipe", choices=("shipped", "ppo", "es"), default="shipped",
                        help=f"shipped: each task's own (ES for {', '.join(ES)}, else PPO)")
    args = parser.parse_args()
    for task in args.tasks or list(TASKS):
        if task not in TASKS:
            parser.error(f"unknown task {task!r}; known: {', '.join(TASKS)}")
    for task in args.tasks or list(TASKS):
        es = args.recipe == "es" or (args.recipe == "shipped" and task in ES)
        out = ["--output-dir", str(args.out / task), *EXTRA.get(task, [])]
        if es:
            import train_es

            argv = ["--task", task, "--no-progress-bar", *ES.get(task, []), *out]
            print("python tools/train_es.py " + " ".join(argv), flush=True)
            train_es.main(argv)
            given = ES.get(task, [])
            prior = given[given.index("--prior") + 1] if "--prior" in given \
                else train_es.default_prior(task)
            what = (f"CMA-ES on {task}'s train windows from the residual prior of {prior}, "
                    "chosen on its validation windows")
        else:
            argv, what = ppo_argv(task)
            argv += out
            print("python train.py " + " ".join(argv), flush=True)
            train.main(argv)
        if args.ship:
            from ship_checkpoint import main as ship

            ship([task, str(args.out / task), "--description", f"{what} (tools/train_tasks.py)"])


if __name__ == "__main__":
    main()
