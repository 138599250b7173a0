"""Action decoding: agent actions become engine :class:`~cbgym.engine.Decision` objects.

``cbgym/Scheduling-v0`` takes a ``Box(-1, 1, (K + R,), float32)`` of scores, laid out as
:class:`ScoreLayout` says (waiting slots, then running slots; deflection dimensions for the
disaggregated variant will be appended after them, never inserted). ``cbgym/SchedulingMasked-v0``
takes one ``Discrete(K + R + 1)`` index per micro-step (see :class:`MicroStepState`). Score
vectors are decoded by the compiled step (:func:`cbgym.env.kernel_ops.decode_scores`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from gymnasium.error import InvalidAction

from cbgym.engine.decision import Decision

__all__ = ["InvalidActionError", "MicroStepState", "ScoreLayout", "check_discrete",
           "check_scores"]

SHED_REASON = "shed_by_agent"


class InvalidActionError(InvalidAction, ValueError):
    """An action the environment cannot apply (wrong shape, NaN, out of range, masked)."""


@dataclass(frozen=True, slots=True)
class ScoreLayout:
    """Where each part of the ``Scheduling-v0`` action vector lives.

    ``action[waiting]``: one score per visible waiting slot; ``action[running]``: one score per
    visible running slot. A future disaggregated variant appends its deflection scores at
    ``[K + R, K + R + D)``; the existing slices never move.
    """

    K: int
    R: int

    @property
    def waiting(self) -> slice:
        return slice(0, self.K)

    @property
    def running(self) -> slice:
        return slice(self.K, self.K + self.R)

    @property
    def size(self) -> int:
        return self.K + self.R


def check_scores(action: object, size: int) -> np.ndarray:
    """The action as float64 scores, or an InvalidActionError naming what is wrong."""
    try:
        a = np.asarray(action, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidActionError(f"action must be a float array of shape ({size},): {exc}") from exc
    if a.shape != (size,):
        raise InvalidActionError(f"action has shape {a.shape}; expected ({size},) "
                                 "(K waiting-slot scores, then R running-slot scores)")
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


@dataclass(slots=True)
class MicroStepState:
    """Choices made so far at one decision point of ``SchedulingMasked-v0``.

    Outside a shortfall the agent admits visible waiting slots one per step (building
    ``Decision.order``) until STOP or until every visible waiting slot is chosen. On a shortfall
    it names victims among the visible running slots one per step until the chosen victims
    would free enough blocks (or no visible running slot is left); waiting slots and STOP are
    masked then, since an iteration that preempts admits nothing (vLLM v1).
    """

    shortfall: int  # blocks missing (0 = admission phase)
    n_waiting: int
    n_running: int
    frees: np.ndarray  # blocks each visible running slot would free if preempted
    chosen_w: list[int] = field(default_factory=list)
    chosen_r: list[int] = field(default_factory=list)
    _mask: np.ndarray | None = None  # kept up to date by choose()

    def mask(self, K: int, R: int) -> np.ndarray:
        """The allowed actions now (int8; the caller copies it before handing it out)."""
        if self._mask is None:
            m = np.zeros(K + R + 1, dtype=np.int8)
            if self.shortfall > 0:
                m[K:K + self.n_running] = 1
                m[[K + j for j in self.chosen_r]] = 0
            else:
                m[: self.n_waiting] = 1
                m[self.chosen_w] = 0
                m[K + R] = 1
            self._mask = m
        return self._mask

    def choose(self, i: int, K: int) -> None:
        """Record an allowed, non-STOP choice: waiting slot i (< K) or running slot i - K."""
        if i < K:
            self.chosen_w.append(i)
        else:
            self.chosen_r.append(i - K)
        if self._mask is not None:
            self._mask[i] = 0

    def describe(self, i: int, K: int, R: int) -> str:
        """Why index ``i`` is (or would be) masked."""
        if i == K + R:
            return "STOP is not allowed while memory runs short (choose a victim)"
        if i < K:
            if self.shortfall > 0:
                return "memory runs short: only running slots (victims) are allowed"
            if i >= self.n_waiting:
                return f"waiting slot {i} is empty"
            return f"waiting slot {i} was already chosen"
        j = i - K
        if self.shortfall <= 0:
            return "no memory shortfall: running slots are chosen only as victims"
        if j >= self.n_running:
            return f"running slot {j} is empty"
        return f"running slot {j} was already chosen"

    def ready(self) -> bool:
        """Whether the iteration can run without another choice."""
        if self.shortfall > 0:
            freed = int(self.frees[self.chosen_r].sum()) if self.chosen_r else 0
            return freed >= self.shortfall or len(self.chosen_r) >= self.n_running
        return len(self.chosen_w) >= self.n_waiting

    def decision(self, w_ids: np.ndarray, r_ids: np.ndarray) -> Decision:
        if self.shortfall > 0:
            # order=None: should the engine end up not preempting, it admits as vLLM would
            return Decision(victims=r_ids[self.chosen_r])
        return Decision(order=w_ids[self.chosen_w])
