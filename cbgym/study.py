"""The CB-SJF-Work study's metrics, as pure functions of simulation outputs.

Definitions (``shared/reference/paper-traces-disaggregation-fairness.md``):

* **Warm-up discard**: the first ``warmup`` fraction of a window's requests, in arrival order,
  is left out of every latency statistic (default 10%). The queue starts empty, so these
  requests see a lighter system than the offered load implies.
* **Normalised latency**: E2E latency / output tokens, in milliseconds per output token, over
  finished requests after the warm-up discard. The study's headline number is its mean.
* **Oracle gain recovered** by a policy P, over windows w:
  ``100 * mean_w(FCFS_w - P_w) / mean_w(FCFS_w - OracleWork_w)`` of mean normalised latency
  (a ratio of means, not a mean of per-window ratios). The study's headline averages it over
  the loads rho in {0.85, 0.92, 0.98}.
* **p99 ratio** to FCFS: ``mean_w(p99_P,w / p99_FCFS,w)`` of normalised latency (a mean of
  per-window ratios). The study's "p99 latency" is read as that of its headline metric,
  normalised latency; the E2E ratio is reported beside it.
* **Starvation count**: requests (after warm-up) whose waiting time before first being
  scheduled (``queue_s``) exceeds ``multiple`` x the FCFS median waiting time of the same
  window, load and seed. Not in the paper; it counts the tail that shortest-first strands.
  A parameter-free companion, ``starved_beyond_fcfs_max``, counts requests that waited
  longer than the longest FCFS wait of the same window: waits FCFS never imposes.
* **Marginal work share** of prefill: ``c_p Sum(x) / (c_p Sum(x) + c_d Sum(y))`` with the
  engine's work coefficients (:func:`cbgym.agents.work.work_coefficients`, which linearises a
  non-linear cost model at reference batches) and the trace's prompt (x) and output (y) tokens.
* **Simulated engine time share** of prefill: engine time spent on prefill over busy time,
  under FCFS. A prefill-only iteration counts entirely (its fixed cost included), a
  decode-only one not at all; a mixed iteration (chunked prefill) is split in proportion to
  the marginal costs ``c_p * prefill tokens : c_d * decode sequences``. The study's engine
  never mixes, so there the split is exact.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from cbgym.agents.work import work_coefficients
from cbgym.engine.config import EngineConfig

WARMUP = 0.1
STARVATION_MULTIPLE = 10.0
HEADLINE_LOADS = (0.85, 0.92, 0.98)
FCFS = "fcfs"
ORACLE_WORK = "oracle-work"
# One simulated window: policies are compared within such a group (common random numbers).
CELL_KEYS = ["trace", "engine", "load", "window", "seed"]
# One line of the study's table: aggregated over windows and seeds.
GROUP_KEYS = ["trace", "engine", "load", "policy"]


def after_warmup(requests: pd.DataFrame, warmup: float = WARMUP) -> pd.DataFrame:
    """The requests left after discarding the first ``warmup`` fraction by arrival.

    The cut is ``int(n * warmup)`` requests, as in :meth:`SimulationResult.summary`; a stable
    sort keeps request-id order among equal arrival times.
    """
    if not 0 <= warmup < 1:
        raise ValueError(f"warmup must be in [0, 1), got {warmup}")
    ordered = requests.sort_values("arrival_s", kind="stable")
    return ordered.iloc[int(len(ordered) * warmup):]


def normalised_latency_ms(requests: pd.DataFrame) -> np.ndarray:
    """E2E / output tokens in ms per token, for finished requests with at least one token."""
    ok = (requests["status"] == "finished") & (requests["output_tokens"] > 0)
    fin = requests[ok]
    return 1000.0 * (fin["e2e_s"] / fin["output_tokens"]).to_numpy(dtype=np.float64)


def latency_stats(requests: pd.DataFrame, warmup: float = WARMUP) -> dict[str, float]:
    """The study's per-window latency numbers after the warm-up discard.

    Mean and p99 normalised latency (ms/token), p99 E2E (s) and the longest wait before first
    being scheduled (s); NaN when no request finished.
    """
    kept = after_warmup(requests, warmup)
    norm = normalised_latency_ms(kept)
    e2e = kept["e2e_s"].to_numpy(dtype=np.float64)
    e2e = e2e[np.isfinite(e2e)]
    wait = kept["queue_s"].to_numpy(dtype=np.float64)
    wait = wait[np.isfinite(wait)]
    nan = float("nan")
    return {
        "mean_norm_latency_ms": float(norm.mean()) if norm.size else nan,
        "p99_norm_latency_ms": float(np.quantile(norm, 0.99)) if norm.size else nan,
        "p99_e2e_s": float(np.quantile(e2e, 0.99)) if e2e.size else nan,
        "max_queue_s": float(wait.max()) if wait.size else nan,
    }


def waiting_times(requests: pd.DataFrame, warmup: float = WARMUP) -> np.ndarray:
    """Sorted waiting times (``queue_s``) after warm-up of requests that were ever scheduled."""
    queue = after_warmup(requests, warmup)["queue_s"].to_numpy(dtype=np.float64)
    return np.sort(queue[np.isfinite(queue)])


def oracle_gain_recovered(fcfs: Sequence[float] | np.ndarray, policy: Sequence[float] | np.ndarray,
                          oracle: Sequence[float] | np.ndarray) -> float:
    """``100 * mean(fcfs - policy) / mean(fcfs - oracle)`` over aligned windows (percent).

    NaN when the oracle gains nothing (the ratio is undefined) or an input is empty.
    """
    f, p, o = (np.asarray(a, dtype=np.float64) for a in (fcfs, policy, oracle))
    if not (f.size and f.shape == p.shape == o.shape):
        return float("nan")
    denom = float(np.mean(f - o))
    if not np.isfinite(denom) or denom <= 0:
        return float("nan")
    return 100.0 * float(np.mean(f - p)) / denom


def p99_ratio(policy_p99: Sequence[float] | np.ndarray, fcfs_p99: Sequence[float] | np.ndarray
              ) -> float:
    """Mean over windows of ``p99_policy / p99_fcfs`` (NaN if empty or misaligned)."""
    p, f = np.asarray(policy_p99, dtype=np.float64), np.asarray(fcfs_p99, dtype=np.float64)
    if not (p.size and p.shape == f.shape):
        return float("nan")
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.mean(p / f))


def starvation_threshold(fcfs_waits: np.ndarray, multiple: float = STARVATION_MULTIPLE) -> float:
    """``multiple`` x the median FCFS waiting time (s) of the same window."""
    if multiple <= 0:
        raise ValueError(f"starvation multiple must be > 0, got {multiple}")
    waits = np.asarray(fcfs_waits, dtype=np.float64)
    return multiple * float(np.median(waits)) if waits.size else float("nan")


def starvation_count(waits: np.ndarray, threshold: float) -> int:
    """How many waiting times strictly exceed ``threshold`` (0 if the threshold is NaN)."""
    if not np.isfinite(threshold):
        return 0
    return int(np.count_nonzero(np.asarray(waits) > threshold))


def marginal_work_share(prompt_tokens: np.ndarray, output_tokens: np.ndarray,
                        engine: EngineConfig) -> float:
    """``c_p Sum(x) / (c_p Sum(x) + c_d Sum(y))``: prefill's share of marginal work."""
    coef = work_coefficients(engine)
    pre = coef.prefill_token_s * float(np.sum(prompt_tokens, dtype=np.float64))
    dec = coef.decode_seq_s * float(np.sum(output_tokens, dtype=np.float64))
    return pre / (pre + dec) if pre + dec > 0 else float("nan")


