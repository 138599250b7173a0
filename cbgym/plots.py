"""PNG plots of a bench sweep (matplotlib, Agg backend, no pyplot global state).

Each figure has one panel per (trace, engine) and one line per policy:

* ``mean_latency_vs_load.png`` / ``p99_latency_vs_load.png``: mean / p99 normalised latency
  (ms per output token, after warm-up, averaged over windows) against offered load rho;
* ``goodput_vs_load.png``: goodput (requests/s meeting both SLOs) against rho, with the
  offered rate rho x mu dashed for reference;
* ``latency_cdf.png``: the CDF of normalised latency at one load, quantile-averaged over
  windows and seeds (each run's quantile function, averaged level by level).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: worker machines and CI have no display

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

DPI = 90
PANEL = (5.0, 3.4)


def _panels(frame: pd.DataFrame) -> list[tuple[str, str]]:
    return list(dict.fromkeys(zip(frame["trace"], frame["engine"], strict=True)))


def _figure(n: int) -> tuple[Figure, list[Axes]]:
    cols = min(n, 2)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(PANEL[0] * cols, PANEL[1] * rows), dpi=DPI, layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel().tolist()
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def _log_if_wide(ax: Axes, values: np.ndarray) -> None:
    vals = values[np.isfinite(values) & (values > 0)]
    if vals.size and vals.max() / vals.min() > 20:
        ax.set_yscale("log")


AXIS_LABELS = {"rho": "offered load rho", "request_rate": "request rate (req/s)"}
AXIS_SHORT = {"rho": "rho", "request_rate": "req/s"}


def _lines_vs_load(ax: Axes, part: pd.DataFrame, column: str, ylabel: str, title: str,
                   axis: str = "rho") -> None:
    """One line per policy of ``part[column]`` against load (or rate), on one panel."""
    for policy, rows in part.groupby("policy", sort=False):
        rows = rows.sort_values("load")
        ax.plot(rows["load"], rows[column], marker="o", ms=3, lw=1.2, label=str(policy))
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(AXIS_LABELS[axis])
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)


def _plot_panels(frame: pd.DataFrame, path: str | Path,
                 draw: Callable[[Axes, pd.DataFrame, str], None]) -> Path:
    """A figure with one panel per (trace, engine) of ``frame``, each drawn by ``draw``."""
    panels = _panels(frame)
    fig, axes = _figure(len(panels))
    for ax, (trace, engine) in zip(axes, panels, strict=True):
        part = frame[(frame["trace"] == trace) & (frame["engine"] == engine)]
        draw(ax, part, f"{trace} | {engine}")
    axes[0].legend(fontsize=7)
    fig.savefig(path)
    return Path(path)


def plot_vs_load(table: pd.DataFrame, path: str | Path, column: str, ylabel: str,
                 axis: str = "rho") -> Path:
    """One line per policy of ``table[column]`` against load, a panel per trace and engine
    (``axis``: what ``load`` holds, ``"rho"`` or ``"request_rate"``)."""

    def draw(ax: Axes, part: pd.DataFrame, title: str) -> None:
        _lines_vs_load(ax, part, column, ylabel, title, axis)
        _log_if_wide(ax, part[column].to_numpy(dtype=float))

    return _plot_panels(table, path, draw)


def plot_goodput(table: pd.DataFrame, path: str | Path, axis: str = "rho") -> Path:
    """Goodput against offered load (or rate), with the offered rate dashed."""

    def draw(ax: Axes, part: pd.DataFrame, title: str) -> None:
        offered = part.groupby("load")["offered_rps"].mean()
        ax.plot(offered.index, offered.to_numpy(), "k--", lw=1, label="offered")
        _lines_vs_load(ax, part, "goodput_rps", "goodput (req/s within SLO)", title, axis)

    return _plot_panels(table, path, draw)


def plot_cdf(cdf: pd.DataFrame, path: str | Path, axis: str = "rho") -> Path:
    """CDF of normalised latency at the one load in ``cdf``, quantile-averaged over windows."""

    def draw(ax: Axes, part: pd.DataFrame, title: str) -> None:
        for policy, rows in part.groupby("policy", sort=False):
            curve = rows.groupby("quantile")["norm_latency_ms"].mean()
            ax.plot(curve.to_numpy(), curve.index, lw=1.2, label=str(policy))
        ax.set_xscale("log")
        ax.set_title(f"{title} | {AXIS_SHORT[axis]}={part['load'].iloc[0]:g}", fontsize=9)
        ax.set_xlabel("normalised latency (ms / output token)")
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)

    return _plot_panels(cdf, path, draw)


def write_plots(table: pd.DataFrame, cdf: pd.DataFrame, out_dir: str | Path,
                axis: str = "rho") -> list[Path]:
    """All bench plots into ``out_dir``; returns the files written."""
    out = Path(out_dir)
    paths = [
        plot_vs_load(table, out / "mean_latency_vs_load.png", "mean_norm_latency_ms",
                     "mean normalised latency (ms/tok)", axis),
        plot_vs_load(table, out / "p99_latency_vs_load.png", "p99_norm_latency_ms",
                     "p99 normalised latency (ms/tok)", axis),
        plot_goodput(table, out / "goodput_vs_load.png", axis),
    ]
    if len(cdf):
        paths.append(plot_cdf(cdf, out / "latency_cdf.png", axis))
    return paths


__all__ = ["plot_cdf", "plot_goodput", "plot_vs_load", "write_plots"]
