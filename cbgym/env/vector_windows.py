"""Each vector env's next episode window, drawn in Python one episode ahead.

An episode starts inside the batched kernel (:mod:`cbgym.env.vector_ops`), so its window
(first request, load) must be known before the step that starts it. :class:`WindowDraws`
keeps each env's own generator and draws its next window right after the kernel consumed the
previous one, exactly as a single :class:`~cbgym.env.SchedulingEnv` draws at each reset
(start, then load), so env i's windows never depend on threads or on the other envs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.utils import seeding

from cbgym.env import vector_ops as vo
from cbgym.env.arguments import check_load
from cbgym.env.draws import draw_load, draw_start
from cbgym.env.scheduling_env import SchedulingEnv

DRAWN = object()  # an option left to the env's draw


class WindowDraws:
    """The kernel's :class:`~cbgym.env.vector_ops.Windows` and how they are filled.

    ``windows.start[i]`` is -1 for a window that cannot be scaled to its load
    (scale_to_load's conditions): the kernel then starts nothing and :meth:`check` (before a
    call) or :meth:`refill` (after one) raises the error, when the env would start it.
    """

    def __init__(self, proto: SchedulingEnv, base: vo.Base, n: int, num_envs: int) -> None:
        self.proto, self.base, self.n = proto, base, n
        self.windows = vo.Windows(np.zeros(num_envs, np.int64), np.zeros(num_envs))
        self.starts = np.zeros(num_envs, np.int64)  # as drawn (windows.start: -1 if in error)
        self.errors: dict[int, str] = {}
        self.rngs = [seeding.np_random(None)[0] for _ in range(num_envs)]

    def reseed(self, i: int, seed: int | None) -> None:
        self.rngs[i] = seeding.np_random(seed)[0]

    def draw(self, which: np.ndarray) -> None:
        """Each listed env's next window, drawn as the single env draws it at reset."""
        proto = self.proto
        for i in which:
            rng = self.rngs[i]
            self.set(i, draw_start(rng, len(self.base.arrival), self.n,
                                   proto.window_start_range), draw_load(rng, proto.load))

    def set(self, i: int, start: int, load: float | None) -> None:
        """Env i's next window (an error kept for when it would start, never raised now)."""
        arrival, n, w = self.base.arrival, self.n, self.windows
        self.starts[i] = start
        w.load[i] = np.nan if load is None else load
        w.start[i] = start
        self.errors.pop(i, None)
        if load is None:
            return
        if n < 2 or arrival[start + n - 1] <= arrival[start]:
            self.errors[i] = (f"env {i}: the window of requests [{start}, {start + n}) cannot "
                              "be scaled to a load: scale_to_load needs at least two requests "
                              "with distinct arrival times")
            w.start[i] = -1  # the kernel starts no episode on it
        elif np.isnan(self.base.mu[0]):  # built with load=None: measure the capacity now
            self.base.mu[0] = self.proto._capacity_of(self.proto.base_trace)

    def check(self, starting: np.ndarray) -> None:
        """Raise, before anything runs, if an env about to start has a window in error."""
        if not self.errors:  # (the usual case: nothing to look up on the hot path)
            return
        for i in np.flatnonzero(starting):
            if i in self.errors:
                raise ValueError(self.errors[i])

    def fixed(self, options: dict[str, Any], mask: np.ndarray) -> dict[int, tuple]:
        """options["start"] / options["load"] per env in ``mask``, checked (nothing set):
        {env: (start or None, load or DRAWN)}."""
        last = len(self.base.arrival) - self.n
        out: dict[int, dict[str, Any]] = {}
        for key, value in options.items():
            values = np.broadcast_to(np.asarray(value, dtype=object), mask.shape)
            for i in np.flatnonzero(mask):
                x = values[i]
                if key == "start" and (not isinstance(x, int | np.integer) or isinstance(
                        x, bool) or not 0 <= int(x) <= last):
                    raise ValueError(f"options['start'] for env {i} is {x!r}: expected an int "
                                     f"in [0, {last}] for {self.n}-request windows")
                if key == "load" and x is not None:
                    x = check_load(float(x))
                out.setdefault(int(i), {})[key] = x
        return {i: (d.get("start"), d.get("load", DRAWN)) for i, d in out.items()}

    def apply(self, fixed: dict[int, tuple]) -> None:
        """Set the windows :meth:`fixed` checked, keeping the drawn start or load where an
        option left it."""
        for i, (start, load) in fixed.items():
            drawn = self.windows.load[i]
            if load is DRAWN:
                load = None if np.isnan(drawn) else float(drawn)
            self.set(i, self.starts[i] if start is None else start, load)

    def refill(self, V: np.ndarray) -> None:
        """After a kernel call: draw the next window of every env that started an episode;
        raise if a same-step autoreset met a window in error."""
        wants = np.flatnonzero(V[:, vo.WANTS_WINDOW])
        if len(wants):
            self.draw(wants)
            V[wants, vo.WANTS_WINDOW] = 0
        missing = np.flatnonzero(V[:, vo.NO_WINDOW])
        if len(missing):
            V[missing, vo.NO_WINDOW] = 0
            raise ValueError(self.errors[int(missing[0])] + " (the env's episode ended in "
                             "this step and no new one started: reset it)")
