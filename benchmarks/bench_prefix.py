"""Prefix caching: the CB-SJF-Work study's open problem measured, and the cache's cost.

1. Speed: all of the Mooncake conversation trace (12,031 requests, 12k-token prompts) under
   FCFS on one engine, prefix caching off and on (the reference is the same run with it off):
   wall seconds, iterations per second, the token hit rate.
2. The open problem, on traces with block ids, prefix caching on. Open-loop traces
   (Mooncake): ``--windows`` windows of ``--window-requests`` requests, each scaled to every
   ``--loads`` value, rho relative to the window's capacity with caching on (the window
   released at t=0 with its block ids, FCFS). Session traces (``has_sessions``: the agent
   sessions, ``--synthetic-sessions``): the whole trace once, replayed closed loop (a turn is
   sent its think time after the previous one ends) and never rescaled: the sessions set the
   load. For each (trace, load): every policy's goodput, SLO attainment, mean normalised
   latency (E2E / output tokens), p99 TTFT and token hit rate (vLLM's counters), and the share
   of the oracle's gain over FCFS it recovers, ``100 x (FCFS - P) / (FCFS - Oracle)`` on mean
   normalised latency (the study's metric, a ratio of window means), against both the
   cache-aware oracle (``oracle-work-uncached``: true output, prefill priced on uncached
   tokens) and the study's (``oracle-work``: prompt length + true output). Where
   ``|FCFS - Oracle| < 2%`` of FCFS the ratio divides by noise: "decisions do not matter".
   Beside FCFS's realised hit rate, the replayed requests' reuse with an infinite cache
   (``prefix_reuse(...)["token_hit_fraction"]``: prompt-to-prompt), the same with each
   response's blocks cached as well (a session's next turn hits them), and the part of the
   first reused within the KV pool's size of other prompts (trace order): how much of it one
   GPU's cache captures.

    python benchmarks/bench_prefix.py [--traces mooncake-conversation,...] [--preset P]
        [--loads 0.8,0.9] [--windows 3] [--window-requests 2000] [--workers 2]
        [--synthetic-sessions RATE[,RATE...]] [--synthetic-sessions-count 1000]
        [--seed 0] [--skip-speed | --speed-only]
"""

from __future__ import annotations

import argparse
import math
import textwrap
import time
from concurrent.futures import ProcessPoolExecutor
from functools import lru_cache

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

import cbgym
from cbgym.capacity import measure_capacity, scale_to_load
from cbgym.engine.trace_setup import has_sessions, next_turn_donors
from cbgym.workload import load_trace, prefix_reuse, synthetic_sessions
from cbgym.workload.trace import Trace

POLICIES = ("fcfs", "sjf-ctx", "cb-sjf-work", "shortest-uncached-first", "hrrn-uncached",
            "cb-sjf-work-uncached", "k-lpm:4", "oracle-work", "oracle-work-uncached")
ORACLES = ("oracle-work-uncached", "oracle-work")
TINY = 0.02  # |FCFS - Oracle| below this share of FCFS: decisions do not matter
WARMUP = 0.1
CLOSED = "closed loop"
# a source: a trace name, or ("synthetic-sessions", sessions, session rate, seed)
Source = str | tuple[str, int, float, int]


def speed(preset: str) -> None:
    trace = load_trace("mooncake-conversation")
    rows = []
    for caching in (False, True):
        eng = cbgym.EngineConfig(preset=preset, enable_prefix_caching=caching)
        mu = measure_capacity(trace, eng)
        tr = scale_to_load(trace, 0.9, eng, capacity_rps=mu)
        best, res = np.inf, None
        for _ in range(2):
            t = time.perf_counter()
            res = cbgym.simulate(tr, engine=eng, policy="fcfs")
            best = min(best, time.perf_counter() - t)
        s = res.summary()
        rate = s["prefix_cache_hits"] / s["prefix_cache_queries"] if caching else 0.0
        rows.append((caching, best, s["iterations"], rate))
    ref = rows[0][1]
    print(f"1. mooncake-conversation, {preset}, rho 0.9, fcfs (best of 2)")
    for caching, wall, iters, rate in rows:
        print(f"   caching {'on ' if caching else 'off'}  {wall:7.2f} s  {iters / wall:10,.0f} "
              f"iterations/s  hit rate {rate:6.1%}  x{wall / ref:.2f} of caching off")


