"""Placement rules of disaggregated serving: disaggregate, or deflect the prefill to the
decode instance (``../shared/reference/cluster-disaggregation.md``, read in the sources).

Every rule picks the decode instance with the fewest requests held and, when it
disaggregates, the prefill instance with the fewest prompt tokens still to compute (ties to
the lowest index).

* ``always-disaggregate``: every prefill on a prefill instance (vLLM's disaggregated
  prefill with a load-balancing proxy).
* ``never-disaggregate``: every prefill deflected (chunked prefill on the decode instance).
* ``dynamo``: NVIDIA Dynamo's conditional disaggregation: remote prefill iff the uncached
  prompt exceeds ``max_local_prefill_length`` (1000) and the prefill queue holds fewer
  than ``max_prefill_queue_size`` (2) requests; the queue is the requests waiting on the
  prefill instances.
* ``llm-d``: llm-d's decode-first rule: disaggregate iff the uncached prompt exceeds the
  threshold (16 in its shipped config); no load term.

Without prefix caching the uncached prompt is the whole prompt.
"""

from __future__ import annotations

import numpy as np

from cbgym.agents.params import parse_float
from cbgym.cluster.routing import Loads, Route, Router, RoutingPoint


def least_held(decode: np.ndarray, loads: Loads) -> int:
    held = loads.committed()
    return int(decode[np.argmin(held[decode])])


def least_prefill(prefill: np.ndarray, loads: Loads) -> int:
    tokens = loads.waiting_prefill_tokens + loads.running_prefill_tokens
    return int(prefill[np.argmin(tokens[prefill])])


class DisaggregationRule(Router):
    """Decode instance first, then whether to disaggregate (:meth:`remote`)."""

    def remote(self, rp: RoutingPoint) -> bool:
        raise NotImplementedError

    def route(self, rp: RoutingPoint) -> Route:
        assert rp.loads is not None
        d = least_held(rp.pool("decode"), rp.loads)
        if len(rp.pool("prefill")) and self.remote(rp):
            return Route.disaggregate(least_prefill(rp.pool("prefill"), rp.loads), d)
        return Route.deflect(d)


class AlwaysDisaggregate(DisaggregationRule):
    name = "always-disaggregate"

    def remote(self, rp: RoutingPoint) -> bool:
        return True


class NeverDisaggregate(DisaggregationRule):
    name = "never-disaggregate"

    def remote(self, rp: RoutingPoint) -> bool:
        return False


class Dynamo(DisaggregationRule):
    """``dynamo[:LENGTH[:QUEUE]]`` (defaults 1000 and 2, Dynamo's)."""

    name = "dynamo"

    def __init__(self, max_local_prefill_length: float | str = 1000,
                 max_prefill_queue_size: float | str = 2) -> None:
        self.length = parse_float(max_local_prefill_length, self.name,
                                  "max_local_prefill_length", lo=0)
        self.queue = parse_float(max_prefill_queue_size, self.name, "max_prefill_queue_size",
                                 lo=0)

    def remote(self, rp: RoutingPoint) -> bool:
        assert rp.loads is not None
        queued = rp.loads.num_waiting[rp.pool("prefill")].sum()
        return rp.prompt_tokens > self.length and queued < self.queue


class LlmD(DisaggregationRule):
    """``llm-d[:THRESHOLD]`` (default 16, llm-d's shipped config)."""

    name = "llm-d"

    def __init__(self, threshold: float | str = 16) -> None:
        self.threshold = parse_float(threshold, self.name, "threshold", lo=0)

    def remote(self, rp: RoutingPoint) -> bool:
        return rp.prompt_tokens > self.threshold
