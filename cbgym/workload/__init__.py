"""Workloads: the request trace, file loaders, named (downloadable) traces, synthetic traces."""

from cbgym.workload.catalog import (
    TraceChecksumError,
    TraceNotFoundError,
    download_trace,
    known_names,
    load_trace,
)
from cbgym.workload.loaders import (
    DroppedRowsWarning,
    TraceFormatError,
    load_azure,
    load_burstgpt,
    load_mooncake,
    load_trace_file,
)
from cbgym.workload.synthetic import (
    from_distributions,
    gamma_arrivals,
    poisson_arrivals,
    synthetic_trace,
)
from cbgym.workload.trace import Trace

__all__ = [
    "DroppedRowsWarning",
    "Trace",
    "TraceChecksumError",
    "TraceFormatError",
    "TraceNotFoundError",
    "download_trace",
    "from_distributions",
    "gamma_arrivals",
    "known_names",
    "load_azure",
    "load_burstgpt",
    "load_mooncake",
    "load_trace",
    "load_trace_file",
    "poisson_arrivals",
    "synthetic_trace",
]
