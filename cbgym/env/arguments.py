"""Checks of :class:`~cbgym.env.SchedulingEnv`'s arguments, each error naming the parameter."""

from __future__ import annotations


def check_load(load: object) -> float | tuple[float, float] | None:
    if load is None:
        return None
    if isinstance(load, tuple | list):
        if len(load) != 2 or not 0 < float(load[0]) <= float(load[1]):
            raise ValueError(f"load={load!r}: expected a float > 0 or (lo, hi) with 0 < lo <= hi")
        return (float(load[0]), float(load[1]))
    if not float(load) > 0:  # type: ignore[arg-type]
        raise ValueError(f"load={load!r}: expected > 0")
    return float(load)  # type: ignore[arg-type]


def check_args(K: int, R: int, episode_requests: int, window_rule: str, hold: float,
                shed: float | None, max_steps: int | None, render_mode: str | None,
                render_modes: list[str]) -> None:
    if K < 1 or R < 1:
        raise ValueError(f"K={K}, R={R}: need at least one waiting and one running slot")
    if episode_requests < 2:
        raise ValueError(f"episode_requests={episode_requests}: need at least 2")
    if window_rule not in ("oldest", "smallest_prompt"):
        raise ValueError(f"window_rule={window_rule!r}: expected 'oldest' or 'smallest_prompt'")
    if not -1.0 <= hold <= 1.0:
        raise ValueError(f"hold_threshold={hold}: expected a score in [-1, 1]")
    if shed is not None and not -1.0 <= shed < hold:
        raise ValueError(f"shed_threshold={shed}: expected None or a score in [-1, "
                         f"hold_threshold={hold})")
    if max_steps is not None and max_steps < 1:
        raise ValueError(f"max_steps={max_steps}: expected None or >= 1")
    if render_mode is not None and render_mode not in render_modes:
        raise ValueError(f"render_mode={render_mode!r}: supported {render_modes}")

