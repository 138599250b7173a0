"""What ``cbgym bench`` and the other commands resolve before any work: engines, traces and
policies by name (each failure one clear line), and where a sweep's windows start."""

from __future__ import annotations

from typing import Any

import numpy as np

from cbgym.engine.config import EngineConfig
from cbgym.workload.catalog import CATALOG, TraceNotFoundError, default_cache_dir, load_trace
from cbgym.workload.trace import Trace


def engine_overrides(max_num_seqs: int | None, max_num_batched_tokens: int | None,
                     preemption: str | None, chunked_prefill: bool,
                     prefix_caching: bool = False) -> dict[str, Any]:
    """EngineConfig fields given on the command line, to set on top of a preset."""
    over: dict[str, Any] = {}
    if max_num_seqs is not None:
        over["max_num_seqs"] = max_num_seqs
    if max_num_batched_tokens is not None:
        over["max_num_batched_tokens"] = max_num_batched_tokens
    if preemption is not None:
        over["preemption"] = preemption
    if not chunked_prefill:
        over["chunked_prefill"] = False
    if prefix_caching:
        over["enable_prefix_caching"] = True
    return over


def resolve_engine(preset: str, overrides: dict[str, Any] | None = None) -> EngineConfig:
    """The EngineConfig of ``preset`` with ``overrides``; ValueError with one clear line."""
    try:
        return EngineConfig(preset=preset, **(overrides or {}))
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"engine {preset!r}: {_first_line(exc)}") from exc


def resolve_trace(name: str, download: bool = False) -> Trace:
    """Load a trace by name or path; ValueError with one clear line when it is missing."""
    try:
        return load_trace(name, download=download)
    except TraceNotFoundError as exc:
        if name in CATALOG:
            raise ValueError(
                f"trace {name!r} not found locally (looked in $CBGYM_TRACE_DIR and "
                f"{default_cache_dir()}); set CBGYM_TRACE_DIR to the folder holding "
                f"{CATALOG[name].filename} or pass --download") from exc
        raise ValueError(_first_line(exc)) from exc
    except (OSError, ValueError) as exc:
        raise ValueError(f"trace {name!r}: {_first_line(exc)}") from exc


def scalable(name: str, trace: Trace) -> None:
    """Raise ValueError (one line) unless ``trace`` can be rescaled to a load: two requests
    or more, not all at one instant (its arrival rate is finite)."""
    if len(trace) < 2:
        raise ValueError(f"trace {name!r} has {len(trace)} request(s); rescaling to a load "
                         "needs at least two")
    if not trace.arrival_s[-1] > trace.arrival_s[0]:
        raise ValueError(f"trace {name!r}: all {len(trace)} requests arrive at one instant; "
                         "rescaling to a load needs distinct arrival times")


def check_policy(spec: str) -> None:
    """Raise ValueError (one line) unless ``spec`` builds a policy."""
    from cbgym.agents import make_policy

    try:
        make_policy(spec)
    except (ValueError, TypeError) as exc:
        raise ValueError(_first_line(exc)) from exc


class PolicyTraceError(ValueError):
    """A policy of the sweep refuses one of its windows (``Policy.check_trace``)."""


def check_policy_windows(specs: tuple[str, ...], windows: list[Trace]) -> None:
    """Each policy's ``check_trace`` on each window, before any work (PolicyTraceError)."""
    from cbgym.agents import make_policy

    for spec in specs:
        pol = make_policy(spec)
        for window in windows:
            try:
                pol.check_trace(window)
            except ValueError as exc:
                raise PolicyTraceError(_first_line(exc)) from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


CAPACITY_MODES = ("per-window", "per-trace")


def window_span(num_requests: int, count: int,
                span: tuple[float, float] = (0.0, 1.0)) -> tuple[int, int, int]:
    """The requests ``[lo, hi)`` a ``span`` of the trace covers, and the window length in
    it (``count`` clipped to the span)."""
    lo, hi = int(np.ceil(span[0] * num_requests)), int(np.floor(span[1] * num_requests))
    if hi - lo < 2:
        raise ValueError(f"window range {span[0]:g}:{span[1]:g} of a trace of {num_requests} "
                         f"requests holds {max(hi - lo, 0)}; a window needs at least 2")
    return lo, hi, min(count, hi - lo)


def window_starts(num_requests: int, windows: int, count: int,
                  span: tuple[float, float] = (0.0, 1.0)) -> list[int]:
    """Evenly spaced window starts: disjoint when ``windows * count`` fits in the span.

    ``span``: the fractions of the trace (by request) the windows are drawn from, e.g.
    ``(0.4, 1.0)`` for the part after a predictor's training split. A window longer than
    that part is clipped to it, and duplicate starts (more windows than distinct positions)
    are dropped.
    """
    lo, hi, count = window_span(num_requests, count, span)
    last = hi - count
    starts = np.rint(np.linspace(lo, last, windows)).astype(int) if windows > 1 else [lo]
    return sorted({int(s) for s in starts})


__all__ = ["CAPACITY_MODES", "PolicyTraceError", "check_policy", "check_policy_windows",
           "engine_overrides", "resolve_engine", "resolve_trace", "scalable", "window_span",
           "window_starts"]
