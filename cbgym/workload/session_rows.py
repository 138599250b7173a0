"""One agent-session file, parsed and checked: its format's keys, the error that names the file,
request and field at fault, and the chained-id check across sessions
(:func:`cbgym.workload.sessions.load_agent_sessions` builds the trace from these)."""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cbgym.workload.rows import TraceFormatError

# Keys every session file and every request must have (others, e.g. ``totals``, are ignored).
SESSION_KEYS = ("id", "block_size", "requests")
REQUEST_KEYS = ("t", "in", "out", "hash_ids")
# Counts must be exact integers; JSON numbers past 2**53 may have lost digits on the way.
_MAX_COUNT = 2**53
_INT64 = (-(2**63), 2**63 - 1)
_SCOPES = ("local", "global")


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


_MISSING = object()


def _shown(value: Any) -> str:
    """A JSON value as text for an error message, cut short (hash lists can be long)."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


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
