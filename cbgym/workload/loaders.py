"""Readers that turn trace files (Azure, BurstGPT, Mooncake) into validated :class:`Trace` objects.

Every row is validated. Parsing is vectorised (pandas/numpy); only when a check fails do we go
back to find the first offending row, so the error names the file, the line (1-based; a CSV
header is line 1), the field, the bad value and what was expected.
"""

from __future__ import annotations

import gzip
import json
import re
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from itertools import islice
from pathlib import Path
from typing import IO, Any

import numpy as np
import pandas as pd

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
# Counts are parsed as float64, which holds every integer only up to 2**53: a larger count (and
# anything past int64) could not be read exactly, and its int64 cast would wrap.
_MAX_COUNT = 2**53


class TraceFormatError(ValueError):
    """A trace file does not match its format.

    Attributes:
        path: the file.
        line: 1-based line number of the problem (a CSV header is line 1).
        field: the column (or ``"header"``, ``"row"``, ``"line"``) at fault.
        value: the offending text as found in the file ('' for an empty field).
        expected: what the field should have held.
    """

    def __init__(
        self, path: str | Path, line: int, field: str, value: str, expected: str, note: str = ""
    ) -> None:
        self.path, self.line, self.field = str(path), line, field
        self.value, self.expected = value, expected
        shown = "is empty" if value == "" else f"is {value!r}"
        message = f"{path}, line {line}: {field} {shown}; expected {expected}"
        super().__init__(f"{message} ({note})" if note else message)


class DroppedRowsWarning(UserWarning):
    """Rows were dropped on purpose while loading (e.g. failed requests).

    ``count`` is how many of ``total`` rows were dropped, and ``reason`` why.
    """

    def __init__(self, path: str | Path, count: int, total: int, reason: str) -> None:
        self.path, self.count, self.total, self.reason = str(path), count, total, reason
        super().__init__(f"{path}: dropped {count} of {total} rows ({reason})")


# --------------------------------------------------------------------------- shared helpers


