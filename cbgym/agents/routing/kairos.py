"""Kairos: load-aware prefill deflection (arXiv 2607.02043), as ``kairos`` and
``kairos-transfer`` (``kairos[:ALPHA[:BETA]]``).

The algorithm is the one ``../shared/reference/cluster-disaggregation.md`` ("Deflection")
states from a public port of the paper; neither the paper nor the port was in the searchable
corpus, so each point below where that text is silent is our choice, marked *(ours)*.

| parameter | meaning | default |
|---|---|---|
| ``alpha`` | deflect iff TTFT_D <= alpha x TTFT_P | 1.3 (paper) |
| ``beta`` | a mixed step on D may take beta x the TBT SLO | 1.0 |
| ``CHUNKS`` | LargestSafe's candidate chunks, largest first | 2048, 1024, 512, 256, 128 |

* **TTFT_P** per prefill instance p: p's remaining prompt tokens (running batch + queue)
  followed by this prompt, as one sequence cut into chunks of p's token budget
  (``max_num_batched_tokens``), each priced by p's cost model as a prefill-only iteration with
  attention over all the tokens before it (the port's ``a + c_pf q + c_attn q (done + q/2)``);
  only the last chunk samples. The queue's requests do not really attend each other, so this
  overstates a long queue a little, as the port does; the running batch's computed context is
  not in the load report and is taken as 0 *(ours)*. ``kairos-transfer`` adds
  ``setup_s + prompt x kv_bytes_per_token / nic_bytes_per_s`` (p's bytes, one uncontended NIC).
  It does not add a backlog from ``transfers_out`` *(ours)*: that counts requests, not bytes,
  includes KV still waiting for D's blocks, and drains while p computes the queue ahead of
  this prompt (2048 tokens of Llama-2-7B move in 43 ms at 25 GB/s and take longer to compute),
  so it would be counted twice. TTFT_P is the minimum over p; its argmin is the prefill pick.
* **TTFT_D** per decode instance d ("LargestSafe"): at each step the largest candidate, cut to
  the prompt left, whose mixed iteration (d's ``decode_batch`` decodes over its
  ``decode_context_tokens`` plus the chunk over the tokens already done) priced by d's cost
  model stays within ``beta x rp.tpot_target_s``; none fits: d is infeasible. TTFT_D is the
  sum of the steps, with no queueing term (the paper's). *(ours)*: the router sees only this
  request's TPOT target, not those of d's residents (exact with one SLO class), and applies it
  even to an idle d, so decodes landing there during the prefill are covered; the decode batch
  is held as reported (its context grows by one token a decode per step); a chunk is at most
  d's token budget less its decodes, as vLLM schedules running decodes first.
* **Eligible** d: no deflected prefill in flight (``local_prefills == 0``, the paper's) as of
  the load report (the paper's dispatcher decides on 100 ms stale state, a limit it states;
  within one report interval several prefills may go to one d: counting the router's own
  deflections since the report as in flight cut the P95 TTFT gain on azure-code-2023 from
  68% to 44% at load 0.4, ``docs/cluster.md``), and
  *(ours)*, to keep "no queueing" true, free blocks for the whole prompt and a free sequence
  slot (``max_num_seqs``); a d that would make the request wait is skipped.
* **Decide**: best d (smallest TTFT_D, ties to the lowest index); deflect iff TTFT_D <= alpha x
  TTFT_P and TTFT_D <= ``rp.ttft_target_s``, with ``Route.deflect(d, chunk_cap)``; otherwise
  ``Route.disaggregate(argmin TTFT_P, least_held decode)``.
* **Chunk cap** *(ours)*: the engine applies one per-request cap, not a schedule, so the cap is
  the largest chunk chosen (the first); when the schedule shrinks later, those steps may run
  larger chunks than planned.

Speed: TTFT_P calls the compiled pricing kernel once a chunk, or prices a queue of more than
``VECTOR_CHUNKS`` chunks as one numpy batch; the LargestSafe walk calls it once or twice a
step. It stops as soon as its sum passes what could
still be chosen (alpha x TTFT_P, the TTFT SLO, the best d so far), which leaves the decision
unchanged, and never re-prices a candidate that failed uncut: its step only grows with the
context done (all cost models but a table fitted with a negative ``kv_token_s``, for which the
walk re-tries every candidate each step). Loads are used as reported (stale by up to
``load_report_interval_s``, as the paper's 100 ms); prefix caching is ignored (the paper's).
"""

