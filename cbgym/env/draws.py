"""An episode's window: its first request and its offered load, drawn from the env's
generator (the single env at each reset; the native vector env one episode ahead, with each
env's own generator, :mod:`cbgym.env.vector_windows`)."""

from __future__ import annotations

import numpy as np

__all__ = ["draw_load", "draw_start"]


def draw_start(rng: np.random.Generator, num_requests: int, n: int,
               start_range: tuple[int, int] | None) -> int:
    """An episode's first request: uniform over the windows of n requests that lie in
    ``start_range`` (default: the whole trace of ``num_requests``)."""
    lo, hi = start_range or (0, num_requests)
    lo, hi = max(int(lo), 0), min(int(hi), num_requests)
    if hi - lo < n:
        raise ValueError(f"window_start_range=({lo}, {hi}) cannot hold "
                         f"{n} requests of a {num_requests}-request trace")
    return int(rng.integers(lo, hi - n + 1))


def draw_load(rng: np.random.Generator, load: float | tuple[float, float] | None
              ) -> float | None:
    """An episode's offered load: fixed, uniform over a (lo, hi) range, or None."""
    if isinstance(load, tuple):
        return float(rng.uniform(*load))
    return load
