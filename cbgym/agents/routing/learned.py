"""``learned-router:NAME|PATH``: a MaskablePPO model trained on ``cbgym/Cluster-v0`` as a router.

It sees each routing point through the env's own encoder (:func:`cbgym.env.cluster_env.encode`)
and draws an allowed route of the env's table (:func:`cbgym.env.cluster_env.route_table`)
from the policy's distribution, or takes the most likely (``:deterministic``), so the cluster
run and the env episode agree.
Shipped checkpoints: ``cbgym/agents/checkpoints/router-<task>.zip`` (``learned-router:<task>``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from cbgym.agents.learned import CHECKPOINT_DIR as CHECKPOINTS  # beside the learned policies
from cbgym.agents.learned import META_KEY
from cbgym.cluster.routing import Route, Router, RouterContext, RoutingPoint
from cbgym.env.cluster_vector_ops import INSTANCE_FEATURES


def router_checkpoint(spec: str) -> Path:
    """The zip ``learned-router:SPEC`` names: a shipped task name or a file path."""
    shipped = CHECKPOINTS / f"router-{spec}.zip"
    if shipped.is_file():
        return shipped
    path = Path(spec).expanduser()
    for candidate in (path, path.with_name(path.name + ".zip")):
        if candidate.is_file():
            return candidate
    names = sorted(p.stem.removeprefix("router-") for p in CHECKPOINTS.glob("router-*.zip"))
    raise ValueError(f"router 'learned-router': no checkpoint {spec!r}: not a file, nor a "
                     f"shipped name ({', '.join(names) or 'none shipped'})")


class LearnedRouter(Router):
    """A trained MaskablePPO router (module docstring).

    Args:
        model: a shipped task name, a zip path, or a loaded model.
        deterministic: take the most likely route, or draw it from the policy's
            distribution with a generator seeded by the run's seed (so a run reproduces).
            None (the default): as the model says it was trained to act (``cbgym``
            attribute saved in its zip, ``{"act": "deterministic"}`` for a router found by
            direct search, ``tools/train_router.py --es-generations``), else drawn, as PPO
            trains and as the cloned routers were measured.
    """

    name = "learned-router"

    def __init__(self, model: Any = "code-2p2d-deflection",
                 deterministic: bool | str | None = None) -> None:
        if isinstance(deterministic, str):  # from a spec: learned-router:NAME:deterministic
            if deterministic not in ("deterministic", "sample"):
                raise ValueError(f"router {self.name!r}: expected 'deterministic' or 'sample' "
                                 f"after the name, got {deterministic!r}")
            deterministic = deterministic == "deterministic"
        if isinstance(model, str | Path):
            try:
                from sb3_contrib import MaskablePPO
            except ImportError as exc:
                raise ImportError("router 'learned-router' needs the train extra: "
                                  "pip install 'cbgym[train]'") from exc
            path = router_checkpoint(str(model))
            self.label = f"{self.name}:{model}"
            model = MaskablePPO.load(path, device="cpu")
        else:
            self.label = f"{self.name}:in-memory"
        self.model = model
        if deterministic is None:
            deterministic = (getattr(model, META_KEY, None) or {}).get("act") == "deterministic"
        self.deterministic = bool(deterministic)
        self.allow_shed = True

    def reset(self, ctx: RouterContext) -> None:
        from cbgym.env.cluster_env import route_table

        super().reset(ctx)
        n = int(self.model.action_space.n)
        # a model trained with allow_shed=False has one action less
        self.routes = route_table(ctx.config, allow_shed=n != len(route_table(ctx.config,
                                                                               False)))
        if n != len(self.routes):
            raise ValueError(f"router {self.label!r}: the model has {n} actions, this cluster "
                             f"{len(self.routes)} routes (trained on another cluster)")
        engines = ctx.config.engines
        self.mask = np.array([not (r.chunk_cap and r.decode is not None and r.prefill is None
                                   and not engines[r.decode].chunked_prefill)
                              for r in self.routes])
        self.rng = np.random.default_rng(ctx.seed)
        # (a model trained with prefix caching reads the cache columns)
        self.prefix = self.model.observation_space["instances"].shape[1] > len(
            INSTANCE_FEATURES)

    def route(self, rp: RoutingPoint) -> Route:
        from cbgym.env.cluster_env import encode

        obs = encode(rp, self.prefix)
        if self.deterministic:
            a, _ = self.model.predict(obs, deterministic=True, action_masks=self.mask)
            return self.routes[int(a)]
        import torch as th

        policy = self.model.policy
        tensor, _ = policy.obs_to_tensor(obs)
        with th.no_grad():
            dist = policy.get_distribution(tensor, action_masks=self.mask)
            p = dist.distribution.probs[0].numpy().astype(np.float64)
        return self.routes[int(self.rng.choice(len(p), p=p / p.sum()))]
