"""What the prefix cache holds for each waiting request, an optional part of the scheduling
env's observation.

With ``prefix_features=True`` (it needs ``EngineConfig(enable_prefix_caching=True)`` and a
trace with block ids: ``extra["hash_ids"]``, e.g. ``load_trace("mooncake-conversation")``)
the observation gains ``waiting_prefix``: K x 3, slot-major (``[:3 * K].reshape(K, 3)``,
aligned with ``waiting`` and zero where ``waiting_mask`` is), then one global entry. The key
sorts after ``waiting_mask`` (and before ``waiting_tenants``), so the flat layout only grows at
its end.

| Index | Feature | Scaling | Meaning |
|---|---|---|---|
| 3i | ``cached_tokens`` | count | tokens slot i's admission would find cached now |
| 3i + 1 | ``uncached_tokens`` | count | its prefill left: prompt + generated - cached |
| 3i + 2 | ``shared_blocks`` | count | its full prompt blocks another waiting request has |
| 3K | ``prefix_cache_hit_rate`` | fraction | hit / queried tokens so far (0 before any) |

``cached_tokens`` is ``DecisionPoint.cached_tokens`` (at most tokens - 1: the last token is
always computed); ``shared_blocks`` is ``DecisionPoint.shared_prefix_blocks`` over the whole
waiting queue, hidden requests included; the hit rate is ``prefix_cache_hit_rate`` (vLLM's
counters).

*count* and *fraction* are the env's own scalings (:mod:`cbgym.env.observation`), so the counts
come back exactly (:func:`decode_prefix`). Content-blind: which blocks are resident is engine
state, as KV pressure is, and block ids are opaque (never tokens). These are what the
cache-aware policies (:mod:`cbgym.agents.prefix`) rank on, so an agent sees what
``shortest-uncached-first`` or ``k-lpm`` would; the env agents read them
(:class:`cbgym.env.agents.EnvAgent`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from gymnasium import spaces

from cbgym.env.observation import count_scale, count_unscale

if TYPE_CHECKING:
    from cbgym.engine.config import EngineConfig
    from cbgym.engine.decision import DecisionPoint
    from cbgym.workload.trace import Trace

KEY = "waiting_prefix"
FEATURES = ("cached_tokens", "uncached_tokens", "shared_blocks")
GLOBAL_FEATURES = ("prefix_cache_hit_rate",)
_F = len(FEATURES)


def check_prefix_features(value: object, config: EngineConfig) -> bool:
    """``prefix_features`` as a bool; True needs an engine with prefix caching on."""
    if not isinstance(value, bool | np.bool_):
        raise ValueError(f"prefix_features={value!r}: expected a bool")
    if value and not config.enable_prefix_caching:
        raise ValueError("prefix_features=True needs an engine with prefix caching: "
                         "engine=EngineConfig(..., enable_prefix_caching=True)")
    return bool(value)


def check_prefix_trace(trace: Trace) -> None:
    """A trace without block ids has no prefix cache to observe (the engine would run
    without one): refuse it."""
    if "hash_ids" not in trace.extra:
        raise ValueError(f"prefix_features=True needs a trace with block ids (extra "
                         f"'hash_ids', e.g. load_trace('mooncake-conversation'), "
                         f"'mooncake-synthetic', 'agent-sessions'); trace {trace.name!r} "
                         "has none")


def prefix_space(K: int) -> spaces.Box:
    return spaces.Box(0.0, 1.0, (K * _F + len(GLOBAL_FEATURES),), np.float32)


def hit_rate(rate: float) -> float:
    """The hit rate as observed: a DecisionPoint's NaN (no query yet) reads 0."""
    return 0.0 if np.isnan(rate) else min(max(float(rate), 0.0), 1.0)


def prefix_obs(dp: DecisionPoint | None, w_ids: np.ndarray, K: int,
               rate: float = float("nan")) -> np.ndarray:
    """The ``waiting_prefix`` vector of a decision point and its visible waiting ids (slot
    order). ``dp=None`` (the episode ended): empty slots and ``rate``, the final hit rate."""
    out = np.zeros(K * _F + len(GLOBAL_FEATURES), np.float32)
    if dp is None:
        out[-1] = hit_rate(rate)
        return out
    cached = dp.cached_tokens
    assert cached is not None, "prefix_features: the engine runs without prefix caching"
    out[-1] = hit_rate(dp.prefix_cache_hit_rate)
    n = len(w_ids)
    if n == 0:
        return out
    waiting = dp.waiting
    # shared with any other waiting request, visible or not: look the slots up by id
    shared = np.zeros(len(dp.prompt_tokens), np.int64)
    shared[waiting] = dp.shared_prefix_blocks(waiting)
    c = cached[w_ids]
    rows = np.column_stack((c, dp.prompt_tokens[w_ids] + dp.num_generated[w_ids] - c,
                            shared[w_ids]))
    out[: n * _F] = count_scale(rows).reshape(-1)
    return out


def decode_prefix(vec: np.ndarray, mask: np.ndarray) -> tuple[dict[str, np.ndarray], float]:
    """Read a ``waiting_prefix`` vector back: the occupied slots' counts by feature name
    (int64, exact, as :func:`cbgym.env.observation.decode_slots`) and the hit rate
    (float32-rounded)."""
    v = np.asarray(vec, dtype=np.float32)
    slots = v[:-len(GLOBAL_FEATURES)].reshape(-1, _F)[np.asarray(mask) > 0.5]
    ints = count_unscale(slots)
    return {name: ints[:, i] for i, name in enumerate(FEATURES)}, float(v[-1])


__all__ = ["FEATURES", "GLOBAL_FEATURES", "KEY", "check_prefix_features", "check_prefix_trace",
           "decode_prefix", "hit_rate", "prefix_obs", "prefix_space"]
