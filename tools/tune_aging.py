"""A Ray Tune sweep of CB-SJF-Work's aging weight, scored by a task's normalized score on its
validation windows (the test windows stay unseen).

    python tools/tune_aging.py --task conv-study-overload --weights 0.1 0.5 1 2 4
    python tools/tune_aging.py --task code-vllm-bursty --base sjf-ctx --address auto

Each trial is one :func:`cbgym.tasks.evaluate.evaluate` of ``<base>-aging:<weight>`` with
``split="validation"``; it reports the normalized score (0: random actions, 1: the best
reference), its 95% interval and the goodput. ``--references`` limits the references the
score is relative to (default: the task's full set, as ``docs/benchmark.md`` scores). Needs
the ``ray`` extra (``pip install 'cbgym[ray]'``: Tune).
"""

from __future__ import annotations

import argparse
import os
from typing import Any


def trial(config: dict[str, Any]) -> None:
    """One Tune trial: the policy's validation score."""
    from ray import tune

    from cbgym.tasks.evaluate import evaluate

    policy = f"{config['base']}-aging:{config['weight']:g}"
    refs = tuple(config["references"]) if config["references"] else None
    ev = evaluate(config["task"], policy, references=refs, split="validation")
    score = ev.score()
    tune.report({"score": score.mean, "score_low": score.low, "score_high": score.high,
                 "goodput": float(ev.goodput[ev.policy].mean()), "policy": policy})


def sweep(task: str, weights: list[float], base: str = "cb-sjf-work",
          references: list[str] | None = None, storage: str | None = None) -> Any:
    """Run the grid over ``weights``; Tune's ResultGrid (best by score). ``storage``: where
    Tune keeps its results (default: ``~/ray_results``)."""
    from ray import tune

    space = {"task": task, "base": base, "references": references or [],
             "weight": tune.grid_search(list(weights))}
    tuner = tune.Tuner(tune.with_resources(trial, {"cpu": 1}), param_space=space,
                       tune_config=tune.TuneConfig(metric="score", mode="max"),
                       run_config=tune.RunConfig(verbose=0, storage_path=storage))
    return tuner.fit()


def main() -> None:
    from cbgym.agents import POLICIES
    from cbgym.tasks import TASKS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="conv-study-overload", choices=sorted(TASKS))
    ap.add_argument("--weights", type=float, nargs="+", default=[0.25, 1.0, 4.0])
    ap.add_argument("--base", default="cb-sjf-work", help="a key policy with an -aging form")
    ap.add_argument("--references", nargs="*", default=None)
    ap.add_argument("--address", default=None, help="a Ray cluster to join (default: local)")
    args = ap.parse_args()
    if f"{args.base}-aging" not in POLICIES:
        ap.error(f"--base: {args.base!r} has no aging form ({args.base}-aging)")
    if any(not w > 0 for w in args.weights):
        ap.error("--weights must be > 0")
    import ray

    env_vars = {k: os.environ[k] for k in ("CBGYM_TRACE_DIR",) if k in os.environ}
    ray.init(address=args.address, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": env_vars} if env_vars else None)
    try:
        grid = sweep(args.task, args.weights, args.base, args.references)
        for r in sorted(grid, key=lambda r: r.config["weight"]):
            m = r.metrics
            print(f"{m['policy']:28s} score {m['score']:+.2f} [{m['score_low']:+.2f}, "
                  f"{m['score_high']:+.2f}]  goodput {m['goodput']:.1f}")
        best = grid.get_best_result()
        print(f"best on validation: {best.metrics['policy']} ({best.metrics['score']:+.2f})")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
