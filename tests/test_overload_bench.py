"""``cbgym bench --overload`` and ``--noisy-neighbour``: the curves' shape on a small
synthetic window, the CLI's outputs, and its argument checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from cbgym.bench import resolve_trace
from cbgym.cli import main
from cbgym.cluster.config import ClusterConfig
from cbgym.cluster.edge_results import OUTCOMES
from cbgym.overload import client_model, overload_sweep


@pytest.fixture(scope="module")
def sweep():  # type: ignore[no-untyped-def]
    tr = resolve_trace("synthetic-conv")
    return overload_sweep({"synthetic-conv": tr}, ClusterConfig.preset("1x:llama-3.1-8b/a100-80gb"),
                          "1x", [0.5, 2.0], 1, 1500, [0], client_model(10.0, 3, "leave"),
                          progress=False)


def test_goodput_collapses_without_admission_control_and_holds_with_it(sweep) -> None:  # type: ignore[no-untyped-def]
    g = sweep.set_index(["load", "mode"])["goodput_rps"]
    mu = float(sweep["capacity_rps"].iloc[0])
    # below capacity every edge serves the same
    assert g[(0.5, "none")] == pytest.approx(g[(0.5, "in-flight-cap")], rel=0.05)
    assert g[(0.5, "none")] > 0.4 * mu
    # at twice capacity: collapse without shedding, most of capacity with Little's-law shedding
    assert g[(2.0, "none")] < 0.2 * mu
    assert g[(2.0, "in-flight-cap")] > 0.6 * mu
    busy = sweep.set_index(["load", "mode"])["tokens_per_s"]
    assert busy[(2.0, "none")] >= busy[(2.0, "in-flight-cap")]  # the GPUs look fine


def test_every_run_conserves_its_requests(sweep) -> None:  # type: ignore[no-untyped-def]
    total = sweep[list(OUTCOMES)].sum(axis=1)
    assert (total == sweep["offered"]).all()
    assert (sweep["attempts"] == sweep["offered"] + sweep["retried"]).all()


def test_overload_cli_writes_its_table_and_plot(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ov"
    assert main(["bench", "--overload", "--trace", "synthetic-conv", "--windows", "1",
                 "--window-requests", "400", "--loads", "0.5,2", "--quiet", "--out",
                 str(out), "--retries", "1", "--abandon", "abort"]) == 0
    text = capsys.readouterr().out
    assert "in-flight-cap" in text and "queue-cap" in text
    assert (out / "overload_results.csv").exists() and (out / "overload_goodput.png").exists()


def test_noisy_neighbour_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--noisy-neighbour", "--trace", "synthetic-conv,synthetic-code",
                 "--window-requests", "300", "--policies", "fcfs,priority", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "| fcfs |" in text and "| priority |" in text and "| isolation |" in text


def test_noisy_neighbour_cli_falls_back_to_the_synthetic_traces(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import cbgym.workload.catalog as catalog

    monkeypatch.setattr(catalog, "find_trace", lambda name, **kw: None)
    assert main(["bench", "--noisy-neighbour", "--window-requests", "300", "--policies",
                 "fcfs", "--quiet"]) == 0
    assert "traces: synthetic-conv (interactive), synthetic-code (batch)" in (
        capsys.readouterr().out)


@pytest.mark.parametrize("argv, message", [
    (["--overload", "--routers", "kairos"], "--routers: not used with --overload"),
    (["--overload", "--timeout", "0"], "--timeout"),
    (["--overload", "--retries", "-1"], "--retries"),
    (["--overload", "--policies", "fcfs,vtc"], "one local policy"),
    (["--overload", "--cluster", "3q:x"], "--cluster"),
    (["--noisy-neighbour", "--timeout", "3"], "--timeout: not used with --noisy-neighbour"),
    (["--noisy-neighbour", "--share", "1.5"], "--share"),
    (["--noisy-neighbour", "--loads", "0.5,1"], "one load"),
    (["--noisy-neighbour", "--trace", "synthetic-conv"], "two traces"),
    (["--overload", "--noisy-neighbour"], "not allowed with"),
])
def test_bad_arguments_fail_before_any_work(argv: list[str], message: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
