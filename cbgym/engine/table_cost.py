"""Iteration-cost model fitted to a user's own profiling table.

CSV schema (header row required, one row per profiled iteration, extra columns ignored):

=================  ========  ===========================================================
column             required  meaning
=================  ========  ===========================================================
``prefill_tokens``  yes      prompt (prefill / chunked-prefill) tokens computed
``decode_seqs``     yes      requests computing one decode token
``kv_tokens``       yes      sum over requests of context + new tokens (KV read)
``time_s``          yes      measured iteration time, seconds (> 0)
``attn_q_sq``       no       sum_i q_i (q_i + 1) / 2; used by ``quadratic=True``. When absent,
                             each row is taken to hold one prefill chunk, i.e.
                             ``prefill_tokens * (prefill_tokens + 1) / 2``
=================  ========  ===========================================================

The fit is least squares, by default constrained to non-negative coefficients so the model
never gets cheaper with more work::

    time_s = intercept + prefill_token * prefill_tokens + decode_seq * decode_seqs
             + kv_token * kv_tokens [+ attn_q_sq_coef * attn_q_sq]

Only numpy is needed: with at most five coefficients the non-negative solution is found
exactly by solving the unconstrained problem on every subset of coefficients and keeping the
best feasible one.
"""

from __future__ import annotations

import csv
import itertools
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from cbgym.engine.cost_model import BatchStats, Number, check_coefficient

if TYPE_CHECKING:
    import pandas as pd

REQUIRED_COLUMNS = ("prefill_tokens", "decode_seqs", "kv_tokens", "time_s")
_FEATURES = ("prefill_tokens", "decode_seqs", "kv_tokens", "attn_q_sq")
_COLUMNS = _FEATURES + ("time_s",)


