"""SJF-Ctx: shortest prompt first (the prefill proxy; exactly observable at admission)."""

from __future__ import annotations

import numpy as np

from cbgym.agents.base import QueueView
from cbgym.agents.work import WorkKeyPolicy


class SJFCtx(WorkKeyPolicy):
    """Admit the request with the fewest prompt tokens first (ties in queue order).

    Key: ``prompt_tokens`` (tokens). Content-blind, not privileged; a fixed key per request,
    so the engine consults it only when the waiting set changes.
    """

    name = "sjf-ctx"
    static_key = True

    def keys(self, view: QueueView) -> np.ndarray:
        return view.prompt_tokens.astype(np.float64)

    def key_unit_s(self) -> float:
        return self.coef.prefill_token_s  # a prompt token is worth c_p seconds of work
