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

**Time order** (:mod:`cbgym.cluster.order`): a prefill or decode instance is advanced only
through iterations that start before the next external event and the clocks of the other
prefill and decode instances that may act; unified replicas exchange nothing.

**Routing ahead of time.** An arrival's route depends only on the load report it reads
(taken at the last report time before it) and the request itself, so where loads are
reported at an interval (or not read) and every local policy is decided in the kernel, the
loop routes each arrival as soon as its report is taken; its delivery waits in the
instance's inbox (kept in arrival order) and bounds no other instance. Same results
(tested), far fewer stops: unified replicas under round-robin run to the end in one call.

**Compiled.** The loop is :func:`cbgym.cluster.loop.run` on the instances' batched states
(:mod:`cbgym.cluster.state`): a router whose rule is compiled (:mod:`cbgym.cluster.route_ops`:
round-robin, least-outstanding, jsq-tokens, jsq-time and the disaggregation rules, Kairos
included) is applied in the kernel, any other one answers at the door; local policies
decided in the kernel (FCFS, static keys) never leave it, others are asked at their
decision points.
"""

from __future__ import annotations

import numpy as np

from cbgym.cluster import loop
from cbgym.cluster import route_ops as ro
from cbgym.cluster import state as K
from cbgym.cluster.config import ClusterConfig
from cbgym.cluster.edge import (
    AdmissionConfig,
    ClientModel,
    attempt_slots,
    check_edge,
)
from cbgym.cluster.routing import (
    ROLE_CODES,
    InvalidRouteError,
    Loads,
    Route,
    Router,
    RouterContext,
    RoutingPoint,
    check_route,
)
from cbgym.cluster.tables import NOT_ROUTED, batched_state, cluster_state, loads_of
from cbgym.engine import handoff
from cbgym.engine import layout as L
from cbgym.engine.decision import Policy, PolicyContext
from cbgym.engine.engine import Engine
from cbgym.engine.jit import bind
from cbgym.metrics import SLO, SLOSpec, slo_arrays
from cbgym.workload.trace import Trace


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
        lock_step: bound every instance's clock by every other's, unified ones included
            (the time-order rule's reference, for tests; slower).
        audit: check every transfer's blocks in the kernel (D holds the prompt's at each
            start, P frees exactly its copy at the landing); counts in ``transfers_audited``.
        eager: route each arrival as soon as the load report it reads has been taken,
            before the instances reach its time (same results, fewer stops). Used where
            it cannot change anything: loads reported at an interval (or not read) and
            every local policy decided in the kernel. False: the door opens at each
            arrival's time (the cluster env, whose reward is counted there).
        itl_p99: keep each request's p99 gap between tokens (``Engine``'s); the envs,
            whose reward reads only the worst gap, turn it off.
        admission: caps and a queue TTL at the edge or the instances
            (:class:`~cbgym.cluster.edge.AdmissionConfig`).
        client: how clients time out and retry (:class:`~cbgym.cluster.edge.ClientModel`):
            each retry is a request of its own (``self.trace`` has a slot for every attempt
            a client may make, the trace's requests first; ``num_offered`` of them).
        decode_stretches: run each instance's decode-only iterations in stretches (off:
            one at a time, the reference the stretches are tested against).
    """

    def __init__(self, trace: Trace, config: ClusterConfig, router: Router | None,
                 policies: list[Policy], slo: SLOSpec | None = None, seed: int = 0,
                 record_iterations: bool = False, lock_step: bool = False,
                 audit: bool = False, eager: bool = True, itl_p99: bool = True,
                 admission: AdmissionConfig | None = None,
                 client: ClientModel | None = None, decode_stretches: bool = True) -> None:
        N = config.num_instances
        if len(policies) != N:
            raise ValueError(f"Cluster: {len(policies)} local policies for {N} instances")
        check_edge("Cluster", admission, client)
        self.admission, self.client = admission, client
        self.num_offered = len(trace)
        self.edge = admission is not None or client is not None
        trace = attempt_slots(trace, client) if self.edge else trace
        n = len(trace)
        self.trace, self.config, self.router = trace, config, router
        self.slo = slo or SLO()
        self.ttft, self.tpot = slo_arrays(self.slo, trace.slo_class)
        # when each request was sent (a retry: when its client sent it again, NaN before)
        self._times = np.full((K.NUM_CTIME, n), np.nan)
        self._times[K.SENT_S, : self.num_offered] = trace.arrival_s[: self.num_offered]
        # what local policies see as a request's arrival: a retry carries its request's first
        # send (its client's deadline runs from there; a static key is fixed before any
        # retry is sent)
        sent, clock = trace.arrival_s, trace.extra.get("epoch_s")
        if self.edge and n > self.num_offered:
            sent = np.tile(trace.arrival_s[: self.num_offered], n // self.num_offered)
            if clock is not None:
                clock = np.tile(clock[: self.num_offered], n // self.num_offered)
        self.role = np.array([ROLE_CODES[r] for r in config.roles], np.int64)
        self.policies = policies
        self.S = batched_state(trace, config)
        self.engines: list[Engine] = []
        for i, (cfg, pol) in enumerate(zip(config.engines, policies, strict=True)):
            pol.reset(PolicyContext(
                config=cfg, num_requests=n, seed=seed,
                true_output_tokens=trace.output_tokens if pol.privileged else None,
                prompt_tokens=trace.prompt_tokens, arrival_s=sent,
                ttft_target_s=self.ttft, priority=trace.priority,
                slo_class=trace.slo_class, trace_name=trace.name, clock_s=clock))
            keys = pol.static_keys()
            self.engines.append(Engine(trace, cfg, consult=pol.consult,
                                       record_iterations=record_iterations, keys=keys,
                                       victim_by_key=pol.victim_by_key and keys is not None,
                                       routed=True, state=K.view(self.S, i), itl_p99=itl_p99,
                                       closed_loop=False,  # (sessions: open loop here)
                                       decode_stretches=decode_stretches))
        if self.edge:
            for eng in self.engines:
                eng._trace_arrival = np.ascontiguousarray(sent)
                eng._views = eng._make_views()
        # one numbering of shed reasons for the whole cluster: an instance ends a request
        # with the code its peer shed it with
        reasons = self.engines[0]._reasons
        for eng in self.engines:
            eng._reasons = eng.req.reasons = reasons
        self._keyed = [pol.static_keys() is not None or pol.consult == "never"
                       for pol in policies]
        for eng, keyed in zip(self.engines, self._keyed, strict=True):
            handoff.decided_in_kernel(eng.state, keyed)
        self.P = K.batched_params([e.params for e in self.engines])
        self.rule = self._rule(router)
        self.C = cluster_state(self, trace, router, lock_step, audit, seed)
        reads = router is None or router.reads_loads
        # (the edge reads live queues at each arrival, and a router with prefix caching
        # each instance's cache now: no routing ahead of time)
        self.C.ci[K.EAGER] = (eager and not lock_step and all(self._keyed) and not self.edge
                              and not self.engines[0].prefix_caching
                              and (config.load_report_interval_s > 0 or not reads))
        self.router_shed: dict[int, str] = {}
        self._pending: RoutingPoint | None = None
        self._report: tuple[int, Loads] | None = None
        self._bind()
        if router is not None:
            router.reset(RouterContext(config=config, seed=seed,
                                       ttft_target_s=float(np.min(self.ttft)) if n else 0.0,
                                       tpot_target_s=float(np.min(self.tpot)) if n else 0.0,
                                       num_requests=n))

    @staticmethod
    def _rule(router: Router | None) -> tuple[int, dict[int, float]]:
        """The router's compiled rule, or the door. A subclass that overrides ``route``
        answers at the door (its own rule)."""
        from cbgym.agents.routing.compiled import CompiledRule

        if isinstance(router, CompiledRule) and type(router).route is CompiledRule.route:
            return router.kernel_rule()
        return ro.DOOR, {}

    def _bind(self) -> None:
        C, S, P = self.C, self.S, self.P
        self._probe = bind(K.probe_each, S, np.int64(0), np.int64(1),
                           np.zeros(self.config.num_instances, np.int64))
        self._run = bind(loop.run, C, S, P)
        self._commit = bind(loop.commit, C, S, 0, 0.0, 0, 0, 0)
        self._door_shed = bind(loop.door_shed, C, 0, 0.0)
        self._take = bind(loop.take_loads, C, S, P, C.live)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        for name in ("_run", "_commit", "_door_shed", "_take", "_probe"):
            del state[name]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        for i, eng in enumerate(self.engines):  # views into the batched arrays again
            st = eng.__getstate__()
            st["state"] = K.view(self.S, i)
            eng.__setstate__(st)
        self._bind()

    # ------------------------------------------------------------------ the loop
    def run(self) -> None:
        """Serve the whole trace, placing every request as the router says."""
        assert self.router is not None, "Cluster.run() needs a router"
        while (rp := self.next_routing_point()) is not None:
            self.route(self.router.route(rp))

    def _advance(self) -> int:
        """Call the compiled loop until it stops at the door or drains; act on the other
        stops (:meth:`serve_stop`)."""
        while True:
            code = self._run(self.C, self.S, self.P)
            if code in (K.CL_DRAINED, K.CL_AT_ROUTE):
                return int(code)
            self.serve_stop(int(code))

    def serve_stop(self, code: int) -> None:
        """Act on a stop of the compiled loop other than the door or the drain: grow a buffer
        (``self.C`` is then a new tuple), empty an instance's time-series buffer, ask its
        local policy, or raise; the loop's next call resumes. (Also the native cluster
        vector env's way back to Python: ``cbgym.env.cluster_vector``.)"""
        if code == K.CL_GROW:
            self._grow()
            return
        if code == K.CL_BAD_ROUTE:
            i = int(self.C.si[K.BAD])
            raise InvalidRouteError(
                f"router {getattr(self.router, 'name', '?')!r}: its route cannot be "
                f"applied on this cluster (instance {i}: no pool the rule needs, or a "
                "chunk cap on an instance without chunked prefill)")
        i = int(self.C.si[K.STOPPED])
        eng = self.engines[i]
        if code == K.CL_NEED_ROOM:
            eng.recorder.flush()
        elif code == K.CL_STUCK:
            eng.settle(L.TOO_MANY_IDLE_TICKS)  # raises EngineStuckError
        else:
            eng.settle(L.AT_DECISION)
            eng.decide(self.policies[i].decide(eng._decision_point()))

    def _grow(self) -> None:
        C = self.C
        heap_t, heap = C.heap_t, C.heap
        need = C.si[K.HEAP_N] + int(self.S.si[:, L.OUTBOX_N].max())
        need += K.HEAP_MARGIN if self.edge else 0
        while need > len(heap_t):
            heap_t, heap = K.grow(heap_t), K.grow(heap)
        link = C.link
        if link.si[K.LN] + 2 > link.i.shape[1]:
            link = K.grow_link(link)
        tid_rid = C.tid_rid if C.si[K.LAST_TID] + 2 < len(C.tid_rid) else K.grow(C.tid_rid)
        self.C = C._replace(heap_t=heap_t, heap=heap, link=link, tid_rid=tid_rid)

    # ------------------------------------------------------------------ the door
    def next_routing_point(self) -> RoutingPoint | None:
        """Advance to the next arrival and return its routing point; None once every
        request has been placed and the cluster has drained."""
        if self._pending is not None:
            return self._pending
        if self._advance() == K.CL_DRAINED:
            return None
        rid = int(self.C.si[K.ROUTE_RID])
        self._pending = self.routing_point(rid, float(self.C.times[K.SENT_S, rid]))
        return self._pending

    def route(self, route: Route) -> None:
        """Place the pending request (:meth:`next_routing_point`) as ``route`` says."""
        if self._pending is None:
            raise RuntimeError("Cluster.route() called with no pending routing point; call "
                               "next_routing_point() first")
        rp, self._pending = self._pending, None
        route = check_route(route, self.role)
        rid = rp.request_id
        if route.shed_reason is not None:
            self.router_shed[rid] = route.shed_reason
            self._door_shed(self.C, np.int64(rid), float(rp.now))
        else:
            target = int(route.decode if route.prefill is None else route.prefill)  # type: ignore[arg-type]
            if route.chunk_cap and not self.engines[target].config.chunked_prefill:
                raise InvalidRouteError(f"Route.chunk_cap={route.chunk_cap}: instance {target} "
                                        "has no chunked prefill to cap")
            prefill = NOT_ROUTED if route.prefill is None else int(route.prefill)
            self._commit(self.C, self.S, np.int64(rid), float(rp.now), np.int64(prefill),
                         np.int64(route.decode), np.int64(route.chunk_cap))

    # ------------------------------------------------------------------ what routers see
    def routing_point(self, rid: int, t: float) -> RoutingPoint:
        """The door's question for ``rid`` arriving at ``t``: load as of the last report
        (live with ``load_report_interval_s=0``; none for a router that reads none)."""
        loads = None
        if self.C.ci[K.READS_LOADS]:
            if self.config.load_report_interval_s == 0:
                loads = self.loads(t)
            elif self.C.si[K.HAVE_REPORT]:
                k = int(self.C.si[K.REPORTS])
                if self._report is None or self._report[0] != k:  # one Loads per report
                    self._report = (k, loads_of(self.C.loads, self.C.sf[K.REPORT_S]))
                loads = self._report[1]
        return RoutingPoint(
            request_id=rid, now=t, prompt_tokens=int(self.trace.prompt_tokens[rid]),
            waited_s=0.0, ttft_target_s=float(self.ttft[rid]),
            tpot_target_s=float(self.tpot[rid]), role=self.role, loads=loads,
            config=self.config, cached_tokens=self.cached_on_each(rid)
            if self.engines[0].prefix_caching else None,
            routed_since_report=self.C.inst[K.ROUTED].copy())

    def cached_on_each(self, rid: int) -> np.ndarray:
        """The tokens of ``rid``'s prompt each instance's prefix cache holds now (at most
        prompt - 1, as its admission would find them; live, not as of a load report)."""
        out = np.zeros(self.config.num_instances, np.int64)
        self._probe(self.S, np.int64(rid), np.int64(self.engines[0].config.block_size), out)
        return out

    def loads(self, t: float) -> Loads:
        """Every instance's load signals now (stamped ``t``)."""
        self._take(self.C, self.S, self.P, self.C.live)
        return loads_of(self.C.live, t)

    # ------------------------------------------------------------------ per request
    @property
    def prefill_instance(self) -> np.ndarray:
        return self.C.req[K.PREFILL_I]

    @property
    def decode_instance(self) -> np.ndarray:
        return self.C.req[K.DECODE_I]

    @property
    def deflected(self) -> np.ndarray:
        return self.C.req[K.DEFLECTED].astype(bool)

    @property
    def chunk_cap(self) -> np.ndarray:
        return self.C.req[K.CAP]

    @property
    def prefill_done_s(self) -> np.ndarray:
        return self.C.times[K.PREFILL_DONE]

    @property
    def transfer_start_s(self) -> np.ndarray:
        return self.C.times[K.T_START]

    @property
    def transfer_end_s(self) -> np.ndarray:
        return self.C.times[K.T_END]

    @property
    def transfer_bytes(self) -> np.ndarray:
        return self.C.req[K.BYTES]

    @property
    def kv_out(self) -> np.ndarray:
        """Per instance: requests whose KV a prefill instance still holds."""
        return self.C.inst[K.KV_OUT]

    @property
    def incoming(self) -> np.ndarray:
        """Per decode instance: requests routed there, still prefilling elsewhere."""
        return self.C.inst[K.INCOMING]

    @property
    def transfers_audited(self) -> tuple[int, int]:
        """(starts, landings) checked with ``audit=True``."""
        return int(self.C.si[K.STARTS]), int(self.C.si[K.LANDS])

    @property
    def instance_calls(self) -> int:
        """How many times the loop advanced an instance (a measure of its work)."""
        return int(self.C.si[K.ADVANCES])


__all__ = ["Cluster", "Route"]
