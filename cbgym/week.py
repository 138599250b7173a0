"""The study's scale: a week of Azure's 2024 traffic (44.1M requests) streamed through the engine.

The CB-SJF-Work study measures its accountings on the 2024 week-long traces (DynamoLLM's:
27,303,999 conversation and 16,803,695 code requests; mean prompt / output 1631.6 / 105.5
and 2511.3 / 22.7 tokens; ``docs/scale.md``). :func:`week_source` gives such a week: the real
file when it is found (``azure-conv-2024``, ``azure-code-2024``: read in chunks), else a
synthetic week at its scale: the 2023 length mixture (:data:`cbgym.workload.LENGTH_FITS`)
rescaled to the 2024 means, Gamma renewal arrivals at the week's mean rate with the 2023
trace's inter-arrival CV (the 2024 one is not published; no daily cycle), generated in blocks
of a million requests, each from its own seed.

:func:`run_week` replays a week at offered load rho (arrivals rescaled affinely, as
:func:`cbgym.capacity.scale_to_load`; mu measured once on its first 4,000 requests, the
study's) in bounded memory: the engine runs it in segments, and each segment's results are
kept up to its last idle point, the last request that arrives after every earlier one has
ended. What comes after it is run again at the start of the next segment. A request's result
is then exactly what one run over the whole week gives (``tests/test_week.py``), for the
policies decided in the compiled loop (FCFS and static keys: ``sjf-ctx``, ``oracle-work``,
...), which remember nothing of earlier requests; a policy asked in Python at every decision
would take hours at this scale and is refused. Results are reduced per segment to counts,
sums and histograms (:mod:`cbgym.engine.itl`'s bins).
"""

from __future__ import annotations

import math
import resource
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cbgym.engine import itl
from cbgym.engine import layout as L
from cbgym.engine.config import EngineConfig
from cbgym.engine.engine import Engine
from cbgym.metrics import SLO
from cbgym.simulate import start_engine
from cbgym.workload.synthetic import LENGTH_FITS, LengthMixture
from cbgym.workload.trace import Trace

WEEK_S = 7 * 86_400.0
BLOCK = 1_000_000  # requests per generated block (each block from its own seed)
SEGMENT = 500_000  # requests the engine runs at once (grown when a busy period is longer)


@dataclass(frozen=True)
class WeekFit:
    """A 2024 week's published scale, and the 2023 trace's inter-arrival CV."""

    requests: int
    mean_prompt: float
    mean_output: float
    cv: float


# DynamoLLM's week (the study's Table of traces; ../shared/reference, [R]); CVs of 2023 [C]
WEEK_2024 = {"conv": WeekFit(27_303_999, 1631.6, 105.5, 1.09),
             "code": WeekFit(16_803_695, 2511.3, 22.7, 13.2)}
CATALOG_NAMES = {"conv": "azure-conv-2024", "code": "azure-code-2024"}


@dataclass
class WeekSource:
    """A week's requests, chunk by chunk (arrivals in seconds from the first, token counts).

    ``span_s``: first to last arrival. ``chunks()`` starts again from the first request on
    every call."""

    name: str
    kind: str
    requests: int
    span_s: float
    _synthetic: tuple[int, int] | None = None  # (seed, requests): a synthetic week
    _path: Path | None = None

    def chunks(self) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        if self._path is not None:
            yield from _file_chunks(self._path)
            return
        assert self._synthetic is not None
        seed, n = self._synthetic
        fit = WEEK_2024[self.kind]
        mixture = length_mixture(self.kind)
        at = 0.0
        for b, block in enumerate(_block_seeds(seed, n)):
            m = min(BLOCK, n - b * BLOCK)
            gaps = _gaps(block, m, fit.requests / WEEK_S, fit.cv)
            if b == 0:
                gaps[0] = 0.0  # (the first request arrives at 0)
            arrival = at + np.cumsum(gaps)
            at = float(arrival[-1])
            prompt, output = mixture.sample(np.random.default_rng(block.spawn(2)[1]), m)
            yield arrival, prompt, output


def _block_seeds(seed: int, n: int) -> list[np.random.SeedSequence]:
    return np.random.SeedSequence(seed).spawn(math.ceil(n / BLOCK))


def _gaps(block: np.random.SeedSequence, m: int, rate: float, cv: float) -> np.ndarray:
    shape = 1.0 / cv**2
    return np.random.default_rng(block.spawn(2)[0]).gamma(shape, 1.0 / (rate * shape), m)


