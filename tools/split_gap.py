"""A shipped policy against a heuristic on each split of a task: train, validation and test.

    python tools/split_gap.py --task code-vllm-bursty --train-windows 30

Plays ``learned:<task>`` (or ``--policy``) and the reference on evenly spaced windows of each
split at the task's test load, and prints the paired difference per split (95% interval over
windows, wins / losses). The default reference is the task's first reference, else
``cb-sjf-work-shed``: the rule the shipped policies were searched from, and the best
content-blind heuristic on every single-instance task until ``cb-sjf-work-fit`` (give
``--reference cb-sjf-work-fit[:CAP]`` for it; ``cbgym evaluate`` finds the best on the test
windows).

The train windows are in-sample for a policy trained on them, so a gap that shrinks from train
to validation to test reads as overfitting or as the trace changing over time. Windows overlap
where a split is short for their number (a note says so): their intervals then count shared
requests as independent and are too narrow. The test split is what ``cbgym evaluate``
reports; leave it out (``--splits train validation``) while choosing a policy.
"""

from __future__ import annotations

import argparse

from cbgym.tasks import TASKS, get
from cbgym.tasks.evaluate import play_windows
from cbgym.tasks.scoring import paired_difference

SPLITS = ("train", "validation", "test")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--task", required=True, choices=sorted(TASKS), metavar="TASK",
                    help=f"a single-instance task: {', '.join(sorted(TASKS))}")
    ap.add_argument("--policy", default="", help="policy spec (default: learned:<task>)")
    ap.add_argument("--reference", default="",
                    help="heuristic spec (default: the task's first reference, else "
                         "cb-sjf-work-shed)")
    ap.add_argument("--train-windows", type=int, default=30,
                    help="windows of the train split (validation and test: the task's own)")
    ap.add_argument("--splits", nargs="+", choices=SPLITS, default=list(SPLITS))
    args = ap.parse_args(argv)
    args.splits = list(dict.fromkeys(args.splits))  # each split once, in the order given
    if args.train_windows < 2:
        ap.error(f"--train-windows {args.train_windows}: expected at least 2 (an interval "
                 "needs two windows)")
    from cbgym.agents import make_policy

    for flag in ("policy", "reference"):  # a bad spec fails here, before any window is played
        if getattr(args, flag):
            try:
                make_policy(getattr(args, flag))
            except (ValueError, ImportError) as exc:
                ap.error(f"--{flag} {getattr(args, flag)}: {exc}")
    return args


def main(argv: list[str] | None = None) -> dict[str, object]:
    args = parse(argv)
    from cbgym.capacity import measure_capacity
    from cbgym.workload import load_trace

    t = get(args.task)
    policy = args.policy or f"learned:{t.name}"
    reference = args.reference or (t.references[0] if t.references else "cb-sjf-work-shed")
    trace = load_trace(t.trace)
    engine = t.engine_config()
    mu = measure_capacity(trace, engine)
    out: dict[str, object] = {}
    for split in args.splits:
        starts = t.starts(len(trace), split, args.train_windows if split == "train" else None)
        a = play_windows(t, policy, trace, starts, engine, mu, 0)[0]
        b = play_windows(t, reference, trace, starts, engine, mu, 0)[0]
        d = paired_difference(a, b)
        iv = d.difference
        print(f"{t.name} {split} ({len(starts)} windows, load {t.test_load:g}): {policy} "
              f"{a.mean():.1f}, {reference} {b.mean():.1f}, difference {iv.mean:+.1f} "
              f"[{iv.low:+.1f}, {iv.high:+.1f}] (wins {d.wins}, ties {d.ties}, losses "
              f"{d.losses})", flush=True)
        gap = min(b - a for a, b in zip(starts, starts[1:], strict=False)) if len(starts) > 1 \
            else t.episode_requests
        if gap < t.episode_requests:
            print(f"  (these windows overlap: starts {gap} requests apart, {t.episode_requests}"
                  "-request windows; the interval counts shared requests as independent)")
        out[split] = d
    return out


if __name__ == "__main__":
    main()
