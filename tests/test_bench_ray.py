"""``cbgym bench --backend ray``: the same sweep as the process backend, on a local Ray."""

from __future__ import annotations

import pandas as pd
import pytest

from cbgym.bench import BenchConfig, run_bench

ray = pytest.importorskip("ray")

TINY = {"traces": ("synthetic-code",), "policies": ("fcfs", "cb-sjf-work", "random"),
        "loads": (0.8, 1.1), "windows": 2, "window_requests": 150, "capacity_sample": 150,
        "seeds": (0, 1), "workers": 2}
SAME = ["trace", "window", "window_start", "engine", "policy", "load", "seed",
        "capacity_rps", "offered_rps", "mean_norm_latency_ms", "p99_norm_latency_ms",
        "goodput_rps"]


def test_ray_backend_equals_the_process_backend() -> None:
    cfg = BenchConfig(**TINY)
    procs = run_bench(cfg, progress=False)
    rays = run_bench(cfg, progress=False, backend="ray")
    assert not ray.is_initialized()  # (the local cluster it started is shut down)
    key = ["trace", "window", "engine", "policy", "load", "seed"]
    a = procs.results[SAME].sort_values(key).reset_index(drop=True)
    b = rays.results[SAME].sort_values(key).reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    timing = [c for c in procs.table.columns if "wall" in c]  # (seconds: never equal)
    pd.testing.assert_frame_equal(procs.table.drop(columns=timing),
                                  rays.table.drop(columns=timing), check_exact=True)


def test_ray_backend_arguments_are_checked() -> None:
    cfg = BenchConfig(**TINY)
    with pytest.raises(ValueError, match="backend"):
        run_bench(cfg, progress=False, backend="dask")
    with pytest.raises(ValueError, match="address"):
        run_bench(cfg, progress=False, address="ray://x:10001")


def test_cli_ray_backend_writes_the_same_csv(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from cbgym.cli import main

    argv = ["bench", "--trace", "synthetic-code", "--policies", "fcfs,cb-sjf-work",
            "--loads", "0.8", "--windows", "2", "--window-requests", "150",
            "--capacity-sample", "150", "--workers", "2", "--quiet", "--no-plots"]
    assert main([*argv, "--out", str(tmp_path / "p")]) == 0
    assert main([*argv, "--backend", "ray", "--out", str(tmp_path / "r")]) == 0
    for name in ("results.csv", "summary.csv"):
        a, b = (pd.read_csv(tmp_path / d / name) for d in ("p", "r"))
        timing = [c for c in a.columns if "wall" in c]
        pd.testing.assert_frame_equal(a.drop(columns=timing), b.drop(columns=timing))
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main([*argv, "--address", "127.0.0.1:6379"])
    assert "--address: only with --backend ray" in capsys.readouterr().err


def test_a_joined_ray_runs_two_sweeps_on_one_worker() -> None:
    """A Ray this process started already is used and left running; its one worker holds a
    sweep's windows between tasks and swaps them for the next sweep's."""
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        for trace in ("synthetic-code", "synthetic-conv"):
            cfg = BenchConfig(**{**TINY, "traces": (trace,), "seeds": (0,)})
            key = ["trace", "window", "engine", "policy", "load", "seed"]
            a, b = (run_bench(cfg, progress=False, backend=k).results[SAME]
                    .sort_values(key).reset_index(drop=True) for k in ("process", "ray"))
            pd.testing.assert_frame_equal(a, b, check_exact=True)
            assert ray.is_initialized()
        with pytest.raises(ValueError, match="joined a Ray cluster already"):
            run_bench(BenchConfig(**TINY), progress=False, backend="ray",
                      address="127.0.0.1:6379")
    finally:
        ray.shutdown()
