"""Load-balancing routers: where a request runs, by a rule on the instances' load.

On a cluster with unified instances they pick one of those; on a disaggregated cluster
(prefill and decode pools) they pick a prefill instance and a decode instance by the same
rule and always disaggregate (jsq-time: decode instances by requests held). Rules as in
Vidur's global schedulers (random, round-robin, least outstanding requests), splitwise-sim
(join the shortest queue by pending tokens) and Mitzenmacher's power of two choices, and
``jsq-time``: the shortest queue by its estimated prefill time on each instance's own cost
model, which is what a queue of tokens means on GPUs of different speeds (Kairos's TTFT_P
estimate, applied to every pool). Round-robin, least-outstanding, jsq-tokens and jsq-time
are compiled rules (:mod:`cbgym.cluster.route_ops`); random and power-of-two draw from the
run's generator at the door.
"""

from __future__ import annotations

import numpy as np

from cbgym.agents.routing.compiled import CompiledRule
from cbgym.cluster import route_ops as ro
from cbgym.cluster.routing import Loads, Route, Router, RouterContext, RoutingPoint


class PoolRouter(Router):
    """A random rule ``pick(candidates, loads, kind)`` applied per pool (the module doc)."""

    def reset(self, ctx: RouterContext) -> None:
        super().reset(ctx)
        self.rng = np.random.default_rng(ctx.seed)
        self.count = 0

    def pick(self, candidates: np.ndarray, loads: Loads | None, kind: str) -> int:
        raise NotImplementedError

    def route(self, rp: RoutingPoint) -> Route:
        unified = rp.pool("unified")
        self.count += 1
        if len(unified):
            return Route.to(self.pick(unified, rp.loads, "unified"))
        return Route.disaggregate(self.pick(rp.pool("prefill"), rp.loads, "prefill"),
                                  self.pick(rp.pool("decode"), rp.loads, "decode"))


class RandomRouter(PoolRouter):
    """Uniformly at random (seeded by the run's seed)."""

    name = "random"
    reads_loads = False

    def pick(self, candidates: np.ndarray, loads: Loads | None, kind: str) -> int:
        return int(candidates[self.rng.integers(len(candidates))])


class RoundRobin(CompiledRule):
    """Request i (in arrival order) to instance i mod N of the pool (of each pool, on a
    disaggregated cluster)."""

    name = "round-robin"
    code = ro.ROUND_ROBIN
    reads_loads = False


def work(loads: Loads, kind: str) -> np.ndarray:
    """Pending work an instance reports: prompt tokens still to compute on a prefill
    instance; requests held or promised (:meth:`Loads.committed`) elsewhere."""
    if kind == "prefill":
        return loads.waiting_prefill_tokens + loads.running_prefill_tokens
    return loads.committed()


class LeastOutstanding(CompiledRule):
    """Fewest requests held (waiting + running, plus those routed to a decode instance and
    still prefilling elsewhere); ties to the lowest index. Vidur's least-outstanding."""

    name = "least-outstanding"
    code = ro.LEAST_OUTSTANDING


class ShortestQueueTokens(CompiledRule):
    """Join the shortest queue by tokens: fewest prompt tokens still to compute (waiting and
    running), ties by fewer requests, then the lowest index; decode instances by requests
    held first (splitwise-sim's pending-tokens rule)."""

    name = "jsq-tokens"
    code = ro.JSQ_TOKENS


class ShortestQueueTime(CompiledRule):
    """Join the queue that is shortest in time: the least estimated seconds to prefill the
    instance's pending prompt tokens (waiting and running) and this prompt, less what its
    prefix cache holds, chunked by its token budget and priced by its own cost model; ties by
    fewer requests held, then the lowest index. Pending counts the requests routed there since
    the load report (``RoutingPoint.routed_since_report``, each as this prompt): the in-flight
    accounting production routers keep, without which the arrivals between two reports herd
    onto one queue. On a disaggregated cluster the prefill instance by that estimate
    (Kairos's TTFT_P) and the decode instance by requests held (those routed since the
    report included). The queue is priced as one sequence of that many tokens, as Kairos
    prices TTFT_P, so its attention term grows with the square of the queue."""

    name = "jsq-time"
    code = ro.JSQ_TIME


class PowerOfTwo(PoolRouter):
    """Two instances drawn at random, the one with less pending work (:func:`work`)."""

    name = "power-of-two"

    def pick(self, candidates: np.ndarray, loads: Loads | None, kind: str) -> int:
        assert loads is not None
        if len(candidates) == 1:
            return int(candidates[0])
        a, b = self.rng.choice(candidates, size=2, replace=False)
        w = work(loads, kind)
        return int(a if w[a] <= w[b] else b)
