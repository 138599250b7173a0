"""Admission control as a router: a base rule, and a 429 once the cluster holds enough.

``inflight-cap:N[:BASE]`` routes with BASE (default ``least-outstanding``) unless the
instances already hold N requests (waiting and running, as of the last load report; a
request of a pipelined disaggregated route counts on both its instances), and then sheds
the arrival: its client gets a 429 and may retry (:class:`~cbgym.cluster.edge.ClientModel`).
The cap is Little's law's ``mu x W`` (:meth:`cbgym.cluster.edge.AdmissionConfig.littles_law`)
when chosen from the capacity and a latency target; the cluster tasks tune N on their
validation windows. The same cap in the kernel, reading live queues, is
``AdmissionConfig(max_in_flight=N)``; this router is what an agent can do at the door.

``ttft-shed:F[:BASE[:K]]`` is the SLO-aware door (the cluster's ``slo-edf`` test): it routes with
BASE (default ``jsq-time``) and sheds the arrival when the instance that would run its
prefill cannot give it a first token within F x its TTFT target, by the load report's
estimate: that instance's pending prompt tokens (waiting and running, and the prompts routed
there since the report, each counted as this one, on a decode instance too: they join the
batch a deflected prefill shares) and this prompt, less what its prefix cache holds,
priced as one chunked prefill on its own cost model (jsq-time's estimate). The estimate
ignores the decodes sharing those iterations and, for a retried request, the time it
already waited, and pricing the queue as one sequence overstates a long queue of short
prompts: F, tuned on validation windows as the caps are, absorbs what it can.
``ttft-shed:F:BASE:K`` tightens the test as the instance's KV cache fills: the bound is F x
the target x exp(-K x its KV usage at the report). The estimate prices prefill alone, and the
more context the running batch holds the longer every iteration a new prompt shares with it,
and the nearer its decodes are to their TPOT target; a fixed F that is safe with a full cache
refuses requests an emptier one could serve (measured on the overload tasks' validation
windows: ``cbgym.tasks.cluster_tasks``, docs/benchmark.md). K = 0, the default, is the plain
door. A door's BASE is a router name with its default settings (as for ``inflight-cap``): the
field after it is always K, so ``ttft-shed:0.5:llm-d:16`` is llm-d's default threshold with
K = 16, not ``llm-d:16``.
"""

from __future__ import annotations

import numpy as np

from cbgym.cluster.route_ops import queue_seconds
from cbgym.cluster.routing import Route, Router, RouterContext, RoutingPoint
from cbgym.cluster.state import ROUTED
from cbgym.cluster.tables import loads_array, static_tables

SHED_REASON = "admission_cap"
UNREACHABLE = "ttft_unreachable"


DOORS = ("inflight-cap", "ttft-shed")


class Door(Router):
    """A base router behind an admission test: the base routes, the door may answer 429."""

    reads_loads = True
    base: Router

    def _set_base(self, base: str) -> None:
        from cbgym.agents.routing import make_router

        if base.startswith(DOORS):
            raise ValueError(f"router {self.name!r}: its base cannot be another door "
                             f"({', '.join(DOORS)}), got {base!r}")
        self.base = make_router(base)

    def reset(self, ctx: RouterContext) -> None:
        super().reset(ctx)
        self.base.reset(ctx)


class InFlightCap(Door):
    """A base router behind an in-flight cap (module docstring)."""

    name = "inflight-cap"

    def __init__(self, cap: str | int | None = None, base: str = "least-outstanding") -> None:
        try:
            self.cap = int(cap)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            self.cap = 0
        if self.cap < 1 or str(cap).strip() != str(self.cap):
            raise ValueError(f"router 'inflight-cap' needs a cap: 'inflight-cap:N[:BASE]' with "
                             f"N an int >= 1, got {cap!r}")
        self._set_base(base)
        self.label = f"{self.name}:{self.cap}:{base}"

    def route(self, rp: RoutingPoint) -> Route:
        loads = rp.loads
        if loads is not None and int(loads.outstanding().sum()) >= self.cap:
            return Route.shed(SHED_REASON)
        return self.base.route(rp)


class TTFTShed(Door):
    """A base router behind a TTFT-feasibility test (module docstring)."""

    name = "ttft-shed"

    def __init__(self, factor: str | float | None = None, base: str = "jsq-time",
                 kv: str | float = 0.0) -> None:
        try:
            self.factor = float(factor)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            self.factor = float("nan")
        if not (self.factor > 0 and np.isfinite(self.factor)):
            raise ValueError(f"router 'ttft-shed' needs a factor: 'ttft-shed:F[:BASE[:K]]' "
                             f"with F a number > 0 (of the TTFT target), got {factor!r}")
        try:
            self.kv = float(kv)
        except (TypeError, ValueError):
            self.kv = float("nan")
        if not (self.kv >= 0 and np.isfinite(self.kv)):
            raise ValueError(f"router 'ttft-shed': K (in 'ttft-shed:F:BASE:K', how much the "
                             f"bound tightens as the KV cache fills; BASE is a router name "
                             f"without arguments) must be a number >= 0, got {kv!r}")
        self._set_base(base)
        self.label = f"{self.name}:{self.factor:g}:{base}" + (f":{self.kv:g}" if self.kv else "")

    def reset(self, ctx: RouterContext) -> None:
        super().reset(ctx)
        self.inst, self.coefs = static_tables(ctx.config)

    def route(self, rp: RoutingPoint) -> Route:
        route = self.base.route(rp)
        if route.shed_reason is not None or rp.loads is None:
            return route
        i = route.prefill if route.prefill is not None else route.decode
        assert i is not None
        # Every request sent to the instance since the report counts as one more prompt ahead
        # of this one, on a decode instance too, where most were prefilled elsewhere: they
        # all join its batch, which a deflected prefill's chunks share. A deliberate
        # overcount: on code-2p2d-overload-retries' validation windows it keeps 468 (F 0.5)
        # against 444 for the best F with deflections priced on the report alone (0.1).
        # (the dynamic row jsq-time reads, in this router's own copy of the static table)
        self.inst[ROUTED] = 0 if rp.routed_since_report is None else rp.routed_since_report
        cached = 0 if rp.cached_tokens is None else int(rp.cached_tokens[i])
        t = queue_seconds(self.inst, self.coefs, loads_array(rp.loads), i,
                          np.int64(rp.prompt_tokens), np.int64(cached))
        bound = self.factor * float(rp.ttft_target_s)
        if self.kv:
            bound *= np.exp(-self.kv * float(rp.loads.kv_usage[i]))
        if t > bound:
            return Route.shed(UNREACHABLE)
        return route


__all__ = ["DOORS", "Door", "InFlightCap", "TTFTShed"]
