"""Train the CB-SJF-Work study's output-length predictor on each 2023 Azure trace and ship it.

Each predictor is fitted on its trace's first 40% of requests (served once under FCFS on the
study's engine at rho 0.9, features taken at each arrival) and written to
``cbgym/agents/predictors/<trace>.npz`` with its split and accuracy; the accuracy on the other
60% is printed. Needs the real traces and scikit-learn (``pip install "cbgym[predict]"``):

    CBGYM_TRACE_DIR=../shared/traces python tools/train_predictor.py [--fraction 0.4]
"""

from __future__ import annotations

import argparse
import json

from cbgym.agents.predictor import SHIPPED, train
from cbgym.workload import load_trace

TRACES = ("azure-conv-2023", "azure-code-2023")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fraction", type=float, default=0.4, help="training split (leading)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    SHIPPED.mkdir(exist_ok=True)
    for name in TRACES:
        pred = train(load_trace(name), train_fraction=args.fraction, seed=args.seed)
        path = pred.save(SHIPPED / f"{name}.npz")
        acc = pred.meta["held_out_accuracy"]
        print(f"{name}: {len(pred.tree_start) - 1} trees, {len(pred.value)} nodes -> {path}")
        print("  held out:", json.dumps({k: round(v, 4) for k, v in acc.items()}))


if __name__ == "__main__":
    main()
