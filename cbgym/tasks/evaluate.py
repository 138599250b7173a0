"""Run a policy on a task's test windows and score it against the task's references.

:func:`evaluate` replays each test window (the task's test load, scaled with the capacity
measured once on the whole trace, as the study does) under the policy, under random actions
on the env (the env's action space with its default decoding, seeded per window), and under
every reference policy, all on the same windows (common random numbers). It reports goodput
(requests of a window meeting both SLOs), SLO attainment and p99 TTFT per policy, the
normalized score (0 = random actions, 1 = the best reference) with its 95% interval, and the
paired difference against each reference.

    from cbgym.tasks.evaluate import evaluate
    ev = evaluate("conv-study-overload", "cb-sjf-work")
    print(ev.table)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from cbgym.tasks.registry import Task, get
from cbgym.tasks.scoring import (
    Interval,
    PairedDifference,
    batch_means,
    mean_ci,
    normalized_score,
    paired_difference,
)

if TYPE_CHECKING:
    from cbgym.workload.trace import Trace

__all__ = ["REFERENCES", "Evaluation", "evaluate", "play_windows"]

# the baselines every task is scored against; the best of them is the normalizing reference
REFERENCES = ("fcfs", "sjf-ctx", "cb-sjf-work", "cb-sjf-work-aging:0.5", "slo-edf",
              "cb-sjf-work-shed", "cb-sjf-work-fit", "oracle-work", "oracle-sjf")
RANDOM = "random actions"


@dataclass
class Evaluation:
    """Per-window results on a task's test windows, and the scored table."""

    task: Task
    policy: str
    starts: list[int]  # the test windows' first requests (each replayed once per seed)
    goodput: dict[str, np.ndarray]  # per policy (the evaluated one, references, random) and
    # window, the mean over the seeds
    attainment: dict[str, np.ndarray]
    ttft_p99: dict[str, np.ndarray]

    @property
    def best_reference(self) -> str:
        refs = [p for p in self.goodput if p not in (self.policy, RANDOM)]
        return max(refs, key=lambda p: self.goodput[p].mean())

    @property
    def best_heuristic(self) -> str:
        """The best content-blind (not privileged) reference: the bar a learned policy must
        clear."""
        from cbgym.agents import POLICIES

        refs = [p for p in self.goodput if p not in (self.policy, RANDOM)
                and not POLICIES[p.partition(":")[0]].privileged]
        if not refs:
            raise ValueError("evaluate: no content-blind reference was run")
        return max(refs, key=lambda p: self.goodput[p].mean())

    @property
    def random_share(self) -> float:
        """Random actions' mean goodput over the best reference's: whether decisions matter
        on the task (docs/benchmark.md asks for at most 0.8)."""
        return float(self.goodput[RANDOM].mean() / self.goodput[self.best_reference].mean())

    def versus(self, baseline: str, batch: int = 1) -> PairedDifference:
        """The evaluated policy minus ``baseline``, per window; with ``batch`` > 1 over the
        means of ``batch`` neighbouring windows (:func:`~cbgym.tasks.scoring.batch_means`:
        where neighbouring test windows are correlated; wins count batches)."""
        a, b = self.goodput[self.policy], self.goodput[baseline]
        # (1.0 and True equal 1 but are no window counts: batch_means refuses them)
        if batch != 1 or type(batch) is not int:
            a, b = batch_means(a, batch), batch_means(b, batch)
        return paired_difference(a, b)

    def score(self, policy: str | None = None) -> Interval:
        """The normalized score of ``policy`` (default: the evaluated one)."""
        return normalized_score(self.goodput[policy or self.policy], self.goodput[RANDOM],
                                self.goodput[self.best_reference])

    @property
    def table(self) -> pd.DataFrame:
        """One row per policy: goodput and its interval, SLO attainment, p99 TTFT, the
        normalized score and its interval, and the paired difference to the evaluated one."""
        rows = []
        for name, good in self.goodput.items():
            g, s = mean_ci(good), self.score(name)
            d = paired_difference(self.goodput[self.policy], good)
            rows.append({"policy": name, "goodput": g.mean, "goodput_low": g.low,
                         "goodput_high": g.high,
                         "slo_attainment": float(self.attainment[name].mean()),
                         "ttft_p99_s": float(np.nanmean(self.ttft_p99[name])),
                         "score": s.mean, "score_low": s.low, "score_high": s.high,
                         "diff_vs": d.difference.mean, "diff_low": d.difference.low,
                         "diff_high": d.difference.high, "wins": d.wins, "ties": d.ties,
                         "losses": d.losses})
        return pd.DataFrame(rows).set_index("policy")


