"""``cbgym bench --backend ray``: the sweep's tasks as Ray tasks, on an existing Ray cluster
(``--address``) or a local one started for the sweep. On a remote cluster every node needs
this cbgym (and any ``module:Class`` policy the sweep names) importable: no runtime
environment is shipped.

The sweep is the process backend's, task for task: :func:`cbgym.bench.run_bench` submits the
same top-level functions (capacity measurements, then cells) through an
:class:`~concurrent.futures.Executor`, and this one sends each as a Ray task, so the windows,
seeds and CSV are the same (``tests/test_bench_ray.py``). The windows and engine configs are
put in Ray's object store once per sweep; each Ray worker process fetches them once per sweep
(tasks carry the sweep id and the reference nested in a list, which Ray does not resolve, so
a long-lived worker neither refetches per task nor reuses another sweep's windows). Ray's
futures are ``concurrent.futures`` futures, so the progress bar is the process backend's.

Needs the ``ray`` extra: ``pip install 'cbgym[ray]'``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

_SWEEP: list[str] = []  # in a Ray worker: the sweep whose windows it holds


class RayStartError(ValueError):
    """Ray could not be started or joined (one line)."""


def ray_module() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ValueError("needs Ray: pip install 'cbgym[ray]'") from exc
    return ray


class RayExecutor(Executor):
    """Submits calls as Ray tasks (module docstring)."""

    def __init__(self, windows: dict, engines: dict, workers: int,
                 address: str | None = None) -> None:
        ray = ray_module()
        self._ray = ray
        self._owned = not ray.is_initialized()
        if not self._owned and address is not None:
            raise RayStartError(f"this process has joined a Ray cluster already; cannot join "
                                f"{address!r} too")
        self._refs: list[Any] = []
        try:
            if self._owned:
                # the given cluster, or a new local one of `workers` CPUs (never one that
                # RAY_ADDRESS or a running `ray start` would otherwise pick)
                kwargs: dict[str, Any] = ({"address": address} if address
                                          else {"address": "local", "num_cpus": workers})
                ray.init(include_dashboard=False, log_to_driver=False, **kwargs)
            self._sweep = uuid.uuid4().hex
            self._state = [ray.put((windows, engines))]  # (nested: passed unresolved)
        except Exception as exc:
            self.shutdown()
            text = " ".join(str(exc).split())
            raise RayStartError(f"cannot start or join Ray ({address or 'local'}): "
                                f"{text[:300]}") from exc
        self._task = ray.remote(_in_worker)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        ref = self._task.remote(self._sweep, self._state, fn, args, kwargs)
        self._refs.append(ref)
        return ref.future()  # type: ignore[no-any-return]

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        ray = self._ray
        if not ray.is_initialized():
            return
        for ref in self._refs:  # (after a failure: nothing left running on the cluster)
            try:
                ray.cancel(ref)
            except Exception:  # noqa: S110  (finished tasks cannot be cancelled: fine)
                pass
        self._refs = []
        if self._owned:
            ray.shutdown()


def _in_worker(sweep: str, state: list[Any], fn: Callable[..., Any], args: tuple,
               kwargs: dict) -> Any:
    """One task in a Ray worker: the sweep's windows fetched first if this worker holds
    another sweep's (or none), as the process backend's initializer does."""
    import ray

    from cbgym import bench_cells

    if _SWEEP != [sweep]:
        bench_cells._init_worker(*ray.get(state[0]))
        _SWEEP[:] = [sweep]
    return fn(*args, **kwargs)
