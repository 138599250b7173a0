"""The deflection paper's setting: 2P2D DeepSeek-V2-Lite on A100s under bursty traces.

"Towards Load-Aware Prefill Deflection for Disaggregated LLM Serving" (Kairos, arXiv
2607.02043) reports, on 2 prefill + 2 decode A100 nodes serving DeepSeek-V2-Lite under
bursty heavy-tailed production-style traces: prefill execution is only 2-23% of P95 TTFT
(queueing and the KV transfer make the rest), and Kairos cuts P95 TTFT by up to 81% and
raises SLO attainment by up to 79% over disaggregated schedulers. This script measures the
same quantities on the Azure 2023 traces (code: inter-arrival CV 13; conv), at several loads,
for ``always-disaggregate``, ``dynamo``, ``kairos``, ``kairos-transfer`` and
``never-disaggregate``, and prints the tables of ``docs/cluster.md``.

Load: relative to twice one instance's measured capacity (the two decode instances; the
study's burst measurement, ``cbgym.measure_capacity``). Load reports every 100 ms (the
paper's). SLO: TTFT 2 s, TPOT 100 ms, TBT (worst gap between tokens) 200 ms. TTFT parts are
those of ``cbgym.cluster.results``; "prefill share of P95" is prefill compute / TTFT averaged
over the requests at or above the P95 TTFT.

    python benchmarks/bench_deflection.py [--traces azure-code-2023,azure-conv-2023]
        [--loads 0.4,0.6,0.8,1.0]
"""

from __future__ import annotations

import argparse
import time

import pandas as pd

import cbgym
from cbgym.capacity import measure_capacity, scale_to_load
from cbgym.cluster import ClusterConfig
from cbgym.cluster.run import serve
from cbgym.metrics import SLO

PRESET = "deepseek-v2-lite/a100-80gb"
ROUTERS = ("always-disaggregate", "dynamo", "kairos", "kairos-transfer", "never-disaggregate")
SLO_TARGETS = SLO(ttft_s=2.0, tpot_s=0.1, tbt_s=0.2)


def tail_parts(req: pd.DataFrame) -> dict[str, float]:
    """Mean share of each TTFT part over the requests at or above the P95 TTFT."""
    fin = req[req["status"] == "finished"]
    tail = fin[fin["ttft_s"] >= fin["ttft_s"].quantile(0.95)]
    prefill = (tail["ttft_prefill_s"] / tail["ttft_s"]).mean()
    queue = (tail["ttft_queue_s"] / tail["ttft_s"]).mean()
    transfer = ((tail["ttft_transfer_s"] + tail["ttft_decode_wait_s"]
                 + tail["ttft_first_step_s"]) / tail["ttft_s"]).mean()
    return {"prefill": prefill, "queue": queue, "transfer+decode side": transfer}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default="azure-code-2023,azure-conv-2023")
    ap.add_argument("--loads", default="0.4,0.6,0.8,1.0")
    args = ap.parse_args()
    try:
        loads = [float(x) for x in args.loads.split(",")]
    except ValueError:
        ap.error(f"--loads: expected comma-separated numbers, got {args.loads!r}")
    if not all(x > 0 for x in loads):
        ap.error("--loads must be > 0")
    engine = cbgym.EngineConfig(preset=PRESET)
    cfg = ClusterConfig.preset(f"2p2d:{PRESET}", load_report_interval_s=0.1)
    wall = time.perf_counter()
    for name in args.traces.split(","):
        trace = cbgym.load_trace(name)
        mu = measure_capacity(trace, engine)
        print(f"\n#### {name} ({len(trace)} requests; one instance's capacity "
              f"{mu:.2f} req/s)\n")
        print("| load | router | P95 TTFT (s) | SLO attainment | deflected | prefill share "
              "of P95 | queue share | transfer + decode-side share |")
        print("|---|---|---|---|---|---|---|---|")
        for load in loads:
            tr = scale_to_load(trace, load, engine, capacity_rps=2 * mu)
            base = None
            for router in ROUTERS:
                res = serve(tr, cfg, router, slo=SLO_TARGETS)
                req = res.requests
                p95 = float(req.loc[req["status"] == "finished", "ttft_s"].quantile(0.95))
                att = res.summary()["slo_attainment"]
                parts = tail_parts(req)
                if router == "always-disaggregate":
                    base = (p95, att)
                note = ""
                if base is not None and router != "always-disaggregate":
                    note = (f" ({100 * (p95 / base[0] - 1):+.0f}%)")
                print(f"| {load:g} | {router} | {p95:.2f}{note} | {att:.3f} | "
                      f"{req['deflected'].mean():.2f} | {parts['prefill']:.2f} | "
                      f"{parts['queue']:.2f} | {parts['transfer+decode side']:.2f} |")
    print(f"\n({time.perf_counter() - wall:.0f} s)")


if __name__ == "__main__":
    main()
