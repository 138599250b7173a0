"""The one door between the engine and whoever decides: DecisionPoint in, Decision out.

The engine stops at a :class:`DecisionPoint` whenever an iteration has something to decide
(requests are waiting, or serving the running batch would run out of KV blocks). The
policy answers with a :class:`Decision`. Baseline agents, learned agents and the Gymnasium
environment all go through this exchange; the engine never knows who is deciding.

Everything a DecisionPoint exposes is content-blind: token counts, timing, KV state. True
output lengths are never in it; oracle policies get them once, through
``PolicyContext.true_output_tokens``, which the engine fills only for policies that declare
``privileged = True``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Literal

import numpy as np

if TYPE_CHECKING:
    from cbgym.engine.config import EngineConfig
    from cbgym.workload.trace import Trace


@dataclass(frozen=True, slots=True)
class DecisionPoint:
    """The engine's state before an iteration's scheduling decisions.

    Per-request columns are read-only views indexed by request id (0..n-1, in trace order);
    ``waiting`` and ``running`` say which ids are where, in queue order.
    """

    # simulated time (s) at which the iteration starts
    now: float
    # index of the iteration about to run
    iteration: int
    # waiting ids in queue order (re-queued preempted requests first, then by arrival)
    waiting: np.ndarray
    # running ids in admission order (vLLM's running list)
    running: np.ndarray
    # KV blocks missing to serve every running request this iteration (0 = no shortfall)
    shortfall_blocks: int
    # new KV blocks each running request needs this iteration (aligned with ``running``)
    running_need_blocks: np.ndarray
    free_blocks: int
    num_blocks: int
    # columns, indexed by request id (read-only)
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    num_computed: np.ndarray
    num_generated: np.ndarray
    num_preemptions: np.ndarray
    tenant: np.ndarray
    slo_class: np.ndarray
    # ids of finished requests in completion order (their output lengths are now known)
    finished: np.ndarray
    # KV blocks each request holds, indexed by request id
    kv_blocks_held: np.ndarray
    # duration of the previous iteration (s)
    last_iteration_s: float
    # total preemptions so far
    total_preemptions: int
    config: EngineConfig
    # prefix caching (zeros / NaN with it off): per request id, the tokens a waiting
    # request's admission would find in the cache now (its cached prefix, at most tokens - 1;
    # uncached prefill = prompt + generated - cached), and the run's hit rate so far (hit /
    # queried tokens, vLLM's counters). Which blocks are resident is engine state: as
    # content-blind as KV pressure.
    cached_tokens: np.ndarray | None = None
    prefix_cache_hit_rate: float = float("nan")
    # when each request completed (s), indexed by id; meaningful for ``finished`` ids only
    # (a front end sees a response end: content-blind)
    finish_s: np.ndarray | None = None
    # the engine's compiled state, for cbgym's own compiled observation encoder (the learned
    # policy builds the env's exact observation from it). It holds true output lengths:
    # policies never read it.
    kernel_state: object = field(default=None, repr=False, compare=False)

    @property
    def kv_usage(self) -> float:
        """Fraction of KV blocks in use (``vllm:kv_cache_usage_perc``)."""
        return 1.0 - self.free_blocks / self.num_blocks

    def waited_s(self, ids: np.ndarray) -> np.ndarray:
        """Seconds each request has spent since arrival."""
        return self.now - self.arrival_s[ids]

    def shared_prefix_blocks(self, ids: np.ndarray) -> np.ndarray:
        """For each of ``ids`` (waiting requests): how many of its full prompt blocks another
        of ``ids`` also has (its prefix is theirs too; opaque block ids, never tokens). Zeros
        with prefix caching off."""
        from cbgym.engine import prefix_cache as pc

        s = self.kernel_state
        if self.cached_tokens is None or s is None:
            return np.zeros(len(ids), np.int64)
        return pc.shared_blocks(s, np.asarray(ids, np.int64), self.config.block_size)


@dataclass(frozen=True, slots=True)
class Decision:
    """What a policy decides for one iteration. Every field is optional.

    Attributes:
        order: waiting ids in the order to try admitting them. Waiting requests left out are
            held back this iteration. None keeps the queue order (FCFS).
        priority: alternative to ``order``: one key per ``DecisionPoint.waiting`` entry, lower
            admitted first (ties keep queue order). Ignored if ``order`` is given.
        shed: waiting ids to drop now; they end with status ``shed`` and ``shed_reason``.
        shed_reason: the reason recorded for ``shed``.
        victims: running ids in the order to preempt them when KV blocks run out (first
            preempted first). Running requests not listed follow in vLLM's default order (the
            most recently admitted first). None = vLLM's default.
        preempt: running ids to evict voluntarily before the iteration (e.g. SRPT).
    """

    order: np.ndarray | Sequence[int] | None = None
    priority: np.ndarray | None = None
    shed: Sequence[int] = ()
    shed_reason: str = "shed_by_policy"
    victims: np.ndarray | Sequence[int] | None = None
    preempt: Sequence[int] = ()


FCFS_DECISION = Decision()

_WAITING, _RUNNING = 1, 2  # Status codes (cbgym.engine.requests.Status)
_STATE_NAMES = {0: "PENDING", 1: "WAITING", 2: "RUNNING", 3: "FINISHED", 4: "SHED"}


class InvalidDecisionError(ValueError):
    """A Decision names a request that is not where the decision says it is."""


def validate_decision(d: Decision, status: np.ndarray, num_waiting: int) -> None:
    """Check every id a decision names against the requests' states; raise a clear error."""
    _check_ids("order", d.order, status, _WAITING)
    _check_ids("shed", d.shed, status, _WAITING)
    _check_ids("victims", d.victims, status, _RUNNING)
    _check_ids("preempt", d.preempt, status, _RUNNING)
    if d.priority is not None and d.order is None:
        pr = np.asarray(d.priority, dtype=np.float64)
        if pr.shape != (num_waiting,) or not np.isfinite(pr).all():
            raise InvalidDecisionError(
                f"Decision.priority: expected {num_waiting} finite keys (one per waiting "
                f"request), got shape {pr.shape}")


