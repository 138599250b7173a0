"""Per-tenant results: goodput, SLO attainment, tail TTFT, service received, fairness.

Service is VTC's cost-weighted tokens (Sheng et al., OSDI'24): ``w_in`` per prompt token a
tenant had admitted plus ``w_out`` per output token it received (defaults 1 and 2, the
paper's). Over time, a request's prompt counts when it was first scheduled and its output
tokens evenly between its first token and its finish (the engine keeps no per-token times;
the policy-side counters of :class:`cbgym.agents.VTC` are exact).

| function | returns |
|---|---|
| :func:`tenant_table` | per tenant: requests, finished, good, shed, TTFT missed, late after |
|  | the first token, goodput, attainment, p99 TTFT, service |
| :func:`service_over_time` | service per tenant in each window (rows: window start) |
| :func:`max_service_difference` | the largest gap between two tenants' cumulative service |
| :func:`jain_index` | Jain's fairness index of per-tenant values, in (0, 1] |
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from cbgym.metrics import SimulationResult, SLOSpec, meets_slo, slo_arrays

W_IN, W_OUT = 1.0, 2.0


def _service(req: pd.DataFrame, w_in: float, w_out: float) -> np.ndarray:
    admitted = req["first_scheduled_s"].notna().to_numpy()
    out = np.where(req["status"].to_numpy() == "finished", req["output_tokens"].to_numpy(), 0)
    return w_in * req["prompt_tokens"].to_numpy() * admitted + w_out * out


def tenant_table(result: SimulationResult, slo: SLOSpec | None = None, w_in: float = W_IN,
                 w_out: float = W_OUT) -> pd.DataFrame:
    """Per-tenant figures of a run (``slo``: the run's own by default). Service counts the
    output of finished requests. Where the requests that were not good went: ``shed``,
    ``ttft_missed`` (finished past the TTFT target) and ``late_after_first_token``
    (finished within it, but past the TPOT target or another of the SLO's targets): with
    ``good`` they add up to ``requests`` (an engine's requests finish or are shed; a cluster
    run with clients also records abandoned attempts, which none of them counts)."""
    req = result.requests
    slo = slo if slo is not None else result.slo
    good = meets_slo(req, slo)
    finished = (req["status"] == "finished").to_numpy()
    ttft_target, _ = slo_arrays(slo, req["slo_class"].to_numpy())
    with np.errstate(invalid="ignore"):
        ttft_met = finished & (req["ttft_s"].to_numpy() <= ttft_target)
    span = float(np.nanmax(req["finish_s"].to_numpy()) - req["arrival_s"].min()) if len(
        req) else 0.0
    frame = pd.DataFrame({"tenant": req["tenant"].to_numpy(), "good": good,
                          "finished": finished, "shed": (req["status"] == "shed").to_numpy(),
                          "ttft_missed": finished & ~ttft_met,
                          "late_after_first_token": ttft_met & ~good,
                          "ttft_s": req["ttft_s"].to_numpy(),
                          "service": _service(req, w_in, w_out)})
    g = frame.groupby("tenant")
    table = pd.DataFrame({
        "requests": g.size(), "finished": g["finished"].sum(), "good": g["good"].sum(),
        "shed": g["shed"].sum(), "ttft_missed": g["ttft_missed"].sum(),
        "late_after_first_token": g["late_after_first_token"].sum(),
        "ttft_p99_s": g["ttft_s"].quantile(0.99), "service": g["service"].sum()})
    table["slo_attainment"] = table["good"] / table["requests"]
    table["goodput_rps"] = table["good"] / span if span > 0 else np.nan
    return table


def service_over_time(result: SimulationResult, window_s: float, w_in: float = W_IN,
                      w_out: float = W_OUT) -> pd.DataFrame:
    """Service each tenant received in each ``window_s`` window (module docstring)."""
    if not window_s > 0:
        raise ValueError(f"service_over_time: window_s={window_s!r}, expected seconds > 0")
    req = result.requests
    end = float(np.nanmax(req["finish_s"].to_numpy())) if len(req) else 0.0
    edges = np.arange(0.0, end + window_s, window_s)
    tenants = np.unique(req["tenant"].to_numpy())
    out = np.zeros((len(edges) - 1, len(tenants)))
    col = {t: k for k, t in enumerate(tenants)}
    for row in req.itertuples(index=False):
        k = col[row.tenant]
        if not np.isnan(row.first_scheduled_s):
            i = min(np.searchsorted(edges, row.first_scheduled_s, "right") - 1, len(out) - 1)
            out[i, k] += w_in * row.prompt_tokens
        if row.status == "finished":
            a, b = row.first_token_s, row.finish_s
            if b <= a:
                i = min(np.searchsorted(edges, b, "right") - 1, len(out) - 1)
                out[i, k] += w_out * row.output_tokens
                continue
            # the overlap of [a, b] with each window, as a share of the output
            lo, hi = np.maximum(edges[:-1], a), np.minimum(edges[1:], b)
            out[:, k] += w_out * row.output_tokens * np.clip(hi - lo, 0, None) / (b - a)
    frame = pd.DataFrame(out, index=pd.Index(edges[:-1], name="window_start_s"),
                         columns=pd.Index(tenants, name="tenant"))
    return frame


def max_service_difference(service: pd.DataFrame, weights: dict[int, float] | None = None
                           ) -> float:
    """The largest difference between two tenants' cumulative (weighted) service at any
    window's end (``service``: :func:`service_over_time`)."""
    cum = service.cumsum()
    if weights:
        cum = cum / np.array([weights.get(int(t), 1.0) for t in cum.columns])
    return float((cum.max(axis=1) - cum.min(axis=1)).max()) if len(cum) else 0.0


def jain_index(values: np.ndarray | pd.Series) -> float:
    """(sum x)^2 / (n sum x^2): 1 when every tenant gets the same, 1/n when one gets all."""
    x = np.asarray(values, np.float64)
    if x.size == 0 or np.any(x < 0) or not np.all(np.isfinite(x)):
        raise ValueError("jain_index: expected finite values >= 0")
    sq = float((x * x).sum())
    return float(x.sum() ** 2 / (x.size * sq)) if sq > 0 else 1.0
