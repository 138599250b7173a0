"""The environment's per-step work, compiled: windows, actions, the step.

A ``Scheduling-v0`` step is one call of :func:`step_scores`: decode the scores into a
decision, apply it through the engine's :func:`decide`, fix the new decision point's visible
windows, score the step and encode the observation. The observation encoder and the reward
(the one implementation of each) are :mod:`cbgym.env.kernel_obs`; :class:`EnvState`, the
env's side of the kernel state, and its layout's names are :mod:`cbgym.env.kernel_state`,
re-exported here.
"""

from __future__ import annotations

import numpy as np

from cbgym.engine import layout as L
from cbgym.engine.jit import inline_kernel, kernel
from cbgym.engine.kutil import sort_by_key
from cbgym.engine.layout import Params, State
from cbgym.engine.loop import decide
from cbgym.env.kernel_obs import account_sheds, observe, reward, update_recent

# (the state's layout and builders, re-exported: callers reach them as kernel_ops' names)
from cbgym.env.kernel_state import (
    CAP_ON,
    HOLD,
    INVALID_ACTION,
    K_SLOTS,
    MAX_SEQS,
    NR,
    NW,
    R_SLOTS,
    SHED_FIXED_S,
    SHED_ON,
    SHED_THRESHOLD,
    SHED_TOKEN_S,
    SHORT,
    SMALLEST,
    TTFT,
    W_IDS,
    EnvState,
    F,
    G,
    alloc_env_state,
    env_settings,
    fill_env_state,
    new_env_state,
)

__all__ = ["F", "G", "INVALID_ACTION", "K_SLOTS", "NR", "NW", "R_SLOTS", "SHORT", "W_IDS",
           "EnvState", "account_sheds", "alloc_env_state", "decode_scores", "env_settings",
           "fill_env_state", "finish_step", "new_env_state", "observe", "reward",
           "running_cap", "step_decision", "step_scores", "update_recent", "visible"]


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
