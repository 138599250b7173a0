"""Environment steps per second: single envs, and native vector envs of N = 1, 4, 16, 64.

1. One env (``gym.make``, wrappers included), random and FCFS agents, both ids, beside
   CartPole-v1 (goal: Scheduling-v0 random at least 0.4x CartPole-v1).
2. The native vector envs (``gym.make_vec``: one compiled call per step, numba threads over
   envs) with random actions drawn ahead, for 1 and 2 threads, beside Gymnasium's
   CartPoleVectorEnv of the same N (goal: N = 16 on 2 threads at least 1.5x CartPole-v1's
   single-env rate in aggregate).
3. Prefix caching (``--prefix-trace``, a trace with block ids; by default the embedded
   ``synthetic-sessions``): the native vector env, whose engines name their blocks, beside
   ``vectorization_mode="sync"`` (single envs stepped in turn, what make_vec built before the
   cache was compiled in), the same N and random actions.

The goals' ratios are then measured again in ``--repeats`` interleaved rounds (CartPole-v1,
the single env, the vector env of 16 on 2 threads, ``min(--seconds, 1)`` each), and their median is
the figure: on a shared machine a row's rate drifts by tens of percent between minutes.

Each row runs for ``--seconds`` of wall time (episodes restart as needed); "iter/s" counts
engine iterations (one step may cover several when nothing can be decided in between).

Usage::

    python benchmarks/bench_env.py                 # default engine, synthetic-conv, load 0.9
    python benchmarks/bench_env.py --seconds 5 --load 1.2
    python benchmarks/bench_env.py --profile       # cProfile of the single-env random row
    python benchmarks/bench_env.py --prefix-trace mooncake-conversation --num-envs 16
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

import cbgym  # registers the env ids
from cbgym.env.agents import EnvAgent

Row = dict[str, Any]


def _timed(step: Callable[[], int], seconds: float) -> tuple[float, float, int]:
    """Call ``step`` (returning engine iterations) in batches until ``seconds`` pass.

    A short untimed warm-up first: the compiled kernels load (or, on a fresh install, compile)
    on first use, a one-time cost that is not steady-state speed.
    """
    warm_until = time.perf_counter() + min(0.5, seconds / 4)
    while time.perf_counter() < warm_until:
        step()
    steps = iterations = 0
    start = time.perf_counter()
    while True:
        for _ in range(64):
            iterations += step()
        steps += 64
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return steps / elapsed, iterations / elapsed, steps


def bench_single(env: gym.Env, agent: EnvAgent | None, seconds: float, seed: int) -> Row:
    rng = np.random.default_rng(seed)
    u = env.unwrapped
    state: dict[str, Any] = {}
    pool = [env.action_space.sample() for _ in range(1024)] if not u.masked else []

    def reset() -> None:
        state["obs"], state["info"] = env.reset(seed=int(rng.integers(1 << 31)))
        if agent is not None:
            agent.reset()

    def step() -> int:
        if agent is not None:
            action = agent.act(state["obs"], state["info"])
        elif u.masked:
            allowed = np.flatnonzero(state["info"]["action_mask"])
            action = int(allowed[rng.integers(len(allowed))])
        else:
            state["k"] = k = state.get("k", 0) + 1
            action = pool[k % 1024]
        obs, _, terminated, truncated, info = env.step(action)
        state["obs"], state["info"] = obs, info
        if terminated or truncated:
            reset()
        return int(info.get("engine_iterations", 0))

    reset()
    steps_s, iters_s, _ = _timed(step, seconds)
    return {"steps_s": steps_s, "iters_s": iters_s}


def bench_native(env_id: str, n: int, threads: int, seconds: float, seed: int,
                 kwargs: dict[str, Any]) -> Row:
    """The native vector env; random actions drawn ahead (masked: a random allowed pick,
    chosen with one argmax over the batched masks)."""
    envs = gym.make_vec(env_id, num_envs=n, num_threads=threads, **kwargs)
    envs.reset(seed=seed)
    rng = np.random.default_rng(seed)
    masked = hasattr(envs.unwrapped, "action_masks") and env_id.endswith("Masked-v0")
    if masked:
        noise = rng.random((64, n, envs.single_action_space.n))
    else:
        pool = rng.uniform(-1, 1, (64, *envs.action_space.shape))
    state = {"k": 0}

    def step() -> int:
        k = state["k"] = (state["k"] + 1) % 64
        if masked:
            actions = np.argmax(envs.unwrapped.action_masks() * noise[k], axis=1)
        else:
            actions = pool[k]
        _, _, _, _, info = envs.step(actions)
        return int(info["engine_iterations"].sum())

    steps_s, iters_s, _ = _timed(step, seconds)
    return {"steps_s": steps_s * n, "iters_s": iters_s}


def bench_sync(env_id: str, n: int, seconds: float, seed: int, kwargs: dict[str, Any]) -> Row:
    """Gymnasium's SyncVectorEnv of single envs, random Box actions drawn ahead."""
    envs = gym.make_vec(env_id, num_envs=n, vectorization_mode="sync", **kwargs)
    envs.reset(seed=seed)
    pool = np.random.default_rng(seed).uniform(-1, 1, (64, *envs.action_space.shape))
    state = {"k": 0}

    def step() -> int:
        k = state["k"] = (state["k"] + 1) % 64
        _, _, _, _, info = envs.step(pool[k])
        return int(info["engine_iterations"].sum())

    steps_s, iters_s, _ = _timed(step, seconds)
    return {"steps_s": steps_s * n, "iters_s": iters_s}


