"""Reproduce the CB-SJF-Work study with ``cbgym bench`` and print the tables for docs/results.md.

Usage (the two 2023 Azure traces must be in ``$CBGYM_TRACE_DIR``)::

    CBGYM_TRACE_DIR=/path/to/traces python benchmarks/bench_repro.py --out results/repro
    python benchmarks/bench_repro.py --out results/repro --tables-only   # re-print the tables

Each sweep is one ``cbgym bench`` command (printed before it runs, and timed). Per engine and
trace there are two sweeps:

* ``main``: the study's seven policies at its five loads;
* ``fairness``: the noisy-oracle accuracy sweep and CB-SJF-Work with aging, at the two highest
  loads, with FCFS and Oracle-Work again (the starvation threshold and the gain need them).

Windows: the 2023 traces are too short for the study's 20,000-request windows, so conv
(19,366 requests) gets 5 disjoint windows of 3,800 and code (8,819) 3 disjoint windows of 2,900.
"""

from __future__ import annotations

import argparse
import json
import shlex
import time
from pathlib import Path

import pandas as pd

from cbgym.cli import main as cbgym_main

ENGINES = {"paper": "cbsjf-paper", "vllm": "llama-2-13b/a100-80gb"}
TRACES = {"conv": ("azure-conv-2023", 5, 3800), "code": ("azure-code-2023", 3, 2900)}
MAIN_POLICIES = "fcfs,sjf-ctx,cb-sjf-work,oracle-work,oracle-sjf,ljf-work,random"
NOISY = [1.0, 0.8, 0.5, 0.0]
AGING = [0.005, 0.02]
FAIR_POLICIES = ",".join(["fcfs", "oracle-work", "cb-sjf-work",
                          *(f"noisy-oracle:{a:g}" for a in NOISY),
                          *(f"cb-sjf-work-aging:{w:g}" for w in AGING)])
SWEEPS = {"main": (MAIN_POLICIES, "0.6,0.75,0.85,0.92,0.98"),
          "fairness": (FAIR_POLICIES, "0.92,0.98")}
# The study's published figures (2024 week-long traces), for the side-by-side table.
PAPER = {
    "conv": {"fcfs": 1161, "cb-sjf-work": 506, "oracle-work": 436, "oracle-sjf": 287,
             "gain": 90.3, "p99_ratio_098": 1.9, "marginal": 91.2, "time_060": 53.9,
             "time_092": 75.6},
    "code": {"fcfs": 16724, "cb-sjf-work": 6327, "oracle-work": 3676, "oracle-sjf": 2289,
             "gain": 79.3, "p99_ratio_098": 3.1, "marginal": 98.7, "time_060": 81.8,
             "time_092": 92.4},
}


def commands(out: Path, quick: bool = False) -> list[tuple[str, list[str]]]:
    """(output folder, cbgym argv) of every sweep (``quick``: one small window, a smoke test)."""
    runs = []
    for eng_key, engine in ENGINES.items():
        for tr_key, (trace, windows, size) in TRACES.items():
            if quick:
                windows, size = 1, 600
            for sweep, (policies, loads) in SWEEPS.items():
                folder = out / eng_key / tr_key / sweep
                runs.append((str(folder), [
                    "bench", "--trace", trace, "--engine", engine, "--policies", policies,
                    "--loads", loads, "--windows", str(windows), "--window-requests", str(size),
                    "--out", str(folder), "--quiet",
                ]))
    return runs


def run_all(out: Path, quick: bool = False) -> dict[str, float]:
    """Run every sweep, returning wall seconds per output folder."""
    timings: dict[str, float] = {}
    for folder, argv in commands(out, quick):
        print("$ cbgym " + " ".join(shlex.quote(a) for a in argv), flush=True)
        started = time.perf_counter()
        cbgym_main(argv)
        timings[folder] = time.perf_counter() - started
        print(f"# {timings[folder]:.1f} s\n", flush=True)
    (out / "timings.json").write_text(json.dumps(timings, indent=2) + "\n")
    return timings


