"""cbgym bench: window placement, the CSV schema, a small end-to-end sweep, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cbgym.bench import ID_COLUMNS, BenchConfig, run_bench, window_starts, write_outputs
from cbgym.cli import build_parser, main

# A tiny sweep: two policies, one load, one short window of a synthetic trace.
TINY = dict(traces=("synthetic-code",), policies=("fcfs", "oracle-work"), loads=(0.9,),
            windows=1, window_requests=250, capacity_sample=250)
STUDY_COLUMNS = [
    "mean_norm_latency_ms", "p99_norm_latency_ms", "p99_e2e_s", "max_queue_s",
    "oracle_gain_recovered_pct", "p99_ratio", "p99_e2e_ratio", "starvation_threshold_s",
    "starvation_count", "starved_beyond_fcfs_max", "prefill_engine_s", "busy_s",
    "prefill_time_share",
]
SUMMARY_COLUMNS = [  # SimulationResult.summary(warmup)
    "num_requests", "num_finished", "num_shed", "ttft_mean", "ttft_p99", "tpot_p50", "e2e_p99",
    "queue_p50", "norm_latency_mean", "norm_latency_p99", "slo_attainment", "goodput_rps",
    "throughput_rps", "throughput_tok_s", "num_preemptions", "iterations", "sim_seconds",
    "wall_seconds",
]


@pytest.fixture(scope="module")
def tiny_result(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    result = run_bench(BenchConfig(**TINY, workers=1), progress=False)
    out = tmp_path_factory.mktemp("bench")
    write_outputs(result, out)
    return out, result


def test_windows_are_evenly_spaced_and_disjoint_when_they_fit() -> None:
    starts = window_starts(19_366, 5, 3800)
    assert starts[0] == 0 and starts[-1] == 19_366 - 3800
    assert all(b - a >= 3800 for a, b in zip(starts, starts[1:], strict=False))
    assert window_starts(100, 3, 50) == [0, 25, 50]  # overlapping: 150 > 100
    assert window_starts(100, 4, 500) == [0]  # clipped to the trace, duplicates dropped
    assert window_starts(100, 1, 10) == [0]


def test_bench_writes_every_file(tiny_result: tuple[Path, object]) -> None:
    out, _ = tiny_result
    for name in ("results.csv", "summary.csv", "headline.csv", "accountings.csv", "cdf.csv",
                 "config.json", "mean_latency_vs_load.png", "p99_latency_vs_load.png",
                 "goodput_vs_load.png", "latency_cdf.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name


def test_results_csv_schema(tiny_result: tuple[Path, object]) -> None:
    out, _ = tiny_result
    frame = pd.read_csv(out / "results.csv")
    assert list(frame.columns[:len(ID_COLUMNS)]) == ID_COLUMNS
    missing = set(SUMMARY_COLUMNS + STUDY_COLUMNS) - set(frame.columns)
    assert not missing
    assert len(frame) == 2 and set(frame["policy"]) == {"fcfs", "oracle-work"}
    fcfs = frame[frame["policy"] == "fcfs"].iloc[0]
    oracle = frame[frame["policy"] == "oracle-work"].iloc[0]
    assert fcfs["oracle_gain_recovered_pct"] == 0 and fcfs["p99_ratio"] == 1
    assert oracle["oracle_gain_recovered_pct"] == pytest.approx(100.0)
    # common random numbers: one capacity, hence one arrival sequence, for both policies
    assert fcfs["capacity_rps"] == oracle["capacity_rps"] > 0
    assert fcfs["offered_rps"] == pytest.approx(0.9 * fcfs["capacity_rps"])
    assert 0 < fcfs["prefill_time_share"] <= 1


def test_accountings_and_config(tiny_result: tuple[Path, object]) -> None:
    out, _ = tiny_result
    acc = pd.read_csv(out / "accountings.csv")
    assert list(acc.columns) == ["trace", "engine", "load", "marginal_work_share_pct",
                                 "engine_time_share_pct", "fcfs_runs"]
    assert 0 < acc["engine_time_share_pct"].item() <= 100
    assert 0 < acc["marginal_work_share_pct"].item() <= 100
    config = json.loads((out / "config.json").read_text())
    import cbgym

    assert config["cbgym_version"] == cbgym.__version__
    assert config["bench"]["policies"] == ["fcfs", "oracle-work"]
    assert config["capacity_rps"][0]["capacity_rps"] > 0
    assert config["engines"]["cbsjf-paper"]["mode"] == "cbsjf-paper"


def test_worker_processes_give_the_same_rows_as_inline(tiny_result: tuple[Path, object]
                                                       ) -> None:
    _, inline = tiny_result
    pooled = run_bench(BenchConfig(**TINY, workers=2), progress=False)
    cols = ["policy", "mean_norm_latency_ms", "p99_norm_latency_ms", "capacity_rps"]
    pd.testing.assert_frame_equal(inline.results[cols], pooled.results[cols])  # type: ignore[attr-defined]


def test_bench_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="loads"):
        BenchConfig(traces=("synthetic-code",), policies=("fcfs",), loads=(0.0,))
    with pytest.raises(ValueError, match="cdf_load"):
        BenchConfig(traces=("synthetic-code",), policies=("fcfs",), loads=(0.5,), cdf_load=0.7)


# ---------------------------------------------------------------- the CLI


def one_error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "error:" in err
    return err


@pytest.mark.parametrize(("argv", "expected"), [
    (["--policies", "fcfs,shortest-magic"], "unknown policy 'shortest-magic'"),
    (["--policies", "noisy-oracle:2"], "--policies"),
    (["--loads", "0.5,0"], "load must be a number > 0"),
    (["--loads", "-0.3"], "load must be a number > 0"),
    (["--loads", "high"], "load must be a number > 0"),
    (["--engine", "gpt-9/abacus"], "--engine: engine 'gpt-9/abacus'"),
    (["--engine", "nonsense"], "--engine"),
    (["--trace", "no/such/file.csv"], "--trace"),
    (["--trace", "azure-conv-9999"], "unknown trace name"),
    (["--windows", "0"], "--windows"),
    (["--warmup", "1.5"], "--warmup"),
    (["--cdf-load", "0.5"], "--cdf-load"),
    (["--bogus"], "unrecognized arguments"),
])
def test_bad_bench_options_give_one_line_and_status_2(
        capsys: pytest.CaptureFixture[str], argv: list[str], expected: str) -> None:
    err = one_error_line(capsys, ["bench", "--trace", "synthetic-code", *argv])
    assert expected in err


def test_missing_catalogue_trace_says_how_to_fix_it(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CBGYM_TRACE_DIR", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    err = one_error_line(capsys, ["bench", "--trace", "azure-code-2023"])
    assert "not found locally" in err and "CBGYM_TRACE_DIR" in err and "--download" in err


def test_no_command_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert "bench" in one_error_line(capsys, [])


def test_bench_help_documents_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    bench = build_parser()._subparsers._group_actions[0].choices["bench"]  # type: ignore[union-attr]
    for action in bench._actions:
        for option in action.option_strings:
            assert option in text, option
        assert action.help, action.option_strings


def test_bench_command_prints_the_table_and_writes_files(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(["bench", "--trace", "synthetic-code", "--policies", "fcfs,cb-sjf-work",
                 "--loads", "0.8", "--windows", "1", "--window-requests", "200",
                 "--capacity-sample", "200", "--workers", "1", "--quiet", "--no-plots",
                 "--out", str(tmp_path)])
    assert code == 0
    out = capsys.readouterr().out
    assert "synthetic-code | cbsjf-paper" in out and "cb-sjf-work" in out
    assert (tmp_path / "results.csv").is_file()
    assert not list(tmp_path.glob("*.png"))


def test_simulate_command_reruns_one_cell(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", "--trace", "synthetic-code", "--requests", "150",
                 "--policy", "oracle-work", "--load", "0.8", "--capacity-rps", "1.5", "--json"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["num_requests"] == 135  # 150 minus the 10% warm-up
    assert np.isfinite(summary["mean_norm_latency_ms"])


AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"


def azure_file(path: Path, stamps: list[str]) -> Path:
    rows = [f"2023-11-16 18:15:{s},{100 + 10 * k},{5 + k}" for k, s in enumerate(stamps)]
    path.write_text("\n".join([AZURE_HEADER, *rows]) + "\n")
    return path


def test_trace_paths_may_hold_commas(tmp_path: Path) -> None:
    """Issue 15: ``--trace`` split a path with commas into two missing traces."""
    odd = azure_file(tmp_path / "week 1, part 2.csv", ["46.68", "47.10", "48.00"])
    args = build_parser().parse_args(["bench", "--trace", f"{odd},synthetic-code"])
    assert args.trace == (str(odd), "synthetic-code")
    assert build_parser().parse_args(["bench", "--trace", "a, b"]).trace == ("a", "b")


def test_out_is_checked_before_the_sweep(capsys: pytest.CaptureFixture[str],
                                         tmp_path: Path) -> None:
    """Issue 15: a bad ``--out`` lost every result after the sweep."""
    blocker = tmp_path / "taken"
    blocker.write_text("")
    for cmd in ("bench", "simulate"):
        err = one_error_line(capsys, [cmd, "--trace", "synthetic-code", "--out", str(blocker)])
        assert "--out" in err and "not a directory" in err


def test_one_request_and_one_instant_traces_are_one_line_errors(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Issue 15: such a trace gave a worker traceback (rho scaling needs a finite rate)."""
    one = azure_file(tmp_path / "one.csv", ["46.68"])
    same = azure_file(tmp_path / "same.csv", ["46.68"] * 3)
    assert "at least two" in one_error_line(capsys, ["bench", "--trace", str(one)])
    assert "one instant" in one_error_line(capsys, ["bench", "--trace", str(same)])
    assert "at least two" in one_error_line(capsys, ["simulate", "--trace", str(one),
                                                     "--load", "0.9"])


