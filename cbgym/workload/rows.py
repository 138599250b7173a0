"""Reading trace files row by row: the checks every loader in :mod:`cbgym.workload.loaders`
shares (text encoding, CSV columns, integer counts, sorted times, timestamps) and the errors
they raise.

Parsing is vectorised; only when a check fails is the first offending row looked up, so an
error names the file, the line (1-based; a CSV header is line 1), the field, the bad value and
what was expected. The underscored helpers are the loaders' (internal to ``cbgym.workload``).
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from itertools import islice
from pathlib import Path
from typing import IO

import numpy as np
import pandas as pd

__all__ = ["DroppedRowsWarning", "TraceFormatError"]


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
