"""The environment's per-step work compiled with numba: windows, actions, observation, reward.

Each function is a port of its Python twin, the same arithmetic in the same order, so that the
compiled backend gives the Python backend's results (``tests/test_kernel.py``):

* :func:`visible` — ``SchedulingEnv._visible_waiting`` and the running window;
* :func:`decode_scores` — :func:`cbgym.env.action.decode_scores`;
* :func:`observe` — :class:`cbgym.env.observation.ObservationEncoder` (its ``log2`` is libm's,
  as Python's ``math.log2``; numpy's vectorised ``log2`` differs from libm in the last bit for
  about 1 value in 10**4, so slot features may differ by one float32 ulp, never more);
* :func:`reward` — :meth:`cbgym.env.reward.RewardTracker.update`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import njit

from cbgym.agents.base import OUTPUT_STAT_EDGES, OUTPUT_STAT_WINDOW
from cbgym.engine import kernel as k
from cbgym.engine.kernel import State

_EDGES = OUTPUT_STAT_EDGES.copy()
_NB = len(_EDGES) + 1
_WINDOW = OUTPUT_STAT_WINDOW
_COUNT_SPAN, _TIME_SPAN = 24.0, 32.0  # as cbgym.env.observation
_MEAN_SCALE, _MEAN_HIGH = 1.0 / 1024.0, 256.0
_F = 8  # slot features
_G = 18 + 2 * _NB + 2  # global features
_RATE_WINDOW = 32
_WAITING, _SHED = k.WAITING, k.SHED
INVALID_ACTION = 100  # step_scores: a score outside [-1, 1] or NaN (the index comes back)


class EnvState(NamedTuple):
    """The environment's side of the compiled step (arrays mutated in place)."""

    K: int
    R: int
    smallest_prompt: bool  # window_rule == "smallest_prompt"
    hold: float
    shed_on: bool
    shed_threshold: float
    token_budget: int
    max_seqs: int
    template: np.ndarray  # per-request static slot features (observation.slot_template)
    ttft_target: np.ndarray
    tpot_target: np.ndarray
    # reward tracker (RewardTracker's fields): deadlines in order, arrival prefix sums, ...
    dl_order: np.ndarray
    dl_sorted: np.ndarray
    deadline: np.ndarray
    arr_prefix: np.ndarray
    shed_seen: np.ndarray
    ti: np.ndarray  # finished, ended, next deadline
    tf: np.ndarray  # sum of finish times (finished), (shed), time, area
    recent: np.ndarray  # the output-length features of the observation
    seen_finished: np.ndarray  # completions the recent features reflect (1 element)
    stat_sums: np.ndarray  # output tokens of the window's completions per bucket, then all
    stat_counts: np.ndarray  # completions in the window per bucket, then all
    w_ids: np.ndarray  # visible waiting ids (K), then running (R); first point[0] / [1] valid
    r_ids: np.ndarray
    point: np.ndarray  # nw, nr, shortfall of the pending decision point


def new_env_state(K: int, R: int, smallest_prompt: bool, hold: float,
                  shed_threshold: float | None, token_budget: int, max_seqs: int,
                  template: np.ndarray, arrival_s: np.ndarray, ttft_target: np.ndarray,
                  tpot_target: np.ndarray) -> EnvState:
    """The env's kernel state at the start of an episode (the reward's laid out as
    RewardTracker's: deadlines in order, prefix sums of arrivals)."""
    deadline = arrival_s + ttft_target
    dl_order = np.argsort(deadline, kind="stable")
    return EnvState(
        K, R, smallest_prompt, float(hold), shed_threshold is not None,
        -2.0 if shed_threshold is None else float(shed_threshold), token_budget, max_seqs,
        template, ttft_target, tpot_target, dl_order, deadline[dl_order], deadline,
        np.concatenate(([0.0], np.cumsum(arrival_s))), np.zeros(len(arrival_s), dtype=bool),
        np.zeros(3, np.int64), np.zeros(4), np.zeros(_G - 18), np.zeros(1, np.int64),
        np.zeros(_NB + 1), np.zeros(_NB + 1, np.int64), np.zeros(K, np.int64),
        np.zeros(R, np.int64), np.zeros(3, np.int64))


