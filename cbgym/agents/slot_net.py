"""A permutation-equivariant slot scorer for stable-baselines3 policies (needs torch).

The scheduling env's action is one score per waiting slot and one per running slot (or, in the
masked variant, one logit per slot plus STOP). A plain MLP over the flattened observation must
learn "short prompt => high score" separately for each of the K + R slot positions; here one
small network scores every slot from that slot's features and a shared context of the global
features, as Decima scores every node and RLScheduler shares one kernel across its job slots.
The same ranking rule then applies wherever a request sits in the window, and learns K times
faster.

* :class:`SlotScorer` is the ``mlp_extractor``: its policy latent *is* the action mean (or the
  logits), so the policy's ``action_net`` becomes the identity; its value latent comes from a
  plain MLP over every feature.
* :class:`SlotPolicy` (PPO, ``Box`` scores) and :class:`MaskableSlotPolicy` (MaskablePPO,
  ``Discrete(K + R + 1)``) plug it into SB3's ``MultiInputPolicy`` classes, so saving, loading
  and ``predict`` work unchanged. SB3 stores the policy class by import path in its zip: keep
  this module where it is.

Each slot also gets soft "waited longer than X s" flags (X = 0.25 s ... 32 s). The observation
scales waiting time logarithmically, so 1.6 s and 2.5 s differ by 0.02 in the input: an MLP
needs many updates to grow weights steep enough to act on an SLO deadline (measured: without
the flags, PPO never learned to shed requests that had missed their TTFT). Fixed steps make
"past the deadline" one weight away.

With ``tenant_features`` (``waiting_tenants``) and ``policy_kwargs={"tenant_inputs": True}``,
each slot's input also holds its own tenant's three counters (the tenant id decoded from the
slot), and the context all tenants' rows; by default only the critic reads them.

With ``prefix_features`` (``waiting_prefix``) and ``policy_kwargs={"prefix_inputs": True}``,
each waiting slot's input also holds its cached-prefix, uncached and shared-block counts
(running slots zeros), and the context the cache's hit rate.

With ``policy_kwargs={"batch_summary": True}`` the context also reads a summary of the
running batch (the masked mean and max of one shared embedding of each running slot): the
cap, which reads only the context, can then see the batch's members, not just its sums.

Two global features are left out of the scores: ``sim_time`` and ``total_preemptions`` count
from the start of an episode, so a policy trained on 512-request windows would see values it
never met on a full trace (``cbgym bench``). The critic keeps them (episode progress helps the
value, and the critic is not used to act).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from sb3_contrib.common.maskable.policies import MaskableMultiInputActorCriticPolicy
from stable_baselines3.common.policies import MultiInputActorCriticPolicy
from stable_baselines3.common.preprocessing import get_flattened_obs_dim
from torch import nn

from cbgym.env.observation import _COUNT_SPAN, SLOT_FEATURES, global_index, slot_index, time_scale
from cbgym.env.prefix_obs import FEATURES as PREFIX_FEATURES
from cbgym.env.prefix_obs import KEY as PREFIX_KEY
from cbgym.env.tenant_obs import FEATURES as TENANT_FEATURES
from cbgym.env.tenant_obs import KEY as TENANT_KEY

__all__ = ["MaskableSlotPolicy", "SlotPolicy", "SlotScorer"]

# episode-cumulative global features the scores ignore (see the module docstring)
NON_STATIONARY_GLOBALS = ("sim_time", "total_preemptions")
# "waited longer than X seconds" soft flags added to every slot (see SlotScorer)
WAIT_THRESHOLDS_S = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
_WAIT_SHARPNESS = 300.0  # per scaled unit: a flag goes from 0.2 to 0.8 within +-10% of X


_TIME = slot_index("time_in_system")
_TENANT = slot_index("tenant")


def _mlp(sizes: list[int], act: type[nn.Module]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(sizes, sizes[1:], strict=False):
        layers += [nn.Linear(a, b), act()]
    return nn.Sequential(*layers[:-1])  # no activation after the output layer


class SlotScorer(nn.Module):
    """Scores every waiting and running slot with shared weights; an MLP critic.

    Args:
        space: the env's ``Dict`` observation space (SB3's ``CombinedExtractor`` flattens it
            key by key in this order, which fixes where each key lies in the features).
        hidden: hidden layer sizes of the slot scorer and of the critic.
        stop_logit: add one more output computed from the context: the masked variant's STOP
            logit, or the running-cap score of ``Scheduling-v0`` with ``admission_cap``.
        act: activation function.
        tenant_inputs: with ``waiting_tenants`` in the observation, the scores read it too
            (each slot its own tenant's counters, the context every tenant's); else only the
            critic does (the default: the measured better of the two on
            ``tenants-noisy-neighbour``, docs/benchmark.md).
        prefix_inputs: with ``waiting_prefix`` in the observation, each waiting slot's score
            reads its prefix-cache counts and the context the hit rate; else only the critic
            does.
        prior: a :class:`cbgym.agents.slot_prior.PriorSpec` (as its dict): the scores are
            the heuristic prior's plus the network's, whose output layers start at zero
            (residual policy learning, :mod:`cbgym.agents.slot_prior`).
        batch_summary: the context also reads the running batch: each running slot's
            features (and waiting flags) through one shared layer, then the masked mean and
            max over the slots (a Deep Sets summary, Zaheer et al. 2017). The global features
            hold only sums over the batch; the cap and the admission scores can then act on
            its worst member (the request with the least time to spare, say).
    """

    def __init__(self, space: spaces.Dict, hidden: list[int], stop_logit: bool = False,
                 act: type[nn.Module] = nn.Tanh, tenant_inputs: bool = False,
                 prefix_inputs: bool = False, prior: Mapping[str, Any] | None = None,
                 batch_summary: bool = False) -> None:
        super().__init__()
        self.slices: dict[str, slice] = {}
        start = 0
        for key, sub in space.spaces.items():
            size = get_flattened_obs_dim(sub)
            self.slices[key] = slice(start, start + size)
            start += size
        self.K = self.slices["waiting_mask"].stop - self.slices["waiting_mask"].start
        self.R = self.slices["running_mask"].stop - self.slices["running_mask"].start
        self.F = (self.slices["waiting"].stop - self.slices["waiting"].start) // self.K
        assert self.F == len(SLOT_FEATURES), "observation layout changed"
        self.register_buffer("wait_centers", th.as_tensor(
            time_scale(np.array(WAIT_THRESHOLDS_S)), dtype=th.float32), persistent=False)
        # the tenants' fairness counters (tenant_features): each slot sees its own tenant's
        # row, the context all of them
        tenants = self.slices.get(TENANT_KEY) if tenant_inputs else None
        self.T = 0 if tenants is None else (tenants.stop - tenants.start) // len(TENANT_FEATURES)
        self.P = len(PREFIX_FEATURES) if prefix_inputs and PREFIX_KEY in self.slices else 0
        self.own = (self.F + len(WAIT_THRESHOLDS_S) + (len(TENANT_FEATURES) if self.T else 0)
                    + self.P)
        slot_in = self.own
        n_global = self.slices["global"].stop - self.slices["global"].start
        keep = np.ones(n_global, dtype=bool)
        keep[[global_index(name) for name in NON_STATIONARY_GLOBALS]] = False
        self.register_buffer("keep", th.as_tensor(np.flatnonzero(keep)), persistent=False)
        width = hidden[0]
        ctx_in = int(keep.sum()) + self.T * len(TENANT_FEATURES) + (1 if self.P else 0)
        # a running slot's embedding: its own features and waiting flags (not its tenant's
        # counters nor prefix zeros: the context holds those)
        self.batch_pool = (nn.Sequential(nn.Linear(self.F + len(WAIT_THRESHOLDS_S), width),
                                         act()) if batch_summary else None)
        ctx_in += 2 * width if batch_summary else 0
        self.context = nn.Sequential(nn.Linear(ctx_in, width), act())
        self.waiting_head = _mlp([slot_in + width, *hidden, 1], act)
        self.running_head = _mlp([slot_in + width, *hidden, 1], act)
        self.stop_head = nn.Linear(width, 1) if stop_logit else None
        self.critic = nn.Sequential(_mlp([start, *hidden], act), act())
        self.latent_dim_pi = self.K + self.R + int(stop_logit)
        self.latent_dim_vf = hidden[-1]
        self.prior: nn.Module | None = None
        if prior is not None:
            from cbgym.agents.slot_prior import HeuristicPrior, spec_from

            spec = spec_from(prior)
            if (spec.cap_score is not None) != stop_logit:
                raise ValueError("prior: its cap score and the action's cap dimension differ "
                                 f"(cap_score={spec.cap_score}, cap dimension={stop_logit})")
            self.prior = HeuristicPrior(spec, self.slices, self.K, self.R, self.F)

    def output_layers(self) -> list[nn.Linear]:
        """The layers that produce scores (initialised small, as SB3 does for its action net)."""
        heads = [self.waiting_head[-1], self.running_head[-1]]
        return heads + ([self.stop_head] if self.stop_head is not None else [])

    def forward(self, features: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        return self.forward_actor(features), self.forward_critic(features)

    def forward_actor(self, features: th.Tensor) -> th.Tensor:
        """One score per waiting slot, then per running slot (then STOP); 0 for empty slots."""
        scores = self.network_scores(features)
        return scores if self.prior is None else scores + self.prior(features)

    def network_scores(self, features: th.Tensor) -> th.Tensor:
        """The network's part of :meth:`forward_actor`: the residual where there is a prior
        (evolution strategies evaluate it for many parameter vectors at once and add the
        prior, which has no parameters, once: :mod:`cbgym.agents.evolution`)."""
        s = self.slices
        glob = features[:, s["global"]].index_select(1, self.keep)
        tenants = features[:, s[TENANT_KEY]] if self.T else None
        ctx_parts = [glob] + ([tenants] if tenants is not None else [])
        w_prefix = r_prefix = None
        if self.P:  # per waiting slot its counts, running slots none; the hit rate global
            pref = features[:, s[PREFIX_KEY]]
            w_prefix = pref[:, : self.K * self.P].reshape(-1, self.K, self.P)
            r_prefix = pref.new_zeros((pref.shape[0], self.R, self.P))
            ctx_parts.append(pref[:, self.K * self.P:])
        if self.batch_pool is not None:
            ctx_parts.append(self._batch_summary(features[:, s["running"]],
                                                 features[:, s["running_mask"]]))
        ctx = self.context(th.cat(ctx_parts, dim=1) if len(ctx_parts) > 1 else glob)
        out = [self._score(self.waiting_head, features[:, s["waiting"]],
                           features[:, s["waiting_mask"]], ctx, self.K, tenants, w_prefix),
               self._score(self.running_head, features[:, s["running"]],
                           features[:, s["running_mask"]], ctx, self.R, tenants, r_prefix)]
        if self.stop_head is not None:
            out.append(self.stop_head(ctx))
        return th.cat(out, dim=1)

    def _wait_flags(self, per_slot: th.Tensor) -> th.Tensor:
        waited = per_slot[:, :, _TIME : _TIME + 1]
        return th.sigmoid((waited - self.wait_centers) * _WAIT_SHARPNESS)

    def _batch_summary(self, slots: th.Tensor, mask: th.Tensor) -> th.Tensor:
        """Masked mean and max of the running slots' embeddings (zeros for an empty batch)."""
        assert self.batch_pool is not None
        per_slot = slots.reshape(-1, self.R, self.F)
        emb = self.batch_pool(th.cat((per_slot, self._wait_flags(per_slot)), dim=2))
        m = mask.unsqueeze(-1)
        n = m.sum(dim=1)
        mean = (emb * m).sum(dim=1) / n.clamp(min=1.0)
        # empty slots never win the max (whatever the activation's range); an empty batch
        # reads 0
        low = th.full_like(emb, th.finfo(emb.dtype).min)
        peak = th.where(m > 0.5, emb, low).amax(dim=1)
        peak = th.where(n > 0.5, peak, th.zeros_like(peak))
        return th.cat((mean, peak), dim=1)

    def _score(self, head: nn.Sequential, slots: th.Tensor, mask: th.Tensor, ctx: th.Tensor,
               n: int, tenants: th.Tensor | None = None,
               prefix: th.Tensor | None = None) -> th.Tensor:
        per_slot = slots.reshape(-1, n, self.F)
        flags = self._wait_flags(per_slot)
        if tenants is not None:  # the slot's tenant's counters (zeros past T tenants)
            who = th.round(th.exp2(per_slot[:, :, _TENANT] * _COUNT_SPAN) - 1.0).long()
            rows = tenants.reshape(-1, self.T, len(TENANT_FEATURES))
            mine = th.gather(rows, 1, who.clamp(0, self.T - 1).unsqueeze(-1).expand(
                -1, -1, len(TENANT_FEATURES)))
            flags = th.cat((flags, mine * (who < self.T).unsqueeze(-1)), dim=2)
        if prefix is not None:
            flags = th.cat((flags, prefix), dim=2)
        # The head's first layer sees [slot features, flags, context]; the context is the same
        # for every slot of a sample, so its part of the product is computed once per sample
        # and broadcast (the same function as concatenating it to each slot: 2x less work).
        first = head[0]
        own = self.own
        w_slot, w_ctx = first.weight[:, :own], first.weight[:, own:]
        hidden = (th.cat((per_slot, flags), dim=2) @ w_slot.T
                  + (ctx @ w_ctx.T + first.bias).unsqueeze(1))
        return head[1:](hidden).squeeze(-1) * mask

    def forward_critic(self, features: th.Tensor) -> th.Tensor:
        return self.critic(features)


