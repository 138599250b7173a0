"""One simulated serving instance, advanced one iteration at a time (vLLM v1 semantics).

The iteration itself is the compiled kernel (:mod:`cbgym.engine.loop` and the modules it
calls; ``NUMBA_DISABLE_JIT=1`` runs it as plain Python). :class:`Engine` is its door: it
compiles an :class:`EngineConfig` into the kernel's static parameters, builds the state, and
talks to whoever decides. :meth:`Engine.next_decision` advances time through iterations with
nothing to decide and returns a :class:`DecisionPoint` (or None when the workload has
drained); :meth:`Engine.decide` applies a :class:`Decision` to that iteration and runs it.
A policy whose ranking is a static key per request never needs the door: give its keys as
``keys=`` and the kernel ranks the queue itself.
"""

from __future__ import annotations

import numpy as np

from cbgym.engine import handoff
from cbgym.engine import layout as L
from cbgym.engine import prefix_cache as pc
from cbgym.engine.config import EngineConfig
from cbgym.engine.decision import Decision, DecisionPoint, Policy, validate_decision
from cbgym.engine.execute import idle_after_turns
from cbgym.engine.jit import bind
from cbgym.engine.kutil import send_turns
from cbgym.engine.kv_cache import KVCacheView
from cbgym.engine.loop import advance, decide
from cbgym.engine.pricing import cost_params
from cbgym.engine.recorder import Recorder
from cbgym.engine.requests import RequestTable
from cbgym.engine.trace_setup import (
    caches_prefixes,
    has_sessions,
    start_sessions,
    trace_block_hashes,
)
from cbgym.workload.trace import Trace

_GIB = 1 << 30
CONSULT_MODES = L.CONSULT_MODES
IDLE_TICK_S, MAX_IDLE_TICKS = L.IDLE_TICK_S, L.MAX_IDLE_TICKS
_NONE = np.empty(0, np.int64)


class EngineStuckError(RuntimeError):
    """The policy held every waiting request back, with nothing running, for
    ``MAX_IDLE_TICKS`` idle ticks in a row: the run would never drain."""


def _ids(x: object) -> np.ndarray:
    """Request ids as a contiguous int64 array (what the bound kernels take)."""
    return np.ascontiguousarray(() if x is None else x, dtype=np.int64).reshape(-1)


def compile_params(config: EngineConfig, consult: str, keyed: bool, record: bool,
                   stretches: bool = True, victim_by_key: bool = False,
                   prefix: bool = False) -> L.Params:
    """The kernel's static parameters for ``config``; ``prefix``: the run names its blocks
    (:func:`cbgym.engine.trace_setup.caches_prefixes`)."""
    assert config.block_size is not None and config.num_kv_blocks is not None
    kind, coef = cost_params(config.cost_model)
    ci = np.zeros(L.NUM_CI, np.int64)
    ci[L.PAPER] = config.paper_mode
    # the study's engine has no token budget
    ci[L.BUDGET] = np.iinfo(np.int64).max if config.paper_mode else config.max_num_batched_tokens
    ci[L.MAX_SEQS] = config.max_num_seqs
    ci[L.BLOCK_SIZE] = config.block_size
    ci[L.NUM_BLOCKS] = config.num_kv_blocks
    ci[L.CHUNKED] = config.chunked_prefill
    ci[L.MAX_MODEL_LEN] = -1 if config.max_model_len is None else config.max_model_len
    ci[L.SWAP] = config.preemption == "swap"
    ci[L.KV_BYTES] = config.kv_bytes_per_token or 0
    ci[L.CONSULT] = CONSULT_MODES.index(consult)
    ci[L.KEYED] = keyed
    ci[L.RECORD] = record
    ci[L.COST_KIND] = kind
    # no decode stretches with named blocks: the named stretch's code, compiled into every
    # run's loop, slowed runs without caching by about 4%; runs with caching iterate one step
    # at a time, 11-28% slower on Mooncake
    ci[L.STRETCH] = stretches and not prefix
    ci[L.PREFIX] = prefix
    ci[L.VICTIM_BY_KEY] = victim_by_key
    return L.Params(ci, coef)