from __future__ import annotations

import math

import numpy as np

from cbgym.agents.params import parse_float
from cbgym.agents.routing.disagg import least_held
from cbgym.cluster.config import ClusterConfig
from cbgym.cluster.routing import Route, Router, RouterContext, RoutingPoint
from cbgym.engine.cost_model import BatchStats
from cbgym.engine.pricing import TABLE, cost_params, iteration_time, price

CHUNKS = (2048, 1024, 512, 256, 128)
VECTOR_CHUNKS = 64  # above this many prefill chunks TTFT_P is priced as one numpy batch


class Kairos(Router):
    """``kairos[:ALPHA[:BETA]]``: deflect a prefill to a decode instance when LargestSafe's
    TTFT there is within alpha of the best prefill instance's (module docstring)."""

    name = "kairos"
    transfer = False  # kairos-transfer: TTFT_P includes the KV transfer

    def __init__(self, alpha: float | str = 1.3, beta: float | str = 1.0) -> None:
        self.alpha = parse_float(alpha, self.name, "alpha", lo=0)
        self.beta = parse_float(beta, self.name, "beta", lo=0)
        self.label = f"{self.name}:{self.alpha:g}:{self.beta:g}"
        self._config: ClusterConfig | None = None

    def reset(self, ctx: RouterContext) -> None:
        super().reset(ctx)
        self._bind(ctx.config)

    def _bind(self, config: ClusterConfig) -> None:
        """Per-instance constants, once per cluster (a route must not rebuild them)."""
        if config is self._config:
            return
        if not config.disaggregated:
            raise ValueError(f"router {self.name!r} needs prefill and decode pools, got "
                             f"roles {sorted(set(config.roles))}")
        engines = config.engines
        self._cost = [cost_params(e.cost_model) for e in engines]
        self._budget = [int(e.max_num_batched_tokens) for e in engines]
        self._block = np.array([e.block_size for e in engines], np.int64)
        self._seqs = np.array([e.max_num_seqs for e in engines], np.int64)
        self._kv_bytes = np.array([e.kv_bytes_per_token or 0 for e in engines], np.float64)
        self._config = config

    # ------------------------------------------------------------------ the estimates
    def prefill_ttft(self, rp: RoutingPoint) -> np.ndarray:
        """TTFT_P of every prefill instance (``rp.pool("prefill")`` order), seconds."""
        assert rp.loads is not None
        self._bind(rp.config)
        pool = rp.pool("prefill")
        backlog = rp.loads.running_prefill_tokens + rp.loads.waiting_prefill_tokens
        out = np.array([self._prefill_s(p, int(backlog[p]) + rp.prompt_tokens)
                        for p in pool.tolist()])
        if self.transfer:
            link = rp.config.link
            out += link.setup_s + rp.prompt_tokens * self._kv_bytes[pool] / link.nic_bytes_per_s
        return out

    def _prefill_s(self, p: int, total: int) -> float:
        """Seconds prefill instance ``p`` takes for ``total`` tokens as one sequence."""
        kind, coef = self._cost[p]
        budget = self._budget[p]
        if total <= VECTOR_CHUNKS * budget:  # numpy's per-call cost outweighs a short loop
            seconds = 0.0
            for done in range(0, total, budget):
                q = min(budget, total - done)
                seconds += float(price(kind, coef, 1, q, 0, int(done + q == total), q * done,
                                       q * (q + 1) // 2, done + q, 0))
            return seconds
        done = np.arange(0, total, budget, dtype=np.int64)
        q = np.minimum(budget, total - done)
        one = np.ones_like(q)
        stats = BatchStats(num_seqs=one, prefill_tokens=q, decode_seqs=0 * one,
                           sampled_seqs=(done + q == total).astype(np.int64),
                           attn_q_ctx=q * done, attn_q_sq=q * (q + 1) // 2, kv_tokens=done + q)
        return float(np.sum(iteration_time(kind, coef, stats)))

    def eligible(self, rp: RoutingPoint) -> np.ndarray:
        """The decode instances LargestSafe may consider (module docstring)."""
        assert rp.loads is not None
        self._bind(rp.config)
        d, loads = rp.pool("decode"), rp.loads
        blocks = -(-rp.prompt_tokens // self._block[d])
        ok = ((loads.local_prefills[d] == 0) & (loads.free_blocks[d] >= blocks)
              & (loads.num_running[d] < self._seqs[d]))
        return d[ok]

    def decode_ttft(self, rp: RoutingPoint, d: int, bound: float = math.inf
                    ) -> tuple[float, int]:
        """(TTFT_D, chunk cap) of decode instance ``d`` by LargestSafe; (inf, 0) if
        infeasible or once the sum passes ``bound``."""
        assert rp.loads is not None
        self._bind(rp.config)
        kind, coef = self._cost[d]
        b, ctx = int(rp.loads.decode_batch[d]), int(rp.loads.decode_context_tokens[d])
        limit = self._budget[d] - b  # vLLM schedules the running decodes first
        sizes = sorted({min(c, limit) for c in CHUNKS}, reverse=True) if limit > 0 else []
        tbt, prompt = self.beta * rp.tpot_target_s, rp.prompt_tokens
        restart = kind == TABLE and coef[3] < 0  # the step may shrink with context

        def step(q: int, done: int, last: int) -> float:
            # the engine's mixed iteration: b decodes (q=1 over their context) + one chunk
            return float(price(kind, coef, b + 1, q, b, b + last, ctx + q * done,
                               b + q * (q + 1) // 2, ctx + b + done + q, 0))

        total, done, cap, i = 0.0, 0, 0, 0
        while sizes and done < prompt:
            left, q, t = prompt - done, 0, math.inf
            if left <= sizes[0]:  # every candidate >= left is the last chunk: it samples
                t = step(left, done, 1)
                q = left if t <= tbt else 0
            if not q:
                i = 0 if restart else i
                # candidates >= left were just tried; an uncut one that failed stays failed
                while i < len(sizes):
                    if sizes[i] < left:
                        t = step(sizes[i], done, 0)
                        if t <= tbt:
                            q = sizes[i]
                            break
                    i += 1
            if not q:
                return math.inf, 0
            total, done, cap = total + t, done + q, max(cap, q)
            if total > bound:
                return math.inf, 0
        return (total, cap) if done >= prompt else (math.inf, 0)

    def estimates(self, rp: RoutingPoint) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(TTFT_P per prefill instance, TTFT_D and cap per decode instance; inf and 0 for an
        ineligible or infeasible one), unpruned: for inspection and tests."""
        ttft_p, decode = self.prefill_ttft(rp), rp.pool("decode")
        ttft_d, caps = np.full(len(decode), math.inf), np.zeros(len(decode), np.int64)
        for d in self.eligible(rp).tolist():
            k = int(np.flatnonzero(decode == d)[0])
            ttft_d[k], caps[k] = self.decode_ttft(rp, d)
        return ttft_p, ttft_d, caps

    # ------------------------------------------------------------------ the decision
    def route(self, rp: RoutingPoint) -> Route:
        assert rp.loads is not None
        ttft_p = self.prefill_ttft(rp)
        k = int(np.argmin(ttft_p))
        bound = min(self.alpha * float(ttft_p[k]), rp.ttft_target_s)
        best, best_d, best_cap = math.inf, -1, 0
        for d in self.eligible(rp).tolist():
            t, cap = self.decode_ttft(rp, d, min(bound, best))
            if t < best:
                best, best_d, best_cap = t, d, cap
        if best_d >= 0:  # the walk returned a sum within bound: both tests hold
            return Route.deflect(best_d, best_cap)
        return Route.disaggregate(int(rp.pool("prefill")[k]),
                                  least_held(rp.pool("decode"), rp.loads))


class KairosTransfer(Kairos):
    """``kairos-transfer[:ALPHA[:BETA]]``: Kairos whose TTFT_P includes the KV transfer."""

    name = "kairos-transfer"
    transfer = True
