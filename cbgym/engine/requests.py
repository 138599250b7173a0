"""Per-request state as numpy columns indexed by request id (trace order)."""

from __future__ import annotations

from enum import IntEnum

import numpy as np

from cbgym.workload.trace import Trace


class Status(IntEnum):
    PENDING = 0  # not yet arrived
    WAITING = 1
    RUNNING = 2
    FINISHED = 3
    SHED = 4


_FINISHED = int(Status.FINISHED)  # FINISHED and SHED are the two largest codes


class RequestTable:
    """Columns of every request of one simulation. Mutated only by the engine."""

    def __init__(self, trace: Trace) -> None:
        n = len(trace)
        self.n = n
        # static, from the trace
        self.arrival_s = trace.arrival_s
        self.prompt = trace.prompt_tokens
        self.output = trace.output_tokens  # true output length: never shown to policies
        self.tenant = trace.tenant
        self.slo_class = trace.slo_class
        # dynamic
        self.computed = np.zeros(n, dtype=np.int64)  # tokens whose KV is computed
        self.generated = np.zeros(n, dtype=np.int64)  # output tokens produced so far
        self.tokens = self.prompt.copy()  # prompt + generated, kept in step with `generated`
        self.host_tokens = np.zeros(n, dtype=np.int64)  # KV tokens swapped out to host
        self.preemptions = np.zeros(n, dtype=np.int64)
        self.status = np.zeros(n, dtype=np.int8)
        self.first_scheduled_s = np.full(n, np.nan)
        self.first_token_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.reason: dict[int, str] = {}  # why a request ended, when not plain "finished"
        self.finish_order = np.empty(n, dtype=np.int64)  # finished ids, in completion order
        self.num_finished = 0
        self.num_ended = 0  # finished + shed

    def num_tokens(self, rid: int) -> int:
        """Tokens the request has: prompt plus generated output."""
        return int(self.tokens[rid])

    def end(self, rid: int, status: Status, t: float, reason: str | None) -> None:
        """Record that a request left the system (exactly once)."""
        assert self.status[rid] < _FINISHED, f"request {rid} ended twice"
        self.status[rid] = status
        self.finish_s[rid] = t
        if reason is not None:
            self.reason[rid] = reason
        if status == _FINISHED:
            self.finish_order[self.num_finished] = rid
            self.num_finished += 1
        self.num_ended += 1

    def readonly(self, column: np.ndarray) -> np.ndarray:
        view = column.view()
        view.flags.writeable = False
        return view
