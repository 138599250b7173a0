"""``SchedulingMasked-v0``'s micro-steps, compiled: one choice per step, then the iteration.

Outside a memory shortfall the agent admits visible waiting slots one per step (building the
admission order) until STOP or until every visible waiting slot is chosen. On a shortfall it
names victims among the visible running slots one per step until the chosen victims would
free enough blocks (or no visible running slot is left); waiting slots and STOP are masked
then, since an iteration that preempts admits nothing (vLLM v1).

The state of one decision point is two small arrays: ``m`` (int64, :data:`CHOSEN` + K + R:
the counts, the blocks the victims free, then the chosen waiting and running slots) and
``mask`` (int8, K + R + 1: the allowed actions). The single env and each env of the vector
env hold their own and go through these functions.
"""

from __future__ import annotations

import numpy as np

from cbgym.engine import layout as L
from cbgym.engine.jit import kernel
from cbgym.engine.layout import Params, State
from cbgym.env import kernel_ops as ko
from cbgym.env.kernel_ops import EnvState

N_CHOSEN_W, N_CHOSEN_R, FREED = L._codes(3)
CHOSEN = np.int64(3)
MORE, READY, MASKED = np.int64(0), np.int64(1), np.int64(-1)  # what a choice led to


def micro_size(K: int, R: int) -> int:
    return int(CHOSEN) + K + R


@kernel
def begin_point(e: EnvState, m: np.ndarray, mask: np.ndarray, done: bool) -> None:
    """A new decision point: nothing chosen; the allowed actions (STOP only when done)."""
    K, R = e.cfg_i[ko.K_SLOTS], e.cfg_i[ko.R_SLOTS]
    nw, nr, short = e.win[ko.NW], e.win[ko.NR], e.win[ko.SHORT]
    m[N_CHOSEN_W], m[N_CHOSEN_R], m[FREED] = 0, 0, 0
    mask[:] = 0
    if done:
        mask[K + R] = 1
    elif short > 0:  # victims only
        mask[K:K + nr] = 1
    else:
        mask[:nw] = 1
        mask[K + R] = 1


@kernel
def victim_frees(s: State, e: EnvState, j: int) -> int:
    """Blocks visible running slot j would free if preempted now (held + needed)."""
    nr_all, nr = s.si[L.N_RUN], e.win[ko.NR]
    pos = nr_all - nr + j  # the visible running slots are the last admitted
    return s.req[L.HELD, s.ids[L.RUN_Q, pos]] + s.ids[L.PLAN_NEED, pos]


@kernel
def choose(s: State, e: EnvState, m: np.ndarray, mask: np.ndarray, i: int) -> int:
    """Record action ``i``: MASKED (nothing recorded), MORE (another choice is wanted) or
    READY (the iteration can run)."""
    K, R = e.cfg_i[ko.K_SLOTS], e.cfg_i[ko.R_SLOTS]
    if i < 0 or i > K + R or not mask[i]:
        return MASKED
    if i == K + R:
        return READY
    mask[i] = 0
    if i < K:
        m[CHOSEN + m[N_CHOSEN_W]] = i
        m[N_CHOSEN_W] += 1
        return READY if m[N_CHOSEN_W] >= e.win[ko.NW] else MORE
    m[CHOSEN + K + m[N_CHOSEN_R]] = i - K
    m[N_CHOSEN_R] += 1
    m[FREED] += victim_frees(s, e, i - K)
    ready = m[FREED] >= e.win[ko.SHORT] or m[N_CHOSEN_R] >= e.win[ko.NR]
    return READY if ready else MORE


@kernel
def chosen(e: EnvState, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(chosen waiting slots, chosen running slots), in the order chosen (views)."""
    K = e.cfg_i[ko.K_SLOTS]
    return (m[CHOSEN:CHOSEN + m[N_CHOSEN_W]],
            m[CHOSEN + K:CHOSEN + K + m[N_CHOSEN_R]])


@kernel
def observe_point(s: State, e: EnvState, m: np.ndarray) -> tuple:
    """The observation mid-way through a decision point (chosen slots flagged)."""
    cw, cr = chosen(e, m)
    return ko.observe(s, e, L.NO, cw, cr)


@kernel
def run_point(s: State, p: Params, e: EnvState, m: np.ndarray) -> tuple:
    """Run the iteration under the choices: (code, observation, outcome) as step_decision.

    On a shortfall the chosen victims go first (order=None: should the engine not preempt,
    it admits as vLLM would); otherwise the chosen waiting slots, in order, are admitted.
    """
    K = e.cfg_i[ko.K_SLOTS]
    cw, cr = chosen(e, m)
    none = np.empty(0, np.int64)
    if e.win[ko.SHORT] > 0:
        victims = np.empty(len(cr), np.int64)
        for c in range(len(cr)):
            victims[c] = e.win[ko.W_IDS + K + cr[c]]
        return ko.step_decision(s, p, e, none, L.NO, none, victims, L.YES)
    order = np.empty(len(cw), np.int64)
    for c in range(len(cw)):
        order[c] = e.win[ko.W_IDS + cw[c]]
    return ko.step_decision(s, p, e, order, L.YES, none, none, L.NO)