@njit(cache=True)
def visible(s: State, e: EnvState) -> None:
    """Fix the pending point's visible windows (``e.point``: nw, nr, shortfall)."""
    K, R = e.K, e.R
    nw_all, nr_all = s.si[k.N_WAIT], s.si[k.N_RUN]
    if nw_all <= K or not e.smallest_prompt:
        nw = min(nw_all, K)
        e.w_ids[:nw] = s.waiting[:nw]
    else:
        waiting = s.waiting[:nw_all]
        pick = np.argsort(s.prompt[waiting], kind="mergesort")[:K]
        pick.sort()  # shown in queue order
        nw = K
        e.w_ids[:K] = waiting[pick]
    nr = min(nr_all, R)
    e.r_ids[:nr] = s.running[nr_all - nr:nr_all]
    e.point[0], e.point[1], e.point[2] = nw, nr, s.si[k.SHORTFALL]


@njit(cache=True)
def decode_scores(s: State, e: EnvState, a: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(order, shed, victims) ids from a validated score vector; see ``decode_scores``."""
    nw, nr, shortfall = e.point[0], e.point[1], e.point[2] > 0
    idx = np.empty(nw, np.int64)  # descending score, ties in slot order (insertion sort)
    for i in range(nw):
        p = i
        while p > 0 and a[idx[p - 1]] < a[i]:
            idx[p] = idx[p - 1]
            p -= 1
        idx[p] = i
    m = 0
    while m < nw and a[idx[m]] >= e.hold:
        m += 1
    order = e.w_ids[idx[:m]]
    n_shed = 0
    shed = np.empty(nw, np.int64)
    if e.shed_on and nw and a[:nw].min() <= e.shed_threshold:
        now = s.sf[k.NOW]
        for i in range(nw):
            rid = e.w_ids[i]
            if now - s.arrival_s[rid] > e.ttft_target[rid] and a[i] <= e.shed_threshold:
                shed[n_shed] = rid
                n_shed += 1
    victims = np.empty(nr if shortfall else 0, np.int64)
    if shortfall:  # ascending score, ties latest admitted first
        vi = np.empty(nr, np.int64)
        K = e.K
        for c in range(nr):
            j = nr - 1 - c
            p = c
            while p > 0 and a[K + vi[p - 1]] > a[K + j]:
                vi[p] = vi[p - 1]
                p -= 1
            vi[p] = j
        victims[:] = e.r_ids[vi]
    return order, shed[:n_shed], victims


@njit(cache=True)
def _count(x: float) -> float:
    return min(math.log2(1.0 + x) / _COUNT_SPAN, 1.0)


@njit(cache=True)
def _time(x: float) -> float:
    return min(math.log2(1.0 + max(x, 0.0) * 1000.0) / _TIME_SPAN, 1.0)


@njit(cache=True)
def _update_recent(s: State, e: EnvState) -> None:
    """Refresh the output-length statistics when a request finished since the last call.

    The window's per-bucket sums move incrementally (completions enter, the oldest leave);
    they are sums of integers, exact in float64, so this equals recomputing them.
    """
    nf, recent = s.si[k.NUM_FINISHED], e.recent
    prev = e.seen_finished[0]
    if nf == prev:
        return
    e.seen_finished[0] = nf
    sums, counts = e.stat_sums, e.stat_counts
    for j, sign in ((max(prev - _WINDOW, 0), -1), (prev, 1)):  # leaving, then entering
        stop = max(nf - _WINDOW, 0) if sign < 0 else nf
        for jj in range(j, stop):
            rid = s.finish_order[jj]
            b = np.searchsorted(_EDGES, s.prompt[rid], side="right")
            sums[b] += sign * s.generated[rid]
            counts[b] += sign
            sums[_NB] += sign * s.generated[rid]
            counts[_NB] += sign
    for b in range(_NB):
        if counts[b]:
            mean = np.float64(np.float32(sums[b] / counts[b]))
            recent[b] = min(mean * _MEAN_SCALE, _MEAN_HIGH)
            recent[_NB + b] = 1.0
        else:
            recent[b] = recent[_NB + b] = 0.0
    has_mean = counts[_NB] > 0
    mean_all = np.float64(np.float32(sums[_NB] / counts[_NB])) if has_mean else 0.0
    recent[2 * _NB] = min(mean_all * _MEAN_SCALE, _MEAN_HIGH) if has_mean else 0.0
    recent[2 * _NB + 1] = 1.0 if has_mean else 0.0


@njit(cache=True)
def observe(s: State, e: EnvState, drained: bool, chosen_w: np.ndarray, chosen_r: np.ndarray,
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(global, waiting, waiting_mask, running, running_mask, waited seconds), fresh arrays."""
    si, now, K, R = s.si, s.sf[k.NOW], e.K, e.R
    nw, nr, shortfall = e.point[0], e.point[1], e.point[2]
    g = np.zeros(_G, np.float32)
    waiting = np.zeros(K * _F, np.float32)
    w_mask = np.zeros(K, np.float32)
    running = np.zeros(R * _F, np.float32)
    r_mask = np.zeros(R, np.float32)
    waited = np.zeros(K)
    n_wait = n_run = 0
    w_prompt = r_prompt = r_computed = r_generated = 0
    if drained:
        nw = nr = shortfall = 0
    else:
        _update_recent(s, e)
        n_wait, n_run = si[k.N_WAIT], si[k.N_RUN]
        for i in range(n_wait):
            w_prompt += s.prompt[s.waiting[i]]
        for i in range(n_run):
            rid = s.running[i]
            r_prompt += s.prompt[rid]
            r_computed += s.computed[rid]
            r_generated += s.generated[rid]
    free, num_blocks, budget = si[k.FREE], s.ci[k.NUM_BLOCKS], e.token_budget
    a = np.searchsorted(s.arrival_s, now, side="right")
    m = min(_RATE_WINDOW, a)
    rate = m / max(now - s.arrival_s[a - m], 1e-3) if m else 0.0
    g[0], g[1] = _count(n_wait), _count(n_run)
    g[2], g[3], g[4] = _count(w_prompt), _count(r_prompt), _count(r_computed)
    g[5], g[6] = 1.0 - free / num_blocks, _count(free)
    g[7], g[8] = _count(si[k.TOTAL_PREEMPT]), _count(rate)
    g[9], g[10], g[11] = _time(now), _time(s.sf[k.LAST_DT]), _count(shortfall)
    g[12] = _count(budget)
    g[13] = _count(max(budget - (r_prompt + r_generated - r_computed), 0))
    g[14], g[15] = _count(max(e.max_seqs - n_run, 0)), _count(n_wait - nw)
    g[16] = 1.0 if shortfall > 0 else 0.0
    g[17] = _count(len(chosen_w) + len(chosen_r))
    g[18:] = e.recent
    for slot in range(nw + nr):
        if slot < nw:
            rid, out, base = e.w_ids[slot], waiting, slot * _F
            w_mask[slot] = 1.0
            waited[slot] = now - s.arrival_s[rid]
        else:
            rid, out, base = e.r_ids[slot - nw], running, (slot - nw) * _F
            r_mask[slot - nw] = 1.0
        row = e.template[rid]
        out[base + 0] = row[0]
        out[base + 1] = min(math.log2(s.computed[rid] + 1.0) * (1 / _COUNT_SPAN), 1.0)
        out[base + 2] = min(math.log2(s.generated[rid] + 1.0) * (1 / _COUNT_SPAN), 1.0)
        ms = (now - s.arrival_s[rid]) * 1000.0
        out[base + 3] = min(math.log2(ms + 1.0) * (1 / _TIME_SPAN), 1.0)
        out[base + 4] = min(math.log2(s.preemptions[rid] + 1.0) * (1 / _COUNT_SPAN), 1.0)
        out[base + 5], out[base + 6] = row[5], row[6]
    for i in chosen_w:
        waiting[i * _F + 7] = 1.0
    for j in chosen_r:
        running[j * _F + 7] = 1.0
    return g, waiting, w_mask, running, r_mask, waited


@njit(cache=True)
def reward(s: State, e: EnvState) -> np.ndarray:
    """One step's (num_good, num_finished, num_shed, ttft misses, latency, elapsed)."""
    si, now, ti, tf = s.si, s.sf[k.NOW], e.ti, e.tf
    f0, f1 = ti[0], si[k.NUM_FINISHED]
    num_good = 0
    for j in range(f0, f1):
        rid = s.finish_order[j]
        first, finish, gen = s.first_token_s[rid], s.finish_s[rid], s.generated[rid]
        tpot = (finish - first) / max(gen - 1, 1) if gen > 1 else 0.0
        if first - s.arrival_s[rid] <= e.ttft_target[rid] and tpot <= e.tpot_target[rid]:
            num_good += 1
        tf[0] += finish
    num_shed = (si[k.NUM_ENDED] - ti[1]) - (f1 - f0)
    if num_shed:
        for rid in range(len(s.status)):
            if s.status[rid] == _SHED and not e.shed_seen[rid]:
                e.shed_seen[rid] = True
                tf[1] += s.finish_s[rid]
    ti[0], ti[1] = f1, si[k.NUM_ENDED]
    misses = 0  # TTFT deadlines that passed unmet (requests shed before theirs excepted)
    j1 = np.searchsorted(e.dl_sorted, now, side="right")
    for j in range(ti[2], j1):
        rid = e.dl_order[j]
        met = s.first_token_s[rid] <= e.deadline[rid]
        shed_before = s.status[rid] == _SHED and s.finish_s[rid] <= e.deadline[rid]
        if not met and not shed_before:
            misses += 1
    ti[2] = max(ti[2], j1)
    a = np.searchsorted(s.arrival_s, now, side="right")
    ended = si[k.NUM_ENDED]
    area = a * now - e.arr_prefix[a] - (ended * now - tf[0] - tf[1])
    latency, elapsed = area - tf[3], now - tf[2]
    tf[2], tf[3] = now, area
    return np.array([num_good, f1 - f0, num_shed, misses, latency, elapsed], np.float64)


_Obs = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@njit(cache=True)
def after_decide(s: State, e: EnvState, drained: bool) -> tuple[_Obs, np.ndarray]:
    """The new point's windows, then the step's reward outcome and the observation."""
    if not drained:
        visible(s, e)
    outcome = reward(s, e)
    none = np.empty(0, np.int64)
    return observe(s, e, drained, none, none), outcome


@njit(cache=True)
def step_scores(s: State, e: EnvState, a: np.ndarray) -> tuple[int, _Obs, np.ndarray]:
    """One ``Scheduling-v0`` step: validate, decode, decide, advance, score, observe.

    Returns (code, observation, outcome). ``code`` is the engine's AT_DECISION or DRAINED with
    everything filled in; NEED_ROOM or TOO_MANY_IDLE_TICKS (the caller settles, then calls
    :func:`after_decide`); or INVALID_ACTION, with nothing applied.
    """
    empty = np.empty(0, np.float32)
    nothing = (empty, empty, empty, empty, empty, np.empty(0)), np.empty(0)
    for x in a:
        if not -1.0 <= x <= 1.0:  # NaN fails too
            return INVALID_ACTION, nothing[0], nothing[1]
    order, shed, victims = decode_scores(s, e, a)
    code = k.decide(s, order, True, shed, victims)
    if code != k.AT_DECISION and code != k.DRAINED:
        return code, nothing[0], nothing[1]
    obs, outcome = after_decide(s, e, code == k.DRAINED)
    return code, obs, outcome
