"""The cluster loop: instances of the one engine, advanced in global time order.

Every instance is an :class:`~cbgym.engine.Engine` built with ``routed=True``; the loop
delivers the requests the router places there, carries the KV of disaggregated requests
over the :class:`~cbgym.cluster.link.Link`, and never reaches into an instance's internals
beyond the handoff kernels (:mod:`cbgym.engine.handoff`). A disaggregated request, as vLLM's
disaggregated prefill serves it:

1. arrives, is routed to prefill instance P and decode instance D, and is delivered to P with
   one output token (vLLM's proxy sends it with ``max_tokens=1``);
2. P computes its prompt (chunked under P's budget); when the last chunk is done it leaves
   P's batch, P keeps its blocks and reports it; it is delivered to D at that moment;
3. D allocates blocks for the whole prompt when its scheduler reaches it (short of blocks
   it waits at the head of D's queue) and reports it: the transfer P -> D starts;
4. when the transfer lands, P frees its blocks and D admits it with all but the last prompt
   token computed: that 1-token step samples its first token (TTFT ends there), then it
   decodes on D.

(With a pipelined link, :mod:`cbgym.cluster.kv`, D receives the request when it is routed
and each prompt chunk moves as it is computed.) A deflected request goes straight to D and
runs its prefill there, with no transfer.

**Time order.** A prefill or decode instance is advanced only through iterations that start
no later than the clocks of the other prefill and decode instances that may act, and before
the next external event (an arrival, a landing, a delivery, a load report). An event can
reach an instance through a chain (D2 starts a transfer; when it lands P's blocks are freed;
P admits and delivers to D1), and a new transfer can make another land earlier, but
everything an instance does happens no earlier than its own next iteration starts, so each
instance sees every event at the first iteration that starts after it, as a real one would:
results do not depend on how the loop interleaves instances (tested against a lock-step
loop). An instance idle under a policy decided in the kernel bounds nobody: only an event
wakes it. Unified replicas exchange nothing and run from one arrival to the next in one
kernel call.
"""

from __future__ import annotations

import copy
import heapq
import math

import numpy as np

from cbgym.cluster.config import ClusterConfig
from cbgym.cluster.kv import Handoff
from cbgym.cluster.link import Link
from cbgym.cluster.routing import (
    LOAD_FIELDS,
    ROLE_CODES,
    InvalidRouteError,
    Loads,
    Route,
    Router,
    RouterContext,
    RoutingPoint,
    check_route,
)
from cbgym.engine import handoff
from cbgym.engine import layout as L
from cbgym.engine.decision import Policy, PolicyContext
from cbgym.engine.engine import Engine
from cbgym.engine.jit import bind
from cbgym.metrics import SLO, SLOSpec, slo_arrays
from cbgym.workload.trace import Trace

# event kinds, in the order events of one instant are handled: a prompt chunk done on P, P's
# last chunk, P shed it, D allocated its blocks, D shed it
_CHUNK, _DONE, _P_SHED, _ALLOC, _D_SHED = 1, 2, 3, 4, 5
NOT_ROUTED = -1


