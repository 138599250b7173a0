"""Per-iteration time series and the optional batch log, kept as growing numpy chunks."""

from __future__ import annotations

import numpy as np

TIMESERIES_COLUMNS = (
    "start_s", "duration_s", "num_waiting", "num_running", "kv_blocks_used",
    "num_tokens", "prefill_tokens", "decode_seqs", "num_preemptions",
)


class Recorder:
    """Collects one row per iteration; stretches of iterations arrive as whole arrays.

    Rows (9-tuples) and stretches (5-tuples of columns) go into one list in time order and
    become an array only when the time series is read, so recording costs a list append.
    """

    def __init__(self, record_batches: bool) -> None:
        self.record_batches = record_batches
        self._items: list[tuple | np.ndarray] = []
        # batch log: (iteration, request id, tokens) triples and preemptions
        self._batch: list[np.ndarray] = []
        self._preempted: list[tuple[int, int]] = []

    def iteration(self, row: tuple[float, ...]) -> None:
        self._items.append(row)

    def iteration_rows(self, rows: np.ndarray) -> None:
        """Many iterations at once, already as rows (the compiled kernel's buffer)."""
        self._items.append(rows)

    def stretch(self, starts: np.ndarray, durations: np.ndarray, kv_used: np.ndarray,
                num_waiting: int, num_running: int) -> None:
        """k decode-only iterations: every running request computes one token, nobody is
        admitted, nobody preempted. Expanded into rows only when the time series is read."""
        self._items.append((starts, durations, kv_used, num_waiting, num_running))

    def batch(self, iteration: int, ids: np.ndarray, tokens: np.ndarray) -> None:
        if self.record_batches:
            self._batch.append(
                np.stack([np.full(len(ids), iteration), np.asarray(ids), np.asarray(tokens)], 1)
            )

    def batch_stretch(self, first_iteration: int, k: int, ids: np.ndarray) -> None:
        """k iterations in which every id computes one token."""
        if self.record_batches:
            its = np.repeat(np.arange(first_iteration, first_iteration + k), len(ids))
            self._batch.append(np.stack([its, np.tile(ids, k), np.ones(len(its), np.int64)], 1))

    def preempted(self, iteration: int, rid: int) -> None:
        if self.record_batches:
            self._preempted.append((iteration, rid))

    def timeseries(self) -> np.ndarray:
        """All iterations so far, one row each (columns as TIMESERIES_COLUMNS)."""
        chunks: list[np.ndarray] = []
        rows: list[tuple] = []
        for item in self._items:
            if isinstance(item, tuple) and len(item) == len(TIMESERIES_COLUMNS):
                rows.append(item)
                continue
            if rows:
                chunks.append(np.asarray(rows, dtype=np.float64))
                rows = []
            chunks.append(_expand(item))
        if rows:
            chunks.append(np.asarray(rows, dtype=np.float64))
        if not chunks:
            return np.empty((0, len(TIMESERIES_COLUMNS)))
        merged = np.concatenate(chunks)
        self._items = [merged]  # read again later: start from the merged rows
        return merged

    def batch_log(self) -> tuple[np.ndarray, np.ndarray]:
        """(iteration, request id, tokens) rows and (iteration, request id) preemptions."""
        log = np.concatenate(self._batch) if self._batch else np.empty((0, 3), np.int64)
        return log.astype(np.int64), np.asarray(self._preempted, dtype=np.int64).reshape(-1, 2)


def _expand(chunk: np.ndarray | tuple) -> np.ndarray:
    """Rows of a chunk: already rows, or a decode stretch kept as its varying columns."""
    if isinstance(chunk, np.ndarray):
        return chunk
    starts, durations, kv_used, num_waiting, num_running = chunk
    rows = np.empty((len(starts), len(TIMESERIES_COLUMNS)))
    rows[:, 0], rows[:, 1], rows[:, 4] = starts, durations, kv_used
    rows[:, 2], rows[:, 3] = num_waiting, num_running
    # tokens = decodes = running; no prefill tokens, no preemptions
    rows[:, 5], rows[:, 6], rows[:, 7], rows[:, 8] = num_running, 0, num_running, 0
    return rows