def _check_ids(name: str, ids: object, status: np.ndarray, where: int) -> None:
    """Every id of a Decision field must exist, once, in the state the field expects."""
    if ids is None or len(ids) == 0:  # type: ignore[arg-type]
        return
    arr = np.asarray(ids, dtype=np.int64).reshape(-1)
    if arr.min() < 0 or arr.max() >= len(status):
        raise InvalidDecisionError(f"Decision.{name}: ids must be in [0, {len(status)})")
    state = status[arr]
    if (state != where).any():
        bad = int(arr[np.flatnonzero(state != where)[0]])
        raise InvalidDecisionError(
            f"Decision.{name}: request {bad} is {_STATE_NAMES[int(status[bad])]}, "
            f"expected {_STATE_NAMES[where]}")
    if len(set(arr.tolist())) != arr.size:
        raise InvalidDecisionError(f"Decision.{name}: ids repeat")


@dataclass(frozen=True, slots=True)
class PolicyContext:
    """What a policy learns once, when a simulation starts."""

    config: EngineConfig
    num_requests: int
    seed: int
    # true output lengths, filled only for policies with ``privileged = True`` (oracles)
    true_output_tokens: np.ndarray | None = None
    # every request's prompt length and arrival time (content-blind; None where unknown)
    prompt_tokens: np.ndarray | None = None
    arrival_s: np.ndarray | None = None
    # every request's TTFT target in seconds (its SLO class's; None where the run has none)
    ttft_target_s: np.ndarray | None = None
    # every request's priority (lower first: the trace's ``priority`` column, else its SLO
    # class: Trace.priority)
    priority: np.ndarray | None = None
    # every request's SLO class (with ``ttft_target_s``: each class's target)
    slo_class: np.ndarray | None = None
    # the trace's name and each request's recorded wall-clock arrival (Unix seconds, UTC;
    # the trace's ``extra["epoch_s"]``), where known: metadata, as content-blind as arrivals
    trace_name: str | None = None
    clock_s: np.ndarray | None = None


class Policy:
    """Base class of scheduling policies: ``decide(DecisionPoint) -> Decision``.

    ``consult`` tells the engine when to ask:
      * ``"never"``: the policy's decision is always vLLM's default (queue order, the most
        recently admitted request as victim), so the engine applies it without asking.
      * ``"on_change"``: only when the waiting set changed (arrivals, re-queued or admitted
        requests) or memory runs short; in between, the engine keeps applying the last
        decision's order and holds (right for any policy whose ranking does not drift with
        time alone, e.g. fixed keys or linear aging). This lets the engine advance blocked
        stretches in one computation.
      * ``"on_completion"``: as ``on_change``, and also after any request finished (for
        rankings that use statistics of completed requests, e.g. CB-SJF-Work's estimate).
      * ``"every_iteration"``: at every iteration with something to decide.
    """

    name: ClassVar[str] = "policy"
    privileged: ClassVar[bool] = False
    consult: ClassVar[Literal["never", "on_change", "on_completion", "every_iteration", "always"]]
    consult = "on_change"
    # with static keys: preempt the running request with the largest key instead of the
    # last admitted (vLLM's priority policy)
    victim_by_key: ClassVar[bool] = False

    def reset(self, ctx: PolicyContext) -> None:
        """Called once before a simulation; keep ``ctx`` if needed."""
        self.ctx = ctx

    def check_trace(self, trace: Trace) -> None:
        """Raise ValueError (one line) if this policy must not serve ``trace``; sweeps call
        it on every window before any work (``cbgym bench``, ``cbgym simulate``). Default:
        every trace is fine (a predictor's policy refuses its training split)."""

    def decide(self, dp: DecisionPoint) -> Decision:
        raise NotImplementedError

    def static_keys(self) -> np.ndarray | None:
        """One key per request id when this policy's decision is always "admit the waiting
        requests by this key, lower first, ties in queue order; default victims" and the key
        of a request never changes (after :meth:`reset`). The engine then ranks inside its
        compiled loop instead of calling :meth:`decide`. None (the default): ask ``decide``."""
        return None
