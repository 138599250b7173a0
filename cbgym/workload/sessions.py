"""Multi-turn sessions with prefix-block identities: the agent-session loader, and the
conventions session traces follow (the synthetic generator is :mod:`cbgym.workload.
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
import json
import math
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from cbgym.workload.rows import TraceFormatError
from cbgym.workload.trace import Trace

__all__ = [
    "SESSION_KEYS",
    "SessionDataWarning",
    "SessionFormatError",
    "is_session_file",
    "load_agent_sessions",
    "previous_in_session",
]

# Keys every session file and every request must have (others, e.g. ``totals``, are ignored).
SESSION_KEYS = ("id", "block_size", "requests")
REQUEST_KEYS = ("t", "in", "out", "hash_ids")
# Counts must be exact integers; JSON numbers past 2**53 may have lost digits on the way.
_MAX_COUNT = 2**53
_INT64 = (-(2**63), 2**63 - 1)
_SCOPES = ("local", "global")
_SESSION_HEAD = re.compile(r'"requests"\s*:\s*\[')

Sampler = Callable[[np.random.Generator, int], ArrayLike]


class SessionFormatError(TraceFormatError):
    """An agent-session file does not match the format.

    Attributes (beyond :class:`TraceFormatError`'s):
        request: 0-based index of the request at fault in the file's ``requests``, or None for
            the file's top level. ``line`` is that index + 1 (0 at top level): a session file
            is one JSON document, often a single line, so a line number would say nothing.
        field: the JSON path at fault, e.g. ``requests[3].hash_ids``.
    """

    def __init__(
        self, path: str | Path, request: int | None, key: str, value: Any, expected: str,
        note: str = "",
    ) -> None:
        where = key if request is None else f"requests[{request}]" + (f".{key}" if key else "")
        missing = value is _MISSING
        shown = "" if missing else _shown(value)
        super().__init__(path, 0 if request is None else request + 1, where, shown, expected, note)
        self.request = request
        state = "is missing" if missing else f"is {shown}"
        message = f"{path}: {where} {state}; expected {expected}"
        self.args = (f"{message} ({note})" if note else message,)


class SessionDataWarning(UserWarning):
    """Values were filled in or adjusted while loading sessions (no request is dropped).

    ``count`` of ``total`` requests were affected, ``reason`` says how.
    """

    def __init__(self, path: str | Path, count: int, total: int, reason: str) -> None:
        self.path, self.count, self.total, self.reason = str(path), count, total, reason
        super().__init__(f"{path}: {count} of {total} requests: {reason}")


_MISSING = object()


def _shown(value: Any) -> str:
    """A JSON value as text for an error message, cut short (hash lists can be long)."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


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


def _session_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.glob("*.json") if p.is_file())
        if not files:
            raise SessionFormatError(path, None, "folder", _MISSING,
                                     "a folder holding at least one session *.json file")
        return files
    if path.is_file():
        return [path]
    raise FileNotFoundError(f"no agent-session file or folder at {path.resolve()}")


def _read_json(path: Path) -> Any:
    raw = path.read_bytes()
    if path.suffix == ".gz":
        raw = gzip.decompress(raw)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SessionFormatError(path, None, "file", _MISSING, "UTF-8 text",
                                 f"byte 0x{raw[exc.start]:02x} at offset {exc.start}") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SessionFormatError(path, None, "file", text[max(exc.pos - 20, 0):exc.pos + 20],
                                 "one JSON object", f"{exc.msg} at line {exc.lineno} column "
                                 f"{exc.colno}") from exc


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _count(value: Any) -> int | None:
    """An exact whole number (int, or a whole float) up to 2**53, else None."""
    if not _is_number(value) or not math.isfinite(value) or value != math.floor(value):
        return None
    return int(value) if abs(value) <= _MAX_COUNT else None


@dataclass
class _Session:
    """One parsed, validated session file (request columns in file order)."""

    path: Path
    sid: str
    block: int
    scope: str
    t: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    ids: list[np.ndarray]
    think: np.ndarray
    think_missing: int
    api: np.ndarray
    ttft: np.ndarray
    model: list[str]
    zero_out: int


def _optional_time(path: Path, i: int, req: dict[str, Any], key: str) -> float:
    if key not in req or req[key] is None:
        return math.nan
    value = req[key]
    if not _is_number(value) or not math.isfinite(value) or value < 0:
        raise SessionFormatError(path, i, key, value, "seconds as a finite number >= 0")
    return float(value)