def bench_prefix(trace: str, load: float, num_envs: list[int], seconds: float,
                 episode_requests: int) -> None:
    """Section 3: prefix caching, native against sync (module docstring)."""
    engine = cbgym.EngineConfig(enable_prefix_caching=True)
    kwargs = {"trace": trace, "load": load, "episode_requests": episode_requests,
              "engine": engine, "shed_rule": "late", "admission_cap": False}
    rows: list[tuple[str, str, str, Row]] = []
    ratios = []
    for n in num_envs:
        sync = bench_sync("cbgym/Scheduling-v0", n, seconds, 0, kwargs)
        for threads in (1, 2)[:n]:
            native = bench_native("cbgym/Scheduling-v0", n, threads, seconds, 0, kwargs)
            rows.append(("Scheduling-v0 native", "random", f"{n} x{threads} thr", native))
            ratios.append(f"N={n} x{threads} thr: {native['steps_s'] / sync['steps_s']:.1f}x")
        rows.append(("Scheduling-v0 sync", "random", f"{n}", sync))
    print(f"\n3. prefix caching ({trace}, load {load}, {episode_requests}-request episodes): "
          "the native vector env against single envs stepped in turn\n")
    print_table(rows)
    print("native / sync: " + ", ".join(ratios))


def bench_cartpole_vector(n: int, seconds: float) -> Row:
    from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv

    envs = CartPoleVectorEnv(num_envs=n)
    envs.reset(seed=0)
    pool = np.random.default_rng(0).integers(0, 2, (64, n))
    state = {"k": 0}

    def step() -> int:
        state["k"] = (state["k"] + 1) % 64
        envs.step(pool[state["k"]])
        return 0

    steps_s, _, _ = _timed(step, seconds)
    return {"steps_s": steps_s * n, "iters_s": float("nan")}


def bench_cartpole(seconds: float) -> Row:
    env = gym.make("CartPole-v1")
    env.reset(seed=0)

    def step() -> int:
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()
        return 0

    steps_s, _, _ = _timed(step, seconds)
    return {"steps_s": steps_s, "iters_s": float("nan")}


def goal_ratios(make: Callable[[], gym.Env], kwargs: dict[str, Any], seconds: float,
                repeats: int) -> None:
    """The two goals' ratios, measured in interleaved rounds (CartPole-v1, the single env,
    the native vector env of 16 on 2 threads, then again): on a shared machine the rate of
    one row drifts by tens of percent from minute to minute, so a ratio of two rows measured
    minutes apart says little; each round's ratio pairs rows measured seconds apart."""
    single, vector = [], []
    for _ in range(repeats):
        ref = bench_cartpole(seconds)["steps_s"]
        single.append(bench_single(make(), None, seconds, 0)["steps_s"] / ref)
        vector.append(bench_native("cbgym/Scheduling-v0", 16, 2, seconds, 0, kwargs)["steps_s"]
                      / ref)
    print(f"\ngoals, {repeats} interleaved rounds of {seconds:g} s a row: median [min, max]")
    for label, values, goal in (("Scheduling-v0 random / CartPole-v1", single, 0.4),
                                ("Scheduling-v0 N=16 on 2 threads / CartPole-v1 single",
                                 vector, 1.5)):
        print(f"  {label}: {np.median(values):.2f}x [{min(values):.2f}, {max(values):.2f}] "
              f"(goal >= {goal}x)")


