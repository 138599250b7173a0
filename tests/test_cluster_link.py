"""The KV-transfer link model: hand-computed landing times, max-min fairness, and properties."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cbgym.cluster.link import Link

GB = 1e9
EXACT = 1e-12  # hand-computable cases must come out exact up to rounding
SLACK = 1e-9  # property checks: rounding accumulated over many events


def drain(link: Link) -> list[tuple[float, list[int]]]:
    """Step event by event to the end; (time, tids landed) for each event that landed some."""
    out = []
    while (t := link.next_event_time()) < math.inf:
        if landed := link.advance(t):
            out.append((t, landed))
    return out


def landing_times(events: list[tuple[float, list[int]]]) -> dict[int, float]:
    return {tid: t for t, tids in events for tid in tids}


# -- hand-computed cases ---------------------------------------------------------------------
def test_one_transfer_takes_setup_plus_bytes_over_bandwidth() -> None:
    link = Link([25 * GB, 12 * GB], setup_s=1e-3)
    link.start(7, 0, 1, 3 * GB, now=2.0)
    assert link.rate(7) == 0.0 and link.in_flight(0) == (1, 0) and link.in_flight(1) == (0, 1)
    assert link.next_event_time() == pytest.approx(2.001, rel=EXACT)  # the setup ends
    assert link.advance(link.next_event_time()) == []
    assert link.rate(7) == 12 * GB  # the slower end limits it
    events = drain(link)
    assert events == [(pytest.approx(2.0 + 1e-3 + 3 / 12, rel=EXACT), [7])]
    assert len(link) == 0 and link.in_flight(0) == (0, 0) and link.next_event_time() == math.inf


@pytest.mark.parametrize("pairs", [[(0, 1), (0, 2)], [(0, 2), (1, 2)]], ids=["src", "dst"])
def test_two_transfers_on_one_nic_take_twice_as_long(pairs: list[tuple[int, int]]) -> None:
    link = Link([GB] * 3, setup_s=0.0)
    for tid, (s, d) in enumerate(pairs):
        link.start(tid, s, d, GB, now=0.0)
    assert [link.rate(0), link.rate(1)] == [GB / 2, GB / 2]
    assert drain(link) == [(pytest.approx(2.0, rel=EXACT), [0, 1])]


def test_transfers_on_disjoint_nics_do_not_slow_each_other() -> None:
    link = Link([GB] * 4, setup_s=0.0)
    link.start(0, 0, 1, GB, now=0.0)
    link.start(1, 2, 3, 2 * GB, now=0.0)
    assert drain(link) == [(pytest.approx(1.0, rel=EXACT), [0]), (pytest.approx(2.0), [1])]


def test_a_transfer_joining_midway_reshares_the_rest() -> None:
    link = Link([GB] * 3, setup_s=0.0)
    link.start(0, 0, 1, GB, now=0.0)
    assert link.advance(0.5) == [] and link.bytes_left(0) == pytest.approx(GB / 2, rel=EXACT)
    link.start(1, 0, 2, GB, now=0.5)
    assert link.rate(0) == link.rate(1) == GB / 2
    events = drain(link)
    assert events == [(pytest.approx(1.5, rel=EXACT), [0]), (pytest.approx(2.0, rel=EXACT), [1])]


def test_max_min_fairness_with_unequal_bottlenecks() -> None:
    link = Link([10 * GB, 10 * GB, 2 * GB], setup_s=0.0)
    link.start(0, 0, 1, 8 * GB, now=0.0)
    link.start(1, 0, 2, GB, now=0.0)
    # 0->2 is held to 2 GB/s by its destination; 0->1 takes the source's other 8, not 5.
    assert link.rate(1) == pytest.approx(2 * GB, rel=EXACT)
    assert link.rate(0) == pytest.approx(8 * GB, rel=EXACT)
    events = drain(link)
    # 0->1 has 4 GB left at 0.5 s, then the whole 10 GB/s: lands at 0.9 s.
    assert events == [(pytest.approx(0.5, rel=EXACT), [1]), (pytest.approx(0.9, rel=EXACT), [0])]


def test_a_transfer_in_setup_uses_no_bandwidth() -> None:
    link = Link([GB] * 3, setup_s=0.25)
    link.start(0, 0, 1, GB, now=0.0)  # shares from 0.25
    link.advance(0.5)
    link.start(1, 0, 2, GB, now=0.5)  # in setup until 0.75
    assert link.rate(1) == 0.0 and link.rate(0) == GB and link.in_flight(0) == (2, 0)
    link.advance(0.7)
    assert link.bytes_left(1) == GB and link.bytes_left(0) == pytest.approx(0.55 * GB, rel=EXACT)
    events = drain(link)  # A: 0.5 GB left at 0.75, then half of 1 GB/s
    assert events == [(pytest.approx(1.75, rel=EXACT), [0]), (pytest.approx(2.25, rel=EXACT), [1])]


@pytest.mark.parametrize("setup", [0.0, 0.125])
def test_a_zero_byte_transfer_lands_after_its_setup(setup: float) -> None:
    link = Link([GB, GB], setup_s=setup)
    link.start(3, 1, 0, 0.0, now=1.0)
    assert link.next_event_time() == 1.0 + setup
    assert link.advance(1.0 + setup) == [3] and len(link) == 0


def test_advance_past_many_events_returns_landing_order_with_ties_by_tid() -> None:
    link = Link([GB] * 4, setup_s=0.0)
    link.start(5, 0, 1, GB, now=0.0)
    link.start(2, 2, 3, GB, now=0.0)  # ties with 5 at t=1
    link.start(9, 1, 0, GB / 2, now=0.0)  # 1 egress and 0 ingress are free: lands at 0.5
    assert link.advance(10.0) == [9, 2, 5] and link.now == 10.0


def test_start_later_than_pending_landings_reports_them_on_the_next_advance() -> None:
    link = Link([GB] * 3, setup_s=0.0)
    link.start(0, 0, 1, GB, now=0.0)
    link.start(1, 0, 2, GB, now=3.0)  # 0 landed at 1.0 meanwhile
    assert 0 not in link and 1 in link and link.rate(1) == GB
    assert link.next_event_time() == 3.0  # the clock: landings are waiting to be reported
    assert link.advance(3.0) == [0]
    assert link.next_event_time() == 4.0
    assert link.advance(4.0) == [1]


def test_several_starts_skipping_landings_keep_them_all_for_advance() -> None:
    link = Link([GB] * 3, setup_s=0.0)
    link.start(0, 0, 1, GB, now=0.0)
    link.start(1, 1, 2, GB, now=2.0)  # 0 landed at 1.0
    link.start(2, 2, 0, GB, now=4.0)  # 1 landed at 3.0
    assert link.advance(4.0) == [0, 1] and link.tids() == (2,)


def test_an_unrelated_event_does_not_land_a_short_transfer_early_at_a_large_clock() -> None:
    link = Link([25 * GB] * 4, setup_s=0.0)
    link.start(0, 0, 1, 100.0, now=1e4)  # 4 ns
    link.start(1, 2, 3, 25.0, now=1e4)  # 1 ns
    assert link.advance(link.next_event_time()) == [1]
    assert link.bytes_left(0) == pytest.approx(75.0, rel=1e-3)  # clock resolution at 1e4 s
    assert link.advance(link.next_event_time()) == [0]


def test_load_reports_per_instance_bytes_and_rates_read_only() -> None:
    link = Link([10 * GB, 10 * GB, 2 * GB], setup_s=0.0)
    link.start(0, 0, 1, 8 * GB, now=0.0)
    link.start(1, 0, 2, GB, now=0.0)
    load = link.load()
    assert load.out_bytes_left.tolist() == [9 * GB, 0.0, 0.0]
    assert load.in_bytes_left.tolist() == [0.0, 8 * GB, GB]
    assert load.out_rate.tolist() == pytest.approx([10 * GB, 0, 0], rel=EXACT)
    assert load.n_out.tolist() == [2, 0, 0] and load.n_in.tolist() == [0, 1, 1]
    with pytest.raises(ValueError):
        load.out_bytes_left[0] = 0.0
    with pytest.raises(ValueError):
        link.nic_bytes_per_s[0] = 1.0


def test_landed_or_unknown_tids_raise_key_error() -> None:
    link = Link([GB, GB], setup_s=0.0)
    link.start(0, 0, 1, GB, now=0.0)
    link.advance(2.0)
    for query in (link.bytes_left, link.rate):
        with pytest.raises(KeyError, match="not in flight"):
            query(0)
    link.start(0, 1, 0, GB, now=2.0)  # a landed tid may be reused
    assert link.tids() == (0,)


def test_hundreds_of_concurrent_transfers_run_to_completion() -> None:
    rng = np.random.default_rng(0)
    n = 32
    link = Link(rng.choice([12 * GB, 25 * GB], n), setup_s=1e-4)
    for tid in range(300):
        s, d = rng.choice(n, 2, replace=False)
        link.start(tid, int(s), int(d), float(rng.uniform(1e6, 1e9)), now=tid * 1e-4)
    assert sorted(link.advance(1e3)) == list(range(300)) and len(link) == 0


# -- bad input -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("nic", "setup", "match"),
    [
        ([], 0.0, "nic_bytes_per_s"),
        ([GB, 0.0], 0.0, "nic_bytes_per_s.*> 0"),
        ([GB, -GB], 0.0, "nic_bytes_per_s"),
        ([GB, math.inf], 0.0, "nic_bytes_per_s.*finite"),
        ([GB, math.nan], 0.0, "nic_bytes_per_s"),
        ([GB, GB], -1e-3, "setup_s.*>= 0"),
        ([GB, GB], math.nan, "setup_s"),
    ],
)
def test_bad_construction_is_rejected(nic: list[float], setup: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Link(nic, setup)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((1, 0, 0, GB, 1.0), "src, dst: expected different"),
        ((1, -1, 0, GB, 1.0), "src: expected an instance in 0..2"),
        ((1, 0, 3, GB, 1.0), "dst: expected an instance in 0..2"),
        ((0, 1, 2, GB, 1.0), "tid: .*already in flight"),
        ((1, 0, 1, -1.0, 1.0), "nbytes: expected a finite value >= 0"),
        ((1, 0, 1, math.nan, 1.0), "nbytes"),
        ((1, 0, 1, GB, 0.5), "now: expected a time >= the clock"),
        ((1, 0, 1, GB, math.inf), "now: expected a finite time"),
    ],
)
def test_bad_start_is_rejected(args: tuple[int, int, int, float, float], match: str) -> None:
    link = Link([GB] * 3, setup_s=0.0)
    link.start(0, 0, 1, 10 * GB, now=1.0)
    with pytest.raises(ValueError, match=match):
        link.start(*args)


def test_time_going_backwards_and_bad_instance_are_rejected() -> None:
    link = Link([GB] * 2, setup_s=0.0)
    link.advance(1.0)
    with pytest.raises(ValueError, match="t: expected a time >= the clock"):
        link.advance(0.5)
    with pytest.raises(ValueError, match="instance: expected an instance in 0..1"):
        link.in_flight(2)


# -- properties ------------------------------------------------------------------------------
Transfers = list[tuple[float, int, int, float]]  # (start time, src, dst, nbytes); tid = index


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[float], float, Transfers]:
    n = draw(st.integers(2, 5))
    nic = draw(
        st.lists(
            st.one_of(st.sampled_from([GB, 2 * GB, 12 * GB, 25 * GB]), st.floats(1e8, 1e11)),
            min_size=n,
            max_size=n,
        )
    )
    setup = draw(st.sampled_from([0.0, 1e-4, 0.05]))
    transfers = []
    for _ in range(draw(st.integers(1, 12))):
        s = draw(st.integers(0, n - 1))
        d = (s + draw(st.integers(1, n - 1))) % n
        nbytes = draw(st.one_of(st.just(0.0), st.sampled_from([GB, 3 * GB]), st.floats(0, 1e10)))
        # a coarse grid makes simultaneous starts and landings common
        t0 = draw(st.one_of(st.sampled_from([0.0, 0.1, 0.5, 1.0]), st.floats(0, 2)))
        transfers.append((t0, s, d, nbytes))
    return nic, setup, transfers


def simulate(
    nic: list[float], setup: float, transfers: Transfers, order: list[int] | None = None
) -> tuple[dict[int, float], list[int], dict[int, float], dict[int, float]]:
    """Event-driven run checking invariants at every event.

    Returns (landing time per tid, landing order, bytes integrated from the rates, their slop).
    """
    link = Link(nic, setup)
    cap = np.asarray(nic)
    tids = order if order is not None else range(len(transfers))
    todo = sorted(tids, key=lambda k: transfers[k][0])  # stable: same-time starts keep `order`
    moved = dict.fromkeys(range(len(transfers)), 0.0)
    # rate * dt is only as exact as the clock: a few ulps of t per event, in bytes
    slop = dict.fromkeys(range(len(transfers)), 0.0)
    land: dict[int, float] = {}
    seq: list[int] = []
    now, i = 0.0, 0
    while True:
        t = min(link.next_event_time(), transfers[todo[i]][0] if i < len(todo) else math.inf)
        if t == math.inf:
            break
        for k in link.tids():  # rates are constant until the next event: integrate them
            moved[k] += link.rate(k) * (t - now)
            slop[k] += 4 * link.rate(k) * math.ulp(t)
        for k in link.advance(t):
            assert k not in land  # lands exactly once
            land[k] = t
            seq.append(k)
        now = t
        while i < len(todo) and transfers[todo[i]][0] == t:
            k = todo[i]
            link.start(k, transfers[k][1], transfers[k][2], transfers[k][3], now=t)
            i += 1
        check_state(link, cap, transfers, moved, slop)
    return land, seq, moved, slop


def check_state(
    link: Link,
    cap: np.ndarray,
    transfers: Transfers,
    moved: dict[int, float],
    slop: dict[int, float],
) -> None:
    load = link.load()
    assert (load.out_rate <= cap * (1 + SLACK)).all() and (load.in_rate <= cap * (1 + SLACK)).all()
    n = len(cap)
    for k in link.tids():
        t0, s, d, nbytes = transfers[k]
        err = abs(link.bytes_left(k) - (nbytes - moved[k]))
        assert err <= SLACK * nbytes + slop[k]
        if link.now < t0 + link.setup_s:
            assert link.rate(k) == 0.0
            continue
        # max-min fair: each sharing transfer has a saturated NIC side on which it is the largest
        assert link.rate(k) > 0
        ok = False
        for side, i, used in ((0, s, load.out_rate), (1, d, load.in_rate)):
            users = [m for m in link.tids() if transfers[m][1 + side] == i]
            top = max(link.rate(m) for m in users)
            ok |= used[i] >= cap[i] * (1 - SLACK) and link.rate(k) >= top * (1 - SLACK)
        assert ok, f"transfer {k} has no bottleneck among {n} instances"


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_every_transfer_lands_once_never_faster_than_alone_and_bytes_are_conserved(
    sc: tuple[list[float], float, Transfers],
) -> None:
    nic, setup, transfers = sc
    land, seq, moved, slop = simulate(nic, setup, transfers)
    assert sorted(land) == list(range(len(transfers))) and len(seq) == len(transfers)
    for k, (t0, s, d, nbytes) in enumerate(transfers):
        bw = min(nic[s], nic[d])
        alone = t0 + setup + nbytes / bw
        assert land[k] >= alone - SLACK * max(alone, 1.0)
        # (+ what lands within one clock tick of joining, which the driver never sees moving)
        assert abs(moved[k] - nbytes) <= SLACK * nbytes + slop[k] + 4 * bw * math.ulp(land[k])


@settings(max_examples=100, deadline=None)
@given(scenarios(), st.randoms(use_true_random=False))
def test_results_do_not_depend_on_the_start_order_at_one_instant(
    sc: tuple[list[float], float, Transfers], rnd: random.Random
) -> None:
    nic, setup, transfers = sc
    base = simulate(nic, setup, transfers)
    order = list(range(len(transfers)))
    rnd.shuffle(order)
    assert simulate(nic, setup, transfers, order)[:2] == base[:2]  # bit for bit


@settings(max_examples=100, deadline=None)
@given(scenarios())
def test_one_long_advance_matches_stepping_event_by_event(
    sc: tuple[list[float], float, Transfers],
) -> None:
    nic, setup, transfers = sc
    seq = simulate(nic, setup, transfers)[1]
    link = Link(nic, setup)
    got: list[int] = []
    for k in sorted(range(len(transfers)), key=lambda k: transfers[k][0]):
        t0, s, d, nbytes = transfers[k]
        got += link.advance(t0)
        link.start(k, s, d, nbytes, now=t0)
    got += link.advance(1e6)
    assert got == seq and len(link) == 0


def test_many_transfers_at_once_grow_the_link_and_share_it_equally() -> None:
    """200 transfers out of one NIC (more than the link's first rows: it grows), started in
    reverse tid order (the state stays sorted by tid), share it equally and land together
    at 200 x bytes / bandwidth."""
    link = Link([10 * GB] + [10 * GB] * 4, setup_s=0.0)
    for tid in range(200, 0, -1):  # (started in reverse tid order)
        link.start(tid, 0, 1 + tid % 4, 1 * GB, now=0.0)
    assert len(link) == 200 and list(link.tids()) == list(range(1, 201))
    assert all(link.rate(t) == pytest.approx(10 * GB / 200, rel=EXACT) for t in link.tids())
    events = drain(link)
    assert len(events) == 1 and sorted(events[0][1]) == list(range(1, 201))
    assert events[0][0] == pytest.approx(200 * GB / (10 * GB), rel=EXACT)
