"""Aging: any key policy plus credit for waiting, the classic cure for starvation.

``with_aging(P)`` ranks by ``P``'s key converted to seconds of work, minus ``W`` times the
seconds waited: ``W`` is dimensionless (seconds of work forgiven per second waited). With
``W = 1`` a request that waited 2 s ranks level with one that has 2 s less work; a huge ``W``
approaches FCFS. Because ``key - W (now - arrival)`` ranks exactly as ``key + W arrival``
(``now`` is shared), the wrapped key is computed from arrival time: it does not drift with the
clock, and an ``on_change`` base policy stays ``on_change``.

Registered as ``<policy>-aging:W``; a base policy's own argument comes first,
``noisy-oracle-aging:0.8,0.5`` or ``cb-sjf-work-aging:global,0.5``.
"""

from __future__ import annotations

import numpy as np

from cbgym.agents.base import KeyPolicy, QueueView
from cbgym.agents.cb_sjf_work import CBSJFWork
from cbgym.agents.noisy_oracle import NoisyOracle, NoisyOracleWork
from cbgym.agents.oracles import OracleSJF, OracleWork
from cbgym.agents.params import check_arity, parse_float
from cbgym.agents.sjf_ctx import SJFCtx


def with_aging(base: type[KeyPolicy]) -> type[KeyPolicy]:
    """A subclass of ``base`` whose key is ``key * key_unit_s + W * arrival`` (see module)."""

    class Aging(base):  # type: ignore[valid-type, misc]
        __doc__ = (
            f"{base.__name__} with aging: its key in seconds of work minus ``weight`` x "
            f"``waited_s``. Privileged: {base.privileged}.\n\n"
            "    Args:\n"
            "        spec: the weight W >= 0 (seconds of work per second waited), or the string\n"
            "            ``'base_arg,W'`` for a base policy that takes an argument.\n"
            "        base_args: the base policy's arguments when ``spec`` is a number.\n"
        )
        name = f"{base.name}-aging"

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

        def keys(self, view: QueueView) -> np.ndarray:
            arrival = view.now - np.asarray(view.waited_s, dtype=np.float64)
            return super().keys(view) * self.key_unit_s() + self.weight * arrival

    Aging.__name__ = Aging.__qualname__ = f"{base.__name__}Aging"
    Aging.__module__ = __name__
    return Aging


SJFCtxAging = with_aging(SJFCtx)
CBSJFWorkAging = with_aging(CBSJFWork)
OracleSJFAging = with_aging(OracleSJF)
OracleWorkAging = with_aging(OracleWork)
NoisyOracleAging = with_aging(NoisyOracle)
NoisyOracleWorkAging = with_aging(NoisyOracleWork)

AGING_POLICIES: tuple[type[KeyPolicy], ...] = (
    SJFCtxAging, CBSJFWorkAging, OracleSJFAging, OracleWorkAging, NoisyOracleAging,
    NoisyOracleWorkAging,
)
