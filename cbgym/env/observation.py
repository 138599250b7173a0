"""Observation encoding for the scheduling environment: content-blind, bounded, float32.

The observation is a flat ``spaces.Dict`` of 1-D float32 boxes (stable-baselines3 warns on 2-D
per-slot boxes and nested dicts):

* ``global`` (:data:`GLOBAL_FEATURES`): engine-wide state;
* ``waiting`` (K slots x :data:`SLOT_FEATURES`, slot-major: ``reshape(K, F)``) and
  ``waiting_mask`` (K): the visible window over the waiting queue;
* ``running`` (R slots x F) and ``running_mask`` (R): the R most recently admitted running
  requests, in admission order.

Scalings (every feature lies in its box, so ``check_env`` holds; values beyond a bound are
clipped):

* ``count``: ``log2(1 + x) / 24`` in [0, 1]. Integer counts are recovered *exactly* by
  :func:`count_unscale` (rounding) for every x below :data:`COUNT_EXACT_BELOW` = 10**6 (tested).
* ``time``: ``log2(1 + t / 1 ms) / 32`` in [0, 1] (t in seconds; approximate inverse).
* ``fraction`` / ``flag``: as is, in [0, 1].
* ``mean_tokens``: ``x / 1024`` in [0, 256]: a power-of-two scaling, so the float32 output-length
  statistics the baselines key on (:func:`cbgym.agents.base.recent_output_stats`) come back
  bit for bit.

Never in the observation: prompt content, true output lengths.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from gymnasium import spaces

from cbgym.agents.base import OUTPUT_STAT_EDGES, recent_output_stats
from cbgym.engine.decision import DecisionPoint

__all__ = [
    "COUNT_EXACT_BELOW", "GLOBAL_FEATURES", "NUM_OUTPUT_BUCKETS", "SLOT_FEATURES", "Feature",
    "ObservationEncoder", "count_scale", "count_unscale", "global_index", "slot_index",
    "time_scale", "time_unscale",
]

_COUNT_SPAN = 24.0  # log2 span of count features: saturates at 2**24 - 1
_TIME_SPAN = 32.0  # log2 span of time features, in milliseconds: saturates after ~50 days
_MEAN_TOKENS_SCALE = 1.0 / 1024.0  # a power of two: exact in float32 both ways
_MEAN_TOKENS_HIGH = 256.0
COUNT_EXACT_BELOW = 1_000_000  # tested; rounding first fails near 1,009,910
NUM_OUTPUT_BUCKETS = len(OUTPUT_STAT_EDGES) + 1
# the arrival-rate feature averages over the most recent arrivals
RATE_WINDOW = 32


def count_scale(x: np.ndarray | float) -> np.ndarray:
    """Scale counts (tokens, requests, blocks) to [0, 1]: ``log2(1 + x) / 24``."""
    return np.minimum(np.log2(1.0 + np.asarray(x, dtype=np.float64)) * (1.0 / _COUNT_SPAN), 1.0)


def count_unscale(v: np.ndarray | float) -> np.ndarray:
    """Invert :func:`count_scale` (int64); exact for counts below :data:`COUNT_EXACT_BELOW`."""
    x = np.exp2(np.asarray(v, dtype=np.float64) * _COUNT_SPAN) - 1.0
    return np.rint(x).astype(np.int64)


def time_scale(t: np.ndarray | float) -> np.ndarray:
    """Scale durations in seconds to [0, 1]: ``log2(1 + t / 1 ms) / 32``."""
    ms = np.maximum(np.asarray(t, dtype=np.float64), 0.0) * 1000.0
    return np.minimum(np.log2(1.0 + ms) * (1.0 / _TIME_SPAN), 1.0)


def time_unscale(v: np.ndarray | float) -> np.ndarray:
    """Approximate inverse of :func:`time_scale` (float32 observations keep ~7 digits)."""
    return (np.exp2(np.asarray(v, dtype=np.float64) * _TIME_SPAN) - 1.0) / 1000.0


@dataclass(frozen=True, slots=True)
class Feature:
    """One observation feature: its name, scaling kind and meaning."""

    name: str
    kind: str  # "count", "time", "fraction", "flag" or "mean_tokens"
    doc: str

    @property
    def high(self) -> float:
        return _MEAN_TOKENS_HIGH if self.kind == "mean_tokens" else 1.0


def _bucket_features() -> tuple[Feature, ...]:
    edges = [0, *OUTPUT_STAT_EDGES.tolist()]
    names = [f"[{lo},{hi})" for lo, hi in zip(edges, edges[1:], strict=False)]
    names.append(f"[{edges[-1]},inf)")
    means = tuple(Feature(f"recent_output_mean_{i}", "mean_tokens",
                          f"mean output length of recent completions with prompt in {b}")
                  for i, b in enumerate(names))
    seen = tuple(Feature(f"recent_output_seen_{i}", "flag",
                         f"1 if bucket {i} saw a recent completion (else its mean reads 0)")
                 for i in range(len(names)))
    return means + seen


GLOBAL_FEATURES: tuple[Feature, ...] = (
    Feature("num_waiting", "count", "requests in the waiting queue"),
    Feature("num_running", "count", "requests in the running batch"),
    Feature("waiting_prompt_tokens", "count", "sum of prompt tokens over the waiting queue"),
    Feature("running_prompt_tokens", "count", "sum of prompt tokens over the running batch"),
    Feature("running_computed_tokens", "count", "sum of KV-computed tokens over the batch"),
    Feature("kv_usage", "fraction", "fraction of KV blocks in use"),
    Feature("free_blocks", "count", "free KV blocks"),
    Feature("total_preemptions", "count", "preemptions so far in the episode"),
    Feature("arrival_rate", "count",
            "requests/s over the last 32 arrivals: m / max(now - t_(a-m), 1 ms)"),
    Feature("sim_time", "time", "simulated time since the episode start"),
    Feature("last_iteration_time", "time", "duration of the previous engine iteration"),
    Feature("shortfall_blocks", "count", "KV blocks missing to serve the batch (0 = none)"),
    Feature("token_budget", "count", "token budget per iteration (max_num_batched_tokens)"),
    Feature("budget_left", "count", "budget left after the running batch's tokens"),
    Feature("seq_slots_left", "count", "max_num_seqs minus running requests"),
    Feature("num_waiting_hidden", "count", "waiting requests outside the visible window"),
    Feature("shortfall_phase", "flag", "1 when memory runs short (victims are chosen)"),
    Feature("num_chosen", "count", "masked variant: slots chosen so far this iteration"),
    *_bucket_features(),
    Feature("recent_output_mean_all", "mean_tokens", "mean output length, all buckets"),
    Feature("recent_output_seen_all", "flag", "1 once any request has completed"),
)

SLOT_FEATURES: tuple[Feature, ...] = (
    Feature("prompt_tokens", "count", "prompt length"),
    Feature("num_computed", "count", "tokens whose KV is computed"),
    Feature("num_generated", "count", "output tokens generated so far"),
    Feature("time_in_system", "time", "seconds since arrival (time waited, for waiting slots)"),
    Feature("num_preemptions", "count", "times the request was preempted"),
    Feature("tenant", "count", "tenant id"),
    Feature("slo_class", "count", "SLO class id"),
    Feature("chosen", "flag", "masked variant: already chosen this iteration"),
)


def global_index(name: str) -> int:
    """Index of a feature in the ``global`` vector."""
    return next(i for i, f in enumerate(GLOBAL_FEATURES) if f.name == name)


def slot_index(name: str) -> int:
    """Index of a feature within one slot of ``waiting`` / ``running``."""
    return next(i for i, f in enumerate(SLOT_FEATURES) if f.name == name)


_G_RECENT = global_index("recent_output_mean_0")
_G_KINDS = tuple(f.kind for f in GLOBAL_FEATURES[:_G_RECENT])
_F = len(SLOT_FEATURES)
# per-slot columns: static ones are scaled once per episode, dynamic ones every step
_S_PROMPT, _S_COMPUTED, _S_GENERATED, _S_TIME, _S_PREEMPT, _S_TENANT, _S_SLO, _S_CHOSEN = range(_F)
_DYNAMIC_COLS = np.array([_S_COMPUTED, _S_GENERATED, _S_PREEMPT, _S_TIME])
# log2(1 + raw) times these gives the count scaling (3 columns) and the time scaling (raw in ms)
_DYNAMIC_FACTORS = np.array([1 / _COUNT_SPAN] * 3 + [1 / _TIME_SPAN])[:, None]
_LOG2 = math.log2


def _scale_scalar(kind: str, x: float) -> float:
    """Scalar twin of the vector scalings (Python floats are faster for a handful)."""
    if kind == "count":
        return min(_LOG2(1.0 + x) / _COUNT_SPAN, 1.0)
    if kind == "time":
        return min(_LOG2(1.0 + max(x, 0.0) * 1000.0) / _TIME_SPAN, 1.0)
    return x


def _box(features: tuple[Feature, ...], slots: int = 1) -> spaces.Box:
    high = np.tile(np.array([f.high for f in features], dtype=np.float32), slots)
    return spaces.Box(low=np.zeros_like(high), high=high, dtype=np.float32)


def observation_space(K: int, R: int) -> spaces.Dict:
    """The observation space for K waiting and R running slots."""
    return spaces.Dict({
        "global": _box(GLOBAL_FEATURES),
        "waiting": _box(SLOT_FEATURES, K),
        "waiting_mask": spaces.Box(0.0, 1.0, (K,), np.float32),
        "running": _box(SLOT_FEATURES, R),
        "running_mask": spaces.Box(0.0, 1.0, (R,), np.float32),
    })


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Engine-wide scalars of one observation (from a DecisionPoint or a drained engine)."""

    now: float
    num_waiting: int
    num_running: int
    waiting_prompt_tokens: int
    running_prompt_tokens: int
    running_computed_tokens: int
    free_blocks: int
    num_blocks: int
    total_preemptions: int
    last_iteration_s: float
    shortfall_blocks: int
    budget_left: int
    seq_slots_left: int
    num_hidden: int


