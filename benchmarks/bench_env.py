"""Environment steps per second: random agent and FCFS agent, single env and a vector of 2.

Every step is one call of the compiled kernel (cbgym.env.kernel_ops); CartPole-v1, timed in
the same run, is the reference.

Gymnasium's CartPole-v1 is measured in the same run for comparison. Each row runs for
``--seconds`` of wall time (whole episodes restart as needed); "iter/s" counts engine iterations
(one step may cover several when nothing can be decided in between).

Usage::

    python benchmarks/bench_env.py                 # default engine, synthetic-conv, load 0.9
    python benchmarks/bench_env.py --seconds 5 --load 1.2
    python benchmarks/bench_env.py --profile       # cProfile of the single-env random row
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

import cbgym  # noqa: F401  (registers the env ids)
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


def bench_vector(make: Callable[[], gym.Env], agent_name: str | None, seconds: float,
                 seed: int) -> Row:
    envs = gym.vector.SyncVectorEnv([make, make])
    n = envs.num_envs
    agents = [EnvAgent(agent_name, e) for e in envs.envs] if agent_name else None
    masked = envs.envs[0].unwrapped.masked
    rng = np.random.default_rng(seed)
    obs, info = envs.reset(seed=seed)
    fresh = np.ones(n, bool)
    state = {"obs": obs, "info": info, "fresh": fresh}
    pool = [np.stack([envs.single_action_space.sample() for _ in range(n)])
            for _ in range(256)] if not masked else []

    def act(i: int) -> Any:
        if agents is None and masked:
            allowed = np.flatnonzero(state["info"]["action_mask"][i])
            return int(allowed[rng.integers(len(allowed))])
        o = {k: v[i] for k, v in state["obs"].items()}
        inf = {k: state["info"][k][i] for k in ("waiting_time_in_system_s", "sim_time_s",
                                                 *(("action_mask",) if masked else ()))}
        assert agents is not None
        if state["fresh"][i]:
            agents[i].reset()
        return agents[i].act(o, inf)

    def step() -> int:
        if agents is None and not masked:  # random scores, drawn ahead as in bench_single
            state["k"] = k = state.get("k", 0) + 1
            actions = pool[k % len(pool)]
        else:
            acts = [act(i) for i in range(n)]
            actions = np.stack(acts) if not masked else np.array(acts)
        obs, _, term, trunc, info = envs.step(actions)
        # NEXT_STEP autoreset: the step after an episode end returns a fresh episode
        state["fresh"] = state.get("done", np.zeros(n, bool))
        state["done"] = term | trunc
        state["obs"], state["info"] = obs, info
        return int(np.sum(info.get("engine_iterations", 0)))

    steps_s, iters_s, _ = _timed(step, seconds)
    envs.close()
    return {"steps_s": steps_s * n, "iters_s": iters_s}


def bench_cartpole(seconds: float, vector: bool) -> Row:
    if vector:
        envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2)
        envs.reset(seed=0)
        actions = np.zeros(2, np.int64)
        steps_s, _, _ = _timed(lambda: (envs.step(actions), 0)[1], seconds)
        return {"steps_s": steps_s * 2, "iters_s": float("nan")}
    env = gym.make("CartPole-v1")
    env.reset(seed=0)

    def step() -> int:
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()
        return 0

    steps_s, _, _ = _timed(step, seconds)
    return {"steps_s": steps_s, "iters_s": float("nan")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="wall time per row")
    parser.add_argument("--load", type=float, default=0.9)
    parser.add_argument("--episode-requests", type=int, default=512)
    parser.add_argument("--trace", default="synthetic-conv")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    kwargs = {"trace": args.trace, "load": args.load, "episode_requests": args.episode_requests}

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
            label = agent_name or "random"
            env = make(env_id)()
            agent = EnvAgent(agent_name, env) if agent_name else None
            rows.append((short, label, "1", bench_single(env, agent, args.seconds, 0)))
            rows.append((short, label, "2 (sync)",
                         bench_vector(make(env_id), agent_name, args.seconds, 0)))
    rows.append(("CartPole-v1", "random", "1", bench_cartpole(args.seconds, False)))
    rows.append(("CartPole-v1", "constant", "2 (sync)", bench_cartpole(args.seconds, True)))

    print(f"\nload {args.load}, {args.episode_requests}-request episodes of {args.trace}, "
          f"{args.seconds:g} s per row (gym.make wrappers included)\n")
    print(f"| {'env':24} | {'agent':8} | {'envs':8} | {'steps/s':>9} | {'iter/s':>9} |")
    print(f"|{'-' * 26}|{'-' * 10}|{'-' * 10}|{'-' * 11}|{'-' * 11}|")
    for env_name, agent_label, n, row in rows:
        iters = "" if np.isnan(row["iters_s"]) else f"{row['iters_s']:9.0f}"
        print(f"| {env_name:24} | {agent_label:8} | {n:8} | {row['steps_s']:9.0f} | {iters:>9} |")


if __name__ == "__main__":
    main()
