"""A cluster run's results: one row per request across instances, one time series each.

Per-request columns are those of a single-engine run (:func:`cbgym.metrics.requests_frame`,
times from the request's trace arrival) plus where it ran and how its TTFT was spent:

| column | meaning |
|---|---|
| ``prefill_instance`` / ``decode_instance`` | instance indices (-1: none) |
| ``deflected`` | its prefill ran on a decode instance |
| ``prefill_done_s`` | a prefill instance computed its last prompt chunk |
| ``transfer_start_s`` / ``transfer_end_s`` / ``transfer_bytes`` | its KV transfer |
| ``ttft_queue_s`` | arrival to first scheduled (on the instance that computes its prompt) |
| ``ttft_prefill_s`` | first scheduled to its prompt computed (chunks, and waits between them) |
| ``ttft_decode_wait_s`` | prompt computed on P to its (first) transfer start, if later |
| ``ttft_transfer_s`` | the transfer after both (pipelined: the part after the prefill) |
| ``ttft_first_step_s`` | transfer landed to first token (D's queue and its 1-token step) |

For a request served by one instance the last three are 0 and ``ttft_prefill_s`` ends at its
first token. The parts add up to ``ttft_s``.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from cbgym.cluster import state as K
from cbgym.cluster.edge_results import attempts_and_clients, edge_totals
from cbgym.engine import itl
from cbgym.engine import layout as L
from cbgym.metrics import SimulationResult, requests_frame, timeseries_frame

if TYPE_CHECKING:
    from cbgym.cluster.cluster import Cluster


@dataclass
class ClusterResult(SimulationResult):
    """A :class:`~cbgym.metrics.SimulationResult` whose ``timeseries`` has an ``instance``
    column; ``instances`` holds each instance's time series apart."""

    num_instances: int = 0
    clients: pd.DataFrame | None = None

    def summary(self, warmup: float = 0.0) -> dict[str, float]:
        """:meth:`SimulationResult.summary`; with an edge (admission control or a client
        model) ``requests`` has a row per attempt, so goodput and SLO attainment count the
        offered requests as their clients see them (``clients``), and the edge's totals
        (:func:`edge_totals`) are added."""
        out = super().summary(warmup)
        if self.clients is not None:
            totals = edge_totals(self)
            out.update({k: float(v) for k, v in totals.items()})
            offered, span = totals["offered"], self.sim_seconds
            out["slo_attainment"] = totals["good"] / offered if offered else float("nan")
            out["goodput_rps"] = totals["good"] / span if span > 0 else 0.0
        return out

    @property
    def instances(self) -> list[pd.DataFrame]:
        """Each instance's time series apart (its rows of ``timeseries``, renumbered)."""
        ts = self.timeseries
        parts = [ts[ts["instance"].to_numpy() == i] for i in range(self.num_instances)]
        out = []
        for part in parts:
            part = part.reset_index(drop=True)
            part.index.name = "iteration"
            out.append(part)
        return out


