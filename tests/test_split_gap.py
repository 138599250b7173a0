"""tools/split_gap.py: a shipped policy against a heuristic on each split of a task."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import split_gap  # noqa: E402

from cbgym.tasks import get  # noqa: E402
from cbgym.workload import load_trace  # noqa: E402
from cbgym.workload.catalog import TraceNotFoundError  # noqa: E402

TASK = "code-vllm-overload"


def test_it_checks_its_arguments_before_working(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in ((["--task", TASK, "--train-windows", "1"], "at least 2"),
                          (["--task", TASK, "--reference", "nope"], "unknown policy 'nope'"),
                          (["--task", "nope"], "invalid choice")):
        with pytest.raises(SystemExit):
            split_gap.main(argv)
        assert message in capsys.readouterr().err


def test_it_pairs_the_policy_and_the_reference_on_each_split(
        capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("stable_baselines3")  # (learned: policies need it; this test plays none)
    try:
        load_trace(get(TASK).trace)
    except TraceNotFoundError:
        pytest.skip(f"{get(TASK).trace} is not available here (CBGYM_TRACE_DIR)")
    out = split_gap.main(["--task", TASK, "--train-windows", "2", "--policy", "cb-sjf-work",
                          "--splits", "train", "validation"])
    assert list(out) == ["train", "validation"]
    t = get(TASK)
    for split, n in (("train", 2), ("validation", t.validation_windows or t.test_windows)):
        d = out[split]
        assert d.wins + d.ties + d.losses == n
        assert d.difference.mean < 0  # uncapped, never shedding: below the tuned reference
    printed = capsys.readouterr().out
    assert "code-vllm-overload train (2 windows, load 1.3): cb-sjf-work" in printed
    assert "cb-sjf-work-shed:48" in printed
    assert "these windows overlap: starts 92 requests apart" in printed  # (validation)
