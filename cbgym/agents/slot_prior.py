"""A heuristic prior for the slot scorer: residual policy learning on ``Scheduling-v0``.

With ``policy_kwargs={"prior": ...}`` the actor's mean scores are *this prior plus the network's
output*, and the network's output layers start at zero, so PPO starts from a known rule exactly
(not from a clone with its fitting error) and learns only where to depart from it: residual
policy learning (Silver et al., 2018, "Residual Policy Learning"; Johannink et al., 2019,
"Residual Reinforcement Learning for Robot Control"). ``train.py --prior cb-sjf-work-shed:28``
builds it.

The prior is ``cb-sjf-work-shed[:CAP]`` (:class:`cbgym.agents.slo_edf.CBSJFWorkShed`),
``cb-sjf-work-fit[:CAP]`` (:class:`~cbgym.agents.slo_edf.CBSJFWorkFit`) or
``cb-sjf-work-fit-tiers[:CAP]`` (:class:`~cbgym.agents.slo_edf.CBSJFWorkFitTiers`) or
``cb-sjf-work-serial[-tiers][:CAP]`` (:class:`~cbgym.agents.slo_edf.CBSJFWorkSerial`) written as
a function of the observation alone, so it reads nothing the env does not show:

| slot / score    | prior                                                                    |
|-----------------|--------------------------------------------------------------------------|
| waiting slot    | ``lo + (1 - lo) / (1 + k / 1 s)``, k = CB-SJF-Work's key (seconds of     |
|                 | work: ``c_f + c_p x + c_d yhat``, ``yhat`` the bucket's recent mean output |
|                 | from ``global``, else the overall mean, else 128; at least generated + 1)|
|                 | and ``lo`` just above the hold threshold: falls with k, never held       |
| with tiers      | ``-tiers`` only: the range above ``lo`` split into one band per distinct |
|                 | TTFT target, the tightest highest; a request's own band by k as above    |
| unreachable     | -1.5 (at or below any shed threshold; shed by the env's own rule): no    |
|                 | first token and waited + ``c_f`` + ``c_p x`` > its class's TTFT target    |
| not fitting     | ``cb-sjf-work-fit[-tiers]`` only: hold - 0.05 (held) for a reachable     |
|                 | request its rule leaves out of the batch (the shared prefill would make  |
|                 | one of them miss its target)                                             |
| one at a time   | ``cb-sjf-work-serial[-tiers]`` only: hold - 0.05 for every reachable     |
|                 | request but the least-key one (the first in slot order among equal      |
|                 | keys), and for that one too while a visible running slot is still       |
|                 | computing its prompt (computed < prompt + generated - 1, at least the   |
|                 | prompt)                                                                  |
| running slot j  | ``1 - 2 j / R``: vLLM's victims, the most recently admitted first        |
| running cap     | the score whose cap is CAP (1 without one)                               |
| empty slot      | 0                                                                        |

Every quantity is decoded from the observation in float64: prompt and generated tokens exactly
(count scaling), the output statistics exactly (power-of-two scaling), the time waited to
float32's precision (microseconds: a request within that of a threshold may be decided the
other way, more often with ``cb-sjf-work-fit``, which compares more thresholds). Within the
visible window the prior admits what the heuristic would, in its order (tested against the fast
path); requests outside the window are held, as the env holds them. So where
``cb-sjf-work-serial``'s pick lies outside the window, the prior admits the least-key visible
request instead. (Its prefill test sees the R most recent running requests: under the rule at
most one is computing its prompt, the most recently admitted, always visible.)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch as th
from torch import nn

from cbgym.agents.base import OUTPUT_STAT_EDGES
from cbgym.agents.slo_edf import (
    CAPPED_RULES,
    CBSJFWorkFit,
    CBSJFWorkSerial,
    CBSJFWorkShed,
    TiersFirst,
)
from cbgym.agents.work import PRIOR_OUTPUT_TOKENS, shed_lead, work_coefficients
from cbgym.engine.config import EngineConfig
from cbgym.env.observation import (
    _COUNT_SPAN,
    _MEAN_TOKENS_SCALE,
    _TIME_SPAN,
    NUM_OUTPUT_BUCKETS,
    global_index,
    slot_index,
)
from cbgym.metrics import SLO, SLOSpec

__all__ = ["PRIOR_POLICIES", "HeuristicPrior", "PriorSpec", "prior_spec"]

PRIOR_POLICIES = tuple(CAPPED_RULES)
UNREACHABLE_SCORE = -1.5  # past the range on purpose: SB3 clips, so exploration noise never
# lifts a shed above a -0.99 threshold
_KEY_SCALE_S = 1.0  # keys of 10 ms to 100 s stay apart in float32
_TIER_SPAN_S = 1e6  # a tier's offset in the batch's sort key: past any key (seconds of work)

_MEANS = [global_index(f"recent_output_mean_{b}") for b in range(NUM_OUTPUT_BUCKETS)]
_SEEN = [global_index(f"recent_output_seen_{b}") for b in range(NUM_OUTPUT_BUCKETS)]
_MEAN_ALL, _SEEN_ALL = global_index("recent_output_mean_all"), global_index(
    "recent_output_seen_all")
_PROMPT, _GENERATED = slot_index("prompt_tokens"), slot_index("num_generated")
_WAITED, _CLASS = slot_index("time_in_system"), slot_index("slo_class")
_COMPUTED = slot_index("num_computed")


@dataclass(frozen=True)
class PriorSpec:
    """The constants of the prior (plain numbers: SB3 saves them in the zip's policy kwargs).

    Attributes:
        work: ``(c_f, c_p, c_d)`` of the engine (:func:`cbgym.agents.work.work_coefficients`).
        lead: the ``"unreachable"`` shed lead ``(a, b)`` (:func:`cbgym.agents.work.shed_lead`).
        ttft_s: the TTFT target of SLO class 0, 1, ... (one entry: every class).
        policy: the rule's spec (the ``-tiers`` rules order by the classes' targets).
        hold: the env's hold threshold.
        cap_score: the running-cap score (1.0: no cap); None if the env has no cap score.
    """

    work: tuple[float, float, float]
    lead: tuple[float, float]
    ttft_s: tuple[float, ...]
    hold: float
    cap_score: float | None
    policy: str = ""


def prior_spec(policy: str, engine: EngineConfig, slo: SLOSpec, hold: float,
               admission_cap: bool) -> PriorSpec:
    """The prior that plays ``policy`` (``cb-sjf-work-shed[:CAP]``) on an env with this engine,
    SLO, hold threshold and cap score; a ValueError names what is not supported."""
    from cbgym.agents.imitation import cap_score

    name, _, arg = policy.partition(":")
    if name not in PRIOR_POLICIES:
        raise ValueError(f"prior {policy!r}: expected one of {', '.join(PRIOR_POLICIES)} "
                         "(optionally :CAP)")
    cap = int(arg) if arg else 0
    if cap < 0 or (arg and str(cap) != arg):
        raise ValueError(f"prior {policy!r}: CAP must be a whole number >= 0")
    if cap and not admission_cap:
        raise ValueError(f"prior {policy!r}: a cap needs the env's cap score (admission_cap)")
    c = work_coefficients(engine)
    if isinstance(slo, SLO):
        ttft: tuple[float, ...] = (slo.ttft_s,)
    else:
        classes = sorted(slo)
        if classes != list(range(len(classes))):
            raise ValueError(f"prior {policy!r}: SLO classes must be 0..n-1, got {classes}")
        ttft = tuple(float(slo[k].ttft_s) for k in classes)
    score = (cap_score(cap, engine.max_num_seqs) if cap else 1.0) if admission_cap else None
    return PriorSpec((c.fixed_s, c.prefill_token_s, c.decode_seq_s),
                     shed_lead("unreachable", engine), ttft, float(hold), score, policy)


def spec_from(data: PriorSpec | Mapping[str, Any]) -> PriorSpec:
    """A spec from itself or from its saved dict (lists for tuples)."""
    if isinstance(data, PriorSpec):
        return data
    d = dict(data)
    return PriorSpec(tuple(d["work"]), tuple(d["lead"]), tuple(d["ttft_s"]),  # type: ignore
                     float(d["hold"]), d["cap_score"], d.get("policy", ""))


def spec_dict(spec: PriorSpec) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(spec).items()}


def _count(v: th.Tensor) -> th.Tensor:
    return th.round(th.exp2(v * _COUNT_SPAN) - 1.0)


class HeuristicPrior(nn.Module):
    """The prior's score vector (module docstring) from SB3's flattened observation batch.

    Args:
        spec: the constants.
        slices: where each observation key lies in the flattened features.
        K, R, F: waiting slots, running slots, features per slot.
    """

    def __init__(self, spec: PriorSpec, slices: Mapping[str, slice], K: int, R: int,
                 F: int) -> None:
        super().__init__()
        self.spec, self.slices, self.K, self.R, self.F = spec, dict(slices), K, R, F
        self.lo = spec.hold + 0.05 * (1.0 - spec.hold)
        # cb-sjf-work-fit holds a reachable request its batch would make miss: below the hold
        # threshold (held; the env sheds only unreachable requests, whatever their score)
        name = spec.policy.partition(":")[0]
        rule = CAPPED_RULES.get(name, CBSJFWorkShed)  # (a spec saved before it named a rule)
        self.fit = issubclass(rule, CBSJFWorkFit)
        self.held = spec.hold - 0.05
        self.serial = issubclass(rule, CBSJFWorkSerial)
        # each SLO class's tier: the rank of its TTFT target among the distinct ones (tightest
        # 0); with "-tiers" a tier orders before every looser one, else one tier for all
        targets = sorted(set(spec.ttft_s))
        tier = [targets.index(t) if issubclass(rule, TiersFirst) else 0 for t in spec.ttft_s]
        self.tiers = max(tier) + 1
        self.register_buffer("tier", th.as_tensor(tier, dtype=th.float64), persistent=False)
        self.register_buffer("edges", th.as_tensor(OUTPUT_STAT_EDGES, dtype=th.float64),
                             persistent=False)
        self.register_buffer("ttft", th.as_tensor(spec.ttft_s, dtype=th.float64),
                             persistent=False)
        running = 1.0 - th.arange(R, dtype=th.float32) * (2.0 / max(R, 1))
        self.register_buffer("running", running, persistent=False)

    def forward(self, features: th.Tensor) -> th.Tensor:
        s, K = self.slices, self.K
        x = features.double()
        glob = x[:, s["global"]]
        slots = x[:, s["waiting"]].reshape(-1, K, self.F)
        mask = x[:, s["waiting_mask"]]
        prompt, generated = _count(slots[..., _PROMPT]), _count(slots[..., _GENERATED])
        # yhat: the prompt's bucket mean, else the overall mean, else the prior (work.py)
        fallback = th.where(glob[:, _SEEN_ALL] > 0.5, glob[:, _MEAN_ALL] / _MEAN_TOKENS_SCALE,
                            th.full_like(glob[:, _MEAN_ALL], PRIOR_OUTPUT_TOKENS))
        table = th.where(glob[:, _SEEN] > 0.5, glob[:, _MEANS] / _MEAN_TOKENS_SCALE,
                         fallback.unsqueeze(1))
        bucket = th.bucketize(prompt, self.edges, right=True)
        yhat = th.maximum(th.gather(table, 1, bucket), generated + 1.0)
        c_f, c_p, c_d = self.spec.work
        key = (c_f + c_p * prompt + c_d * yhat).clamp(min=0.0)
        waited = (th.exp2(slots[..., _WAITED] * _TIME_SPAN) - 1.0) / 1000.0
        cls = _count(slots[..., _CLASS]).long().clamp(0, len(self.spec.ttft_s) - 1)
        tier = self.tier[cls]
        band = (self.tiers - 1 - tier + 1.0 / (1.0 + key / _KEY_SCALE_S)) / self.tiers
        score = self.lo + (1.0 - self.lo) * band
        key = key + _TIER_SPAN_S * tier  # the batch is formed in the same order
        a, b = self.spec.lead
        lost = (generated == 0) & (waited + a + b * prompt > self.ttft[cls])
        if self.fit:
            spare = th.where(generated == 0, self.ttft[cls] - waited,
                             th.full_like(waited, math.inf))
            fits = self._fits(key, (mask > 0.5) & ~lost, prompt + generated, spare)
            score = th.where(fits, score, th.full_like(score, self.held))
        if self.serial:
            score = th.where(self._one(x, key, (mask > 0.5) & ~lost), score,
                             th.full_like(score, self.held))
        waiting = th.where(lost, th.full_like(score, UNREACHABLE_SCORE), score) * mask
        out = [waiting.float(), self.running * features[:, s["running_mask"]]]
        if self.spec.cap_score is not None:
            out.append(features.new_full((features.shape[0], 1), self.spec.cap_score))
        return th.cat(out, dim=1)

    def _one(self, x: th.Tensor, key: th.Tensor, candidate: th.Tensor) -> th.Tensor:
        """cb-sjf-work-serial's admission (:class:`cbgym.agents.slo_edf.CBSJFWorkSerial`):
        the least-key candidate (the first slot among equal keys), none while a running
        slot is still computing its prompt."""
        run = x[:, self.slices["running"]].reshape(-1, self.R, self.F)
        prompt, computed = _count(run[..., _PROMPT]), _count(run[..., _COMPUTED])
        owed = prompt + (_count(run[..., _GENERATED]) - 1.0).clamp(min=0.0)
        busy = ((computed < owed) & (x[:, self.slices["running_mask"]] > 0.5)).any(dim=1)
        first = th.argmin(th.where(candidate, key, th.full_like(key, math.inf)), dim=1)
        one = th.zeros_like(candidate).scatter(1, first[:, None], True)
        return one & candidate & ~busy[:, None]

    def _fits(self, key: th.Tensor, candidate: th.Tensor, tokens: th.Tensor, spare: th.Tensor
              ) -> th.Tensor:
        """cb-sjf-work-fit's batch (:class:`cbgym.agents.slo_edf.CBSJFWorkFit`): going down
        the candidates by key (ties in slot order, the queue's), each joins while the shared
        prefill ``a + b (tokens so far + its own)`` stays within the least time to spare of
        the batch and its own. (Its cap is the env's cap score, applied to this order.)"""
        a, b = self.spec.lead
        order = th.sort(th.where(candidate, key, th.full_like(key, math.inf)), dim=1,
                        stable=True).indices
        cand, tok = th.gather(candidate, 1, order), th.gather(tokens, 1, order)
        spare = th.gather(spare, 1, order)
        total = th.zeros_like(key[:, 0])
        least = th.full_like(total, math.inf)
        taken = th.zeros_like(cand)
        first = th.ones_like(cand[:, 0])  # nobody taken yet: the first candidate always is
        for i in range(self.K):  # sequential by nature: who fits depends on who joined
            t, m = total + tok[:, i], th.minimum(least, spare[:, i])
            ok = cand[:, i] & (first | (a + b * t <= m))
            first = first & ~ok
            taken[:, i] = ok
            total, least = th.where(ok, t, total), th.where(ok, m, least)
        return th.zeros_like(taken).scatter(1, order, taken)


def as_numpy(prior: HeuristicPrior, obs: Mapping[str, np.ndarray]) -> np.ndarray:
    """The prior's scores for one observation dict (a test and debugging helper)."""
    flat = th.as_tensor(np.concatenate([np.asarray(obs[k], np.float32).ravel()
                                        for k in prior.slices]))[None]
    with th.no_grad():
        return prior(flat)[0].numpy()
