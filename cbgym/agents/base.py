"""What a baseline sees of the queue, and the key-ordering policy they all share.

A baseline is a *key function* over a :class:`QueueView`: one number per waiting request,
lower admitted first, ties kept in queue order. The same key function runs two ways:

* inside ``cbgym.simulate`` (fast path): the view is built from the engine's
  :class:`~cbgym.engine.DecisionPoint`;
* as an agent on the Gymnasium env: the view is built from the observation's waiting window
  (see ``cbgym.env``), and the keys become action scores.

The view is content-blind. ``true_output_tokens`` is filled only for policies that declare
``privileged = True`` (the oracles), through the engine's or env's explicitly privileged channel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from cbgym.engine.decision import FCFS_DECISION, Decision, DecisionPoint, Policy, PolicyContext

# prompt-length buckets for the content-blind output-length statistic: [1,128), [128,256), ...
OUTPUT_STAT_EDGES = np.array([128, 256, 512, 1024, 2048, 4096, 8192], dtype=np.int64)
OUTPUT_STAT_WINDOW = 512  # the study's rolling statistics use the last 512 completions


@dataclass(frozen=True, slots=True)
class QueueView:
    """Content-blind features of the waiting requests a policy ranks (aligned arrays)."""

    # position in the engine's queue order (0 = head); ties in keys keep this order
    queue_pos: np.ndarray
    prompt_tokens: np.ndarray
    num_computed: np.ndarray
    num_generated: np.ndarray
    num_preemptions: np.ndarray
    waited_s: np.ndarray
    tenant: np.ndarray
    slo_class: np.ndarray
    now: float
    # mean output length of recently completed requests per prompt bucket (float32 values,
    # len(OUTPUT_STAT_EDGES) + 1 buckets, NaN where a bucket saw no completion) and overall
    recent_output_by_bucket: np.ndarray
    recent_output_mean: float
    # privileged: true output lengths (oracles only), else None
    true_output_tokens: np.ndarray | None = None
    # prefix caching: tokens of each request the cache holds now (DecisionPoint.
    # cached_tokens); None where the engine has no prefix cache (as if nothing were cached)
    cached_tokens: np.ndarray | None = None
    # a learned predictor's output length per request, taken at its arrival (policies with
    # a predictor: cbgym.agents.predicted); None otherwise
    predicted_output: np.ndarray | None = None

    def uncached_tokens(self) -> np.ndarray:
        """Prefill left after cache hits: prompt + generated - cached (what admission must
        compute: its prefill work under prefix caching)."""
        total = self.prompt_tokens + self.num_generated
        return total if self.cached_tokens is None else total - self.cached_tokens


def recent_output_stats(finished: np.ndarray, prompt: np.ndarray,
                        generated: np.ndarray) -> tuple[np.ndarray, float]:
    """Mean output length of the last completions, per prompt bucket and overall (float32).

    Only requests that already finished are used, and their output length is then an observed
    fact, not a prediction input: this is content-blind.
    """
    last = finished[-OUTPUT_STAT_WINDOW:]
    out = np.full(len(OUTPUT_STAT_EDGES) + 1, np.nan, dtype=np.float32)
    if last.size == 0:
        return out, float("nan")
    lengths = generated[last].astype(np.float64)
    bucket = np.searchsorted(OUTPUT_STAT_EDGES, prompt[last], side="right")
    sums = np.bincount(bucket, weights=lengths, minlength=out.size)
    counts = np.bincount(bucket, minlength=out.size)
    seen = counts > 0
    out[seen] = (sums[seen] / counts[seen]).astype(np.float32)
    return out, float(np.float32(lengths.mean()))


OutputStats = tuple[np.ndarray, float]

# What a view carries when its policy does not use the output statistic (see KeyPolicy).
_NO_STATS = np.full(len(OUTPUT_STAT_EDGES) + 1, np.nan, dtype=np.float32)
_NO_STATS.flags.writeable = False


def view_from_decision_point(dp: DecisionPoint, true_output: np.ndarray | None,
                             output_stats: OutputStats | bool = True) -> QueueView:
    """The fast path's view: every waiting request of the decision point.

    Args:
        dp: the engine's decision point.
        true_output: true output lengths indexed by request id (oracles only), else None.
        output_stats: True computes ``recent_output_stats`` from ``dp``; a precomputed
            ``(by_bucket, mean)`` pair is used as is; False leaves them NaN (for policies that
            never read them: the statistic is the most expensive part of a view).
    """
    ids = dp.waiting
    if output_stats is True:
        by_bucket, mean = recent_output_stats(dp.finished, dp.prompt_tokens, dp.num_generated)
    elif output_stats is False:
        by_bucket, mean = _NO_STATS, float("nan")
    else:
        by_bucket, mean = output_stats
    return QueueView(
        queue_pos=np.arange(len(ids)),
        prompt_tokens=dp.prompt_tokens[ids],
        num_computed=dp.num_computed[ids],
        num_generated=dp.num_generated[ids],
        num_preemptions=dp.num_preemptions[ids],
        waited_s=dp.now - dp.arrival_s[ids],
        tenant=dp.tenant[ids],
        slo_class=dp.slo_class[ids],
        now=dp.now,
        recent_output_by_bucket=by_bucket,
        recent_output_mean=mean,
        true_output_tokens=None if true_output is None else true_output[ids],
        cached_tokens=None if dp.cached_tokens is None else dp.cached_tokens[ids],
    )


class KeyPolicy(Policy):
    """A policy that ranks waiting requests by ``keys(view)`` (lower first, ties by queue).

    Subclasses implement :meth:`keys` over :class:`QueueView` fields only, so the same ranking
    runs on the fast path and on the env. ``uses_output_stats`` says whether ``keys`` reads
    ``recent_output_by_bucket``/``recent_output_mean``; the fast path computes them only then
    (once per new completion, cached), and leaves them NaN otherwise.
    """

    uses_output_stats: ClassVar[bool] = False
    # keys read only a request's own fixed features (prompt, true output, arrival): the engine
    # may rank by them inside its compiled loop (see Policy.static_keys)
    static_key: ClassVar[bool] = False

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)
        true_output = ctx.true_output_tokens if self.privileged else None
        if self.privileged and true_output is None:
            raise ValueError(f"policy {self.name!r} is an oracle: it needs true output lengths")
        self._true_output = true_output
        self._stats_at = -1  # number of completions the cached output statistic covers
        self._stats: OutputStats = (_NO_STATS, float("nan"))

    @property
    def privileged_output_tokens(self) -> np.ndarray | None:
        """Per-request-id output lengths this policy's view carries as ``true_output_tokens``.

        The true lengths for oracles (a corrupted copy for ``noisy-oracle``), None otherwise.
        A privileged env path should fill ``QueueView.true_output_tokens`` from this array.
        """
        return self._true_output

    def keys(self, view: QueueView) -> np.ndarray:
        """One key per waiting request of ``view``, lower admitted first."""
        raise NotImplementedError

    def static_keys(self) -> np.ndarray | None:
        """:meth:`keys` of every request at once, for ``static_key`` policies.

        The view holds every request as if it were waiting at time 0 with nothing computed
        (waited -arrival, so ``now - waited_s`` is each arrival time exactly).
        """
        ctx = self.ctx
        if not self.static_key or ctx.prompt_tokens is None or ctx.arrival_s is None:
            return None
        n = ctx.num_requests
        zeros = np.zeros(n, np.int64)
        view = QueueView(
            queue_pos=np.arange(n), prompt_tokens=ctx.prompt_tokens, num_computed=zeros,
            num_generated=zeros, num_preemptions=zeros, waited_s=0.0 - ctx.arrival_s,
            tenant=zeros, slo_class=zeros, now=0.0, recent_output_by_bucket=_NO_STATS,
            recent_output_mean=float("nan"), true_output_tokens=self._true_output)
        return np.asarray(self.keys(view), dtype=np.float64)

    def key_unit_s(self) -> float:
        """Seconds of work one unit of this policy's key stands for (aging adds waited time
        in that unit). 1 for keys that already are seconds of work."""
        return 1.0

    def decide(self, dp: DecisionPoint) -> Decision:
        if len(dp.waiting) == 0:
            return FCFS_DECISION
        keys = self.keys(self.view(dp))
        return Decision(priority=np.asarray(keys, dtype=np.float64))

    def view(self, dp: DecisionPoint) -> QueueView:
        """This policy's fast-path view of ``dp`` (output statistic only if it is used)."""
        return view_from_decision_point(dp, self._true_output, self._output_stats(dp))

    def _output_stats(self, dp: DecisionPoint) -> OutputStats | bool:
        if not self.uses_output_stats:
            return False
        # finished ids only ever grow by appending, so their count identifies the statistic
        if self._stats_at != len(dp.finished):
            self._stats = recent_output_stats(dp.finished, dp.prompt_tokens, dp.num_generated)
            self._stats_at = len(dp.finished)
        return self._stats
