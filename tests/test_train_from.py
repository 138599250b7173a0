"""train.py --train-from: training windows from the most recent part of the training range only
(a task's split stays its own; the held-out windows do not move)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cbgym.engine.config import EngineConfig
from cbgym.workload import load_trace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import train  # noqa: E402


def test_train_from_narrows_the_training_range_only() -> None:
    trace = load_trace("synthetic-conv")
    n = len(trace)
    whole = train.parse_args(["--load", "0.9"])
    recent = train.parse_args(["--load", "0.9", "--train-from", "0.5"])
    assert train.env_kwargs(whole, trace, EngineConfig(), 1.0)["window_start_range"] == (
        0, int(n * 0.7))
    assert train.env_kwargs(recent, trace, EngineConfig(), 1.0)["window_start_range"] == (
        int(n * 0.5), int(n * 0.7))
    # the held-out windows are the same either way
    assert train.eval_starts(recent, trace) == train.eval_starts(whole, trace)
    # a range too short for one window is refused before anything is built
    late = train.parse_args(["--load", "0.9", "--train-from", "0.69"])
    with pytest.raises(ValueError, match="--train-from"):
        train.env_kwargs(late, trace, EngineConfig(), 1.0)


def test_train_from_is_checked_against_the_split(capsys: pytest.CaptureFixture[str]) -> None:
    assert train.parse_args(["--task", "code-vllm-bursty", "--train-from", "0.3"]).train_from == 0.3
    for bad, split in ((["--train-from", "0.7"], "0.7"), (["--train-from", "-0.1"], "0.7"),
                       (["--task", "code-vllm-bursty", "--train-from", "0.6"], "0.6")):
        with pytest.raises(SystemExit):
            train.parse_args(bad)
        err = capsys.readouterr().err
        assert "--train-from" in err and f"[0, {split})" in err
    with pytest.raises(SystemExit):  # an unknown task is named first
        train.parse_args(["--task", "nope", "--train-from", "0.8"])
    assert "--task 'nope'" in capsys.readouterr().err
