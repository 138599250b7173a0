"""The task registry: lookup, disjoint splits, and every task id built and stepped."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import cbgym
from cbgym.tasks import TASKS, Task, batch_means, get, paired_difference
from cbgym.workload import load_trace
from cbgym.workload.catalog import TraceNotFoundError
from tests.conftest import load_script


def test_lookup_and_unknown_names() -> None:
    assert TASKS and all(get(name) is task for name, task in TASKS.items())
    with pytest.raises(ValueError, match="unknown task 'nope'; known: "):
        get("nope")
    with pytest.raises(TypeError):
        TASKS["x"] = None  # type: ignore[index]  (read only)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_splits_are_disjoint_and_test_windows_stay_inside(name: str) -> None:
    task = get(name)
    for n in (2_000, 19_366, 100_000):
        r = task.ranges(n)
        if r["test"][1] - r["test"][0] < task.episode_requests:  # (too short: refused)
            with pytest.raises(ValueError, match="cannot hold"):
                task.starts(n)
            continue
        assert r["train"][0] == 0 and r["test"][1] == n
        assert r["train"][1] == r["validation"][0] and r["validation"][1] == r["test"][0]
        lo, hi = r["test"]
        starts = task.starts(n)
        assert len(starts) == task.test_windows == len(set(starts))
        assert all(lo <= s and s + task.episode_requests <= hi for s in starts)
        assert task.env_kwargs(n)["window_start_range"] == r["train"]
        assert task.env_kwargs(n, "validation")["load"] == task.test_load


def test_starts_can_count_their_own_windows() -> None:
    task = get("conv-study-overload")
    n = 19_366
    lo, hi = task.ranges(n)["train"]
    starts = task.starts(n, "train", 7)
    assert len(set(starts)) == 7 and starts == sorted(starts)
    assert starts[0] == lo and starts[-1] == hi - task.episode_requests
    assert task.starts(n, "validation", None) == task.starts(n, "validation")
    with pytest.raises(ValueError, match="at least 1 window"):
        task.starts(n, "train", 0)


def test_validation_can_hold_fewer_windows_than_the_test() -> None:
    task = Task(**{**get("conv-study-overload").__dict__, "validation_windows": 3})
    n = 19_366
    assert len(task.starts(n, "validation")) == 3 and len(task.starts(n)) == task.test_windows
    assert len(task.starts(n, "validation", 5)) == 5  # an explicit count still wins
    with pytest.raises(ValueError, match="validation_windows=0"):
        Task(**{**task.__dict__, "validation_windows": 0})


@pytest.mark.parametrize("name", sorted(TASKS))
def test_test_windows_never_overlap_on_the_tasks_own_trace(name: str) -> None:
    task = get(name)
    try:
        n = len(load_trace(task.trace))
    except TraceNotFoundError:
        pytest.skip(f"{task.trace} is not available here (CBGYM_TRACE_DIR)")
    starts = task.starts(n)
    assert len(starts) == task.test_windows
    # disjoint windows: no request is counted in two of the windows the intervals are over
    assert np.all(np.diff(starts) >= task.episode_requests)
    assert len(task.starts(n, "validation")) == (task.validation_windows or task.test_windows)


def test_impossible_tasks_are_refused() -> None:
    base = get(sorted(TASKS)[0])
    with pytest.raises(ValueError, match="splits"):
        Task(**{**base.__dict__, "splits": (0.7, 0.6)})
    with pytest.raises(ValueError, match="cannot hold"):
        base.starts(600)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_task_id_builds_and_steps(name: str) -> None:
    task = get(name)
    try:
        load_trace(task.trace)
    except TraceNotFoundError:
        pytest.skip(f"{task.trace} is not available here (CBGYM_TRACE_DIR)")
    for env_id in (task.env_id, task.masked_env_id):
        env = gym.make(env_id)
        env.reset(seed=0)
        env.step(env.action_space.sample())
        venv = gym.make_vec(env_id, num_envs=2)
        venv.reset(seed=0)
        actions = venv.unwrapped.action_masks().argmax(axis=1) if "Masked" in env_id else \
            np.zeros((2, env.action_space.shape[0]))
        venv.step(actions)
    u = gym.make(task.env_id).unwrapped
    assert u.window_start_range == task.ranges(len(u.base_trace))["train"]


def test_the_default_ids_are_the_default_task() -> None:
    from gymnasium.utils.env_checker import check_env

    from cbgym.tasks import DEFAULT_TASK

    task = get(DEFAULT_TASK)
    try:
        load_trace(task.trace)
    except TraceNotFoundError:
        pytest.skip(f"{task.trace} is not available here (CBGYM_TRACE_DIR)")
    for env_id, twin in (("cbgym/Scheduling-v0", task.env_id),
                         ("cbgym/SchedulingMasked-v0", task.masked_env_id)):
        a, b = gym.make(env_id).unwrapped, gym.make(twin).unwrapped
        assert (a.config, a.load, a.slo, a.window_start_range, a.episode_requests) == (
            b.config, b.load, b.slo, b.window_start_range, b.episode_requests)
        assert a.config == task.engine_config() and a.slo == task.slo
        check_env(gym.make(env_id).unwrapped)  # Gymnasium's checker, default arguments
    # another trace keeps the task's other settings, without the task's window range
    other = gym.make("cbgym/Scheduling-v0", trace="synthetic-conv").unwrapped
    assert other.config == task.engine_config() and other.window_start_range is None
    own = gym.make("cbgym/Scheduling-v0", trace=task.trace).unwrapped  # its own trace, by name
    assert own.window_start_range == task.ranges(len(own.base_trace))["train"]


SMALL = Task("small", "an offline task for the tests", trace="synthetic-conv",
             engine="cbsjf-paper", train_load=1.2, test_load=1.3,
             slo=cbgym.SLO(ttft_s=2.0, tpot_s=0.1), episode_requests=128, test_windows=4)


def test_evaluate_scores_against_random_actions_and_the_best_reference() -> None:
    from cbgym.tasks.evaluate import RANDOM, evaluate

    ev = evaluate(SMALL, "sjf-ctx", references=("fcfs", "oracle-work"), seeds=(0, 1))
    table = ev.table
    assert list(table.index) == ["sjf-ctx", "fcfs", "oracle-work", RANDOM]
    assert len(ev.goodput["fcfs"]) == len(ev.starts) == 4  # per window, mean over the seeds
    one = evaluate(SMALL, "sjf-ctx", references=("fcfs",), seeds=(0,))
    np.testing.assert_array_equal(one.goodput["fcfs"], ev.goodput["fcfs"])  # deterministic
    assert table.loc[ev.best_reference, "score"] == pytest.approx(1.0)
    assert ev.random_share == pytest.approx(ev.goodput[RANDOM].mean()
                                            / ev.goodput[ev.best_reference].mean())
    assert table.loc[RANDOM, "score"] == 0.0
    assert table.loc["sjf-ctx", "diff_vs"] == 0.0 and table.loc["sjf-ctx", "ties"] == 4
    assert (table["slo_attainment"].between(0, 1)).all()
    again = evaluate(SMALL, "sjf-ctx", references=("fcfs", "oracle-work"), seeds=(0, 1))
    assert again.table.equals(table)  # deterministic
    assert ev.best_heuristic == "fcfs"  # oracle-work is privileged: never the heuristic bar
    d = ev.versus("fcfs")
    assert d.difference.mean == pytest.approx(table.loc["fcfs", "diff_vs"])
    # over the means of neighbouring windows: 4 windows, 2 batches of 2
    b = ev.versus("fcfs", batch=2)
    want = paired_difference(batch_means(ev.goodput[ev.policy], 2),
                             batch_means(ev.goodput["fcfs"], 2))
    assert b == want and b.wins + b.ties + b.losses == 2
    assert b.difference.mean == pytest.approx(d.difference.mean)  # the same mean
    assert ev.versus("fcfs", batch=np.int64(2)) == b
    with pytest.raises(ValueError, match="at least 2"):
        ev.versus("fcfs", batch=3)  # one batch: no interval
    for bad in (0, True, 1.0):
        with pytest.raises(ValueError, match="positive integer"):
            ev.versus("fcfs", batch=bad)  # type: ignore[arg-type]
    bench = load_script("benchmarks/bench_tasks.py")  # its --batch lines
    assert bench.batched(ev, 1, "fcfs") == []
    assert "fewer than 2 batches" in bench.batched(ev, 3, "fcfs")[0]
    share, diff = bench.batched(ev, 2, "fcfs")
    assert share.startswith("over means of 2 neighbouring windows (2 batches): random actions")
    assert diff.endswith(f"sjf-ctx minus fcfs: {b.difference.mean:+.1f} [{b.difference.low:+.1f}, "
                         f"{b.difference.high:+.1f}] (wins {b.wins}, ties {b.ties}, "
                         f"losses {b.losses})")


def test_evaluate_plays_the_task_on_another_trace(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from cbgym.tasks.evaluate import evaluate

    # the task's own trace, given: the same evaluation
    refs = ("fcfs", "cb-sjf-work-fit")
    own = evaluate(SMALL, "sjf-ctx", references=refs, trace=load_trace(SMALL.trace))
    assert own.table.equals(evaluate(SMALL, "sjf-ctx", references=refs).table)
    # another trace (here the first 2,000 requests): the task's split rule on its length
    other = load_trace(SMALL.trace).window(0, 2_000)
    ev = evaluate(SMALL, "sjf-ctx", references=refs, trace=other)
    assert ev.starts == SMALL.starts(2_000) != own.starts
    assert not ev.table.equals(own.table)
    days = load_script("benchmarks/bench_servegen_days.py")  # its summary line
    line = days.summary(ev, "the first 2,000")
    assert line.startswith("the first 2,000: random actions / best reference (cb-sjf-work-fit)")
    assert "by window" in line and "sjf-ctx minus cb-sjf-work-fit" in line
    d = ev.versus("cb-sjf-work-fit", 2)
    assert days.summary(ev, "x", 2).endswith(f"{days.bench_tasks.said(d)} over means of 2")
    monkeypatch.setattr("sys.argv", ["bench_servegen_days.py", "--start-days", "12"])
    with pytest.raises(SystemExit):  # the CLI checks its span before drawing anything
        days.main()
    assert "--start-days 12: expected a day in [0, 11]" in capsys.readouterr().err
    bench = load_script("benchmarks/bench_tasks.py")
    assert bench.report(ev, 1, "test", title="x").startswith("### x (test: 4 windows x 1 seeds)")


def test_validation_windows_are_the_validation_range_and_never_the_test_windows() -> None:
    from cbgym.tasks.evaluate import evaluate

    ev = evaluate(SMALL, "fcfs", references=("sjf-ctx",), split="validation")
    n = len(load_trace(SMALL.trace))
    lo, hi = SMALL.ranges(n)["validation"]
    assert ev.starts == SMALL.starts(n, "validation")
    assert all(lo <= s and s + SMALL.episode_requests <= hi for s in ev.starts)
    assert not set(ev.starts) & set(SMALL.starts(n))
    with pytest.raises(ValueError, match="split='train'"):
        evaluate(SMALL, "fcfs", split="train")


def test_engine_arguments_and_env_settings_reach_the_env() -> None:
    t = Task(**{**SMALL.__dict__, "engine": "llama-2-7b/a100-80gb",
                "engine_args": {"num_kv_blocks": 500, "max_num_seqs": 16},
                "env": {"shed_rule": "unreachable", "K": 8}})
    cfg = t.engine_config()
    assert (cfg.num_kv_blocks, cfg.max_num_seqs) == (500, 16)
    kw = t.env_kwargs(None)
    assert "window_start_range" not in kw and kw["K"] == 8
    env = cbgym.SchedulingEnv(**kw)
    assert env.config == cfg and env.shed_rule == "unreachable" and env.K == 8


def test_cbgym_evaluate_command(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from cbgym.cli import main

    with pytest.raises(SystemExit):
        main(["evaluate", "--task", "nope", "--policy", "fcfs"])
    with pytest.raises(SystemExit):
        main(["evaluate", "--task", sorted(TASKS)[0], "--policy", "nope"])
    task = get(sorted(TASKS)[0])
    try:
        load_trace(task.trace)
    except TraceNotFoundError:
        pytest.skip(f"{task.trace} is not available here (CBGYM_TRACE_DIR)")
    capsys.readouterr()
    assert main(["evaluate", "--task", task.name, "--policy", "cb-sjf-work", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["policy"]: r for r in out["rows"]}
    assert rows[out["best_reference"]]["score"] == pytest.approx(1.0)
    assert rows["random actions"]["score"] == 0.0
