"""LJF-Work: longest estimated work first, a control that leaves arrival order the other way."""

from __future__ import annotations

import numpy as np

from cbgym.agents.base import QueueView
from cbgym.agents.cb_sjf_work import CBSJFWork


class LJFWork(CBSJFWork):
    """Admit the request with the MOST estimated work first: the negated CB-SJF-Work key.

    Same fields, estimator and consult rule as :class:`CBSJFWork`; not privileged. With
    random order it isolates the tail cost of leaving FCFS from shortest-first ordering.
    """

    name = "ljf-work"

    def keys(self, view: QueueView) -> np.ndarray:
        return -super().keys(view)
