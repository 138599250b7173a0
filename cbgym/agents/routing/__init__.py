"""Routers: where a request runs in a cluster (the cluster's door, :mod:`cbgym.cluster.routing`).

``make_router("dynamo:1000:2")``: a spec name, then its arguments after colons.
"""

from __future__ import annotations

import inspect

from cbgym.agents.routing.admission import InFlightCap, TTFTShed
from cbgym.agents.routing.basic import (
    LeastOutstanding,
    PowerOfTwo,
    RandomRouter,
    RoundRobin,
    ShortestQueueTime,
    ShortestQueueTokens,
)
from cbgym.agents.routing.disagg import AlwaysDisaggregate, Dynamo, LlmD, NeverDisaggregate
from cbgym.agents.routing.kairos import Kairos, KairosTransfer
from cbgym.agents.routing.learned import LearnedRouter
from cbgym.agents.routing.prefix import PREFIX_ROUTERS
from cbgym.cluster.routing import Router

ROUTERS: dict[str, type[Router]] = {
    cls.name: cls for cls in (
        RandomRouter, RoundRobin, LeastOutstanding, ShortestQueueTokens, ShortestQueueTime,
        PowerOfTwo, AlwaysDisaggregate, NeverDisaggregate, Dynamo, LlmD, Kairos, KairosTransfer,
        LearnedRouter, InFlightCap, TTFTShed, *PREFIX_ROUTERS)
}


def make_router(spec: str | Router) -> Router:
    """A router from a spec (``"round-robin"``, ``"llm-d:16"``) or a Router (returned)."""
    if isinstance(spec, Router):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"router: expected a spec such as 'round-robin' or a Router, got "
                        f"{type(spec).__name__}")
    name, *args = spec.split(":")
    if name not in ROUTERS:
        raise ValueError(f"unknown router {name!r}; known: {', '.join(sorted(ROUTERS))}")
    cls = ROUTERS[name]
    most = len(inspect.signature(cls).parameters)
    if len(args) > most:
        raise ValueError(f"router {name!r} takes at most {most} argument(s) after ':', got "
                         f"{len(args)} in {spec!r}")
    return cls(*args)  # type: ignore[call-arg]


__all__ = ["ROUTERS", "make_router"]