def label(source: Source) -> str:
    if isinstance(source, str):
        return source
    return f"synthetic-sessions@{source[2]:g}/s"


@lru_cache(maxsize=8)
def build(source: Source) -> Trace:
    if isinstance(source, str):
        return load_trace(source)
    _, count, rate, seed = source
    return synthetic_sessions(num_sessions=count, session_rate=rate, seed=seed,
                              name=f"synthetic-sessions(n={count},rate={rate:g}/s,seed={seed})")


def windows_of(source: Source, windows: int, size: int) -> list[tuple[int, int]]:
    """(start, count) of each replayed window: the whole trace, once, for a session trace."""
    trace = build(source)
    n = len(trace)
    if has_sessions(trace):
        return [(0, n)]
    count = min(size, n)
    starts = np.linspace(0, n - count, windows).astype(int) if windows > 1 else [0]
    return [(int(w), count) for w in dict.fromkeys(starts)]


def window(source: Source, start: int, count: int) -> Trace:
    trace = build(source)
    return trace if (start, count) == (0, len(trace)) else trace.window(start, count)


def engine(preset: str) -> cbgym.EngineConfig:
    return cbgym.EngineConfig(preset=preset, enable_prefix_caching=True)


def reuse_within(trace: Trace, pool_tokens: int) -> float:
    """Infinite-cache hit tokens (as :func:`prefix_reuse` counts them) whose prefix was last
    seen at most ``pool_tokens`` prompt tokens earlier (the prompts of the requests in
    between, in trace order): roughly what an LRU cache of that size could still hold."""
    block = np.asarray(trace.extra["hash_block_tokens"], np.int64)
    prompt = np.asarray(trace.prompt_tokens, np.int64)
    before = np.concatenate(([0], np.cumsum(prompt)))
    last: dict[int, int] = {}  # id -> the last request (trace order) that had it
    near = 0
    for r, ids in enumerate(trace.extra["hash_ids"]):
        k = 0  # leading ids seen before (as leading_hits counts them)
        while k < len(ids) and ids[k] in last:
            k += 1
        if k and before[r] - before[last[ids[k - 1]] + 1] <= pool_tokens:
            near += min(k * int(block[r]), int(prompt[r]))
        for h in ids:
            last[h] = r
    return float(near)


