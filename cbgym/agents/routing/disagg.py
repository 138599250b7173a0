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

Without prefix caching the uncached prompt is the whole prompt. The rules are compiled
(:mod:`cbgym.cluster.route_ops`).
"""

from __future__ import annotations

from cbgym.agents.params import parse_float
from cbgym.agents.routing.compiled import CompiledRule
from cbgym.cluster import route_ops as ro
from cbgym.cluster.state import LENGTH, QUEUE, THRESHOLD


class DisaggregationRule(CompiledRule):
    """Decode instance first, then whether to disaggregate (the rule's ``code``)."""

    needs_decode_pool = True


class AlwaysDisaggregate(DisaggregationRule):
    name = "always-disaggregate"
    code = ro.ALWAYS


class NeverDisaggregate(DisaggregationRule):
    name = "never-disaggregate"
    code = ro.NEVER


class Dynamo(DisaggregationRule):
    """``dynamo[:LENGTH[:QUEUE]]`` (defaults 1000 and 2, Dynamo's)."""

    name = "dynamo"
    code = ro.DYNAMO

    def __init__(self, max_local_prefill_length: float | str = 1000,
                 max_prefill_queue_size: float | str = 2) -> None:
        self.length = parse_float(max_local_prefill_length, self.name,
                                  "max_local_prefill_length", lo=0)
        self.queue = parse_float(max_prefill_queue_size, self.name, "max_prefill_queue_size",
                                 lo=0)

    def kernel_params(self) -> dict[int, float]:
        return {LENGTH: self.length, QUEUE: self.queue}


class LlmD(DisaggregationRule):
    """``llm-d[:THRESHOLD]`` (default 16, llm-d's shipped config)."""

    name = "llm-d"
    code = ro.LLM_D

    def __init__(self, threshold: float | str = 16) -> None:
        self.threshold = parse_float(threshold, self.name, "threshold", lo=0)

    def kernel_params(self) -> dict[int, float]:
        return {THRESHOLD: self.threshold}
