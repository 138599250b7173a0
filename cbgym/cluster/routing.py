"""The cluster's door: a :class:`RoutingPoint` answered by a :class:`Route`.

As scheduling leaves an instance through ``DecisionPoint`` / ``Decision``, placement leaves
the cluster through these. At each arrival the cluster stops, shows the router the request's
content-blind counts and every instance's load as of the last load report, and places the
request as the route says. Routers (``cbgym.agents.routers``), the cluster env and the tasks
all go through it.

Per-instance signals are arrays indexed by instance (CartPoleVectorEnv's batched style):

| field | meaning |
|---|---|
| ``role`` | 0 unified, 1 prefill, 2 decode |
| ``num_waiting`` | waiting requests |
| ``waiting_prefill_tokens`` | prompt tokens they still have to compute (none for received KV) |
| ``num_running`` / ``decode_batch`` | running requests / of them, those past their prompt |
| ``decode_context_tokens`` | tokens of KV the decode batch attends to (its step's cost) |
| ``running_prefill_tokens`` | prompt tokens the running batch has still to compute |
| ``kv_usage`` / ``free_blocks`` | used fraction of KV blocks / free blocks |
| ``transfers_in`` / ``transfers_out`` | KV transfers in flight into / out of the instance |
| ``incoming`` | requests routed to this decode instance still prefilling on a prefill one |
| ``kv_held_for_transfer`` | requests whose KV a prefill instance keeps until it is read |
| ``local_prefills`` | requests whose prompt is computed here (deflected, on a decode one) |
| ``last_iteration_s`` | the instance's last iteration time |
| ``report_s`` | when these signals were taken |

With prefix caching, ``RoutingPoint.cached_tokens`` (per instance, live) says how much of the
request's prompt each instance's cache holds.

Content-blind: no prompt content and never a request's true output length.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from cbgym.cluster.config import ClusterConfig

ROLE_CODES = {"unified": 0, "prefill": 1, "decode": 2}
LOAD_FIELDS = ("num_waiting", "waiting_prefill_tokens", "num_running", "decode_batch",
               "decode_context_tokens", "running_prefill_tokens", "kv_usage", "free_blocks",
               "transfers_in", "transfers_out", "local_prefills", "last_iteration_s",
               "incoming", "kv_held_for_transfer")


@dataclass(frozen=True, slots=True)
class Loads:
    """Every instance's load signals at one report (arrays indexed by instance)."""

    report_s: float
    num_waiting: np.ndarray
    waiting_prefill_tokens: np.ndarray
    num_running: np.ndarray
    decode_batch: np.ndarray
    decode_context_tokens: np.ndarray
    running_prefill_tokens: np.ndarray
    kv_usage: np.ndarray
    free_blocks: np.ndarray
    transfers_in: np.ndarray
    transfers_out: np.ndarray
    local_prefills: np.ndarray
    last_iteration_s: np.ndarray
    incoming: np.ndarray
    kv_held_for_transfer: np.ndarray

    def outstanding(self) -> np.ndarray:
        """Requests an instance holds: waiting + running (Vidur's least-outstanding)."""
        return self.num_waiting + self.num_running

    def committed(self) -> np.ndarray:
        """Requests an instance holds or has been promised: waiting + running + incoming
        (routed to a decode instance, prefilling elsewhere)."""
        return self.num_waiting + self.num_running + self.incoming


@dataclass(frozen=True, slots=True)
class RoutingPoint:
    """One request to place, and the cluster as the router sees it."""

    request_id: int
    now: float
    prompt_tokens: int
    waited_s: float
    ttft_target_s: float
    tpot_target_s: float
    role: np.ndarray  # per instance: ROLE_CODES
    loads: Loads | None  # None for a router that reads none (Router.reads_loads)
    config: ClusterConfig
    # prefix caching: per instance, the tokens of this request's prompt its cache holds now
    # (at most prompt - 1; live; None with caching off). From opaque block ids: engine
    # state, content-blind.
    cached_tokens: np.ndarray | None = None
    # per instance, the requests routed there since the load report in ``loads`` was taken
    # (a router's own in-flight accounting, kept by the cluster; zeros with live loads)
    routed_since_report: np.ndarray | None = None

    def uncached_tokens(self) -> np.ndarray:
        """Per instance, the prompt tokens it would have to prefill (all without a cache)."""
        if self.cached_tokens is None:
            return np.full(len(self.role), self.prompt_tokens, np.int64)
        return self.prompt_tokens - self.cached_tokens

    @property
    def num_instances(self) -> int:
        return len(self.role)

    def pool(self, role: str) -> np.ndarray:
        """Indices of the instances with ``role`` (``unified``, ``prefill``, ``decode``)."""
        return np.flatnonzero(self.role == ROLE_CODES[role])