@lru_cache(maxsize=4)
def length_mixture(kind: str) -> LengthMixture:
    """The 2023 mixture of ``kind`` with its log-means moved (and its caps scaled) so that
    400,000 draws have the 2024 week's mean prompt and output (a few fixed-point steps)."""
    base, fit = LENGTH_FITS[kind], WEEK_2024[kind]
    sp = so = 1.0
    for _ in range(5):
        p, o = _scaled(base, sp, so).sample(np.random.default_rng(0), 400_000)
        sp *= fit.mean_prompt / p.mean()
        so *= fit.mean_output / o.mean()
    return _scaled(base, sp, so)


def _scaled(base: LengthMixture, sp: float, so: float) -> LengthMixture:
    lp, lo = math.log(sp), math.log(so)
    return replace(base, means=tuple((a + lp, b + lo) for a, b in base.means),
                   max_prompt=round(base.max_prompt * sp), max_output=round(base.max_output * so))


def week_source(kind: str, requests: int | None = None, seed: int = 0,
                real: bool = True) -> WeekSource:
    """The 2024 week of ``kind`` (``"conv"`` or ``"code"``): the real file if found (and
    ``real``), else the synthetic week; ``requests``: only the first ones (a shorter run at
    the week's rate, e.g. for a test)."""
    if kind not in WEEK_2024:
        raise ValueError(f"week_source: kind={kind!r}, expected 'conv' or 'code'")
    if requests is not None and requests < 2:
        raise ValueError(f"week_source: requests={requests!r}, expected at least 2")
    from cbgym.workload.catalog import find_trace

    path = find_trace(CATALOG_NAMES[kind]) if real else None
    if path is not None:
        n, span = _file_extent(path, requests)
        return WeekSource(str(path), kind, n, span, _path=path)
    n = WEEK_2024[kind].requests if requests is None else requests
    fit = WEEK_2024[kind]
    span = 0.0
    for b, block in enumerate(_block_seeds(seed, n)):  # (a first pass, arrivals only)
        gaps = _gaps(block, min(BLOCK, n - b * BLOCK), fit.requests / WEEK_S, fit.cv)
        span += float(gaps.sum()) - (float(gaps[0]) if b == 0 else 0.0)
    return WeekSource(f"synthetic-{kind}-week(n={n},seed={seed})", kind, n, span,
                      _synthetic=(seed, n))


