"""The columnar, immutable request trace every workload becomes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


def _frozen(values: Any, dtype: type, name: str) -> np.ndarray:
    arr = np.array(values, dtype=dtype, copy=True).reshape(-1)
    arr.flags.writeable = False
    return arr


# Integer columns: dtype and smallest allowed value (None: anything the dtype holds; ids may be
# any value, but they must never wrap, e.g. tenant 2**40 silently becoming 0 in int32).
_INT_COLUMNS: dict[str, tuple[type[np.signedinteger[Any]], int | None]] = {
    "prompt_tokens": (np.int64, 1),
    "output_tokens": (np.int64, 1),
    "tenant": (np.int32, None),
    "slo_class": (np.int16, None),
}


def _check_columns(arrival: np.ndarray, cols: dict[str, np.ndarray]) -> None:
    """Every column as long as arrival_s; finite sorted arrivals."""
    n = arrival.size
    for col, values in cols.items():
        if values.size != n:
            raise ValueError(f"Trace.from_arrays: {col} has {values.size} entries, arrival_s {n}")
    bad = np.flatnonzero(~np.isfinite(arrival))
    if bad.size:
        raise ValueError(
            f"Trace.from_arrays: arrival_s[{bad[0]}] is {arrival[bad[0]]}; expected finite")
    with np.errstate(over="ignore"):  # a difference past float64 range is +inf, not "< 0"
        back = np.flatnonzero(np.diff(arrival) < 0)
    if back.size:
        i = back[0] + 1
        raise ValueError(
            f"Trace.from_arrays: arrival_s[{i}]={arrival[i]} is before arrival_s[{i - 1}]="
            f"{arrival[i - 1]}; expected non-decreasing arrival times")


def _show(value: Any) -> str:
    return repr(value.item() if isinstance(value, np.generic) else value)


def _int_column(values: np.ndarray, col: str) -> np.ndarray:
    """``values`` as the column's integer dtype, or a ValueError naming the first bad entry.

    Checked before converting: a cast would turn 1e30 or 2**63 into -2**63 and wrap 2**40 into
    an int32 0, so a range check on the converted column could not see them.
    """
    dtype, minimum = _INT_COLUMNS[col]
    info = np.iinfo(dtype)
    lo = info.min if minimum is None else minimum
    hi = int(info.max)
    if minimum is None:
        expected = f"an integer from {lo} to {hi} ({info.dtype})"
    else:
        expected = f"an integer >= {minimum} (at most {hi}, {info.dtype})"
    kind = values.dtype.kind
    if kind in "iu":  # exact comparisons (numpy compares with out-of-range Python ints exactly)
        bad = np.flatnonzero((values < lo) | (values > hi))
    elif kind == "f":
        as_float = values.astype(np.float64)
        with np.errstate(invalid="ignore"):
            # hi + 1 is a power of two, so exact as a float; a float equal to hi rounds up to it
            bad = np.flatnonzero(
                ~np.isfinite(as_float) | (as_float != np.floor(as_float))
                | (as_float < lo) | (as_float >= float(hi + 1)))
    elif kind == "O":  # e.g. Python ints too large for int64 mixed with others
        bad = np.flatnonzero([not _int_in_range(v, lo, hi) for v in values])
        if not bad.size:
            values = np.array([int(v) for v in values], dtype=np.int64)
    else:  # bool, str, complex, datetime: not integer counts or ids, even if castable
        bad = np.arange(min(values.size, 1))
    if bad.size:
        i = int(bad[0])
        shown = _show(values[i])
        raise ValueError(f"Trace.from_arrays: {col}[{i}] is {shown}; expected {expected}")
    return values.astype(dtype)


def _int_in_range(value: Any, lo: int, hi: int) -> bool:
    if isinstance(value, bool | np.bool_):
        return False
    if isinstance(value, int | np.integer):
        return lo <= int(value) <= hi
    if isinstance(value, float | np.floating):
        return bool(np.isfinite(value)) and value == np.floor(value) and lo <= value < hi + 1
    return False


def _frozen_extra(key: str, values: Any, n: int) -> np.ndarray:
    """A read-only copy of per-request side data (object arrays stay object arrays)."""
    arr = np.asarray(values, dtype=object if np.asarray(values).dtype == object else None)
    if len(arr) != n:
        raise ValueError(f"Trace.from_arrays: extra[{key!r}] has {len(arr)} entries, expected {n}")
    arr = arr.copy()
    arr.flags.writeable = False
    return arr


@dataclass(frozen=True, eq=False)
class Trace:
    """A request trace as columns: one entry per request, sorted by arrival time.

    Attributes:
        arrival_s: arrival time in seconds from the trace start (first request at 0), float64.
        prompt_tokens: prompt (context) length in tokens, int64, >= 1.
        output_tokens: true output length in tokens, int64, >= 1. Never shown to policies
            except through the engine's explicitly privileged oracle view.
        tenant: tenant (client) id, int32, default 0.
        slo_class: SLO class id, int16, default 0.
        name: where the trace came from (a file path, a catalogue name or a generator).
        extra: optional per-request side data that travels with slicing (e.g. Mooncake
            ``hash_ids`` as an object array).
    """

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    tenant: np.ndarray
    slo_class: np.ndarray
    name: str = "trace"
    extra: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def from_arrays(
        cls,
        arrival_s: Any,
        prompt_tokens: Any,
        output_tokens: Any,
        tenant: Any | None = None,
        slo_class: Any | None = None,
        name: str = "trace",
        extra: dict[str, Any] | None = None,
        rebase: bool = True,
    ) -> Trace:
        """Build a trace from array-likes, validating every entry.

        Arrival times must be finite and non-decreasing; they are shifted so the first arrival
        is at 0 unless ``rebase=False``. Token counts must be integers >= 1 that fit in int64,
        tenant and SLO class integers that fit in int32 and int16 (never wrapped).
        """
        arrival = np.asarray(arrival_s, dtype=np.float64).reshape(-1)
        n = arrival.size
        cols = {"prompt_tokens": prompt_tokens, "output_tokens": output_tokens,
                "tenant": np.zeros(n, np.int32) if tenant is None else tenant,
                "slo_class": np.zeros(n, np.int16) if slo_class is None else slo_class}
        cols = {k: np.asarray(v).reshape(-1) for k, v in cols.items()}
        _check_columns(arrival, cols)
        cols = {k: _int_column(v, k) for k, v in cols.items()}
        if rebase and n:
            first, last = arrival[0], arrival[-1]
            with np.errstate(over="ignore"):  # reported just below
                arrival = arrival - first
            # finite times can be more than float64's range apart (-1e308 and 1e308)
            if not np.isfinite(arrival[-1]):
                raise ValueError(
                    f"Trace.from_arrays: arrival_s[{n - 1}]={last} is too far after "
                    f"arrival_s[0]={first}; expected a span that is finite in float64")
        return cls(
            arrival_s=_frozen(arrival, np.float64, "arrival_s"),
            prompt_tokens=_frozen(cols["prompt_tokens"], np.int64, "prompt_tokens"),
            output_tokens=_frozen(cols["output_tokens"], np.int64, "output_tokens"),
            tenant=_frozen(cols["tenant"], np.int32, "tenant"),
            slo_class=_frozen(cols["slo_class"], np.int16, "slo_class"),
            name=name,
            extra={key: _frozen_extra(key, values, n) for key, values in (extra or {}).items()},
        )

    def __len__(self) -> int:
        return int(self.arrival_s.size)

    def __getitem__(self, index: slice) -> Trace:
        """A window of requests by position, e.g. ``trace[1000:3000]`` (arrivals rebased to 0)."""
        if not isinstance(index, slice):
            raise TypeError(
                "Trace supports slicing by request window (trace[a:b]); use window() or between()"
            )
        return self._take(index)

    def window(self, start: int, count: int) -> Trace:
        """``count`` consecutive requests starting at request ``start`` (rebased to t=0)."""
        if start < 0 or count < 1 or start + count > len(self):
            raise ValueError(
                f"Trace.window: start={start}, count={count} outside a trace of "
                f"{len(self)} requests"
            )
        return self._take(slice(start, start + count))

    def between(self, t0: float, t1: float) -> Trace:
        """Requests arriving in [t0, t1) seconds (rebased so the first one arrives at 0)."""
        lo, hi = np.searchsorted(self.arrival_s, [t0, t1], side="left")
        return self._take(slice(int(lo), int(hi)))

    def with_arrivals(self, arrival_s: np.ndarray, name: str | None = None) -> Trace:
        """The same requests with new arrival times (used by load scaling)."""
        return Trace.from_arrays(
            arrival_s,
            self.prompt_tokens,
            self.output_tokens,
            self.tenant,
            self.slo_class,
            name=name or self.name,
            extra=self.extra,
            rebase=False,
        )

    def _take(self, index: slice) -> Trace:
        arrival = self.arrival_s[index]
        return Trace.from_arrays(
            arrival,
            self.prompt_tokens[index],
            self.output_tokens[index],
            self.tenant[index],
            self.slo_class[index],
            name=self.name,
            extra={k: v[index] for k, v in self.extra.items()},
        )

    @property
    def priority(self) -> np.ndarray:
        """Each request's priority, lower first (vLLM's ``Request.priority``): the
        ``priority`` column (``extra``) where the trace has one, else its SLO class."""
        if "priority" in self.extra:
            return np.asarray(self.extra["priority"], np.int64)
        return self.slo_class.astype(np.int64)

    @property
    def duration_s(self) -> float:
        """Time from the first to the last arrival."""
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) else 0.0

    @property
    def rate(self) -> float:
        """Mean arrival rate in requests per second."""
        return (len(self) - 1) / self.duration_s if self.duration_s > 0 else float("inf")

    def __repr__(self) -> str:
        if not len(self):
            return f"Trace(name={self.name!r}, 0 requests)"
        return (
            f"Trace(name={self.name!r}, {len(self)} requests over {self.duration_s:.1f} s, "
            f"mean prompt {self.prompt_tokens.mean():.0f}, "
            f"mean output {self.output_tokens.mean():.0f})"
        )
