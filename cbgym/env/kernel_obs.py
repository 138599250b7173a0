"""The environment's observation encoder and reward, compiled: the one implementation.

The feature tables and scalings are documented in :mod:`cbgym.env.observation` and
:mod:`cbgym.env.reward`; the step that calls them after each decision is
:func:`cbgym.env.kernel_ops.finish_step`. Both are incremental: the output-length features
move as requests finish, the reward's sums as requests end and deadlines pass.
"""

from __future__ import annotations

import math

import numpy as np

from cbgym.engine import layout as L
from cbgym.engine.jit import inline_kernel, kernel
from cbgym.engine.kutil import count_at_most
from cbgym.engine.layout import State
from cbgym.env.kernel_state import (
    _COUNT_SPAN,
    _EDGES,
    _KINDS,
    _MEAN_HIGH,
    _MEAN_SCALE,
    _NB,
    _RATE_WINDOW,
    _TIME_SPAN,
    _WINDOW,
    AREA,
    COUNTS,
    DEADLINE,
    DL_NEXT,
    DL_ORDER,
    DL_SORTED,
    ENDED_SEEN,
    FIN_SEEN,
    K_SLOTS,
    MAX_SEQS,
    NR,
    NUM_BLOCKS,
    NW,
    R_SLOTS,
    RECENT,
    RECENT_SEEN,
    SHED_SEEN,
    SHORT,
    SUM_FIN,
    SUM_SHED,
    SUMS,
    T_LAST,
    TOKEN_BUDGET,
    TPOT,
    TTFT,
    W_IDS,
    EnvState,
    F,
    G,
)

__all__ = ["account_sheds", "observe", "reward", "update_recent"]


@kernel
def update_recent(s: State, e: EnvState) -> None:
    """Refresh the output-length features when a request finished since the last call.

    The window's per-bucket sums move incrementally (completions enter, the oldest leave);
    they are sums of integers, exact in float64, so this equals recomputing them.
    """
    acc_i, acc_f = e.acc_i, e.acc_f
    nf, prev = s.si[L.NUM_FINISHED], acc_i[RECENT_SEEN]
    if nf == prev:
        return
    acc_i[RECENT_SEEN] = nf
    finish_order, prompt, generated = s.ids[L.FINISH_ORDER], s.req[L.PROMPT], s.req[L.GENERATED]
    for lo, hi, sign in ((max(prev - _WINDOW, 0), max(nf - _WINDOW, 0), -1),  # leaving
                         (prev, nf, 1)):  # entering
        for j in range(lo, hi):
            rid = finish_order[j]
            b = count_at_most(_EDGES, float(prompt[rid]))
            for slot in (b, _NB):  # its bucket, and all
                acc_f[SUMS + slot] += sign * generated[rid]
                acc_i[COUNTS + slot] += sign
    for b in range(_NB + 1):
        count = acc_i[COUNTS + b]
        mean = np.float64(np.float32(acc_f[SUMS + b] / count)) if count else 0.0
        # the bucket means, then their seen flags; the overall mean and its flag last
        at = RECENT + (b if b < _NB else 2 * _NB)
        seen_at = RECENT + (_NB + b if b < _NB else 2 * _NB + 1)
        acc_f[at] = min(mean * _MEAN_SCALE, _MEAN_HIGH)
        acc_f[seen_at] = 1.0 if count else 0.0