def prefill_engine_time(timeseries: pd.DataFrame, engine: EngineConfig) -> tuple[float, float]:
    """(engine seconds spent on prefill, busy seconds) of one run's iteration time series."""
    coef = work_coefficients(engine)
    prefill = timeseries["prefill_tokens"].to_numpy(dtype=np.float64)
    decode = timeseries["decode_seqs"].to_numpy(dtype=np.float64)
    duration = timeseries["duration_s"].to_numpy(dtype=np.float64)
    p_cost, d_cost = coef.prefill_token_s * prefill, coef.decode_seq_s * decode
    total = p_cost + d_cost
    # Pure iterations go wholly to their phase; a mixed one is split by marginal cost.
    frac = np.where(prefill > 0, 1.0, 0.0)
    mixed = (prefill > 0) & (decode > 0) & (total > 0)
    frac[mixed] = p_cost[mixed] / total[mixed]
    return float(np.sum(duration * frac)), float(np.sum(duration))


def add_relative_metrics(results: pd.DataFrame, waits: Sequence[np.ndarray] | None = None,
                         multiple: float = STARVATION_MULTIPLE) -> pd.DataFrame:
    """Per-row comparisons with FCFS and Oracle-Work of the same window, load and seed.

    Adds ``oracle_gain_recovered_pct`` (this window alone), ``p99_ratio`` (normalised latency),
    ``p99_e2e_ratio``, ``starvation_threshold_s``, ``starvation_count`` and
    ``starved_beyond_fcfs_max``; NaN where the sweep lacks the FCFS (or, for the gain,
    Oracle-Work) run of the window.

    Args:
        results: one row per run with :data:`CELL_KEYS`, ``policy``, ``mean_norm_latency_ms``,
            ``p99_norm_latency_ms`` and ``p99_e2e_s``.
        waits: per row (same order as ``results``), the waiting times from
            :func:`waiting_times`; without them the starvation columns are NaN.
        multiple: the starvation threshold as a multiple of the FCFS median wait.
    """
    out = results.reset_index(drop=True).copy()
    keyed = out.set_index(CELL_KEYS)
    base = _policy_rows(out, FCFS)
    oracle = _policy_rows(out, ORACLE_WORK)
    f_mean = _lookup(keyed, base, "mean_norm_latency_ms")
    o_mean = _lookup(keyed, oracle, "mean_norm_latency_ms")
    with np.errstate(divide="ignore", invalid="ignore"):
        gain = 100.0 * (f_mean - out["mean_norm_latency_ms"].to_numpy()) / (f_mean - o_mean)
        out["oracle_gain_recovered_pct"] = np.where(f_mean - o_mean > 0, gain, np.nan)
        out["p99_ratio"] = out["p99_norm_latency_ms"].to_numpy() / _lookup(
            keyed, base, "p99_norm_latency_ms")
        out["p99_e2e_ratio"] = out["p99_e2e_s"].to_numpy() / _lookup(keyed, base, "p99_e2e_s")
    for col in ("starvation_threshold_s", "starvation_count", "starved_beyond_fcfs_max"):
        out[col] = np.nan
    if waits is not None:
        _add_starvation(out, list(waits), multiple)
    return out


