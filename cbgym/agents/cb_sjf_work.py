"""CB-SJF-Work: shortest estimated total work first, content-blind (the study's policy)."""

from __future__ import annotations

import numpy as np

from cbgym.agents.base import QueueView
from cbgym.agents.params import parse_choice
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

    ``estimator="hgb"`` (or a predictor file) is the study's own key, ``yhat`` from its
    learned predictor: ``cb-sjf-work:hgb`` builds a
    :class:`cbgym.agents.predicted.CBSJFWorkPred`.

    Args:
        estimator: ``"bucket"`` (default), ``"global"``, or ``"hgb"`` / a predictor file.
    """

    name = "cb-sjf-work"
    uses_output_stats = True
    # The keys move only when a request completes (the output statistic changes); nothing
    # else about a waiting request's key changes with time. So ask when the queue changed or
    # a request finished: the fast path then ranks with the same statistic the env agent,
    # which recomputes keys at every step, sees.
    consult = "on_completion"

    def __new__(cls, estimator: str = "bucket", *args: object) -> CBSJFWork:
        if cls is CBSJFWork and estimator not in ESTIMATORS:  # the learned predictor's key
            from cbgym.agents.predicted import CBSJFWorkPred

            return CBSJFWorkPred(estimator)  # type: ignore[return-value]
        return super().__new__(cls)

    def __init__(self, estimator: str = "bucket",
                 prior_output_tokens: float = PRIOR_OUTPUT_TOKENS) -> None:
        self.estimator = parse_choice(estimator, self.name, "estimator", ESTIMATORS)
        self.prior_output_tokens = float(prior_output_tokens)
        self.label = self.name if estimator == "bucket" else f"{self.name}:{estimator}"

    def keys(self, view: QueueView) -> np.ndarray:
        yhat = estimated_output(view, self.estimator, self.prior_output_tokens)
        return self.coef.work(view.prompt_tokens, yhat)
