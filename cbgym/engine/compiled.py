"""An :class:`~cbgym.engine.Engine` whose iterations run in the compiled kernel.

:class:`CompiledEngine` owns a plain ``Engine`` (its request table, block counts and recorder)
and a :class:`cbgym.engine.kernel.State` that shares those arrays. The kernel advances the
state; :meth:`CompiledEngine.sync` copies the few scalars and queues back into the ``Engine``
object, which is then exactly the engine the reference would have produced (and can even carry
on in Python). Only the ``"every_iteration"`` and ``"always"`` consult modes and the linear and
roofline cost models are compiled; :func:`supports` says whether a configuration is.
"""

from __future__ import annotations

import numpy as np

from cbgym.engine import kernel as k
from cbgym.engine.config import EngineConfig
from cbgym.engine.decision import Decision, DecisionPoint
from cbgym.engine.engine import Engine
from cbgym.workload.trace import Trace

_REC_ROWS = 4096  # time-series rows buffered in the kernel before they move to the recorder


def _ids(x: object) -> np.ndarray:
    """Request ids as a contiguous int64 array (None: none)."""
    return np.ascontiguousarray(() if x is None else x, dtype=np.int64)


def supports(config: EngineConfig) -> bool:
    """Whether the kernel reproduces ``config`` exactly (its cost model is one it compiles)."""
    return k.cost_params(config.cost_model) is not None


