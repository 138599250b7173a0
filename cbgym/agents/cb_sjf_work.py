"""CB-SJF-Work: shortest estimated total work first, content-blind (the study's policy)."""

from __future__ import annotations

import numpy as np

from cbgym.agents.base import QueueView
from cbgym.agents.work import PRIOR_OUTPUT_TOKENS, WorkKeyPolicy, estimated_output

ESTIMATORS = ("bucket", "global")


class CBSJFWork(WorkKeyPolicy):
    """Admit the request with the least estimated work ``c_f + c_p x + c_d yhat`` first.

    ``x`` is ``prompt_tokens``; ``yhat`` is content-blind (see
    :func:`cbgym.agents.work.estimated_output`): the recent mean output of completed requests
    with a prompt in the same bucket (``recent_output_by_bucket``; ``estimator="global"``:
    ``recent_output_mean`` only), 128 tokens before any completion, and at least
    ``num_generated + 1``. Keys are seconds of work priced by the engine's cost model. Not
    privileged.

    The study's own key, ``yhat`` from its learned predictor, is
    :class:`cbgym.agents.predicted.CBSJFWorkPred`: ``make_policy("cb-sjf-work:hgb")`` (or
    ``"cb-sjf-work:FILE"``) builds it.

    Args:
        estimator: ``"bucket"`` (default) or ``"global"``.
    """

    name = "cb-sjf-work"
    uses_output_stats = True
    # The keys move only when a request completes (the output statistic changes); nothing
    # else about a waiting request's key changes with time. So ask when the queue changed or
    # a request finished: the fast path then ranks with the same statistic the env agent,
    # which recomputes keys at every step, sees.
    consult = "on_completion"

    def __init__(self, estimator: str = "bucket",
                 prior_output_tokens: float = PRIOR_OUTPUT_TOKENS) -> None:
        if estimator not in ESTIMATORS:
            raise ValueError(f"policy {self.name!r}: estimator must be one of "
                             f"{', '.join(ESTIMATORS)} (the learned predictor: "
                             "'cb-sjf-work:hgb', 'cb-sjf-work-pred-aging:hgb,W'); got "
                             f"{estimator!r}")
        self.estimator = estimator
        self.prior_output_tokens = float(prior_output_tokens)
        self.label = self.name if estimator == "bucket" else f"{self.name}:{estimator}"

    def keys(self, view: QueueView) -> np.ndarray:
        yhat = estimated_output(view, self.estimator, self.prior_output_tokens)
        return self.coef.work(view.prompt_tokens, yhat)