def merged_table(c: Cluster) -> SimpleNamespace:
    """The request table of the whole cluster: each column from the instance that did it."""
    tr = c.trace
    n = len(tr)
    arrival = c.C.times[K.SENT_S] if c.edge else tr.arrival_s
    idx = np.arange(n)
    S = c.S  # every instance's columns, instance by row (views, no copies)
    stack = {"status": S.req[:, L.STATUS], "reason_code": S.req[:, L.REASON],
             "first_scheduled_s": S.times[:, L.FIRST_SCHEDULED],
             "first_token_s": S.times[:, L.FIRST_TOKEN], "finish_s": S.times[:, L.FINISH],
             "generated": S.req[:, L.GENERATED], "preemptions": S.req[:, L.PREEMPTIONS],
             "itl_max_s": S.times[:, L.ITL_MAX], "itl_p99_s": S.times[:, L.ITL_P99]}
    first = np.where(c.prefill_instance >= 0, c.prefill_instance, c.decode_instance)
    # the instance that ends it: D once delivered there, else where it was (P, or unified)
    on_d = (c.decode_instance >= 0) & (stack["status"][np.maximum(c.decode_instance, 0), idx]
                                       != L.PENDING)
    last = np.where(on_d, c.decode_instance, first)
    routed = first >= 0
    f, la = np.maximum(first, 0), np.maximum(last, 0)
    status = np.where(routed, stack["status"][la, idx], L.SHED)
    # done on P, not yet on D (mid-run): still in progress, not finished
    status = np.where((c.prefill_instance >= 0) & ~on_d & (status == L.FINISHED), L.RUNNING,
                      status)
    reasons: dict[int, str] = {}
    codes = np.where(routed, stack["reason_code"][la, idx], 0)
    names = c.engines[0].req.reasons  # (one numbering for the whole cluster)
    for rid, code in zip(np.flatnonzero(codes).tolist(), codes[codes != 0].tolist(),
                         strict=True):
        reasons[rid] = names[code]
    reasons.update(c.router_shed)
    nan = np.full(n, np.nan)
    return SimpleNamespace(
        n=n, arrival_s=arrival, prompt=tr.prompt_tokens, output=tr.output_tokens,
        tenant=tr.tenant, slo_class=tr.slo_class, status=status, reason=reasons,
        first_scheduled_s=np.where(routed, stack["first_scheduled_s"][f, idx], nan),
        first_token_s=np.where(routed, stack["first_token_s"][la, idx], nan),
        finish_s=np.where(routed, stack["finish_s"][la, idx], arrival),
        generated=np.where(routed, stack["generated"][la, idx], 0),
        itl_max_s=np.where(routed, stack["itl_max_s"][la, idx], nan),
        itl_p99_s=np.where(routed, stack["itl_p99_s"][la, idx], nan),
        preemptions=np.where(routed, stack["preemptions"].sum(axis=0), 0),
        cached_tokens=np.where(routed, S.req[f, L.CACHED, idx], 0))


def cluster_result(c: Cluster, meta: dict) -> ClusterResult:
    """Turn a drained cluster into a :class:`ClusterResult`."""
    table = merged_table(c)
    disagg = c.prefill_instance >= 0
    sched, first = table.first_scheduled_s, table.first_token_s
    done = np.where(disagg, c.prefill_done_s, first)
    zero = np.zeros(table.n)
    # (pipelined: transfers start before the prefill ends; only what follows it is exposed)
    start, p_done = c.transfer_start_s, c.prefill_done_s
    parts = {"ttft_queue_s": sched - table.arrival_s, "ttft_prefill_s": done - sched,
             "ttft_decode_wait_s": np.where(disagg, np.maximum(start - p_done, 0.0), zero),
             "ttft_transfer_s": np.where(disagg, c.transfer_end_s - np.maximum(start, p_done),
                                         zero),
             "ttft_first_step_s": np.where(disagg, first - c.transfer_end_s, zero)}
    shed = table.status != L.FINISHED  # (requests_frame's "shed")
    for col in parts.values():
        col[shed] = np.nan
    req = requests_frame(table, c.slo, {
        "prefill_instance": c.prefill_instance, "decode_instance": c.decode_instance,
        "deflected": c.deflected, "prefill_done_s": c.prefill_done_s,
        "transfer_start_s": c.transfer_start_s, "transfer_end_s": c.transfer_end_s,
        "transfer_bytes": c.transfer_bytes, **parts})
    # one frame for all instances (building one per instance and concatenating costs as
    # much as the run on a short trace)
    rows = [eng.recorder.timeseries() for eng in c.engines]
    which = np.repeat(np.arange(len(rows)), [len(r) for r in rows])
    blocks = np.array([eng.kv.num_blocks for eng in c.engines])[which]
    timeseries = timeseries_frame(np.concatenate(rows), blocks)
    timeseries.insert(0, "instance", which)
    timeseries.index.name = "row"
    clients = None
    if c.edge:
        req, clients = attempts_and_clients(c, req)
    return ClusterResult(requests=req, timeseries=timeseries, iterations=None,
                         preemption_log=None, slo=c.slo, meta=meta,
                         num_instances=len(c.engines), clients=clients,
                         itl_histogram=itl.pooled(c.S.sf[:, L.ITL:]) if c.S.si[:, L.P99_ON].all()
                         else None)
