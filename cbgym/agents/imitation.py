"""Demonstrations of a fast-path policy on the env, for a behaviour-cloning warm start.

``train.py --imitate cb-sjf-work-shed:28`` first plays the named policy on the training env
(its decisions at each decision point, turned into the env's score vector), fits the PPO
network's mean scores to those vectors and its critic to the returns, then trains with PPO as
usual: reinforcement learning starts from the heuristic instead of from random scores, and
every result is still scored on windows it never saw.

The translation of a :class:`~cbgym.engine.Decision` into ``Scheduling-v0`` scores:

| slot / score     | value                                                                 |
|------------------|-----------------------------------------------------------------------|
| admitted         | a key policy's key k (seconds of work): ``1 - (1 - lo) (1 - exp(-k / 1 s))`` |
|                  | with ``lo`` just above the hold threshold: falling with k, never held  |
|                  | other policies: ``1 - r * step`` by rank r                            |
| shed             | -1.5: past the range on purpose, so that the fitted mean, clipped to  |
|                  | [-1, 1] as SB3 clips its actions, stays at or below a -0.99 threshold  |
| held back        | midway between the shed and the hold threshold                        |
| running slot j   | vLLM's victim order: the most recently admitted scores lowest         |
| running cap      | the score whose ``running_cap`` is the policy's ``cap`` (1 without)    |

Only requests the env shows can be scored; the rest are held, as the env holds them. A key
becomes a score of the slot's own features (and the context), which the shared slot scorer
can fit; ranks depend on the other slots too, which it cannot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from cbgym.engine.decision import Decision, DecisionPoint, Policy, PolicyContext

__all__ = ["Demonstrations", "cap_score", "clone", "demonstrate", "scores_of"]


@dataclass
class Demonstrations:
    """Observations, the policy's score vectors, and discounted returns (aligned rows)."""

    obs: dict[str, np.ndarray]
    actions: np.ndarray
    returns: np.ndarray
    episodes: int
    goodput: float  # mean requests meeting both SLOs per finished episode


def cap_score(cap: int, max_seqs: int) -> float:
    """The cap score whose :func:`cbgym.env.kernel_ops.running_cap` is ``cap``."""
    if max_seqs <= 1 or cap >= max_seqs:
        return 1.0
    return float(np.clip(2.0 * math.log(max(cap, 1)) / math.log(max_seqs) - 1.0, -1.0, 1.0))


def _order(dp: DecisionPoint, d: Decision) -> np.ndarray:
    if d.order is not None:
        return np.asarray(d.order, dtype=np.int64)
    if d.priority is not None:
        return dp.waiting[np.argsort(np.asarray(d.priority), kind="stable")]
    return dp.waiting.copy()


SHED_TARGET = -1.5  # see the module docstring: a regression error must not undo a shed
_KEY_SCALE_S = 1.0  # seconds of work over which key scores fall from 1 towards the floor


def scores_of(env: object, dp: DecisionPoint, d: Decision, cap: int,
              keys: np.ndarray | None = None) -> np.ndarray:
    """``d`` as the env's score vector over its visible slots (module docstring), a target
    for the network (clip it to [-1, 1] to step the env); ``keys``: the policy's key per
    ``dp.waiting`` entry, when it has them."""
    u = env
    K, R = u.K, u.R  # type: ignore[attr-defined]
    a = np.zeros(u.layout.size, np.float32)  # type: ignore[attr-defined]
    hold, shed = u.hold_threshold, u.shed_threshold  # type: ignore[attr-defined]
    held = hold - 1e-3 if shed is None else (hold + shed) / 2.0
    rank = {int(r): i for i, r in enumerate(_order(dp, d))}
    shed_ids = {int(r) for r in (d.shed or ())}
    w_ids = u.visible_waiting_ids  # type: ignore[attr-defined]
    admitted = sorted((rank[int(r)], i) for i, r in enumerate(w_ids) if int(r) in rank)
    lo = hold + 0.05 * (1.0 - hold)  # the lowest admitted score
    if keys is not None:
        key_of = dict(zip(dp.waiting.tolist(), np.asarray(keys, np.float64).tolist(),
                          strict=True))
        for _, i in admitted:
            k = max(key_of[int(w_ids[i])], 0.0)
            a[i] = 1.0 - (1.0 - lo) * (1.0 - math.exp(-k / _KEY_SCALE_S))
    else:
        step = (1.0 - lo) / max(K - 1, 1)
        for k, (_, i) in enumerate(admitted):
            a[i] = 1.0 - k * step
    for i, r in enumerate(w_ids):
        if int(r) not in rank:
            a[i] = SHED_TARGET if int(r) in shed_ids else held
    nr = len(u.visible_running_ids)  # type: ignore[attr-defined]
    a[K:K + nr] = 1.0 - np.arange(nr) * (2.0 / max(R, 1))
    if u.admission_cap:  # type: ignore[attr-defined]
        a[K + R] = cap_score(cap, u.config.max_num_seqs) if cap else 1.0  # type: ignore
    return a


