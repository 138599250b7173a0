"""The tenants' fairness counters, an optional part of the scheduling env's observation.

With ``tenant_features=T`` the observation gains ``waiting_tenants`` (T x 3, tenant-major:
``reshape(T, 3)``; the key sorts after the others, so the flat layout only grows at its end),
one row per tenant id 0 .. T-1 (requests of other tenants, negative ids included, are not
counted):

| Index | Feature | Meaning |
|---|---|---|
| 0 | ``service_share`` | its share of the service given so far (VTC's counters, below) |
| 1 | ``waiting_share`` | its share of the waiting queue |
| 2 | ``deficit`` | ``(max - own) / max`` of the counters of tenants with requests waiting |

A tenant's counter is VTC's: ``w_in`` x the prompt tokens of its admitted requests +
``w_out`` x its generated tokens (weights 1 and 2). The deficit is 0 for a tenant with
nothing waiting, or the most served.

All in [0, 1]; content-blind (token counts of admitted requests, never a true output length).
These are what VTC, DRR and WFQ rank on: an agent sees which tenant a fair scheduler would
serve next.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from cbgym.engine import layout as L
from cbgym.engine.layout import State
from cbgym.fairness import W_IN, W_OUT

KEY = "waiting_tenants"
FEATURES = ("service_share", "waiting_share", "deficit")
MAX_TENANTS = 64


def check_tenant_features(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or not (
            0 <= value <= MAX_TENANTS):
        raise ValueError(f"tenant_features={value!r}: expected an int in [0, {MAX_TENANTS}] "
                         "(the number of tenant ids observed; 0: none)")
    return int(value)


def tenant_space(T: int) -> spaces.Box:
    return spaces.Box(0.0, 1.0, (T * len(FEATURES),), np.float32)


def tenant_obs(s: State, tenant: np.ndarray, T: int) -> np.ndarray:
    """The ``waiting_tenants`` vector of an engine state (``tenant``: each request's id)."""
    req, times = s.req, s.times
    started = ~np.isnan(times[L.FIRST_SCHEDULED])
    service = W_IN * req[L.PROMPT] * started + W_OUT * req[L.GENERATED]
    keep = (tenant >= 0) & (tenant < T)
    counter = np.bincount(tenant[keep], weights=service[keep], minlength=T)[:T]
    waiting_ids = s.ids[L.WAIT_Q, : s.si[L.N_WAIT]]
    who = tenant[waiting_ids]
    backlog = np.bincount(who[(who >= 0) & (who < T)], minlength=T)[:T].astype(np.float64)
    out = np.zeros((T, len(FEATURES)), np.float32)
    total = counter.sum()
    if total > 0:
        out[:, 0] = counter / total
    if len(waiting_ids):
        out[:, 1] = backlog / len(waiting_ids)
    waiting = backlog > 0
    if waiting.any():
        top = counter[waiting].max()
        if top > 0:
            out[:, 2] = np.where(waiting, np.clip((top - counter) / top, 0.0, 1.0), 0.0)
    return out.reshape(-1)


__all__ = ["FEATURES", "KEY", "check_tenant_features", "tenant_obs", "tenant_space"]
