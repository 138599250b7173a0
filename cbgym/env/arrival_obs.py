"""Each waiting request's content-blind features at its arrival, an optional part of the
scheduling env's observation (``arrival_features=True``).

The observation gains ``waiting_arrival``: K x 9, slot-major (``reshape(K, 9)``, aligned with
``waiting``, zero where ``waiting_mask`` is), the nine features of
:mod:`cbgym.agents.predictor_features` in its order, raw (float32, as computed there) and -1
where a feature is undefined (a statistic over fewer than 8 completions; the hour and weekday
on a trace without a recorded clock). They are what the learned output-length predictor reads
(``sjf-pred``, ``cb-sjf-work:hgb``), so an agent sees what those policies rank by, and
:class:`cbgym.env.agents.EnvAgent` plays them from the observation exactly as the fast path
does. Content-blind: prompt lengths, arrival times and the outputs of completed requests.

Features at arrival never change, so the env computes them once per request and episode.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from cbgym.agents.predictor_features import (
    FEATURES,
    arrival_features,
    completions,
    is_code_trace,
)
from cbgym.engine.decision import DecisionPoint
from cbgym.workload.trace import Trace

KEY = "waiting_arrival"
_F = len(FEATURES)
MISSING = -1.0


def check_arrival_features(value: object) -> bool:
    if not isinstance(value, bool | np.bool_):
        raise ValueError(f"arrival_features={value!r}: expected a bool")
    return bool(value)


def arrival_space(K: int) -> spaces.Box:
    big = float(np.finfo(np.float32).max)
    return spaces.Box(MISSING, big, (K * _F,), np.float32)


class ArrivalFeatures:
    """The episode's per-request features, computed on first sight (see module)."""

    def __init__(self, trace: Trace) -> None:
        self.clock = trace.extra.get("epoch_s")
        self.code = is_code_trace(trace.name)
        self.rows = np.full((len(trace), _F), np.nan)
        self.known = np.zeros(len(trace), bool)

    def obs(self, dp: DecisionPoint | None, w_ids: np.ndarray, K: int) -> np.ndarray:
        """``waiting_arrival`` for the visible waiting ids (slot order); empty at the end."""
        out = np.zeros(K * _F, np.float32)
        if dp is None or len(w_ids) == 0:
            return out
        new = w_ids[~self.known[w_ids]]
        if len(new):
            assert dp.finish_s is not None
            done_t, done_out = completions(dp.finished, dp.finish_s, dp.num_generated,
                                           float(dp.arrival_s[new].min()))
            self.rows[new] = arrival_features(new, dp.arrival_s, dp.prompt_tokens, self.clock,
                                              self.code, done_t, done_out)
            self.known[new] = True
        rows = self.rows[w_ids]
        out[: len(w_ids) * _F] = np.where(np.isnan(rows), MISSING, rows).reshape(-1)
        return out


def decode_arrival(vec: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The occupied slots' feature rows (float64, NaN where undefined), as computed."""
    rows = np.asarray(vec, np.float32).reshape(-1, _F)[np.asarray(mask) > 0.5]
    rows = rows.astype(np.float64)
    rows[rows == MISSING] = np.nan
    return rows


__all__ = ["KEY", "ArrivalFeatures", "arrival_space", "check_arrival_features",
           "decode_arrival"]
