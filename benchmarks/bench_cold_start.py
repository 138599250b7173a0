"""Cold start: seconds from a fresh process to the first env step, with an empty kernel cache.

Runs ``gym.make("cbgym/Scheduling-v0")``, ``reset`` and one ``step`` in a fresh subprocess
whose numba cache folder (NUMBA_CACHE_DIR) is a new empty directory, so every kernel is
compiled (goal: at most 20 s on a 2-core machine); then again in a second fresh process with
the cache that run left, which only loads the kernels (goal: at most 2 s). Also times
``cbgym.simulate`` on a small trace after an empty cache, and how long unpickling an env
takes in a process that already compiled (it must not compile again).

    python benchmarks/bench_cold_start.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

FIRST_STEP = """
import time, pickle
t0 = time.perf_counter()
import gymnasium as gym
import cbgym
env = gym.make("cbgym/Scheduling-v0")
env.reset(seed=0)
env.step(env.action_space.sample())
t1 = time.perf_counter()
blob = pickle.dumps(env)
env2 = pickle.loads(blob)
env2.step(env2.action_space.sample())
print(f"{t1 - t0:.2f} {time.perf_counter() - t1:.2f}")
"""

SIMULATE = """
import time
t0 = time.perf_counter()
import cbgym
cbgym.simulate("synthetic-conv", engine="llama-2-7b/a100-80gb")
print(f"{time.perf_counter() - t0:.2f}")
"""


def run(code: str, cache: str) -> tuple[list[float], str]:
    env = {**os.environ, "NUMBA_CACHE_DIR": cache}
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    wall = time.perf_counter() - t0
    return [float(x) for x in out.stdout.split()] + [wall], out.stderr.strip()


def main() -> None:
    with tempfile.TemporaryDirectory() as cache:
        (cold, unpickle, wall), notice = run(FIRST_STEP, cache)
        print(f"first env step, empty cache:   {cold:6.2f} s in-process, {wall:6.2f} s with "
              "interpreter start (goal <= 20 s)")
        print(f"  unpickle + step after it:    {unpickle:6.2f} s (no second compilation)")
        print(f"  stderr: {notice or '(nothing)'}")
        (warm, _, wall), _ = run(FIRST_STEP, cache)
        print(f"first env step, warm cache:    {warm:6.2f} s in-process, {wall:6.2f} s with "
              "interpreter start (goal <= 2 s)")
    with tempfile.TemporaryDirectory() as cache:
        (sim, wall), _ = run(SIMULATE, cache)
        print(f"simulate(synthetic-conv), empty cache: {sim:6.2f} s ({wall:.2f} s with start)")


if __name__ == "__main__":
    main()
