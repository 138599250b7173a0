"""The settings of a ``cbgym bench`` sweep: :class:`BenchConfig`, its defaults and the checks
that reject a bad one before any work starts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from cbgym import study
from cbgym.bench_inputs import CAPACITY_MODES, engine_overrides
from cbgym.capacity import CAPACITY_SAMPLE
from cbgym.metrics import SLO

__all__ = ["BenchConfig"]


@dataclass(frozen=True)
class BenchConfig:
    """Everything a sweep depends on (written to ``config.json``).

    Attributes:
        traces: catalogue names (``azure-conv-2023``, ``synthetic-conv``, ...) or file paths.
        policies: policy specs for :func:`cbgym.agents.make_policy` (``noisy-oracle:0.8``).
        loads: offered loads rho = lambda / mu, each > 0 (empty with ``request_rates``).
        engines: engine presets (``cbsjf-paper``, ``llama-2-13b/a100-80gb``, ...).
        windows: windows per trace.
        window_requests: requests per window (the study uses 20,000).
        seeds: seeds handed to the policies.
        max_num_seqs: engine override (None: the preset's).
        max_num_batched_tokens: engine override (None: the preset's).
        preemption: engine override, ``recompute`` or ``swap`` (None: the preset's).
        chunked_prefill: False turns chunked prefill off.
        prefix_caching: True turns vLLM's automatic prefix caching on (traces with block
            ids; docs/prefix-caching.md).
        ttft_s: TTFT SLO for goodput.
        tpot_s: TPOT SLO for goodput.
        warmup: fraction of each window's earliest requests left out of latency statistics.
        starvation_multiple: starvation threshold as a multiple of the FCFS median wait.
        cdf_load: load whose latency CDFs are kept and plotted (None: the highest).
        capacity_sample: requests released at t=0 to measure capacity.
        capacity: ``"per-window"`` (each window's own mu) or ``"per-trace"`` (one mu per
            trace and engine, the study's).
        workers: worker processes (None: ``os.cpu_count()``; 1 runs in this process).
        download: whether missing catalogue traces may be downloaded.
        request_rates: instead of ``loads``, send each window at these rates (requests/s)
            as vLLM's benchmark does (Gamma gaps of shape ``burstiness``, drawn with the
            cell's seed: :func:`cbgym.workload.at_request_rate`). The sweep's axis is then
            the rate: the ``load`` column of every table holds it, and ``results.csv``'s
            ``rho`` says what load it is on that window (rate / mu).
        burstiness: vLLM's ``--burstiness`` (1: Poisson; lower: burstier), with
            ``request_rates`` only.
        window_range: the part of each trace the windows are drawn from, as fractions of
            its requests (``(0.4, 1.0)``: after a predictor's training split).
    """

    traces: tuple[str, ...]
    policies: tuple[str, ...]
    loads: tuple[float, ...]
    engines: tuple[str, ...] = ("cbsjf-paper",)
    windows: int = 2
    window_requests: int = 4000
    seeds: tuple[int, ...] = (0,)
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    preemption: str | None = None
    chunked_prefill: bool = True
    prefix_caching: bool = False
    ttft_s: float = 2.0
    tpot_s: float = 0.1
    warmup: float = study.WARMUP
    starvation_multiple: float = study.STARVATION_MULTIPLE
    cdf_load: float | None = None
    capacity_sample: int = CAPACITY_SAMPLE
    capacity: str = "per-window"
    workers: int | None = None
    download: bool = False
    request_rates: tuple[float, ...] = ()
    burstiness: float = 1.0
    window_range: tuple[float, float] = (0.0, 1.0)

    def __post_init__(self) -> None:
        checks = [
            (bool(self.traces), "traces", "at least one trace"),
            (bool(self.policies), "policies", "at least one policy"),
            (bool(self.loads) != bool(self.request_rates), "loads",
             "loads or request_rates, not both"),
            (all(x > 0 and np.isfinite(x) for x in self.points), "loads" if self.loads else
             "request_rates", "values > 0"),
            (np.isfinite(self.burstiness) and self.burstiness > 0
             and (self.burstiness == 1.0 or bool(self.request_rates)), "burstiness",
             "a shape > 0 for request_rates' arrivals"),
            (bool(self.engines), "engines", "at least one engine"),
            (self.windows >= 1, "windows", "an integer >= 1"),
            (self.window_requests >= 2, "window_requests", "an integer >= 2"),
            (bool(self.seeds), "seeds", "at least one seed"),
            (self.ttft_s > 0 and self.tpot_s > 0, "ttft_s/tpot_s", "SLOs > 0"),
            (0 <= self.warmup < 1, "warmup", "a fraction in [0, 1)"),
            (self.starvation_multiple > 0, "starvation_multiple", "a multiple > 0"),
            (self.cdf_load is None or self.cdf_load in self.points, "cdf_load",
             "one of the loads (or request_rates)"),
            (self.capacity_sample >= 2, "capacity_sample", "an integer >= 2"),
            (self.capacity in CAPACITY_MODES, "capacity", "'per-window' or 'per-trace'"),
            (self.workers is None or self.workers >= 1, "workers", "an integer >= 1"),
            (self.preemption in (None, "recompute", "swap"), "preemption",
             "'recompute' or 'swap'"),
            (len(self.window_range) == 2 and 0.0 <= self.window_range[0]
             < self.window_range[1] <= 1.0, "window_range", "fractions 0 <= lo < hi <= 1"),
        ]
        for ok, name, expected in checks:
            if not ok:
                raise ValueError(f"BenchConfig.{name}={getattr(self, name, None)!r}: "
                                 f"expected {expected}")

    @property
    def slo(self) -> SLO:
        return SLO(ttft_s=self.ttft_s, tpot_s=self.tpot_s)

    @property
    def points(self) -> tuple[float, ...]:
        """The sweep's axis: the loads, or the request rates."""
        return self.request_rates or self.loads

    @property
    def axis(self) -> str:
        """``"rho"`` or ``"request_rate"``: what the ``load`` columns hold."""
        return "request_rate" if self.request_rates else "rho"

    @property
    def plot_load(self) -> float:
        """The load (or rate) whose latency CDFs are kept."""
        return self.cdf_load if self.cdf_load is not None else max(self.points)

    def engine_overrides(self) -> dict[str, Any]:
        """The EngineConfig fields this sweep sets on top of each preset."""
        return engine_overrides(self.max_num_seqs, self.max_num_batched_tokens, self.preemption,
                                self.chunked_prefill, self.prefix_caching)