def slot_template(prompt: np.ndarray, tenant: np.ndarray, slo_class: np.ndarray) -> np.ndarray:
    """Per-request slot rows with the static features scaled (the dynamic ones left 0)."""
    template = np.zeros((len(prompt), _F))
    template[:, [_S_PROMPT, _S_TENANT, _S_SLO]] = count_scale(
        np.column_stack((prompt, tenant, slo_class)))
    return template


class ObservationEncoder:
    """Turns engine state into observations, with per-episode precomputation.

    Static per-request features (prompt, tenant, SLO class) are scaled once per episode;
    each step gathers the dynamic columns of the visible slots in a handful of vectorised
    operations and returns freshly allocated arrays (Gymnasium 1.4 rejects reuse).
    """

    def __init__(self, K: int, R: int, token_budget: int, max_num_seqs: int) -> None:
        self.K, self.R = K, R
        self.token_budget = token_budget
        self.max_num_seqs = max_num_seqs
        self.space = observation_space(K, R)
        self.start_episode(np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0))

    def start_episode(self, arrival_s: np.ndarray, prompt: np.ndarray, tenant: np.ndarray,
                      slo_class: np.ndarray) -> None:
        """Precompute the scaled static features of every request of the episode."""
        self._arrival = arrival_s
        self._template = slot_template(prompt, tenant, slo_class)
        self._recent = [0.0] * (2 * NUM_OUTPUT_BUCKETS + 2)
        self._recent_finished = -1
        self._masks: dict[tuple[int, int], np.ndarray] = {}

    def snapshot(self, dp: DecisionPoint, num_hidden: int) -> Snapshot:
        """Engine-wide scalars at a decision point."""
        running = dp.running
        add = np.add.reduce
        r_prompt = int(add(dp.prompt_tokens[running]))
        r_computed = int(add(dp.num_computed[running]))
        remaining = r_prompt + int(add(dp.num_generated[running])) - r_computed
        return Snapshot(
            now=dp.now, num_waiting=len(dp.waiting), num_running=len(running),
            waiting_prompt_tokens=int(add(dp.prompt_tokens[dp.waiting])),
            running_prompt_tokens=r_prompt, running_computed_tokens=r_computed,
            free_blocks=dp.free_blocks, num_blocks=dp.num_blocks,
            total_preemptions=dp.total_preemptions, last_iteration_s=dp.last_iteration_s,
            shortfall_blocks=dp.shortfall_blocks,
            budget_left=max(self.token_budget - remaining, 0),
            seq_slots_left=max(self.max_num_seqs - len(running), 0), num_hidden=num_hidden,
        )

    def update_recent(self, finished: np.ndarray, prompt: np.ndarray,
                      generated: np.ndarray) -> None:
        """Refresh the output-length statistics (only when a request finished since)."""
        if finished.size == self._recent_finished:
            return
        self._recent_finished = finished.size
        by_bucket, mean = recent_output_stats(finished, prompt, generated)
        seen = ~np.isnan(by_bucket)
        values = np.where(seen, by_bucket, 0.0).astype(np.float64) * _MEAN_TOKENS_SCALE
        has_mean = not math.isnan(mean)
        recent = [*np.minimum(values, _MEAN_TOKENS_HIGH).tolist(), *seen.astype(float).tolist(),
                  min(mean * _MEAN_TOKENS_SCALE, _MEAN_TOKENS_HIGH) if has_mean else 0.0,
                  float(has_mean)]
        self._recent = recent

    def encode_global(self, s: Snapshot, num_chosen: int) -> np.ndarray:
        """The ``global`` vector (float32, fresh)."""
        arrival = self._arrival
        a = int(arrival.searchsorted(s.now, side="right"))
        m = min(RATE_WINDOW, a)
        rate = m / max(s.now - float(arrival[a - m]), 1e-3) if m else 0.0
        raw = (
            s.num_waiting, s.num_running, s.waiting_prompt_tokens, s.running_prompt_tokens,
            s.running_computed_tokens, 1.0 - s.free_blocks / s.num_blocks, s.free_blocks,
            s.total_preemptions, rate, s.now, s.last_iteration_s, s.shortfall_blocks,
            self.token_budget, s.budget_left, s.seq_slots_left, s.num_hidden,
            float(s.shortfall_blocks > 0), num_chosen,
        )
        scaled = [_scale_scalar(k, float(x)) for k, x in zip(_G_KINDS, raw, strict=True)]
        return np.array(scaled + self._recent, dtype=np.float32)

    def encode_slots(
        self, dp: DecisionPoint, w_ids: np.ndarray, r_ids: np.ndarray,
        chosen_w: list[int] | None = None, chosen_r: list[int] | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``waiting``, ``waiting_mask``, ``running``, ``running_mask`` (float32, fresh)."""
        K, R = self.K, self.R
        nw, nr = len(w_ids), len(r_ids)
        ids = np.concatenate((w_ids, r_ids))
        # one log2 over every dynamic value: counts as is, time in milliseconds
        raw = np.array((dp.num_computed[ids], dp.num_generated[ids], dp.num_preemptions[ids],
                        (dp.now - self._arrival[ids]) * 1000.0))
        dyn = np.log2(raw + 1.0)
        dyn *= _DYNAMIC_FACTORS
        np.minimum(dyn, 1.0, out=dyn)
        block = self._template[ids]
        block[:, _DYNAMIC_COLS] = dyn.T
        slots = np.zeros((K + R, _F), dtype=np.float32)
        slots[:nw] = block[:nw]
        slots[K:K + nr] = block[nw:]
        if chosen_w:
            slots[chosen_w, _S_CHOSEN] = 1.0
        if chosen_r:
            slots[np.asarray(chosen_r) + K, _S_CHOSEN] = 1.0
        mask = self._mask(nw, nr).copy()
        return slots[:K].reshape(-1), mask[:K], slots[K:].reshape(-1), mask[K:]

    def _mask(self, nw: int, nr: int) -> np.ndarray:
        mask = self._masks.get((nw, nr))
        if mask is None:
            mask = np.zeros(self.K + self.R, dtype=np.float32)
            mask[:nw] = 1.0
            mask[self.K:self.K + nr] = 1.0
            self._masks[(nw, nr)] = mask
        return mask

    def encode(self, dp: DecisionPoint, w_ids: np.ndarray, r_ids: np.ndarray,
               chosen_w: list[int] | None = None, chosen_r: list[int] | None = None,
               ) -> dict[str, np.ndarray]:
        """The full observation at a decision point."""
        self.update_recent(dp.finished, dp.prompt_tokens, dp.num_generated)
        snap = self.snapshot(dp, len(dp.waiting) - len(w_ids))
        num_chosen = len(chosen_w or ()) + len(chosen_r or ())
        waiting, w_mask, running, r_mask = self.encode_slots(dp, w_ids, r_ids, chosen_w, chosen_r)
        return {"global": self.encode_global(snap, num_chosen), "waiting": waiting,
                "waiting_mask": w_mask, "running": running, "running_mask": r_mask}

    def encode_empty(self, s: Snapshot) -> dict[str, np.ndarray]:
        """The observation of a drained engine: empty windows, final global state."""
        K, R = self.K, self.R
        return {
            "global": self.encode_global(s, 0),
            "waiting": np.zeros(K * _F, np.float32), "waiting_mask": np.zeros(K, np.float32),
            "running": np.zeros(R * _F, np.float32), "running_mask": np.zeros(R, np.float32),
        }


def decode_slots(flat: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
    """Read the occupied slots of a ``waiting``/``running`` vector back into raw units.

    Integer features come back exactly (see :func:`count_unscale`); ``time_in_system`` is the
    float32-rounded value (the env's ``info["waiting_time_in_system_s"]`` holds the exact one).
    """
    slots = np.asarray(flat, dtype=np.float32).reshape(-1, _F)[np.asarray(mask) > 0.5]
    ints = count_unscale(slots[:, [_S_PROMPT, _S_COMPUTED, _S_GENERATED, _S_PREEMPT,
                                   _S_TENANT, _S_SLO]])
    return {
        "prompt_tokens": ints[:, 0], "num_computed": ints[:, 1], "num_generated": ints[:, 2],
        "num_preemptions": ints[:, 3], "tenant": ints[:, 4].astype(np.int32),
        "slo_class": ints[:, 5].astype(np.int16),
        "time_in_system": time_unscale(slots[:, _S_TIME]),
        "chosen": slots[:, _S_CHOSEN] > 0.5,
    }


def decode_recent(global_obs: np.ndarray) -> tuple[np.ndarray, float]:
    """The float32 output-length statistics exactly as ``recent_output_stats`` returned them."""
    g = np.asarray(global_obs, dtype=np.float32)
    nb = NUM_OUTPUT_BUCKETS
    values = g[_G_RECENT:_G_RECENT + nb] / np.float32(_MEAN_TOKENS_SCALE)
    seen = g[_G_RECENT + nb:_G_RECENT + 2 * nb] > 0.5
    by_bucket = np.where(seen, values, np.float32(np.nan)).astype(np.float32)
    has_mean = g[_G_RECENT + 2 * nb + 1] > 0.5
    mean = float(g[_G_RECENT + 2 * nb] / np.float32(_MEAN_TOKENS_SCALE)) if has_mean else float(
        "nan")
    return by_bucket, mean
