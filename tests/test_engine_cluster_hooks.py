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
from cbgym.engine import handoff, itl
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


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_the_pooled_itl_is_every_gap_of_the_run(seed: int) -> None:
    """The run's pooled inter-token latencies (vLLM's benchmark's mean, std, median, p99
    over every gap of every request) from the histogram: the count and mean exact, the
    percentiles within the bins' 0.2%; the same histogram with stretches and without."""
    tr = trace_of(seed, 40)
    gaps, _ = gaps_by_iteration(tr)
    pooled = np.array([g for run in gaps for g in run])
    res = simulate(tr, engine=ENGINE)
    h = res.itl_histogram
    assert h is not None and h[itl.COUNT] == len(pooled)
    stepped = Engine(tr, ENGINE, consult="always")
    while stepped.next_decision() is not None:
        stepped.decide(Decision())
    assert (stepped.state.sf[L.ITL:][: itl.NUM_BINS] == h[: itl.NUM_BINS]).all()
    got = res.summary()
    if not len(pooled):
        assert np.isnan(got["itl_mean"])
        return
    assert got["itl_mean"] == pytest.approx(pooled.mean(), rel=1e-12)
    assert got["itl_std"] == pytest.approx(pooled.std(), rel=1e-6, abs=1e-12)
    for q in (50, 90, 95, 99):
        assert got[f"itl_p{q}"] == pytest.approx(np.percentile(pooled, q), rel=2e-3)


def test_the_pooled_itl_of_a_cluster_adds_its_instances() -> None:
    """One replica's pooled gaps are the single engine's; two replicas' are the sum of the
    two engines fed the round-robin split; the study's engine mode keeps none (NaN)."""
    from cbgym.cluster import ClusterConfig, Pool

    tr = trace_of(3, 60)
    one = simulate(tr, engine=ENGINE).itl_histogram
    cfg = ClusterConfig((Pool("unified", 1, ENGINE),))
    assert np.array_equal(simulate(tr, cluster=cfg).itl_histogram, one)
    both = simulate(tr, cluster=ClusterConfig((Pool("unified", 2, ENGINE),))).itl_histogram
    halves = []
    for i in (0, 1):
        ids = np.arange(i, len(tr), 2)
        part = Trace.from_arrays(tr.arrival_s[ids], tr.prompt_tokens[ids],
                                 tr.output_tokens[ids], name="part", rebase=False)
        halves.append(simulate(part, engine=ENGINE).itl_histogram)
    assert both is not None and np.array_equal(both[: itl.NUM_BINS],
                                               (halves[0] + halves[1])[: itl.NUM_BINS])
    study = simulate(tr, engine="cbsjf-paper")
    assert study.itl_histogram is None and np.isnan(study.summary()["itl_p99"])