def _file_chunks(path: Path, limit: int | None = None
                 ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    from cbgym.workload.rows import _parse_timestamps

    first, taken = None, 0
    for frame in pd.read_csv(path, chunksize=BLOCK, dtype={"TIMESTAMP": str}):
        nanos, ok = _parse_timestamps(frame["TIMESTAMP"])
        if not ok.all():
            bad = int(np.flatnonzero(~ok)[0])
            raise ValueError(f"{path}: line {int(frame.index[bad]) + 2}: TIMESTAMP "
                             f"{frame['TIMESTAMP'].iloc[bad]!r} is not a timestamp")
        prompt = frame["ContextTokens"].to_numpy(np.int64)
        output = frame["GeneratedTokens"].to_numpy(np.int64)
        keep = output > 0  # (requests that produced nothing are left out)
        first = nanos[0] if first is None else first
        arrival = (nanos[keep] - first) / 1e9
        if limit is not None:
            arrival, prompt, output = (a[: limit - taken] for a in
                                       (arrival, prompt[keep], output[keep]))
        else:
            prompt, output = prompt[keep], output[keep]
        taken += len(arrival)
        yield arrival, prompt, output
        if limit is not None and taken >= limit:
            return


def _file_extent(path: Path, limit: int | None) -> tuple[int, float]:
    n, last = 0, 0.0
    for arrival, _, _ in _file_chunks(path, limit):
        n += len(arrival)
        last = float(arrival[-1]) if len(arrival) else last
    return n, last


# ---------------------------------------------------------------- the run


@dataclass
class WeekResult:
    """A week's run, reduced (module docstring)."""

    source: str
    policy: str
    load: float
    capacity_rps: float
    num_requests: int = 0
    num_finished: int = 0
    num_shed: int = 0
    num_good: int = 0
    prompt_tokens: float = 0.0
    output_tokens: float = 0.0
    prefill_engine_s: float = 0.0
    busy_s: float = 0.0
    sim_seconds: float = 0.0
    segments: int = 0
    rerun_requests: int = 0  # simulated again after a segment's last idle point
    wall_s: float = 0.0
    peak_rss_mib: float = 0.0
    norm_latency: np.ndarray = field(default_factory=lambda: np.zeros(itl.SLOTS))
    ttft: np.ndarray = field(default_factory=lambda: np.zeros(itl.SLOTS))

    def summary(self) -> dict[str, Any]:
        """One row: counts, the study's mean (and p99) normalised latency in ms per output
        token, TTFT quantiles, goodput, the prefill shares, wall time and peak memory."""
        norm = itl.stats(self.norm_latency, (0.5, 0.99), "norm_latency")
        ttft = itl.stats(self.ttft, (0.5, 0.99), "ttft")
        from cbgym.study import work_coefficients

        coef = work_coefficients(EngineConfig(preset="cbsjf-paper"))
        pre = coef.prefill_token_s * self.prompt_tokens
        dec = coef.decode_seq_s * self.output_tokens
        return {
            "source": self.source, "policy": self.policy, "load": self.load,
            "capacity_rps": self.capacity_rps, "num_requests": self.num_requests,
            "num_finished": self.num_finished, "num_shed": self.num_shed,
            "mean_prompt": self.prompt_tokens / max(self.num_requests, 1),
            "mean_output": self.output_tokens / max(self.num_requests, 1),
            "mean_norm_latency_ms": 1e3 * norm["norm_latency_mean"],
            "p99_norm_latency_ms": 1e3 * norm["norm_latency_p99"],
            "ttft_p50": ttft["ttft_p50"], "ttft_p99": ttft["ttft_p99"],
            "slo_attainment": self.num_good / max(self.num_requests, 1),
            "marginal_work_share_pct": 100 * pre / (pre + dec) if pre + dec else math.nan,
            "engine_time_share_pct": (100 * self.prefill_engine_s / self.busy_s
                                      if self.busy_s else math.nan),
            "sim_days": self.sim_seconds / 86_400, "segments": self.segments,
            "rerun_requests": self.rerun_requests, "wall_s": self.wall_s,
            "peak_rss_mib": self.peak_rss_mib,
        }


def run_week(source: WeekSource, engine: EngineConfig | str = "cbsjf-paper",
             policy: str = "fcfs", load: float = 0.9, slo: SLO | None = None,
             capacity_rps: float | None = None, segment: int = SEGMENT,
             progress: bool = False) -> WeekResult:
    """Replay ``source`` at offered load ``load`` under ``policy`` (module docstring).

    Raises:
        ValueError: a policy not decided in the compiled loop, a load or segment out of range.
    """
    from tqdm import tqdm

    from cbgym.capacity import measure_capacity
    from cbgym.simulate import resolve_engine, resolve_policy, run_engine

    if not (isinstance(load, int | float) and 0 < load < math.inf):
        raise ValueError(f"run_week: load={load!r}, expected a number > 0")
    if segment < 2:
        raise ValueError(f"run_week: segment={segment!r}, expected at least 2 requests")
    cfg = resolve_engine(engine)
    pol = resolve_policy(policy)
    if pol.consult != "never" and not pol.static_key:
        raise ValueError(f"run_week: policy {policy!r} is asked in Python at its decisions "
                         "(hours at this scale); the week runs policies decided in the "
                         "compiled loop: fcfs, sjf-ctx, oracle-work, oracle-sjf, ...")
    slo = slo or SLO()
    started = time.perf_counter()
    stream = _Stream(source.chunks())
    if capacity_rps is None:
        head = stream.peek(4000)
        capacity_rps = measure_capacity(Trace.from_arrays(*head, name="week-head"), cfg)
    # scale_to_load's map: the n requests span n / (rho mu) seconds
    stretch = source.requests / (load * capacity_rps) / source.span_s
    out = WeekResult(source.name, getattr(pol, "label", pol.name), float(load), capacity_rps)
    bar = tqdm(total=source.requests, unit="req", unit_scale=True, disable=not progress,
               desc=source.kind)
    size = segment
    while not stream.done():
        arrival, prompt, output = stream.peek(size)
        last = stream.exhausted(len(arrival))
        eng = _run_segment(cfg, pol, arrival * stretch, prompt, output, run_engine)
        s = eng.state
        finish = s.times[L.FINISH]
        if last:
            cut = len(arrival)
        else:  # the last request arriving after every earlier one has ended
            ended = np.maximum.accumulate(finish[:-1])
            idle = np.flatnonzero(arrival[1:] * stretch > ended)
            cut = int(idle[-1]) + 1 if len(idle) else 0
            if cut == 0:
                size *= 2  # one busy period over the whole segment: a longer one
                continue
        _reduce(out, eng, cut, slo, cfg, arrival[cut] * stretch if cut < len(arrival)
                else math.inf)
        out.segments += 1
        out.rerun_requests += len(arrival) - cut
        stream.drop(cut)
        bar.update(cut)
        size = segment
    bar.close()
    out.wall_s = time.perf_counter() - started
    out.peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def _run_segment(cfg: EngineConfig, pol: Any, arrival: np.ndarray, prompt: np.ndarray,
                 output: np.ndarray, run_engine: Any) -> Engine:
    tr = Trace.from_arrays(arrival, prompt, output, name="week-segment", rebase=False)
    eng = start_engine(tr, cfg, pol, 0, np.full(len(tr), np.inf), itl_p99=False)
    run_engine(eng, pol)
    return eng


def _reduce(out: WeekResult, eng: Engine, cut: int, slo: SLO, cfg: EngineConfig,
            until: float) -> None:
    """Add the first ``cut`` requests of a finished segment (and its iterations before
    ``until``, the next segment's start) to ``out``."""
    from cbgym.metrics import timeseries_frame
    from cbgym.study import prefill_engine_time

    s = eng.state
    arrival, first, finish = (s.times[r, :cut] for r in (L.ARRIVAL, L.FIRST_TOKEN, L.FINISH))
    prompt, output, status = (s.req[r, :cut] for r in (L.PROMPT, L.OUTPUT, L.STATUS))
    done = status == L.FINISHED
    e2e = (finish - arrival)[done]
    out_tok = output[done]
    tpot = np.where(out_tok > 1, (finish - first)[done] / np.maximum(out_tok - 1, 1), 0.0)
    ttft = (first - arrival)[done]
    out.num_requests += cut
    out.num_finished += int(done.sum())
    out.num_shed += int((status == L.SHED).sum())
    out.num_good += int(((ttft <= slo.ttft_s) & (tpot <= slo.tpot_s)).sum())
    out.prompt_tokens += float(prompt.sum())
    out.output_tokens += float(output.sum())
    itl.add_values(out.norm_latency, e2e / out_tok)
    itl.add_values(out.ttft, ttft)
    out.sim_seconds = max(out.sim_seconds, float(np.max(finish, initial=0.0)))
    rows = eng.recorder.timeseries()
    rows = rows[rows[:, 0] < until]
    pre, busy = prefill_engine_time(timeseries_frame(rows, eng.kv.num_blocks), cfg)
    out.prefill_engine_s += pre
    out.busy_s += busy


class _Stream:
    """Requests from chunks, peeked ahead and dropped from the front (bounded buffer)."""

    def __init__(self, chunks: Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
        self._chunks = chunks
        self._buf: list[np.ndarray] = [np.zeros(0), np.zeros(0, np.int64),
                                       np.zeros(0, np.int64)]
        self._end = False

    def _fill(self, n: int) -> None:
        parts: list[list[np.ndarray]] = [[b] for b in self._buf]
        have = len(self._buf[0])
        while have < n and not self._end:
            chunk = next(self._chunks, None)
            if chunk is None:
                self._end = True
                break
            for p, a in zip(parts, chunk, strict=True):
                p.append(a)
            have += len(chunk[0])
        self._buf = [np.concatenate(p) for p in parts]

    def peek(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        self._fill(n)
        a, p, o = (b[:n] for b in self._buf)
        return a, p, o

    def exhausted(self, n: int) -> bool:
        """Whether the first ``n`` buffered requests are all that is left."""
        self._fill(n + 1)
        return self._end and len(self._buf[0]) <= n

    def drop(self, n: int) -> None:
        self._buf = [b[n:] for b in self._buf]

    def done(self) -> bool:
        self._fill(1)
        return self._end and len(self._buf[0]) == 0


__all__ = ["WEEK_2024", "WeekFit", "WeekResult", "WeekSource", "length_mixture", "run_week",
           "week_source"]
