"""Action decoding: agent actions become engine :class:`~cbgym.engine.Decision` objects.

``cbgym/Scheduling-v0`` takes a ``Box(-1, 1, (K + R,), float32)`` of scores (``K + R + 1`` with
``admission_cap``: the running cap last), laid out as
:class:`ScoreLayout` says (waiting slots, then running slots; deflection dimensions for the
disaggregated variant will be appended after them, never inserted). ``cbgym/SchedulingMasked-v0``
takes one ``Discrete(K + R + 1)`` index per micro-step (see :class:`MicroSteps`). Score
vectors are decoded by the compiled step (:func:`cbgym.env.kernel_ops.decode_scores`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from gymnasium.error import InvalidAction

from cbgym.env import micro_ops as mo

__all__ = ["InvalidActionError", "MicroSteps", "ScoreLayout", "check_discrete",
           "check_scores"]

SHED_REASON = "shed_by_agent"


class InvalidActionError(InvalidAction, ValueError):
    """An action the environment cannot apply (wrong shape, NaN, out of range, masked)."""


@dataclass(frozen=True, slots=True)
class ScoreLayout:
    """Where each part of the ``Scheduling-v0`` action vector lives.

    ``action[waiting]``: one score per visible waiting slot; ``action[running]``: one score per
    visible running slot; with ``cap``, ``action[K + R]`` caps the running batch
    (:func:`cbgym.env.kernel_ops.running_cap`). A future disaggregated variant appends its
    deflection scores after these; the existing slices never move.
    """

    K: int
    R: int
    cap: bool = False

    @property
    def waiting(self) -> slice:
        return slice(0, self.K)

    @property
    def running(self) -> slice:
        return slice(self.K, self.K + self.R)

    @property
    def size(self) -> int:
        return self.K + self.R + int(self.cap)


def check_scores(action: object, size: int) -> np.ndarray:
    """The action as float64 scores, or an InvalidActionError naming what is wrong."""
    try:
        a = np.asarray(action, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidActionError(f"action must be a float array of shape ({size},): {exc}") from exc
    if a.shape != (size,):
        raise InvalidActionError(f"action has shape {a.shape}; expected ({size},) "
                                 "(K waiting-slot scores, then R running-slot scores, then the "
                                 "running cap with admission_cap)")
    # one pass each: NaN propagates through min/max, so this also catches non-finite scores
    if not (-1.0 <= np.minimum.reduce(a) and np.maximum.reduce(a) <= 1.0):
        bad = np.flatnonzero(~((a >= -1.0) & (a <= 1.0)))[0]
        raise InvalidActionError(
            f"action[{bad}] is {a[bad]}; scores must be finite and in [-1, 1] (clip the "
            "policy's output, e.g. with gymnasium.wrappers.ClipAction)")
    return a


def check_discrete(action: object, mask: np.ndarray, describe: Callable[[int], str]) -> int:
    """Validate one ``SchedulingMasked-v0`` action against the current mask; return it as int.

    Args:
        action: an integer (Python or numpy, or a 0-d/1-element integer array).
        mask: the current action mask (int8, 1 = allowed).
        describe: why an index is masked, for the error message.
    """
    if isinstance(action, int | np.integer):  # the common case, without an array round trip
        i = int(action)
    else:
        a = np.asarray(action)
        if a.size != 1 or not (np.issubdtype(a.dtype, np.integer) or a.dtype == np.bool_):
            raise InvalidActionError(
                f"action {action!r} is not an integer index in [0, {len(mask)})")
        i = int(a.reshape(()))
    if not 0 <= i < len(mask):
        raise InvalidActionError(f"action {i} is outside [0, {len(mask)})")
    if not mask[i]:
        raise InvalidActionError(f"action {i} is masked: {describe(i)}; allowed: "
                                 f"{np.flatnonzero(mask).tolist()}")
    return i


class MicroSteps:
    """One env's micro-step state at its decision point: the arrays the compiled micro-step
    functions (:mod:`cbgym.env.micro_ops`) read and write, and why an action is masked.

    Outside a shortfall the agent admits visible waiting slots one per step (building
    ``Decision.order``) until STOP or until every visible waiting slot is chosen. On a
    shortfall it names victims among the visible running slots one per step until the chosen
    victims would free enough blocks (or no visible running slot is left); waiting slots and
    STOP are masked then, since an iteration that preempts admits nothing (vLLM v1).
    """

    def __init__(self, K: int, R: int) -> None:
        self.K, self.R = K, R
        self.m = np.zeros(mo.micro_size(K, R), np.int64)
        self.mask = np.zeros(K + R + 1, np.int8)
        self.mask[K + R] = 1  # before the first decision point: STOP only

    def begin(self, es: object, done: bool) -> None:
        """A new decision point of the env state ``es``."""
        mo.begin_point(es, self.m, self.mask, done)

    def choose(self, s: object, es: object, i: int) -> int:
        """Record allowed action i: micro_ops.MORE or READY."""
        return int(mo.choose(s, es, self.m, self.mask, np.int64(i)))

    @property
    def chosen_w(self) -> np.ndarray:
        return self.m[mo.CHOSEN:mo.CHOSEN + self.m[mo.N_CHOSEN_W]]

    @property
    def chosen_r(self) -> np.ndarray:
        at = mo.CHOSEN + self.K
        return self.m[at:at + self.m[mo.N_CHOSEN_R]]

    def describe(self, i: int, shortfall: int, n_waiting: int, n_running: int) -> str:
        """Why index ``i`` is masked at this point."""
        K, R = self.K, self.R
        if i == K + R:
            return "STOP is not allowed while memory runs short (choose a victim)"
        if i < K:
            if shortfall > 0:
                return "memory runs short: only running slots (victims) are allowed"
            if i >= n_waiting:
                return f"waiting slot {i} is empty"
            return f"waiting slot {i} was already chosen"
        j = i - K
        if shortfall <= 0:
            return "no memory shortfall: running slots are chosen only as victims"
        if j >= n_running:
            return f"running slot {j} is empty"
        return f"running slot {j} was already chosen"
