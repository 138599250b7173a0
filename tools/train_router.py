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
    ap.add_argument("--ship", action="store_true",
                    help="also copy the model to cbgym/agents/checkpoints/router-TASK.zip")
    args = ap.parse_args()
    if args.steps < 0 or args.envs < 1 or args.epochs < 0 or not args.lr > 0:
        ap.error("--steps and --epochs must be >= 0, --envs >= 1, --lr > 0")
    if not args.ent_coef >= 0:
        ap.error(f"--ent-coef must be >= 0, got {args.ent_coef}")
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
    task = CLUSTER_TASKS[args.task]
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
                "trained_on": f"training windows of {task.trace}, loads {task.train_load}",
                "acts": "routes drawn from the policy's distribution, seeded by the run's "
                        "seed; ':deterministic' takes the most likely"}
        target.with_suffix(".json").write_text(json.dumps(card, indent=2) + "\n")
        print(f"shipped {target} and its card")


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
