"""Many customers on one trace: tenants by share, traces mixed as tenants, SLO tiers.

A tenant is an integer id in ``Trace.tenant`` (its requests' SLO class in ``Trace.slo_class``);
:class:`Tenant` names it and gives its share of requests, its fairness weight (VTC, DRR, WFQ)
and its SLO tier. :func:`assign_tenants` splits an existing trace among tenants by share;
:func:`mix_tenants` merges whole traces, one tenant each (e.g. conv as an interactive tenant
beside code as a batch tenant), each at its own rate. :func:`tier_slos` turns the tiers into
the ``{slo_class: SLO}`` mapping every metric and env takes.

| tier | TTFT | TPOT | source |
|---|---|---|---|
| ``interactive`` | 450 ms | 40 ms | MLPerf Inference, Llama-2-70B interactive |
| ``standard`` | 2 s | 200 ms | MLPerf Inference, Llama-2-70B server |
| ``batch`` | 30 s | 1 s | loose targets: a batch tenant is judged on getting done |
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from cbgym.metrics import SLO
from cbgym.workload.trace import Trace

TIERS: dict[str, tuple[int, SLO]] = {
    "interactive": (0, SLO(0.45, 0.04)),
    "standard": (1, SLO(2.0, 0.2)),
    "batch": (2, SLO(30.0, 1.0)),
}


@dataclass(frozen=True)
class Tenant:
    """One customer: ``share`` of the requests (:func:`assign_tenants`) or of the mixed
    rate (:func:`mix_tenants`), fairness ``weight``, SLO ``tier`` (its requests' SLO class:
    interactive 0, standard 1, batch 2)."""

    name: str
    share: float = 1.0
    weight: float = 1.0
    tier: str = "standard"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Tenant name={self.name!r}: expected a non-empty string")
        for field_name in ("share", "weight"):
            v = getattr(self, field_name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < np.inf:
                raise ValueError(f"Tenant {self.name!r}: {field_name}={v!r}, expected a "
                                 "number > 0")
        if self.tier not in TIERS:
            raise ValueError(f"Tenant {self.name!r}: tier={self.tier!r}, expected one of "
                             f"{sorted(TIERS)}")

    @property
    def slo_class(self) -> int:
        return TIERS[self.tier][0]


def _check(tenants: Sequence[Tenant]) -> list[Tenant]:
    tenants = list(tenants)
    if not tenants or not all(isinstance(t, Tenant) for t in tenants):
        raise ValueError("tenants: expected a non-empty list of Tenant")
    names = [t.name for t in tenants]
    if len(set(names)) != len(names):
        raise ValueError(f"tenants: names must be unique, got {names}")
    return tenants


def assign_tenants(trace: Trace, tenants: Sequence[Tenant], seed: int = 0) -> Trace:
    """``trace`` with each request given to a tenant at random by share (tenant i's id is
    i; its SLO class is its tier's). Arrivals and lengths are unchanged."""
    tenants = _check(tenants)
    share = np.array([t.share for t in tenants], np.float64)
    rng = np.random.default_rng(seed)
    who = rng.choice(len(tenants), size=len(trace), p=share / share.sum())
    cls = np.array([t.slo_class for t in tenants], np.int16)[who]
    return Trace.from_arrays(trace.arrival_s, trace.prompt_tokens, trace.output_tokens,
                             tenant=who.astype(np.int32), slo_class=cls,
                             name=f"{trace.name}+tenants", extra=dict(trace.extra),
                             rebase=False)


def mix_tenants(parts: Sequence[tuple[Tenant, Trace]], rate_rps: float | None = None,
                duration_s: float | None = None) -> Trace:
    """Merge traces, one per tenant, by arrival time (tenant i's id is i).

    ``rate_rps``: the mixed rate; each tenant's trace is rescaled (its arrival pattern kept)
    to ``share / sum(shares)`` of it. None keeps every trace's own clock. ``duration_s``:
    keep the first seconds of each (rescaled) trace. Extra columns are dropped (they need
    not exist in every part)."""
    tenants = _check([t for t, _ in parts])
    traces = [tr for _, tr in parts]
    if not all(isinstance(tr, Trace) and len(tr) >= 2 for tr in traces):
        raise ValueError("mix_tenants: each part needs a Trace of at least two requests")
    if rate_rps is not None and not 0 < rate_rps < np.inf:
        raise ValueError(f"mix_tenants: rate_rps={rate_rps!r}, expected requests/s > 0")
    if duration_s is not None and not 0 < duration_s < np.inf:
        raise ValueError(f"mix_tenants: duration_s={duration_s!r}, expected seconds > 0")
    total = sum(t.share for t in tenants)
    cols: list[list[np.ndarray]] = [[], [], [], [], []]
    for i, (t, tr) in enumerate(zip(tenants, traces, strict=True)):
        arrival = tr.arrival_s - tr.arrival_s[0]
        if rate_rps is not None:
            if tr.duration_s <= 0:
                raise ValueError(f"mix_tenants: tenant {t.name!r}'s trace has no duration")
            arrival = arrival * (len(tr) / (rate_rps * t.share / total)) / tr.duration_s
        keep = slice(None) if duration_s is None else arrival < duration_s
        for col, values in zip(cols, (arrival, tr.prompt_tokens, tr.output_tokens,
                                      np.full(len(tr), i, np.int32),
                                      np.full(len(tr), t.slo_class, np.int16)), strict=True):
            col.append(values[keep])
    arrival = np.concatenate(cols[0])
    order = np.argsort(arrival, kind="stable")  # (ties: tenant order, then trace order)
    merged = [np.concatenate(c)[order] for c in cols]
    name = "+".join(f"{t.name}:{tr.name}" for t, tr in zip(tenants, traces, strict=True))
    return Trace.from_arrays(*merged[:3], tenant=merged[3], slo_class=merged[4], name=name,
                             rebase=False)


def tier_slos(tiers: Mapping[int, SLO] | None = None) -> dict[int, SLO]:
    """The ``{slo_class: SLO}`` mapping of the tiers (``tiers`` replaces some)."""
    out = {cls: slo for cls, slo in TIERS.values()}
    for cls, slo in (tiers or {}).items():
        if cls not in out or not isinstance(slo, SLO):
            raise ValueError(f"tier_slos: class {cls!r} -> {slo!r}; expected a known class "
                             f"({sorted(out)}) and an SLO")
        out[cls] = slo
    return out


def conv_code_tenants(conv: Trace, code: Trace, share: float = 0.7) -> Trace:
    """The noisy-neighbour mix: ``conv`` as an interactive tenant (tenant 0) keeping its own
    clock, ``code`` as a batch tenant (tenant 1) at ``1 - share`` of the requests (its own
    arrival pattern, rescaled), cut where the shorter of the two ends: the derived trace
    ``tenants-conv-code-2023`` (:func:`cbgym.load_trace`) of azure-conv-2023 and
    azure-code-2023."""
    if not 0 < share < 1:
        raise ValueError(f"conv_code_tenants: share={share!r}, expected in (0, 1)")
    rate = conv.rate / share
    code_span = len(code) / (rate * (1 - share))  # the code tenant's duration at its rate
    chat = Tenant("interactive", share, tier="interactive")
    bulk = Tenant("batch", 1 - share, tier="batch")
    return mix_tenants([(chat, conv), (bulk, code)], rate_rps=rate,
                       duration_s=min(conv.duration_s, code_span))