@kernel
def observe(s: State, e: EnvState, drained: bool, chosen_w: np.ndarray, chosen_r: np.ndarray,
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(global, waiting, waiting_mask, running, running_mask, waited seconds), fresh arrays."""
    si, now, K, R = s.si, s.sf[L.NOW], e.cfg_i[K_SLOTS], e.cfg_i[R_SLOTS]
    win, prompt, computed, generated = e.win, s.req[L.PROMPT], s.req[L.COMPUTED], s.req[
        L.GENERATED]
    arrival, preemptions = s.times[L.ARRIVAL], s.req[L.PREEMPTIONS]
    nw, nr, shortfall = win[NW], win[NR], win[SHORT]
    g = np.zeros(G, np.float32)
    waiting = np.zeros(K * F, np.float32)
    w_mask = np.zeros(K, np.float32)
    running = np.zeros(R * F, np.float32)
    r_mask = np.zeros(R, np.float32)
    waited = np.zeros(K)
    n_wait = n_run = w_prompt = r_prompt = r_computed = r_generated = 0
    if drained:
        nw = nr = shortfall = 0
    else:
        update_recent(s, e)
        n_wait, n_run = si[L.N_WAIT], si[L.N_RUN]
        for i in range(n_wait):
            w_prompt += prompt[s.ids[L.WAIT_Q, i]]
        for i in range(n_run):
            rid = s.ids[L.RUN_Q, i]
            r_prompt += prompt[rid]
            r_computed += computed[rid]
            r_generated += generated[rid]
    free, budget = si[L.FREE], e.cfg_i[TOKEN_BUDGET]
    a = count_at_most(arrival, now)
    m = min(_RATE_WINDOW, a)
    rate = m / max(now - arrival[a - m], 1e-3) if m else 0.0
    # GLOBAL_FEATURES[:18] in raw units, then scaled by kind (count, fraction, time, flag)
    raw = np.empty(18)
    raw[0], raw[1], raw[2], raw[3], raw[4] = n_wait, n_run, w_prompt, r_prompt, r_computed
    raw[5], raw[6] = 1.0 - free / e.cfg_i[NUM_BLOCKS], free
    raw[7], raw[8], raw[9], raw[10] = si[L.TOTAL_PREEMPT], rate, now, s.sf[L.LAST_DT]
    raw[11], raw[12] = shortfall, budget
    raw[13] = max(budget - (r_prompt + r_generated - r_computed), 0)
    raw[14], raw[15] = max(e.cfg_i[MAX_SEQS] - n_run, 0), n_wait - nw
    raw[16], raw[17] = 1.0 if shortfall > 0 else 0.0, len(chosen_w) + len(chosen_r)
    for i in range(18):
        x = raw[i]
        if _KINDS[i] == 0:  # count
            g[i] = min(math.log2(1.0 + x) / _COUNT_SPAN, 1.0)
        elif _KINDS[i] == 2:  # time, in milliseconds
            g[i] = min(math.log2(1.0 + max(x, 0.0) * 1000.0) / _TIME_SPAN, 1.0)
        else:  # fraction, flag
            g[i] = x
    for i in range(G - 18):
        g[18 + i] = e.acc_f[RECENT + i]
    for slot in range(nw + nr):
        if slot < nw:
            rid, out, base = win[W_IDS + slot], waiting, slot * F
            w_mask[slot] = 1.0
            waited[slot] = now - arrival[rid]
        else:
            rid, out, base = win[W_IDS + K + slot - nw], running, (slot - nw) * F
            r_mask[slot - nw] = 1.0
        row = e.template[rid]
        out[base + 0] = row[0]
        out[base + 1] = min(math.log2(computed[rid] + 1.0) * (1 / _COUNT_SPAN), 1.0)
        out[base + 2] = min(math.log2(generated[rid] + 1.0) * (1 / _COUNT_SPAN), 1.0)
        ms = (now - arrival[rid]) * 1000.0
        out[base + 3] = min(math.log2(ms + 1.0) * (1 / _TIME_SPAN), 1.0)
        out[base + 4] = min(math.log2(preemptions[rid] + 1.0) * (1 / _COUNT_SPAN), 1.0)
        out[base + 5], out[base + 6] = row[5], row[6]
    for i in chosen_w:
        waiting[i * F + 7] = 1.0
    for j in chosen_r:
        running[j * F + 7] = 1.0
    return g, waiting, w_mask, running, r_mask, waited


@inline_kernel
def reward(s: State, e: EnvState) -> np.ndarray:
    """One step's (num_good, num_finished, num_shed, ttft misses, latency, elapsed)."""
    si, now, acc_i, acc_f, t = s.si, s.sf[L.NOW], e.acc_i, e.acc_f, e.targets
    arrival, first, finish = s.times[L.ARRIVAL], s.times[L.FIRST_TOKEN], s.times[L.FINISH]
    status, generated = s.req[L.STATUS], s.req[L.GENERATED]
    f0, f1 = acc_i[FIN_SEEN], si[L.NUM_FINISHED]
    num_good = 0
    for j in range(f0, f1):  # completions, in completion order
        rid = s.ids[L.FINISH_ORDER, j]
        gen = generated[rid]
        tpot = (finish[rid] - first[rid]) / max(gen - 1, 1) if gen > 1 else 0.0
        if first[rid] - arrival[rid] <= t[TTFT, rid] and tpot <= t[TPOT, rid]:
            num_good += 1
        acc_f[SUM_FIN] += finish[rid]
    num_shed = (si[L.NUM_ENDED] - acc_i[ENDED_SEEN]) - (f1 - f0)
    if num_shed:  # sheds, in request-id order
        seen = e.order[SHED_SEEN]
        for rid in range(len(status)):
            if status[rid] == L.SHED and not seen[rid]:
                seen[rid] = 1
                acc_f[SUM_SHED] += finish[rid]
    acc_i[FIN_SEEN], acc_i[ENDED_SEEN] = f1, si[L.NUM_ENDED]
    misses = 0  # TTFT deadlines that passed unmet (requests shed before theirs excepted)
    j1 = count_at_most(t[DL_SORTED], now)
    for j in range(acc_i[DL_NEXT], j1):
        rid = e.order[DL_ORDER, j]
        met = first[rid] <= t[DEADLINE, rid]
        shed_before = status[rid] == L.SHED and finish[rid] <= t[DEADLINE, rid]
        if not met and not shed_before:
            misses += 1
    acc_i[DL_NEXT] = max(acc_i[DL_NEXT], j1)
    # Little's law: requests in system integrated over time, from arrival and finish sums
    a = count_at_most(arrival, now)
    ended = si[L.NUM_ENDED]
    area = a * now - e.arr_prefix[a] - (ended * now - acc_f[SUM_FIN] - acc_f[SUM_SHED])
    latency, elapsed = area - acc_f[AREA], now - acc_f[T_LAST]
    acc_f[T_LAST], acc_f[AREA] = now, area
    return np.array([num_good, f1 - f0, num_shed, misses, latency, elapsed], np.float64)


@kernel
def account_sheds(s: State, e: EnvState) -> int:
    """Count the requests shed before the episode's first decision (those that can never
    fit): the reset's ``info["num_shed"]``, so that no step's reward takes them."""
    status, seen = s.req[L.STATUS], e.order[SHED_SEEN]
    k = 0
    for rid in range(len(status)):
        if status[rid] == L.SHED and not seen[rid]:
            seen[rid] = 1
            e.acc_f[SUM_SHED] += s.times[L.FINISH, rid]
            k += 1
    e.acc_i[ENDED_SEEN] += k
    return k