# ---------------------------------------------------------------- markdown tables


def md(frame: pd.DataFrame, digits: int = 1) -> str:
    """A GitHub markdown table (no tabulate dependency)."""
    def cell(column: str, v: object) -> str:
        if not isinstance(v, float):
            return str(v)
        if v != v:
            return "-"
        if column == "rho":
            return f"{v:g}"
        places = 2 if "/FCFS" in column else digits
        return f"{v:,.{places}f}"

    head = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "|" + "|".join("---:" if frame[c].dtype.kind in "fi" else "---"
                          for c in frame.columns) + "|"
    body = ["| " + " | ".join(cell(str(c), v) for c, v in zip(frame.columns, row, strict=True))
            + " |" for row in frame.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def load_sweep(out: Path, eng: str, tr: str, sweep: str) -> dict[str, pd.DataFrame]:
    folder = out / eng / tr / sweep
    return {name: pd.read_csv(folder / f"{name}.csv")
            for name in ("summary", "headline", "accountings", "results")}


def pivot(table: pd.DataFrame, column: str, policies: list[str] | None = None) -> pd.DataFrame:
    wide = table.pivot(index="policy", columns="load", values=column)
    order = policies or list(dict.fromkeys(table["policy"]))
    wide = wide.reindex([p for p in order if p in wide.index])
    wide.columns = [f"rho={c:g}" for c in wide.columns]
    return wide.reset_index()


def tables(out: Path) -> str:
    """All the reproduction's markdown tables."""
    parts = []
    for eng_key, engine in ENGINES.items():
        parts.append(f"## Engine `{engine}`\n")
        for tr_key, (trace, windows, size) in TRACES.items():
            parts.append(_trace_tables(out, eng_key, tr_key, trace, windows, size))
        parts.append(_paper_side_by_side(out, eng_key))
    return "\n".join(parts)


def _trace_tables(out: Path, eng: str, tr: str, trace: str, windows: int, size: int) -> str:
    main = load_sweep(out, eng, tr, "main")
    fair = load_sweep(out, eng, tr, "fairness")
    mu = main["results"].groupby("window")["capacity_rps"].first()
    lines = [f"### `{trace}` ({windows} windows x {size} requests; mu = "
             + ", ".join(f"{v:.3f}" for v in mu) + " req/s)\n",
             "Mean normalised latency (ms per output token):\n",
             md(pivot(main["summary"], "mean_norm_latency_ms"), 0),
             "\nOracle gain recovered (%; ratio of window means):\n",
             md(pivot(main["summary"], "oracle_gain_recovered_pct")),
             "\nHeadline (mean over rho in {0.85, 0.92, 0.98}): "
             + ", ".join(f"{r.policy} {r.headline_gain_pct:.1f}%"
                         for r in main["headline"].itertuples()
                         if r.policy not in ("fcfs", "oracle-work")) + "\n",
             "p99 ratio to FCFS (mean over windows of p99 normalised latency ratios):\n",
             md(pivot(main["summary"], "p99_ratio"), 2),
             "\nPrefill share (%): marginal work vs simulated engine time under FCFS:\n",
             md(_accounting_rows(main["accountings"])),
             "\nNoisy oracle (oracle-SJF on lengths shuffled among 1-ACC of requests) and "
             "aging, CB-SJF-Work with aging weight W:\n",
             md(_fairness_rows(fair["summary"]), 1), ""]
    return "\n".join(lines)


def _accounting_rows(acc: pd.DataFrame) -> pd.DataFrame:
    rows = acc[["load", "marginal_work_share_pct", "engine_time_share_pct"]].copy()
    rows.columns = ["rho", "marginal work %", "engine time % (FCFS)"]
    return rows


def _fairness_rows(summary: pd.DataFrame) -> pd.DataFrame:
    cols = {"load": "rho", "policy": "policy", "mean_norm_latency_ms": "mean ms/tok",
            "p99_norm_latency_ms": "p99 ms/tok", "oracle_gain_recovered_pct": "gain %",
            "p99_ratio": "p99/FCFS", "starvation_count": "starved (>10x FCFS median)",
            "starved_beyond_fcfs_max": "waits > FCFS max", "max_queue_s": "max wait s"}
    rows = summary.sort_values("load", kind="stable")[list(cols)].rename(columns=cols)
    return rows


def _paper_side_by_side(out: Path, eng: str) -> str:
    rows = []
    for tr in TRACES:
        main = load_sweep(out, eng, tr, "main")
        s = main["summary"]
        at = s[s["load"] == 0.92].set_index("policy")["mean_norm_latency_ms"]
        p99 = s[(s["load"] == 0.98) & (s["policy"] == "cb-sjf-work")]["p99_ratio"].iloc[0]
        head = main["headline"].set_index("policy")["headline_gain_pct"]
        acc = main["accountings"].set_index("load")
        paper = PAPER[tr]
        for key, label in (("fcfs", "FCFS"), ("cb-sjf-work", "CB-SJF-Work"),
                           ("oracle-work", "Oracle-Work"), ("oracle-sjf", "Oracle-SJF")):
            rows.append((tr, f"{label} ms/tok at rho .92", paper[key], at[key]))
        rows += [
            (tr, "CB-SJF-Work oracle gain recovered %", paper["gain"], head["cb-sjf-work"]),
            (tr, "p99 ratio CB/FCFS at rho .98", paper["p99_ratio_098"], p99),
            (tr, "prefill % of marginal work", paper["marginal"],
             acc["marginal_work_share_pct"].iloc[0]),
            (tr, "prefill % of engine time, FCFS, rho .60", paper["time_060"],
             acc.loc[0.6, "engine_time_share_pct"]),
            (tr, "prefill % of engine time, FCFS, rho .92", paper["time_092"],
             acc.loc[0.92, "engine_time_share_pct"]),
        ]
    frame = pd.DataFrame(rows, columns=["trace", "quantity", "paper (2024 traces)", "cbgym"])
    frame["paper (2024 traces)"] = frame["paper (2024 traces)"].astype(float)
    return "Side by side with the study's published figures:\n\n" + md(frame, 1) + "\n"


def doc_plots(out: Path, img: Path) -> list[Path]:
    """The docs' figures: every engine and trace of the main sweeps in one figure each, and
    the latency CDFs of the fairness sweeps at rho = 0.98."""
    from cbgym.plots import plot_cdf, plot_goodput, plot_vs_load

    img.mkdir(parents=True, exist_ok=True)
    main = pd.concat([load_sweep(out, e, t, "main")["summary"]
                      for e in ENGINES for t in TRACES], ignore_index=True)
    cdf = pd.concat([pd.read_csv(out / e / t / "fairness" / "cdf.csv")
                     for e in ENGINES for t in TRACES], ignore_index=True)
    return [
        plot_vs_load(main, img / "mean_latency_vs_load.png", "mean_norm_latency_ms",
                     "mean normalised latency (ms/tok)"),
        plot_vs_load(main, img / "p99_latency_vs_load.png", "p99_norm_latency_ms",
                     "p99 normalised latency (ms/tok)"),
        plot_goodput(main, img / "goodput_vs_load.png"),
        plot_cdf(cdf, img / "latency_cdf_fairness.png"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/repro", help="output folder")
    parser.add_argument("--tables-only", action="store_true",
                        help="only print the tables from an earlier run")
    parser.add_argument("--doc-img", default=None, metavar="DIR",
                        help="also write the combined figures for docs/results.md here")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: one window of 600 requests per trace")
    args = parser.parse_args()
    out = Path(args.out)
    if not args.tables_only:
        started = time.perf_counter()
        timings = run_all(out, args.quick)
        total = time.perf_counter() - started
        print(f"# total {total:.1f} s over {len(timings)} sweeps")
    text = tables(out)
    (out / "tables.md").write_text(text)
    print(text)
    if args.doc_img:
        for path in doc_plots(out, Path(args.doc_img)):
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