@dataclass(frozen=True, slots=True)
class TableCostModel:
    """Linear-in-work iteration cost with coefficients fitted to profiling data.

    Build it with :meth:`from_csv` or :meth:`from_dataframe`, or give coefficients directly.

    Args:
        intercept_s: Fixed seconds per iteration.
        prefill_token_s: Seconds per prefill token.
        decode_seq_s: Seconds per decoding request.
        kv_token_s: Seconds per KV token read by attention.
        attn_q_sq_s: Seconds per unit of ``attn_q_sq`` (0 unless fitted with ``quadratic``).
        host_link_bytes_per_s: Host link bandwidth pricing swap traffic, bytes/s.
        rmse_s: Root-mean-square residual of the fit, seconds (informational).
        source: Where the coefficients came from (informational).
    """

    intercept_s: float
    prefill_token_s: float
    decode_seq_s: float
    kv_token_s: float
    attn_q_sq_s: float = 0.0
    host_link_bytes_per_s: float = 25e9
    rmse_s: float = 0.0
    source: str = ""

    def __post_init__(self) -> None:
        for name in (
            "intercept_s",
            "prefill_token_s",
            "decode_seq_s",
            "kv_token_s",
            "attn_q_sq_s",
        ):
            # finite but of either sign: from_csv(nonnegative=False) may fit a negative term
            check_coefficient("TableCostModel", name, getattr(self, name), "")
        check_coefficient("TableCostModel", "rmse_s", self.rmse_s)
        check_coefficient("TableCostModel", "host_link_bytes_per_s", self.host_link_bytes_per_s,
                          "> 0")

    def kernel_params(self) -> tuple[int, np.ndarray]:
        """(kind, coefficients) the engine's kernel prices with (cbgym.engine.pricing)."""
        from cbgym.engine.pricing import TABLE

        return TABLE, np.array([self.intercept_s, self.prefill_token_s, self.decode_seq_s,
                                self.kv_token_s, self.attn_q_sq_s, self.host_link_bytes_per_s],
                               dtype=np.float64)

    def iteration_time(self, stats: BatchStats) -> Number:
        """Seconds for one iteration (an array when the stats hold arrays)."""
        from cbgym.engine.pricing import iteration_time

        return iteration_time(*self.kernel_params(), stats)

    @classmethod
    def from_csv(
        cls,
        path: str | os.PathLike[str],
        *,
        quadratic: bool = False,
        nonnegative: bool = True,
        host_link_bytes_per_s: float = 25e9,
    ) -> TableCostModel:
        """Fit to a profiling CSV (schema in the module docstring).

        Args:
            path: CSV file.
            quadratic: Also fit a term in ``attn_q_sq`` (causal attention among new tokens).
            nonnegative: Constrain every coefficient to be >= 0.
            host_link_bytes_per_s: Host link bandwidth for swap traffic, bytes/s.

        Raises:
            ValueError: Naming file, line and column of the first bad value, a missing column,
                or too few rows for the coefficients.
        """
        name = os.fspath(path)
        with open(name, newline="") as f:
            reader = csv.DictReader(f)
            header = [h.strip() for h in (reader.fieldnames or [])]
            _check_header(header, name)
            reader.fieldnames = header
            columns: dict[str, list[float]] = {c: [] for c in header if c in _COLUMNS}
            for row in reader:
                where = f"{name}:{reader.line_num}"
                for col, values in columns.items():
                    values.append(_parse_value(row.get(col), col, where))
        arrays = {c: np.asarray(v, dtype=float) for c, v in columns.items()}
        return cls._fit(arrays, name, quadratic, nonnegative, host_link_bytes_per_s)

    @classmethod
    def from_dataframe(
        cls,
        df: pd.DataFrame,
        *,
        quadratic: bool = False,
        nonnegative: bool = True,
        host_link_bytes_per_s: float = 25e9,
        source: str = "<dataframe>",
    ) -> TableCostModel:
        """Fit to a DataFrame with the CSV's columns (see :meth:`from_csv`).

        Raises:
            ValueError: Naming the row label and column of the first bad value, a missing
                column, or too few rows.
        """
        header = [str(c).strip() for c in df.columns]
        _check_header(header, source)
        arrays: dict[str, np.ndarray] = {}
        for col, name in zip(df.columns, header, strict=True):
            if name not in _COLUMNS:
                continue
            values = [
                _parse_value(v, name, f"{source} row {label!r}") for label, v in df[col].items()
            ]
            arrays[name] = np.asarray(values, dtype=float)
        return cls._fit(arrays, source, quadratic, nonnegative, host_link_bytes_per_s)

    @classmethod
    def _fit(
        cls,
        columns: dict[str, np.ndarray],
        source: str,
        quadratic: bool,
        nonnegative: bool,
        host_link_bytes_per_s: float,
    ) -> TableCostModel:
        y = columns["time_s"]
        if quadratic and "attn_q_sq" not in columns:
            p = columns["prefill_tokens"]
            columns["attn_q_sq"] = p * (p + 1) / 2  # one prefill chunk per row
        names = _FEATURES if quadratic else _FEATURES[:3]
        x = np.column_stack([np.ones_like(y)] + [columns[n] for n in names])
        if len(y) < x.shape[1]:
            raise ValueError(
                f"{source}: {len(y)} data row(s) cannot fit {x.shape[1]} coefficients; "
                f"profile at least {x.shape[1]} iterations"
            )
        coef = _nnls(x, y) if nonnegative else np.linalg.lstsq(x, y, rcond=None)[0]
        rmse = float(np.sqrt(np.mean((x @ coef - y) ** 2)))
        padded = list(coef) + [0.0] * (5 - len(coef))
        return cls(*(float(c) for c in padded), host_link_bytes_per_s, rmse, source)


def _check_header(header: list[str], source: str) -> None:
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise ValueError(
            f"{source}: missing required column(s) {', '.join(repr(c) for c in missing)}; "
            f"found {header}; required: {list(REQUIRED_COLUMNS)}"
        )


def _parse_value(raw: object, column: str, where: str) -> float:
    """One cell as a finite, non-negative float (time must be > 0), else a located error."""
    text = "" if raw is None else str(raw).strip()
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{where}: column {column!r}: {text!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{where}: column {column!r}: {text!r} is not finite")
    if value < 0 or (column == "time_s" and value == 0):
        bound = "> 0" if column == "time_s" else ">= 0"
        raise ValueError(f"{where}: column {column!r}: {value} must be {bound}")
    return value


def _nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Exact non-negative least squares for a handful of columns (search over supports)."""
    n = x.shape[1]
    best, best_err = np.zeros(n), float(np.sum(y**2))
    for size in range(1, n + 1):
        for support in itertools.combinations(range(n), size):
            sub = np.linalg.lstsq(x[:, support], y, rcond=None)[0]
            if np.any(sub < 0):
                continue
            err = float(np.sum((x[:, support] @ sub - y) ** 2))
            if err < best_err:
                best = np.zeros(n)
                best[list(support)] = sub
                best_err = err
    return best
