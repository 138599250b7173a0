"""Admission control as a router: a base rule, and a 429 once the cluster holds enough.

``inflight-cap:N[:BASE]`` routes with BASE (default ``least-outstanding``) unless the
instances already hold N requests (waiting and running, as of the last load report; a
request of a pipelined disaggregated route counts on both its instances), and then sheds
the arrival: its client gets a 429 and may retry (:class:`~cbgym.cluster.edge.ClientModel`).
The cap is Little's law's ``mu x W`` (:meth:`cbgym.cluster.edge.AdmissionConfig.littles_law`)
when chosen from the capacity and a latency target; the cluster tasks tune N on their
validation windows. The same cap in the kernel, reading live queues, is
``AdmissionConfig(max_in_flight=N)``; this router is what an agent can do at the door.
"""

from __future__ import annotations

from cbgym.cluster.routing import Route, Router, RouterContext, RoutingPoint

SHED_REASON = "admission_cap"


class InFlightCap(Router):
    """A base router behind an in-flight cap (module docstring)."""

    name = "inflight-cap"
    reads_loads = True

    def __init__(self, cap: str | int | None = None, base: str = "least-outstanding") -> None:
        from cbgym.agents.routing import make_router

        try:
            self.cap = int(cap)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            self.cap = 0
        if self.cap < 1 or str(cap).strip() != str(self.cap):
            raise ValueError(f"router 'inflight-cap' needs a cap: 'inflight-cap:N[:BASE]' with "
                             f"N an int >= 1, got {cap!r}")
        if base.startswith(self.name):
            raise ValueError("router 'inflight-cap': its base cannot be another cap")
        self.base = make_router(base)
        self.label = f"{self.name}:{self.cap}:{base}"

    def reset(self, ctx: RouterContext) -> None:
        super().reset(ctx)
        self.base.reset(ctx)

    def route(self, rp: RoutingPoint) -> Route:
        loads = rp.loads
        if loads is not None and int(loads.outstanding().sum()) >= self.cap:
            return Route.shed(SHED_REASON)
        return self.base.route(rp)


__all__ = ["InFlightCap"]