def _keys(policy: Policy, dp: DecisionPoint) -> np.ndarray | None:
    """A key policy's keys at ``dp`` (aligned with ``dp.waiting``), else None: the ones it
    admits by (``admission_keys``, where a rule orders by more than its key: tiers first)."""
    from cbgym.agents.base import KeyPolicy

    if not isinstance(policy, KeyPolicy) or len(dp.waiting) == 0:
        return None
    admission_keys = getattr(policy, "admission_keys", None)
    if admission_keys is not None:
        return np.asarray(admission_keys(dp), np.float64)
    return np.asarray(policy.keys(policy.view(dp)), np.float64)


def discounted_returns(rewards: list[float], gamma: float) -> np.ndarray:
    """Each step's discounted return to the episode's end (it ends: nothing to bootstrap),
    float32: what the critic is fitted to from demonstrations (here and for the routers,
    ``tools/train_router.py``)."""
    ret = np.zeros(len(rewards), np.float32)
    g = 0.0
    for i in range(len(rewards) - 1, -1, -1):
        g = rewards[i] + gamma * g
        ret[i] = g
    return ret


def demonstrate(env: object, policy: Policy, steps: int, gamma: float,
                seed: int = 0) -> Demonstrations:
    """Play ``policy`` on ``env`` (an unwrapped single env) for ``steps`` steps, whole
    episodes, reseeding each; record what it saw, what it did and the discounted returns."""
    u = env
    cap = int(getattr(policy, "cap", 0) or 0)
    obs_rows: dict[str, list[np.ndarray]] = {}
    acts: list[np.ndarray] = []
    rewards: list[float] = []
    returns: list[np.ndarray] = []
    goods: list[float] = []
    episode = 0
    while len(acts) < steps:
        obs, _ = u.reset(seed=seed + episode)  # type: ignore[attr-defined]
        trace = u.episode_trace  # type: ignore[attr-defined]
        policy.reset(PolicyContext(
            config=u.config, num_requests=len(trace), seed=seed + episode,  # type: ignore
            prompt_tokens=trace.prompt_tokens, arrival_s=trace.arrival_s,
            ttft_target_s=u.ttft_target, priority=trace.priority,  # type: ignore[attr-defined]
            slo_class=trace.slo_class))  # type: ignore[attr-defined]
        start, done, good = len(acts), False, 0.0
        while not done:
            dp = u.decision_point  # type: ignore[attr-defined]
            d = policy.decide(dp)
            keys = _keys(policy, dp)
            a = scores_of(u, dp, d, cap, keys)
            for k, v in obs.items():
                obs_rows.setdefault(k, []).append(v)
            acts.append(a)
            obs, r, te, tr, info = u.step(np.clip(a, -1.0, 1.0))  # type: ignore[attr-defined]
            rewards.append(float(r))
            good += info["num_good"]
            done = te or tr
        returns.append(discounted_returns(rewards[start:], gamma))
        goods.append(good)
        episode += 1
    return Demonstrations({k: np.stack(v) for k, v in obs_rows.items()}, np.stack(acts),
                          np.concatenate(returns), episode, float(np.mean(goods)))


def clone(policy: Any, demos: Demonstrations, epochs: int, batch_size: int, lr: float,
          seed: int = 0) -> dict[str, float]:
    """Fit an SB3 actor-critic ``policy`` to ``demos``: its mean scores to the score vectors
    (mean squared error), its critic to the discounted returns (scaled by their variance, so
    that neither term swamps the other). Returns the last minibatch's losses."""
    import torch as th

    obs = {k: th.as_tensor(v) for k, v in demos.obs.items()}
    target, ret = th.as_tensor(demos.actions), th.as_tensor(demos.returns)
    scale = float(ret.var()) + 1.0
    opt = th.optim.Adam(policy.parameters(), lr=lr)
    gen = th.Generator().manual_seed(seed)
    actor = loss = th.zeros(())
    for _ in range(epochs):
        for idx in th.randperm(len(target), generator=gen).split(batch_size):
            o = {k: v[idx] for k, v in obs.items()}
            mean = policy.get_distribution(o).distribution.mean
            value = policy.predict_values(o).squeeze(-1)
            actor = ((mean - target[idx]) ** 2).mean()
            loss = actor + ((value - ret[idx]) ** 2).mean() / scale
            opt.zero_grad()
            loss.backward()
            opt.step()
    return {"final_loss": float(loss.detach()), "final_actor_mse": float(actor.detach())}
