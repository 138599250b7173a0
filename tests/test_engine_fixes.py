"""The one engine: its debug mode, stretches, stuck policies, bounded memory, pickling.

1. ``NUMBA_DISABLE_JIT=1`` runs the kernels as plain Python with the same results;
2. decode stretches give exactly the iterations of plain iteration (property test);
3. a policy or agent holding every waiting request with nothing running: ``simulate`` raises
   a clear error naming the policy, the env truncates the episode (and can be reset);
4. memory follows the workload's events, not output lengths;
5. unpickling an env binds to the compiled kernels it had (no second compilation);
6. an edit to any kernel module empties the compiled-kernel caches (numba itself checks a
   kernel's own file only, not the callees inlined into it).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cbgym
from cbgym.engine import Decision, DecisionPoint, Engine, EngineStuckError, Policy, jit
from cbgym.engine.layout import MAX_IDLE_TICKS
from cbgym.env import SchedulingEnv
from cbgym.env import kernel_ops as ko
from cbgym.simulate import collect
from tests.conftest import make_config, random_trace
from tests.test_engine_invariants import build, configs, drive, traces

DEBUG_RUN = """
import hashlib, sys
import numpy as np
import cbgym
from tests.conftest import make_config, random_trace
tr = random_trace(np.random.default_rng(7), 40, max_prompt=600, max_output=60)
for policy in ("fcfs", "sjf-ctx", "cb-sjf-work"):
    res = cbgym.simulate(tr, policy=policy, engine=make_config(num_kv_blocks=60))
    cols = res.requests[["first_token_s", "finish_s", "preemptions"]].to_numpy()
    print(policy, hashlib.sha256(cols.tobytes()).hexdigest(), len(res.timeseries))
"""


def test_disable_jit_runs_the_same_engine_as_plain_python() -> None:
    here = {**os.environ, "PYTHONPATH": os.getcwd()}
    runs = []
    for jit_off in ("1", "0"):
        out = subprocess.run([sys.executable, "-c", DEBUG_RUN], capture_output=True, text=True,
                             env={**here, "NUMBA_DISABLE_JIT": jit_off}, check=True)
        runs.append(out.stdout)
    assert runs[0] == runs[1] and runs[0].count("\n") == 3


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces, cfg=configs, consult=st.sampled_from(["never", "on_change",
                                                          "every_iteration"]))
def test_decode_stretches_are_exact(trace, cfg, consult) -> None:
    results = []
    for stretches in (True, False):
        engine = Engine(build(*trace), make_config(**cfg), consult=consult,
                        decode_stretches=stretches)
        drive(engine, None)
        results.append(collect(engine, slo=cbgym.SLO(), meta={}))
    pd.testing.assert_frame_equal(results[0].requests, results[1].requests)
    pd.testing.assert_frame_equal(results[0].timeseries, results[1].timeseries)


class HoldAll(Policy):
    """Admits nobody, ever."""

    name = "hold-all"

    def decide(self, dp: DecisionPoint) -> Decision:
        return Decision(order=[])


def test_simulate_names_a_policy_that_never_drains() -> None:
    trace = cbgym.Trace.from_arrays([0.0, 0.1], [100, 100], [10, 10])
    with pytest.raises(EngineStuckError, match="policy 'hold-all'.*idle ticks"):
        cbgym.simulate(trace, policy=HoldAll(), engine=make_config())


def test_env_truncates_an_agent_that_holds_everyone_back() -> None:
    trace = random_trace(np.random.default_rng(0), 64)
    env = SchedulingEnv(trace=trace, engine=make_config(num_kv_blocks=400), load=None,
                        episode_requests=16)
    env.reset(seed=0)
    hold = np.full(env.action_space.shape, -0.7, np.float32)  # below hold, above shed
    steps = 0
    while True:
        _, reward, terminated, truncated, info = env.step(hold)
        steps += 1
        if terminated or truncated:
            break
    assert truncated and not terminated
    assert info["truncated_reason"] == "idle_hold_limit"
    assert MAX_IDLE_TICKS <= steps <= MAX_IDLE_TICKS + 16
    env.reset(seed=1)  # usable again
    _, _, terminated, truncated, _ = env.step(np.ones(env.action_space.shape, np.float32))
    assert not truncated


def test_memory_is_bounded_by_events_not_output_length() -> None:
    cfg = make_config(num_kv_blocks=700_000)
    trace = cbgym.Trace.from_arrays([0.0, 0.5], [100, 200], [10_000_000, 20])
    res = cbgym.simulate(trace, engine=cfg)
    assert (res.requests["status"] == "finished").all()
    assert res.summary()["iterations"] == 10_000_000
    # a decode run is one row of the time series, however many tokens it lasts
    assert len(res.timeseries) <= 6


def test_unpickled_env_uses_the_compiled_kernels_it_had() -> None:
    env = SchedulingEnv(trace=random_trace(np.random.default_rng(1), 80),
                        engine=make_config(num_kv_blocks=400), episode_requests=32)
    env.reset(seed=0)
    env.step(env.action_space.sample())
    before = len(ko.step_scores.signatures)
    twin = pickle.loads(pickle.dumps(env))
    twin.step(twin.action_space.sample())
    assert len(ko.step_scores.signatures) == before


def test_a_stretch_with_more_rows_than_the_buffer_holds() -> None:
    """FCFS behind a blocked head: every arrival during a long decode opens a time-series
    row, far more than the kernel's buffer holds in one stretch."""
    n = 6000
    arrival = np.concatenate(([0.0], np.linspace(0.01, 50.0, n)))
    output = np.concatenate(([200_000], np.full(n, 2)))
    trace = cbgym.Trace.from_arrays(arrival, np.full(n + 1, 16), output)
    res = cbgym.simulate(trace, engine=make_config(num_kv_blocks=20_000, max_num_seqs=1))
    ts = res.timeseries
    assert (res.requests["status"] == "finished").all()
    assert len(ts) > 4096 and np.all(np.diff(ts["start_s"].to_numpy()) > 0)
    assert ts["num_iterations"].sum() == res.summary()["iterations"] == engine_iterations(res)
    assert ts["num_waiting"].max() == n


def engine_iterations(res: cbgym.SimulationResult) -> int:
    """Iterations the run needed: one per output token here (prefill comes with the first)."""
    return int(res.requests["output_tokens"].sum())


def test_the_cache_stamp_covers_every_kernel_module_and_what_they_import() -> None:
    names = {str(p.relative_to(jit.PACKAGE)) for p in jit.kernel_sources()}
    assert {"engine/loop.py", "engine/stretch.py", "engine/execute.py", "engine/layout.py",
            "engine/jit.py", "env/kernel_ops.py"} <= names
    assert "simulate.py" not in names and "env/core.py" not in names


def test_a_changed_stamp_empties_the_cache_folder(tmp_path) -> None:
    for name in ("loop.advance-89.py311.nbi", "loop.advance-89.py311.1.nbc"):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "other.txt").write_text("kept")
    assert jit.drop_stale(tmp_path, "stamp-1") == 2  # no stamp yet: stale
    assert sorted(p.name for p in tmp_path.iterdir()) == [jit.STAMP_FILE, "other.txt"]
    (tmp_path / "loop.advance-89.py311.nbi").write_bytes(b"x")
    assert jit.drop_stale(tmp_path, "stamp-1") == 0  # same sources: the cache stays
    assert jit.drop_stale(tmp_path, "stamp-2") == 1  # a kernel module changed
