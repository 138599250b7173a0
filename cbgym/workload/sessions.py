"""Multi-turn sessions with prefix-block identities: the agent-session loader, and the
conventions session traces follow (a file's parsing and checks are
:mod:`cbgym.workload.session_rows`, the synthetic generator :mod:`cbgym.workload.
session_synth`, the reuse statistics :mod:`cbgym.workload.prefix_reuse`).

Block identities follow one convention, read by the engine (``cbgym.engine.prefix_cache``):

- ``trace.extra["hash_ids"]``: one tuple of ints per request, one id per ``B``-token block of the
  prompt (``ceil(prompt / B)`` ids; the last covers a final partial block). Ids are chained:
  equal ids at position k mean identical tokens over blocks 0..k, in any two requests of the
  trace (ids are global to the trace).
- ``trace.extra["hash_block_tokens"]``: ``B`` per request (int64).

Session traces add, per request (all aligned with the arrival-sorted trace):

- ``session`` (int64): the session's index (0-based; file order for the loader).
- ``turn`` (int64): the request's index within its session.
- ``prev`` (int64): the trace position of the same session's previous turn, -1 for a first
  turn. Positions are those of the trace as built; after slicing use
  :func:`previous_in_session`, which recomputes them from ``session`` and ``turn``.
- ``think_time_s`` (float64): seconds the client waits after the previous turn's response
  ends before sending this one (0 for a first turn). A closed-loop replay sends request i at
  ``end(prev[i]) + think_time_s[i]``; ``arrival_s`` is the open-loop schedule.
"""

from __future__ import annotations

import gzip
import math
import re
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from cbgym.workload.session_rows import (
    SESSION_KEYS,
    SessionFormatError,
    _check_chain,
    _parse_session,
    _Session,
    _session_files,
)
from cbgym.workload.trace import Trace

__all__ = [
    "SESSION_KEYS",
    "SessionDataWarning",
    "SessionFormatError",
    "is_session_file",
    "load_agent_sessions",
    "previous_in_session",
]

_SESSION_HEAD = re.compile(r'"requests"\s*:\s*\[')

Sampler = Callable[[np.random.Generator, int], ArrayLike]


class SessionDataWarning(UserWarning):
    """Values were filled in or adjusted while loading sessions (no request is dropped).

    ``count`` of ``total`` requests were affected, ``reason`` says how.
    """

    def __init__(self, path: str | Path, count: int, total: int, reason: str) -> None:
        self.path, self.count, self.total, self.reason = str(path), count, total, reason
        super().__init__(f"{path}: {count} of {total} requests: {reason}")


# --------------------------------------------------------------------------- agent sessions


