"""The environment's side of the compiled step's state: its layout, its builders.

:class:`EnvState` is packed like the engine's state (:mod:`cbgym.engine.layout`) into a few
arrays; the names below are the rows and slots of those arrays. The step that reads and
writes it is :mod:`cbgym.env.kernel_ops`; the observation encoder and the reward,
:mod:`cbgym.env.kernel_obs`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from cbgym.agents.base import OUTPUT_STAT_EDGES, OUTPUT_STAT_WINDOW
from cbgym.engine import layout as L
from cbgym.engine.jit import kernel
from cbgym.engine.kutil import sort_by_key

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
