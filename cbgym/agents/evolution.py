"""Direct policy search: CMA-ES on the goodput of the deterministic policy that ships.

PPO optimises the expected return of the Gaussian-noised policy it samples from; the policy
that ships acts on the mean scores. On the benchmark tasks that gap decided the outcome:
started from the heuristic exactly (the residual prior, :mod:`cbgym.agents.slot_prior`),
PPO's small steps drifted the deterministic policy below it every time, and after a
router's clone PPO lowered the validation score on every task tried (docs/benchmark.md).
Here the parameters of the very policy that ships are searched directly: each candidate
plays whole training windows deterministically on the native vector env, and its goodput
(requests meeting both SLOs) is its fitness. The search is CMA-ES (Hansen, "The CMA
Evolution Strategy: A Tutorial", 2016; the ``cma`` package) with a diagonal covariance and
mirrored samples, every candidate of a generation on the same windows (common random
numbers: only differences between candidates rank them). Evolution strategies as an RL
method: Salimans et al., 2017, "Evolution Strategies as a Scalable Alternative to
Reinforcement Learning"; Mania et al., 2018, "Simple random search provides a competitive
approach to reinforcement learning".

* :class:`Population`: the actor's parameters of an SB3 policy as one flat vector, and the
  actions of many such vectors at once (``torch.func.vmap`` over the network's part; a slot
  scorer's prior, which has no parameters, once): the slot scorer of ``Scheduling-v0``
  (:class:`~cbgym.agents.slot_net.SlotPolicy`) or a MaskablePPO router of ``Cluster-v0``.
* :func:`play`: every (candidate, window) pair as one env of a native vector env, stepped
  together until every episode ended; goodput per pair.
* :func:`search`: the CMA-ES loop, choosing by validation windows.
* :func:`draw_windows`: a generation's training windows (start and load).

``tools/train_es.py`` runs the search for a scheduler (its ``policy.zip`` plays as
``learned:PATH``), ``tools/train_router.py --es-generations N`` for a router (played
deterministically). Needs the ``train`` extra (torch, SB3, cma).
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch as th
from torch import nn
from torch.func import functional_call, vmap

__all__ = ["ACTOR_MODULES", "CAP_MODULES", "GenerationLog", "Population", "Searched",
           "draw_windows", "play", "search"]

# the SlotScorer modules that make the scores (its critic is not part of the policy that acts)
ACTOR_MODULES = ("batch_pool", "context", "waiting_head", "running_head", "stop_head")
# what the running cap's score reads: the context (global features, the batch's summary) and
# its own head
CAP_MODULES = ("batch_pool", "context", "stop_head")


class _Network(nn.Module):
    """What ``functional_call`` calls: the actor's parameterised part, from flat features
    (a slot scorer's :meth:`~cbgym.agents.slot_net.SlotScorer.network_scores`; a router's
    logits, ``action_net(mlp_extractor.forward_actor(.))``)."""

    def __init__(self, root: nn.Module, slot: bool) -> None:
        super().__init__()
        self.root, self.slot = root, slot

    def forward(self, features: th.Tensor) -> th.Tensor:
        if self.slot:
            return self.root.network_scores(features)
        return self.root.action_net(self.root.mlp_extractor.forward_actor(features))


class Population:
    """Flat parameter vectors of an SB3 policy's actor, and the actions they take.

    Args:
        policy: a :class:`~cbgym.agents.slot_net.SlotPolicy` (PPO's Box scores; its
            ``action_net`` is the identity, so the actor's output is the mean), or a
            MaskablePPO ``MultiInputPolicy`` (a router of ``cbgym/Cluster-v0``: its most likely
            allowed route is the deterministic action).
        modules: a slot scorer's modules whose parameters are searched (the others keep
            their values): :data:`CAP_MODULES` searches the running cap alone, the order and
            the victims staying the prior's (the score heads' output layers start at zero).

    A vector holds the actor's parameters in ``named_parameters`` order: those of the slot
    scorer's ``modules`` (default :data:`ACTOR_MODULES`), or the router's
    ``mlp_extractor.policy_net`` and ``action_net``.
    :meth:`scores` computes, for P vectors at once, what ``policy.predict(obs,
    deterministic=True)`` decides from: the mean scores with the prior, clipped to [-1, 1], or
    the route logits.
    """

    def __init__(self, policy: Any, modules: tuple[str, ...] = ACTOR_MODULES) -> None:
        from cbgym.agents.slot_net import SlotScorer

        self.discrete = hasattr(policy.action_space, "n")
        slot = isinstance(policy.mlp_extractor, SlotScorer)
        if set(modules) - set(ACTOR_MODULES) or not modules:
            raise ValueError(f"Population: modules must be among {ACTOR_MODULES}, got "
                             f"{modules}")
        if slot and not self.discrete:
            root: nn.Module = policy.mlp_extractor
            self.names = [n for n, _ in root.named_parameters()
                          if n.split(".")[0] in modules]
            self.prior = policy.mlp_extractor.prior
        elif self.discrete and not slot and hasattr(policy.mlp_extractor, "policy_net"):
            if set(modules) != set(ACTOR_MODULES):
                raise ValueError("Population: modules choose among a slot scorer's; a router "
                                 "searches its whole actor")
            root = policy
            self.names = [n for n, _ in root.named_parameters()
                          if n.startswith(("mlp_extractor.policy_net.", "action_net."))]
            self.prior = None
        else:
            raise TypeError("Population: expected a PPO SlotPolicy (cbgym.agents.slot_net) or "
                            "a MaskablePPO MultiInputPolicy (a router)")
        if not self.names:
            raise ValueError(f"Population: the policy has none of the modules {modules}")
        self.policy, self.root = policy, root
        params = dict(root.named_parameters())
        self.shapes = [tuple(params[n].shape) for n in self.names]
        self.sizes = [int(np.prod(s)) for s in self.shapes]
        self.dim = int(sum(self.sizes))
        # SB3's CombinedExtractor flattens the Dict observation key by key in this order
        self.keys = list(policy.observation_space.spaces)
        network = _Network(root, slot)
        self._batched = vmap(lambda p, x: functional_call(network, p, (x,)))

    def get(self) -> np.ndarray:
        """The policy's current actor parameters (float64)."""
        params = dict(self.root.named_parameters())
        return th.cat([params[n].detach().flatten() for n in self.names]).double().numpy()

    def set(self, x: np.ndarray) -> None:
        """Write a vector into the policy (what it then saves and plays)."""
        x = self._check(np.asarray(x)[None])[0]
        params = dict(self.root.named_parameters())
        with th.no_grad():
            for name, part in zip(self.names, self._split(th.as_tensor(x)), strict=True):
                params[name].copy_(part.reshape(params[name].shape))

    def features(self, obs: Mapping[str, np.ndarray]) -> th.Tensor:
        """A batch of observations (the vector env's dict) as the policy's flat features."""
        n = len(obs[self.keys[0]])
        return th.as_tensor(np.concatenate(
            [np.asarray(obs[k], np.float32).reshape(n, -1) for k in self.keys], axis=1))

    def scores(self, X: np.ndarray, obs: Mapping[str, np.ndarray]) -> np.ndarray:
        """What P vectors decide from: env ``p * W + w`` of the batch (P * W envs) acts with
        vector p. (P * W, action size), float64: clipped scores, or route logits."""
        X = self._check(np.asarray(X))
        features = self.features(obs)
        P = len(X)
        if len(features) % P:
            raise ValueError(f"Population.scores: {len(features)} observations are not "
                             f"{P} equal groups")
        params = {f"root.{n}": part.reshape(P, *shape) for n, part, shape in zip(
            self.names, self._split(th.as_tensor(X, dtype=th.float32)), self.shapes,
            strict=True)}
        with th.no_grad():
            out = self._batched(params, features.reshape(P, len(features) // P, -1))
            out = out.reshape(len(features), -1)
            if self.discrete:
                return out.double().numpy()
            if self.prior is not None:
                out = out + self.prior(features)
        return out.clamp(-1.0, 1.0).double().numpy()

    def actions(self, X: np.ndarray, obs: Mapping[str, np.ndarray],
                masks: np.ndarray | None = None) -> np.ndarray:
        """The deterministic actions: the scores, or the most likely allowed route."""
        out = self.scores(X, obs)
        if not self.discrete:
            return out
        return np.where(masks, out, -np.inf).argmax(axis=1) if masks is not None \
            else out.argmax(axis=1)

    def _split(self, x: th.Tensor) -> list[th.Tensor]:
        return list(th.split(x, self.sizes, dim=-1))

    def _check(self, X: np.ndarray) -> np.ndarray:
        if X.ndim != 2 or X.shape[1] != self.dim or not np.isfinite(X).all():
            raise ValueError(f"Population: expected finite vectors of {self.dim} parameters, "
                             f"got shape {X.shape}")
        return X


def draw_windows(rng: np.random.Generator, start_range: tuple[int, int], n: int,
                 load: float | tuple[float, float], count: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """``count`` training windows of ``n`` requests: starts uniform within ``start_range``,
    loads uniform over a (lo, hi) range (or fixed)."""
    lo, hi = start_range
    if hi - lo < n:
        raise ValueError(f"draw_windows: the range [{lo}, {hi}) cannot hold {n} requests")
    starts = rng.integers(lo, hi - n + 1, count)
    loads = rng.uniform(*load, count) if isinstance(load, tuple) else np.full(count, load)
    return starts, loads


def play(venv: Any, population: Population, X: np.ndarray, starts: np.ndarray,
         loads: np.ndarray, seeds: np.ndarray | None = None) -> np.ndarray:
    """Goodput of each of P vectors on each of W windows, (P, W).

    ``venv`` is a native vector env of P * W envs whose step reward is the requests that
    became good in it: a :class:`~cbgym.env.vector.SchedulingVectorEnv` without reward
    shaping, or a :class:`~cbgym.env.cluster_vector.ClusterVectorEnv` (goodput as clients
    see it). Env ``p * W + w`` plays vector p on window ``(starts[w], loads[w])``, seeded
    ``seeds[w]`` (default w: a cluster draws its own randomness, client retries for one, from
    it; the same for every vector, common random numbers). Every env is stepped until each
    has ended once (an episode truncated by ``max_steps`` counts what it served); envs that
    ended earlier start new episodes that are not counted.

    On the scheduling env each entry is what ``learned:`` scores with that vector on that
    window (tested), with one exception: a vector that holds every waiting request while
    nothing runs idles the env until ``max_steps`` ends the episode, where
    :class:`~cbgym.agents.learned.LearnedPolicy` admits its best-scored request instead. The
    search therefore ranks such a vector lower than the fast path would; the chosen vector is
    scored on the fast path afterwards.
    """
    P, W = len(X), len(starts)
    if venv.num_envs != P * W:
        raise ValueError(f"play: the vector env holds {venv.num_envs} envs, not {P} x {W}")
    if np.any(getattr(venv, "weights", 0) != 0):
        raise ValueError("play: the env's reward is shaped; goodput needs weights of 0")
    seeds = np.arange(W) if seeds is None else np.asarray(seeds)
    obs, _ = venv.reset(seed=[int(x) for x in np.tile(seeds, P)],
                        options={"start": np.tile(np.asarray(starts, np.int64), P),
                                 "load": np.tile(np.asarray(loads, float), P)})
    masks = venv.action_masks() if population.discrete else None
    done = np.zeros(P * W, bool)
    good = np.zeros(P * W)
    while not done.all():
        obs, reward, terminated, truncated, _ = venv.step(population.actions(X, obs, masks))
        good += np.where(done, 0.0, reward)
        done |= terminated | truncated
    return good.reshape(P, W)


@dataclass
class Searched:
    """What :func:`search` found: the chosen vector (the best mean on validation; the start
    if none was better), its generation (0: the start) and validation score, the start's
    validation score, and one row per generation."""

    x: np.ndarray
    generation: int
    validation: float
    start_validation: float
    rows: list[dict[str, float]]


def search(x0: np.ndarray, fitness: Callable[[np.ndarray, int], np.ndarray],
           validate: Callable[[np.ndarray], float], *, generations: int, popsize: int,
           sigma: float, seed: int, validate_every: int = 10, time_budget_s: float = 0.0,
           on_generation: Callable[[dict[str, float]], None] | None = None,
           on_best: Callable[[Searched], None] | None = None) -> Searched:
    """CMA-ES from ``x0``, maximising ``fitness(X, generation)`` (one value per row of X:
    mean goodput on that generation's training windows, the same windows for every row).

    Diagonal covariance (separable CMA-ES: its learning rates stay useful for thousands of
    parameters) and mirrored pairs (x, 2m - x: the pair's difference in fitness is its
    direction's, free of the windows' own spread). Every ``validate_every`` generations (and
    at the last) the search's mean is scored by ``validate``; the best mean is kept, so the
    validation windows choose and the training windows move. ``time_budget_s`` > 0 stops
    after that many seconds; ``on_generation`` sees each row (for logs and progress) and
    ``on_best`` the start and each new best mean (to checkpoint it: a search cut short keeps
    its best)."""
    import time

    import cma

    if popsize < 2 or popsize % 2:
        raise ValueError(f"search: popsize must be an even number >= 2, got {popsize}")
    started = time.perf_counter()
    opts = {"popsize": popsize, "CMA_diagonal": True, "CMA_mirrors": popsize // 2,
            "CMA_mirrormethod": 0, "seed": seed + 1, "verbose": -9}
    es = cma.CMAEvolutionStrategy(np.asarray(x0, float), sigma, opts)
    start = float(validate(np.asarray(x0, float)))
    best = Searched(np.array(x0, float), 0, start, start, [])
    if on_best is not None:
        on_best(best)
    for g in range(1, generations + 1):
        X = np.asarray(es.ask())
        good = np.asarray(fitness(X, g), float)
        es.tell(list(X), list(-good))
        row = {"generation": g, "goodput_mean": float(good.mean()),
               "goodput_max": float(good.max()), "goodput_min": float(good.min()),
               "sigma": float(es.sigma), "validation": float("nan"),
               "seconds": time.perf_counter() - started}
        expired = time_budget_s > 0 and row["seconds"] > time_budget_s
        if g % validate_every == 0 or g == generations or expired:
            row["validation"] = float(validate(np.array(es.mean)))
            if row["validation"] > best.validation:
                best.x, best.generation = np.array(es.mean), g
                best.validation = row["validation"]
                if on_best is not None:
                    on_best(best)
        row["best_validation"] = best.validation
        best.rows.append(row)
        if on_generation is not None:
            on_generation(row)
        if expired:
            break
    return best


class GenerationLog:
    """``search``'s ``on_generation`` for the tools: TensorBoard scalars (``es/*`` in
    ``out/tb``), a tqdm bar (or, without it, a line on stderr at each validation) and, on
    :meth:`close`, ``out/generations.csv``."""

    def __init__(self, out: Path, generations: int, progress_bar: bool, name: str) -> None:
        from torch.utils.tensorboard import SummaryWriter
        from tqdm import tqdm

        self.out, self.name, self.rows = out, name, []
        self.writer = SummaryWriter(str(out / "tb"))
        self.bar = tqdm(total=generations, unit="gen", disable=not progress_bar)
        self.quiet = not progress_bar

    def __call__(self, row: dict[str, float]) -> None:
        g = int(row["generation"])
        self.rows.append(row)
        for k in ("goodput_mean", "goodput_max", "goodput_min", "sigma", "validation"):
            if np.isfinite(row[k]):
                self.writer.add_scalar(f"es/{k}", row[k], g)
        self.bar.update(1)
        if np.isfinite(row["validation"]):
            self.bar.set_postfix(val=f"{row['validation']:.1f}",
                                 best=f"{row['best_validation']:.1f}")
            if self.quiet:
                print(f"[{self.name}] generation {g}: training {row['goodput_mean']:.1f} (best "
                      f"candidate {row['goodput_max']:.1f}), validation {row['validation']:.1f},"
                      f" best {row['best_validation']:.1f}, {row['seconds']:.0f} s",
                      file=sys.stderr, flush=True)

    def close(self) -> None:
        self.bar.close()
        self.writer.close()
        if self.rows:
            with (self.out / "generations.csv").open("w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(self.rows[0]))
                w.writeheader()
                w.writerows(self.rows)
