"""Aging: any key policy plus credit for waiting, the classic cure for starvation.

``with_aging(P)`` ranks by ``P``'s key converted to seconds of work, minus ``W`` times the
seconds waited: ``W`` is dimensionless (seconds of work forgiven per second waited). With
``W = 1`` a request that waited 2 s ranks level with one that has 2 s less work; a huge ``W``
approaches FCFS. Because ``key - W (now - arrival)`` ranks exactly as ``key + W arrival``
(``now`` is shared), the wrapped key is computed from arrival time: it does not drift with the
clock, and an ``on_change`` base policy stays ``on_change``.

Registered as ``<policy>-aging:W``; a base policy's own argument comes first,
``noisy-oracle-aging:0.8,0.5`` or ``cb-sjf-work-aging:global,0.5``.

**Scaled to the SLO horizon** (``<policy>-slo-aging:W``): with several SLO classes a second
waited means more to a request with a 450 ms TTFT target than to one with 30 s, so the
credit is ``W`` seconds of work per TTFT target waited: ``key - W waited / T`` with ``T`` the
request's class's target (for one class of target T, ``slo-aging:W`` is ``aging:W/T``).
Requests of different targets then trade places as time passes, so the key is no longer
static: the policy ranks at every iteration with a request waiting (``consult =
"every_iteration"``; a Python call each).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cbgym.agents.base import KeyPolicy, QueueView
from cbgym.agents.cb_sjf_work import CBSJFWork
from cbgym.agents.noisy_oracle import NoisyOracle, NoisyOracleWork
from cbgym.agents.oracles import OracleSJF, OracleWork
from cbgym.agents.params import check_arity, parse_float
from cbgym.agents.predicted import CBSJFWorkPred, SJFPred
from cbgym.agents.sjf_ctx import SJFCtx
from cbgym.engine.decision import PolicyContext


def with_aging(base: type[KeyPolicy], per_slo: bool = False) -> type[KeyPolicy]:
    """A subclass of ``base`` whose key is ``key * key_unit_s + W * arrival`` (see module;
    ``per_slo``: ``key * key_unit_s - W * waited / T``, T the request's TTFT target)."""

    class Aging(base):  # type: ignore[valid-type, misc]
        __doc__ = (
            f"{base.__name__} with aging: its key in seconds of work minus ``weight`` x "
            f"``waited_s``. Privileged: {base.privileged}.\n\n"
            "    Args:\n"
            "        spec: the weight W >= 0 (seconds of work per second waited), or the string\n"
            "            ``'base_arg,W'`` for a base policy that takes an argument.\n"
            "        base_args: the base policy's arguments when ``spec`` is a number.\n"
        )
        name = f"{base.name}-{'slo-' if per_slo else ''}aging"
        static_key = base.static_key and not per_slo
        # requests of different targets trade places as time passes: rank every iteration
        consult = "every_iteration" if per_slo else base.consult

        def __init__(self, spec: str | float | None = None, *base_args: object) -> None:
            if spec is None:
                raise ValueError(f"policy {self.name!r} needs an aging weight: "
                                 f"'{self.name}:W' (seconds of work per second waited, >= 0)")
            if isinstance(spec, str):
                *args, weight = spec.split(",")
            else:
                args, weight = list(base_args), spec
            check_arity(base, base.name, args)
            super().__init__(*args)
            self.weight = parse_float(weight, self.name, "aging weight", 0.0)
            self.label = f"{self.name}:{','.join([*map(str, args), f'{self.weight:g}'])}"

        def reset(self, ctx: PolicyContext) -> None:
            super().reset(ctx)
            if per_slo:
                self._targets = class_targets(ctx, self.name)

        def keys(self, view: QueueView) -> np.ndarray:
            key = super().keys(view) * self.key_unit_s()
            if per_slo:
                waited = np.asarray(view.waited_s, dtype=np.float64)
                return key - self.weight * waited / self._targets(view.slo_class)
            arrival = view.now - np.asarray(view.waited_s, dtype=np.float64)
            return key + self.weight * arrival

    Aging.__name__ = Aging.__qualname__ = f"{base.__name__}{'SLO' if per_slo else ''}Aging"
    Aging.__module__ = __name__
    return Aging


def class_targets(ctx: PolicyContext, name: str) -> Callable[[np.ndarray], np.ndarray]:
    """Each SLO class's TTFT target, read from the run's per-request targets: a lookup from
    an array of classes to their targets (a class never seen: an error naming it)."""
    if ctx.ttft_target_s is None or ctx.slo_class is None:
        raise ValueError(f"policy {name!r} scales aging by each request's TTFT target: the "
                         "run must give its SLO targets and classes (PolicyContext."
                         "ttft_target_s, slo_class)")
    classes = np.asarray(ctx.slo_class, np.int64)
    targets = np.asarray(ctx.ttft_target_s, np.float64)
    known = {int(c): float(targets[np.argmax(classes == c)]) for c in np.unique(classes)}

    def lookup(slo_class: np.ndarray) -> np.ndarray:
        cls = np.asarray(slo_class, np.int64)
        out = np.empty(len(cls))
        for c in np.unique(cls):
            if int(c) not in known:
                raise ValueError(f"policy {name!r}: SLO class {int(c)} has no TTFT target in "
                                 f"this run (classes {sorted(known)})")
            out[cls == c] = known[int(c)]
        return out

    return lookup


SJFCtxAging = with_aging(SJFCtx)
CBSJFWorkAging = with_aging(CBSJFWork)
OracleSJFAging = with_aging(OracleSJF)
OracleWorkAging = with_aging(OracleWork)
NoisyOracleAging = with_aging(NoisyOracle)
NoisyOracleWorkAging = with_aging(NoisyOracleWork)

SJFPredAging = with_aging(SJFPred)
CBSJFWorkPredAging = with_aging(CBSJFWorkPred)
SJFCtxSLOAging = with_aging(SJFCtx, per_slo=True)
CBSJFWorkSLOAging = with_aging(CBSJFWork, per_slo=True)

AGING_POLICIES: tuple[type[KeyPolicy], ...] = (
    SJFCtxAging, CBSJFWorkAging, OracleSJFAging, OracleWorkAging, NoisyOracleAging,
    NoisyOracleWorkAging, SJFPredAging, CBSJFWorkPredAging, SJFCtxSLOAging, CBSJFWorkSLOAging,
)
