"""The CB-SJF-Work study's content-blind features of a request, taken when it arrives.

The study predicts each request's output length from metadata a privacy-respecting front end
has, never from the prompt (its ``src/features.py``; ``../shared/reference/
paper-traces-disaggregation-fairness.md``):

======  ======================  ===========================================================
index   name                    value at the request's arrival
======  ======================  ===========================================================
0       context_tokens          its prompt length x
1       log_context_tokens      log(1 + x)
2       is_code                 1 on a code trace, 0 on a conversation trace (per trace)
3       hour_of_day             UTC hour of its recorded arrival (NaN when the trace has
                                no wall clock: the predictor's training median)
4       day_of_week             UTC weekday of its recorded arrival, Monday 0 (likewise)
5       inter_arrival_s         seconds since the previous arrival (the run's clock)
6       recent_arrival_rate     requests/s over the previous 512 inter-arrival gaps
7       recent_mean_output      mean output length of the last 512 requests completed
                                before it arrived
8       recent_p90_output       their 90th percentile (linear, as pandas' ``quantile``)
======  ======================  ===========================================================

Statistics over fewer than 8 values are NaN (the study's ``min_periods=8``), filled by the
predictor with its training medians. The study rolls over the previous 512 *arrivals* in
the trace's order (outputs of the fleet's earlier requests); here only requests that have
completed count, in this run, so a request's features never depend on an output not yet
produced (tests/test_predictor.py changes the lengths of unfinished requests and checks).
The study also uses the recent mean context length; the issue that specified this
predictor (cbgym #16) leaves it out, and so does this module.

:func:`arrival_features` serves the predictor's training (on a whole run), the policies
(each request once, at the first decision point that sees it) and the env's observation
(``arrival_features=True``: :mod:`cbgym.env.arrival_obs`): one computation. Values are
rounded to float32, the observation's precision.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

FEATURES = ("context_tokens", "log_context_tokens", "is_code", "hour_of_day", "day_of_week",
            "inter_arrival_s", "recent_arrival_rate", "recent_mean_output",
            "recent_p90_output")
WINDOW = 512  # the study's RECENT_WINDOW
MIN_PERIODS = 8  # the study's min_periods


def is_code_trace(name: str) -> bool:
    """Whether trace ``name`` (a catalogue name or a file, load-scaled or not) is a code
    workload (the study's ``workload_is_code``): "code" in its file or catalogue name."""
    return "code" in Path(name.partition("@")[0].strip()).name.lower()


def arrival_features(ids: np.ndarray, arrival_s: np.ndarray, prompt: np.ndarray,
                     clock_s: np.ndarray | None, is_code: bool, done_finish_s: np.ndarray,
                     done_output: np.ndarray) -> np.ndarray:
    """The features (rows, columns as :data:`FEATURES`) of requests ``ids`` at their arrival.

    Args:
        ids: the requests, indices into the per-request columns.
        arrival_s: every request's arrival in the run's clock, in arrival order.
        prompt: every request's prompt length.
        clock_s: every request's recorded wall-clock arrival (Unix seconds, UTC), or None.
        is_code: the trace's workload flag.
        done_finish_s: completion times of the requests completed so far, non-decreasing
            (completion order).
        done_output: their output lengths (known: they completed), aligned.
    """
    ids = np.asarray(ids, np.int64)
    X = np.empty((len(ids), len(FEATURES)))
    x = prompt[ids].astype(np.float64)
    X[:, 0], X[:, 1], X[:, 2] = x, np.log1p(x), float(is_code)
    if clock_s is None:
        X[:, 3] = X[:, 4] = np.nan
    else:
        t = np.asarray(clock_s, np.float64)[ids]
        X[:, 3] = np.floor(t / 3600.0) % 24
        X[:, 4] = (np.floor(t / 86400.0) + 3) % 7  # 1970-01-01 was a Thursday (3)
    a = np.asarray(arrival_s, np.float64)
    prev = np.maximum(ids - 1, 0)
    X[:, 5] = np.where(ids > 0, a[ids] - a[prev], np.nan)
    # the rate over the gaps before this arrival's own: previous 512 (study: shift(1))
    gaps = np.clip(ids - 1, 0, WINDOW)
    span = a[prev] - a[np.maximum(prev - gaps, 0)]
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(span > 0, gaps / span, np.nan)
    X[:, 6] = np.where(gaps >= MIN_PERIODS, rate, np.nan)
    k = np.searchsorted(done_finish_s, a[ids], side="right")  # completed by the arrival
    out = np.asarray(done_output, np.float64)
    for r, end in enumerate(k):
        if end < MIN_PERIODS:
            X[r, 7] = X[r, 8] = np.nan
            continue
        last = out[max(end - WINDOW, 0):end]
        X[r, 7], X[r, 8] = last.mean(), np.percentile(last, 90.0)
    # float32 values: the env's observation (float32) carries them exactly, so a policy
    # predicts the same from it as from the engine (cbgym.env.arrival_obs)
    return X.astype(np.float32).astype(np.float64)


def completions(finished: np.ndarray, finish_s: np.ndarray, generated: np.ndarray,
                earliest: float) -> tuple[np.ndarray, np.ndarray]:
    """The completions :func:`arrival_features` needs for arrivals at or after ``earliest``:
    from ``finished`` (ids in completion order, times non-decreasing), those from the last
    :data:`WINDOW` before ``earliest`` on, as (times, output lengths), ties in time by id as
    :func:`run_features` orders them. Only the tail is sorted: a call costs what it reads."""
    t = finish_s[finished]
    start = max(int(np.searchsorted(t, earliest, side="left")) - WINDOW, 0)
    while start > 0 and t[start - 1] == t[start]:  # (a tie block is never split)
        start -= 1
    tail = finished[start:]
    tail = tail[np.lexsort((tail, finish_s[tail]))]
    return finish_s[tail], generated[tail]


def run_features(arrival_s: np.ndarray, prompt: np.ndarray, output: np.ndarray,
                 finish_s: np.ndarray, finished: np.ndarray, clock_s: np.ndarray | None,
                 is_code: bool) -> np.ndarray:
    """Every request's :func:`arrival_features` in a finished run (``finished``: a mask of
    the requests that completed, at ``finish_s``): how a predictor's training rows are made."""
    done = np.flatnonzero(finished)
    order = done[np.argsort(finish_s[done], kind="stable")]
    return arrival_features(np.arange(len(arrival_s)), arrival_s, prompt, clock_s, is_code,
                            finish_s[order], output[order])


__all__ = ["FEATURES", "WINDOW", "arrival_features", "completions", "is_code_trace",
           "run_features"]
