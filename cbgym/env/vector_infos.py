"""The native vector env's outputs as Gymnasium's batched infos and final observations.

Gymnasium's vector envs report a dict of arrays, each key with a ``_key`` bool mask of the
envs it holds for. The compiled step leaves its per-env counters in two matrices (rows named
by :mod:`cbgym.env.vector_ops`' ``I_`` and ``F_`` constants); these functions turn them into
that dict with one copy of each matrix (the keys are rows of the copies).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cbgym.env import vector_ops as vo

__all__ = ["batch_infos", "final_observations"]


def batch_infos(out: vo.Out, mask: np.ndarray, action_mask: np.ndarray | None = None,
                stop: int = 0, final: bool = False) -> dict[str, Any]:
    """Gymnasium's dict of arrays for ``out``, every key masked by ``mask`` (bool, N).

    ``action_mask`` (the masked variant's (N, K + R + 1) allowed picks, else None) adds
    ``action_mask`` and ``invalid_action``; ``final`` marks the infos of ended episodes,
    whose only allowed pick is ``stop``, as the single env says.
    """
    ii, ff = out.info_i.copy(), out.info_f.copy()
    m = mask
    # rows in the order of vo's I_ and F_ names
    finished, good, shed, iterations, *_ = ii
    _, goodput, ttft_miss, shed_c, latency, now, elapsed = ff
    infos: dict[str, Any] = {
        "reward_components": {
            "goodput": goodput, "_goodput": m, "ttft_miss": ttft_miss, "_ttft_miss": m,
            "shed": shed_c, "_shed": m, "latency": latency, "_latency": m},
        "_reward_components": m,
        "num_finished": finished, "_num_finished": m, "num_good": good, "_num_good": m,
        "num_shed": shed, "_num_shed": m,
        "engine_iterations": iterations, "_engine_iterations": m,
        "sim_time_s": now, "_sim_time_s": m, "sim_time_elapsed": elapsed,
        "_sim_time_elapsed": m,
        "waiting_time_in_system_s": out.waited.copy(), "_waiting_time_in_system_s": m,
    }
    if action_mask is not None:
        masks = action_mask.copy()
        if final:
            masks[:] = 0
            masks[:, stop] = 1
        infos["action_mask"], infos["_action_mask"] = masks, m
        infos["invalid_action"], infos["_invalid_action"] = ii[vo.I_INVALID] != 0, m
    # (rare: the mask is built only then; count_nonzero is a fifth of ndarray.any's cost)
    if np.count_nonzero(ii[vo.I_STUCK]):
        stuck = (ii[vo.I_STUCK] != 0) & m
        if np.count_nonzero(stuck):
            reason = np.full(len(m), None, dtype=object)
            reason[stuck] = "idle_hold_limit"
            infos["truncated_reason"], infos["_truncated_reason"] = reason, stuck
    return infos


def final_observations(flat: np.ndarray, ended: np.ndarray,
                       slices: dict[str, slice] | None) -> np.ndarray:
    """Gymnasium's ``final_obs``: an object array holding env i's last observation where it
    ended (None elsewhere), a flat row (``slices=None``) or the Dict's keys as views of it."""
    out = np.full(len(ended), None, dtype=object)
    for i in np.flatnonzero(ended):
        row = flat[i].copy()
        out[i] = row if slices is None else {key: row[sl] for key, sl in slices.items()}
    return out