def evaluate(task: str | Task, policy: str, references: tuple[str, ...] | None = None,
             seeds: tuple[int, ...] = (0,), split: str = "test",
             trace: Trace | None = None) -> Evaluation:
    """Score ``policy`` (a spec: ``cbgym.agents.POLICIES``, ``learned:PATH``) on the task.

    Every seed replays every test window (seeding randomised policies and random actions);
    each window's result is its mean over the seeds. ``references``: by default
    :data:`REFERENCES` and the task's own (``Task.references``). ``split="validation"``
    replays the validation range's windows instead (``Task.validation_windows``, by default
    as many as the test's), at the test load: what task design and tuning use, so that the
    test windows stay unseen. ``trace``: play the task on another trace (its capacity
    measured as the task's, the task's split rule applied to it), e.g. later days of a drawn
    trace that the task never saw (``benchmarks/bench_servegen_days.py``)."""
    if not seeds:
        raise ValueError("evaluate: give at least one seed")
    from cbgym.capacity import measure_capacity
    from cbgym.workload import load_trace

    t = task if isinstance(task, Task) else get(task)
    if references is None:
        references = (*REFERENCES, *t.references)
    if trace is None:
        trace = load_trace(t.trace)
    if split not in ("test", "validation"):
        raise ValueError(f"evaluate: split={split!r}: expected 'test' or 'validation'")
    engine = t.engine_config()
    mu = measure_capacity(trace, engine)  # once per trace: load is relative to it
    starts = t.starts(len(trace), split)
    runs: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
    for seed in seeds:
        for name in dict.fromkeys((policy, *references)):
            runs.setdefault(name, []).append(play_windows(t, name, trace, starts, engine, mu,
                                                          seed))
        runs.setdefault(RANDOM, []).append(_random_actions(t, trace, starts, mu, seed,
                                                           split))
    # windows are the independent samples: a window's result is its mean over the seeds
    # (a deterministic policy repeats itself exactly; counting each seed again would narrow
    # the intervals and double the wins and losses)
    results = {k: tuple(np.stack(parts).mean(axis=0) for parts in zip(*v, strict=True))
               for k, v in runs.items()}
    return Evaluation(t, policy, starts, {k: v[0] for k, v in results.items()},
                      {k: v[1] for k, v in results.items()},
                      {k: v[2] for k, v in results.items()})


def play_windows(t: Task, policy: str, trace: object, starts: list[int], engine: object,
                 mu: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``policy`` (a spec) on ``trace``'s windows from ``starts`` at the task's test load
    (``mu``: the trace's capacity, requests/s): goodput, SLO attainment and p99 TTFT per
    window (:func:`window_rows`)."""
    from cbgym.simulate import simulate

    return window_rows(simulate(trace.window(start, t.episode_requests),  # type: ignore
                                policy, engine, load=t.test_load, seed=seed, slo=t.slo,
                                capacity_rps=mu).summary() for start in starts)


def window_rows(summaries: Iterable[dict[str, float]]) -> tuple[np.ndarray, np.ndarray,
                                                                np.ndarray]:
    """(goodput, SLO attainment, p99 TTFT) per window, from each window run's summary (a
    run with a client model counts its offered requests good as their clients see them)."""
    good, att, p99 = [], [], []
    for s in summaries:
        att.append(s["slo_attainment"])
        good.append(s["good"] if "good" in s else round(s["slo_attainment"] * s["num_requests"]))
        p99.append(s["ttft_p99"])
    return np.array(good, float), np.array(att), np.array(p99)


def _random_actions(t: Task, trace: object, starts: list[int], mu: float, seed: int,
                    split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    from cbgym.env.scheduling_env import SchedulingEnv

    n = len(trace)  # type: ignore[arg-type]
    env = SchedulingEnv(**{**t.env_kwargs(n, split), "trace": trace, "capacity_rps": mu})
    good, att, p99 = [], [], []
    for k, start in enumerate(starts):
        env.reset(seed=seed + k, options={"start": start, "load": t.test_load})
        env.action_space.seed(seed + k)
        done = False
        while not done:
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            done = terminated or truncated
        s = env.episode_result().summary()
        att.append(s["slo_attainment"])
        good.append(round(s["slo_attainment"] * s["num_requests"]))
        p99.append(s["ttft_p99"])
    return np.array(good, float), np.array(att), np.array(p99)
