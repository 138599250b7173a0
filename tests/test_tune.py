"""``tools/tune_aging.py``: a Ray Tune sweep of the aging weight on a task's validation
windows, on a local Ray."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import load_script

pytest.importorskip("ray.tune")


def test_tune_example_runs_a_two_point_sweep(tmp_path: Path) -> None:
    """A two-point grid, each trial the task's validation score."""
    import ray

    from cbgym.workload import load_trace
    from cbgym.workload.catalog import TraceNotFoundError

    try:
        load_trace("azure-conv-2023", download=False)
    except TraceNotFoundError:
        pytest.skip("azure-conv-2023 is not available here (CBGYM_TRACE_DIR)")
    mod = load_script("tools/tune_aging.py")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        grid = mod.sweep("conv-study-overload", [0.5, 2.0], references=["slo-edf"],
                         storage=str(tmp_path))
    finally:
        ray.shutdown()
    assert len(grid) == 2 and not grid.errors
    scores = {r.config["weight"]: r.metrics["score"] for r in grid}
    assert set(scores) == {0.5, 2.0}
    assert grid.get_best_result().metrics["score"] == max(scores.values())