def is_session_file(path: str | Path) -> bool:
    """Whether ``path`` looks like an agent-session JSON (a top-level ``"requests": [``).

    Only the first 64 KiB are read; a Mooncake JSONL line never has a ``requests`` key.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as handle:
            head = handle.read(1 << 16).decode("utf-8", errors="replace")
    except OSError:
        return False
    return head.lstrip("\ufeff \t\r\n").startswith("{") and bool(_SESSION_HEAD.search(head))


def _remap(sessions: list[_Session]) -> list[list[tuple[int, ...]]]:
    """Every session's ids as globally unique dense ints, plus a fresh id per partial block.

    A ``local`` session's ids get their own range (two sessions never share a block); all
    ``global`` sessions share one namespace. Within a range, ids are numbered in sorted order
    of the file's ids, then the partial blocks' fresh ids in request order.
    """
    groups: list[list[int]] = [[k] for k, s in enumerate(sessions) if s.scope == "local"]
    shared = [k for k, s in enumerate(sessions) if s.scope == "global"]
    if shared:
        groups.append(shared)
    groups.sort(key=lambda g: g[0])
    out: list[list[tuple[int, ...]]] = [[] for _ in sessions]
    offset = 0
    for group in groups:
        members = [sessions[k] for k in group]
        _check_chain(members)
        lengths = [len(a) for s in members for a in s.ids]
        flat = [a for s in members for a in s.ids]
        ids = np.concatenate(flat) if flat else np.zeros(0, np.int64)
        uniq, inverse = np.unique(ids, return_inverse=True)
        new = (inverse.reshape(-1) + offset).astype(np.int64)
        fresh = offset + uniq.size
        bounds = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
        r = 0
        for k, s in zip(group, members, strict=True):
            for i in range(len(s.ids)):
                row = new[bounds[r]:bounds[r + 1]].tolist()
                if s.prompt[i] % s.block:
                    row.append(fresh)
                    fresh += 1
                out[k].append(tuple(row))
                r += 1
        offset = fresh
    return out


def load_agent_sessions(path: str | Path, *, stagger_s: float = 0.0) -> Trace:
    """Load agent sessions (kv-cache-tester format): a folder of session JSONs or one file.

    A session file holds ``id``, ``block_size``, ``hash_id_scope`` (``"local"``: ids are
    comparable within the session only; ``"global"``: across sessions too; absent: local),
    and ``requests``, each with ``t`` (s from the session start), ``in``, ``out`` (tokens),
    ``hash_ids`` (one per full ``block_size``-token block), and optionally ``think_time``,
    ``api_time``, ``ttft`` (s), ``model``. Other keys are ignored. A folder's ``*.json`` files
    are read in name order; session ``i`` is the i-th.

    Arrivals are open loop: session ``i`` starts at ``i * stagger_s`` (by default every session
    starts at 0) and a request arrives at its session's start + ``t``. The trace is sorted by
    arrival, stably (ties keep session, then turn order), and rebased so the first is at 0.

    Block ids are remapped to ints unique across the trace, dense from 0: a local session's
    ids get a range no other session shares. The files give no id to a prompt's partial last
    block, so it gets a fresh id of its own (never a hit: its tokens are not known to match
    anything), making ``ceil(in / block_size)`` ids per request as the engine expects.

    Filled in or adjusted, with a :class:`SessionDataWarning` giving the count (nothing is
    dropped): ``out == 0`` becomes 1 (a :class:`Trace` needs an output token, and a zero would
    not cost the request its prefill; none in the published files); a missing ``think_time``
    (7 of the 996 published requests) is estimated as the gap to the previous request's ``t``
    less its ``api_time`` (the whole gap where that is missing too), 0 for a first turn.

    Args:
        path: a folder of session ``*.json`` files, or one session file (``.json[.gz]``).
        stagger_s: seconds between consecutive sessions' starts, >= 0.

    Returns:
        A trace named by ``path`` with extras ``hash_ids``, ``hash_block_tokens``,
        ``session``, ``turn``, ``prev``, ``think_time_s`` (see the module docstring), and
        ``session_id`` (the file's ``id``), ``model`` (str), ``api_time_s`` and ``ttft_s``
        (float64 as measured upstream, NaN where the file has none).

    Raises:
        SessionFormatError: (a :class:`TraceFormatError`) naming the file, the request, the
            JSON path, the value and what was expected: a missing key; a count that is not a
            whole number (``in`` >= 1, ``out`` >= 0); a time that is negative, not finite, or
            before the session's previous request; ``hash_ids`` that is not a list of ints, or
            whose length is not ``floor(in / block_size)``; ids that are not chained (an id at
            two positions, or after two different ids); a folder without ``*.json`` files.
        FileNotFoundError: nothing at ``path``.
        ValueError: a negative or non-finite ``stagger_s``.
    """
    if not math.isfinite(stagger_s) or stagger_s < 0:
        raise ValueError(f"stagger_s is {stagger_s}; expected a finite number of seconds >= 0")
    path = Path(path)
    sessions = [_parse_session(p) for p in _session_files(path)]
    firsts: dict[str, Path] = {}
    for s in sessions:
        if s.sid in firsts:
            raise SessionFormatError(s.path, None, "id", s.sid,
                                     f"a session id no other file has ({firsts[s.sid]} has it)")
        firsts[s.sid] = s.path
    total = sum(len(s.t) for s in sessions)
    for count, reason in (
        (sum(s.zero_out for s in sessions), "out == 0 raised to 1 (a request decodes at least "
         "one token)"),
        (sum(s.think_missing for s in sessions), "no think_time; estimated from the gap "
         "between send times less the previous api_time"),
    ):
        if count:
            warnings.warn(SessionDataWarning(path, count, total, reason), stacklevel=2)
    ids = [row for rows in _remap(sessions) for row in rows]
    counts = [len(s.t) for s in sessions]
    session = np.repeat(np.arange(len(sessions), dtype=np.int64), counts)
    turn = np.concatenate([np.arange(c, dtype=np.int64) for c in counts])
    arrival = np.concatenate([s.t + k * stagger_s for k, s in enumerate(sessions)])
    columns = {
        "hash_block_tokens": np.repeat([s.block for s in sessions], counts).astype(np.int64),
        "session": session,
        "turn": turn,
        "think_time_s": np.concatenate([s.think for s in sessions]),
        "session_id": _objects([s.sid for s in sessions for _ in s.t]),
        "model": _objects([m for s in sessions for m in s.model]),
        "api_time_s": np.concatenate([s.api for s in sessions]),
        "ttft_s": np.concatenate([s.ttft for s in sessions]),
    }
    return _sessions_trace(
        arrival, np.concatenate([s.prompt for s in sessions]),
        np.concatenate([s.output for s in sessions]), ids, columns, name=str(path))


def _objects(values: Sequence[Any]) -> np.ndarray:
    column = np.empty(len(values), dtype=object)
    column[:] = list(values)
    return column


def _sessions_trace(
    arrival: np.ndarray, prompt: np.ndarray, output: np.ndarray, ids: list[tuple[int, ...]],
    columns: dict[str, np.ndarray], name: str,
) -> Trace:
    """Sort requests given in (session, turn) order by arrival and add ``prev``."""
    order = np.argsort(arrival, kind="stable")
    extra = {k: v[order] for k, v in columns.items()}
    extra["hash_ids"] = _objects(ids)[order]
    extra["prev"] = _previous(extra["session"], extra["turn"])
    return Trace.from_arrays(arrival[order], prompt[order], output[order], name=name,
                             extra=extra)


def _previous(session: np.ndarray, turn: np.ndarray) -> np.ndarray:
    prev = np.full(session.size, -1, np.int64)
    if session.size < 2:
        return prev
    by = np.lexsort((turn, session))  # positions in (session, turn) order
    follows = (session[by][1:] == session[by][:-1]) & (turn[by][1:] == turn[by][:-1] + 1)
    prev[by[1:][follows]] = by[:-1][follows]
    return prev


def previous_in_session(trace: Trace) -> np.ndarray:
    """Each request's previous turn's position in ``trace`` (-1: none in the trace).

    Recomputed from ``extra["session"]`` and ``extra["turn"]``, so it stays right after
    slicing (the stored ``prev`` holds positions of the trace as built); a turn whose
    predecessor lies outside a window counts as a first turn.
    """
    for key in ("session", "turn"):
        if key not in trace.extra:
            raise ValueError(f"trace {trace.name!r} has no extra[{key!r}] (not a session trace)")
    return _previous(np.asarray(trace.extra["session"], np.int64),
                     np.asarray(trace.extra["turn"], np.int64))