def _hidden(net_arch: Any) -> list[int]:
    if isinstance(net_arch, dict):
        return list(net_arch.get("pi", [64, 64]))
    return list(net_arch or [64, 64])


class _SlotBuild:
    """Shared ``_build``: the scorer's latent is the action, so ``action_net`` is the identity."""

    observation_space: spaces.Dict
    net_arch: Any
    activation_fn: type[nn.Module]
    stop_logit: bool = False
    tenant_inputs: bool = False
    prefix_inputs: bool = False
    prior: dict[str, Any] | None = None
    batch_summary: bool = False

    def __init__(self, *args: Any, tenant_inputs: bool = False, prefix_inputs: bool = False,
                 prior: Mapping[str, Any] | None = None, batch_summary: bool = False,
                 **kwargs: Any) -> None:
        self.tenant_inputs = bool(tenant_inputs)  # (read while the base class builds)
        self.prefix_inputs = bool(prefix_inputs)
        self.batch_summary = bool(batch_summary)
        self.prior = None if prior is None else dict(prior)
        super().__init__(*args, **kwargs)

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()  # type: ignore[misc]
        data["tenant_inputs"] = self.tenant_inputs
        data["prefix_inputs"] = self.prefix_inputs
        if self.prior is not None:  # (absent otherwise: older zips load unchanged)
            data["prior"] = self.prior
        if self.batch_summary:  # (likewise)
            data["batch_summary"] = True
        return data

    def _build_mlp_extractor(self) -> None:
        space = self.observation_space
        slots = space["waiting_mask"].shape[0] + space["running_mask"].shape[0]
        action_space: Any = getattr(self, "action_space", None)
        n = getattr(action_space, "n", None) or (action_space.shape[0] if action_space else 0)
        # one output beyond the slots (STOP, or the running cap) comes from the context
        self.mlp_extractor = SlotScorer(space, _hidden(self.net_arch),
                                        stop_logit=self.stop_logit or int(n) > slots,
                                        act=self.activation_fn,
                                        tenant_inputs=self.tenant_inputs,
                                        prefix_inputs=self.prefix_inputs, prior=self.prior,
                                        batch_summary=self.batch_summary)

    def _build(self, lr_schedule: Callable[[float], float]) -> None:
        super()._build(lr_schedule)  # type: ignore[misc]
        self.action_net = nn.Identity()
        for layer in self.mlp_extractor.output_layers():
            # with a prior the policy starts as the prior exactly (a zero residual)
            nn.init.orthogonal_(layer.weight, gain=0.0 if self.prior else 0.01)
            nn.init.zeros_(layer.bias)
        # rebuilt so that the dropped linear action net's parameters are not optimised
        self.optimizer = self.optimizer_class(  # type: ignore[attr-defined]
            self.parameters(), lr=lr_schedule(1), **self.optimizer_kwargs)  # type: ignore


class SlotPolicy(_SlotBuild, MultiInputActorCriticPolicy):
    """PPO policy for ``cbgym/Scheduling-v0``: Gaussian scores from :class:`SlotScorer` (and
    the running cap from the context, with ``admission_cap``)."""


class MaskableSlotPolicy(_SlotBuild, MaskableMultiInputActorCriticPolicy):
    """MaskablePPO policy for ``cbgym/SchedulingMasked-v0``: slot logits plus STOP."""

    stop_logit = True
