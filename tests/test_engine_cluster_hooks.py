"""The engine's hooks for clusters change nothing for a standalone engine: decode stretches
and horizons split iterations without changing a result; the per-request worst gap between
tokens (``itl_max_s``) and the p99 of the gaps (``itl_p99_s``) are exact."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cbgym import EngineConfig, LinearCostModel, Trace
from cbgym.engine import handoff
from cbgym.engine import layout as L
from cbgym.engine.decision import Decision
from cbgym.engine.engine import Engine
from cbgym.metrics import SLO, requests_frame
from cbgym.simulate import simulate

ENGINE = EngineConfig(preset=None, cost_model=LinearCostModel(0.01, 1e-4, 2e-4),
                      num_kv_blocks=300, block_size=16, max_num_batched_tokens=512)


def trace_of(seed: int, n: int = 80) -> Trace:
    rng = np.random.default_rng(seed)
    return Trace.from_arrays(np.sort(rng.uniform(0, 8, n)), rng.integers(1, 1500, n),
                             rng.integers(1, 200, n), name="t", rebase=False)


def frame(eng: Engine) -> pd.DataFrame:
    return requests_frame(eng.req, SLO())


def run_plain(tr: Trace, stretches: bool) -> pd.DataFrame:
    eng = Engine(tr, ENGINE, consult="never", decode_stretches=stretches)
    assert eng.next_decision() is None
    return frame(eng)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_decode_stretches_change_nothing(seed: int) -> None:
    tr = trace_of(seed)
    pd.testing.assert_frame_equal(run_plain(tr, True), run_plain(tr, False), check_exact=True)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), cuts=st.lists(st.floats(0, 30), max_size=40))
def test_horizons_change_nothing(seed: int, cuts: list[float]) -> None:
    """A routed engine fed every request at its arrival and stopped at arbitrary horizons
    equals the standalone engine (what makes one replica the single engine)."""
    tr = trace_of(seed)
    eng = Engine(tr, ENGINE, consult="never", routed=True)
    # the cluster's rule: run to an event's time, then apply it (arrivals before cuts)
    events = sorted([(t, 0, j) for j, t in enumerate(tr.arrival_s.tolist())]
                    + [(t, 1, -1) for t in cuts])
    for t, kind, rid in events:
        eng.run_until(t, None)
        if kind == 0:
            handoff.deliver(eng.state, rid, t, int(tr.output_tokens[rid]), False, L.LOCAL, 0, 1)
    eng.run_until(np.inf, None)
    pd.testing.assert_frame_equal(frame(eng), run_plain(tr, True), check_exact=True)


def test_itl_max_by_hand() -> None:
    """One request decodes alone (gaps a + d); a second arrives mid-decode and its prefill
    iteration (a + c_p x + d) is the first's worst gap."""
    a, b, d = 0.01, 1e-4, 2e-4
    tr = Trace.from_arrays(np.array([0.0, 0.1]), np.array([100, 400]), np.array([30, 3]),
                           name="two", rebase=False)
    res = simulate(tr, engine=ENGINE).requests
    # request 1's 400-token prompt shares an iteration with request 0's decode
    assert np.isclose(res["itl_max_s"].iloc[0], a + b * 400 + d, rtol=1e-12)
    # request 1 then decodes beside request 0: two decodes a step
    assert np.isclose(res["itl_max_s"].iloc[1], a + 2 * d, rtol=1e-12)
    alone = simulate(Trace.from_arrays(np.array([0.0]), np.array([100]), np.array([30]),
                                       name="one"), engine=ENGINE).requests
    assert np.isclose(alone["itl_max_s"].iloc[0], a + d, rtol=1e-12)


def test_tbt_slo_judges_the_worst_gap() -> None:
    tr = Trace.from_arrays(np.array([0.0, 0.1]), np.array([100, 400]), np.array([30, 3]),
                           name="two", rebase=False)
    res = simulate(tr, engine=ENGINE, slo=SLO(ttft_s=5, tpot_s=1, tbt_s=0.03))
    # request 0's worst gap is the 50 ms mixed iteration: it misses a 30 ms TBT target
    assert res.summary()["slo_attainment"] == 0.5


