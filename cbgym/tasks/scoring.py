"""Scores a benchmark reports: means with confidence intervals, normalized scores, paired
differences.

Every score is over the task's test windows, and every comparison is paired: all policies
replay the same scaled windows (common random numbers), so the per-window difference between
two policies carries no window-to-window noise.

* :func:`mean_ci`: a mean with its Student-t confidence interval over windows.
* :func:`normalized_score`: (P - random) / (best reference - random) per window, with the
  task-level spread (mean best - mean random) as the fixed denominator, so its mean is the
  usual (P̄ - R̄) / (B̄ - R̄): 0 is random actions, 1 the best reference; the interval is that
  of the paired per-window gains over random, in units of the reference spread.
* :func:`paired_difference`: policy minus baseline per window, with wins / ties / losses.
* :func:`batch_means`: the means of neighbouring windows. The intervals above treat windows
  as independent samples; disjoint windows cut side by side from a trace (a test range
  holding many) can be correlated, and over batch means they come nearer to independent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

__all__ = ["Interval", "PairedDifference", "batch_means", "mean_ci", "normalized_score",
           "paired_difference"]


@dataclass(frozen=True, slots=True)
class Interval:
    """A mean over ``n`` windows and its confidence interval [low, high] at ``level``."""

    mean: float
    low: float
    high: float
    n: int
    level: float = 0.95

    def __str__(self) -> str:
        return f"{self.mean:.3f} [{self.low:.3f}, {self.high:.3f}]"


@dataclass(frozen=True, slots=True)
class PairedDifference:
    """Policy minus baseline over the same windows."""

    difference: Interval
    wins: int
    ties: int
    losses: int

    @property
    def significant(self) -> bool:
        """Whether the interval excludes zero (above or below)."""
        return self.difference.low > 0 or self.difference.high < 0


def _values(x: object, name: str) -> np.ndarray:
    v = np.asarray(x, dtype=np.float64).reshape(-1)
    if len(v) == 0 or not np.isfinite(v).all():
        raise ValueError(f"{name}: expected one finite number per window, got {x!r}")
    return v


def mean_ci(values: object, level: float = 0.95) -> Interval:
    """The mean and its two-sided Student-t interval (NaN bounds with one window)."""
    if not 0 < level < 1:
        raise ValueError(f"level={level!r}: expected a probability in (0, 1)")
    v = _values(values, "values")
    n, mean = len(v), float(v.mean())
    if n < 2:
        return Interval(mean, math.nan, math.nan, n, level)
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * float(v.std(ddof=1)) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n, level)


def normalized_score(policy: object, random: object, best: object,
                     level: float = 0.95) -> Interval:
    """(P - random) / (best reference - random) over paired windows (see the module doc).

    Args:
        policy, random, best: one goodput per window, the same windows in the same order.
    """
    p, r, b = (_values(x, name) for x, name in ((policy, "policy"), (random, "random"),
                                                 (best, "best")))
    if not len(p) == len(r) == len(b):
        raise ValueError(f"normalized_score: {len(p)}, {len(r)} and {len(b)} windows; the "
                         "three must be scored on the same windows")
    spread = float(b.mean() - r.mean())
    if spread <= 0:
        raise ValueError(f"normalized_score: the best reference ({b.mean():g}) does not beat "
                         f"random actions ({r.mean():g}); the task does not separate policies")
    return mean_ci((p - r) / spread, level)


def paired_difference(policy: object, baseline: object, level: float = 0.95
                      ) -> PairedDifference:
    """Policy minus baseline per window: the mean difference's interval, wins/ties/losses."""
    p, b = _values(policy, "policy"), _values(baseline, "baseline")
    if len(p) != len(b):
        raise ValueError(f"paired_difference: {len(p)} and {len(b)} windows; a paired "
                         "comparison needs the same windows")
    d = p - b
    return PairedDifference(mean_ci(d, level), int((d > 0).sum()), int((d == 0).sum()),
                            int((d < 0).sum()))


def batch_means(values: object, size: int) -> np.ndarray:
    """The means of ``size`` neighbouring windows each, in order (the last ``len % size``
    windows dropped), for intervals over windows that are correlated with their neighbours.

    Raises:
        ValueError: ``size`` is not a positive integer, or leaves fewer than 2 batches (no
            interval).
    """
    if isinstance(size, bool) or not isinstance(size, int | np.integer) or size < 1:
        raise ValueError(f"batch_means: size={size!r}: expected a positive integer")
    v = _values(values, "values")
    n = len(v) // size
    if n < 2:
        raise ValueError(f"batch_means: {len(v)} windows make {n} batch(es) of {size}; an "
                         "interval needs at least 2")
    return v[: n * size].reshape(n, size).mean(axis=1)
