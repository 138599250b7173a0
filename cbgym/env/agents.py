"""Baseline policies acting on the environment's observations (the second of the two ways).

:class:`EnvAgent` wraps a key policy (:class:`cbgym.agents.base.KeyPolicy`, or FCFS) so that it
plays ``cbgym/Scheduling-v0`` or ``cbgym/SchedulingMasked-v0`` from what the agent observes:

* the :class:`~cbgym.agents.base.QueueView` is rebuilt from the ``waiting`` window of the
  observation: integer features are recovered exactly from their count scaling, the output-length
  statistics exactly from their power-of-two scaling; waited times and the clock come from
  ``info["waiting_time_in_system_s"]`` / ``info["sim_time_s"]`` (float64, bit-exact; the float32
  observation would round them), falling back to the observation when no info is given;
* with ``prefix_features`` (``waiting_prefix``), ``cached_tokens`` comes exactly from its
  count scaling, so the cache-aware policies (``shortest-uncached-first``, ``k-lpm``...) rank
  as on the fast path; without it the view has none (as if nothing were cached: each such
  policy plays its cache-blind twin, even on an engine with prefix caching);
* oracles (``privileged = True``) read true output lengths through the env's explicitly
  privileged accessors (the episode's lengths at reset, the visible slots' request ids each
  step; ``noisy-oracle`` thus sees its own corrupted lengths), never through obs or info;
* keys become scores by rank: the best key gets 1.0, the others follow down to just above
  the hold threshold, ties in slot (queue) order; running slots get vLLM's default victim
  order (the most recently admitted scores lowest). The masked variant emits the slots in key
  order, then STOP, and on a memory shortfall the most recently admitted running slot left.

Whenever the waiting queue fits in the window (at most K waiting), the agent reproduces the
fast path (``cbgym.simulate`` with the same policy) request for request, bit for bit. The
exceptions: ``random`` draws fresh scores on the env (its fast-path keys are per request id,
which the view does not carry; see :class:`cbgym.agents.RandomOrder`), and preemptive
``oracle-srpt`` and the shedding ``slo-edf``, ``cb-sjf-work-shed``, ``cb-sjf-work-fit[-tiers]``,
``cb-sjf-work-serial[-tiers]`` and ``oracle-work-shed`` (``sheds = True``) run on the fast
path only (constructing an EnvAgent for them raises ``TypeError``). The learned-predictor
policies (``sjf-pred``, ``cb-sjf-work:hgb``) read each slot's features at arrival, an opt-in
part of the observation: they need an env made with ``arrival_features=True``
(:mod:`cbgym.env.arrival_obs`).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from cbgym.agents.base import KeyPolicy, QueueView
from cbgym.agents.predicted import PredictedOutput
from cbgym.engine.decision import Policy, PolicyContext
from cbgym.env.arrival_obs import KEY as ARRIVAL_KEY
from cbgym.env.arrival_obs import decode_arrival
from cbgym.env.observation import (
    decode_recent,
    decode_slots,
    global_index,
    time_unscale,
)
from cbgym.env.prefix_obs import KEY as PREFIX_KEY
from cbgym.env.prefix_obs import decode_prefix
from cbgym.env.scheduling_env import SchedulingEnv

__all__ = ["EnvAgent", "run_episode"]

_SHORTFALL = global_index("shortfall_phase")
_NUM_CHOSEN = global_index("num_chosen")
_SIM_TIME = global_index("sim_time")


def _plays_env(policy: Policy) -> bool:
    """Key policies that do not shed (their keys alone are their decisions), and the random
    control (its ``keys`` draws fresh scores on the env)."""
    from cbgym.agents.random_order import RandomOrder

    return isinstance(policy, KeyPolicy | RandomOrder) and not getattr(policy, "sheds", False)


class EnvAgent:
    """A baseline policy playing the scheduling env from observations.

    Args:
        policy: a :class:`KeyPolicy` (or FCFS) object or a registered name
            (``cbgym.agents.POLICIES``, e.g. ``"fcfs"``, ``"noisy-oracle:0.8"``).
        env: the environment it plays (any wrapper of a :class:`SchedulingEnv`); used for its
            layout, and by oracles for the privileged true output lengths.
        seed: handed to the policy's ``reset`` (as ``cbgym.simulate(seed=...)`` does).

    Call :meth:`reset` after each ``env.reset`` (``run_episode`` does), then :meth:`act`.
    """

    def __init__(self, policy: Policy | str, env: gym.Env, seed: int = 0) -> None:
        from cbgym.simulate import resolve_policy

        self.policy = resolve_policy(policy)
        if not _plays_env(self.policy):
            raise TypeError(f"policy {self.policy.name!r} is not a key policy (or it sheds): "
                            "it runs on the fast path (cbgym.simulate) only")
        base = env.unwrapped
        if not isinstance(base, SchedulingEnv):
            raise TypeError(f"EnvAgent needs a cbgym SchedulingEnv, got {type(base).__name__}")
        if isinstance(self.policy, PredictedOutput) and not base.arrival_features:
            raise TypeError(f"policy {self.policy.name!r} ranks by features at arrival: make "
                            "the env with arrival_features=True (cbgym.env.arrival_obs)")
        self.env = base
        self.seed = seed
        self.K, self.R = base.K, base.R
        lo = base.hold_threshold + 0.05 * (1.0 - base.hold_threshold)
        # rank r -> 1 - r * step: every admitted slot stays above the hold threshold
        self._rank_scores = (1.0 - np.arange(self.K) * (1.0 - lo) / max(self.K - 1, 1))
        self._victim_scores = 1.0 - np.arange(self.R) * (2.0 / self.R)
        self._plan: list[int] = []
        self._pos = 0

    def reset(self) -> None:
        """Start an episode: hand the policy its context (oracles: the privileged outputs)."""
        env = self.env
        true = env.privileged_episode_true_output_tokens() if self.policy.privileged else None
        trace = env.episode_trace
        self.policy.reset(PolicyContext(config=env.config, num_requests=len(trace),
                                        seed=self.seed, true_output_tokens=true,
                                        ttft_target_s=getattr(env, "ttft_target", None),
                                        priority=trace.priority, slo_class=trace.slo_class,
                                        trace_name=trace.name,
                                        clock_s=trace.extra.get("epoch_s")))
        self._plan, self._pos = [], 0

    # ------------------------------------------------------------------ acting
    def act(self, obs: dict[str, np.ndarray], info: dict[str, Any] | None = None
            ) -> np.ndarray | int:
        """The action for ``obs`` (a score vector, or a slot index for the masked variant)."""
        if self.env.masked:
            return self._act_masked(obs, info)
        scores = np.zeros(self.env.layout.size, dtype=np.float32)
        if self.env.admission_cap:
            scores[-1] = 1.0  # no cap beyond the engine's: a baseline admits as it would
        order = self.slot_order(obs, info)
        scores[order] = self._rank_scores[: len(order)]
        nr = int(np.count_nonzero(obs["running_mask"] > 0.5))
        scores[self.K:self.K + nr] = self._victim_scores[:nr]
        return scores

    def _act_masked(self, obs: dict[str, np.ndarray], info: dict[str, Any] | None) -> int:
        mask = info["action_mask"] if info is not None else self.env.action_masks()
        stop = self.K + self.R
        if obs["global"][_SHORTFALL] > 0.5:
            allowed = np.flatnonzero(mask[self.K:stop])
            return int(self.K + allowed[-1])  # vLLM's default: the latest admitted goes first
        if obs["global"][_NUM_CHOSEN] == 0.0:  # a new decision point: rank once
            self._plan, self._pos = self.slot_order(obs, info).tolist(), 0
        while self._pos < len(self._plan):
            slot = self._plan[self._pos]
            self._pos += 1
            if mask[slot]:
                return slot
        return stop

    def slot_order(self, obs: dict[str, np.ndarray], info: dict[str, Any] | None) -> np.ndarray:
        """Visible waiting slots in admission order (best key first, ties by slot)."""
        if self.policy.consult == "never":  # its decision is always the default: queue order
            return np.flatnonzero(obs["waiting_mask"] > 0.5)
        view = self.view(obs, info)
        if len(view.queue_pos) == 0:
            return np.empty(0, np.int64)
        keys = np.asarray(self.policy.keys(view), dtype=np.float64)  # type: ignore[attr-defined]
        return np.argsort(keys, kind="stable")

    def view(self, obs: dict[str, np.ndarray], info: dict[str, Any] | None = None) -> QueueView:
        """The QueueView of the visible waiting slots, rebuilt from the observation."""
        d = decode_slots(obs["waiting"], obs["waiting_mask"])
        n = len(d["prompt_tokens"])
        if info is not None and "waiting_time_in_system_s" in info:
            waited = np.asarray(info["waiting_time_in_system_s"], dtype=np.float64)[:n]
            now = float(info["sim_time_s"])
        else:
            waited = d["time_in_system"]
            now = float(time_unscale(obs["global"][_SIM_TIME]))
        by_bucket, mean = decode_recent(obs["global"])
        true = None
        if self.policy.privileged:
            true = self._privileged_outputs(n)
        cached = None
        if PREFIX_KEY in obs:
            cached = decode_prefix(obs[PREFIX_KEY], obs["waiting_mask"])[0]["cached_tokens"]
        predicted = None
        if isinstance(self.policy, PredictedOutput):  # (the same rows the fast path makes)
            rows = decode_arrival(obs[ARRIVAL_KEY], obs["waiting_mask"])
            predicted = self.policy.predictor.predict(rows)
        return QueueView(
            queue_pos=np.arange(n), prompt_tokens=d["prompt_tokens"],
            num_computed=d["num_computed"], num_generated=d["num_generated"],
            num_preemptions=d["num_preemptions"], waited_s=waited, tenant=d["tenant"],
            slo_class=d["slo_class"], now=now, recent_output_by_bucket=by_bucket,
            recent_output_mean=mean, true_output_tokens=true, cached_tokens=cached,
            predicted_output=predicted,
        )

    def _privileged_outputs(self, n: int) -> np.ndarray:
        """True output lengths of the visible slots, as the policy believes them.

        A key policy carries its per-request-id lengths (``privileged_output_tokens``: the
        truth, or the corrupted copy of ``noisy-oracle``); they are indexed by the visible
        slots' request ids, which the env exposes for this privileged path only.
        """
        per_id = getattr(self.policy, "privileged_output_tokens", None)
        if per_id is None:
            return self.env.privileged_true_output_tokens()[:n].astype(np.int64)
        return np.asarray(per_id)[self.env.visible_waiting_ids[:n]]


def run_episode(env: gym.Env, agent: EnvAgent, seed: int | None = None,
                options: dict[str, Any] | None = None) -> dict[str, float]:
    """Play one episode; returns the return, step count and goodput."""
    obs, info = env.reset(seed=seed, options=options)
    agent.reset()
    total, steps, good = 0.0, 0, 0
    while True:
        obs, reward, terminated, truncated, info = env.step(agent.act(obs, info))
        total += float(reward)
        steps += 1
        good += int(info["num_good"])
        if terminated or truncated:
            return {"return": total, "steps": float(steps), "num_good": float(good),
                    "terminated": float(terminated)}
