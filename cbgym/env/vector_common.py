"""What the native vector envs (:mod:`cbgym.env.vector`, :mod:`cbgym.env.cluster_vector`)
share outside their compiled step: numba's thread count, ``reset``'s options and seeds, and
the one list of what the batched step lacks."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import numba
import numpy as np
from gymnasium.error import ResetNeeded

if TYPE_CHECKING:
    from cbgym.env.scheduling_env import SchedulingEnv

__all__ = ["REC_ROWS", "env_seeds", "native_lacks", "native_only", "reset_options",
           "use_threads"]

_THREADS = threading.local()  # the count this module last gave numba in this thread
REC_ROWS = 256  # time-series rows per env before the buffer is emptied in place


def use_threads(n: int) -> None:
    """numba's thread count for this thread's next parallel call (set only when another
    vector env changed it: numba.get_num_threads costs a microsecond). Every native vector
    env sets it here, so they agree on what numba was last told."""
    if getattr(_THREADS, "n", 0) != n:
        numba.set_num_threads(n)
        _THREADS.n = n


def reset_options(options: dict[str, Any] | None, num_envs: int, started: bool,
                  need_one: bool = False) -> tuple[np.ndarray, dict[str, Any]]:
    """A native vector env's ``reset`` options: the ``reset_mask`` (bool, N; all by default,
    contiguous: kernels read it) and the ``start`` / ``load`` it fixes; unknown keys, a
    malformed mask (``need_one``: one with no True) or a first reset that leaves an env out
    are clear errors."""
    options = dict(options or {})
    mask = options.pop("reset_mask", None)
    fixed = {k: options.pop(k) for k in ("start", "load") if k in options}
    if options:
        raise ValueError(f"reset(options=...): unknown keys {sorted(options)}; known: "
                         "['load', 'reset_mask', 'start'] (a vector env keeps its trace)")
    mask = np.ones(num_envs, np.bool_) if mask is None else np.asarray(mask)
    if mask.shape != (num_envs,) or mask.dtype != np.bool_ or (need_one and not mask.any()):
        raise ValueError(f"options['reset_mask'] must be a bool array of shape ({num_envs},)"
                         f"{' with a True' if need_one else ''}, got {mask.dtype} {mask.shape}")
    if not started and not mask.all():
        raise ResetNeeded("the first reset() must start every env (no reset_mask)")
    return np.ascontiguousarray(mask), fixed


def env_seeds(seed: int | list[int | None] | None, num_envs: int) -> list[int | None]:
    """Each env's seed from ``reset(seed=)``: s + i for an int s, a list as given (ints >= 0
    or None), None for all."""
    if seed is None:
        return [None] * num_envs
    if isinstance(seed, int | np.integer) and not isinstance(seed, bool):
        return [int(seed) + i for i in range(num_envs)]
    seeds = list(seed)  # type: ignore[arg-type]
    if len(seeds) != num_envs:
        raise ValueError(f"reset(seed=[...]) needs {num_envs} seeds, got {len(seeds)}")
    for i, x in enumerate(seeds):
        if x is not None and (not isinstance(x, int | np.integer) or isinstance(x, bool)
                              or x < 0):
            raise ValueError(f"reset(seed=[...]): seed {i} is {x!r}; expected an int >= 0 "
                             "or None")
    return [None if x is None else int(x) for x in seeds]


def native_lacks(*, tenant_features: bool = False, arrival_features: bool = False,
                 prefix_features: bool = False) -> str | None:
    """What the batched compiled step lacks to serve these env settings, or None: the one
    list of it (the task registry, :func:`native_only` and the direct search's CLI all ask
    here). Each is an observation the single env writes in Python."""
    if tenant_features:
        return "no tenant_features"
    if arrival_features:
        return "no arrival_features"
    if prefix_features:
        return "no prefix_features"
    return None


def native_only(proto: SchedulingEnv) -> None:
    """Refuse what the batched compiled step lacks (gym.make_vec builds a
    :class:`~cbgym.env.sync_vector.SyncTaskVectorEnv` for those instead)."""
    lack = native_lacks(tenant_features=bool(proto.tenant_features),
                        arrival_features=bool(proto.arrival_features),
                        prefix_features=bool(proto.prefix_features))
    if lack:
        raise NotImplementedError(f"the native vector env has {lack} yet; gym.make_vec "
                                  "builds a SyncVectorEnv for such envs")
