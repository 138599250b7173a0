"""The time series and the optional batch log, moved out of the kernel's buffers in chunks."""

from __future__ import annotations

import numpy as np

from cbgym.engine import layout as L

TIMESERIES_COLUMNS = L.REC_COLUMNS


class Recorder:
    """Collects what the kernel wrote: time-series rows, batch-log and preemption rows.

    The kernel writes into fixed buffers (``State.rec``, ``blog``, ``plog``); :meth:`flush`
    moves full buffers here. The last time-series row stays in the kernel, which may still
    extend it (a run of decode iterations).
    """

    def __init__(self, s: L.State, record_batches: bool) -> None:
        self._s = s
        self.record_batches = record_batches
        self._rows: list[np.ndarray] = []
        self._batch: list[np.ndarray] = []
        self._preempted: list[np.ndarray] = []

    def flush(self) -> None:
        """Empty the kernel's buffers (keeping the open time-series row)."""
        s, si = self._s, self._s.si
        n = int(si[L.REC_N])
        if n > 1:
            self._rows.append(s.rec[: n - 1].copy())
            s.rec[0] = s.rec[n - 1]
            si[L.REC_N] = 1
        if si[L.BLOG_N]:
            self._batch.append(s.blog[: si[L.BLOG_N]].copy())
            si[L.BLOG_N] = 0
        if si[L.PLOG_N]:
            self._preempted.append(s.plog[: si[L.PLOG_N]].copy())
            si[L.PLOG_N] = 0

    def timeseries(self) -> np.ndarray:
        """Every row so far (columns as TIMESERIES_COLUMNS): one per iteration, or per run of
        identical decode iterations (``num_iterations``) unless batches are recorded."""
        s = self._s
        rows = np.concatenate([*self._rows, s.rec[: s.si[L.REC_N]]])
        return rows

    def batch_log(self) -> tuple[np.ndarray, np.ndarray]:
        """(iteration, request id, tokens) rows and (iteration, request id) preemptions."""
        self.flush()
        log = np.concatenate(self._batch) if self._batch else np.empty((0, 3), np.int64)
        pre = np.concatenate(self._preempted) if self._preempted else np.empty((0, 2), np.int64)
        return log, pre