class CompiledEngine:
    """Drive an engine through the numba kernel; ``sync()`` gives the equivalent ``Engine``.

    Args:
        trace: the requests, in arrival order.
        config: a configuration :func:`supports` accepts.
        consult: ``"every_iteration"`` (stop whenever a request waits or memory runs short)
            or ``"always"`` (stop before every iteration).
    """

    def __init__(self, trace: Trace, config: EngineConfig,
                 consult: str = "every_iteration") -> None:
        if consult not in ("every_iteration", "always"):
            raise ValueError(f"CompiledEngine consult={consult!r}: expected 'every_iteration' "
                             "or 'always'")
        cost = k.cost_params(config.cost_model)
        if cost is None:
            raise ValueError(f"the compiled engine does not price "
                             f"{type(config.cost_model).__name__}; use Engine")
        self.engine = eng = Engine(trace, config, consult=consult)
        req, n = eng.req, len(trace)
        ci = np.zeros(k.NUM_CI, np.int64)
        ci[k.PAPER] = eng.paper
        ci[k.BUDGET] = eng.budget
        ci[k.MAX_SEQS] = config.max_num_seqs
        ci[k.BLOCK_SIZE] = eng.kv.block_size
        ci[k.NUM_BLOCKS] = eng.kv.num_blocks
        ci[k.CHUNKED] = config.chunked_prefill
        ci[k.MAX_MODEL_LEN] = -1 if config.max_model_len is None else config.max_model_len
        ci[k.SWAP] = config.preemption == "swap"
        ci[k.KV_BYTES] = eng.kv_bytes_per_token
        ci[k.CONSULT_ALWAYS] = consult == "always"
        ci[k.COST_KIND] = cost[0]
        si = np.zeros(k.NUM_SI, np.int64)
        si[k.FREE] = eng.kv.free
        si[k.HOST_FREE] = eng.host_free_tokens
        si[k.CHANGED] = 1
        self.state = k.State(
            req.arrival_s, req.prompt, req.output, req.tokens, req.computed, req.generated,
            req.host_tokens, req.preemptions, req.status, req.first_scheduled_s,
            req.first_token_s, req.finish_s, req.finish_order, np.zeros(n, np.int8),
            eng.kv.held, np.zeros(n, np.int64), np.zeros(n, np.int64), si,
            np.zeros(k.NUM_SF), ci, cost[1], np.zeros((_REC_ROWS, k.REC_COLUMNS)),
            np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64),
            np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, bool))
        self.drained = False
        self._bind()
        self._advance(k.advance)

    def _bind(self) -> None:
        none = np.empty(0, np.int64)
        self._decide = k.bind(k.decide, self.state, none, True, none, none)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["_decide"]  # compiled code: bound again after unpickling
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._bind()

    # ------------------------------------------------------------------ stepping
    def _advance(self, run: object, *args: object) -> None:
        """Call a kernel entry point, emptying the row buffer whenever it fills."""
        self.make_room()
        self.settle(run(self.state, *args))  # type: ignore[operator]

    def make_room(self) -> None:
        """Ensure the row buffer has room for the next iteration (the kernel's precondition)."""
        s = self.state
        if s.si[k.REC_N] >= len(s.rec):
            self._flush()

    def settle(self, code: int) -> int:
        """Finish what a kernel call returned: advance on after a full buffer, raise on a stuck
        workload, note whether it drained. Returns AT_DECISION or DRAINED."""
        while code == k.NEED_ROOM:
            self._flush()
            code = k.advance(self.state)
        if code == k.TOO_MANY_IDLE_TICKS:
            raise RuntimeError(
                f"the policy held every waiting request for {k.MAX_IDLE_TICKS} idle ticks with "
                "nothing running; it would never drain the workload")
        self.drained = code == k.DRAINED
        return code

    def decide_arrays(self, order: np.ndarray | None, shed: object,
                      victims: np.ndarray | None) -> None:
        """Apply a decision given as id arrays (None: FCFS order / default victims), run it
        and advance to the next decision point."""
        if self.drained:
            raise RuntimeError("CompiledEngine.decide: the workload has drained")
        ids = _ids  # the bound kernel takes contiguous int64 arrays only
        self._advance(self._decide, ids(order), order is not None, ids(shed), ids(victims))

    def decide(self, d: Decision) -> None:
        """Apply a :class:`Decision` (order, shed, victims; no priority or voluntary preempt)."""
        if d.priority is not None or len(d.preempt):
            raise ValueError("CompiledEngine.decide takes order, shed and victims only")
        if len(d.shed) and d.shed_reason != k.REASONS[k.R_AGENT]:
            raise ValueError(f"CompiledEngine.decide records sheds as {k.REASONS[k.R_AGENT]!r}; "
                             f"got shed_reason={d.shed_reason!r}")
        self.decide_arrays(None if d.order is None else _ids(d.order), _ids(d.shed),
                           None if d.victims is None else _ids(d.victims))

    # ------------------------------------------------------------------ reading the state
    @property
    def now(self) -> float:
        return float(self.state.sf[k.NOW])

    @property
    def iteration(self) -> int:
        return int(self.state.si[k.ITERATION])

    @property
    def running(self) -> np.ndarray:
        return self.state.running[: self.state.si[k.N_RUN]]

    @property
    def waiting(self) -> np.ndarray:
        return self.state.waiting[: self.state.si[k.N_WAIT]]

    def _flush(self) -> None:
        s = self.state
        rows = int(s.si[k.REC_N])
        if rows:
            self.engine.recorder.iteration_rows(s.rec[:rows].copy())
            s.si[k.REC_N] = 0

    def sync(self) -> Engine:
        """Bring the reference ``Engine`` object up to the kernel's state and return it."""
        s, eng = self.state, self.engine
        si = s.si
        self._flush()
        eng.now = float(s.sf[k.NOW])
        eng.last_iteration_s = float(s.sf[k.LAST_DT])
        eng.iteration = int(si[k.ITERATION])
        eng.total_preemptions = int(si[k.TOTAL_PREEMPT])
        eng.running = self.running.tolist()
        eng.waiting = self.waiting.tolist()
        nxt = int(si[k.NEXT_ARRIVAL])
        eng._next_arrival = nxt
        eng._next_arrival_s = float(s.arrival_s[nxt]) if nxt < len(s.arrival_s) else float("inf")
        eng._changed = bool(si[k.CHANGED])
        eng._idle_ticks = int(si[k.IDLE_TICKS])
        eng._pending = eng._plan = None
        eng.host_free_tokens = int(si[k.HOST_FREE])
        eng.kv.free = int(si[k.FREE])
        eng.req.num_finished = int(si[k.NUM_FINISHED])
        eng.req.num_ended = int(si[k.NUM_ENDED])
        for rid in np.flatnonzero(s.reason).tolist():
            eng.req.reason[rid] = k.REASONS[s.reason[rid]]
        return eng

    def decision_point(self) -> DecisionPoint | None:
        """The pending decision point, as the reference engine presents it (None if drained)."""
        if self.drained:
            return None
        return self.sync().next_decision()
