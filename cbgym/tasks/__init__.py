"""Benchmark tasks and how their results are scored.

``cbgym.tasks.TASKS`` and ``cbgym.tasks.get(name)`` are the named tasks
(:mod:`cbgym.tasks.registry`: trace, load, engine, SLO, disjoint splits, env ids);
:mod:`cbgym.tasks.scoring` computes what a benchmark reports over a task's test windows:
means with confidence intervals, normalized scores and paired differences.
"""

from cbgym.tasks.registry import DEFAULT_TASK, TASKS, Task, get
from cbgym.tasks.scoring import (
    Interval,
    PairedDifference,
    batch_means,
    mean_ci,
    normalized_score,
    paired_difference,
)

__all__ = ["DEFAULT_TASK", "TASKS", "Interval", "PairedDifference", "Task", "batch_means", "get",
           "mean_ci", "normalized_score", "paired_difference"]
