"""What the edge did, as frames: one row per attempt, one per offered request, and totals.

With admission control or a client model, ``ClusterResult.requests`` has one row per attempt
a client sent (index: its slot, ``k * offered + j`` for attempt k of request j), with

| column | meaning |
|---|---|
| ``request`` / ``attempt`` | which offered request, which attempt (0: the first) |
| ``status`` | the server's ``finished`` / ``shed``, or ``abandoned`` (its client gave up) |
| ``outcome`` | ``good``, ``late`` (SLO missed), ``shed`` (a 429 or the server's), ``expired`` |
| | (503), ``abandoned`` |
| ``client_end_s`` | when its client had its answer (the last token, a 429 or 503, or giving up) |

and ``ClusterResult.clients`` one row per offered request, its story across attempts: when
it was first sent (``arrival_s``), ``attempts``, the ``outcome`` of its last attempt,
``final_attempt`` (that row of ``requests``), ``ttft_s`` and ``e2e_s`` from its first send.
A request is ``good`` as its client sees it: its last attempt finished within the SLO with
its TTFT counted from the first send (a request served on its third try after 5 s of
429s is late, although that attempt alone met its target).
Conservation: offered = good + late + shed + expired + abandoned (:func:`edge_totals`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from cbgym.cluster import state as K
from cbgym.cluster.edge import OUTCOME_NAMES, REJECT_REASON
from cbgym.metrics import meets_slo

if TYPE_CHECKING:
    from cbgym.cluster.cluster import Cluster
    from cbgym.cluster.results import ClusterResult

OUTCOMES = ("good", "late", "shed", "expired", "abandoned")


def attempts_and_clients(c: Cluster, req: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The attempt rows (``req``: every slot's row, edited in place) and the client rows."""
    C, n0 = c.C, c.num_offered
    slots = np.arange(len(req))
    code = C.req[K.OUTCOME]
    rejected = code == K.O_REJECTED
    reason = req["reason"].to_numpy(dtype=object)
    reason[rejected & (reason == "")] = REJECT_REASON
    status = req["status"].to_numpy(dtype=object)
    status[code == K.O_ABANDONED] = "abandoned"
    req["status"], req["reason"] = status, reason
    good = meets_slo(req, c.slo)
    outcome = np.where(status == "finished", np.where(good, "good", "late"),
                       np.where(status == "shed", "shed", "")).astype(object)
    for k, name in OUTCOME_NAMES.items():
        outcome[code == k] = name
    req.insert(0, "request", slots % max(n0, 1))
    req.insert(1, "attempt", C.req[K.ATTEMPT])
    req["outcome"] = outcome
    req["client_end_s"] = np.where(code == K.O_NONE, req["finish_s"].to_numpy(),
                                   C.times[K.CLIENT_END])
    sent = ~np.isnan(C.times[K.SENT_S])
    attempts = np.bincount(slots[sent] % max(n0, 1), minlength=n0)[:n0]
    final = (attempts - 1) * n0 + np.arange(n0)
    first = req["arrival_s"].to_numpy()[:n0]
    last = req.iloc[final].copy()
    done = last["status"].to_numpy() == "finished"
    # the client's view: its TTFT runs from its first send, across retries
    last["ttft_s"] = np.where(done, last["first_token_s"].to_numpy() - first, np.nan)
    last["e2e_s"] = np.where(done, last["finish_s"].to_numpy() - first, np.nan)
    served = last["outcome"].isin(["good", "late"]).to_numpy()
    final_outcome = np.where(served, np.where(meets_slo(last, c.slo), "good", "late"),
                             last["outcome"].to_numpy()).astype(object)
    clients = pd.DataFrame({
        "arrival_s": first, "tenant": last["tenant"].to_numpy(),
        "slo_class": last["slo_class"].to_numpy(), "attempts": attempts,
        "outcome": final_outcome, "final_attempt": final, "ttft_s": last["ttft_s"].to_numpy(),
        "e2e_s": last["client_end_s"].to_numpy() - first})
    clients.index.name = "request_id"
    return req[sent], clients


def edge_totals(result: ClusterResult) -> dict[str, int]:
    """Totals of a run with an edge: ``offered`` requests, ``attempts`` sent, ``retried``
    (attempts after the first), ``accepted`` (attempts placed on an instance), the final
    outcome of each offered request (``good``, ``late``, ``shed``, ``expired``,
    ``abandoned``: they add up to ``offered``), and attempts answered 429 / 503 / given up
    (``shed_attempts``, ``expired_attempts``, ``abandoned_attempts``)."""
    if result.clients is None:
        raise ValueError("edge_totals: this run has no admission control nor client model")
    req, cl = result.requests, result.clients
    out = {"offered": len(cl), "attempts": len(req), "retried": len(req) - len(cl),
           "accepted": int(((req["prefill_instance"] >= 0)
                            | (req["decode_instance"] >= 0)).sum())}
    final = cl["outcome"].value_counts()
    for name in OUTCOMES:
        out[name] = int(final.get(name, 0))
    per = req["outcome"].value_counts()
    for name, key in (("shed", "shed_attempts"), ("expired", "expired_attempts"),
                      ("abandoned", "abandoned_attempts")):
        out[key] = int(per.get(name, 0))
    return out


__all__ = ["OUTCOMES", "attempts_and_clients", "edge_totals"]
