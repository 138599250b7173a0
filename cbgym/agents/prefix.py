"""Cache-aware content-blind policies: ranking by the prefill left after prefix-cache hits.

With prefix caching a request's prefill work is its *uncached* tokens (prompt + generated -
the cached prefix the engine finds for it now), not its context length: the CB-SJF-Work
study's open problem. Which blocks are resident is engine state (opaque block ids, never
text), so these keys are as content-blind as the study's own. The cache changes with every
iteration, so they are asked every iteration. Without prefix caching ``cached_tokens`` is
None and each reduces to its cache-blind twin (SJF-Ctx, CB-SJF-Work, FCFS).

- ``shortest-uncached-first``: fewest uncached prefill tokens first (SGLang's
  shortest-prefill-first without its output term).
- ``hrrn-uncached``: highest response ratio ``1 + waited / service`` first, the service priced
  as this engine's prefill of the uncached tokens (``c_f + c_p x_uncached``).
- ``cb-sjf-work-uncached``: CB-SJF-Work's ``c_f + c_p x + c_d yhat`` with x uncached.
- ``k-lpm:K``: longest prefix match with a starvation guard (the locality-aware fairness
  paper's k-LPM): the oldest request, then the K - 1 with the most cached tokens, repeated
  over the queue; K = 1 is FCFS.
- ``oracle-work-uncached``: the privileged bound, ``c_f + c_p x_uncached + c_d y`` with the
  true output y.
"""

from __future__ import annotations

import numpy as np

from cbgym.agents.base import QueueView
from cbgym.agents.cb_sjf_work import CBSJFWork
from cbgym.agents.oracles import _true_output
from cbgym.agents.params import parse_float
from cbgym.agents.work import WorkKeyPolicy, estimated_output


class ShortestUncachedFirst(WorkKeyPolicy):
    """Admit the request with the fewest uncached prefill tokens first (key: tokens)."""

    name = "shortest-uncached-first"
    consult = "every_iteration"

    def keys(self, view: QueueView) -> np.ndarray:
        return view.uncached_tokens().astype(np.float64)

    def key_unit_s(self) -> float:
        return self.coef.prefill_token_s


class HRRNUncached(WorkKeyPolicy):
    """Highest response ratio next, ``1 + waited_s / (c_f + c_p x_uncached)``: short
    uncached prefills first, and every request's ratio grows while it waits (no starvation).
    Key: minus the ratio."""

    name = "hrrn-uncached"
    consult = "every_iteration"

    def keys(self, view: QueueView) -> np.ndarray:
        service = self.coef.work(view.uncached_tokens(), 0.0)
        return -(1.0 + view.waited_s / np.maximum(service, 1e-9))


class CBSJFWorkUncached(CBSJFWork):
    """CB-SJF-Work with the prompt term priced on the uncached prefill only."""

    name = "cb-sjf-work-uncached"
    consult = "every_iteration"

    def __init__(self, estimator: str = "bucket") -> None:
        super().__init__(estimator)
        self.label = self.name if estimator == "bucket" else f"{self.name}:{estimator}"

    def keys(self, view: QueueView) -> np.ndarray:
        yhat = estimated_output(view, self.estimator, self.prior_output_tokens)
        return self.coef.work(view.uncached_tokens(), yhat)


class OracleWorkUncached(WorkKeyPolicy):
    """Least true work first, the prefill priced on its uncached tokens (privileged)."""

    name = "oracle-work-uncached"
    privileged = True
    consult = "every_iteration"

    def keys(self, view: QueueView) -> np.ndarray:
        return self.coef.work(view.uncached_tokens(), _true_output(view))


class KLPM(WorkKeyPolicy):
    """k-LPM: the oldest waiting request, then the ``k - 1`` with the longest cached
    prefix (ties: older first), and again over the rest. Keys are the resulting ranks."""

    name = "k-lpm"
    consult = "every_iteration"

    def __init__(self, k: str | float = 4) -> None:
        value = parse_float(k, self.name, "k", 1)
        if value != int(value):
            raise ValueError(f"{self.name}: k={k!r}: expected a whole number >= 1")
        self.k = int(value)
        self.label = f"{self.name}:{self.k}"

    def keys(self, view: QueueView) -> np.ndarray:
        n = len(view.queue_pos)
        cached = (np.zeros(n) if view.cached_tokens is None else
                  view.cached_tokens.astype(np.float64))
        oldest = np.argsort(-view.waited_s, kind="stable")  # longest waiting first
        by_match = np.lexsort((-view.waited_s, -cached))  # most cached, then oldest
        rank = np.full(n, -1, np.int64)
        taken = np.zeros(n, bool)
        r = i_old = i_lpm = 0
        while r < n:
            while taken[oldest[i_old]]:
                i_old += 1
            pick = [oldest[i_old]]
            taken[pick[0]] = True
            while len(pick) < self.k and r + len(pick) < n:
                while taken[by_match[i_lpm]]:
                    i_lpm += 1
                taken[by_match[i_lpm]] = True
                pick.append(by_match[i_lpm])
            rank[pick] = np.arange(r, r + len(pick))
            r += len(pick)
        return rank.astype(np.float64)


PREFIX_POLICIES = (ShortestUncachedFirst, HRRNUncached, CBSJFWorkUncached, OracleWorkUncached,
                   KLPM)