def print_table(rows: list[tuple[str, str, str, Row]]) -> None:
    print(f"| {'env':24} | {'agent':8} | {'envs':14} | {'steps/s':>9} | {'iter/s':>9} |")
    print(f"|{'-' * 26}|{'-' * 10}|{'-' * 16}|{'-' * 11}|{'-' * 11}|")
    for env_name, agent_label, n, row in rows:
        iters = "" if np.isnan(row["iters_s"]) else f"{row['iters_s']:9.0f}"
        print(f"| {env_name:24} | {agent_label:8} | {n:14} | {row['steps_s']:9.0f} | "
              f"{iters:>9} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="wall time per row")
    parser.add_argument("--load", type=float, default=0.9)
    parser.add_argument("--episode-requests", type=int, default=512)
    parser.add_argument("--trace", default="synthetic-conv")
    parser.add_argument("--num-envs", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--repeats", type=int, default=5,
                        help="interleaved rounds for the goals' ratios (0: skip them)")
    parser.add_argument("--prefix-trace", default="synthetic-sessions",
                        help="section 3's trace (block ids needed); 'none' skips it")
    args = parser.parse_args()
    if args.seconds <= 0 or args.episode_requests < 2 or min(args.num_envs) < 1 \
            or args.repeats < 0:
        parser.error("--seconds must be > 0, --episode-requests >= 2, --num-envs >= 1, "
                     "--repeats >= 0")
    if args.prefix_trace != "none":
        try:
            ids = "hash_ids" in cbgym.load_trace(args.prefix_trace).extra
        except (ValueError, FileNotFoundError) as exc:
            parser.error(f"--prefix-trace {args.prefix_trace!r}: {exc}")
        if not ids:
            parser.error(f"--prefix-trace {args.prefix_trace!r} has no block ids (extra "
                         "'hash_ids'): nothing to cache")
    # the env's own defaults (the default engine, late shedding, no cap score), not the
    # default task's: the figures in docs/vector.md were measured so
    kwargs = {"trace": args.trace, "load": args.load, "episode_requests": args.episode_requests,
              "engine": cbgym.EngineConfig(), "shed_rule": "late", "admission_cap": False}

    def make(env_id: str) -> Callable[[], gym.Env]:
        return lambda: gym.make(env_id, **kwargs)

    make("cbgym/Scheduling-v0")().reset(seed=0)  # measure capacity once (cached) outside rows
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        bench_single(make("cbgym/Scheduling-v0")(), None, args.seconds, 0)
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
        return

    rows: list[tuple[str, str, str, Row]] = []
    for env_id in ("cbgym/Scheduling-v0", "cbgym/SchedulingMasked-v0"):
        short = env_id.split("/")[1]
        for agent_name in (None, "fcfs"):
            env = make(env_id)()
            agent = EnvAgent(agent_name, env) if agent_name else None
            rows.append((short, agent_name or "random", "1",
                         bench_single(env, agent, args.seconds, 0)))
    cartpole = bench_cartpole(args.seconds)
    rows.append(("CartPole-v1", "random", "1", cartpole))
    print(f"\nload {args.load}, {args.episode_requests}-request episodes of {args.trace}, "
          f"{args.seconds:g} s per row\n\n1. single envs (gym.make wrappers included)\n")
    print_table(rows)
    ref = cartpole["steps_s"]
    print(f"\nScheduling-v0 random / CartPole-v1: {rows[0][3]['steps_s'] / ref:.2f}x "
          "(goal >= 0.4x; rows measured in turn: the paired rounds, --repeats, decide)")

    vec: list[tuple[str, str, str, Row]] = []
    for env_id in ("cbgym/Scheduling-v0", "cbgym/SchedulingMasked-v0"):
        short = env_id.split("/")[1]
        for n in args.num_envs:
            for threads in (1, 2):
                if threads > n:
                    continue
                vec.append((short, "random", f"{n} x{threads} thr",
                            bench_native(env_id, n, threads, args.seconds, 0, kwargs)))
    for n in args.num_envs:
        vec.append(("CartPoleVectorEnv", "random", f"{n}", bench_cartpole_vector(n, args.seconds)))
    print("\n2. native vector envs (gym.make_vec), random actions drawn ahead; steps/s summed "
          "over envs\n")
    print_table(vec)
    n16 = [r for name, _, n, r in vec if name == "Scheduling-v0" and n == "16 x2 thr"]
    if n16:
        print(f"\nScheduling-v0 N=16 on 2 threads / CartPole-v1 single: "
              f"{n16[0]['steps_s'] / ref:.2f}x (goal >= 1.5x; rows minutes apart: the "
              "paired rounds, --repeats, decide)")
    if args.repeats:
        goal_ratios(make("cbgym/Scheduling-v0"), kwargs, min(args.seconds, 1.0), args.repeats)
    if args.prefix_trace != "none":
        bench_prefix(args.prefix_trace, args.load, args.num_envs, args.seconds,
                     args.episode_requests)


if __name__ == "__main__":
    main()