def host_swap_tokens(config: EngineConfig) -> int:
    """KV tokens the host's swap space holds (0 without a KV size per token)."""
    kvb = config.kv_bytes_per_token or 0
    return int(config.swap_space_gib * _GIB // kvb) if kvb else 0


class Engine:
    """A serving instance replaying ``trace`` under ``config``.

    Args:
        trace: the requests, in arrival order.
        config: static engine configuration.
        consult: when to stop for a decision (see :class:`cbgym.engine.Policy`):
            ``"never"``, ``"on_change"``, ``"on_completion"``, ``"every_iteration"`` or
            ``"always"``.
        record_iterations: keep the per-iteration batch log (ids and tokens per iteration);
            the time series then has one row per iteration.
        keys: a static policy's key per request id (lower admitted first, ties in queue
            order): the kernel decides wherever ``consult`` would ask, and
            :meth:`next_decision` returns None once the run drained.
        decode_stretches: run stretches of decode-only iterations with nothing to decide in
            one pass (identical results; off only to test exactly that).
        routed: an instance of a cluster (:mod:`cbgym.cluster`): requests arrive only as
            its cluster delivers them, and it runs to the cluster's horizons
            (:meth:`run_until`) instead of through :meth:`next_decision`.
        state: arrays to run in (a cluster's instance: views into the cluster's batched
            state, which its compiled loop advances); new ones by default.
        itl_p99: keep what each request's p99 gap between tokens needs (``itl_p99_s``; a
            run 25-35% slower on a real trace); else its worst gap only (``itl_p99_s`` NaN,
            as always in the study's engine mode). The envs keep it off.
        victim_by_key: when blocks run out, preempt the running request with the largest of
            ``keys`` (the first of equals, in running order) instead of the last admitted:
            vLLM's priority policy (:class:`cbgym.agents.Priority`).
        closed_loop: replay sessions as closed loops: a session's next request is sent
            ``think_time_s`` after its previous one ends (finished or shed), whatever the
            trace's recorded time; first turns arrive as recorded. None: where the trace
            has sessions (``extra`` ``session``, ``turn``, ``think_time_s``:
            :func:`cbgym.workload.load_agent_sessions`, ``synthetic_sessions``).
    """

    def __init__(self, trace: Trace, config: EngineConfig, consult: str = "on_change",
                 record_iterations: bool = False, keys: np.ndarray | None = None,
                 decode_stretches: bool = True, routed: bool = False,
                 state: L.State | None = None, itl_p99: bool = True,
                 victim_by_key: bool = False, closed_loop: bool | None = None) -> None:
        if consult not in CONSULT_MODES:
            raise ValueError(f"Engine consult={consult!r}: expected one of {CONSULT_MODES}")
        assert config.num_kv_blocks is not None and config.block_size is not None
        self.config = config
        self.consult = consult
        if victim_by_key and keys is None:
            raise ValueError("Engine victim_by_key=True needs keys= (the static keys it reads)")
        self.prefix_caching = caches_prefixes(trace, config)
        self.params = compile_params(config, consult, keys is not None, record_iterations,
                                     decode_stretches, victim_by_key, self.prefix_caching)
        self.state = s = L.new_state(trace.arrival_s, trace.prompt_tokens, trace.output_tokens,
                                     config.num_kv_blocks, host_swap_tokens(config),
                                     config.max_num_seqs, config.block_size, routed, state,
                                     p99=itl_p99 and not config.paper_mode,
                                     prefix_hashes=trace_block_hashes(trace, config)
                                     if self.prefix_caching else None)
        self.closed_loop = has_sessions(trace) if closed_loop is None else bool(closed_loop)
        if self.closed_loop:
            if routed:
                raise ValueError("Engine closed_loop=True: not on a cluster's instance yet "
                                 "(its cluster routes arrivals ahead of time)")
            start_sessions(s, trace)
        if keys is not None:
            k = np.asarray(keys, dtype=np.float64)
            if k.shape != (len(trace),) or not np.isfinite(k).all():
                raise ValueError(f"Engine keys: expected {len(trace)} finite keys (one per "
                                 f"request), got shape {k.shape}")
            s.times[L.KEY] = k
        self._routed = routed
        self._trace_arrival = np.ascontiguousarray(trace.arrival_s, dtype=np.float64)
        self._reasons = list(L.REASONS)
        self.req = RequestTable(s, trace.tenant, trace.slo_class, self._reasons)
        self.kv = KVCacheView(s, config.num_kv_blocks, config.block_size)
        self.recorder = Recorder(s, record_iterations)
        self.at_point = False  # the kernel stopped at a decision point
        self.drained = len(trace) == 0
        self._pending: DecisionPoint | None = None
        self._views = self._make_views()
        self._bind()

    def _bind(self) -> None:
        s, p = self.state, self.params
        self._advance = bind(advance, s, p)
        self._horizon = bind(handoff.set_horizon, s, 0.0)
        if self.prefix_caching:
            self._probe = bind(pc.probe_waiting, s, np.int64(self.config.block_size))
        self._decide = bind(decide, s, p, _NONE, True, _NONE, L.R_POLICY, _NONE, True, _NONE,
                            False)

    def _make_views(self) -> dict[str, np.ndarray]:
        """Read-only views handed to policies (made once: the columns change in place). A
        cluster's instance shows each request's arrival at the cluster (the trace's), not
        its delivery here, so that a local policy measures waits as its clients do."""
        r, ro = self.req, RequestTable.readonly
        arrival = self._trace_arrival if self._routed else r.arrival_s
        return {"arrival_s": ro(arrival), "prompt": ro(r.prompt),
                "computed": ro(r.computed), "generated": ro(r.generated),
                "preemptions": ro(r.preemptions), "tenant": ro(r.tenant),
                "slo_class": ro(r.slo_class), "finish_order": ro(r.finish_order),
                "finish_s": ro(r.finish_s),
                "held": ro(self.kv.held), "lookup": ro(self.state.req[L.LOOKUP])}

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        # views of the state's arrays and compiled entry points: rebuilt on the new arrays
        for name in ("_views", "_advance", "_decide", "_horizon", "_pending", "req", "kv",
                     "_probe"):
            state.pop(name, None)
        state["_tenant"], state["_slo_class"] = self.req.tenant, self.req.slo_class
        return state

    def __setstate__(self, state: dict) -> None:
        tenant, slo_class = state.pop("_tenant"), state.pop("_slo_class")
        self.__dict__.update(state)
        s, cfg = self.state, self.config
        self.req = RequestTable(s, tenant, slo_class, self._reasons)
        self.kv = KVCacheView(s, cfg.num_kv_blocks, cfg.block_size)  # type: ignore[arg-type]
        self.recorder._s = s
        self._pending = None
        self._views = self._make_views()
        self._bind()

    # ------------------------------------------------------------------ the door
    def next_decision(self) -> DecisionPoint | None:
        """Advance to the next iteration that needs a decision; None once all requests ended."""
        if self._pending is None and not self.drained:
            if not self.at_point:
                self.run(self._advance)
            if not self.drained:
                self._pending = self._decision_point()
        return self._pending

    def decide(self, decision: Decision, validate: bool = True) -> None:
        """Apply ``decision`` to the pending iteration and run it.

        Args:
            decision: what to do this iteration.
            validate: check every id the decision names (an :class:`InvalidDecisionError`
                otherwise). Callers that build decisions only from the decision point's own
                ids (the Gymnasium env decodes actions that way) may skip it.
        """
        if not self.at_point:
            raise RuntimeError("Engine.decide() called with no pending decision point; "
                               "call next_decision() first")
        if validate:
            validate_decision(decision, self.req.status, int(self.state.si[L.N_WAIT]))
        order, has_order = _NONE, decision.order is not None
        if has_order:
            order = _ids(decision.order)
        elif decision.priority is not None:  # ties keep queue order
            waiting = self.waiting_ids
            rank = np.argsort(np.asarray(decision.priority, dtype=np.float64), kind="stable")
            order, has_order = np.ascontiguousarray(waiting[rank]), True
        victims = _NONE if decision.victims is None else _ids(decision.victims)
        # the iteration only: the next decision point is found by next_decision(), so the
        # engine between the two shows the state right after this iteration
        self.run(self._decide, order, has_order, _ids(decision.shed),
                 np.int64(self.reason_code(decision.shed_reason)), victims,
                 decision.victims is not None, _ids(decision.preempt), False)
        self.at_point = False

    def run_until(self, until: float, policy: Policy | None) -> int:
        """An instance of a cluster: run iterations that start before ``until``, asking
        ``policy`` at decision points, until the horizon (``AT_HORIZON``; also when the
        outbox has events for the cluster) or idle with nothing delivered left
        (``DRAINED``)."""
        self._horizon(self.state, float(until))
        code = self.run(self._advance)
        while code == L.AT_DECISION:
            assert policy is not None, "a keyed instance never stops at a decision point"
            self.decide(policy.decide(self._decision_point()))
            code = self.run(self._advance)
        return code

    def reason_code(self, reason: str) -> int:
        """The kernel's code for a shed reason (a run's own reasons are numbered here)."""
        try:
            return self._reasons.index(reason)
        except ValueError:
            self._reasons.append(reason)
            return len(self._reasons) - 1

    def run(self, entry: object, *args: object) -> int:
        """Call a bound kernel entry point on this engine and settle what it returned."""
        return self.settle(entry(self.state, self.params, *args))  # type: ignore[operator]

    def settle(self, code: int) -> int:
        """Finish what a kernel call returned: advance on after a full buffer, raise on a
        stuck run, note a decision point or the end. Returns AT_DECISION or DRAINED."""
        self._pending = None
        while code in (L.NEED_ROOM, L.TURNS_DUE, L.TURNS_IDLE):
            if code == L.NEED_ROOM:
                self.recorder.flush()
            else:  # closed-loop sessions: their next turns into the inbox
                send_turns(self.state)
                if code == L.TURNS_IDLE and (  # (an idle iteration lets time pass now)
                        idle_after_turns(self.state) == L.TOO_MANY_IDLE_TICKS):
                    code = L.TOO_MANY_IDLE_TICKS
                    break
            code = self._advance(self.state, self.params)  # type: ignore[operator]
        self.at_point = bool(code == L.AT_DECISION)
        if code == L.TOO_MANY_IDLE_TICKS:
            raise EngineStuckError(
                f"the policy held every waiting request back for {MAX_IDLE_TICKS} idle ticks "
                f"({MAX_IDLE_TICKS * IDLE_TICK_S:g} simulated seconds) with nothing running; "
                "it would never drain the workload")
        self.drained = bool(code == L.DRAINED)
        return code

    @property
    def done(self) -> bool:
        return self.req.num_ended == self.req.n

    # ------------------------------------------------------------------ reading the state
    @property
    def now(self) -> float:
        return float(self.state.sf[L.NOW])

    @property
    def iteration(self) -> int:
        return int(self.state.si[L.ITERATION])

    @property
    def last_iteration_s(self) -> float:
        return float(self.state.sf[L.LAST_DT])

    @property
    def total_preemptions(self) -> int:
        return int(self.state.si[L.TOTAL_PREEMPT])

    @property
    def prefix_cache_stats(self) -> dict[str, int]:
        """Prefix-cache counters so far, in tokens as vLLM's: ``queries`` and ``hits`` of
        first lookups (``vllm:prefix_cache_queries`` / ``_hits``), ``preempted_queries`` /
        ``preempted_hits`` of preempted requests looking up again, and
        ``evicted_blocks`` (cached blocks reused for other content). Zero with it off."""
        si = self.state.si
        return {"queries": int(si[L.PC_QUERIES]), "hits": int(si[L.PC_HITS]),
                "preempted_queries": int(si[L.PC_PRE_QUERIES]),
                "preempted_hits": int(si[L.PC_PRE_HITS]),
                "evicted_blocks": int(si[L.PC_EVICTED])}

    @property
    def host_free_tokens(self) -> int:
        return int(self.state.si[L.HOST_FREE])

    @property
    def running_ids(self) -> np.ndarray:
        """Running ids in admission order (a view, valid until the engine moves)."""
        return self.state.ids[L.RUN_Q, : self.state.si[L.N_RUN]]

    @property
    def waiting_ids(self) -> np.ndarray:
        """Waiting ids in queue order (a view, valid until the engine moves)."""
        return self.state.ids[L.WAIT_Q, : self.state.si[L.N_WAIT]]

    @property
    def running(self) -> list[int]:
        return self.running_ids.tolist()

    @property
    def waiting(self) -> list[int]:
        return self.waiting_ids.tolist()

    def _decision_point(self) -> DecisionPoint:
        s, ro = self.state, self._views
        n_run = int(s.si[L.N_RUN])
        return DecisionPoint(
            now=self.now,
            iteration=self.iteration,
            waiting=self.waiting_ids.copy(),
            running=self.running_ids.copy(),
            shortfall_blocks=int(s.si[L.SHORTFALL]),
            running_need_blocks=RequestTable.readonly(s.ids[L.PLAN_NEED, :n_run].copy()),
            free_blocks=self.kv.free,
            num_blocks=self.kv.num_blocks,
            arrival_s=ro["arrival_s"],
            prompt_tokens=ro["prompt"],
            num_computed=ro["computed"],
            num_generated=ro["generated"],
            num_preemptions=ro["preemptions"],
            tenant=ro["tenant"],
            slo_class=ro["slo_class"],
            finished=ro["finish_order"][: self.req.num_finished],
            kv_blocks_held=ro["held"],
            last_iteration_s=self.last_iteration_s,
            total_preemptions=self.total_preemptions,
            config=self.config,
            **(self._cache_view() if self.prefix_caching else {}),
            finish_s=ro["finish_s"],
            kernel_state=s,
        )

    def _cache_view(self) -> dict:
        """The decision point's prefix-cache fields (probed now)."""
        self._probe(self.state, np.int64(self.config.block_size))
        stats = self.prefix_cache_stats
        return {"cached_tokens": self._views["lookup"],
                "prefix_cache_hit_rate": stats["hits"] / stats["queries"]
                if stats["queries"] else float("nan")}

