"""The cluster's edge: admission control and the clients that send, time out and retry.

Past capacity a server that accepts everything lets its queue grow without bound; clients
time out and retry, the retries add load, and goodput collapses while the GPUs stay busy
(metastable failure, Bronson et al. HotOS'21). Admission control keeps goodput flat by
answering excess work at once. Facts and defaults: ``../shared/reference/
tenants-admission-prefix-caching.md``.

:class:`AdmissionConfig` (the server side):

| field | meaning | default |
|---|---|---|
| ``max_waiting`` | an arrival finding this many waiting is rejected (HTTP 429) | None |
| ``max_in_flight`` | the same for requests in flight (Little's law: :meth:`littles_law`) | None |
| ``scope`` | ``"cluster"``: caps on the whole cluster, before routing; ``"instance"`` | cluster |
| ``queue_ttl_s`` | a request waiting this long for its first scheduling expires (503) | None |

With ``scope="instance"`` the caps count the instance a request is routed to (its prefill
instance when disaggregated). Waiting counts requests that wait for their prefill on
unified and prefill instances (deliveries not yet taken into a queue included); in
flight counts requests placed and not yet ended on the server (per instance: delivered there
and not ended there). The Gateway API Inference Extension answers rejection with 429 and a
queue-TTL expiry with 503 (its default TTL 30 s).

:class:`ClientModel` (each request's client):

| field | meaning | default |
|---|---|---|
| ``timeout_s`` | the client gives up on an attempt this long after sending it | None |
| ``timeout_on`` | what must arrive by then: ``"first_token"`` or ``"completion"`` | first_token |
| ``max_retries`` | attempts after the first (OpenAI's SDK: 2) | 2 |
| ``backoff_base_s``, ``_multiplier``, ``_cap_s`` | retry k waits ``min(cap, b m^k)`` | .2, 2, 30 |
| ``jitter`` | the wait times ``U(1 - jitter, 1 + jitter)`` | 0.25 |
| ``retry_on`` | failures retried: ``"rejected"`` (429), ``"expired"`` (503), ``"timeout"`` | all |
| ``on_abandon`` | ``"abort"`` (as vLLM on a disconnect) or ``"leave"`` (runs on, wasted) | abort |

A retry is a new arrival with the same work (prompt, output, tenant, SLO class), in its own
row of the results (``request``, ``attempt``). Backoff figures: a replay tool for agent
traces (0.2 s base, x2, 30 s cap, +-25% jitter); OpenAI's SDK retries twice by default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real
from typing import Literal

import numpy as np

from cbgym.cluster import state as K
from cbgym.workload.trace import Trace

RETRY_REASONS = ("rejected", "expired", "timeout")
SCOPES = ("cluster", "instance")
TIMEOUT_ON = ("first_token", "completion")
ON_ABANDON = ("abort", "leave")
# the client-side outcome of an attempt (ClusterState.req[OUTCOME]) and of a request
OUTCOME_NAMES = {int(K.O_REJECTED): "shed", int(K.O_EXPIRED): "expired",
                 int(K.O_ABANDONED): "abandoned"}
REJECT_REASON = "rejected_429"


def _check_real(owner: str, name: str, value: object, *, positive: bool,
                optional: bool = True, finite: bool = True) -> None:
    if value is None and optional:
        return
    ok = isinstance(value, Real) and not isinstance(value, bool) and not math.isnan(value)
    if ok and finite:
        ok = math.isfinite(value)  # type: ignore[arg-type]
    if ok:
        ok = value > 0 if positive else value >= 0  # type: ignore[operator]
    if not ok:
        want = "> 0" if positive else ">= 0"
        raise ValueError(f"{owner}.{name}={value!r}: expected a finite number {want}"
                         + (" or None" if optional else ""))


def _check_count(owner: str, name: str, value: object, *, lo: int,
                 optional: bool = True) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < lo:
        raise ValueError(f"{owner}.{name}={value!r}: expected an int >= {lo}"
                         + (" or None" if optional else ""))


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """Caps and a queue TTL at the cluster's edge or its instances (module docstring)."""

    max_waiting: int | None = None
    max_in_flight: int | None = None
    scope: Literal["cluster", "instance"] = "cluster"
    queue_ttl_s: float | None = None

    def __post_init__(self) -> None:
        _check_count("AdmissionConfig", "max_waiting", self.max_waiting, lo=0)
        _check_count("AdmissionConfig", "max_in_flight", self.max_in_flight, lo=1)
        _check_real("AdmissionConfig", "queue_ttl_s", self.queue_ttl_s, positive=True)
        if self.scope not in SCOPES:
            raise ValueError(f"AdmissionConfig.scope={self.scope!r}: expected one of {SCOPES}")

    @staticmethod
    def littles_law(rate_rps: float, latency_s: float, **fields: object) -> AdmissionConfig:
        """An in-flight cap of ``ceil(rate_rps x latency_s)``: by Little's law the most
        requests in flight at ``rate_rps`` that each spend ``latency_s`` in the system
        (e.g. the capacity and an end-to-end latency target)."""
        _check_real("AdmissionConfig.littles_law", "rate_rps", rate_rps, positive=True,
                    optional=False)
        _check_real("AdmissionConfig.littles_law", "latency_s", latency_s, positive=True,
                    optional=False)
        cap = max(1, math.ceil(rate_rps * latency_s))
        return AdmissionConfig(max_in_flight=cap, **fields)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class ClientModel:
    """How each request's client times out and retries (module docstring)."""

    timeout_s: float | None = None
    timeout_on: Literal["first_token", "completion"] = "first_token"
    max_retries: int = 2
    backoff_base_s: float = 0.2
    backoff_multiplier: float = 2.0
    backoff_cap_s: float = 30.0
    jitter: float = 0.25
    retry_on: tuple[str, ...] = RETRY_REASONS
    on_abandon: Literal["abort", "leave"] = "abort"

    def __post_init__(self) -> None:
        own = "ClientModel"
        _check_real(own, "timeout_s", self.timeout_s, positive=True)
        _check_count(own, "max_retries", self.max_retries, lo=0, optional=False)
        _check_real(own, "backoff_base_s", self.backoff_base_s, positive=False, optional=False)
        _check_real(own, "backoff_cap_s", self.backoff_cap_s, positive=False, optional=False)
        _check_real(own, "backoff_multiplier", self.backoff_multiplier, positive=True,
                    optional=False)
        if self.backoff_multiplier < 1:
            raise ValueError(f"ClientModel.backoff_multiplier={self.backoff_multiplier!r}: "
                             "expected >= 1 (a backoff that shrinks is no backoff)")
        _check_real(own, "jitter", self.jitter, positive=False, optional=False)
        if self.jitter >= 1:
            raise ValueError(f"ClientModel.jitter={self.jitter!r}: expected in [0, 1) (the "
                             "wait is scaled by U(1 - jitter, 1 + jitter))")
        if self.timeout_on not in TIMEOUT_ON:
            raise ValueError(f"ClientModel.timeout_on={self.timeout_on!r}: expected one of "
                             f"{TIMEOUT_ON}")
        if self.on_abandon not in ON_ABANDON:
            raise ValueError(f"ClientModel.on_abandon={self.on_abandon!r}: expected one of "
                             f"{ON_ABANDON}")
        if isinstance(self.retry_on, str) or not all(r in RETRY_REASONS for r in self.retry_on):
            raise ValueError(f"ClientModel.retry_on={self.retry_on!r}: expected a tuple of "
                             f"{RETRY_REASONS}")

    def backoff_s(self, attempt: int, u: float = 0.5) -> float:
        """The wait before retrying after attempt ``attempt`` (0: the first) failed, with the
        uniform draw ``u`` in [0, 1) (0.5: no jitter); the kernel computes the same."""
        wait = min(self.backoff_cap_s, self.backoff_base_s * self.backoff_multiplier ** attempt)
        return wait * (1.0 + self.jitter * (2.0 * u - 1.0))


