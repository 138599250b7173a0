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

Compiled (:mod:`cbgym.cluster.route_ops`: the cluster loop applies it in the kernel, and
:meth:`Kairos.route` calls the same function). The LargestSafe walk stops as soon as its sum
passes what could still be chosen (alpha x TTFT_P, the TTFT SLO, the best d so far), which
leaves the decision unchanged, and never re-prices a candidate that failed uncut: its step
only grows with the context done (all cost models but a table fitted with a negative
``kv_token_s``, for which the walk re-tries every candidate each step). Loads are used as
reported (stale by up to ``load_report_interval_s``, as the paper's 100 ms). With prefix
caching *(ours; the paper has none)*: TTFT_P prices what p's cache leaves to compute, the
transfer term what the decode instance it would use lacks, LargestSafe on d starts after
d's cached prefix, and d's blocks are counted for its uncached tokens.
"""

from __future__ import annotations

import math

import numpy as np

from cbgym.agents.params import parse_float
from cbgym.agents.routing.compiled import CompiledRule, cached_of
from cbgym.cluster import route_ops as ro
from cbgym.cluster.config import ClusterConfig
from cbgym.cluster.routing import RoutingPoint
from cbgym.cluster.state import ALPHA, BETA, BUDGET, COST_KIND, DECODE

CHUNKS = tuple(int(c) for c in ro.CHUNKS)


class Kairos(CompiledRule):
    """``kairos[:ALPHA[:BETA]]``: deflect a prefill to a decode instance when LargestSafe's
    TTFT there is within alpha of the best prefill instance's (module docstring)."""

    name = "kairos"
    code = ro.KAIROS

    def __init__(self, alpha: float | str = 1.3, beta: float | str = 1.0) -> None:
        self.alpha = parse_float(alpha, self.name, "alpha", lo=0)
        self.beta = parse_float(beta, self.name, "beta", lo=0)
        self.label = f"{self.name}:{self.alpha:g}:{self.beta:g}"

    def kernel_params(self) -> dict[int, float]:
        return {ALPHA: self.alpha, BETA: self.beta}

    def _tables(self, config: ClusterConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if not config.disaggregated:
            raise ValueError(f"router {self.name!r} needs prefill and decode pools, got "
                             f"roles {sorted(set(config.roles))}")
        return super()._tables(config)

    # ------------------------------------------------------------------ the estimates
    def prefill_ttft(self, rp: RoutingPoint) -> np.ndarray:
        """TTFT_P of every prefill instance (``rp.pool("prefill")`` order), seconds."""
        assert rp.loads is not None
        inst, coefs, cf = self._tables(rp.config)
        loads = _loads(rp)
        cached = cached_of(rp)
        d = ro.pick(ro.LEAST_OUTSTANDING, inst, loads, DECODE, np.int64(0))
        sent = np.int64(rp.prompt_tokens - cached[d] if d >= 0 else rp.prompt_tokens)
        return np.array([ro.prefill_estimate(self.code, cf, inst, coefs, loads, p,
                                             np.int64(rp.prompt_tokens), cached[p], sent)
                         for p in rp.pool("prefill").tolist()])

    def eligible(self, rp: RoutingPoint) -> np.ndarray:
        """The decode instances LargestSafe may consider (module docstring)."""
        assert rp.loads is not None
        inst, _, _ = self._tables(rp.config)
        loads = _loads(rp)
        d, cached = rp.pool("decode"), cached_of(rp)
        return d[[bool(ro.kairos_ok(inst, loads, k, np.int64(rp.prompt_tokens), cached[k]))
                  for k in d.tolist()]]

    def decode_ttft(self, rp: RoutingPoint, d: int, bound: float = math.inf
                    ) -> tuple[float, int]:
        """(TTFT_D, chunk cap) of decode instance ``d`` by LargestSafe; (inf, 0) if
        infeasible or once the sum passes ``bound``."""
        assert rp.loads is not None
        inst, coefs, _ = self._tables(rp.config)
        t, cap = ro.decode_ttft(inst[COST_KIND, d], coefs[d], inst[BUDGET, d],
                                np.int64(rp.loads.decode_batch[d]),
                                np.int64(rp.loads.decode_context_tokens[d]),
                                np.int64(rp.prompt_tokens), self.beta * rp.tpot_target_s,
                                float(bound), cached_of(rp)[d])
        return float(t), int(cap)

    def estimates(self, rp: RoutingPoint) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(TTFT_P per prefill instance, TTFT_D and cap per decode instance; inf and 0 for an
        ineligible or infeasible one), unpruned: for inspection and tests."""
        ttft_p, decode = self.prefill_ttft(rp), rp.pool("decode")
        ttft_d, caps = np.full(len(decode), math.inf), np.zeros(len(decode), np.int64)
        for d in self.eligible(rp).tolist():
            k = int(np.flatnonzero(decode == d)[0])
            ttft_d[k], caps[k] = self.decode_ttft(rp, d)
        return ttft_p, ttft_d, caps


def _loads(rp: RoutingPoint) -> np.ndarray:
    from cbgym.cluster.tables import loads_array

    assert rp.loads is not None
    return loads_array(rp.loads)


class KairosTransfer(Kairos):
    """``kairos-transfer[:ALPHA[:BETA]]``: Kairos whose TTFT_P includes the KV transfer."""

    name = "kairos-transfer"
    code = ro.KAIROS_TRANSFER
