"""SLO-aware heuristics: spend no capacity on requests already lost.

* ``slo-edf``: earliest TTFT deadline first, shedding the unreachable.
* ``cb-sjf-work-shed``: CB-SJF-Work's order, shedding the unreachable (the strongest
  content-blind rule on the overloaded tasks: short requests first, nothing spent on lost
  ones).
* ``cb-sjf-work-fit``: the same, admitting a request only if the batch it joins still lets
  each of its members meet its TTFT target (the strongest content-blind rule on the study
  engine's tasks).
* ``cb-sjf-work-serial``: ``cb-sjf-work-shed`` admitting one prefill at a time (the strongest
  content-blind rule where prefill chunks stretch the decodes past their TPOT target);
  ``cb-sjf-work-fit-tiers`` and ``cb-sjf-work-serial-tiers`` order by TTFT target first.
* ``oracle-work-shed``: ``cb-sjf-work-shed`` ordered by the true work (privileged): what
  knowing every output length would add to it.

A waiting request is unreachable once it can no longer meet its TTFT target even if admitted
at once: it has no first token yet and waited + its own prefill at the engine's linearised
cost > target
(:func:`cbgym.agents.work.shed_lead`, the env's ``shed_rule="unreachable"``).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from cbgym.agents.base import QueueView
from cbgym.agents.cb_sjf_work import CBSJFWork
from cbgym.agents.oracles import _true_output
from cbgym.agents.params import parse_float
from cbgym.agents.work import shed_lead
from cbgym.engine.decision import Decision, DecisionPoint, Policy, PolicyContext

DEFAULT_TTFT_S = 2.0  # cbgym.metrics.SLO's default, when the run gives no targets


def ttft_targets(ctx: PolicyContext, name: str) -> np.ndarray:
    """Each request's TTFT target from the run's SLO (``DEFAULT_TTFT_S`` where none is given),
    checked."""
    ttft = ctx.ttft_target_s
    if ttft is None:
        ttft = np.full(ctx.num_requests, DEFAULT_TTFT_S)
    out = np.asarray(ttft, dtype=np.float64)
    if out.shape != (ctx.num_requests,) or not (out > 0).all():
        raise ValueError(f"{name}: ttft_target_s must hold {ctx.num_requests} positive "
                         f"targets, got shape {out.shape}")
    return out


def unreachable(dp: DecisionPoint, ttft: np.ndarray, lead: tuple[float, float]
                ) -> np.ndarray:
    """Which waiting requests can no longer meet their TTFT target: no first token yet, and
    waited + their own prefill at the engine's linearised cost exceeds it (the env's
    ``shed_rule="unreachable"``, :func:`cbgym.agents.work.shed_lead`). A re-queued
    (preempted) request that already has its first token is never among them."""
    w = dp.waiting
    fresh = dp.num_generated[w] == 0
    return fresh & (dp.now - dp.arrival_s[w] + lead[0] + lead[1] * dp.prompt_tokens[w] > ttft[w])


class ShedUnreachable:
    """Mixin of the SLO-aware policies: the run's TTFT targets and the shed lead, read at
    ``reset``; :meth:`ordered` turns keys into an order that sheds the unreachable."""

    name: str
    ttft: np.ndarray
    lead: tuple[float, float]

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)  # type: ignore[misc]
        self.ttft = ttft_targets(ctx, self.name)
        self.lead = shed_lead("unreachable", ctx.config)

    def ordered(self, dp: DecisionPoint, keys: np.ndarray, room: int | None = None) -> Decision:
        """Reachable waiting requests by ascending key (ties in queue order, as the engine
        breaks equal priorities), at most ``room`` of them; the unreachable shed."""
        waiting = dp.waiting
        lost = unreachable(dp, self.ttft, self.lead)
        keep = ~lost
        order = waiting[keep][np.argsort(keys[keep], kind="stable")]
        if room is not None:
            order = order[:max(room, 0)]
        return Decision(order=order, shed=waiting[lost].tolist(),
                        shed_reason="slo_unreachable")


class SLOEarliestDeadline(ShedUnreachable, Policy):
    """Admit waiting requests by TTFT deadline (arrival + the request's TTFT target), earliest
    first, ties in queue order; shed a waiting request once it can no longer meet its TTFT
    target (see the module docstring): it cannot count toward goodput but would still take
    capacity.

    Content-blind: it reads arrival times, the clock and the SLO targets, which a serving
    system knows (``PolicyContext.ttft_target_s``, filled by ``cbgym.simulate`` from its
    ``slo``; 2 s each when absent), prompt lengths and the engine's cost model. Not
    privileged. The deadline order alone is a static key, but reachability changes with the
    clock alone, so the engine asks at every iteration with someone waiting. Sheds are
    recorded with reason ``slo_unreachable``.
    """

    name = "slo-edf"
    consult = "every_iteration"

    def decide(self, dp: DecisionPoint) -> Decision:
        waiting = dp.waiting
        return self.ordered(dp, dp.arrival_s[waiting] + self.ttft[waiting])  # deadlines


class CBSJFWorkShed(ShedUnreachable, CBSJFWork):
    """CB-SJF-Work's order (least estimated work first, its content-blind estimate), and a
    waiting request is shed once it can no longer meet its TTFT target, as ``slo-edf`` sheds.

    The hand-written rule of ``docs/learned.md`` ("CB-SJF-Work + shed every late waiting
    request"), shedding earlier (unreachable, not only late): on overloaded tasks goodput is
    won by admitting short requests first and spending nothing on requests already lost.
    Content-blind, not privileged. Reachability changes with the clock alone, so the engine
    asks at every iteration with someone waiting.

    Args:
        cap: admission control: admit only while the running batch holds fewer than ``cap``
            requests (``cb-sjf-work-shed:24``; 0, the default: only the engine's
            ``max_num_seqs``). Past saturation a smaller batch keeps iterations short enough
            for the TPOT target; the benchmark tasks tune it on their validation windows.
    """

    name = "cb-sjf-work-shed"
    consult = "every_iteration"
    sheds = True  # its keys alone are not its decisions: the env agent refuses it

    def __init__(self, cap: int | str = 0) -> None:
        super().__init__()
        c = parse_float(cap, self.name, "cap", lo=0)
        if c != int(c):
            raise ValueError(f"policy {self.name!r}: cap must be a whole number, got {cap!r}")
        self.cap = int(c)
        self.label = f"{self.name}:{self.cap}" if self.cap else self.name

    def decide(self, dp: DecisionPoint) -> Decision:
        if len(dp.waiting) == 0:
            return super().decide(dp)
        keys = self.admission_keys(dp)
        return self.ordered(dp, keys, self.cap - len(dp.running) if self.cap else None)

    def admission_keys(self, dp: DecisionPoint) -> np.ndarray:
        """The waiting requests' keys, in ``dp.waiting``'s order (smallest admitted first)."""
        return np.asarray(self.keys(self.view(dp)), dtype=np.float64)


class CBSJFWorkFit(CBSJFWorkShed):
    """``cb-sjf-work-shed[:CAP]`` that admits a request only if the batch it joins still
    lets every member meet its TTFT target.

    The shed rule asks whether a request could meet its target if it were admitted alone.
    Requests admitted together share the prefill of their admission: about ``a + b (x_1 +
    ... + x_m)`` seconds at the engine's linearised cost (the shed lead's ``(a, b)``; x the
    tokens each must compute: its prompt, plus what it had generated if it was preempted).
    Going down CB-SJF-Work's order, a request joins if that time, its tokens added, stays
    within the least time to spare (target minus waited) of the batch and of itself. Else it
    is held: a shorter request further down may still fit, and it is shed once unreachable.
    So capacity goes to requests that can still count, and a long prompt does not make the
    whole admission miss. The first candidate is always taken (it is reachable: it fits
    alone, up to rounding, which must not idle the engine). Re-queued requests that already
    have a first token have no TTFT to miss. The batch is formed as if the engine admits all
    of it; one it cannot admit (KV memory) still counted against the others this iteration.

    The shared prefill is exact on the study's engine (``cbsjf-paper``), whose admission step
    prefills every admitted prompt at once. On vLLM's engines prefills are chunked within a
    token budget, so it is an estimate there. Measured in docs/benchmark.md.
    Content-blind, not privileged.
    """

    name = "cb-sjf-work-fit"

    def decide(self, dp: DecisionPoint) -> Decision:
        if len(dp.waiting) == 0:
            return super().decide(dp)
        # cb-sjf-work-shed's decision without its cap: the reachable by key, the rest shed
        shed = self.ordered(dp, self.admission_keys(dp))
        cand = np.asarray(shed.order)
        room = self.cap - len(dp.running) if self.cap else len(cand)
        a, b = self.lead
        tokens = (dp.prompt_tokens[cand] + dp.num_generated[cand]).astype(np.float64)
        spare = np.where(dp.num_generated[cand] == 0,
                         self.ttft[cand] - (dp.now - dp.arrival_s[cand]), np.inf)
        take = np.zeros(len(cand), dtype=bool)
        total, least, taken = 0.0, np.inf, 0
        for i in range(len(cand)):
            if taken >= room or (taken and a + b * total >= least):
                break  # (every request adds tokens: none further down can fit)
            if not taken or a + b * (total + tokens[i]) <= min(least, spare[i]):
                take[i] = True
                total += tokens[i]
                least = min(least, spare[i])
                taken += 1
        return replace(shed, order=cand[take])


class TiersFirst:
    """Mixin of the ``-tiers`` rules: the tighter TTFT target's requests first, then the
    rule's own keys (:func:`tier_ranks`)."""

    ttft: np.ndarray

    def admission_keys(self, dp: DecisionPoint) -> np.ndarray:
        return tier_ranks(super().admission_keys(dp), self.ttft[dp.waiting])  # type: ignore[misc]


def tier_ranks(keys: np.ndarray, ttft: np.ndarray) -> np.ndarray:
    """Each request's rank by (TTFT target, key): the tighter target first."""
    ranks = np.empty(len(keys))  # (a rank per request: ties already broken by position)
    ranks[np.lexsort((keys, ttft))] = np.arange(len(keys))
    return ranks


class CBSJFWorkFitTiers(TiersFirst, CBSJFWorkFit):
    """``cb-sjf-work-fit[:CAP]`` that admits the tighter TTFT target's requests first: by
    target, then by CB-SJF-Work's key, ties in queue order.

    With SLO tiers (the noisy neighbour's interactive 450 ms beside batch 30 s) a request
    with a loose target can wait and still count, one with a tight target cannot; within a
    target it is ``cb-sjf-work-fit``. With one target for every request it makes
    ``cb-sjf-work-fit``'s decisions (tested). Content-blind, not privileged: a serving
    system knows each request's SLO class, as ``slo-edf`` and ``strict-tiers`` read it.
    """

    name = "cb-sjf-work-fit-tiers"


def prefilling(dp: DecisionPoint) -> bool:
    """Whether a running request is still computing its prompt: fewer tokens computed than
    its prompt plus all but the last token it generated (a decoding request has computed
    ``prompt + generated - 1``; a preempted one recomputes all of them)."""
    r = dp.running
    return bool((dp.num_computed[r] < dp.prompt_tokens[r]
                 + np.maximum(dp.num_generated[r] - 1, 0)).any())


class CBSJFWorkSerial(CBSJFWorkShed):
    """``cb-sjf-work-shed[:CAP]`` that admits one prefill at a time: nothing while a running
    request is still computing its prompt, else the least-work reachable request alone.

    On vLLM's engines a prefill chunk shares its iteration with every running decode, so it
    stretches their inter-token time: on ``llama-2-7b/a100-80gb`` an iteration with a full
    2,048-token chunk takes about 140 ms against 17 ms for 10 decodes alone, past a 100 ms
    TPOT target, and requests with a handful of output tokens (the code trace's median is 13)
    have few fast tokens to average such iterations out. Admitting whenever the batch has
    room fills the token budget with the heads of the next prompts; this rule leaves an
    iteration at most one prompt's chunk, so prefill iterations are shorter (on
    ``code-vllm-bursty``'s validation windows, iterations with requests waiting, 928 prefill
    tokens each against 1,293 for ``cb-sjf-work-shed:16``), at the cost of budget left
    unused. With one admission the TTFT fit of ``cb-sjf-work-fit`` holds by itself: the
    first candidate is reachable alone. Measured in docs/benchmark.md. Content-blind, not
    privileged.
    """

    name = "cb-sjf-work-serial"

    def decide(self, dp: DecisionPoint) -> Decision:
        if len(dp.waiting) == 0:
            return super().decide(dp)
        room = 0 if prefilling(dp) else 1
        if self.cap:
            room = min(room, self.cap - len(dp.running))
        return self.ordered(dp, self.admission_keys(dp), room)


class CBSJFWorkSerialTiers(TiersFirst, CBSJFWorkSerial):
    """``cb-sjf-work-serial[:CAP]`` that admits the tighter TTFT target's requests first, as
    ``cb-sjf-work-fit-tiers`` orders them. With one target for every request it makes
    ``cb-sjf-work-serial``'s decisions (tested). Content-blind, not privileged."""

    name = "cb-sjf-work-serial-tiers"


class OracleWorkShed(CBSJFWorkShed):
    """``cb-sjf-work-shed[:CAP]`` with the true work ``c_f + c_p x + c_d y`` as its key:
    the same shedding and the same cap, the order of ``oracle-work``. Privileged.

    A reference, not a bound: it shows what knowing output lengths adds to a shortest-work
    order (other orders may do better; docs/benchmark.md). ``oracle-work`` alone never sheds,
    so past saturation it trails the content-blind rule and tells nothing of that.
    """

    name = "oracle-work-shed"
    privileged = True
    uses_output_stats = False

    def keys(self, view: QueueView) -> np.ndarray:
        return self.coef.work(view.prompt_tokens, _true_output(view))


# the capped rules by name: what ``tools/tune_caps.py`` tunes and what the slot scorer's
# residual prior plays (:mod:`cbgym.agents.slot_prior`)
CAPPED_RULES: dict[str, type[CBSJFWorkShed]] = {
    cls.name: cls for cls in (CBSJFWorkShed, CBSJFWorkFit, CBSJFWorkFitTiers, CBSJFWorkSerial,
                              CBSJFWorkSerialTiers)}