def _parse_session(path: Path) -> _Session:
    doc = _read_json(path)
    if not isinstance(doc, dict):
        raise SessionFormatError(path, None, "file", doc, "a JSON object {...} (one session)")
    for key in SESSION_KEYS:
        if key not in doc:
            raise SessionFormatError(path, None, key, _MISSING, f"a top-level {key!r} key")
    sid = doc["id"]
    if not isinstance(sid, str | int) or isinstance(sid, bool):
        raise SessionFormatError(path, None, "id", sid, "a session id (string)")
    block = _count(doc["block_size"])
    if block is None or block < 1:
        raise SessionFormatError(path, None, "block_size", doc["block_size"],
                                 "tokens per hash block, an integer >= 1")
    # Without a scope, ids are taken as local: never sharing across sessions is the safe
    # reading (a false share would fake cache hits).
    scope = doc.get("hash_id_scope", "local")
    if scope not in _SCOPES:
        raise SessionFormatError(path, None, "hash_id_scope", scope, "'local' or 'global'")
    requests = doc["requests"]
    if not isinstance(requests, list) or not requests:
        raise SessionFormatError(path, None, "requests", requests,
                                 "a non-empty list of request objects")
    n = len(requests)
    t, think, api, ttft = (np.empty(n) for _ in range(4))
    prompt, output = np.empty(n, np.int64), np.empty(n, np.int64)
    ids: list[np.ndarray] = []
    model: list[str] = []
    think_missing = zero_out = 0
    for i, req in enumerate(requests):
        if not isinstance(req, dict):
            raise SessionFormatError(path, i, "", req, "a request object {...}")
        for key in REQUEST_KEYS:
            if key not in req:
                raise SessionFormatError(path, i, key, _MISSING, f"a {key!r} key in every request")
        stamp = req["t"]
        if not _is_number(stamp) or not math.isfinite(stamp) or stamp < 0:
            raise SessionFormatError(path, i, "t", stamp,
                                     "seconds from the session start, a finite number >= 0")
        if i and stamp < t[i - 1]:
            raise SessionFormatError(path, i, "t", stamp,
                                     f"a time >= requests[{i - 1}].t = {t[i - 1]:g} (a session's "
                                     "requests are in sending order)")
        t[i] = stamp
        size = _count(req["in"])
        if size is None or size < 1:
            raise SessionFormatError(path, i, "in", req["in"], "prompt tokens, an integer >= 1")
        prompt[i] = size
        out = _count(req["out"])
        if out is None or out < 0:
            raise SessionFormatError(path, i, "out", req["out"], "output tokens, an integer >= 0")
        zero_out += out == 0
        output[i] = max(out, 1)
        ids.append(_check_ids(path, i, req["hash_ids"], size, block))
        think[i] = _optional_time(path, i, req, "think_time")
        api[i] = _optional_time(path, i, req, "api_time")
        ttft[i] = _optional_time(path, i, req, "ttft")
        if math.isnan(think[i]):
            think_missing += 1
            # Estimated from the send times: the gap less the previous request's measured API
            # time (the whole gap where that is unknown too: an upper bound).
            think[i] = 0.0 if i == 0 else max(
                0.0, t[i] - t[i - 1] - (0.0 if math.isnan(api[i - 1]) else api[i - 1]))
        name = req.get("model", "")
        model.append(name if isinstance(name, str) else str(name))
    return _Session(path, str(sid), block, scope, t, prompt, output, ids, think, think_missing,
                    api, ttft, model, zero_out)


def _check_ids(path: Path, i: int, hashes: Any, prompt: int, block: int) -> np.ndarray:
    if not isinstance(hashes, list):
        raise SessionFormatError(path, i, "hash_ids", hashes, "a list of integer block ids")
    # map(type, ...) runs in C; the scan for the culprit only on failure (bool is no id)
    kinds = set(map(type, hashes))
    try:
        ids = np.asarray(hashes, dtype=np.int64) if kinds <= {int} else None
    except OverflowError:
        ids = None
    if ids is None:
        for j, h in enumerate(hashes):
            if type(h) is not int or not _INT64[0] <= h <= _INT64[1]:
                raise SessionFormatError(path, i, f"hash_ids[{j}]", h,
                                         "an integer block id (fitting in int64)")
    # The published files hold one id per *full* block (len == floor(in / B) in all 996
    # requests); the partial last block has none, and gets a fresh id when loaded.
    if len(hashes) != prompt // block:
        raise SessionFormatError(
            path, i, "hash_ids", hashes,
            f"floor(in / block_size) = floor({prompt} / {block}) = {prompt // block} ids, one per "
            "full block", f"it has {len(hashes)}")
    assert ids is not None
    return ids


def _check_chain(sessions: list[_Session]) -> None:
    """Ids must be chained prefix identities: an id always at the same block position and
    after the same predecessor id. Otherwise the engine's prefix matching would be wrong."""
    flat = [a for s in sessions for a in s.ids]
    owner = np.repeat(np.arange(sum(len(s.ids) for s in sessions)), [len(a) for a in flat])
    ids = np.concatenate(flat) if flat else np.zeros(0, np.int64)
    if not ids.size:
        return
    pos = np.concatenate([np.arange(len(a)) for a in flat])
    pred = np.concatenate([np.concatenate(([0], a[:-1])) if len(a) else a for a in flat])
    _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    bad = np.flatnonzero((pos != pos[first][inverse]) | (pred != pred[first][inverse]))
    if bad.size:
        k = int(bad[0])
        first_k = int(first[inverse[k]])
        where = [(s, r) for s in sessions for r in range(len(s.ids))]
        session, request = where[int(owner[k])]
        other_s, other_r = where[int(owner[first_k])]
        seen = f"requests[{other_r}]" + ("" if other_s is session else f" of {other_s.path}")
        raise SessionFormatError(
            session.path, request, f"hash_ids[{int(pos[k])}]", int(ids[k]),
            f"chained prefix ids: this id is at position {int(pos[first_k])} after "
            f"{'nothing' if pos[first_k] == 0 else int(pred[first_k])} in {seen}, here at "
            f"position {int(pos[k])} after {'nothing' if pos[k] == 0 else int(pred[k])}")


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
