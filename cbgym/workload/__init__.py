"""Workloads: the request trace, file loaders, named (downloadable) traces, synthetic traces,
multi-turn sessions with prefix-block ids."""

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
from cbgym.workload.prefix_reuse import leading_hits, prefix_reuse
from cbgym.workload.session_synth import synthetic_sessions
from cbgym.workload.sessions import (
    SessionDataWarning,
    SessionFormatError,
    load_agent_sessions,
    previous_in_session,
)
from cbgym.workload.synthetic import (
    at_request_rate,
    from_distributions,
    gamma_arrivals,
    poisson_arrivals,
    synthetic_trace,
)
from cbgym.workload.trace import Trace

__all__ = [
    "DroppedRowsWarning",
    "SessionDataWarning",
    "SessionFormatError",
    "Trace",
    "TraceChecksumError",
    "TraceFormatError",
    "TraceNotFoundError",
    "at_request_rate",
    "download_trace",
    "from_distributions",
    "gamma_arrivals",
    "known_names",
    "load_agent_sessions",
    "load_azure",
    "load_burstgpt",
    "load_mooncake",
    "load_trace",
    "load_trace_file",
    "poisson_arrivals",
    "leading_hits",
    "prefix_reuse",
    "previous_in_session",
    "synthetic_sessions",
    "synthetic_trace",
]
