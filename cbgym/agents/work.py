"""Pricing a request's service work with the engine's own cost model.

The CB-SJF-Work study prices a request as ``W = c_f + c_p x + c_d y`` seconds: a fixed
prefill cost, ``c_p`` per prompt token and ``c_d`` per decode step (the marginal cost of one
more sequence in a decode batch; the decode iteration's base cost belongs to the batch, not to
any one request). :func:`work_coefficients` reads ``(c_f, c_p, c_d)`` off the engine's cost
model once per simulation, so keys are in seconds of this engine's work.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cbgym.agents.base import OUTPUT_STAT_EDGES, KeyPolicy, QueueView
from cbgym.engine.config import EngineConfig
from cbgym.engine.cost_model import BatchStats, LinearCostModel
from cbgym.engine.decision import PolicyContext

# Reference points for models that are not linear (see work_coefficients).
_REF_CHUNK_TOKENS = 2048  # prefill chunk when the engine has no token budget (paper mode)
_REF_DECODE_CONTEXT = 1024  # context of each sequence in the reference decode batch
_MAX_REF_BATCH = 64
# Output length assumed before any request has completed (trace-agnostic).
PRIOR_OUTPUT_TOKENS = 128.0


@dataclass(frozen=True, slots=True)
class WorkCoefficients:
    """``W = fixed_s + prefill_token_s * x + decode_seq_s * y`` seconds (c_f, c_p, c_d)."""

    fixed_s: float
    prefill_token_s: float
    decode_seq_s: float

    def work(self, prompt: np.ndarray, output: np.ndarray) -> np.ndarray:
        """Total work in seconds of ``prompt`` prompt tokens and ``output`` output tokens."""
        return self.fixed_s + self.prefill_token_s * prompt + self.decode_seq_s * output


def _prefill(x: int) -> BatchStats:
    """One fresh prompt of ``x`` tokens in one iteration (it samples its first token)."""
    return BatchStats(num_seqs=1, prefill_tokens=x, decode_seqs=0, sampled_seqs=1,
                      attn_q_ctx=0, attn_q_sq=x * (x + 1) // 2, kv_tokens=x)


def _decode(b: int, ctx: int) -> BatchStats:
    """A decode iteration of ``b`` sequences holding ``ctx`` tokens each."""
    return BatchStats(num_seqs=b, prefill_tokens=0, decode_seqs=b, sampled_seqs=b,
                      attn_q_ctx=b * ctx, attn_q_sq=b, kv_tokens=b * (ctx + 1))


def work_coefficients(config: EngineConfig) -> WorkCoefficients:
    """``(c_f, c_p, c_d)`` of the engine's cost model.

    A :class:`LinearCostModel` gives them directly: ``c_f`` = ``prefill_base_s`` (or ``base_s``),
    ``c_p`` = ``prefill_per_token_s``, ``c_d`` = ``decode_per_seq_s``. Any other model is
    linearised by finite differences of ``iteration_time``, once:

    * ``c_p``: slope between a prefill of half a chunk and of a full chunk (the engine's
      ``max_num_batched_tokens``, 2048 without one); ``c_f``: that line's intercept (>= 0).
    * ``c_d``: extra time per sequence from a decode batch of ``b`` to ``2b`` sequences of
      1024 context tokens each, ``b = min(max_num_seqs, 64) // 2`` (at least 1).

    This keeps the study's three-term form: attention over a long context, which makes later
    chunks and long-context decodes cost more, is priced at the reference points only.
    """
    cost = config.cost_model
    if isinstance(cost, LinearCostModel):
        fixed = cost.base_s if cost.prefill_base_s is None else cost.prefill_base_s
        return WorkCoefficients(fixed, cost.prefill_per_token_s, cost.decode_per_seq_s)
    assert cost is not None

    def t(stats: BatchStats) -> float:
        return float(cost.iteration_time(stats))

    chunk = _REF_CHUNK_TOKENS if config.paper_mode else config.max_num_batched_tokens
    x0, x1 = max(chunk // 2, 1), max(chunk, 2)
    c_p = max((t(_prefill(x1)) - t(_prefill(x0))) / (x1 - x0), 0.0)
    c_f = max(t(_prefill(x0)) - c_p * x0, 0.0)
    b0 = max(min(config.max_num_seqs, _MAX_REF_BATCH) // 2, 1)
    c_d = (t(_decode(2 * b0, _REF_DECODE_CONTEXT)) - t(_decode(b0, _REF_DECODE_CONTEXT))) / b0
    return WorkCoefficients(c_f, c_p, max(c_d, 0.0))


def estimated_output(view: QueueView, estimator: str = "bucket",
                     prior: float = PRIOR_OUTPUT_TOKENS) -> np.ndarray:
    """Content-blind output-length estimate ``yhat`` per waiting request (float32).

    ``"bucket"``: the recent mean output of completed requests in the request's prompt bucket,
    else the recent overall mean, else ``prior`` (before any completion). ``"global"``: the
    recent overall mean, else ``prior``. A request that already produced ``g`` tokens (it was
    preempted) is known to need more than ``g``: the estimate is at least ``g + 1``.

    Values stay float32, as ``recent_output_stats`` returns them, so a view built by the env
    from the same statistic yields bit-identical keys.
    """
    mean = view.recent_output_mean
    fallback = np.float32(mean if np.isfinite(mean) else prior)
    if estimator == "global":
        yhat = np.full(len(view.prompt_tokens), fallback, dtype=np.float32)
    else:  # fill the few empty buckets first, then look every request up
        table = view.recent_output_by_bucket
        table = np.where(np.isnan(table), fallback, table).astype(np.float32)
        yhat = table[np.searchsorted(OUTPUT_STAT_EDGES, view.prompt_tokens, side="right")]
    return np.maximum(yhat, (np.asarray(view.num_generated) + 1).astype(np.float32))


class WorkKeyPolicy(KeyPolicy):
    """A key policy that prices work with the engine's cost model (``self.coef``, at reset)."""

    coef: WorkCoefficients

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)
        self.coef = work_coefficients(ctx.config)


SHED_RULES = ("late", "unreachable")


def shed_lead(rule: str, config: EngineConfig) -> tuple[float, float]:
    """When a waiting request can be shed, as (seconds, seconds per prompt token) subtracted
    from its TTFT target: it is sheddable once ``waited + a + b * prompt_tokens > target``.

    ``"late"``: (0, 0), once its TTFT deadline has passed. ``"unreachable"``: ``(c_f, c_p)`` of
    :func:`work_coefficients`, its own prefill at the engine's linearised cost: once less time
    is left than that, even admitted at once it would (almost surely) miss its first-token
    target. An estimate, not a bound: it leaves out queueing and co-running decodes, which only
    add time, but the linearisation itself overestimates a lone prefill on the vLLM presets by
    a few percent (1.5-4% for 256-2,048 tokens), so a request that could just make it is
    occasionally shed. Prompts many chunks long go the other way: attention over the growing
    context is priced at the reference chunk only, so on ``llama-3.1-8b/h100-80gb`` a lone
    60k-token prefill is priced 1.50 s against the cost model's 3.36 s in 2,048-token chunks
    (docs/benchmark.md: such prompts are admitted and miss their target). Content-blind: the
    prompt length and the engine's cost model. Only requests without a first token are ever
    shed (the env and the heuristics check that).
    """
    if rule == "late":
        return (0.0, 0.0)
    if rule != "unreachable":
        raise ValueError(f"shed_rule={rule!r}: expected one of {SHED_RULES}")
    c = work_coefficients(config)
    return (c.fixed_s, c.prefill_token_s)

