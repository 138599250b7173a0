"""A run's inter-token latencies pooled over its requests, as vLLM's benchmark reports them.

``vllm bench serve`` collects every gap between two streamed tokens of every request into one
list and prints its mean, standard deviation, median and p99 (``mean_itl_ms``,
``std_itl_ms``, ``median_itl_ms``, ``p99_itl_ms``). A run here streams far more tokens
than it can keep, so each gap goes into a histogram instead (``State.sf[ITL:]``, written
where the engine already takes a request's gap for its own worst and p99 gap,
:mod:`cbgym.engine.execute` and :mod:`cbgym.engine.stretch`): 256 bins per octave from
2**-18 s (4 us) to 2**14 s (4.6 h), so a bin is at most 0.39% of its gaps wide and a
percentile read at its bin's middle is within 0.2% of numpy's. The mean and standard
deviation are exact (the sum and the sum of squares are kept beside the bins). A decode
iteration's gaps are mostly one value, the iteration's duration, counted once for all the
requests it serves.

One departure from vLLM's benchmark, which pools the successful requests only: a gap counts
when it is streamed, so a request that streams tokens and then does not finish (preempted
and then shed by a policy; a client's abandoned attempt at a cluster's edge) keeps its gaps
in the pool. Without an edge or a shedding policy every request that streams finishes.

Kept with the requests' p99 gaps (``Engine(itl_p99=True)``, not in the study's engine mode,
not in the envs); each instance of a cluster keeps its own and the cluster adds them.
"""

from __future__ import annotations

import math

import numpy as np

from cbgym.engine.jit import no_alloc_kernel

E_MIN, E_MAX = -17, 14  # frexp exponents: gaps in [2**(E_MIN - 1), 2**E_MAX) s, else clamped
SUB = 256  # bins per octave, linear in the octave
NUM_BINS = (E_MAX - E_MIN + 1) * SUB  # (exponents E_MIN ... E_MAX)
SUM, SUM_SQ, COUNT = NUM_BINS, NUM_BINS + 1, NUM_BINS + 2  # beside the bins
SLOTS = NUM_BINS + 3


@no_alloc_kernel
def add(h: np.ndarray, at: int, gap: float, count: int) -> None:
    """``count`` gaps of ``gap`` seconds into the histogram ``h[at:at + SLOTS]``."""
    m, e = math.frexp(gap)  # gap = m 2**e, m in [0.5, 1)
    j = (e - E_MIN) * SUB + int((m - 0.5) * (2 * SUB)) if gap > 0 else 0
    h[at + min(max(j, 0), NUM_BINS - 1)] += count
    h[at + SUM] += gap * count
    h[at + SUM_SQ] += gap * gap * count
    h[at + COUNT] += count


def edges() -> np.ndarray:
    """The bins' edges in seconds (NUM_BINS + 1 of them)."""
    e = np.repeat(np.arange(E_MIN, E_MAX + 1), SUB)
    low = np.ldexp(0.5 + np.tile(np.arange(SUB), E_MAX - E_MIN + 1) / (2 * SUB), e)
    return np.append(low, 2.0 ** E_MAX)


def add_values(h: np.ndarray, values: np.ndarray) -> None:
    """Each of ``values`` (seconds, or any positive quantity in the bins' range) into the
    histogram ``h``, as :func:`add` would (numpy, for results reduced outside the kernel:
    :mod:`cbgym.week`)."""
    v = np.asarray(values, dtype=np.float64)
    m, e = np.frexp(v)
    j = np.where(v > 0, (e - E_MIN) * SUB + ((m - 0.5) * (2 * SUB)).astype(np.int64), 0)
    h[:NUM_BINS] += np.bincount(np.clip(j, 0, NUM_BINS - 1), minlength=NUM_BINS)
    h[SUM] += v.sum()
    h[SUM_SQ] += (v * v).sum()
    h[COUNT] += v.size


def stats(h: np.ndarray | None, quantiles: tuple[float, ...],
          prefix: str = "itl") -> dict[str, float]:
    """``itl_mean``, ``itl_std`` (numpy's population std, as vLLM's) and ``itl_p<q>`` (q in
    percent; numpy's linear method read at the bin's middle) in seconds; NaN without gaps
    or a histogram (the study's engine mode). ``prefix``: another name than ``itl``."""
    nan = float("nan")
    keys = [f"{prefix}_mean", f"{prefix}_std",
            *(f"{prefix}_p{round(q * 100)}" for q in quantiles)]
    if h is None or h[COUNT] == 0:
        return dict.fromkeys(keys, nan)
    n = h[COUNT]
    mean = h[SUM] / n
    out = {f"{prefix}_mean": float(mean),
           f"{prefix}_std": float(math.sqrt(max(h[SUM_SQ] / n - mean * mean, 0.0)))}
    cum = np.cumsum(h[:NUM_BINS])
    mid = edges()
    mid = (mid[:-1] + mid[1:]) / 2
    for q in quantiles:
        # numpy's linear method between the order statistics lo and lo + 1, each read at
        # the middle of its bin
        pos = (n - 1) * q
        lo = math.floor(pos)
        a, b = mid[np.searchsorted(cum, [lo, min(lo + 1, n - 1)], side="right")]
        out[f"{prefix}_p{round(q * 100)}"] = float(a + (b - a) * (pos - lo))
    return out


def pooled(hists: np.ndarray) -> np.ndarray:
    """One histogram from several (a cluster's instances: one row each)."""
    return np.asarray(hists).sum(axis=0)