def test_simulate_out_writes_requests_and_summary(capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert main(["simulate", "--trace", "synthetic-code", "--requests", "120", "--load", "0.8",
                 "--capacity-rps", "1.5", "--json", "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert json.loads((out / "summary.json").read_text()) == printed
    req = pd.read_csv(out / "requests.csv", index_col=0)
    assert len(req) == 120 and {"arrival_s", "ttft_s", "status"} <= set(req.columns)


def test_simulate_request_rate_and_burstiness(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--trace", "synthetic-code", "--requests", "150",
                 "--request-rate", "2", "--burstiness", "0.5", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["request_rate"] == 2.0 and summary["burstiness"] == 0.5
    assert "not both" in one_error_line(capsys, ["simulate", "--trace", "synthetic-code",
                                                 "--load", "0.8", "--request-rate", "2"])
    assert "--request-rate" in one_error_line(capsys, ["simulate", "--trace",
                                                       "synthetic-code", "--burstiness", "2"])


POLICY_MODULE = '''
from cbgym.agents import FCFS


class MyFCFS(FCFS):
    """A policy of the user's own (an FCFS under another name)."""

    name = "my-fcfs"
'''


def test_custom_policies_reach_the_worker_processes(
        capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 15: a policy added to POLICIES at run time was invisible to bench's workers; a
    ``module:Class`` spec and an installed package's ``cbgym.policies`` entry point are
    built in every process."""
    from cbgym.agents import make_policy

    (tmp_path / "my_policies.py").write_text(POLICY_MODULE)
    dist = tmp_path / "my_policies-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-policies\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[cbgym.policies]\nmine = my_policies:MyFCFS\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # (spawned workers)
    assert type(make_policy("my_policies:MyFCFS")).__name__ == "MyFCFS"
    assert type(make_policy("mine")).__name__ == "MyFCFS"
    out = tmp_path / "out"
    assert main(["bench", "--trace", "synthetic-code",
                 "--policies", "fcfs,my_policies:MyFCFS,mine",
                 "--loads", "0.8", "--windows", "2", "--window-requests", "150",
                 "--capacity-sample", "150", "--workers", "2", "--quiet", "--no-plots",
                 "--out", str(out)]) == 0
    rows = pd.read_csv(out / "results.csv")
    by = rows.groupby("policy")["goodput_rps"].mean()
    assert by["my_policies:MyFCFS"] == by["fcfs"] == by["mine"]
    for bad, says in (("my_policies:Nope", "has no 'Nope'"), ("no_such.mod:X", "cannot import"),
                      ("json:JSONDecoder", "not a cbgym Policy"),
                      ("this:zen", "unknown policy 'this'")):  # (a typo imports nothing)
        with pytest.raises(ValueError, match=says):
            make_policy(bad)


def test_bare_simulate_uses_the_bench_defaults(capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    """Issue 15: bare ``cbgym simulate`` replayed the synthetic trace as recorded on the
    study's engine (0% SLO attainment, 3,000 s queues); it now runs bench's default cell."""
    monkeypatch.setenv("CBGYM_TRACE_DIR", str(tmp_path))  # (no trace found: the fallback)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert main(["simulate", "--requests", "400", "--json"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert "synthetic-conv" in captured.err and summary["trace"] == "synthetic-conv"
    assert summary["load"] == 0.9 and summary["engine"] == "cbsjf-paper"
    assert summary["slo_attainment"] > 0.3
    assert main(["simulate", "--requests", "400", "--load", "recorded", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["load"] is None


def test_capacity_per_trace_is_one_mu_for_every_window() -> None:
    """Issue 15/16: the study measures capacity once per trace; per window is the default."""
    def mus(mode: str) -> pd.Series:
        cfg = BenchConfig(traces=("synthetic-code",), policies=("fcfs",), loads=(0.8,),
                          windows=3, window_requests=150, capacity_sample=400, workers=1,
                          capacity=mode)
        rows = run_bench(cfg).results
        return rows.groupby("window")["capacity_rps"].first()

    from cbgym.capacity import measure_capacity
    from cbgym.engine import EngineConfig
    from cbgym.workload import load_trace

    per_window, per_trace = mus("per-window"), mus("per-trace")
    assert per_window.nunique() == 3 and per_trace.nunique() == 1
    # the trace's first 400 requests, not window 0's 150 (the study's sample)
    first = load_trace("synthetic-code").window(0, 400)
    assert per_trace.iloc[0] == measure_capacity(first, EngineConfig(preset="cbsjf-paper"),
                                                 sample=400) != per_window.loc[0]
    with pytest.raises(ValueError, match="capacity"):
        BenchConfig(traces=("x",), policies=("fcfs",), loads=(0.8,), capacity="weekly")
