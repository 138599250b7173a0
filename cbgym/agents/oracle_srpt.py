"""Oracle-SRPT: preemptive shortest remaining work first (privileged upper bound)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cbgym.agents.base import QueueView, view_from_decision_point
from cbgym.agents.oracles import _true_output
from cbgym.agents.work import WorkCoefficients, work_coefficients
from cbgym.engine.decision import Decision, DecisionPoint, Policy, PolicyContext


def remaining_work(coef: WorkCoefficients, prompt: np.ndarray, computed: np.ndarray,
                   generated: np.ndarray, output: np.ndarray) -> np.ndarray:
    """Seconds of work left: ``c_p`` per token still to prefill + ``c_d`` per token to produce.

    Tokens to prefill are the request's backlog ``prompt + generated - computed`` (a fresh
    prompt, the rest of a chunked one, or everything again after a recompute preemption),
    except a running decode's one-token backlog, which is a decode. A fresh request's
    remaining work is its total work less ``c_f``, so waiting requests rank as in Oracle-Work.
    """
    backlog = prompt + generated - computed
    decoding = (generated > 0) & (backlog == 1)
    prefill = np.where(decoding, 0, backlog)
    return coef.prefill_token_s * prefill + coef.decode_seq_s * (output - generated)


class OracleSRPT(Policy):
    """Shortest remaining work first, evicting running requests with more work left.

    * Waiting order: least remaining work first (``keys``; uses ``prompt_tokens``,
      ``num_computed``, ``num_generated`` and ``true_output_tokens``).
    * Victims when memory runs short: most remaining work first.
    * Voluntary eviction (``Decision.preempt``): when the best waiting request cannot start
      because the batch is full (``max_num_seqs``) or its KV does not fit in the free blocks,
      evict the fewest running requests, most remaining work first and each with more work
      left than it, that make room for it; none if they cannot. Not done while memory is
      already short (the victims order handles that). An evicted request's work grows by its
      recompute, so two requests cannot evict each other back and forth.

    Privileged; consulted at every iteration, since remaining work shrinks as requests run.
    A fast-path policy: it needs the running requests, which a QueueView does not carry, so
    it is deliberately not a KeyPolicy (the env's EnvAgent refuses it rather than silently
    running it without evictions). ``keys`` alone gives non-preemptive SRPT admission.
    """

    name = "oracle-srpt"
    privileged = True
    consult = "every_iteration"

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)
        if ctx.true_output_tokens is None:
            raise ValueError(f"policy {self.name!r} is an oracle: it needs true output lengths")
        self._true_output = ctx.true_output_tokens
        self.coef = work_coefficients(ctx.config)

    def keys(self, view: QueueView) -> np.ndarray:
        """Seconds of work left for each waiting request of ``view``."""
        return remaining_work(self.coef, view.prompt_tokens, view.num_computed,
                              view.num_generated, _true_output(view))

    def decide(self, dp: DecisionPoint) -> Decision:
        run = dp.running
        left = remaining_work(self.coef, dp.prompt_tokens[run], dp.num_computed[run],
                              dp.num_generated[run], self._true_output[run])
        most_first = np.argsort(-left, kind="stable")
        victims = run[most_first]
        if len(dp.waiting) == 0:
            return Decision(victims=victims)
        keys = self.keys(view_from_decision_point(dp, self._true_output, output_stats=False))
        evict = self._evictions(dp, keys, run, left, most_first) if dp.shortfall_blocks == 0 \
            else ()
        return Decision(priority=keys, victims=victims, preempt=evict)

    def _evictions(self, dp: DecisionPoint, keys: np.ndarray, run: np.ndarray,
                   left: np.ndarray, most_first: np.ndarray) -> Sequence[int]:
        """The running ids to evict so the best waiting request can start (maybe none)."""
        cfg, true = dp.config, self._true_output
        best = int(np.argmin(keys))
        rid = int(dp.waiting[best])
        bs = int(cfg.block_size or 1)
        if cfg.paper_mode:  # KV for prompt + true output is reserved at admission
            need = int(dp.prompt_tokens[rid] + true[rid])
            held = dp.prompt_tokens[run] + true[run]
        else:
            need = int(dp.prompt_tokens[rid] + dp.num_generated[rid])
            held = dp.num_computed[run]
        need_blocks = -(-need // bs) - dp.free_blocks
        need_slots = len(run) - cfg.max_num_seqs + 1
        if need_blocks <= 0 and need_slots <= 0:
            return ()
        cand = most_first[left[most_first] > keys[best]]
        freed = np.cumsum(-(-held[cand] // bs))
        # fewest victims that free enough blocks (len(cand) + 1 when even all of them do not)
        k_blocks = int(np.searchsorted(freed, need_blocks, side="left")) + 1 \
            if need_blocks > 0 else 0
        k = max(need_slots, k_blocks)
        if k > len(cand):
            return ()
        return run[cand[:k]].tolist()
