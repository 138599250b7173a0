"""The scheduling environment's observation: content-blind, bounded, float32.

This module describes it (features, scalings, spaces) and decodes it; the one encoder is
compiled, :func:`cbgym.env.kernel_obs.observe`.

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

from dataclasses import dataclass

import numpy as np
from gymnasium import spaces

from cbgym.agents.base import OUTPUT_STAT_EDGES

__all__ = [
    "COUNT_EXACT_BELOW", "GLOBAL_FEATURES", "NUM_OUTPUT_BUCKETS", "SLOT_FEATURES", "Feature",
    "count_scale", "count_unscale", "global_index", "slot_index",
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
    """Scale counts (tokens, requests, blocks) to [0, 1]: ``log2(1 + x) / 24`` (a negative
    id, which a Trace allows for tenants, reads as 0)."""
    x = np.maximum(np.asarray(x, dtype=np.float64), 0.0)
    return np.minimum(np.log2(1.0 + x) * (1.0 / _COUNT_SPAN), 1.0)


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
_F = len(SLOT_FEATURES)
_S_PROMPT, _S_COMPUTED, _S_GENERATED, _S_TIME, _S_PREEMPT, _S_TENANT, _S_SLO, _S_CHOSEN = range(_F)


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


def slot_template(prompt: np.ndarray, tenant: np.ndarray, slo_class: np.ndarray) -> np.ndarray:
    """Per-request slot rows with the static features scaled (the dynamic ones left 0)."""
    template = np.zeros((len(prompt), _F))
    template[:, [_S_PROMPT, _S_TENANT, _S_SLO]] = count_scale(
        np.column_stack((prompt, tenant, slo_class)))
    return template


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