def _policy_rows(results: pd.DataFrame, policy: str) -> pd.DataFrame:
    rows = results[results["policy"] == policy]
    return rows.drop_duplicates(CELL_KEYS).set_index(CELL_KEYS)


def _lookup(keyed: pd.DataFrame, reference: pd.DataFrame, column: str) -> np.ndarray:
    """``reference[column]`` aligned to every row of ``keyed`` (NaN where missing)."""
    return reference[column].reindex(keyed.index).to_numpy(dtype=np.float64)


def _add_starvation(out: pd.DataFrame, waits: list[np.ndarray], multiple: float) -> None:
    if len(waits) != len(out):
        raise ValueError(f"waits has {len(waits)} entries for {len(out)} result rows")
    keys = list(out[CELL_KEYS].itertuples(index=False, name=None))
    fcfs: dict[tuple, np.ndarray] = {}
    for i, key in enumerate(keys):
        if out.at[i, "policy"] == FCFS:
            fcfs.setdefault(key, np.asarray(waits[i], dtype=np.float64))
    for i, key in enumerate(keys):
        if key not in fcfs:
            continue
        threshold = starvation_threshold(fcfs[key], multiple)
        longest = float(fcfs[key].max()) if fcfs[key].size else float("nan")
        out.at[i, "starvation_threshold_s"] = threshold
        out.at[i, "starvation_count"] = starvation_count(waits[i], threshold)
        out.at[i, "starved_beyond_fcfs_max"] = starvation_count(waits[i], longest)


