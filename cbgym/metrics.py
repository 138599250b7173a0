"""Per-request records, SLOs, summaries: what a simulation produced, as pandas objects.

Names follow vLLM's Prometheus metrics where one exists: ``ttft`` is
``vllm:time_to_first_token_seconds``, ``tpot`` is ``vllm:request_time_per_output_token_seconds``,
``e2e`` is ``vllm:e2e_request_latency_seconds``, ``queue`` is ``vllm:request_queue_time_seconds``,
``kv_cache_usage_perc`` and ``num_preemptions`` are the gauges/counters of the same name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cbgym.engine import itl
from cbgym.engine.recorder import TIMESERIES_COLUMNS

QUANTILES = (0.5, 0.9, 0.95, 0.99)


@dataclass(frozen=True, slots=True)
class SLO:
    """Latency targets a request must meet to count towards goodput (the study's defaults)."""

    ttft_s: float = 2.0
    tpot_s: float = 0.1
    # longest gap between two tokens of a request (time between tokens, TBT: judged on its
    # worst gap, ``itl_max_s``); None: not judged
    tbt_s: float | None = None
    # an end-to-end deadline, arrival to last token (a batch class's); None: not judged.
    # Judged in results and the cluster env; the scheduling envs' compiled reward does not
    # read it yet, and refuses an SLO that has one
    e2e_s: float | None = None

    def __post_init__(self) -> None:
        if not (self.ttft_s > 0 and self.tpot_s > 0):
            raise ValueError(
                f"SLO: ttft_s and tpot_s must be > 0, got {self.ttft_s}, {self.tpot_s}"
            )
        if self.tbt_s is not None and not self.tbt_s > 0:
            raise ValueError(f"SLO: tbt_s must be None or > 0, got {self.tbt_s}")
        if self.e2e_s is not None and not self.e2e_s > 0:
            raise ValueError(f"SLO: e2e_s must be None or > 0, got {self.e2e_s}")


SLOSpec = SLO | Mapping[int, SLO]


def slo_arrays(slo: SLOSpec, slo_class: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-request TTFT and TPOT targets from one SLO or a mapping SLO class -> SLO."""
    if isinstance(slo, SLO):
        return np.full(len(slo_class), slo.ttft_s), np.full(len(slo_class), slo.tpot_s)
    check_slo(slo)
    ttft = np.empty(len(slo_class))
    tpot = np.empty(len(slo_class))
    for cls in np.unique(slo_class):
        if int(cls) not in slo:
            raise ValueError(f"SLO mapping has no entry for SLO class {int(cls)} (it names "
                             f"classes {sorted(slo)}; the trace has {np.unique(slo_class)})")
        mask = slo_class == cls
        ttft[mask], tpot[mask] = slo[int(cls)].ttft_s, slo[int(cls)].tpot_s
    return ttft, tpot


def check_slo(slo: object) -> None:
    """An SLO, or a mapping from SLO class ids (ints in [0, 32767], as ``Trace.slo_class``)
    to SLOs; anything else is a clear error naming the entry."""
    if isinstance(slo, SLO):
        return
    if not isinstance(slo, Mapping):
        raise TypeError(f"slo: expected an SLO or a mapping {{SLO class: SLO}}, got "
                        f"{type(slo).__name__}")
    for cls, target in slo.items():
        if isinstance(cls, bool) or not isinstance(cls, int | np.integer) or not (
                0 <= cls <= np.iinfo(np.int16).max):
            raise ValueError(f"slo[{cls!r}]: SLO classes are ints in [0, 32767] (Trace."
                             "slo_class)")
        if not isinstance(target, SLO):
            raise TypeError(f"slo[{cls!r}]={target!r}: expected an SLO")


def slo_to_dict(slo: SLOSpec) -> dict[str, Any]:
    """An SLO (or a class map) as JSON-friendly data: ``{"ttft_s", "tpot_s"[, "tbt_s"]}``, or
    ``{"classes": {"0": {...}, ...}}``; :func:`slo_from_dict` reads it back."""
    def one(x: SLO) -> dict[str, Any]:
        d: dict[str, Any] = {"ttft_s": x.ttft_s, "tpot_s": x.tpot_s}
        for key in ("tbt_s", "e2e_s"):
            if getattr(x, key) is not None:
                d[key] = getattr(x, key)
        return d

    if isinstance(slo, SLO):
        return one(slo)
    return {"classes": {str(int(c)): one(x) for c, x in slo.items()}}


def slo_from_dict(data: Mapping[str, Any]) -> SLOSpec:
    """The SLO :func:`slo_to_dict` wrote (a malformed entry: a ValueError naming it)."""
    try:
        if "classes" in data:
            return {int(c): SLO(**x) for c, x in data["classes"].items()}
        return SLO(**data)
    except (TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"SLO data {dict(data)!r}: expected {{'ttft_s', 'tpot_s'}} or "
                         f"{{'classes': {{class: {{...}}}}}} ({exc})") from None


def tpot(first_token_s: np.ndarray, finish_s: np.ndarray, output_tokens: np.ndarray) -> np.ndarray:
    """Time per output token after the first: (finish - first token) / (output - 1); 0 if one."""
    return np.where(
        output_tokens > 1, (finish_s - first_token_s) / np.maximum(output_tokens - 1, 1), 0.0
    )


def meets_slo(requests: pd.DataFrame, slo: SLOSpec) -> np.ndarray:
    """Whether each request finished within both its TTFT and TPOT targets."""
    ttft_t, tpot_t = slo_arrays(slo, requests["slo_class"].to_numpy())
    finished = (requests["status"] == "finished").to_numpy()
    with np.errstate(invalid="ignore"):
        ok = (requests["ttft_s"].to_numpy() <= ttft_t) & (requests["tpot_s"].to_numpy() <= tpot_t)
        tbt = tbt_targets(slo, requests["slo_class"].to_numpy())
        if tbt is not None and "itl_max_s" in requests:
            ok &= requests["itl_max_s"].to_numpy() <= tbt
        e2e = e2e_targets(slo, requests["slo_class"].to_numpy())
        if e2e is not None:
            ok &= requests["e2e_s"].to_numpy() <= e2e
    return finished & ok


def tbt_targets(slo: SLOSpec, slo_class: np.ndarray) -> np.ndarray | None:
    """Per-request TBT targets (inf where a class has none); None if no class has one."""
    return _optional_targets(slo, slo_class, "tbt_s")


def e2e_targets(slo: SLOSpec, slo_class: np.ndarray) -> np.ndarray | None:
    """Per-request end-to-end deadlines (inf where a class has none); None if none has."""
    return _optional_targets(slo, slo_class, "e2e_s")


def _optional_targets(slo: SLOSpec, slo_class: np.ndarray, field: str) -> np.ndarray | None:
    slos = [slo] if isinstance(slo, SLO) else list(slo.values())
    if all(getattr(s, field) is None for s in slos):
        return None
    if isinstance(slo, SLO):
        return np.full(len(slo_class), getattr(slo, field))
    out = np.full(len(slo_class), np.inf)
    for cls, s in slo.items():
        if getattr(s, field) is not None:
            out[slo_class == cls] = getattr(s, field)
    return out


def has_e2e(slo: SLOSpec) -> bool:
    """Whether any class of ``slo`` has an end-to-end deadline."""
    return any(s.e2e_s is not None for s in ([slo] if isinstance(slo, SLO) else slo.values()))


def _quantiles(prefix: str, values: np.ndarray, out: dict[str, float]) -> None:
    values = values[np.isfinite(values)]
    out[f"{prefix}_mean"] = float(values.mean()) if values.size else float("nan")
    for q in QUANTILES:
        key = f"{prefix}_p{round(q * 100)}"
        out[key] = float(np.quantile(values, q)) if values.size else float("nan")


@dataclass
class SimulationResult:
    """What ``cbgym.simulate`` returns.

    Attributes:
        requests: one row per request (arrival_s, prompt_tokens, output_tokens,
            first_scheduled_s, first_token_s, finish_s, ttft_s, tpot_s, e2e_s, queue_s,
            preemptions, status ("finished" or "shed"), reason).
        timeseries: one row per engine iteration (start_s, duration_s, num_waiting,
            num_running, kv_blocks_used, kv_cache_usage_perc, num_tokens, prefill_tokens,
            decode_seqs, num_preemptions, num_iterations). Without ``record_iterations``, a run
            of identical pure-decode iterations (same queue and batch, no prefill, no
            preemption) is one row: ``num_iterations`` of them, ``duration_s`` their total,
            per-iteration token counts, and the KV blocks in use after the last; so memory
            grows with the workload's events, not with its output lengths.
        iterations: the batch log when run with ``record_iterations=True`` (one row per
            scheduled request per iteration: iteration, request_id, num_tokens), else None.
        preemption_log: (iteration, request_id) of each preemption, with the batch log.
        slo: the SLO used for goodput.
        meta: run configuration (policy, engine, load, seed, wall time).
        itl_histogram: every gap between two tokens of the run, pooled over its requests
            (:mod:`cbgym.engine.itl`: bins, then the gaps' sum, sum of squares and count);
            None in the study's engine mode, which does not keep it.
    """

    requests: pd.DataFrame
    timeseries: pd.DataFrame
    iterations: pd.DataFrame | None
    preemption_log: pd.DataFrame | None
    slo: SLOSpec = field(default_factory=SLO)
    meta: dict[str, Any] = field(default_factory=dict)
    itl_histogram: np.ndarray | None = None

    def summary(self, warmup: float = 0.0) -> dict[str, float]:
        """Latency quantiles, goodput, SLO attainment, throughput and engine counters.

        The inter-token latencies ``itl_mean``, ``itl_std``, ``itl_p50`` ... ``itl_p99``
        pool every gap between two tokens of the run, as vLLM's benchmark's
        ``inter_token_latency`` (``mean_itl_ms``, ``median_itl_ms``, ``p99_itl_ms``; NaN in
        the study's engine mode, and on a cluster with a pool in that mode), counted as they
        are streamed, so also those of requests that did not finish after streaming
        (:mod:`cbgym.engine.itl`); per request, ``requests`` has its worst and p99 gap.

        Args:
            warmup: fraction of the earliest-arriving requests left out of the latency
                statistics (the study discards 10%); counters and the pooled inter-token
                latencies always cover the whole run.
        """
        req = self.requests
        if warmup:
            req = req.iloc[int(len(req) * warmup) :]
        fin = req[req["status"] == "finished"]
        out: dict[str, float] = {
            "num_requests": float(len(req)),
            "num_finished": float(len(fin)),
            "num_shed": float((req["status"] == "shed").sum()),
        }
        for col in ("ttft_s", "tpot_s", "e2e_s", "queue_s"):
            _quantiles(col.removesuffix("_s"), fin[col].to_numpy(), out)
        out.update(itl.stats(self.itl_histogram, QUANTILES))
        norm = (fin["e2e_s"] / fin["output_tokens"]).to_numpy()
        _quantiles("norm_latency", norm, out)
        good = meets_slo(req, self.slo)
        span = _span(req)  # rates over the requests measured (after any warm-up discard)
        out["slo_attainment"] = float(good.mean()) if len(req) else float("nan")
        out["goodput_rps"] = float(good.sum() / span) if span > 0 else 0.0
        out["throughput_rps"] = float(len(fin) / span) if span > 0 else 0.0
        out["throughput_tok_s"] = float(fin["output_tokens"].sum() / span) if span > 0 else 0.0
        out["num_preemptions"] = float(self.requests["preemptions"].sum())
        # vLLM's counters (tokens looked up / found at first admission); 0 with caching off
        cache = self.meta.get("prefix_cache", {})
        out["prefix_cache_queries"] = float(cache.get("queries", 0))
        out["prefix_cache_hits"] = float(cache.get("hits", 0))
        out["iterations"] = float(self.timeseries["num_iterations"].sum())
        out["sim_seconds"] = self.sim_seconds
        out["wall_seconds"] = float(self.meta.get("wall_seconds", float("nan")))
        return out

    @property
    def sim_seconds(self) -> float:
        """Simulated time from the first arrival to the last request leaving."""
        return _span(self.requests)

    def to_chrome_trace(self, path: str | Path | None = None) -> dict[str, Any]:
        """The batch log as Chrome-trace JSON (open in chrome://tracing or Perfetto)."""
        if self.iterations is None:
            raise ValueError("no batch log: run simulate(..., record_iterations=True)")
        ts = self.timeseries
        events: list[dict[str, Any]] = []
        for it, row in enumerate(ts.itertuples(index=False)):
            events.append(
                {
                    "name": f"iteration {it}",
                    "ph": "X",
                    "pid": 0,
                    "tid": 0,
                    "ts": row.start_s * 1e6,
                    "dur": row.duration_s * 1e6,
                    "args": {"tokens": int(row.num_tokens), "running": int(row.num_running)},
                }
            )
        starts = ts["start_s"].to_numpy()
        durs = ts["duration_s"].to_numpy()
        for it, rid, tok in self.iterations.itertuples(index=False):
            events.append(
                {
                    "name": f"req {rid}",
                    "ph": "X",
                    "pid": 1,
                    "tid": int(rid),
                    "ts": starts[it] * 1e6,
                    "dur": durs[it] * 1e6,
                    "args": {"tokens": int(tok)},
                }
            )
        if self.preemption_log is not None:
            for it, rid in self.preemption_log.itertuples(index=False):
                events.append(
                    {
                        "name": "preempted",
                        "ph": "i",
                        "s": "t",
                        "pid": 1,
                        "tid": int(rid),
                        "ts": starts[min(it, len(starts) - 1)] * 1e6,
                    }
                )
        doc = {"traceEvents": events, "displayTimeUnit": "ms"}
        if path is not None:
            Path(path).write_text(json.dumps(doc))
        return doc


def _span(requests: pd.DataFrame) -> float:
    """Seconds from the first of these requests arriving to the last of them leaving."""
    if not len(requests):
        return 0.0
    return float(np.nanmax(requests["finish_s"].to_numpy()) - requests["arrival_s"].min())


def requests_frame(table: Any, slo: SLOSpec,
                   extra: dict[str, np.ndarray] | None = None) -> pd.DataFrame:
    """Build the per-request DataFrame from the engine's request table (``extra``: more
    columns, after the standard ones; one frame built at once is much cheaper than columns
    added one by one)."""
    out_tok = table.output
    status = np.where(table.status == 3, "finished", "shed")
    reason = np.full(table.n, "", dtype=object)
    for rid, why in table.reason.items():
        reason[rid] = why
    ttft = table.first_token_s - table.arrival_s
    frame = pd.DataFrame(
        {
            "arrival_s": table.arrival_s,
            "prompt_tokens": table.prompt,
            "output_tokens": out_tok,
            "tenant": table.tenant,
            "slo_class": table.slo_class,
            "first_scheduled_s": table.first_scheduled_s,
            "first_token_s": table.first_token_s,
            "finish_s": table.finish_s,
            "ttft_s": ttft,
            "tpot_s": tpot(table.first_token_s, table.finish_s, table.generated),
            "itl_max_s": table.itl_max_s,
            "itl_p99_s": table.itl_p99_s,
            "e2e_s": table.finish_s - table.arrival_s,
            "queue_s": table.first_scheduled_s - table.arrival_s,
            "preemptions": table.preemptions,
            "cached_tokens": table.cached_tokens,
            "status": status,
            "reason": reason,
            **(extra or {}),
        }
    )
    frame.index.name = "request_id"
    shed = status == "shed"
    frame.loc[shed, ["ttft_s", "tpot_s", "itl_max_s", "itl_p99_s", "e2e_s"]] = np.nan
    return frame


def timeseries_frame(rows: np.ndarray, num_blocks: int | np.ndarray) -> pd.DataFrame:
    """Time-series rows as a frame (``num_blocks``: the KV capacity, or one per row)."""
    cols: dict[str, np.ndarray] = {}
    for k, col in enumerate(TIMESERIES_COLUMNS):
        cols[col] = rows[:, k] if k < 2 else rows[:, k].astype(np.int64)
        if col == "kv_blocks_used":  # vLLM's gauge, beside the block count
            cols["kv_cache_usage_perc"] = cols[col] / num_blocks
    frame = pd.DataFrame(cols)
    frame.index.name = "iteration"
    return frame


def config_dict(obj: Any) -> dict[str, Any]:
    """A JSON-friendly view of a dataclass config (objects become their repr)."""
    raw = asdict(obj) if hasattr(obj, "__dataclass_fields__") else dict(obj)
    return {
        k: v if isinstance(v, int | float | str | bool | type(None)) else repr(v)
        for k, v in raw.items()
    }
