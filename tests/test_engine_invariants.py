"""Engine invariants under random traces and random policy decisions (property tests).

This test verifies that, whatever the policy decides:
1. every request ends exactly once (finished, or shed with a reason);
2. KV blocks are never negative nor over capacity, and held + free == capacity;
3. simulated time never goes backwards;
4. the same inputs give identical results.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cbgym.engine import Decision, Engine, Status
from cbgym.engine.decision import DecisionPoint
from cbgym.simulate import collect
from cbgym.workload.trace import Trace
from tests.conftest import make_config

traces = st.integers(1, 40).flatmap(lambda n: st.tuples(
    st.lists(st.floats(0, 5, allow_nan=False), min_size=n, max_size=n),
    st.lists(st.integers(1, 400), min_size=n, max_size=n),
    st.lists(st.integers(1, 120), min_size=n, max_size=n),
))
configs = st.fixed_dictionaries({
    "num_kv_blocks": st.integers(4, 80),
    "block_size": st.sampled_from([1, 4, 16]),
    "max_num_seqs": st.integers(1, 8),
    "max_num_batched_tokens": st.sampled_from([16, 64, 512]),
    "chunked_prefill": st.booleans(),
    "preemption": st.sampled_from(["recompute", "swap"]),
    "preset": st.sampled_from([None, None, "cbsjf-paper", "llama-2-7b/a100-80gb"]),
})


def build(gaps: list[float], prompt: list[int], output: list[int]) -> Trace:
    return Trace.from_arrays(np.cumsum(gaps), prompt, output)


def random_decision(dp: DecisionPoint, rng: np.random.Generator) -> Decision:
    """Any decision a policy may legally make: order, holds, sheds, victims, evictions."""
    waiting = rng.permutation(dp.waiting)
    shed = waiting[: int(rng.random() < 0.05)]
    keep = waiting[len(shed):]
    order = keep[rng.random(len(keep)) < 0.9] if rng.random() < 0.5 else keep
    victims = rng.permutation(dp.running) if rng.random() < 0.5 else None
    preempt = dp.running[:1] if len(dp.running) and rng.random() < 0.05 else ()
    return Decision(order=order, shed=shed.tolist(), victims=victims, preempt=list(preempt))


def check_kv(engine: Engine) -> None:
    kv = engine.kv
    assert 0 <= kv.free <= kv.num_blocks
    assert (kv.held >= 0).all()
    assert int(kv.held.sum()) + kv.free == kv.num_blocks


def drive(engine: Engine, rng: np.random.Generator | None) -> None:
    last = engine.now
    while (dp := engine.next_decision()) is not None:
        check_kv(engine)
        assert dp.now >= last
        last = dp.now
        engine.decide(random_decision(dp, rng) if rng is not None else Decision())
        check_kv(engine)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces, cfg=configs, seed=st.integers(0, 2**16))
def test_invariants_under_random_decisions(trace, cfg, seed) -> None:
    tr = build(*trace)
    engine = Engine(tr, make_config(**cfg))
    drive(engine, np.random.default_rng(seed))
    req = engine.req
    assert engine.done and req.num_ended == len(tr)
    ended = np.isin(req.status, [Status.FINISHED, Status.SHED])
    assert ended.all(), "a request never ended"
    shed = req.status == Status.SHED
    assert all(req.reason.get(int(i)) for i in np.flatnonzero(shed)), "shed without a reason"
    fin = req.status == Status.FINISHED
    assert (req.generated[fin] == req.output[fin]).all()
    assert np.all(req.finish_s[ended] >= req.arrival_s[ended])
    assert engine.kv.free == engine.kv.num_blocks and not engine.running and not engine.waiting
    ts = engine.recorder.timeseries()
    assert np.all(np.diff(ts[:, 0]) >= 0) and np.all(ts[:, 1] >= 0)
    assert np.all(ts[:, 4] <= engine.kv.num_blocks)


@settings(max_examples=40, deadline=None)
@given(trace=traces, cfg=configs, seed=st.integers(0, 2**16))
def test_same_seed_same_result(trace, cfg, seed) -> None:
    frames = []
    for _ in range(2):
        engine = Engine(build(*trace), make_config(**cfg))
        drive(engine, np.random.default_rng(seed))
        frames.append(collect(engine, slo=__import__("cbgym").SLO(), meta={}).requests)
    pd.testing.assert_frame_equal(frames[0], frames[1])


@pytest.mark.slow
@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces, cfg=configs, seed=st.integers(0, 2**16),
       consult=st.sampled_from(["on_change", "on_completion", "every_iteration", "always"]))
def test_invariants_under_random_decisions_slow(trace, cfg, seed, consult) -> None:
    """The invariants over 1,000 random traces, configs and decision streams."""
    tr = build(*trace)
    engine = Engine(tr, make_config(**cfg), consult=consult)
    drive(engine, np.random.default_rng(seed))
    req = engine.req
    assert engine.done and req.num_ended == len(tr)
    assert np.isin(req.status, [Status.FINISHED, Status.SHED]).all()
    fin = req.status == Status.FINISHED
    assert (req.generated[fin] == req.output[fin]).all()
    assert engine.kv.free == engine.kv.num_blocks and not engine.running and not engine.waiting
