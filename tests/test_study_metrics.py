"""The study's metric definitions (cbgym.study) on hand-made results."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from cbgym import study
from cbgym.agents.work import work_coefficients
from cbgym.engine.config import EngineConfig
from cbgym.metrics import SLO, SimulationResult, timeseries_frame


def requests(arrival: list[float], e2e: list[float], output: list[int],
             queue: list[float] | None = None, status: list[str] | None = None) -> pd.DataFrame:
    """A per-request frame with the columns SimulationResult.requests has."""
    n = len(arrival)
    arr = np.asarray(arrival, dtype=float)
    e2e_a = np.asarray(e2e, dtype=float)
    frame = pd.DataFrame({
        "arrival_s": arr, "prompt_tokens": np.full(n, 100), "output_tokens": output,
        "tenant": np.zeros(n, int), "slo_class": np.zeros(n, int),
        "first_scheduled_s": arr + np.asarray(queue if queue else [0.0] * n),
        "first_token_s": arr + 0.1, "finish_s": arr + e2e_a, "ttft_s": np.full(n, 0.1),
        "tpot_s": np.full(n, 0.01), "e2e_s": e2e_a,
        "queue_s": np.asarray(queue if queue else [0.0] * n, dtype=float),
        "preemptions": np.zeros(n, int), "status": status or ["finished"] * n,
        "reason": [""] * n,
    })
    frame.index.name = "request_id"
    return frame


def test_warmup_discards_the_earliest_arrivals_whatever_the_row_order() -> None:
    frame = requests(arrival=[float(i) for i in range(10)], e2e=[1.0] * 10, output=[1] * 10)
    shuffled = frame.iloc[[3, 0, 9, 1, 2, 4, 5, 6, 7, 8]]
    kept = study.after_warmup(shuffled, 0.1)
    assert len(kept) == 9 and 0.0 not in kept["arrival_s"].to_list()
    assert len(study.after_warmup(frame, 0.0)) == 10
    assert len(study.after_warmup(frame, 0.25)) == 8  # int(10 * 0.25) = 2 dropped
    with pytest.raises(ValueError, match="warmup"):
        study.after_warmup(frame, 1.0)


def test_mean_normalised_latency_is_ms_per_output_token_after_warmup() -> None:
    # request 0 (dropped by warm-up) would dominate: 100 s for one token
    frame = requests(arrival=[0, 1, 2, 3, 4, 5, 6, 7, 8, 9],
                     e2e=[100, 1, 2, 3, 4, 5, 6, 7, 8, 9], output=[1, 10, 10, 10, 10, 10, 10,
                                                                  10, 10, 10])
    stats = study.latency_stats(frame, 0.1)
    assert stats["mean_norm_latency_ms"] == pytest.approx(1000 * np.mean(np.arange(1, 10) / 10))
    assert stats["max_queue_s"] == 0.0


def test_unfinished_requests_are_left_out_of_normalised_latency() -> None:
    frame = requests(arrival=[0, 1], e2e=[1.0, np.nan], output=[4, 4],
                     status=["finished", "shed"])
    np.testing.assert_allclose(study.normalised_latency_ms(frame), [250.0])


def test_latency_stats_agree_with_simulation_result_summary() -> None:
    rng = np.random.default_rng(1)
    frame = requests(arrival=list(np.sort(rng.uniform(0, 50, 40))),
                     e2e=list(rng.uniform(0.5, 9, 40)), output=list(rng.integers(1, 300, 40)))
    res = SimulationResult(frame, timeseries_frame(np.empty((0, 10)), 10), None, None, SLO())
    summary = res.summary(warmup=0.1)
    stats = study.latency_stats(frame, 0.1)
    assert stats["mean_norm_latency_ms"] == pytest.approx(1000 * summary["norm_latency_mean"])
    assert stats["p99_norm_latency_ms"] == pytest.approx(1000 * summary["norm_latency_p99"])


def test_oracle_gain_recovered_is_a_ratio_of_window_means() -> None:
    fcfs, policy, oracle = [10.0, 20.0], [6.0, 14.0], [5.0, 10.0]
    # (4 + 6) / 2 over (5 + 10) / 2 = 66.7 %, not the mean of 80 % and 60 %
    assert study.oracle_gain_recovered(fcfs, policy, oracle) == pytest.approx(200 / 3)
    assert study.oracle_gain_recovered(fcfs, fcfs, oracle) == 0.0
    assert study.oracle_gain_recovered(fcfs, oracle, oracle) == pytest.approx(100.0)
    assert np.isnan(study.oracle_gain_recovered(fcfs, policy, fcfs))  # oracle gains nothing
    assert np.isnan(study.oracle_gain_recovered([], [], []))


def test_p99_ratio_is_a_mean_of_window_ratios() -> None:
    assert study.p99_ratio([2.0, 6.0], [1.0, 2.0]) == pytest.approx(2.5)
    assert np.isnan(study.p99_ratio([1.0], [1.0, 2.0]))


def test_starvation_counts_waits_strictly_above_multiple_of_fcfs_median() -> None:
    fcfs_waits = np.array([1.0, 2.0, 3.0, 4.0, 100.0])
    threshold = study.starvation_threshold(fcfs_waits, multiple=10)
    assert threshold == 30.0
    assert study.starvation_count(np.array([0.0, 30.0, 30.5, 500.0]), threshold) == 2
    assert study.starvation_count(np.array([50.0]), float("nan")) == 0
    with pytest.raises(ValueError, match="multiple"):
        study.starvation_threshold(fcfs_waits, multiple=0)


def results_frame() -> pd.DataFrame:
    """Two windows x three policies at one load, plus a window without FCFS."""
    rows = []
    for window, (f, c, o) in enumerate([(10.0, 6.0, 5.0), (20.0, 14.0, 10.0)]):
        for policy, mean, p99 in (("fcfs", f, 2 * f), ("cb-sjf-work", c, 4 * f),
                                  ("oracle-work", o, 3 * f)):
            rows.append({"trace": "t", "engine": "e", "load": 0.9, "window": window,
                         "seed": 0, "policy": policy, "mean_norm_latency_ms": mean,
                         "p99_norm_latency_ms": p99, "p99_e2e_s": p99 / 10})
    rows.append({"trace": "t", "engine": "e", "load": 0.5, "window": 0, "seed": 0,
                 "policy": "cb-sjf-work", "mean_norm_latency_ms": 1.0,
                 "p99_norm_latency_ms": 1.0, "p99_e2e_s": 1.0})
    return pd.DataFrame(rows)


def test_relative_metrics_compare_each_row_with_fcfs_of_the_same_window() -> None:
    frame = results_frame()
    waits = [np.array([1.0, 2.0, 3.0])] * 6 + [np.array([99.0])]
    waits[1] = np.array([0.0, 25.0, 31.0])  # cb-sjf-work, window 0: threshold 10 x 2 = 20
    out = study.add_relative_metrics(frame, waits, multiple=10)
    cb0 = out[(out["policy"] == "cb-sjf-work") & (out["window"] == 0) & (out["load"] == 0.9)]
    assert cb0["oracle_gain_recovered_pct"].item() == pytest.approx(80.0)
    assert cb0["p99_ratio"].item() == pytest.approx(2.0)
    assert cb0["starvation_threshold_s"].item() == pytest.approx(20.0)
    assert cb0["starvation_count"].item() == 2
    assert cb0["starved_beyond_fcfs_max"].item() == 2  # FCFS's longest wait is 3 s
    lone = out[out["load"] == 0.5]
    unmatched = lone[["oracle_gain_recovered_pct", "p99_ratio", "starvation_count"]]
    assert unmatched.isna().to_numpy().all()


def test_aggregate_uses_ratio_of_means_for_gain_and_mean_of_ratios_for_p99() -> None:
    out = study.add_relative_metrics(results_frame())
    table = study.aggregate(out).set_index(["load", "policy"])
    cb = table.loc[(0.9, "cb-sjf-work")]
    assert cb["runs"] == 2
    assert cb["mean_norm_latency_ms"] == pytest.approx(10.0)
    assert cb["oracle_gain_recovered_pct"] == pytest.approx(200 / 3)
    assert cb["p99_ratio"] == pytest.approx(2.0)
    assert table.loc[(0.9, "fcfs"), "oracle_gain_recovered_pct"] == 0.0
    assert np.isnan(table.loc[(0.5, "cb-sjf-work"), "oracle_gain_recovered_pct"])


def test_headline_averages_the_gain_over_the_headline_loads_present() -> None:
    table = pd.DataFrame({
        "trace": "t", "engine": "e", "policy": "cb-sjf-work",
        "load": [0.6, 0.85, 0.92, 0.98], "oracle_gain_recovered_pct": [0.0, 80.0, 90.0, 100.0],
    })
    head = study.headline_gain(table)
    assert head["headline_gain_pct"].item() == pytest.approx(90.0)
    assert head["loads"].item() == "0.85,0.92,0.98"


def test_marginal_work_share_uses_the_engine_work_coefficients() -> None:
    paper = EngineConfig(preset="cbsjf-paper")
    prompt, output = np.array([1000, 2000]), np.array([100, 300])
    expected = 0.28 * 3000 / (0.28 * 3000 + 0.42 * 400)
    assert study.marginal_work_share(prompt, output, paper) == pytest.approx(expected)
    roofline = EngineConfig(preset="llama-2-13b/a100-80gb")
    coef = work_coefficients(roofline)
    pre, dec = coef.prefill_token_s * 3000, coef.decode_seq_s * 400
    assert study.marginal_work_share(prompt, output, roofline) == pytest.approx(pre / (pre + dec))


def test_engine_time_splits_mixed_iterations_by_marginal_cost() -> None:
    paper = EngineConfig(preset="cbsjf-paper")
    ts = pd.DataFrame({"duration_s": [1.0, 0.5, 2.0, 0.25],
                       "prefill_tokens": [500, 0, 100, 0], "decode_seqs": [0, 8, 10, 0]})
    prefill, busy = study.prefill_engine_time(ts, paper)
    mixed = 0.28 * 100 / (0.28 * 100 + 0.42 * 10)
    assert busy == pytest.approx(3.75)
    assert prefill == pytest.approx(1.0 + 2.0 * mixed)
