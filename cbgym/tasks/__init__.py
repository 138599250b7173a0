"""Benchmark tasks and how their results are scored.

:mod:`cbgym.tasks.scoring` computes what a benchmark reports over a task's test windows:
means with confidence intervals, normalized scores and paired differences.
"""

from cbgym.tasks.scoring import (
    Interval,
    PairedDifference,
    mean_ci,
    normalized_score,
    paired_difference,
)

__all__ = ["Interval", "PairedDifference", "mean_ci", "normalized_score", "paired_difference"]