class Cluster:
    """``trace`` served by the instances of ``config``, placed by ``router``.

    Args:
        trace: the requests, in arrival order.
        config: pools, link and load reports.
        router: a :class:`~cbgym.cluster.routing.Router` (``reset`` here) for :meth:`run`;
            None to place requests through the door yourself (:meth:`next_routing_point`,
            :meth:`route`), as the cluster env does.
        policies: each instance's local policy (one per instance: they keep state).
        slo: the run's targets (routers see the request's TTFT and TPOT targets).
        seed: handed to the router and the local policies.
    """

    def __init__(self, trace: Trace, config: ClusterConfig, router: Router | None,
                 policies: list[Policy], slo: SLOSpec | None = None, seed: int = 0,
                 record_iterations: bool = False) -> None:
        n, N = len(trace), config.num_instances
        if len(policies) != N:
            raise ValueError(f"Cluster: {len(policies)} local policies for {N} instances")
        self.trace, self.config, self.router = trace, config, router
        self.slo = slo or SLO()
        self.ttft, self.tpot = slo_arrays(self.slo, trace.slo_class)
        self.role = np.array([ROLE_CODES[r] for r in config.roles], np.int64)
        self.engines: list[Engine] = []
        self.policies = policies
        for cfg, pol in zip(config.engines, policies, strict=True):
            pol.reset(PolicyContext(
                config=cfg, num_requests=n, seed=seed,
                true_output_tokens=trace.output_tokens if pol.privileged else None,
                prompt_tokens=trace.prompt_tokens, arrival_s=trace.arrival_s,
                ttft_target_s=self.ttft))
            self.engines.append(Engine(trace, cfg, consult=pol.consult,
                                       record_iterations=record_iterations,
                                       keys=pol.static_keys(), routed=True))
        self._keyed = [pol.static_keys() is not None or pol.consult == "never"
                       for pol in policies]
        for eng, keyed in zip(self.engines, self._keyed, strict=True):
            handoff.decided_in_kernel(eng.state, keyed)
        s0 = self.engines[0].state
        self._deliver = bind(handoff.deliver, s0, 0, 0.0, 0, 0, 0, 0)
        self.link = Link([config.link.nic_bytes_per_s] * N, config.link.setup_s)
        # whose clock bounds each instance's: every other prefill or decode instance (an
        # event can reach an instance through a chain: D2 starts a transfer, P's blocks are
        # freed when it lands, P admits and delivers to D1; a new transfer can also make
        # another land earlier), none for a unified one
        pd = tuple(i for i, r in enumerate(config.roles) if r != "unified")
        self.peers = [tuple(j for j in pd if j != i) if r != "unified" else ()
                      for i, r in enumerate(config.roles)]
        self.active = np.zeros(N, bool)
        # per request: where it went and what its KV did
        self.prefill_instance = np.full(n, NOT_ROUTED, np.int64)
        self.decode_instance = np.full(n, NOT_ROUTED, np.int64)
        self.deflected = np.zeros(n, bool)
        self.chunk_cap = np.zeros(n, np.int64)
        self.router_shed: dict[int, str] = {}
        self.prefill_done_s = np.full(n, np.nan)
        self.transfer_start_s = np.full(n, np.nan)
        self.transfer_end_s = np.full(n, np.nan)
        self.transfer_bytes = np.zeros(n, np.int64)
        self.kv_out = np.zeros(N, np.int64)  # requests whose KV a prefill instance still holds
        self.incoming = np.zeros(N, np.int64)  # routed to a decode instance, prefilling on P
        self.kv = Handoff(self)
        # (time, kind, seq, rid, prompt tokens computed on P)
        self._events: list[tuple[float, int, int, int, int]] = []
        self._seq = 0
        self._next = 0  # next arrival to route
        self._interval = config.load_report_interval_s
        self._loads: Loads | None = None  # the last load report taken
        self._pending: RoutingPoint | None = None
        # routers that read no load (round-robin) spare the cluster its load reports
        self._reads_loads = router is None or router.reads_loads
        if router is not None:
            router.reset(RouterContext(config=config, seed=seed,
                                       ttft_target_s=float(np.min(self.ttft)) if n else 0.0,
                                       tpot_target_s=float(np.min(self.tpot)) if n else 0.0,
                                       num_requests=n))

    # ------------------------------------------------------------------ the loop
    def run(self) -> None:
        """Serve the whole trace, placing every request as the router says."""
        assert self.router is not None, "Cluster.run() needs a router"
        while (rp := self.next_routing_point()) is not None:
            self.route(self.router.route(rp))

    # ------------------------------------------------------------------ the door
    def next_routing_point(self) -> RoutingPoint | None:
        """Advance to the next arrival and return its routing point; None once every
        request has been placed and the cluster has drained."""
        if self._pending is not None:
            return self._pending
        engines, arrival = self.engines, self.trace.arrival_s
        n = len(arrival)
        while True:
            t_arr = arrival[self._next] if self._next < n else math.inf
            t_heap = self._events[0][0] if self._events else math.inf
            t_link = self.link.next_event_time()
            t_rep = self._report_due(t_arr)
            t_ext = min(t_arr, t_heap, t_link, t_rep)
            i = self._earliest_active()
            if i < 0 and t_ext == math.inf:
                return None
            if i < 0 or t_ext <= engines[i].now:
                if t_arr == t_ext and t_ext not in (t_heap, t_link, t_rep):
                    self._pending = self.routing_point(self._next, t_arr)
                    return self._pending
                self._handle(t_ext, t_link, t_heap, t_rep)
                continue
            until = t_ext
            if not self._asleep(i) or self._keyed[i]:
                # (an idle instance whose policy is asked outside the kernel re-checks its
                # queue every idle tick, up to the next external event: bounding it by its
                # peers would make two such instances creep forward one ulp at a time)
                for j in self.peers[i]:
                    if self.active[j] and not (self._keyed[j] and self._asleep(j)):
                        until = min(until, np.nextafter(engines[j].now, math.inf))
            code = engines[i].run_until(until, None if self._keyed[i] else self.policies[i])
            self._read_outbox(i)
            if code == L.DRAINED:
                self.active[i] = False

    def route(self, route: Route) -> None:
        """Place the pending request (:meth:`next_routing_point`) as ``route`` says."""
        if self._pending is None:
            raise RuntimeError("Cluster.route() called with no pending routing point; call "
                               "next_routing_point() first")
        rp, self._pending = self._pending, None
        self._place(rp.request_id, rp.now, check_route(route, self.role))
        self._next += 1

    def _asleep(self, j: int) -> bool:
        """Instance j's last iteration scheduled nothing and nothing runs there. With a
        policy decided in the kernel only an event of the cluster can change that, no
        earlier than the event: it bounds nobody's clock (else two idle instances would
        bound each other's and creep forward one ulp at a time)."""
        si = self.engines[j].state.si
        return bool(si[L.IDLED] and si[L.N_RUN] == 0)

    def _earliest_active(self) -> int:
        best, t = -1, math.inf
        for i, (on, eng) in enumerate(zip(self.active.tolist(), self.engines, strict=True)):
            if on and eng.state.sf[L.NOW] < t:
                best, t = i, eng.state.sf[L.NOW]
        return best

    def _report_due(self, t_arr: float) -> float:
        """When the next load report that a router will read is taken: the last report at
        or before the next arrival, unless taken already (reports no arrival reads are
        skipped: nothing could tell). inf when routers read live load or none."""
        if self._interval == 0 or not self._reads_loads or t_arr == math.inf:
            return math.inf
        r = min(math.floor(t_arr / self._interval) * self._interval, t_arr)  # (rounding)
        return r if self._loads is None or r > self._loads.report_s else math.inf

    def _handle(self, t: float, t_link: float, t_heap: float, t_rep: float) -> None:
        """Handle an event at time ``t``: landings, then deliveries and transfer starts, then
        a load report (arrivals, after them, stop at the door)."""
        if t_link == t:
            for tid in self.link.advance(t):
                self.kv.landed(int(tid), t)
        elif t_heap == t:
            _, kind, _, rid, computed = heapq.heappop(self._events)
            if kind in (_CHUNK, _DONE):
                self.kv.prefill_progress(rid, t, computed, kind == _DONE)
            elif kind == _P_SHED:
                self.kv.prefill_shed(rid, t)
            elif kind == _ALLOC:
                self.kv.allocated_on_decode(rid, t)
            else:
                self.kv.decode_shed(rid)
        else:
            self._loads = self.loads(t)

    def _push(self, t: float, kind: int, rid: int, computed: int = 0) -> None:
        heapq.heappush(self._events, (t, kind, self._seq, rid, computed))
        self._seq += 1

    def _read_outbox(self, i: int) -> None:
        """Turn an instance's outbox into events at the times they happened."""
        s = self.engines[i].state
        for k in range(s.si[L.OUTBOX_N]):
            rid = int(s.ids[L.OUTBOX, k])
            t = float(s.times[L.KV_EVENT, rid])
            status = s.req[L.STATUS, rid]
            if self.role[i] == ROLE_CODES["prefill"]:
                kind = _P_SHED if status == L.SHED else _DONE if status == L.FINISHED else _CHUNK
                self._push(t, kind, rid, int(s.req[L.COMPUTED, rid]))
            else:
                self._push(t, _D_SHED if status == L.SHED else _ALLOC, rid)
        s.si[L.OUTBOX_N] = 0

    # ------------------------------------------------------------------ events
    def _place(self, rid: int, t: float, route: Route) -> None:
        target = route.decode if route.prefill is None else route.prefill
        if route.chunk_cap and route.shed_reason is None and not (
                self.engines[int(target)].config.chunked_prefill):  # type: ignore[arg-type]
            raise InvalidRouteError(f"Route.chunk_cap={route.chunk_cap}: instance {target} "
                                    "has no chunked prefill to cap")
        if route.shed_reason is not None:
            self.router_shed[rid] = route.shed_reason
            return
        self.decode_instance[rid] = route.decode
        out = int(self.trace.output_tokens[rid])
        if route.prefill is None:
            self.deflected[rid] = self.role[route.decode] == ROLE_CODES["decode"]
            self.chunk_cap[rid] = route.chunk_cap
            self.give(int(route.decode), rid, t, out, 0, L.LOCAL, route.chunk_cap)
        else:
            self.prefill_instance[rid] = route.prefill
            keep = L.PIPELINED if self.kv.pipelined else L.BULK
            self.give(int(route.prefill), rid, t, 1, keep, L.LOCAL, route.chunk_cap)
            if self.kv.pipelined:  # D takes it at once, to hold blocks for each chunk
                self.give(int(route.decode), rid, t, out, 0, L.REMOTE_NEW)
            else:
                self.incoming[route.decode] += 1

    def give(self, i: int, rid: int, t: float, out: int, keep: int, remote: int,
             cap: int = 0) -> None:
        """Deliver ``rid`` to instance ``i`` at ``t`` (:func:`cbgym.engine.handoff.deliver`)."""
        self._deliver(self.engines[i].state, rid, t, out, keep, remote, cap)
        self.active[i] = True

    # ------------------------------------------------------------------ what routers see
    def routing_point(self, rid: int, t: float) -> RoutingPoint:
        """The door's question for ``rid`` arriving at ``t``: load as of the last report
        (live with ``load_report_interval_s=0``; none for a router that reads none)."""
        loads = None
        if self._reads_loads:
            loads = self.loads(t) if self._interval == 0 else self._loads
        return RoutingPoint(
            request_id=rid, now=t, prompt_tokens=int(self.trace.prompt_tokens[rid]),
            waited_s=0.0, ttft_target_s=float(self.ttft[rid]),
            tpot_target_s=float(self.tpot[rid]), role=self.role, loads=loads,
            config=self.config)

    def loads(self, t: float) -> Loads:
        """Every instance's load signals now (stamped ``t``)."""
        N = len(self.engines)
        cols = {f: np.zeros(N) for f in LOAD_FIELDS}
        for i in range(N):
            cols["transfers_out"][i], cols["transfers_in"][i] = self.link.in_flight(i)
        cols["incoming"][:], cols["kv_held_for_transfer"][:] = self.incoming, self.kv_out
        for i, eng in enumerate(self.engines):
            s = eng.state
            w, r = eng.waiting_ids, eng.running_ids
            prompt, computed = s.req[L.PROMPT], s.req[L.COMPUTED]
            local = s.req[L.REMOTE, w] == L.LOCAL
            cols["num_waiting"][i] = len(w)
            cols["waiting_prefill_tokens"][i] = (s.req[L.TOKENS, w][local]
                                                 - s.req[L.HOST_TOKENS, w][local]).sum()
            cols["num_running"][i] = len(r)
            left = np.maximum(prompt[r] - computed[r], 0)
            cols["decode_batch"][i] = int((left == 0).sum())
            cols["decode_context_tokens"][i] = computed[r][left == 0].sum()
            cols["running_prefill_tokens"][i] = left.sum()
            cols["free_blocks"][i] = s.si[L.FREE]
            cols["kv_usage"][i] = 1.0 - s.si[L.FREE] / eng.kv.num_blocks
            if self.role[i] == ROLE_CODES["decode"]:
                cols["local_prefills"][i] = (int((left > 0)[self.deflected[r]].sum())
                                             + int((local & self.deflected[w]).sum()))
            cols["last_iteration_s"][i] = s.sf[L.LAST_DT]
        ints = {k: v.astype(np.int64) for k, v in cols.items()
                if k not in ("kv_usage", "last_iteration_s")}
        return Loads(report_s=t, kv_usage=cols["kv_usage"],
                     last_iteration_s=cols["last_iteration_s"], **ints)


def local_policies(policy: str | Policy | type[Policy], count: int) -> list[Policy]:
    """One local policy object per instance (a given object is copied: policies keep
    per-run state)."""
    from cbgym.simulate import resolve_policy

    if isinstance(policy, Policy):
        return [copy.deepcopy(policy) for _ in range(count)]
    return [resolve_policy(policy) for _ in range(count)]


__all__ = ["Cluster", "Route", "local_policies"]
