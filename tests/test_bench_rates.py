"""cbgym bench by request rate (vLLM's benchmark's --request-rate / --burstiness), a saved
sweep read back (``--from``), and the pooled inter-token latencies in its rows."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cbgym.bench import (
    BenchConfig,
    format_table,
    read_outputs,
    run_bench,
    run_cell,
    write_outputs,
)
from cbgym.bench_cells import CellSettings, _init_worker
from cbgym.cli import main
from cbgym.simulate import simulate
from cbgym.workload import load_trace

RATES = dict(traces=("synthetic-code",), policies=("fcfs", "oracle-work"), loads=(),
             request_rates=(0.5, 1.5), burstiness=0.5, windows=1, window_requests=200,
             capacity_sample=200, seeds=(0, 1), engines=("llama-2-7b/a100-80gb",))


@pytest.fixture(scope="module")
def rate_sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    result = run_bench(BenchConfig(**RATES, workers=1), progress=False)
    out = tmp_path_factory.mktemp("rates")
    write_outputs(result, out)
    return out, result


def test_a_rate_sweep_sends_each_window_as_vllms_benchmark(rate_sweep: tuple) -> None:
    """Each cell is ``simulate(window, request_rate=r, burstiness=b, seed=s)``: its row
    equals that run's summary, its ``load`` is the rate, ``rho`` the rate over mu."""
    _, result = rate_sweep
    res = result.results
    assert sorted(res["load"].unique()) == [0.5, 1.5]
    assert (res["offered_rps"] == res["load"]).all()
    np.testing.assert_allclose(res["rho"], res["load"] / res["capacity_rps"])
    row = res[(res["policy"] == "fcfs") & (res["load"] == 1.5) & (res["seed"] == 1)].iloc[0]
    window = load_trace("synthetic-code").window(0, 200)
    alone = simulate(window, "fcfs", "llama-2-7b/a100-80gb", request_rate=1.5,
                     burstiness=0.5, seed=1).summary(warmup=0.1)
    for key in ("num_finished", "ttft_p99", "goodput_rps", "itl_mean", "itl_p99"):
        assert row[key] == pytest.approx(alone[key], rel=1e-12), key
    # the seed draws the arrivals: another seed, another run
    fcfs = res[(res["policy"] == "fcfs") & (res["load"] == 1.5)]
    assert fcfs["sim_seconds"].nunique() == 2
    assert result.headline.empty  # (the study's headline is over loads)
    assert "req/s" in format_table(result).splitlines()[1]
    assert result.config["bench"]["axis"] == "request_rate"
    assert "--request-rate LOAD --burstiness 0.5" in result.config["rerun"]


def test_the_rows_carry_vllms_pooled_itl(rate_sweep: tuple) -> None:
    _, result = rate_sweep
    res = result.results
    assert (res["itl_p50"] <= res["itl_p99"]).all() and (res["itl_mean"] > 0).all()


