"""Train a learned router on a cluster task (MaskablePPO on ``cbgym/Cluster-<task>-v0``).

    python tools/train_router.py --task code-2p2d-deflection --steps 100000 --out runs/router
    python tools/train_router.py --task code-2p2d-deflection --ship   # to the checkpoints

``--imitate kairos`` first clones a rule router: it plays the rule on the training windows,
records each routing point's observation, the rule's route (as the env's action index,
chunk caps rounded down to the table's) and the discounted return that followed, fits the
policy's action distribution to the routes (cross-entropy) and its critic to the returns (as
``cbgym.agents.imitation.clone`` does for the schedulers), then fine-tunes with PPO: its
first advantages then come from the rule's values rather than a critic at its random start.

Episodes come from the task's training windows only; the run prints the validation score
(``cbgym.tasks.cluster_tasks.evaluate_cluster(..., split="validation")``) against the task's
rules, so test windows stay unseen. TensorBoard logs go to ``OUT/tb``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def main() -> None:
    from cbgym.tasks.cluster_tasks import CLUSTER_TASKS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="code-2p2d-deflection", choices=list(CLUSTER_TASKS))
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--envs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/router")
    ap.add_argument("--imitate", default=None, metavar="ROUTER",
                    help="behaviour-clone this router first (e.g. kairos)")
    ap.add_argument("--demo-steps", type=int, default=30_000)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--ent-coef", type=float, default=0.01,
                    help="PPO's entropy bonus (0: none, so a clone is not pushed to uniform)")
    ap.add_argument("--es-generations", type=int, default=0, metavar="N",
                    help="after the clone (and PPO): N generations of CMA-ES on the "
                         "deterministic router's goodput (cbgym.agents.evolution); the router "
                         "then routes deterministically")
    ap.add_argument("--es-popsize", type=int, default=16, help="candidates per generation")
    ap.add_argument("--es-windows", type=int, default=8, help="training windows per generation")
    ap.add_argument("--es-sigma", type=float, default=0.02, help="the search's initial step")
    ap.add_argument("--ship", action="store_true",
                    help="also copy the model to cbgym/agents/checkpoints/router-TASK.zip")
    args = ap.parse_args()
    if args.steps < 0 or args.envs < 1 or args.epochs < 0 or not args.lr > 0:
        ap.error("--steps and --epochs must be >= 0, --envs >= 1, --lr > 0")
    if not args.ent_coef >= 0:
        ap.error(f"--ent-coef must be >= 0, got {args.ent_coef}")
    if args.es_generations < 0 or args.es_windows < 1 or not args.es_sigma > 0 \
            or args.es_popsize < 2 or args.es_popsize % 2:
        ap.error("--es-generations must be >= 0, --es-windows >= 1, --es-sigma > 0 and "
                 "--es-popsize an even number >= 2")
    task = CLUSTER_TASKS[args.task]
    if args.es_generations and (task.admission is not None or task.client is not None):
        ap.error(f"--es-generations: {args.task} has clients at its edge, which the native "
                 "cluster vector env does not simulate (the search needs it)")
    if args.imitate:
        from cbgym.agents.routing import make_router
        from cbgym.cluster.routing import RouterContext

        if args.demo_steps < 1:
            ap.error("--demo-steps must be >= 1")
        try:
            make_router(args.imitate).reset(RouterContext(
                config=CLUSTER_TASKS[args.task].cluster_config()))
        except (ValueError, TypeError) as exc:
            ap.error(f"--imitate: {exc}")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        ap.error(f"--out: {out} is not a directory")
    out.mkdir(parents=True, exist_ok=True)

    import gymnasium as gym
    import torch
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv

    from cbgym.agents.routing.learned import CHECKPOINTS, LearnedRouter
    from cbgym.tasks.cluster_tasks import evaluate_cluster

    torch.set_num_threads(1)
    envs = DummyVecEnv([lambda: Monitor(gym.make(task.env_id).unwrapped)
                        for _ in range(args.envs)])
    model = MaskablePPO("MultiInputPolicy", envs, n_steps=1024, batch_size=256,
                        learning_rate=args.lr, gamma=0.999, ent_coef=args.ent_coef, seed=args.seed,
                        verbose=0, tensorboard_log=str(out / "tb"))
    t = time.perf_counter()
    cloned: dict[str, object] = {}
    if args.imitate:
        obs, acts, returns = demonstrate(gym.make(task.env_id).unwrapped, args.imitate,
                                         args.demo_steps, args.seed, model.gamma)
        loss, agree = clone(model.policy, obs, acts, returns, args.epochs, args.seed)
        cloned = {"imitated": args.imitate, "routing_points": len(acts),
                  "agreement": round(agree, 3)}
        print(f"cloned {args.imitate} on {len(acts)} routing points in "
              f"{time.perf_counter() - t:.0f} s: loss {loss:.3f}, agreement {agree:.3f}")
    if args.steps:
        model.learn(args.steps)  # (SB3's progress bar needs rich, not a dependency here)
    print(f"trained {args.steps} steps in {time.perf_counter() - t:.0f} s")
    searched: dict[str, object] = {}
    if args.es_generations:
        searched = router_search(task, model, args, out)
    path = out / "router.zip"
    model.save(path)
    ev = evaluate_cluster(task, LearnedRouter(model), split="validation")
    best = ev.best_heuristic
    d = ev.versus(best)
    print(f"validation: learned {ev.goodput[ev.policy].mean():.1f}, best rule {best} "
          f"{ev.goodput[best].mean():.1f}, difference {d.difference.mean:+.1f} "
          f"[{d.difference.low:+.1f}, {d.difference.high:+.1f}]")
    if args.ship:
        import json
        import sys

        target = CHECKPOINTS / f"router-{args.task}.zip"
        model.save(target)
        card = {"task": args.task, "algo": "maskable_ppo",
                "command": "python tools/train_router.py " + " ".join(sys.argv[1:]),
                "validation_goodput": {k: float(v.mean()) for k, v in ev.goodput.items()},
                **({"clone": cloned} if cloned else {}),
                **({"search": searched} if searched else {}),
                "trained_on": f"training windows of {task.trace}, loads {task.train_load}",
                "acts": "the most likely route (found by direct search); ':sample' draws "
                        "from the policy's distribution" if searched else
                        "routes drawn from the policy's distribution, seeded by the run's "
                        "seed; ':deterministic' takes the most likely"}
        target.with_suffix(".json").write_text(json.dumps(card, indent=2) + "\n")
        print(f"shipped {target} and its card")


def router_search(task, model, args, out: Path) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """CMA-ES on the model's actor (``cbgym.agents.evolution.search``): each candidate routes
    deterministically on ``--es-windows`` training windows (the task's train range and loads,
    drawn anew each generation) on the native cluster vector env; every 10 generations the
    search's mean routes the validation windows (at the test load), and the best mean is
    written into the model, marked to route deterministically."""
    import numpy as np

    from cbgym.agents.evolution import GenerationLog, Population, draw_windows, play, search
    from cbgym.agents.learned import META_KEY
    from cbgym.cluster.run import cluster_capacity
    from cbgym.cluster.sweep import reference_router
    from cbgym.env.cluster_vector import ClusterVectorEnv
    from cbgym.workload import load_trace

    trace = load_trace(task.trace)
    cfg = task.cluster_config()
    kw = {**task.env_kwargs(len(trace), "train"), "trace": trace,
          "capacity_rps": cluster_capacity(trace, cfg, reference_router(cfg))}
    P, W = args.es_popsize, args.es_windows
    venv = ClusterVectorEnv(num_envs=P * W, **kw)
    starts_v = np.asarray(task.starts(len(trace), "validation"))
    vval = ClusterVectorEnv(num_envs=len(starts_v), **{**kw, "window_start_range": None})
    loads_v = np.full(len(starts_v), task.test_load)
    population = Population(model.policy)
    rng = np.random.default_rng(args.seed)

    def fitness(X: np.ndarray, generation: int) -> np.ndarray:
        starts, loads = draw_windows(rng, kw["window_start_range"], task.episode_requests,
                                     kw["load"], W)
        seeds = rng.integers(0, 2**31 - 1, W)
        return play(venv, population, X, starts, loads, seeds).mean(axis=1)

    def validate(x: np.ndarray) -> float:
        return float(play(vval, population, x[None], starts_v, loads_v).mean())

    log = GenerationLog(out, args.es_generations, False, "train_router")
    try:
        found = search(population.get(), fitness, validate, generations=args.es_generations,
                       popsize=P, sigma=args.es_sigma, seed=args.seed, on_generation=log)
    finally:
        log.close()
    population.set(found.x)
    setattr(model, META_KEY, {"act": "deterministic"})
    print(f"searched {len(found.rows)} generations: chosen generation {found.generation}, "
          f"validation {found.validation:.1f} on the vector env (the start "
          f"{found.start_validation:.1f})")
    return {"generations": len(found.rows), "popsize": P, "windows": W,
            "sigma": args.es_sigma, "chosen_generation": found.generation,
            "validation_vector_env": round(found.validation, 2),
            "validation_start": round(found.start_validation, 2)}


def demonstrate(env, spec: str, steps: int, seed: int,  # type: ignore[no-untyped-def]
                gamma: float = 0.999):
    """Play rule ``spec`` on ``env`` (a ClusterEnv) for ``steps`` routing points, whole
    episodes: (observations stacked by key, action indices, discounted returns)."""
    import numpy as np

    from cbgym.agents.imitation import discounted_returns
    from cbgym.agents.routing import make_router
    from cbgym.cluster.routing import RouterContext
    from cbgym.env.cluster_env import route_index

    rows: dict[str, list] = {"request": [], "instances": []}
    acts: list[int] = []
    returns: list[np.ndarray] = []
    episode = 0
    while len(acts) < steps:
        obs, _ = env.reset(seed=seed + episode)
        router = make_router(spec)
        router.reset(RouterContext(config=env.config, seed=seed + episode))
        done = False
        rewards: list[float] = []
        while not done:
            a = route_index(env.routes, router.route(env._rp), env._rp)
            for k in rows:
                rows[k].append(obs[k])
            acts.append(a)
            obs, r, done, _, _ = env.step(a)
            rewards.append(float(r))
        returns.append(discounted_returns(rewards, gamma))
        episode += 1
    return ({k: np.stack(v) for k, v in rows.items()}, np.array(acts),
            np.concatenate(returns))


def clone(policy, obs, acts, returns, epochs: int,  # type: ignore[no-untyped-def]
          seed: int, batch: int = 256, lr: float = 1e-3) -> tuple[float, float]:
    """Fit the policy's action distribution to the demonstrations (cross-entropy) and its
    critic to their returns (squared error over the returns' variance, so the two terms weigh
    alike at any reward scale); the last minibatch's loss and the agreement of the policy's
    most likely action on all of them."""
    import torch as th

    o = {k: th.as_tensor(v) for k, v in obs.items()}
    a = th.as_tensor(acts)
    ret = th.as_tensor(returns, dtype=th.float32)
    scale = float(ret.var()) if len(ret) > 1 and float(ret.var()) > 0 else 1.0
    opt = th.optim.Adam(policy.parameters(), lr=lr)
    gen = th.Generator().manual_seed(seed)
    loss = th.zeros(())
    for _ in range(epochs):
        for idx in th.randperm(len(a), generator=gen).split(batch):
            batch_obs = {k: v[idx] for k, v in o.items()}
            dist = policy.get_distribution(batch_obs)
            value = policy.predict_values(batch_obs).squeeze(-1)
            loss = -dist.log_prob(a[idx]).mean() + ((value - ret[idx]) ** 2).mean() / scale
            opt.zero_grad()
            loss.backward()
            opt.step()
    with th.no_grad():
        probs = policy.get_distribution(o).distribution.probs
    return float(loss.detach()), float((probs.argmax(-1) == a).float().mean())


if __name__ == "__main__":
    main()
