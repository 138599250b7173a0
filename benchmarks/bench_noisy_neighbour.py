"""The noisy neighbour: an interactive tenant beside a long-prompt batch tenant on one engine.

azure-conv-2023 is the interactive tenant (tier ``interactive``: 450 ms / 40 ms) and
azure-code-2023 the batch tenant (tier ``batch``; its prompts are twice as long), mixed at
``--share`` of the requests for conv (``cbgym.workload.tenants.mix_tenants``) and offered at
``--load`` of the engine's capacity on the mix. Each tenant's SLO attainment and p99 TTFT,
and Jain's index of their attainments, under FCFS, vLLM's priority policy (the tier is the
priority: interactive first), VTC, DRR and WFQ (equal weights), and with the interactive
tenant alone on the engine (isolation: what it would get with no neighbour).

    python benchmarks/bench_noisy_neighbour.py [--requests 4000] [--load 1.0] [--share 0.7]
"""

from __future__ import annotations

import argparse
import time

import cbgym
from cbgym.capacity import measure_capacity, scale_to_load
from cbgym.fairness import jain_index, tenant_table
from cbgym.workload import load_trace
from cbgym.workload.tenants import Tenant, mix_tenants, tier_slos


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
    n_conv = int(args.requests * args.share)
    conv = load_trace("azure-conv-2023").window(0, n_conv)
    code = load_trace("azure-code-2023").window(0, args.requests - n_conv)
    chat = Tenant("chat", args.share, tier="interactive")
    batch = Tenant("batch", 1 - args.share, tier="batch")
    # the mix at one request per second, then scaled to the load on its own capacity
    mixed = mix_tenants([(chat, conv), (batch, code)], rate_rps=1.0)
    mu = measure_capacity(mixed, engine)
    mixed = scale_to_load(mixed, args.load, engine, capacity_rps=mu)
    slo = tier_slos()
    print(f"{len(mixed)} requests ({n_conv} chat, {len(mixed) - n_conv} batch), {args.preset}, "
          f"load {args.load} of {mu:.2f} req/s")
    print(f"{'policy':<12}{'chat attain':>12}{'chat p99 TTFT':>15}{'batch attain':>14}"
          f"{'batch p99 TTFT':>16}{'Jain':>7}{'wall s':>8}")
    for policy in ("fcfs", "priority", "vtc", "drr", "wfq"):
        t = time.perf_counter()
        res = cbgym.simulate(mixed, policy=policy, engine=engine, slo=slo)
        wall = time.perf_counter() - t
        tab = tenant_table(res)
        att = tab["slo_attainment"]
        print(f"{policy:<12}{att[0]:>12.3f}{tab['ttft_p99_s'][0]:>15.2f}{att[1]:>14.3f}"
              f"{tab['ttft_p99_s'][1]:>16.2f}{jain_index(att.to_numpy()):>7.3f}{wall:>8.2f}")
    # isolation: the chat tenant's requests alone, at the same times
    alone = mixed.window(0, len(mixed))
    keep = alone.tenant == 0
    only = cbgym.Trace.from_arrays(alone.arrival_s[keep], alone.prompt_tokens[keep],
                                   alone.output_tokens[keep], tenant=alone.tenant[keep],
                                   slo_class=alone.slo_class[keep], rebase=False)
    tab = tenant_table(cbgym.simulate(only, policy="fcfs", engine=engine, slo=slo))
    print(f"{'chat alone':<12}{tab['slo_attainment'][0]:>12.3f}{tab['ttft_p99_s'][0]:>15.2f}")


if __name__ == "__main__":
    main()
