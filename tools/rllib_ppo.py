"""PPO from RLlib (new API stack) on a cbgym task, each env runner stepping the task's native
vector env (``gym_env_vectorize_mode="vector_entry_point"``: one compiled call steps all of a
runner's envs).

    python tools/rllib_ppo.py --env-id cbgym/Scheduling-v0 --iterations 20
    python tools/rllib_ppo.py --env-id cbgym/Cluster-v0 --env-runners 2 --envs-per-runner 8

Needs the ``rllib`` extra (``pip install 'cbgym[rllib]'``; it pins gymnasium, see pyproject.toml)
and the ``train`` extra (torch).
The env id is given to RLlib as ``cbgym:<id>`` so that every env runner imports cbgym (which
registers the ids) before Gymnasium builds the env. The dict observations are flattened by
RLlib's ``FlattenObservations`` connector. The env runners see ``CBGYM_TRACE_DIR`` (the real
traces) through Ray's runtime environment. This is a plain PPO: the task scores and the
shipped policies come from ``train.py`` and ``tools/train_router.py``.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any


def build_config(env_id: str, env_runners: int = 2, envs_per_runner: int = 4,
                 batch: int = 1024, minibatch: int = 256, epochs: int = 2,
                 seed: int = 0) -> Any:
    """The PPOConfig (new API stack) for ``env_id`` (a registered cbgym id)."""
    from ray.rllib.algorithms.ppo import PPOConfig

    return (PPOConfig()
            .environment(f"cbgym:{env_id}")
            .env_runners(num_env_runners=env_runners, num_envs_per_env_runner=envs_per_runner,
                         gym_env_vectorize_mode="vector_entry_point",
                         env_to_module_connector=_flatten)
            .training(train_batch_size_per_learner=batch, minibatch_size=minibatch,
                      num_epochs=epochs)
            .debugging(seed=seed))


def _flatten(env: Any = None, spaces: Any = None, device: Any = None) -> Any:
    from ray.rllib.connectors.env_to_module import FlattenObservations

    return FlattenObservations()


def init_ray(num_cpus: int | None = None, address: str | None = None) -> None:
    """Start (or join) Ray with the trace folder passed on to the env runners."""
    import ray

    env_vars = {k: os.environ[k] for k in ("CBGYM_TRACE_DIR",) if k in os.environ}
    ray.init(address=address or "local", num_cpus=None if address else num_cpus,
             include_dashboard=False,
             log_to_driver=False, runtime_env={"env_vars": env_vars} if env_vars else None)


def train(env_id: str, iterations: int, **kwargs: Any) -> list[dict[str, Any]]:
    """Build PPO for ``env_id``, run ``iterations`` training iterations; each one's figures."""
    algo = build_config(env_id, **kwargs).build_algo()
    rows = []
    try:
        for i in range(iterations):
            t = time.perf_counter()
            result = algo.train()
            runners = result.get("env_runners", {})
            rows.append({"iteration": i + 1, "seconds": time.perf_counter() - t,
                         "env_steps": runners.get("num_env_steps_sampled_lifetime"),
                         "episode_return_mean": runners.get("episode_return_mean")})
    finally:
        algo.stop()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env-id", default="cbgym/Scheduling-v0")
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--env-runners", type=int, default=2)
    ap.add_argument("--envs-per-runner", type=int, default=4)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--address", default=None, help="a Ray cluster to join (default: local)")
    args = ap.parse_args()
    if args.iterations < 1 or args.env_runners < 0 or args.envs_per_runner < 1 \
            or args.batch < 2:
        ap.error("--iterations and --envs-per-runner must be >= 1, --env-runners >= 0, "
                 "--batch >= 2")
    import gymnasium as gym

    import cbgym  # noqa: F401  (registers the ids)

    if args.env_id not in gym.registry:
        ap.error(f"--env-id: {args.env_id!r} is not a registered id (cbgym/Scheduling-v0, "
                 "cbgym/Cluster-v0, cbgym/Scheduling-<task>-v0, ...)")
    import ray

    init_ray(num_cpus=max(args.env_runners, 1) + 1, address=args.address)
    try:
        for row in train(args.env_id, args.iterations, env_runners=args.env_runners,
                         envs_per_runner=args.envs_per_runner, batch=args.batch,
                         minibatch=max(args.batch // 4, 1), seed=args.seed):
            print(row)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
