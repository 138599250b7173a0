"""Readers that turn trace files (Azure, BurstGPT, Mooncake) into validated :class:`Trace` objects.

Every row is validated. Parsing is vectorised (pandas/numpy); only when a check fails do we go
back to find the first offending row, so the error names the file, the line (1-based; a CSV
header is line 1), the field, the bad value and what was expected.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cbgym.workload.rows import (
    DroppedRowsWarning,
    TraceFormatError,
    _base_suffix,
    _check_int,
    _check_sorted,
    _check_span,
    _csv_line,
    _first_line,
    _numbers,
    _open_text,
    _parse_timestamps,
    _Problems,
    _read_csv,
    _suffix_name,
    _utf8,
)
from cbgym.workload.trace import Trace

__all__ = [
    "AZURE_COLUMNS",
    "BURSTGPT_COLUMNS",
    "DroppedRowsWarning",
    "MOONCAKE_BLOCK_TOKENS",
    "TraceFormatError",
    "load_azure",
    "load_burstgpt",
    "load_mooncake",
    "load_trace_file",
    "sniff_format",
]

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = (
    "Timestamp", "Session ID", "Elapsed time", "Model",
    "Request tokens", "Response tokens", "Total tokens", "Log Type",
)
# Only these BurstGPT columns are needed; the others may be absent.
_BURSTGPT_REQUIRED = ("Timestamp", "Request tokens", "Response tokens")
_TIMESTAMP_EXPECTED = (
    "a timestamp like '2023-11-16 18:15:46.6805900' or '2024-05-10 00:00:00.009930+00:00'"
    " between 1677-09-21 and 2262-04-11 UTC"
)
# Mooncake's hash_ids name 512-token blocks (the FAST'25 release's block size).
MOONCAKE_BLOCK_TOKENS = 512



# --------------------------------------------------------------------------- Azure


def load_azure(path: str | Path, *, drop_zero_output: bool = False) -> Trace:
    """Load an Azure LLM inference trace CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``).

    Reads both the 2023 format (``2023-11-16 18:15:46.6805900``, naive, 7 fractional digits)
    and the 2024 format (``2024-05-10 00:00:00.009930+00:00``, mixed precision, UTC offset);
    naive times are taken as UTC. Arrivals are rebased so the first request arrives at 0.

    Args:
        path: the CSV file (``.csv`` or ``.csv.gz``).
        drop_zero_output: rows with ``GeneratedTokens == 0`` (requests that produced nothing;
            none in the 2023 files) are rejected by default. With True they are dropped, a
            :class:`DroppedRowsWarning` says how many, and the trace name ends with
            ``"(dropped N zero-output rows)"``.

    Returns:
        The validated trace, named by the file path.

    Raises:
        TraceFormatError: a missing header column, an empty file, an unparseable or unsorted
            timestamp, a token count that is empty, not a whole number, or below 1.
    """
    path = Path(path)
    frame = _read_csv(path, AZURE_COLUMNS, text_columns=("TIMESTAMP",))
    problems = _Problems(path, _csv_line)
    nanos, stamp_ok = _parse_timestamps(frame["TIMESTAMP"])
    problems.check(~stamp_ok, frame["TIMESTAMP"], "TIMESTAMP", _TIMESTAMP_EXPECTED)
    prompt = _check_int(problems, frame["ContextTokens"], "ContextTokens", 1)
    output = _check_int(problems, frame["GeneratedTokens"], "GeneratedTokens", 0)
    zero = output == 0
    if not drop_zero_output:
        problems.check(
            zero, frame["GeneratedTokens"], "GeneratedTokens", "an integer >= 1",
            f"{int(zero.sum())} of {len(frame)} rows have 0 generated tokens; "
            "load with drop_zero_output=True to drop them",
        )
    problems.raise_first()
    _check_sorted(path, nanos, frame["TIMESTAMP"], "TIMESTAMP", _csv_line)
    keep = ~zero
    dropped = int(zero.sum())
    if dropped:
        warnings.warn(
            DroppedRowsWarning(path, dropped, len(frame), "GeneratedTokens == 0"), stacklevel=2
        )
    if not keep.any():
        raise TraceFormatError(path, 2, "GeneratedTokens", "0", "at least one row with output >= 1")
    # sorted, so each span is in [0, 2**64): a span over 292 years wraps in int64 but is exact
    # read back as uint64
    seconds = (nanos[keep] - nanos[keep][0]).view(np.uint64) / 1e9
    return Trace.from_arrays(
        seconds, prompt[keep].astype(np.int64), output[keep].astype(np.int64),
        name=_suffix_name(path, dropped, "zero-output rows"),
        # the recorded wall clock (Unix seconds, UTC): hour and weekday for predictors
        extra={"epoch_s": nanos[keep] / 1e9},
    )


# --------------------------------------------------------------------------- BurstGPT


def load_burstgpt(path: str | Path, *, model: str | Iterable[str] | None = None) -> Trace:
    """Load a BurstGPT CSV (``Timestamp,Session ID,...,Request tokens,Response tokens,...``).

    ``Timestamp`` is seconds (float) since the trace start. Rows with ``Response tokens == 0``
    are failed requests in BurstGPT; they are dropped, a :class:`DroppedRowsWarning` gives the
    count (also in ``warning.count``), and the trace name ends with
    ``"(dropped N failed requests)"``.

    Args:
        path: the CSV file.
        model: keep only rows whose ``Model`` equals this name (or is in this collection of
            names), e.g. ``"ChatGPT"`` or ``"GPT-4"``; None keeps every model.

    Returns:
        The validated trace of successful requests, named by the file path.

    Raises:
        TraceFormatError: a missing column, an empty file, a non-numeric or unsorted timestamp,
            a token count that is not a whole number >= 0, a kept request with 0 request
            tokens, or no request left after filtering.
    """
    path = Path(path)
    required = _BURSTGPT_REQUIRED + (("Model",) if model is not None else ())
    frame = _read_csv(path, required, text_columns=("Model", "Log Type", "Session ID"))
    problems = _Problems(path, _csv_line)
    stamp = _numbers(frame["Timestamp"])
    problems.check(~np.isfinite(stamp), frame["Timestamp"], "Timestamp", "seconds as a number")
    _check_span(problems, stamp, frame["Timestamp"], "Timestamp")
    prompt = _check_int(problems, frame["Request tokens"], "Request tokens", 0)
    output = _check_int(problems, frame["Response tokens"], "Response tokens", 0)
    problems.raise_first()
    _check_sorted(path, stamp, frame["Timestamp"], "Timestamp", _csv_line)

    selected = np.ones(len(frame), dtype=bool)
    if model is not None:
        names = [model] if isinstance(model, str) else list(model)
        selected = frame["Model"].isin(names).to_numpy()
    failed = selected & (output == 0)
    keep = selected & ~failed
    problems.check(keep & (prompt < 1), frame["Request tokens"], "Request tokens",
                   "an integer >= 1 for a successful request")
    problems.raise_first()
    if not keep.any():
        raise TraceFormatError(
            path, 2, "Model" if model is not None else "Response tokens", "",
            f"at least one successful request (model filter: {model!r})",
        )
    dropped = int(failed.sum())
    if dropped:
        warnings.warn(
            DroppedRowsWarning(path, dropped, int(selected.sum()), "failed: Response tokens == 0"),
            stacklevel=2,
        )
    return Trace.from_arrays(
        stamp[keep], prompt[keep].astype(np.int64), output[keep].astype(np.int64),
        name=_suffix_name(path, dropped, "failed requests"),
    )


# --------------------------------------------------------------------------- Mooncake


def _jsonl_records(path: Path) -> tuple[list[Any], np.ndarray]:
    """Parse a JSONL file; returns the records and the 1-based line number of each."""
    with _utf8(path), _open_text(path) as handle:
        lines = handle.read().splitlines()
    line_no = np.array([i + 1 for i, text in enumerate(lines) if text.strip()], dtype=np.int64)
    if not line_no.size:
        raise TraceFormatError(path, 1, "line", "", "at least one JSON object per line")
    body = [lines[i - 1] for i in line_no]
    try:
        # One C-level parse of the whole file; only on failure do we look line by line.
        records = json.loads("[" + ",".join(body) + "]")
    except json.JSONDecodeError:
        records = None
    if records is None or len(records) != len(body):
        for number, text in zip(line_no, body, strict=True):
            try:
                json.loads(text)
            except json.JSONDecodeError as exc:
                raise TraceFormatError(path, int(number), "line", text, "a JSON object",
                                       exc.msg) from exc
        raise TraceFormatError(path, int(line_no[0]), "line", body[0], "one JSON object per line")
    not_dict = [i for i, rec in enumerate(records) if not isinstance(rec, dict)]
    if not_dict:
        i = not_dict[0]
        raise TraceFormatError(path, int(line_no[i]), "line", body[i], "a JSON object {...}")
    return records, line_no


def load_mooncake(path: str | Path) -> Trace:
    """Load a Mooncake (FAST'25) JSONL trace: one ``{"timestamp", "input_length",
    "output_length", "hash_ids"}`` object per line.

    ``timestamp`` is milliseconds; it becomes seconds. ``hash_ids`` (ids of the 512-token
    prefix blocks) is kept in ``trace.extra["hash_ids"]`` as an object array of tuples (tuples,
    not lists, so a cached trace cannot be changed through them), with
    ``trace.extra["hash_block_tokens"]`` = 512 for every request (the tokens each id stands
    for, which the engine's prefix cache needs).

    Args:
        path: the ``.jsonl`` file.

    Returns:
        The validated trace, named by the file path.

    Raises:
        TraceFormatError: a line that is not a JSON object, a missing or non-numeric
            timestamp, a length that is not a whole number >= 1, ``hash_ids`` that is not a
            list, or unsorted timestamps.
    """
    path = Path(path)
    records, line_no = _jsonl_records(path)
    frame = pd.DataFrame.from_records(records)
    problems = _Problems(path, lambda i: int(line_no[i]))
    for field in ("timestamp", "input_length", "output_length"):
        if field not in frame:
            raise TraceFormatError(path, int(line_no[0]), field, "",
                                   f"a {field!r} key on every line")
    stamp = _numbers(frame["timestamp"])
    problems.check(~np.isfinite(stamp), frame["timestamp"], "timestamp", "milliseconds as a number")
    _check_span(problems, stamp, frame["timestamp"], "timestamp")
    prompt = _check_int(problems, frame["input_length"], "input_length", 1)
    output = _check_int(problems, frame["output_length"], "output_length", 1)
    extra = {}
    if "hash_ids" in frame:
        hashes = frame["hash_ids"]
        not_list = np.fromiter((not isinstance(h, list) for h in hashes), bool, len(hashes))
        problems.check(not_list, hashes, "hash_ids", "a list of block ids")
        problems.raise_first()
        column = np.empty(len(hashes), dtype=object)
        column[:] = [tuple(h) for h in hashes]
        extra["hash_ids"] = column
        extra["hash_block_tokens"] = np.full(len(hashes), MOONCAKE_BLOCK_TOKENS, np.int64)
    problems.raise_first()
    _check_sorted(path, stamp, frame["timestamp"], "timestamp", lambda i: int(line_no[i]))
    return Trace.from_arrays(
        stamp / 1000.0, prompt.astype(np.int64), output.astype(np.int64),
        name=str(path), extra=extra,
    )


# --------------------------------------------------------------------------- dispatch

def _load_agent_sessions(path: Path, **options: Any) -> Trace:
    # imported here: cbgym.workload.sessions imports this module (TraceFormatError)
    from cbgym.workload.sessions import load_agent_sessions

    return load_agent_sessions(path, **options)


_LOADERS: dict[str, Callable[..., Trace]] = {
    "azure": load_azure,
    "burstgpt": load_burstgpt,
    "mooncake": load_mooncake,
    "agent-sessions": _load_agent_sessions,
}


def sniff_format(path: str | Path) -> str:
    """Which loader reads ``path``: ``"azure"``, ``"burstgpt"``, ``"mooncake"`` or
    ``"agent-sessions"``.

    A JSON document with a top-level ``"requests": [`` list in its first 64 KiB is an agent
    session (:func:`cbgym.workload.sessions.load_agent_sessions`). Otherwise decided by the
    extension (``.jsonl``/``.json``: Mooncake) or else by the first line (a JSON object, the
    Azure header or the BurstGPT header). A ``.gz`` suffix is looked through.

    Raises:
        TraceFormatError: the first line matches no known format.
    """
    from cbgym.workload.sessions import is_session_file

    path = Path(path)
    if _base_suffix(path) in (".jsonl", ".json"):
        return "agent-sessions" if is_session_file(path) else "mooncake"
    first = _first_line(path)
    if first is None:
        raise TraceFormatError(path, 1, "header", "", "a header line (the file is empty)")
    if first.lstrip().startswith("{"):
        return "agent-sessions" if is_session_file(path) else "mooncake"
    header = {name.strip() for name in first.split(",")}
    # Any one known column is enough to pick the format; its loader then names what is missing.
    if header & set(AZURE_COLUMNS):
        return "azure"
    if header & set(BURSTGPT_COLUMNS):
        return "burstgpt"
    raise TraceFormatError(
        path, 1, "header", first,
        f"an Azure header {','.join(AZURE_COLUMNS)!r}, a BurstGPT header "
        f"{','.join(BURSTGPT_COLUMNS)!r} or Mooncake JSON lines",
    )


def load_trace_file(path: str | Path, **options: Any) -> Trace:
    """Load a trace file of any supported format, chosen by :func:`sniff_format`.

    Args:
        path: an Azure CSV, a BurstGPT CSV, a Mooncake JSONL file or one agent-session JSON
            (optionally ``.gz``).
        **options: passed to the format's loader (``drop_zero_output`` for Azure, ``model``
            for BurstGPT, ``stagger_s`` for agent sessions).

    Returns:
        The validated trace.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no trace file at {path.resolve()}")
    return _LOADERS[sniff_format(path)](path, **options)
