"""Parsing policy arguments given as strings (``make_policy("noisy-oracle:0.8")``)."""

from __future__ import annotations

import inspect


def parse_float(value: str | float, policy: str, param: str, lo: float = float("-inf"),
                hi: float = float("inf")) -> float:
    """``value`` as a float in ``[lo, hi]``, or a ValueError naming the policy and parameter."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"policy {policy!r}: {param} must be a number, got {value!r}") from None
    if not lo <= x <= hi:  # also rejects NaN
        span = f">= {lo:g}" if hi == float("inf") else f"in [{lo:g}, {hi:g}]"
        raise ValueError(f"policy {policy!r}: {param} must be {span}, got {value!r}")
    return x


def parse_choice(value: str, policy: str, param: str, choices: tuple[str, ...]) -> str:
    """``value`` if it is one of ``choices``, else a ValueError naming the parameter."""
    if value not in choices:
        raise ValueError(f"policy {policy!r}: {param} must be one of {', '.join(choices)}; "
                         f"got {value!r}")
    return value


def check_arity(cls: type, policy: str, args: tuple[object, ...] | list[object]) -> None:
    """A ValueError if ``cls`` takes fewer positional arguments than ``args``."""
    params = inspect.signature(cls).parameters.values()
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return
    room = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
    if len(args) > room:
        got = ",".join(map(str, args))
        what = "no argument" if room == 0 else f"at most {room} argument(s)"
        raise ValueError(f"policy {policy!r} takes {what}, got {got!r}")
