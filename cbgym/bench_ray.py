"""``cbgym bench --backend ray``: the sweep's tasks as Ray tasks, on an existing Ray cluster
(``--address``) or a local one started for the sweep.

The sweep is the process backend's, task for task: :func:`cbgym.bench.run_bench` submits the
same top-level functions (capacity measurements, then cells) through an
:class:`~concurrent.futures.Executor`, and this one sends each as a Ray task, so the windows,
seeds and CSV are the same (``tests/test_bench_ray.py``). The windows and engine configs are
put in Ray's object store once per sweep; each Ray worker process loads them once per sweep
(keyed by a sweep id, so a long-lived worker never reuses another sweep's windows). Ray's
futures are ``concurrent.futures`` futures, so the progress bar is the process backend's.

Needs the ``ray`` extra: ``pip install 'cbgym[ray]'``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

_SWEEP: list[str] = []  # in a Ray worker: the sweep whose windows it holds


def ray_module() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ValueError("--backend ray needs Ray: pip install 'cbgym[ray]'") from exc
    return ray


class RayExecutor(Executor):
    """Submits calls as Ray tasks (module docstring)."""

    def __init__(self, windows: dict, engines: dict, workers: int,
                 address: str | None = None) -> None:
        ray = ray_module()
        self._ray = ray
        self._owned = not ray.is_initialized()
        if self._owned:
            # a local cluster of `workers` CPUs, or the given cluster's
            kwargs: dict[str, Any] = {"address": address} if address else {"num_cpus": workers}
            ray.init(include_dashboard=False, log_to_driver=False, **kwargs)
        self._state = ray.put((uuid.uuid4().hex, windows, engines))
        self._task = ray.remote(_in_worker)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        return self._task.remote(self._state, fn, args, kwargs).future()  # type: ignore[no-any-return]

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if self._owned and self._ray.is_initialized():
            self._ray.shutdown()


def _in_worker(state: tuple[str, dict, dict], fn: Callable[..., Any], args: tuple,
               kwargs: dict) -> Any:
    """One task in a Ray worker: the sweep's windows loaded first if this worker has
    another sweep's (or none), as the process backend's initializer does."""
    from cbgym import bench

    sweep, windows, engines = state
    if _SWEEP != [sweep]:
        bench._init_worker(windows, engines)
        _SWEEP[:] = [sweep]
    return fn(*args, **kwargs)
