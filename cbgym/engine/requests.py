"""Per-request state as numpy columns indexed by request id (trace order).

The columns are the kernel state's own arrays (:class:`cbgym.engine.layout.State`): reading
them costs nothing and always shows the current state. Only the kernel writes them.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np

from cbgym.engine import layout as L


class Status(IntEnum):
    PENDING = L.PENDING  # not yet arrived
    WAITING = L.WAITING
    RUNNING = L.RUNNING
    FINISHED = L.FINISHED
    SHED = L.SHED


class RequestTable:
    """Columns of every request of one run, over the kernel state (read them, never write).

    ``reasons`` names the codes in ``reason_code`` (the kernel's, then the run's own shed
    reasons); ``tenant`` and ``slo_class`` come from the trace.
    """

    def __init__(self, s: L.State, tenant: np.ndarray, slo_class: np.ndarray,
                 reasons: list[str]) -> None:
        self._s = s
        req, times = s.req, s.times
        self.n = times.shape[1]
        self.arrival_s, self.prompt, self.output = times[L.ARRIVAL], req[L.PROMPT], req[L.OUTPUT]
        self.tokens, self.computed, self.generated = req[L.TOKENS], req[L.COMPUTED], req[
            L.GENERATED]
        self.host_tokens, self.preemptions = req[L.HOST_TOKENS], req[L.PREEMPTIONS]
        self.cached_tokens = req[L.CACHED]  # found in the prefix cache at first admission
        self.status, self.reason_code = req[L.STATUS], req[L.REASON]
        self.first_scheduled_s = times[L.FIRST_SCHEDULED]
        self.first_token_s, self.finish_s = times[L.FIRST_TOKEN], times[L.FINISH]
        self.itl_max_s = times[L.ITL_MAX]
        self.itl_p99_s = times[L.ITL_P99]
        self.finish_order = s.ids[L.FINISH_ORDER]
        self.tenant, self.slo_class = tenant, slo_class
        self.reasons = reasons

    @property
    def num_finished(self) -> int:
        return int(self._s.si[L.NUM_FINISHED])

    @property
    def num_ended(self) -> int:
        """Finished + shed."""
        return int(self._s.si[L.NUM_ENDED])

    @property
    def reason(self) -> dict[int, str]:
        """Why requests ended, for those that did not plainly finish."""
        ids = np.flatnonzero(self.reason_code).tolist()
        return {rid: self.reasons[self.reason_code[rid]] for rid in ids}

    def num_tokens(self, rid: int) -> int:
        """Tokens the request has: prompt plus generated output."""
        return int(self.tokens[rid])

    @staticmethod
    def readonly(column: np.ndarray) -> np.ndarray:
        view = column.view()
        view.flags.writeable = False
        return view