def check_edge(owner: str, admission: object, client: object) -> None:
    """``admission`` and ``client`` are an AdmissionConfig and a ClientModel, or None."""
    for name, value, kind in (("admission", admission, AdmissionConfig),
                              ("client", client, ClientModel)):
        if value is not None and not isinstance(value, kind):
            raise TypeError(f"{owner} {name}=: expected a {kind.__name__} or None, got "
                            f"{type(value).__name__}")


def edge_settings(ci: np.ndarray, cf: np.ndarray, n: int,
                  admission: AdmissionConfig | None, client: ClientModel | None) -> None:
    """Write the edge's static settings into a ClusterState's ``ci`` and ``cf``."""
    ci[K.N_ORIG] = n
    ci[K.EDGE] = admission is not None or client is not None
    ci[K.MAX_WAIT] = ci[K.MAX_FLIGHT] = -1
    cf[K.TTL] = cf[K.CLIENT_TIMEOUT] = np.inf
    if admission is not None:
        if admission.max_waiting is not None:
            ci[K.MAX_WAIT] = admission.max_waiting
        if admission.max_in_flight is not None:
            ci[K.MAX_FLIGHT] = admission.max_in_flight
        ci[K.CAP_SCOPE] = SCOPES.index(admission.scope)
        if admission.queue_ttl_s is not None:
            cf[K.TTL] = admission.queue_ttl_s
    if client is not None:
        ci[K.MAX_RETRIES] = client.max_retries
        ci[K.RETRY_MASK] = sum(1 << k for k, r in enumerate(RETRY_REASONS)
                               if r in client.retry_on)
        ci[K.ABORT] = client.on_abandon == "abort"
        ci[K.ON_FINISH] = client.timeout_on == "completion"
        if client.timeout_s is not None:
            cf[K.CLIENT_TIMEOUT] = client.timeout_s
        cf[K.B_BASE], cf[K.B_MULT] = client.backoff_base_s, client.backoff_multiplier
        cf[K.B_CAP], cf[K.JITTER] = client.backoff_cap_s, client.jitter


def attempt_slots(trace: Trace, client: ClientModel | None) -> Trace:
    """``trace`` with a request slot for every attempt a client may make: slot
    ``k * len(trace) + j`` is attempt k of request j, with its work (prompt, output, tenant,
    SLO class, extra columns); a retry's arrival is set when it is sent (here: the last
    arrival, so that the slots form a valid trace)."""
    k = 1 + (client.max_retries if client is not None else 0)
    if k == 1 or not len(trace):
        return trace
    n = len(trace)
    arrival = np.concatenate([trace.arrival_s, np.full((k - 1) * n, trace.arrival_s[-1])])
    return Trace.from_arrays(
        arrival, np.tile(trace.prompt_tokens, k), np.tile(trace.output_tokens, k),
        np.tile(trace.tenant, k), np.tile(trace.slo_class, k), name=trace.name,
        extra={key: np.tile(v, k) for key, v in trace.extra.items()}, rebase=False)


__all__ = ["AdmissionConfig", "ClientModel", "attempt_slots", "check_edge", "edge_settings"]
