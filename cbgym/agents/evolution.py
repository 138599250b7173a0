"""Direct policy search for the slot scorer: CMA-ES on the deterministic policy's goodput.

PPO optimises the expected return of the Gaussian-noised policy it samples from; the policy
that ships acts on the mean scores. On the benchmark tasks that gap decided the outcome:
started from the heuristic exactly (the residual prior, :mod:`cbgym.agents.slot_prior`),
PPO's small steps drifted the deterministic policy below it every time
(docs/benchmark.md). Here the parameters of the very policy that ships are searched
directly: each candidate plays whole training windows deterministically on the native
vector env, and its goodput (requests meeting both SLOs) is its fitness. The search is
CMA-ES (Hansen, "The CMA Evolution Strategy: A Tutorial", 2016; the ``cma`` package) with a
diagonal covariance and mirrored samples, every candidate of a generation on the same
windows (common random numbers: only differences between candidates rank them). Evolution
strategies as an RL method: Salimans et al., 2017, "Evolution Strategies as a Scalable
Alternative to Reinforcement Learning"; Mania et al., 2018, "Simple random search provides a
competitive approach to reinforcement learning".

* :class:`Population`: the actor's parameters of an SB3 :class:`~cbgym.agents.slot_net.
  SlotPolicy` as one flat vector, and the mean scores of many such vectors at once
  (``torch.func.vmap`` over the network's part; the prior, which has no parameters, once).
* :func:`play`: every (candidate, window) pair as one env of a native vector env, stepped
  together until every episode ended; goodput per pair.
* :func:`draw_windows`: a generation's training windows (start and load).

``tools/train_es.py`` runs the search on a task and writes the same outputs as ``train.py``
(``policy.zip`` plays as ``learned:PATH``). Needs the ``train`` extra (torch, SB3, cma).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch as th
from torch import nn
from torch.func import functional_call, vmap

__all__ = ["ACTOR_MODULES", "Population", "draw_windows", "play"]

# the SlotScorer modules that make the scores (its critic is not part of the policy that acts)
ACTOR_MODULES = ("context", "waiting_head", "running_head", "stop_head")


class _Network(nn.Module):
    """The scorer's network part as a module whose ``forward`` is
    :meth:`~cbgym.agents.slot_net.SlotScorer.network_scores` (what ``functional_call`` calls)."""

    def __init__(self, scorer: nn.Module) -> None:
        super().__init__()
        self.scorer = scorer

    def forward(self, features: th.Tensor) -> th.Tensor:
        return self.scorer.network_scores(features)


class Population:
    """Flat parameter vectors of an SB3 slot policy's actor, and their mean scores.

    Args:
        policy: a :class:`~cbgym.agents.slot_net.SlotPolicy` (PPO's Box scores; its
            ``action_net`` is the identity, so the actor's output is the mean).

    A vector holds the parameters of :data:`ACTOR_MODULES` in ``named_parameters`` order.
    :meth:`scores` computes, for P vectors at once, what ``policy.predict(obs,
    deterministic=True)`` gives (the mean, with the prior, clipped to [-1, 1]): the action
    ``learned:`` plays.
    """

    def __init__(self, policy: Any) -> None:
        from cbgym.agents.slot_net import SlotScorer

        scorer = policy.mlp_extractor
        if not isinstance(scorer, SlotScorer) or hasattr(policy.action_space, "n"):
            raise TypeError("Population: expected a PPO SlotPolicy (cbgym.agents.slot_net)")
        self.policy, self.scorer = policy, scorer
        self.names = [n for n, _ in scorer.named_parameters()
                      if n.split(".")[0] in ACTOR_MODULES]
        params = dict(scorer.named_parameters())
        self.shapes = [tuple(params[n].shape) for n in self.names]
        self.sizes = [int(np.prod(s)) for s in self.shapes]
        self.dim = int(sum(self.sizes))
        # SB3's CombinedExtractor flattens the Dict observation key by key in this order
        self.keys = list(policy.observation_space.spaces)
        network = _Network(scorer)
        self._batched = vmap(lambda p, x: functional_call(network, p, (x,)))

    def get(self) -> np.ndarray:
        """The policy's current actor parameters (float64)."""
        params = dict(self.scorer.named_parameters())
        return th.cat([params[n].detach().flatten() for n in self.names]).double().numpy()

    def set(self, x: np.ndarray) -> None:
        """Write a vector into the policy (what it then saves and plays)."""
        x = self._check(np.asarray(x)[None])[0]
        params = dict(self.scorer.named_parameters())
        with th.no_grad():
            for name, part in zip(self.names, self._split(th.as_tensor(x)), strict=True):
                params[name].copy_(part.reshape(params[name].shape))

    def features(self, obs: Mapping[str, np.ndarray]) -> th.Tensor:
        """A batch of observations (the vector env's dict) as the policy's flat features."""
        n = len(obs[self.keys[0]])
        return th.as_tensor(np.concatenate(
            [np.asarray(obs[k], np.float32).reshape(n, -1) for k in self.keys], axis=1))

    def scores(self, X: np.ndarray, obs: Mapping[str, np.ndarray]) -> np.ndarray:
        """The deterministic actions of P vectors: env ``p * W + w`` of the batch (P * W envs)
        acts with vector p. (P * W, action size), float64, clipped to [-1, 1]."""
        X = self._check(np.asarray(X))
        features = self.features(obs)
        P = len(X)
        if len(features) % P:
            raise ValueError(f"Population.scores: {len(features)} observations are not "
                             f"{P} equal groups")
        params = {f"scorer.{n}": part.reshape(P, *shape) for n, part, shape in zip(
            self.names, self._split(th.as_tensor(X, dtype=th.float32)), self.shapes,
            strict=True)}
        with th.no_grad():
            out = self._batched(params, features.reshape(P, len(features) // P, -1))
            out = out.reshape(len(features), -1)
            if self.scorer.prior is not None:
                out = out + self.scorer.prior(features)
        return out.clamp(-1.0, 1.0).double().numpy()

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
         loads: np.ndarray) -> np.ndarray:
    """Goodput of each of P vectors on each of W windows, (P, W).

    ``venv`` is a native :class:`~cbgym.env.vector.SchedulingVectorEnv` of P * W envs with
    no reward shaping (a step's reward is then the requests that met both SLOs in it); env
    ``p * W + w`` plays vector p on window ``(starts[w], loads[w])``. Every env is stepped
    until each has ended once (an episode truncated by ``max_steps`` counts what it served);
    envs that ended earlier start new episodes that are not counted.

    Each entry is what ``learned:`` scores with that vector on that window (tested), with one
    exception: a vector that holds every waiting request while nothing runs idles the env
    until ``max_steps`` ends the episode, where :class:`~cbgym.agents.learned.LearnedPolicy`
    admits its best-scored request instead. The search therefore ranks such a vector lower
    than the fast path would; the chosen vector is scored on the fast path afterwards.
    """
    P, W = len(X), len(starts)
    if venv.num_envs != P * W:
        raise ValueError(f"play: the vector env holds {venv.num_envs} envs, not {P} x {W}")
    if np.any(venv.weights != 0):
        raise ValueError("play: the env's reward is shaped; goodput needs weights of 0")
    obs, _ = venv.reset(seed=0, options={"start": np.tile(np.asarray(starts, np.int64), P),
                                         "load": np.tile(np.asarray(loads, float), P)})
    done = np.zeros(P * W, bool)
    good = np.zeros(P * W)
    while not done.all():
        obs, reward, terminated, truncated, _ = venv.step(population.scores(X, obs))
        good += np.where(done, 0.0, reward)
        done |= terminated | truncated
    return good.reshape(P, W)