def aggregate(results: pd.DataFrame) -> pd.DataFrame:
    """The study's table: one row per trace, engine, load and policy, over windows and seeds.

    Means over windows of the per-window numbers, except ``oracle_gain_recovered_pct``: a
    ratio of the means of FCFS, the policy and Oracle-Work over the same windows.
    """
    cols = {c: "mean" for c in (
        "mean_norm_latency_ms", "p99_norm_latency_ms", "p99_ratio", "p99_e2e_ratio",
        "starvation_count", "starved_beyond_fcfs_max", "max_queue_s", "goodput_rps",
        "slo_attainment", "num_shed", "throughput_rps", "capacity_rps",
        "offered_rps", "rho", "ttft_p50", "ttft_p99", "queue_p99", "itl_mean", "itl_p50",
        "itl_p99", "num_preemptions", "wall_seconds",
    ) if c in results}
    agg = results.groupby(GROUP_KEYS, sort=True).agg(cols)
    agg.insert(0, "runs", results.groupby(GROUP_KEYS, sort=True).size())
    agg["oracle_gain_recovered_pct"] = [
        _group_gain(results, key) for key in agg.index
    ]
    return agg.reset_index()


def _group_gain(results: pd.DataFrame, key: tuple) -> float:
    trace, engine, load, policy = key
    same = results[(results["trace"] == trace) & (results["engine"] == engine)
                   & (results["load"] == load)]

    def means(name: str) -> pd.Series:
        rows = same[same["policy"] == name].drop_duplicates(["window", "seed"])
        return rows.set_index(["window", "seed"])["mean_norm_latency_ms"]

    pol, base, oracle = means(policy), means(FCFS), means(ORACLE_WORK)
    common = pol.index.intersection(base.index).intersection(oracle.index)
    return oracle_gain_recovered(base[common].to_numpy(), pol[common].to_numpy(),
                                 oracle[common].to_numpy())


def headline_gain(table: pd.DataFrame, loads: Iterable[float] = HEADLINE_LOADS) -> pd.DataFrame:
    """The study's headline: oracle gain recovered averaged over ``loads`` (those present).

    Args:
        table: the output of :func:`aggregate`.
        loads: the offered loads to average over (the study: 0.85, 0.92, 0.98).

    Returns:
        One row per trace, engine and policy: ``headline_gain_pct`` and the loads used.
    """
    wanted = np.asarray(list(loads), dtype=np.float64)
    near = np.isclose(table["load"].to_numpy()[:, None], wanted[None, :]).any(axis=1)
    rows = table[near]
    grouped = rows.groupby(["trace", "engine", "policy"], sort=True)
    out = grouped["oracle_gain_recovered_pct"].mean().rename("headline_gain_pct").to_frame()
    out["loads"] = grouped["load"].apply(lambda s: ",".join(f"{v:g}" for v in sorted(s)))
    return out.reset_index()


__all__ = [
    "CELL_KEYS", "FCFS", "GROUP_KEYS", "HEADLINE_LOADS", "ORACLE_WORK", "STARVATION_MULTIPLE",
    "WARMUP", "add_relative_metrics", "after_warmup", "aggregate", "headline_gain",
    "latency_stats", "marginal_work_share", "normalised_latency_ms", "oracle_gain_recovered",
    "p99_ratio", "prefill_engine_time", "starvation_count", "starvation_threshold",
    "waiting_times",
]
