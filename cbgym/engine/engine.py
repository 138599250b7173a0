"""One simulated serving instance, advanced one iteration at a time (vLLM v1 semantics).

NOTE on the scheduling algorithm (after vLLM v1): there is no prefill phase and no decode
phase. Every request has ``computed`` tokens catching up with its tokens (prompt + generated
output); an iteration hands out a token budget, running requests first, then waiting ones.
A decode is a request one token behind; a long prompt is caught up in chunks. A request samples
a token when it has caught up, so its first token comes with its last prompt chunk.

The engine talks to whoever decides through one door: :meth:`Engine.next_decision` advances
time through iterations with nothing to decide and returns a :class:`DecisionPoint` (or None
when the workload has drained); :meth:`Engine.decide` applies a :class:`Decision` to that
iteration and runs it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cbgym.engine.config import EngineConfig
from cbgym.engine.cost_model import BatchStats
from cbgym.engine.decision import (
    FCFS_DECISION,
    Decision,
    DecisionPoint,
    validate_decision,
)
from cbgym.engine.fast_forward import advance_stretch
from cbgym.engine.kv_cache import BlockManager
from cbgym.engine.recorder import Recorder
from cbgym.engine.requests import RequestTable, Status
from cbgym.workload.trace import Trace

_GIB = 1 << 30
WAITING, RUNNING = int(Status.WAITING), int(Status.RUNNING)  # plain ints: hot-path lookups
# With nothing running and every waiting request held back, time moves by this much per tick.
IDLE_TICK_S = 0.01
MAX_IDLE_TICKS = 100_000


CONSULT_MODES = ("never", "on_change", "on_completion", "every_iteration", "always")
_VIEWS = ("arrival_s", "prompt", "computed", "generated", "preemptions", "tenant", "slo_class",
          "finish_order")


@dataclass(slots=True)
class RunningPlan:
    """What serving the running batch would take this iteration (vLLM's running loop)."""

    ids: np.ndarray  # running ids, in order
    computed: np.ndarray  # tokens computed before the iteration
    tokens: np.ndarray  # tokens each should catch up with this iteration (the budget allows)
    need: np.ndarray  # new KV blocks each needs for that
    need_total: int  # their sum
    shortfall: int  # blocks missing overall (0: everyone fits)
    decoding: bool  # every running request is one token behind (a pure decode batch)


class Engine:
    """A serving instance replaying ``trace`` under ``config``.

    Args:
        trace: the requests, in arrival order.
        config: static engine configuration.
        consult: ``"on_change"`` (ask for a decision only when the waiting set changed or
            memory runs short) or ``"every_iteration"``; see :class:`cbgym.engine.Policy`.
        record_iterations: keep the per-iteration batch log (ids and tokens per iteration).
        fast_forward: advance stretches of decode-only iterations with nothing to decide in one
            computation (identical results; off only to test exactly that).
    """

    def __init__(
        self,
        trace: Trace,
        config: EngineConfig,
        consult: str = "on_change",
        record_iterations: bool = False,
        fast_forward: bool = True,
    ) -> None:
        assert config.block_size is not None and config.num_kv_blocks is not None
        self.config = config
        self.req = RequestTable(trace)
        self.kv = BlockManager(config.num_kv_blocks, config.block_size, len(trace))
        self.cost = config.cost_model
        self.recorder = Recorder(record_iterations)
        if consult not in CONSULT_MODES:
            raise ValueError(f"Engine consult={consult!r}: expected one of {CONSULT_MODES}")
        self.consult_every_iteration = consult in ("every_iteration", "always")
        # "always": stop before every iteration, even with nothing to decide (no skipping)
        self.consult_always = consult == "always"
        self.consult_on_completion = consult == "on_completion"
        # "never": the policy's decisions are vLLM's defaults (FCFS order, latest-admitted
        # victim), so there is nothing to ask; the engine applies the defaults itself
        self.consult_never = consult == "never"
        self.fast_forward = fast_forward
        self.paper = config.paper_mode
        self.budget = np.iinfo(np.int64).max if self.paper else config.max_num_batched_tokens
        kvb = config.kv_bytes_per_token or 0
        self.kv_bytes_per_token = kvb
        self.host_free_tokens = int(config.swap_space_gib * _GIB // kvb) if kvb else 0
        self.now = 0.0
        self.iteration = 0
        self.last_iteration_s = 0.0
        self.total_preemptions = 0
        self.running: list[int] = []
        self.waiting: list[int] = []
        self._next_arrival = 0  # index of the next request to arrive
        self._next_arrival_s = float(trace.arrival_s[0]) if len(trace) else float("inf")
        self._changed = True  # the waiting set changed since the policy last decided
        self._standing: Decision = FCFS_DECISION  # last decision, re-applied until a change
        self._pending: DecisionPoint | None = None
        self._plan: RunningPlan | None = None
        self._idle_ticks = 0
        self._views = self._make_views()
        self._swap_bytes = 0
        self._preempted_now = 0

    def _make_views(self) -> dict[str, np.ndarray]:
        """Read-only views handed to policies (made once: the columns are updated in place)."""
        views = {name: self.req.readonly(getattr(self.req, name)) for name in _VIEWS}
        views["held"] = self.req.readonly(self.kv.held)
        return views

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["_views"]  # views would unpickle as detached copies of the columns
        state["_pending"] = None if self._pending is None else True
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._views = self._make_views()
        if self._pending is not None:  # rebuild the pending decision point on the new columns
            self._pending = self._decision_point(self._running_plan())

    # ------------------------------------------------------------------ the door
    def next_decision(self) -> DecisionPoint | None:
        """Advance to the next iteration that needs a decision; None once all requests ended."""
        if self._pending is not None:
            return self._pending
        while True:
            self._admit_arrivals()
            if not self.running and not self.waiting:
                if self._next_arrival >= self.req.n:
                    return None
                self.now = max(self.now, float(self.req.arrival_s[self._next_arrival]))
                continue
            plan = self._running_plan()
            asks = self.consult_always or (
                self.waiting and (self.consult_every_iteration or self._changed))
            if (plan.shortfall > 0 or asks) and not self.consult_never:
                self._pending = self._decision_point(plan)
                return self._pending
            if not (self.fast_forward and advance_stretch(self, plan)):
                self._iterate(self._standing, plan)

    def decide(self, decision: Decision, validate: bool = True) -> None:
        """Apply ``decision`` to the pending iteration and run it.

        Args:
            decision: what to do this iteration.
            validate: check every id the decision names (an :class:`InvalidDecisionError`
                otherwise). Callers that build decisions only from the decision point's own
                ids (the Gymnasium env decodes actions that way) may skip it.
        """
        if self._pending is None:
            raise RuntimeError("Engine.decide() called with no pending decision point; "
                               "call next_decision() first")
        self._pending = None
        if validate:
            validate_decision(decision, self.req.status, len(self.waiting))
        for rid in decision.shed:
            self._shed(int(rid), decision.shed_reason)
        if decision.priority is not None and decision.order is None:
            self._standing = self._order_by_priority(decision)
        else:
            self._standing = decision
        self._changed = False
        plan = self._plan if not decision.shed else None
        self._iterate(self._standing, plan)

    @property
    def done(self) -> bool:
        return self.req.num_ended == self.req.n

    # ------------------------------------------------------------------ arrivals
    def _admit_arrivals(self) -> None:
        """Move every request that has arrived by ``now`` into the waiting queue."""
        if self._next_arrival_s > self.now:  # a float compare: this runs every iteration
            return
        req, n = self.req, self.req.n
        i = self._next_arrival
        j = int(np.searchsorted(req.arrival_s, self.now, side="right"))
        for rid in range(i, j):
            reason = self._never_fits(rid)
            if reason:
                req.end(rid, Status.SHED, float(req.arrival_s[rid]), reason)
            else:
                req.status[rid] = WAITING
                self.waiting.append(rid)
                self._changed = True
        self._next_arrival = j
        self._next_arrival_s = float(req.arrival_s[j]) if j < n else float("inf")

    def _never_fits(self, rid: int) -> str | None:
        req, cfg = self.req, self.config
        if self.paper:
            if self.kv.blocks_for(int(req.prompt[rid] + req.output[rid])) > self.kv.num_blocks:
                return "kv_reservation_exceeds_capacity"
            return None
        if cfg.max_model_len is not None and req.prompt[rid] >= cfg.max_model_len:
            return "prompt_exceeds_max_model_len"
        if self.kv.blocks_for(int(req.prompt[rid])) > self.kv.num_blocks:
            return "prompt_exceeds_kv_capacity"
        if not cfg.chunked_prefill and req.prompt[rid] > self.budget:
            return "prompt_exceeds_token_budget"  # without chunking it could never be scheduled
        return None

    # ------------------------------------------------------------------ decision points
    def _running_plan(self) -> RunningPlan:
        """vLLM's running loop, vectorised: tokens per request under the budget, blocks needed."""
        if self._plan is not None:
            return self._plan
        req = self.req
        n = len(self.running)
        ids = np.fromiter(self.running, np.int64, n)
        computed = req.computed[ids]
        remaining = req.tokens[ids] - computed
        # a request one token behind that has output is decoding; else it is (re)prefilling
        decoding = n > 0 and int(remaining.max()) == 1 and int(req.generated[ids].min()) > 0
        if self.paper:  # the study's decode step serves every running request, KV reserved
            tokens, need = remaining, np.zeros_like(remaining)
        else:
            if decoding and n <= self.budget:
                # a decoding request holds exactly ceil(computed / block_size) blocks, so its
                # next token needs a new block exactly when its last block is full
                tokens = remaining
                need = (computed % self.kv.block_size == 0).astype(np.int64)
            else:
                before = np.cumsum(remaining) - remaining
                tokens = np.minimum(remaining, np.maximum(self.budget - before, 0))
                need = -(-(computed + tokens) // self.kv.block_size) - self.kv.held[ids]
                np.maximum(need, 0, out=need)
        total = int(need.sum())
        self._plan = RunningPlan(ids, computed, tokens, need, total,
                                 max(total - self.kv.free, 0), decoding)
        return self._plan

    def _decision_point(self, plan: RunningPlan) -> DecisionPoint:
        req, ro = self.req, self._views
        return DecisionPoint(
            now=self.now,
            iteration=self.iteration,
            waiting=np.fromiter(self.waiting, np.int64, len(self.waiting)),
            running=plan.ids.copy(),
            shortfall_blocks=plan.shortfall,
            running_need_blocks=self.req.readonly(plan.need),
            free_blocks=self.kv.free,
            num_blocks=self.kv.num_blocks,
            arrival_s=ro["arrival_s"],
            prompt_tokens=ro["prompt"],
            num_computed=ro["computed"],
            num_generated=ro["generated"],
            num_preemptions=ro["preemptions"],
            tenant=ro["tenant"],
            slo_class=ro["slo_class"],
            finished=ro["finish_order"][: req.num_finished],
            kv_blocks_held=ro["held"],
            last_iteration_s=self.last_iteration_s,
            total_preemptions=self.total_preemptions,
            config=self.config,
        )

    def _order_by_priority(self, d: Decision) -> Decision:
        waiting = np.fromiter(self.waiting, np.int64, len(self.waiting))
        order = waiting[np.argsort(np.asarray(d.priority, dtype=np.float64), kind="stable")]
        return Decision(order=order, victims=d.victims, preempt=d.preempt)

    # ------------------------------------------------------------------ one iteration
    def _iterate(self, d: Decision, plan: RunningPlan | None) -> None:
        """Schedule and run one iteration under decision ``d``."""
        self._swap_bytes = 0
        self._preempted_now = 0
        for rid in d.preempt:
            self._preempt(int(rid))
            self.running.remove(int(rid))
            plan = None
        if self.paper:
            ids, tokens = self._schedule_paper(d)
        else:
            ids, tokens = self._schedule(d, plan or self._running_plan())
        self._plan = None
        self._execute(ids, tokens)
        if d.preempt:  # a voluntary eviction is consumed; the order stands
            self._standing = Decision(order=d.order, victims=d.victims)

    def _schedule(self, d: Decision, plan: RunningPlan) -> tuple[np.ndarray, np.ndarray]:
        budget = self.budget
        # First, schedule the RUNNING requests.
        if plan.shortfall == 0 and not self._any_too_long(plan):
            if plan.decoding and len(plan.ids) <= budget:
                ids, tokens = plan.ids, plan.tokens
                budget -= len(ids)  # one token each
            else:
                scheduled = plan.tokens > 0
                ids, tokens = plan.ids[scheduled], plan.tokens[scheduled]
                budget -= int(tokens.sum())
            self.kv.add(plan.ids, plan.need, plan.need_total)
            preempted = False
        else:
            ids, tokens, budget, preempted = self._schedule_running_slow(d, budget)
        # Next, schedule the WAITING requests, unless this iteration had to preempt.
        if not preempted:
            new_ids, new_tokens = self._admit(d, budget)
            if new_ids:
                ids = np.concatenate([ids, np.asarray(new_ids, np.int64)])
                tokens = np.concatenate([tokens, np.asarray(new_tokens, np.int64)])
                budget -= sum(new_tokens)
        # Check that the scheduling constraints are satisfied.
        assert budget >= 0 and len(self.running) <= self.config.max_num_seqs
        return ids, tokens

    def _any_too_long(self, plan: RunningPlan) -> bool:
        if self.config.max_model_len is None:
            return False
        return bool(np.any(plan.computed + plan.tokens > self.config.max_model_len))

    def _schedule_running_slow(
        self, d: Decision, budget: int
    ) -> tuple[np.ndarray, np.ndarray, int, bool]:
        """vLLM's running loop one request at a time, preempting when blocks run out."""
        req, kv, running = self.req, self.kv, self.running
        scheduled: dict[int, int] = {}
        victims = iter(()) if d.victims is None else iter(np.asarray(d.victims).tolist())
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            rid = running[i]
            tokens = min(req.num_tokens(rid) - int(req.computed[rid]), budget)
            if kv.blocks_for(int(req.computed[rid]) + tokens) > kv.num_blocks:
                self._shed(rid, "kv_capacity_exceeded")  # could never run, even alone
                continue
            while not kv.grow_to(rid, int(req.computed[rid]) + tokens):
                victim = self._pick_victim(victims)
                pos = running.index(victim)
                running.pop(pos)
                budget += scheduled.pop(victim, 0)  # give back what it was granted
                self._preempt(victim)
                preempted = True
                if pos < i:
                    i -= 1
                if victim == rid:
                    break
            else:
                scheduled[rid] = tokens
                budget -= tokens
                i += 1
        ids = np.fromiter(scheduled.keys(), np.int64, len(scheduled))
        tokens_arr = np.fromiter(scheduled.values(), np.int64, len(scheduled))
        return ids, tokens_arr, budget, preempted

    def _pick_victim(self, victims: object) -> int:
        """The policy's next victim still running, else vLLM's default: the last admitted."""
        for rid in victims:  # type: ignore[attr-defined]
            if self.req.status[rid] == RUNNING:
                return int(rid)
        return self.running[-1]

    def _admission_order(self, d: Decision) -> list[int]:
        if d.order is None:
            return self.waiting  # iterated, not mutated, by the callers
        order = np.asarray(d.order, dtype=np.int64)
        return order[self.req.status[order] == WAITING].tolist()

    def _admit(self, d: Decision, budget: int) -> tuple[list[int], list[int]]:
        """Admit waiting requests in the decision's order; stop at the first that does not fit."""
        req, kv, cfg = self.req, self.kv, self.config
        new_ids: list[int] = []
        new_tokens: list[int] = []
        never: list[int] = []
        for rid in self._admission_order(d):
            if len(self.running) >= cfg.max_num_seqs or budget <= 0:
                break
            total = req.num_tokens(rid)
            computed = int(req.host_tokens[rid])  # swapped-out KV comes back; else recompute
            new = total - computed
            blocks = kv.blocks_for(total)
            if blocks > kv.num_blocks or (not cfg.chunked_prefill and new > self.budget):
                never.append(rid)  # prompt + output so far outgrew the cache or the budget
                continue
            if not cfg.chunked_prefill and new > budget:
                break
            tokens = min(new, budget)
            # The whole sequence must fit before a request is admitted (no partial reservation
            # of a prompt that could then stall), but only the scheduled chunk is allocated.
            # (A waiting request holds no blocks: preemption and swap-out free them all.)
            if blocks > kv.free:
                break
            kv.grow_to(rid, computed + tokens)
            self._start(rid, computed)
            new_ids.append(rid)
            new_tokens.append(tokens)
            budget -= tokens
        if new_ids:
            admitted = set(new_ids)
            self.waiting = [r for r in self.waiting if r not in admitted]
            self._changed = True
        for rid in never:
            self._shed(rid, "kv_capacity_exceeded")
        return new_ids, new_tokens

    def _start(self, rid: int, computed: int) -> None:
        req = self.req
        if computed:  # swap-in: the KV crosses the host link back
            self._swap_bytes += computed * self.kv_bytes_per_token
            self.host_free_tokens += computed
            req.host_tokens[rid] = 0
        req.computed[rid] = computed
        req.status[rid] = RUNNING
        first = req.first_scheduled_s[rid]
        if first != first:  # NaN: never scheduled before
            req.first_scheduled_s[rid] = self.now
        self.running.append(rid)

    def _schedule_paper(self, d: Decision) -> tuple[np.ndarray, np.ndarray]:
        """The CB-SJF-Work study's step: a prefill step for admissions, else a decode step."""
        req, kv, cfg = self.req, self.kv, self.config
        admitted: list[int] = []
        for rid in self._admission_order(d):
            if len(self.running) >= cfg.max_num_seqs:
                break
            # KV for prompt + true output is reserved at admission: a memory oracle for all
            if not kv.grow_to(rid, int(req.prompt[rid] + req.output[rid])):
                break
            self._start(rid, 0)
            admitted.append(rid)
        if admitted:
            ids = np.asarray(admitted, np.int64)
            chosen = set(admitted)
            self.waiting = [r for r in self.waiting if r not in chosen]
            self._changed = True
            return ids, req.tokens[ids].copy()  # prompt (+ generated, after an eviction)
        ids = np.fromiter(self.running, np.int64, len(self.running))
        return ids, np.ones(len(ids), np.int64)

    # ------------------------------------------------------------------ preemption
    def _preempt(self, rid: int) -> None:
        """Evict a running request: swap its KV to host if asked and room, else recompute."""
        req = self.req
        computed = int(req.computed[rid])
        if self.config.preemption == "swap" and 0 < computed <= self.host_free_tokens:
            req.host_tokens[rid] = computed
            self.host_free_tokens -= computed
            self._swap_bytes += computed * self.kv_bytes_per_token
        req.computed[rid] = 0
        self.kv.free_request(rid)
        self._plan = None
        req.status[rid] = WAITING
        req.preemptions[rid] += 1
        self.total_preemptions += 1
        self._preempted_now += 1
        self.waiting.insert(0, rid)  # vLLM re-queues a preempted request at the head
        self._changed = True
        self.recorder.preempted(self.iteration, rid)

    def _shed(self, rid: int, reason: str) -> None:
        req = self.req
        if req.status[rid] == Status.RUNNING:
            self.running.remove(rid)
        elif req.status[rid] == Status.WAITING:
            self.waiting.remove(rid)
        if req.host_tokens[rid]:
            self.host_free_tokens += int(req.host_tokens[rid])
            req.host_tokens[rid] = 0
        self.kv.free_request(rid)
        req.end(rid, Status.SHED, self.now, reason)
        self._changed = True

    # ------------------------------------------------------------------ running the batch
    def _execute(self, ids: np.ndarray, tokens: np.ndarray) -> None:
        """Price the iteration, advance the clock, produce tokens, retire finished requests."""
        if not len(ids) and not self._swap_bytes and not self._preempted_now:
            self._idle()
            return
        self._idle_ticks = 0
        req = self.req
        computed = req.computed[ids]
        after = computed + tokens
        sampled = after == req.tokens[ids]
        # a decode is one token past the prompt; everything else computed is prefill work
        num_decode = int(np.count_nonzero(sampled & (tokens == 1) & (req.generated[ids] > 0)))
        num_tokens = int(tokens.sum())
        stats = BatchStats(
            num_seqs=len(ids),
            prefill_tokens=num_tokens - num_decode,
            decode_seqs=num_decode,
            sampled_seqs=int(np.count_nonzero(sampled)),
            attn_q_ctx=int(tokens @ computed),
            attn_q_sq=(int(tokens @ tokens) + num_tokens) // 2,  # sum of q (q + 1) / 2
            kv_tokens=int(after.sum()),
            swap_bytes=self._swap_bytes,
        )
        dt = float(self.cost.iteration_time(stats))
        start, self.now = self.now, self.now + dt
        req.computed[ids] = after
        out = ids[sampled]
        req.generated[out] += 1
        req.tokens[out] += 1
        req.first_token_s[out[req.generated[out] == 1]] = self.now
        # gauges as vLLM reports them: after scheduling, before finished requests are freed
        self.recorder.iteration((start, dt, len(self.waiting), len(self.running), self.kv.used,
                                 num_tokens, num_tokens - num_decode, num_decode,
                                 self._preempted_now))
        self.recorder.batch(self.iteration, ids, tokens)
        self._retire(out)
        self.iteration += 1
        self.last_iteration_s = dt

    def _idle(self) -> None:
        """Nothing was scheduled (the policy held every waiting request): let time pass."""
        self._idle_ticks += 1
        self._changed = True  # a standing hold must not outlive an idle tick: ask again
        if self._idle_ticks > MAX_IDLE_TICKS:
            raise RuntimeError(
                f"the policy held every waiting request for {MAX_IDLE_TICKS} idle ticks with "
                "nothing running; it would never drain the workload")
        nxt = self._next_arrival
        future = nxt < self.req.n and self.req.arrival_s[nxt] > self.now
        self.now = float(self.req.arrival_s[nxt]) if future else self.now + IDLE_TICK_S

    def _retire(self, sampled: np.ndarray) -> None:
        """End requests that produced their last token (or reached max_model_len)."""
        req = self.req
        generated = req.generated[sampled]
        full = generated >= req.output[sampled]
        capped = None
        if self.config.max_model_len is not None:
            capped = (req.tokens[sampled] >= self.config.max_model_len) & ~full
            full |= capped
        if not full.any():
            return
        ended = sampled[full].tolist()
        reasons = [None] * len(ended) if capped is None else [
            "max_model_len" if c else None for c in capped[full].tolist()]
        for rid, reason in zip(ended, reasons, strict=True):
            req.end(rid, Status.FINISHED, self.now, reason)
            self.kv.free_request(rid)
        gone = set(ended)
        self.running = [r for r in self.running if r not in gone]
        if self.consult_on_completion:
            self._changed = True