def test_deliveries_ahead_of_time_keep_the_inbox_in_arrival_order() -> None:
    """A cluster routes arrivals ahead of time: a later delivery with an earlier time goes
    before them (events before arrivals at one instant); never before an arrived one."""
    tr = Trace.from_arrays(np.zeros(4), np.full(4, 10), np.full(4, 2), name="inbox")
    eng = Engine(tr, ENGINE, consult="never", routed=True)
    s = eng.state
    handoff.deliver(s, 0, 2.0, 2, False, L.LOCAL, 0, 1)
    handoff.deliver(s, 1, 1.0, 2, False, L.LOCAL, 0, 1)
    handoff.deliver(s, 2, 1.0, 2, False, L.LOCAL, 0, 0)  # an event of the same instant
    assert s.ids[L.INBOX, :3].tolist() == [2, 1, 0]
    handoff.decided_in_kernel(s, True)
    eng.run_until(1.5, None)  # 2 and 1 have arrived
    assert s.si[L.NEXT_ARRIVAL] == 2
    with pytest.raises(AssertionError, match="before an arrived request"):
        handoff.deliver(s, 3, 0.5, 2, False, L.LOCAL, 0, 1)


def gaps_by_iteration(tr: Trace) -> tuple[list[list[float]], pd.DataFrame]:
    """Every request's gaps between tokens, read after each iteration (asked every one)."""
    eng = Engine(tr, ENGINE, consult="always")
    s = eng.state
    gaps: list[list[float]] = [[] for _ in range(len(tr))]
    seen = s.req[L.GENERATED].copy()
    last = s.times[L.LAST_TOKEN].copy()
    while eng.next_decision() is not None:
        eng.decide(Decision())
        now = s.req[L.GENERATED]
        for rid in np.flatnonzero(now != seen):
            assert now[rid] == seen[rid] + 1  # one token an iteration
            if seen[rid] >= 1:
                gaps[rid].append(float(s.times[L.LAST_TOKEN, rid] - last[rid]))
        seen, last = now.copy(), s.times[L.LAST_TOKEN].copy()
    return gaps, frame(eng)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), long=st.booleans())
def test_itl_p99_is_numpys_percentile_of_the_gaps(seed: int, long: bool) -> None:
    """``itl_p99_s`` is ``np.percentile(gaps, 99)`` of the request's gaps, bit for bit, with
    stretches (the default run) and iteration by iteration; ``itl_max_s`` their maximum."""
    rng = np.random.default_rng(seed)
    n = 30
    out = rng.integers(1, 1500 if long else 200, n)  # long: heaps of up to 16 gaps
    tr = Trace.from_arrays(np.sort(rng.uniform(0, 8, n)), rng.integers(1, 1500, n), out,
                           name="t", rebase=False)
    gaps, stepped = gaps_by_iteration(tr)
    plain = run_plain(tr, True)
    for rid, g in enumerate(gaps):
        if plain["status"].iloc[rid] != "finished":
            continue
        want = float(np.percentile(g, 99)) if g else 0.0
        assert plain["itl_p99_s"].iloc[rid] == want, (rid, len(g))
        assert stepped["itl_p99_s"].iloc[rid] == want
        assert plain["itl_max_s"].iloc[rid] == (max(g) if g else 0.0)


def test_an_output_too_long_for_its_p99_slots_is_a_clear_error() -> None:
    tr = Trace.from_arrays(np.array([0.0]), np.array([10]), np.array([14_000_000]), name="t")
    with pytest.raises(ValueError, match="request 0: 14000000 output tokens.*itl_p99=False"):
        Engine(tr, ENGINE)
    Engine(tr, ENGINE, itl_p99=False)  # only the worst gap: fine