def _open_text(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8-sig", newline="")
    return path.open("r", encoding="utf-8-sig", newline="")


@contextmanager
def _utf8(path: Path) -> Iterator[None]:
    """Turn a UnicodeDecodeError (which names no file) into a TraceFormatError at its line."""
    try:
        yield
    except UnicodeDecodeError as exc:
        raise _not_utf8(path) from exc


def _not_utf8(path: Path) -> TraceFormatError:
    """The first line that is not UTF-8, found by decoding the raw bytes line by line."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                shown = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                return TraceFormatError(
                    path, number, "line", shown, "UTF-8 text",
                    f"not UTF-8 text: byte 0x{raw[exc.start]:02x} at byte {exc.start + 1} of "
                    "the line; re-save the file as UTF-8",
                )
    return TraceFormatError(path, 0, "file", "", "UTF-8 text", "not UTF-8 text")


def _base_suffix(path: Path) -> str:
    return Path(path.stem).suffix.lower() if path.suffix == ".gz" else path.suffix.lower()


def _first_line(path: Path, skip_blank: bool = True) -> str | None:
    """The first (non-blank, unless ``skip_blank`` is False) line; None for an empty file."""
    with _utf8(path), _open_text(path) as handle:
        for line in handle:
            if line.strip() or not skip_blank:
                return line.rstrip("\r\n")
    return None


def _line_text(path: Path, line: int) -> str:
    """The text of one line, for error messages only (reads up to that line)."""
    with _utf8(path), _open_text(path) as handle:
        found = next(islice(handle, line - 1, line), "")
    return found.rstrip("\r\n")


def _read_csv(path: Path, columns: Sequence[str], text_columns: Iterable[str]) -> pd.DataFrame:
    """Read a CSV whose header must contain ``columns``; rows map to lines ``index + 2``.

    ``text_columns`` are read as str; the others' types are inferred (int64 when clean).
    """
    header_line = _first_line(path, skip_blank=False)
    if not header_line:
        raise TraceFormatError(path, 1, "header", "", f"a header line {','.join(columns)!r}")
    header = [name.strip() for name in header_line.split(",")]
    missing = [c for c in columns if c not in header]
    if missing:
        raise TraceFormatError(
            path, 1, "header", header_line,
            f"columns {', '.join(columns)} (missing: {', '.join(missing)})",
        )
    try:
        # skip_blank_lines=False keeps row i on line i + 2, so a blank line is reported
        # where it is instead of silently shifting every later line number.
        with _utf8(path):
            frame = pd.read_csv(
                path, dtype={c: "str" for c in text_columns if c in header},
                keep_default_na=False, na_values=[""], skip_blank_lines=False,
                skipinitialspace=True,
            )
    except pd.errors.ParserError as exc:
        match = re.search(r"line (\d+), saw (\d+)", str(exc))
        if not match:
            raise TraceFormatError(path, 0, "file", "", "a well-formed CSV", str(exc)) from exc
        line = int(match.group(1))
        raise TraceFormatError(
            path, line, "row", _line_text(path, line), f"{len(header)} comma-separated fields"
        ) from exc
    frame = _drop_trailing_blank_rows(frame)
    if not len(frame):
        raise TraceFormatError(path, 2, "row", "", "at least one data row after the header")
    return frame


def _drop_trailing_blank_rows(frame: pd.DataFrame) -> pd.DataFrame:
    filled = np.flatnonzero(frame.notna().any(axis=1).to_numpy())
    return frame.iloc[: filled[-1] + 1] if filled.size else frame.iloc[:0]


def _raw(series: pd.Series, i: int) -> str:
    value = series.iloc[i]
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return ""
    # whole floats read back as ints ("12.0" -> "12"), but not past 2**53, where int(1e30)
    # would show digits the file never had
    if isinstance(value, float) and value.is_integer() and abs(value) <= _MAX_COUNT:
        return str(int(value))
    return str(value)


class _Problems:
    """Collects the first problem of each check and raises the earliest (by row)."""

    def __init__(self, path: Path, line_of: Callable[[int], int]) -> None:
        self.path, self.line_of = path, line_of
        self.found: list[tuple[int, int, str, str, str, str]] = []

    def check(
        self, bad: np.ndarray, series: pd.Series, field: str, expected: str, note: str = ""
    ) -> None:
        rows = np.flatnonzero(bad)
        if rows.size:
            i = int(rows[0])
            self.found.append((i, len(self.found), field, _raw(series, i), expected, note))

    def raise_first(self) -> None:
        if self.found:
            i, _, field, value, expected, note = min(self.found)
            raise TraceFormatError(self.path, self.line_of(i), field, value, expected, note)


def _numbers(series: pd.Series) -> np.ndarray:
    """Column as float64; NaN where empty or not a number."""
    if pd.api.types.is_numeric_dtype(series.dtype) and not pd.api.types.is_bool_dtype(series):
        return series.to_numpy(dtype=np.float64, na_value=np.nan)
    return pd.to_numeric(series, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)


def _check_int(
    problems: _Problems, series: pd.Series, field: str, minimum: int
) -> np.ndarray:
    values = _numbers(series)
    problems.check(np.isnan(values), series, field, f"an integer >= {minimum}")
    with np.errstate(invalid="ignore"):
        bad = ~np.isnan(values) & ((values != np.floor(values)) | (values < minimum))
    problems.check(bad, series, field, f"an integer >= {minimum}")
    # inf passes the whole-number test above (inf == floor(inf)); this catches it too
    problems.check(values > _MAX_COUNT, series, field,
                   f"an integer >= {minimum} and at most 2**53 = {_MAX_COUNT}")
    return values


def _check_sorted(path: Path, keys: np.ndarray, series: pd.Series, field: str,
                  line_of: Callable[[int], int]) -> None:
    back = np.flatnonzero(keys[1:] < keys[:-1])
    if back.size:
        i = int(back[0]) + 1
        raise TraceFormatError(
            path, line_of(i), field, _raw(series, i),
            f"a time >= {_raw(series, i - 1)!r} on line {line_of(i - 1)} "
            "(rows must be sorted by arrival time)",
        )


def _check_span(problems: _Problems, stamps: np.ndarray, series: pd.Series, field: str) -> None:
    """Finite times can be too far apart for float64 (-1e308, 1e308): rebasing gives inf."""
    with np.errstate(over="ignore", invalid="ignore"):
        span = stamps - stamps[0]
    problems.check(np.isfinite(stamps) & ~np.isfinite(span), series, field,
                   "a time whose distance from the first row's is finite in float64")


def _csv_line(i: int) -> int:
    return i + 2


def _suffix_name(path: Path, dropped: int, what: str) -> str:
    return f"{path} (dropped {dropped} {what})" if dropped else str(path)


# --------------------------------------------------------------------------- timestamps


def _parse_timestamps(column: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """UTC nanoseconds (int64) and a validity mask; naive times are taken as UTC.

    pandas' ISO-8601 reader handles both Azure spellings (7 fractional digits; mixed precision
    with "+00:00") per row in C. NOTE: numpy's own string-to-datetime64 cast would be faster
    but numpy 2.4 segfaults when it meets a bad or zone-aware value in a large array.
    """
    stamps = pd.DatetimeIndex(pd.to_datetime(column, format="ISO8601", utc=True, errors="coerce"))
    # pandas 3 may infer seconds or microseconds, which reach years that int64 nanoseconds
    # cannot hold; as_unit("ns") would then raise for the whole column, naming no row
    lo, hi = (pd.Timestamp(t).tz_localize("UTC") for t in (pd.Timestamp.min, pd.Timestamp.max))
    ok = np.asarray(stamps.notna() & (stamps >= lo) & (stamps <= hi))
    nanos = stamps.where(ok).as_unit("ns").asi8.copy()
    nanos[~ok] = 0
    return nanos, ok


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
