"""Engine speed, with references measured in the same run.

1. All of azure-conv-2023 at rho = 0.9 under FCFS on llama-2-7b/a100-80gb: wall seconds,
   iterations per second, peak memory (goal: at most 0.4 s and 300 MB on an idle 2-core
   machine; Vidur needs 73 s for this run).
2. The CB-SJF-Work study's engine mode on 3,000 conv requests at rho = 0.9, under FCFS and
   SJF-Ctx, beside a plain heap-based Python implementation of that mode carried here (an
   event-driven loop that jumps over decode stretches): cbgym should be at least 5x faster.
   Both must agree on every request's first-token and finish time.

The trace is read from CBGYM_TRACE_DIR (or the user cache); without it, the synthetic-conv
workload of the same size stands in.

    python benchmarks/bench_engine.py [--trace NAME] [--load 0.9] [--preset P] [--repeat 3]
"""

from __future__ import annotations

import argparse
import heapq
import math
import resource
import time

import numpy as np

import cbgym
from cbgym.capacity import measure_capacity, scale_to_load
from cbgym.engine.config import PAPER_COST, PAPER_KV_TOKENS
from cbgym.workload import Trace, load_trace


def reference_study(trace: Trace, order: str, max_seqs: int = 256) -> tuple[np.ndarray, ...]:
    """The study's engine mode in plain Python: (first token, finish) times per request.

    A prefill step admits waiting requests in key order while a sequence slot is free and
    the KV for prompt + output can be reserved; otherwise every running request decodes one
    token. Decode stretches are jumped over to the next completion or arrival (a heap of
    completion steps), with the clock summed step by step as the engine does.
    """
    arrival, prompt, output = trace.arrival_s, trace.prompt_tokens, trace.output_tokens
    n, cost, kv = len(arrival), PAPER_COST, PAPER_KV_TOKENS
    key = prompt if order == "sjf-ctx" else np.arange(n)
    first = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    waiting: list[tuple[int, int]] = []
    done_at: list[tuple[int, int]] = []  # (decode step at which it finishes, id)
    free, now, step, i, ended = kv, 0.0, 0, 0, 0
    while ended < n:
        while i < n and arrival[i] <= now:
            if prompt[i] + output[i] > kv:  # can never be reserved: shed at arrival
                finish[i] = arrival[i]
                ended += 1
            else:
                heapq.heappush(waiting, (int(key[i]), i))
            i += 1
        batch = []
        while waiting and len(done_at) + len(batch) < max_seqs:
            rid = waiting[0][1]
            need = int(prompt[rid] + output[rid])
            if need > free:
                break
            heapq.heappop(waiting)
            free -= need
            batch.append(rid)
        if batch:  # a prefill step: each admitted request samples its first token
            now += cost.prefill_base_s + cost.prefill_per_token_s * int(prompt[batch].sum())
            for rid in batch:
                first[rid] = now
                if output[rid] == 1:
                    finish[rid] = now
                    free += int(prompt[rid] + 1)
                    ended += 1
                else:
                    heapq.heappush(done_at, (step + int(output[rid]) - 1, rid))
            continue
        if not done_at:  # idle until the next arrival
            now = max(now, float(arrival[i]))
            continue
        # a decode stretch: up to the next completion, or the step that passes an arrival
        dt = cost.base_s + cost.decode_per_seq_s * len(done_at)
        k = done_at[0][0] - step
        t = now
        for j in range(1, k + 1):
            t += dt
            if i < n and t >= arrival[i]:  # it may be admitted at the next step
                k = j
                break
        now, step = t, step + k
        while done_at and done_at[0][0] == step:
            _, rid = heapq.heappop(done_at)
            finish[rid] = now
            free += int(prompt[rid] + output[rid])
            ended += 1
    return first, finish


def bench_full_trace(trace: Trace, load: float, preset: str, repeat: int) -> None:
    engine = cbgym.EngineConfig(preset=preset)
    t0 = time.perf_counter()
    mu = measure_capacity(trace, engine)
    scaled = scale_to_load(trace, load, engine, capacity_rps=mu)
    t_cap = time.perf_counter() - t0
    wall, res = min(((r.meta["wall_seconds"], r) for r in (
        cbgym.simulate(scaled, policy="fcfs", engine=engine) for _ in range(repeat))),
        key=lambda x: x[0])
    s = res.summary()
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"1. {trace.name}: {len(trace)} requests, rho={load}, mu={mu:.2f} req/s "
          f"(measured in {t_cap:.2f} s); {preset}, {engine.num_kv_blocks} KV blocks, fcfs")
    print(f"   wall seconds     {wall:.3f}   (best of {repeat}; goal <= 0.4 s; Vidur 73 s)")
    print(f"   iterations       {s['iterations']:.0f}  ->  {s['iterations'] / wall:,.0f}/s")
    print(f"   simulated        {s['sim_seconds']:.0f} s, {s['num_shed']:.0f} shed, "
          f"{s['num_preemptions']:.0f} preemptions")
    print(f"   peak memory      {rss_mb:.0f} MB (max RSS of this process; goal <= 300 MB)")


def bench_study(trace: Trace, load: float, repeat: int) -> None:
    engine = cbgym.EngineConfig(preset="cbsjf-paper")
    window = scale_to_load(trace.window(0, 3000), load, engine)
    print(f"2. study engine mode, {len(window)} requests of {trace.name}, rho={load}")
    for policy in ("fcfs", "sjf-ctx"):
        ours = min((cbgym.simulate(window, policy=policy, engine=engine)
                    for _ in range(repeat)), key=lambda r: r.meta["wall_seconds"])
        walls = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            first, finish = reference_study(window, policy)
            walls.append(time.perf_counter() - t0)
        req = ours.requests
        same = (np.allclose(req["first_token_s"], first, rtol=1e-9, equal_nan=True)
                and np.allclose(req["finish_s"], finish, rtol=1e-9, equal_nan=True))
        w_ours, w_ref = ours.meta["wall_seconds"], min(walls)
        print(f"   {policy:8s} cbgym {w_ours * 1e3:7.1f} ms   heap reference "
              f"{w_ref * 1e3:7.1f} ms   speed-up {w_ref / w_ours:5.1f}x (goal >= 5x)   "
              f"same times: {same}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="azure-conv-2023")
    ap.add_argument("--load", type=float, default=0.9)
    ap.add_argument("--preset", default="llama-2-7b/a100-80gb")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if not (args.load > 0 and math.isfinite(args.load)) or args.repeat < 1:
        ap.error("--load must be a finite number > 0 and --repeat >= 1")
    try:
        trace = load_trace(args.trace, download=False)
    except FileNotFoundError:
        print(f"{args.trace} not found locally; using synthetic-conv instead")
        trace = load_trace("synthetic-conv")
    cbgym.simulate(trace.window(0, 50), engine=args.preset)  # load the compiled kernels
    bench_full_trace(trace, args.load, args.preset, args.repeat)
    bench_study(trace, args.load, args.repeat)


if __name__ == "__main__":
    main()