def reuse_with_responses(trace: Trace) -> float:
    """Infinite-cache hit tokens (as :func:`prefix_reuse` counts them, trace order) when a
    request's response blocks are cached too: on a session trace, the engine names the blocks
    a turn's response fills with its next turn's ids (``next_turn_donors``), so the next turn
    can hit them; :func:`prefix_reuse` counts prompt-to-prompt reuse only."""
    ids, block = trace.extra["hash_ids"], np.asarray(trace.extra["hash_block_tokens"], np.int64)
    prompt = np.asarray(trace.prompt_tokens, np.int64)
    output = np.asarray(trace.output_tokens, np.int64)
    donor = next_turn_donors(trace) if has_sessions(trace) else np.full(len(trace), -1)
    seen: set[int] = set()
    hit = 0
    for r in range(len(trace)):
        k = 0
        while k < len(ids[r]) and ids[r][k] in seen:
            k += 1
        hit += min(k * int(block[r]), int(prompt[r]))
        seen.update(ids[r])
        if donor[r] >= 0:  # the full blocks of prompt + response, named by the next turn
            seen.update(ids[donor[r]][:int((prompt[r] + output[r]) // block[r])])
    return float(hit)


def capacity(args: tuple[Source, str, int, int]) -> dict:
    """A window's capacity with caching on (released at t=0 with its block ids, FCFS), the
    cache-blind capacity (measure_capacity: no ids, so no hits) and its infinite-cache reuse."""
    source, preset, start, count = args
    trace = window(source, start, count)
    reuse = prefix_reuse(trace)
    pool = int(engine(preset).kv_capacity_tokens)
    out = {"trace": label(source), "window": start, "requests": count, "pool_tokens": pool,
           "reuse_hit_tokens": reuse["hit_tokens"], "reuse_prompt_tokens": reuse["prompt_tokens"],
           "reuse_near_tokens": reuse_within(trace, pool),
           "reuse_resp_tokens": reuse_with_responses(trace),
           "spearman": reuse["spearman_prompt_uncached"], "mu_cached": math.nan,
           "mu_blind": math.nan, "burst_hit_rate": math.nan}
    if not has_sessions(trace):
        eng = engine(preset)
        burst = cbgym.simulate(trace.with_arrivals(np.zeros(len(trace))), engine=eng,
                               policy="fcfs")
        s = burst.summary()
        out.update(mu_cached=len(trace) / burst.sim_seconds,
                   mu_blind=measure_capacity(trace, eng),
                   burst_hit_rate=s["prefix_cache_hits"] / max(s["prefix_cache_queries"], 1.0))
    return out


def cell(args: tuple[Source, str, int, int, float | None, float, str]) -> dict:
    source, preset, start, count, load, mu, policy = args
    trace = window(source, start, count)
    if load is not None:  # open loop: rescaled; a session trace is replayed closed loop as is
        trace = scale_to_load(trace, load, engine(preset), capacity_rps=mu)
    res = cbgym.simulate(trace, engine=engine(preset), policy=policy)
    s = res.summary(warmup=WARMUP)
    prompt = res.requests["prompt_tokens"].to_numpy()
    uncached = prompt - res.requests["cached_tokens"].to_numpy()
    rho = spearmanr(prompt, uncached).statistic if np.ptp(prompt) and np.ptp(uncached) else np.nan
    return {"trace": label(source), "window": start,
            "load": CLOSED if load is None else f"rho {load:g}", "policy": policy,
            "goodput_rps": s["goodput_rps"], "slo_pct": 100 * s["slo_attainment"],
            "ms_per_token": 1e3 * s["norm_latency_mean"], "ttft_p99_s": s["ttft_p99"],
            "throughput_rps": s["throughput_rps"], "spearman_run": float(rho),
            "hits": s["prefix_cache_hits"], "queries": s["prefix_cache_queries"]}


def gains(mean: pd.DataFrame) -> pd.DataFrame:
    """Each policy's gain recovered against each oracle, NaN where decisions do not matter."""
    fcfs = mean.xs("fcfs", level="policy")["ms_per_token"]
    key = mean.index.droplevel("policy")
    for oracle in ORACLES:
        gap = fcfs - mean.xs(oracle, level="policy")["ms_per_token"]
        gap = gap.where(gap.abs() >= TINY * fcfs)
        mean[f"gap_{oracle}_pct"] = (100 * gap / fcfs).reindex(key).to_numpy()
        mean[f"gain_{oracle}"] = (100 * (fcfs.reindex(key).to_numpy() - mean["ms_per_token"])
                                  / gap.reindex(key).to_numpy())
    return mean


def study(sources: list[Source], preset: str, loads: list[float], windows: int, size: int,
          workers: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    spans = {s: windows_of(s, windows, size) for s in sources}
    with ProcessPoolExecutor(workers) as pool:
        caps = pd.DataFrame(list(pool.map(capacity, [(s, preset, w, c) for s in sources
                                                     for w, c in spans[s]])))
        mu = {(t, w): m for t, w, m in zip(caps["trace"], caps["window"], caps["mu_cached"],
                                           strict=True)}
        jobs = []
        for s in sources:
            closed = has_sessions(build(s))
            for w, c in spans[s]:
                for x in [None] if closed else loads:
                    jobs += [(s, preset, w, c, x, mu[label(s), w], p) for p in POLICIES]
        frame = pd.DataFrame(list(pool.map(cell, jobs)))
    group = frame.groupby(["trace", "load", "policy"], sort=False)
    mean = group.mean(numeric_only=True).drop(columns=["window", "hits", "queries"])
    mean["hit_pct"] = 100 * group["hits"].sum() / group["queries"].sum().clip(lower=1.0)
    return gains(mean), caps


def fmt_gain(value: float) -> str:
    return "n/m" if math.isnan(value) else f"{value:6.1f}"


def say(text: str) -> None:
    print(textwrap.fill(text, 100, initial_indent="   ", subsequent_indent="   "))


def report(mean: pd.DataFrame, caps: pd.DataFrame, args: argparse.Namespace,
           sources: list[Source]) -> None:
    print(f"\n2. {args.preset}, prefix caching on")
    say(f"Open-loop traces: {args.windows} window(s) of {args.window_requests} requests, rho "
        "relative to the window's capacity with caching on (released at t=0 with its block ids, "
        "FCFS). Session traces: the whole trace, closed loop (each turn sent its think time "
        "after the previous one ends), not rescaled: the sessions set the load. First "
        f"{WARMUP:.0%} of requests (trace order) left out of latency figures; hit rates pool "
        "every run's tokens (vLLM's prefix_cache_hits / prefix_cache_queries).")
    say("gain % = 100 x (FCFS - P) / (FCFS - Oracle) on mean ms/token (E2E / output tokens), "
        "a ratio of window means: gain_cache = against oracle-work-uncached (true output, "
        "prefill priced on uncached tokens), gain_study = against oracle-work (prompt length + "
        f"true output). n/m: |FCFS - Oracle| < {TINY:.0%} of FCFS, decisions do not matter.")
    per = caps.groupby("trace", sort=False)
    summary = {}
    for (trace, load), rows in mean.groupby(level=["trace", "load"], sort=False):
        rows = rows.droplevel(["trace", "load"])
        c = per.get_group(trace)
        reuse = c["reuse_hit_tokens"].sum() / c["reuse_prompt_tokens"].sum()
        fcfs = rows.loc["fcfs"]
        print(f"\n   {trace}, {load}: {len(c)} window(s), {int(c['requests'].sum())} requests")
        near = c["reuse_near_tokens"].sum() / c["reuse_prompt_tokens"].sum()
        resp = c["reuse_resp_tokens"].sum() / c["reuse_prompt_tokens"].sum()
        say(f"infinite-cache reuse of these requests {reuse:.1%} of prompt tokens (prompt vs "
            f"uncached Spearman {c['spearman'].mean():.2f}), {resp:.1%} with the responses' "
            f"blocks cached too, {near:.1%} reused within the KV "
            f"pool's {c['pool_tokens'].iloc[0]:,} tokens of other prompts (trace order); FCFS "
            f"realised hit rate {fcfs['hit_pct']:.1f}% (prompt vs uncached at first admission "
            f"Spearman {fcfs['spearman_run']:.2f}).")
        if load == CLOSED:
            src = next(s for s in sources if label(s) == trace)
            made = ("" if isinstance(src, str) else f"synthetic_sessions(num_sessions={src[1]}, "
                    f"session_rate={src[2]:g}, seed={src[3]}); ")
            say(f"{made}closed loop: arrivals are set by the sessions, no load scaling (FCFS "
                f"served {fcfs['throughput_rps']:.3f} req/s).")
        else:
            say(f"capacity mu {c['mu_cached'].mean():.3f} req/s with caching on (burst hit "
                f"rate {c['burst_hit_rate'].mean():.1%}), {c['mu_blind'].mean():.3f} without "
                "block ids (mean over windows).")
        gaps = {o: rows[f"gap_{o}_pct"].iloc[0] for o in ORACLES}
        say("FCFS - Oracle, % of FCFS: " + ", ".join(
            f"{o} {'< 2%: decisions do not matter' if math.isnan(g) else f'{g:.1f}%'}"
            for o, g in gaps.items()) + ".")
        table = pd.DataFrame({
            "goodput_rps": rows["goodput_rps"].map(lambda v: f"{v:.3f}"),
            "slo_%": rows["slo_pct"].map(lambda v: f"{v:.1f}"),
            "ms/token": rows["ms_per_token"].map(lambda v: f"{v:.1f}"),
            "ttft_p99_s": rows["ttft_p99_s"].map(lambda v: f"{v:.2f}"),
            "hit_%": rows["hit_pct"].map(lambda v: f"{v:.1f}"),
            "gain_cache_%": rows[f"gain_{ORACLES[0]}"].map(fmt_gain),
            "gain_study_%": rows[f"gain_{ORACLES[1]}"].map(fmt_gain),
        })
        table.index.name = None
        print("   " + table.to_string().replace("\n", "\n   "))
        col = {"infinite-cache reuse %": f"{100 * reuse:.1f}",
               "with responses %": f"{100 * resp:.1f}",
               "reuse within the pool %": f"{100 * near:.1f}",
               "FCFS hit %": f"{fcfs['hit_pct']:.1f}",
               "FCFS Spearman(prompt, uncached)": f"{fcfs['spearman_run']:.2f}"}
        for o in ORACLES:
            col[f"(FCFS-{o})/FCFS %"] = "n/m" if math.isnan(gaps[o]) else f"{gaps[o]:.1f}"
        col.update({p: fmt_gain(rows.loc[p, f"gain_{ORACLES[0]}"]) for p in POLICIES[1:-1]})
        summary[(trace, load)] = col
    print("\n   summary: gain_cache % (against oracle-work-uncached) by trace and load")
    frame = pd.DataFrame(summary)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print("   " + frame.to_string().replace("\n", "\n   "))


def parse_list(ap: argparse.ArgumentParser, option: str, text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        ap.error(f"{option} {text!r}: expected comma-separated numbers")
    if not all(math.isfinite(x) and x > 0 for x in values):
        ap.error(f"{option} {text!r}: expected finite numbers > 0")
    if len(set(values)) != len(values):
        ap.error(f"{option} {text!r}: a value is repeated")
    return values


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default="mooncake-conversation,mooncake-synthetic,"
                    "agent-sessions", help="comma-separated trace names ('' for none)")
    ap.add_argument("--preset", default="llama-3.1-8b/h100-80gb")
    ap.add_argument("--loads", default="0.8,0.9", help="loads of the open-loop traces")
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--window-requests", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--synthetic-sessions", metavar="RATE[,RATE...]", default=None,
                    help="also replay synthetic_sessions at these session rates (per s), "
                    "closed loop")
    ap.add_argument("--synthetic-sessions-count", type=int, default=1000,
                    help="sessions in each synthetic-sessions trace")
    ap.add_argument("--seed", type=int, default=0, help="synthetic_sessions' seed")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--skip-speed", action="store_true")
    mode.add_argument("--speed-only", action="store_true")
    args = ap.parse_args()
    try:
        cbgym.EngineConfig(preset=args.preset, enable_prefix_caching=True)
    except ValueError as exc:
        ap.error(f"--preset {args.preset!r}: {exc}")
    loads = parse_list(ap, "--loads", args.loads)
    if args.windows < 1:
        ap.error(f"--windows {args.windows}: expected >= 1")
    if args.window_requests < 2:
        ap.error(f"--window-requests {args.window_requests}: expected >= 2")
    if args.workers < 1:
        ap.error(f"--workers {args.workers}: expected >= 1")
    if args.synthetic_sessions_count < 1:
        ap.error(f"--synthetic-sessions-count {args.synthetic_sessions_count}: expected >= 1")
    rates = ([] if args.synthetic_sessions is None
             else parse_list(ap, "--synthetic-sessions", args.synthetic_sessions))
    names = [x for x in args.traces.split(",") if x.strip()]
    if len(set(names)) != len(names):
        ap.error(f"--traces {args.traces!r}: a trace is repeated")
    for name in ([] if args.speed_only else names) + ([] if args.skip_speed else
                                                      ["mooncake-conversation"]):
        option = "--traces" if name in names else "the speed part (or --skip-speed)"
        try:
            trace = load_trace(name)
        except (FileNotFoundError, ValueError) as exc:
            ap.error(f"{option}: {name}: {exc}")
        if "hash_ids" not in trace.extra or "hash_block_tokens" not in trace.extra:
            ap.error(f"{option}: {name}: no block ids (extra['hash_ids'] and "
                     "['hash_block_tokens']): no prefix to cache")
    sources: list[Source] = [*names, *(("synthetic-sessions", args.synthetic_sessions_count,
                                        r, args.seed) for r in rates)]
    if not sources and not args.speed_only:
        ap.error("--traces is empty and no --synthetic-sessions: nothing to study")
    wall = time.perf_counter()
    if not args.skip_speed:
        speed(args.preset)
    if not args.speed_only:
        mean, caps = study(sources, args.preset, loads, args.windows, args.window_requests,
                           args.workers)
        report(mean, caps, args, sources)
    print(f"\nwall {time.perf_counter() - wall:.0f} s")


if __name__ == "__main__":
    main()
