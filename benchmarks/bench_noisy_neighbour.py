"""The noisy neighbour: an interactive tenant beside a long-prompt batch tenant on one engine.

The same experiment as ``cbgym bench --noisy-neighbour`` (:mod:`cbgym.noisy_neighbour`),
with its wall time per policy: azure-conv-2023 as the interactive tenant beside
azure-code-2023 as the batch tenant, each tenant's SLO attainment and p99 TTFT under FCFS,
tenant-aware priority, strict tiers, VTC, DRR and WFQ, and the interactive tenant alone.

    python benchmarks/bench_noisy_neighbour.py [--requests 4000] [--load 1.0] [--share 0.7]
"""

from __future__ import annotations

import argparse

import cbgym
from cbgym.noisy_neighbour import format_table, noisy_neighbour_mix, noisy_neighbour_table
from cbgym.workload import load_trace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--load", type=float, default=1.0)
    ap.add_argument("--share", type=float, default=0.7)
    ap.add_argument("--preset", default="llama-3.1-8b/a100-80gb")
    args = ap.parse_args()
    if args.requests < 100 or not args.load > 0 or not 0 < args.share < 1:
        ap.error("--requests >= 100, --load > 0, 0 < --share < 1")
    engine = cbgym.EngineConfig(preset=args.preset)
    mixed, mu = noisy_neighbour_mix(load_trace("azure-conv-2023"), load_trace("azure-code-2023"),
                                    args.requests, args.share, args.load, engine)
    print(f"{len(mixed)} requests, {args.preset}, load {args.load} of {mu:.2f} req/s")
    table = noisy_neighbour_table(mixed, engine)
    print(format_table(table))
    for row in table.dropna(subset=["wall_s"]).itertuples(index=False):
        print(f"{row.policy:<14} {row.wall_s:.2f} s")


if __name__ == "__main__":
    main()
