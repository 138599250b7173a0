"""Perfect-information upper bounds: rank by the true output length (privileged)."""

from __future__ import annotations

import numpy as np

from cbgym.agents.base import QueueView
from cbgym.agents.work import WorkKeyPolicy


def _true_output(view: QueueView) -> np.ndarray:
    if view.true_output_tokens is None:  # the env built a content-blind view for an oracle
        raise ValueError("an oracle policy needs QueueView.true_output_tokens (privileged view)")
    return view.true_output_tokens


class OracleWork(WorkKeyPolicy):
    """Admit the request with the least true work ``c_f + c_p x + c_d y`` first.

    Uses ``prompt_tokens`` and ``true_output_tokens``; privileged (an upper bound for
    CB-SJF-Work, which differs only in estimating ``y``). Keys in seconds of work.
    """

    name = "oracle-work"
    static_key = True
    privileged = True

    def keys(self, view: QueueView) -> np.ndarray:
        return self.coef.work(view.prompt_tokens, _true_output(view))


class OracleSJF(WorkKeyPolicy):
    """Admit the request with the shortest true output first (key: output tokens).

    Uses ``true_output_tokens`` only; privileged.
    """

    name = "oracle-sjf"
    static_key = True
    privileged = True

    def keys(self, view: QueueView) -> np.ndarray:
        return _true_output(view).astype(np.float64)

    def key_unit_s(self) -> float:
        return self.coef.decode_seq_s  # an output token is worth c_d seconds of work