@dataclass(frozen=True, slots=True)
class Route:
    """Where a request runs.

    * unified: ``Route.to(i)``: instance i (a unified instance) prefills and decodes it;
    * disaggregated: ``Route.disaggregate(p, d)``: prefill on p, KV sent to d, decoded there;
    * deflected: ``Route.deflect(d, chunk_cap)``: decode instance d runs its prefill itself,
      as chunked prefill beside its decodes, at most ``chunk_cap`` prompt tokens an
      iteration (0: d's token budget), with no transfer;
    * shed: ``Route.shed(reason)``: refused at the edge.
    """

    prefill: int | None = None
    decode: int | None = None
    chunk_cap: int = 0
    shed_reason: str | None = None

    @classmethod
    def to(cls, instance: int) -> Route:
        return cls(decode=int(instance))

    @classmethod
    def disaggregate(cls, prefill: int, decode: int) -> Route:
        return cls(prefill=int(prefill), decode=int(decode))

    @classmethod
    def deflect(cls, decode: int, chunk_cap: int = 0) -> Route:
        return cls(decode=int(decode), chunk_cap=int(chunk_cap))

    @classmethod
    def shed(cls, reason: str = "shed_by_router") -> Route:
        return cls(shed_reason=reason)

    def __post_init__(self) -> None:
        if self.shed_reason is not None and (not isinstance(self.shed_reason, str)
                                             or not self.shed_reason):
            raise InvalidRouteError(f"Route.shed_reason={self.shed_reason!r}: expected a "
                                    "non-empty string (why the request was refused)")


class InvalidRouteError(ValueError):
    """A route the cluster cannot apply (the message says which field and why)."""


def check_route(route: object, role: np.ndarray) -> Route:
    """``route`` if the cluster can apply it, else an :class:`InvalidRouteError`."""
    if not isinstance(route, Route):
        raise InvalidRouteError(f"a router must return a Route, got {type(route).__name__}")
    if route.shed_reason is not None:
        return route
    n = len(role)

    def bad(name: str, value: object, want: str) -> InvalidRouteError:
        return InvalidRouteError(f"Route.{name}={value!r}: expected {want}")

    d, p = route.decode, route.prefill
    if not isinstance(d, int | np.integer) or not 0 <= d < n:
        raise bad("decode", d, f"an instance index in [0, {n})")
    if p is None:
        if role[d] == ROLE_CODES["prefill"]:
            raise bad("decode", d, "a unified or decode instance (it is a prefill instance)")
    else:
        if not isinstance(p, int | np.integer) or not 0 <= p < n or role[p] != 1:
            raise bad("prefill", p, "None or the index of a prefill instance")
        if role[d] != ROLE_CODES["decode"]:
            raise bad("decode", d, "a decode instance for a disaggregated route")
    cap = route.chunk_cap
    if isinstance(cap, bool) or not isinstance(cap, int | np.integer) or cap < 0:
        raise bad("chunk_cap", cap, "an int >= 0 (0: the instance's token budget)")
    return route


@dataclass(frozen=True, slots=True)
class RouterContext:
    """What a router is told before a run: the cluster, the run's seed and SLO targets."""

    config: ClusterConfig
    seed: int = 0
    ttft_target_s: float = 2.0
    tpot_target_s: float = 0.1
    num_requests: int = 0
    extra: dict = field(default_factory=dict)


class Router:
    """Base class of routers: ``reset`` once per run, ``route`` at every arrival.
    ``reads_loads = False`` (round-robin, random): the cluster takes no load reports."""

    name = "router"
    reads_loads = True

    def reset(self, ctx: RouterContext) -> None:
        self.ctx = ctx

    def route(self, rp: RoutingPoint) -> Route:  # pragma: no cover - abstract
        raise NotImplementedError
