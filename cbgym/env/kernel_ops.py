"""The environment's per-step work, compiled: windows, actions, observation, reward.

This is the one implementation of the env's observation encoding and reward (the feature
tables and scalings are documented in :mod:`cbgym.env.observation` and
:mod:`cbgym.env.reward`). A ``Scheduling-v0`` step is one call of :func:`step_scores`:
decode the scores into a decision, apply it through the engine's :func:`decide`, fix the new
decision point's visible windows, score the step and encode the observation.

:class:`EnvState` is the env's side of the kernel state, packed like the engine's
(:mod:`cbgym.engine.layout`) into a few arrays under the names below.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from cbgym.agents.base import OUTPUT_STAT_EDGES, OUTPUT_STAT_WINDOW
from cbgym.engine import layout as L
from cbgym.engine.jit import inline_kernel, kernel
from cbgym.engine.kutil import count_at_most, sort_by_key
from cbgym.engine.layout import Params, State
from cbgym.engine.loop import decide

_EDGES = OUTPUT_STAT_EDGES.astype(np.float64)
_NB = np.int64(len(_EDGES) + 1)
_WINDOW = np.int64(OUTPUT_STAT_WINDOW)
_COUNT_SPAN, _TIME_SPAN = 24.0, 32.0  # as cbgym.env.observation
_MEAN_SCALE, _MEAN_HIGH = 1.0 / 1024.0, 256.0
F = 8  # slot features
G = 18 + 2 * _NB + 2  # global features
_RATE_WINDOW = np.int64(32)
INVALID_ACTION = np.int64(100)  # step_scores: a score outside [-1, 1] or NaN
# scaling of the first 18 global features (cbgym.env.observation.GLOBAL_FEATURES' kinds)
_KINDS = np.array([0, 0, 0, 0, 0, 1, 0, 0, 0, 2, 2, 0, 0, 0, 0, 0, 3, 0], np.int64)

# cfg_i / cfg_f: static settings
K_SLOTS, R_SLOTS, SMALLEST, SHED_ON, TOKEN_BUDGET, MAX_SEQS, NUM_BLOCKS, CAP_ON = L._codes(8)
HOLD, SHED_THRESHOLD, SHED_FIXED_S, SHED_TOKEN_S = L._codes(4)
# targets rows (float64, per request)
TTFT, TPOT, DEADLINE, DL_SORTED = L._codes(4)
# order rows (int64, per request): requests by TTFT deadline; shed requests already counted
DL_ORDER, SHED_SEEN = L._codes(2)
# acc_i: counters; then the per-bucket completion counts of the output-length window
FIN_SEEN, ENDED_SEEN, DL_NEXT, RECENT_SEEN = L._codes(4)
COUNTS = np.int64(4)
# acc_f: reward sums; then the observation's output-length features; then per-bucket sums
SUM_FIN, SUM_SHED, T_LAST, AREA = L._codes(4)
RECENT = np.int64(4)
SUMS = np.int64(4 + G - 18)
# win: the pending point's visible windows: NW, NR, SHORT, then K waiting ids, R running ids
NW, NR, SHORT = L._codes(3)
W_IDS = np.int64(3)


class EnvState(NamedTuple):
    """The environment's side of the compiled step (arrays mutated in place)."""

    cfg_i: np.ndarray
    cfg_f: np.ndarray
    targets: np.ndarray  # (4, n)
    arr_prefix: np.ndarray  # (n + 1,) prefix sums of arrival times (the latency integral)
    order: np.ndarray  # (2, n)
    template: np.ndarray  # (n, F) per-request static slot features (observation.slot_template)
    acc_i: np.ndarray
    acc_f: np.ndarray
    win: np.ndarray


def new_env_state(K: int, R: int, smallest_prompt: bool, hold: float,
                  shed_threshold: float | None, token_budget: int, max_seqs: int,
                  num_blocks: int, template: np.ndarray, arrival_s: np.ndarray,
                  ttft_target: np.ndarray, tpot_target: np.ndarray,
                  shed_lead: tuple[float, float] = (0.0, 0.0),
                  admission_cap: bool = False) -> EnvState:
    """The env's kernel state at the start of an episode."""
    e = alloc_env_state(env_settings(K, R, smallest_prompt, hold, shed_threshold, token_budget,
                                     max_seqs, num_blocks, shed_lead, admission_cap),
                        len(arrival_s))
    fill_env_state(e, np.ascontiguousarray(arrival_s, dtype=np.float64),
                   np.ascontiguousarray(ttft_target, dtype=np.float64),
                   np.ascontiguousarray(tpot_target, dtype=np.float64),
                   np.ascontiguousarray(template, dtype=np.float64))
    return e


