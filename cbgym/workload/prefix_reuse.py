"""How much of a trace's prompts an infinite prefix cache would find: leading-prefix reuse of
its block ids (:mod:`cbgym.workload.sessions`' conventions) and the rank correlation between
prompt length and the prefill left after those hits."""

from __future__ import annotations

import math

import numpy as np

from cbgym.workload.trace import Trace

__all__ = ["leading_hits", "prefix_reuse"]


def _block_tokens(trace: Trace, block_tokens: int | None) -> np.ndarray:
    if "hash_ids" not in trace.extra:
        raise ValueError(f"trace {trace.name!r} has no extra['hash_ids']")
    own = trace.extra.get("hash_block_tokens")
    if own is None:
        if block_tokens is None:
            raise ValueError(f"trace {trace.name!r} has no extra['hash_block_tokens']; "
                             "pass block_tokens (the tokens each id stands for)")
        return np.full(len(trace), block_tokens, np.int64)
    own = np.asarray(own, np.int64)
    if block_tokens is not None and np.any(own != block_tokens):
        raise ValueError(f"block_tokens={block_tokens} differs from the trace's own "
                         f"hash_block_tokens ({sorted(set(own.tolist()))}); ids cannot be "
                         "re-blocked")
    return own


def leading_hits(trace: Trace) -> np.ndarray:
    """Per request, how many leading ids an infinite cache already holds (int64).

    Requests are taken in trace (arrival) order; ids count from position 0 while each was
    seen in an earlier request, the partial last block's id included.
    """
    if "hash_ids" not in trace.extra:
        raise ValueError(f"trace {trace.name!r} has no extra['hash_ids']")
    seen: set[int] = set()
    hits = np.zeros(len(trace), np.int64)
    for r, ids in enumerate(trace.extra["hash_ids"]):
        k = 0
        for h in ids:
            if h not in seen:
                break
            k += 1
        hits[r] = k
        seen.update(ids)
    return hits


def prefix_reuse(
    trace: Trace, block_tokens: int | None = None, *, full_blocks_only: bool = False
) -> dict[str, float]:
    """Leading-prefix reuse with an infinite cache, and how prefill cost tracks prompt length.

    With ``full_blocks_only=False`` (default) every id counts, the partial last block's too:
    this reproduces the published Mooncake figures (conversation 36.6%, synthetic 64.0% of
    blocks); counting full blocks only gives 38.2% and 65.9%.

    Args:
        trace: a trace with ``extra["hash_ids"]``.
        block_tokens: ``B``, needed only when the trace has no ``extra["hash_block_tokens"]``
            (it must agree where it has).
        full_blocks_only: count only ids of full blocks (``prompt // B`` per request).

    Returns:
        ``blocks`` (ids counted), ``hit_blocks``, ``block_hit_fraction``; ``prompt_tokens``,
        ``hit_tokens`` (``min(hits * B, prompt)`` per request), ``token_hit_fraction``;
        ``uncached_tokens`` (prompt tokens left to prefill); ``spearman_prompt_uncached``:
        Spearman's rank correlation between prompt length and uncached tokens over requests
        (NaN when either is constant); ``requests``.
    """
    block = _block_tokens(trace, block_tokens)
    prompt = np.asarray(trace.prompt_tokens, np.int64)
    lengths = np.fromiter((len(h) for h in trace.extra["hash_ids"]), np.int64, len(trace))
    hits = leading_hits(trace)
    if full_blocks_only:
        lengths = np.minimum(lengths, prompt // block)
        hits = np.minimum(hits, lengths)
    hit_tokens = np.minimum(hits * block, prompt)
    uncached = prompt - hit_tokens
    blocks, total = int(lengths.sum()), int(prompt.sum())
    if len(trace) > 1 and np.ptp(prompt) and np.ptp(uncached):
        from scipy.stats import spearmanr  # (scipy is slow to import: only here)

        rho = float(spearmanr(prompt, uncached).statistic)
    else:
        rho = math.nan
    return {
        "requests": float(len(trace)),
        "blocks": float(blocks),
        "hit_blocks": float(hits.sum()),
        "block_hit_fraction": float(hits.sum()) / blocks if blocks else math.nan,
        "prompt_tokens": float(total),
        "hit_tokens": float(hit_tokens.sum()),
        "token_hit_fraction": float(hit_tokens.sum()) / total if total else math.nan,
        "uncached_tokens": float(uncached.sum()),
        "spearman_prompt_uncached": rho,
    }
