"""Cluster speed, with the single engine measured in the same run as the reference.

All of azure-conv-2023 (scaled to ``--load`` of one instance's capacity, times the
instances) under FCFS on every instance:

1. the single engine (``cbgym.simulate``, the reference);
2. ``1x`` (one replica through the cluster loop: the loop's own overhead);
3. ``4x`` round-robin (unified replicas: no KV exchanged);
4. ``2p2d`` with ``always-disaggregate`` and with ``kairos`` (goal: at most 1.5x the single
   engine's wall time).

Figures: wall seconds, engine iterations per second, and the ratio to the reference. Then the
cluster env ``cbgym/Cluster-v0`` (the task ``code-2p2d-deflection``: 2P2D DeepSeek-V2-Lite,
512-request episodes), every env routing uniformly at random among its allowed routes
(drawn ahead), over at least two episodes per env (their starts count): steps/s of the
single env, of 4 copies under ``gym.make_vec(..., vectorization_mode="sync")``, and of the
native vector env (``gym.make_vec``: one compiled call per step) with 4 and 16 envs, beside
CartPole-v1's single-env steps/s as the reference of a step that costs nothing.

    python benchmarks/bench_cluster.py [--trace NAME] [--preset MODEL/GPU] [--load 0.8] [--repeat 3]

Each row is the fastest of ``--repeat`` runs (the reference's too).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import TypeVar

import cbgym
from cbgym.capacity import measure_capacity, scale_to_load
from cbgym.cluster import ClusterConfig
from cbgym.cluster.run import serve
from cbgym.workload import load_trace, synthetic_trace

T = TypeVar("T")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="azure-conv-2023")
    ap.add_argument("--preset", default="deepseek-v2-lite/a100-80gb")
    ap.add_argument("--load", type=float, default=0.8)
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs of each row; the fastest is shown (the others are noise)")
    args = ap.parse_args()
    if not args.load > 0:
        ap.error("--load must be > 0")
    if args.repeat < 1:
        ap.error("--repeat must be >= 1")
    try:
        trace = load_trace(args.trace)
    except (FileNotFoundError, ValueError) as exc:
        print(f"({exc.__class__.__name__}: using the synthetic-conv workload instead)")
        trace = synthetic_trace("conv")
    engine = cbgym.EngineConfig(preset=args.preset)
    mu = measure_capacity(trace, engine)
    print(f"{trace.name}: {len(trace)} requests, {args.preset}, one instance's capacity "
          f"{mu:.2f} req/s")
    rows = []
    single = scale_to_load(trace, args.load, engine, capacity_rps=mu)
    serve(single.window(0, 200), ClusterConfig.preset(f"1x:{args.preset}"), "round-robin")
    ref_wall, ref = fastest(lambda: cbgym.simulate(single, engine=engine), args.repeat)
    rows.append(("single engine (reference)", ref_wall, ref.summary()["iterations"]))
    for name, router, instances in (("1x", "round-robin", 1), ("4x", "round-robin", 4),
                                    ("2p2d", "always-disaggregate", 2),
                                    ("2p2d", "kairos", 2)):
        # the same load per serving instance: 2P2D has two decode instances
        tr = scale_to_load(trace, args.load, engine, capacity_rps=mu * instances)
        cfg = ClusterConfig.preset(f"{name}:{args.preset}")
        wall, res = fastest(lambda: serve(tr, cfg, router), args.repeat)  # noqa: B023
        rows.append((f"{name} {router}", wall, res.summary()["iterations"]))
    print(f"{'run':<28}{'wall s':>9}{'iterations':>12}{'iter/s':>12}{'x reference':>13}")
    for label, wall, iters in rows:
        print(f"{label:<28}{wall:>9.2f}{iters:>12.0f}{iters / wall:>12.0f}"
              f"{wall / ref_wall:>13.1f}")
    print("goal: 2p2d at most 1.5x the single engine's wall time")
    env_speed()


def fastest(run: Callable[[], T], repeat: int) -> tuple[float, T]:
    """The shortest wall time of ``repeat`` calls of ``run``, and the last call's result."""
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        out = run()
        best = min(best, time.perf_counter() - t)
    return best, out


def env_speed(steps: int = 6000) -> None:
    import gymnasium as gym
    import numpy as np

    env = gym.make("cbgym/Cluster-v0")
    allowed = np.flatnonzero(env.unwrapped.action_masks())
    rng = np.random.default_rng(0)

    episode = env.unwrapped.n

    def run(envs: gym.Env | gym.vector.VectorEnv, num: int) -> float:
        """Steps/s over ``steps`` env steps and at least two whole episodes per env (their
        starts count), after a warm-up; random allowed routes."""
        envs.reset(seed=0)
        picks = rng.choice(allowed, (max(steps // num, 2 * episode) + 50, num))
        if num == 1:
            picks = picks[:, 0].tolist()
        t = time.perf_counter()
        for k, a in enumerate(picks):
            if k == 50:
                t = time.perf_counter()
            out = envs.step(a)
            if num == 1 and (out[2] or out[3]):
                envs.reset()
        return (len(picks) - 50) * num / (time.perf_counter() - t)

    single = run(env, 1)
    sync = run(gym.make_vec("cbgym/Cluster-v0", num_envs=4, vectorization_mode="sync"), 4)
    native = {n: run(gym.make_vec("cbgym/Cluster-v0", num_envs=n), n) for n in (4, 16)}
    cart = gym.make("CartPole-v1")
    cart.reset(seed=0)
    t = time.perf_counter()
    for _ in range(steps):
        _, _, done, trunc, _ = cart.step(cart.action_space.sample())
        if done or trunc:
            cart.reset()
    ref = steps / (time.perf_counter() - t)
    print(f"cbgym/Cluster-v0, random allowed routes (steps/s): {single:.0f} single, {sync:.0f} "
          f"sync (4 envs), {native[4]:.0f} native (4 envs), {native[16]:.0f} native (16 envs); "
          f"CartPole-v1: {ref:.0f} single")

if __name__ == "__main__":
    main()