def env_settings(K: int, R: int, smallest_prompt: bool, hold: float,
                 shed_threshold: float | None, token_budget: int, max_seqs: int,
                 num_blocks: int, shed_lead: tuple[float, float] = (0.0, 0.0),
                 admission_cap: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(cfg_i, cfg_f): the env's static settings. ``shed_lead``: (seconds, seconds per prompt
    token) by which a request becomes sheddable before its TTFT deadline
    (:func:`cbgym.agents.work.shed_lead`); ``admission_cap``: the action's last score caps the
    running batch (:func:`running_cap`)."""
    cfg_i = np.array([K, R, smallest_prompt, shed_threshold is not None, token_budget,
                      max_seqs, num_blocks, admission_cap], np.int64)
    cfg_f = np.array([hold, -2.0 if shed_threshold is None else shed_threshold,
                      shed_lead[0], shed_lead[1]], np.float64)
    return cfg_i, cfg_f


def alloc_env_state(settings: tuple[np.ndarray, np.ndarray], n: int,
                    batch: tuple[int, ...] = ()) -> EnvState:
    """Zeroed env-state arrays for n-request episodes (a leading ``batch`` shape for a
    vector of envs; the settings are shared)."""
    cfg_i, cfg_f = settings
    K, R = int(cfg_i[K_SLOTS]), int(cfg_i[R_SLOTS])
    return EnvState(cfg_i, cfg_f, np.zeros((*batch, 4, n)), np.zeros((*batch, n + 1)),
                    np.zeros((*batch, 2, n), np.int64), np.zeros((*batch, n, F)),
                    np.zeros((*batch, COUNTS + _NB + 1), np.int64),
                    np.zeros((*batch, SUMS + _NB + 1)),
                    np.zeros((*batch, W_IDS + K + R), np.int64))


@kernel
def fill_env_state(e: EnvState, arrival_s: np.ndarray, ttft_target: np.ndarray,
                   tpot_target: np.ndarray, template: np.ndarray) -> None:
    """Start an episode in ``e``'s arrays: per-request targets and static slot features,
    deadlines in order, counters at zero."""
    n = len(arrival_s)
    t = e.targets
    for j in range(n):
        t[TTFT, j], t[TPOT, j] = ttft_target[j], tpot_target[j]
        t[DEADLINE, j] = arrival_s[j] + ttft_target[j]
        for f in range(F):
            e.template[j, f] = template[j, f]
    dl_order = np.arange(n)
    sort_by_key(dl_order, n, t[DEADLINE], np.empty(n, np.int64))  # stable: ties in id order
    e.arr_prefix[0] = 0.0
    for j in range(n):
        e.order[DL_ORDER, j] = dl_order[j]
        e.order[SHED_SEEN, j] = 0
        t[DL_SORTED, j] = t[DEADLINE, dl_order[j]]
        e.arr_prefix[j + 1] = e.arr_prefix[j] + arrival_s[j]  # as numpy's cumsum
    e.acc_i[:] = 0
    e.acc_f[:] = 0.0
    e.win[:] = 0


@inline_kernel
def visible(s: State, e: EnvState) -> None:
    """Fix the pending point's visible windows: the first K waiting (or the K with the
    fewest prompt tokens, shown in queue order) and the R most recently admitted running."""
    K, R, win = e.cfg_i[K_SLOTS], e.cfg_i[R_SLOTS], e.win
    nw_all, nr_all = s.si[L.N_WAIT], s.si[L.N_RUN]
    waiting, running = s.ids[L.WAIT_Q], s.ids[L.RUN_Q]
    if nw_all <= K or not e.cfg_i[SMALLEST]:
        nw = min(nw_all, K)
        for i in range(nw):
            win[W_IDS + i] = waiting[i]
    else:  # positions of the K smallest prompts (stable), then back in queue order
        pos = np.arange(nw_all)
        prompt_of = s.req[L.PROMPT, waiting[:nw_all]].astype(np.float64)
        sort_by_key(pos, nw_all, prompt_of, np.empty(nw_all, np.int64))
        shown = np.zeros(nw_all, np.bool_)
        for i in range(K):
            shown[pos[i]] = True
        nw = 0
        for i in range(nw_all):  # in queue order, so equal keys keep queue order downstream
            if shown[i]:
                win[W_IDS + nw] = waiting[i]
                nw += 1
    nr = min(nr_all, R)
    for i in range(nr):
        win[W_IDS + K + i] = running[nr_all - nr + i]
    win[NW], win[NR], win[SHORT] = nw, nr, s.si[L.SHORTFALL]


@kernel
def running_cap(score: float, max_seqs: int) -> int:
    """The running-batch cap a score in [-1, 1] asks for, log-scaled over [1, max_seqs]:
    ``round(max_seqs ** ((score + 1) / 2))`` (-1: one request, 0: sqrt(max_seqs), 1: no cap
    beyond the engine's)."""
    cap = int(np.round(max_seqs ** ((score + 1.0) / 2.0)))
    return min(max(cap, 1), max_seqs)


@kernel
def decode_scores(s: State, e: EnvState, a: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(order, shed, victims) ids from a validated score vector (see the env's docstring):
    waiting slots at or above the hold threshold by descending score (ties in slot order), at
    most as many as the running cap leaves room for (with ``admission_cap``);
    sheddable waiting requests (no first token yet, and waited + the shed lead > TTFT target)
    scoring at or below the shed threshold; on a shortfall, running
    slots by ascending score (ties: the most recently admitted first)."""
    K, win = e.cfg_i[K_SLOTS], e.win
    nw, nr, shortfall = win[NW], win[NR], win[SHORT] > 0
    w_ids = win[W_IDS:W_IDS + nw]
    neg = np.empty(nw)
    for i in range(nw):
        neg[i] = -a[i]
    idx = np.arange(nw)
    sort_by_key(idx, nw, neg, np.empty(nw, np.int64))
    m = 0
    while m < nw and a[idx[m]] >= e.cfg_f[HOLD]:
        m += 1
    if e.cfg_i[CAP_ON]:  # admissions stop once the batch holds the cap
        room = running_cap(a[K + e.cfg_i[R_SLOTS]], e.cfg_i[MAX_SEQS]) - s.si[L.N_RUN]
        m = min(m, max(room, 0))
    order = w_ids[idx[:m]]
    n_shed = 0
    shed = np.empty(nw, np.int64)
    threshold = e.cfg_f[SHED_THRESHOLD]
    if e.cfg_i[SHED_ON] and nw and a[:nw].min() <= threshold:
        now, arrival, prompt = s.sf[L.NOW], s.times[L.ARRIVAL], s.req[L.PROMPT]
        generated = s.req[L.GENERATED]
        fixed, per_token = e.cfg_f[SHED_FIXED_S], e.cfg_f[SHED_TOKEN_S]
        for i in range(nw):
            rid = w_ids[i]
            lead = fixed + per_token * prompt[rid]
            # a re-queued (preempted) request with a first token already met or missed its
            # TTFT: it is never shed for it
            if (generated[rid] == 0 and now - arrival[rid] + lead > e.targets[TTFT, rid]
                    and a[i] <= threshold):
                shed[n_shed] = rid
                n_shed += 1
    victims = np.empty(nr if shortfall else 0, np.int64)
    if shortfall:  # slots latest-admitted first, then stably by ascending score
        vi = np.arange(nr - 1, -1, -1)
        score = np.empty(nr)
        for j in range(nr):
            score[j] = a[K + j]
        sort_by_key(vi, nr, score, np.empty(nr, np.int64))
        for c in range(nr):
            victims[c] = win[W_IDS + K + vi[c]]
    return order, shed[:n_shed], victims


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


_Obs = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@inline_kernel
def finish_step(s: State, e: EnvState, drained: bool) -> tuple[_Obs, np.ndarray]:
    """After a decision: the new point's windows, the step's reward outcome, the observation."""
    if not drained:
        visible(s, e)
    outcome = reward(s, e)
    none = np.empty(0, np.int64)
    return observe(s, e, drained, none, none), outcome


@kernel
def step_decision(s: State, p: Params, e: EnvState, order: np.ndarray, has_order: bool,
                  shed_ids: np.ndarray, victims: np.ndarray, has_victims: bool,
                  ) -> tuple[int, _Obs, np.ndarray]:
    """Apply a decision (ids), advance, and finish the step when the engine got to the next
    decision point or drained. Returns (code, observation, outcome); on any other code
    (NEED_ROOM, TOO_MANY_IDLE_TICKS) the caller settles, then calls :func:`finish_step`."""
    code = decide(s, p, order, has_order, shed_ids, L.R_AGENT, victims, has_victims,
                  np.empty(0, np.int64), L.YES)
    if code != L.AT_DECISION and code != L.DRAINED:
        empty = np.empty(0, np.float32)
        return code, (empty, empty, empty, empty, empty, np.empty(0)), np.empty(0)
    obs, outcome = finish_step(s, e, code == L.DRAINED)
    return code, obs, outcome


@kernel
def step_scores(s: State, p: Params, e: EnvState, a: np.ndarray) -> tuple[int, _Obs, np.ndarray]:
    """One ``Scheduling-v0`` step: validate, decode, decide, advance, score, observe.

    Returns (code, observation, outcome) as :func:`step_decision`, or INVALID_ACTION with
    nothing applied.
    """
    for x in a:
        if not -1.0 <= x <= 1.0:  # NaN fails too
            empty = np.empty(0, np.float32)
            return INVALID_ACTION, (empty, empty, empty, empty, empty, np.empty(0)), np.empty(0)
    order, shed, victims = decode_scores(s, e, a)
    return step_decision(s, p, e, order, L.YES, shed, victims, len(victims) > 0)
