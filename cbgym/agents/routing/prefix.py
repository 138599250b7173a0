"""Cache-aware routers: send a request where its prefix is cached, balanced against load.

They read ``RoutingPoint.cached_tokens`` (per instance, the request's prompt tokens its
prefix cache holds now: engine state from opaque block ids, content-blind) beside the load
report; without prefix caching every instance holds nothing and they reduce to their load
term. Unified replicas only (on prefill/decode pools the placement rules ``dynamo``,
``llm-d`` and ``kairos`` read the uncached prompt: :mod:`cbgym.cluster.route_ops`).

Each also counts what it routed since the load report it reads (requests, and their prompt
blocks), as production routers keep their own in-flight accounting: requests arriving at
one instant (Mooncake's timestamps come in batches) would otherwise all see the same report
and herd onto one instance.

- ``dynamo-kv[:W]``: NVIDIA Dynamo's KV-aware router cost per worker, ``W x`` (blocks it
  would have to prefill) ``+`` (its active blocks), lowest wins (W = 1, Dynamo's
  ``kv_overlap_score_weight`` default; no softmax sampling: temperature 0).
- ``llm-d-prefix``: llm-d's default scheduling profile, the prefix-cache scorer (the share
  of the prompt's blocks cached there) with weight 3 plus the queue scorer (waiting
  requests, min-max normalised: 1 for the shortest queue) with weight 2, highest wins.
- ``cache-affinity[:B[:F]]``: after SGLang's cache-aware router: the instance with the
  longest cached prefix if it holds at least a fraction F of the prompt (default 0.5) and
  the load is balanced (the outstanding requests of the busiest and the idlest instances
  differ by at most B, default 32); else the least outstanding. Parameters are ours.
"""

from __future__ import annotations

import numpy as np

from cbgym.agents.params import parse_float
from cbgym.cluster.routing import Route, Router, RouterContext, RoutingPoint


class CacheRouter(Router):
    """A cache-aware rule over the unified pool."""

    def reset(self, ctx: RouterContext) -> None:
        super().reset(ctx)
        if ctx.config.disaggregated:
            raise ValueError(f"router {self.name!r}: routes among unified replicas (on "
                             "prefill/decode pools: dynamo, llm-d or kairos, which read "
                             "the uncached prompt)")
        engines = ctx.config.engines
        self.block_size = int(engines[0].block_size or 16)
        self.num_blocks = np.array([e.num_kv_blocks for e in engines], np.float64)

        n = ctx.config.num_instances
        self.report_s = -np.inf
        self.sent = np.zeros(n, np.int64)  # requests routed since the report
        self.sent_blocks = np.zeros(n, np.int64)  # and their prompt blocks

    def cached(self, rp: RoutingPoint) -> np.ndarray:
        if rp.cached_tokens is None:
            return np.zeros(rp.num_instances, np.int64)
        return rp.cached_tokens

    def route(self, rp: RoutingPoint) -> Route:
        assert rp.loads is not None
        if rp.loads.report_s != self.report_s:  # a new report counts what was sent before
            self.report_s = rp.loads.report_s
            self.sent[:] = 0
            self.sent_blocks[:] = 0
        i = self.pick(rp)
        self.sent[i] += 1
        self.sent_blocks[i] += -(-rp.prompt_tokens // self.block_size)
        return Route.to(i)

    def pick(self, rp: RoutingPoint) -> int:  # pragma: no cover - abstract
        raise NotImplementedError


class DynamoKV(CacheRouter):
    """Dynamo's KV-aware cost: W x blocks to prefill + active blocks, lowest first."""

    name = "dynamo-kv"

    def __init__(self, overlap_weight: str | float = 1.0) -> None:
        self.weight = parse_float(overlap_weight, self.name, "overlap_weight", 0.0)
        self.label = self.name if self.weight == 1.0 else f"{self.name}:{self.weight:g}"

    def pick(self, rp: RoutingPoint) -> int:
        assert rp.loads is not None
        bs = self.block_size
        prefill = -(-(rp.prompt_tokens - self.cached(rp)) // bs)
        active = rp.loads.kv_usage * self.num_blocks + self.sent_blocks
        return int(np.argmin(self.weight * prefill + active))


class LlmDPrefix(CacheRouter):
    """llm-d's default profile: 3 x prefix-cache score + 2 x queue score, highest first."""

    name = "llm-d-prefix"
    PREFIX_WEIGHT, QUEUE_WEIGHT = 3.0, 2.0

    def pick(self, rp: RoutingPoint) -> int:
        assert rp.loads is not None
        blocks = max(-(-rp.prompt_tokens // self.block_size), 1)
        prefix = (self.cached(rp) // self.block_size) / blocks
        q = (rp.loads.num_waiting + self.sent).astype(np.float64)
        span = q.max() - q.min()
        queue = np.ones_like(q) if span == 0 else (q.max() - q) / span
        return int(np.argmax(self.PREFIX_WEIGHT * prefix + self.QUEUE_WEIGHT * queue))


class CacheAffinity(CacheRouter):
    """The longest cached prefix while the load is balanced, else the least outstanding."""

    name = "cache-affinity"

    def __init__(self, balance: str | float = 32, min_fraction: str | float = 0.5) -> None:
        self.balance = parse_float(balance, self.name, "balance", 0.0)
        self.min_fraction = parse_float(min_fraction, self.name, "min_fraction", 0.0)
        if self.min_fraction > 1:
            raise ValueError(f"{self.name}: min_fraction={min_fraction!r}: expected a "
                             "fraction in [0, 1]")
        self.label = f"{self.name}:{self.balance:g}:{self.min_fraction:g}"

    def pick(self, rp: RoutingPoint) -> int:
        assert rp.loads is not None
        outstanding = rp.loads.outstanding() + self.sent
        cached = self.cached(rp)
        best = int(np.argmax(cached))
        balanced = outstanding.max() - outstanding.min() <= self.balance
        if balanced and cached[best] >= self.min_fraction * rp.prompt_tokens and cached[best]:
            return best
        return int(np.argmin(outstanding))


PREFIX_ROUTERS = (DynamoKV, LlmDPrefix, CacheAffinity)
