"""A finished ``cbgym bench`` sweep: its tables, the folder it is written to and read back
from (``results.csv``, ``summary.csv``, ``headline.csv``, ``accountings.csv``, ``cdf.csv``,
``config.json``, the plots), and its text table."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

TEXT_COLUMNS = {"trace": str, "engine": str, "policy": str, "loads": str}
NEEDED = {"results": ("trace", "engine", "policy", "load", "window", "seed"),
          "table": ("trace", "engine", "policy", "load")}
TABLES = {"results": "results.csv", "table": "summary.csv", "headline": "headline.csv",
          "accountings": "accountings.csv", "cdf": "cdf.csv"}


@dataclass
class BenchResult:
    """A finished sweep.

    Attributes:
        results: one row per cell (``results.csv``).
        table: the study's table, aggregated over windows and seeds (``summary.csv``).
        headline: oracle gain recovered averaged over the study's headline loads.
        accountings: the two accountings of the prefill share per trace, engine and load.
        cdf: normalised-latency quantiles per run at the CDF load (long format).
        config: the full configuration, versions and measured capacities.
        elapsed_s: wall-clock seconds of the sweep.
    """

    results: pd.DataFrame
    table: pd.DataFrame
    headline: pd.DataFrame
    accountings: pd.DataFrame
    cdf: pd.DataFrame
    config: dict[str, Any]
    elapsed_s: float
    notes: list[str] = field(default_factory=list)


def write_outputs(result: BenchResult, out_dir: str | Path, plots: bool = True) -> list[Path]:
    """Write the CSVs, ``config.json`` and (optionally) the PNG plots into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for key, name in TABLES.items():
        getattr(result, key).to_csv(out / name, index=False)
        written.append(out / name)
    (out / "config.json").write_text(json.dumps(result.config, indent=2, default=str) + "\n")
    written.append(out / "config.json")
    if plots:
        from cbgym.plots import write_plots

        written += write_plots(result.table, result.cdf, out,
                               axis=result.config["bench"].get("axis", "rho"))
    return written


TABLE_COLUMNS = {
    "policy": "policy", "load": "rho", "mean_norm_latency_ms": "mean ms/tok",
    "p99_norm_latency_ms": "p99 ms/tok", "oracle_gain_recovered_pct": "gain %",
    "p99_ratio": "p99/FCFS", "starvation_count": "starved",
    "starved_beyond_fcfs_max": "> FCFS max", "goodput_rps": "goodput/s",
    "slo_attainment": "SLO ok",
    # latency columns cover finished requests only: a policy that drops requests must be
    # compared on goodput, so show how many it dropped
    "num_shed": "shed",
}


def format_table(result: BenchResult) -> str:
    """A compact text table per trace and engine (pandas ``to_string``)."""
    blocks = []
    axis = result.config["bench"].get("axis", "rho")
    for (trace, engine), part in result.table.groupby(["trace", "engine"], sort=False):
        acc = result.accountings
        acc = acc[(acc["trace"] == trace) & (acc["engine"] == engine)]
        runs = result.results[(result.results["trace"] == trace)
                              & (result.results["engine"] == engine)]
        head = (f"== {trace} | {engine} | {runs['window'].nunique()} window(s) x "
                f"{int(runs['window_requests'].iloc[0])} requests | mu "
                f"{runs['capacity_rps'].mean():.3g} req/s | prefill share: marginal work "
                f"{acc['marginal_work_share_pct'].iloc[0]:.1f}%")
        names = {**TABLE_COLUMNS, "load": "req/s" if axis == "request_rate" else "rho"}
        shown = part[[c for c in TABLE_COLUMNS if c in part]].rename(columns=names)
        blocks.append(head + "\n" + shown.to_string(index=False, float_format=_fmt))
    return "\n\n".join(blocks)


def _fmt(value: float) -> str:
    if not np.isfinite(value):
        return "-"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"


def read_outputs(out_dir: str | Path) -> BenchResult:
    """The sweep :func:`write_outputs` wrote into ``out_dir``, for new tables and plots
    (``format_table(read_outputs(d))``, ``write_outputs(read_outputs(d), d2)``).

    Raises:
        ValueError: the folder lacks one of the files, or one does not parse (named).
    """
    folder = Path(out_dir)
    if not folder.is_dir():
        raise ValueError(f"{folder}: not a folder (expected a cbgym bench --out folder)")
    frames: dict[str, pd.DataFrame] = {}
    for key, name in TABLES.items():
        path = folder / name
        if not path.is_file():
            raise ValueError(f"{path}: missing (a cbgym bench --out folder has "
                             f"{', '.join(TABLES.values())} and config.json)")
        try:  # (names stay text: a policy or trace named "1" is not a number)
            frames[key] = pd.read_csv(path, dtype=TEXT_COLUMNS)
        except pd.errors.EmptyDataError:
            raise ValueError(f"{path}: empty (expected a table with a header row)") from None
        except (pd.errors.ParserError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path}: not a CSV table ({str(exc).splitlines()[0]})") from None
        missing = [c for c in NEEDED.get(key, ()) if c not in frames[key]]
        if missing:
            raise ValueError(f"{path}: no column {', '.join(map(repr, missing))} (not a cbgym "
                             "bench table)")
    path = folder / "config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: missing") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    if not isinstance(config, dict) or not isinstance(config.get("bench"), dict):
        raise ValueError(f"{path}: no 'bench' settings (not a cbgym bench config.json)")
    if config["bench"].get("axis", "rho") not in ("rho", "request_rate"):
        raise ValueError(f"{path}: bench.axis={config['bench']['axis']!r}, expected 'rho' or "
                         "'request_rate'")
    return BenchResult(config=config, elapsed_s=float(config.get("elapsed_s", float("nan"))),
                       **frames)


__all__ = ["TABLES", "BenchResult", "format_table", "read_outputs", "write_outputs"]