def test_a_saved_sweep_reads_back(rate_sweep: tuple, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    out, result = rate_sweep
    back = read_outputs(out)
    pd.testing.assert_frame_equal(back.table, result.table, check_dtype=False)
    assert format_table(back) == format_table(result)
    assert main(["bench", "--from", str(out), "--out", str(tmp_path / "again")]) == 0
    printed = capsys.readouterr().out
    assert format_table(result) in printed
    assert (tmp_path / "again" / "goodput_vs_load.png").is_file()
    again = json.loads((tmp_path / "again" / "config.json").read_text())
    assert again["bench"] == json.loads((out / "config.json").read_text())["bench"]


def error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    return err[-1]


def test_bad_rate_and_from_options_are_one_line_errors(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    base = ["bench", "--trace", "synthetic-code"]
    assert "not both" in error_line(capsys, [*base, "--loads", "0.8", "--request-rate", "2"])
    assert "--request-rate" in error_line(capsys, [*base, "--burstiness", "0.5"])
    assert "--request-rate" in error_line(capsys, [*base, "--request-rate", "0,2"])
    assert "--cdf-load" in error_line(capsys, [*base, "--request-rate", "2", "--cdf-load", "3"])
    assert "not used with --cluster" in error_line(
        capsys, [*base, "--cluster", "2x:llama-3.1-8b/h100-80gb", "--request-rate", "2"])
    assert "missing" in error_line(capsys, ["bench", "--from", str(tmp_path)])
    assert "--loads: not used with --from" in error_line(
        capsys, ["bench", "--from", str(tmp_path), "--loads", "0.5"])
    with pytest.raises(ValueError, match="loads or request_rates, not both"):
        BenchConfig(**{**RATES, "loads": (0.9,)})
    with pytest.raises(ValueError, match="burstiness"):
        BenchConfig(**{**RATES, "request_rates": (), "loads": (0.9,)})


def test_run_cell_by_rate_matches_the_process_backend(rate_sweep: tuple) -> None:
    """(The cell a worker runs: the same row in this process.)"""
    _, result = rate_sweep
    window = load_trace("synthetic-code").window(0, 200)
    from cbgym.bench import Cell, resolve_engine

    _init_worker({("synthetic-code", 0): window},
                 {"llama-2-7b/a100-80gb": resolve_engine("llama-2-7b/a100-80gb")})
    row0 = result.results.iloc[0]
    cell = Cell("synthetic-code", 0, "llama-2-7b/a100-80gb", row0["policy"], row0["load"],
                int(row0["seed"]), row0["capacity_rps"])
    out = run_cell(cell, CellSettings(2.0, 0.1, 0.1, 1.5, 0.5))
    assert out.row["goodput_rps"] == row0["goodput_rps"]


def test_bench_simulate_and_the_python_api_agree_on_one_cell(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The defaults are one set: a bench cell (the study's engine, rho 0.9, mu measured on
    the window's first 4,000 requests), ``cbgym simulate`` on the same window, and
    ``cbgym.simulate(window, engine="cbsjf-paper", load=0.9)`` give the same run."""
    cfg = BenchConfig(traces=("synthetic-conv",), policies=("fcfs",), loads=(0.9,),
                      windows=1, window_requests=300, workers=1)
    row = run_bench(cfg, progress=False).results.iloc[0]
    assert main(["simulate", "--trace", "synthetic-conv", "--requests", "300", "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    window = load_trace("synthetic-conv").window(0, 300)
    api = simulate(window, engine="cbsjf-paper", load=0.9).summary(warmup=0.1)
    for key in ("goodput_rps", "ttft_p99", "norm_latency_mean", "sim_seconds"):
        assert row[key] == cli[key] == api[key], key


def test_review_fixes_of_the_rate_sweep(capsys: pytest.CaptureFixture[str],
                                        tmp_path: Path) -> None:
    """A one-instant trace runs by rate (the rate replaces its arrivals); ``--loads`` given
    at its default value still clashes with ``--request-rate``; names read back as text."""
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    rows += [f"2023-11-16 18:15:46.6805900,{100 + k},{5 + k % 7}" for k in range(60)]
    flat = tmp_path / "flat.csv"
    flat.write_text("\n".join(rows) + "\n")
    assert main(["bench", "--trace", str(flat), "--request-rate", "2", "--policies", "fcfs",
                 "--windows", "1", "--workers", "1", "--quiet", "--no-plots"]) == 0
    capsys.readouterr()
    assert "not both" in error_line(capsys, ["bench", "--trace", "synthetic-code", "--loads",
                                             "0.9", "--request-rate", "2"])
    cfg = BenchConfig(traces=("synthetic-code",), policies=("fcfs", "oracle-work", "sjf-ctx"),
                      loads=(0.92,), windows=1, window_requests=200, capacity_sample=200,
                      workers=1)
    result = run_bench(cfg, progress=False)
    write_outputs(result, tmp_path / "sweep", plots=False)
    assert format_table(read_outputs(tmp_path / "sweep")) == format_table(result)
    assert read_outputs(tmp_path / "sweep").headline["loads"].tolist() == \
        result.headline["loads"].tolist()
    (tmp_path / "sweep" / "summary.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="no column 'trace'"):
        read_outputs(tmp_path / "sweep")


def test_a_cluster_with_a_study_mode_pool_keeps_no_pooled_itl() -> None:
    from cbgym import EngineConfig
    from cbgym.cluster import ClusterConfig, Pool

    tr = load_trace("synthetic-conv").window(0, 200)
    cfg = ClusterConfig((Pool("unified", 1, EngineConfig(preset="cbsjf-paper")),
                         Pool("unified", 1, EngineConfig(preset="llama-2-7b/a100-80gb"))))
    res = simulate(tr, cluster=cfg, load=0.8)
    assert res.itl_histogram is None and np.isnan(res.summary()["itl_mean"])
