"""Policies that rank by a learned output-length prediction (the study's SJF-Pred and
CB-SJF-Work with its predictor, ``cb-sjf-work:hgb``).

Each request's prediction is made once, at the first decision point that sees it waiting,
from its features at its arrival (:func:`cbgym.agents.predictor_features.arrival_features`:
completions before it only), and then stays fixed, as the study's per-request ``yhat``. A
request's key therefore never changes once made, and the policy is consulted only when the
waiting set changes (``on_change``).

The predictor is frozen: trained on a trace's leading split (its metadata says which), and a
run whose requests fall inside that split is refused, so no evaluation window is one the
predictor saw. On the env, :class:`cbgym.env.agents.EnvAgent` plays them from the
observation's per-slot features at arrival (``arrival_features=True``:
:mod:`cbgym.env.arrival_obs`), predicting what the fast path predicts.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from cbgym.agents.base import QueueView, view_from_decision_point
from cbgym.agents.predictor import Predictor, source_name
from cbgym.agents.predictor_features import arrival_features, completions, is_code_trace
from cbgym.agents.work import WorkKeyPolicy
from cbgym.engine.decision import DecisionPoint, PolicyContext
from cbgym.workload.trace import Trace

SHIPPED_NAME = "hgb"  # the predictor shipped for the run's trace


def load_predictor(spec: str, trace_name: str | None, policy: str) -> Predictor:
    """``"hgb"``: the shipped predictor of trace ``trace_name``; else a predictor file."""
    if spec == SHIPPED_NAME:
        if trace_name is None:
            raise ValueError(f"policy {policy!r}: the run does not name its trace, so no "
                             "shipped predictor can be chosen; give a predictor file")
        return Predictor.shipped(trace_name)
    if not Path(spec).is_file():
        raise ValueError(f"policy {policy!r}: predictor {spec!r} is neither "
                         f"{SHIPPED_NAME!r} (the shipped one) nor a file")
    return Predictor.load(spec)


class TrainingSplitError(ValueError):
    """A run would evaluate a predictor policy on requests its predictor was trained on."""


def check_held_out(pred: Predictor, ctx: PolicyContext, policy: str) -> None:
    """A :class:`TrainingSplitError` if the run serves requests of the predictor's training
    split: a recorded arrival (``PolicyContext.clock_s``) among the split's, under any trace
    name; or if the run, on the predictor's own trace, has no recorded arrivals to check."""
    meta, clock, seen = pred.meta, ctx.clock_s, pred.train_clock
    if not len(seen):
        return  # trained on a trace without a recorded clock: nothing to recognise it by
    if clock is None:
        if ctx.trace_name is not None and source_name(ctx.trace_name) != meta.get("trace"):
            return
        raise TrainingSplitError(
            f"policy {policy!r}: this run's requests have no recorded clock "
            "(PolicyContext.clock_s), so they cannot be checked against the predictor's "
            f"training split (trace {meta.get('trace')!r})")
    inside = np.isin(np.asarray(clock, np.float64), seen)
    if inside.any():
        raise TrainingSplitError(
            f"policy {policy!r}: {int(inside.sum())} of this run's {len(clock)} requests are "
            f"in the predictor's training split (trace {meta['trace']!r}, rows "
            f"{meta['train_rows'][0]}..{meta['train_rows'][1] - 1}); evaluate on later "
            "requests (cbgym simulate --start, cbgym bench --window-range)")


class PredictedOutput(WorkKeyPolicy):
    """A key policy whose view carries each waiting request's predicted output length."""

    uses_output_stats = False

    def __init__(self, predictor: str = SHIPPED_NAME) -> None:
        self.predictor_spec = str(predictor)
        if self.predictor_spec != SHIPPED_NAME and not Path(self.predictor_spec).is_file():
            raise ValueError(f"policy {self.name!r}: predictor must be {SHIPPED_NAME!r} (the "
                             "one shipped for the run's trace) or a predictor file; got "
                             f"{self.predictor_spec!r}")

    def check_trace(self, trace: Trace) -> None:
        pred = load_predictor(self.predictor_spec, trace.name, self.name)
        ctx = PolicyContext(config=None, num_requests=len(trace), seed=0,  # type: ignore[arg-type]
                            trace_name=trace.name, clock_s=trace.extra.get("epoch_s"))
        check_held_out(pred, ctx, self.name)

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)
        self.predictor = load_predictor(self.predictor_spec, ctx.trace_name, self.name)
        check_held_out(self.predictor, ctx, self.name)
        self._code = is_code_trace(ctx.trace_name or "")
        self._clock = ctx.clock_s
        self._yhat = np.full(ctx.num_requests, np.nan)

    def view(self, dp: DecisionPoint) -> QueueView:
        if dp.finish_s is None:
            raise ValueError(f"policy {self.name!r} needs the decision point's finish_s")
        ids = dp.waiting
        new = ids[np.isnan(self._yhat[ids])]
        if len(new):
            done_t, done_out = completions(dp.finished, dp.finish_s, dp.num_generated,
                                           float(dp.arrival_s[new].min()))
            X = arrival_features(new, dp.arrival_s, dp.prompt_tokens, self._clock, self._code,
                                 done_t, done_out)
            self._yhat[new] = self.predictor.predict(X)
        return replace(view_from_decision_point(dp, self._true_output, False),
                       predicted_output=self._yhat[ids])

    def predicted(self, view: QueueView) -> np.ndarray:
        """The view's predicted output lengths, at least what each request already made."""
        if view.predicted_output is None:
            raise ValueError(f"policy {self.name!r} ranks by per-request predictions made at "
                             "arrival, which the env's observation does not carry: run it "
                             "with cbgym.simulate or cbgym bench")
        return np.maximum(view.predicted_output, np.asarray(view.num_generated) + 1.0)


class SJFPred(PredictedOutput):
    """SJF-Pred: admit the request with the shortest predicted output first (the study's
    ablation: the predictor alone). Key: predicted output tokens. Not privileged.

    Args:
        predictor: ``"hgb"`` (the predictor shipped for the run's trace) or a predictor file.
    """

    name = "sjf-pred"
    consult = "on_change"

    def keys(self, view: QueueView) -> np.ndarray:
        return self.predicted(view)

    def key_unit_s(self) -> float:
        return self.coef.decode_seq_s  # an output token is worth c_d seconds of work


class CBSJFWorkPred(PredictedOutput):
    """CB-SJF-Work as the study runs it: least ``c_f + c_p x + c_d yhat`` first, ``yhat``
    from the learned predictor (spec ``cb-sjf-work:hgb``, or ``cb-sjf-work:FILE``). Not
    privileged.

    Args:
        predictor: ``"hgb"`` (the predictor shipped for the run's trace) or a predictor file.
    """

    name = "cb-sjf-work-pred"
    consult = "on_change"

    def __init__(self, predictor: str = SHIPPED_NAME) -> None:
        if predictor != SHIPPED_NAME and not Path(str(predictor)).is_file():
            raise ValueError(f"policy {self.name!r} (cb-sjf-work:ESTIMATOR): estimator must be "
                             f"one of bucket, global, {SHIPPED_NAME} or a predictor file; got "
                             f"{predictor!r}")
        super().__init__(predictor)
        self.label = f"cb-sjf-work:{self.predictor_spec}"

    def keys(self, view: QueueView) -> np.ndarray:
        return self.coef.work(view.prompt_tokens, self.predicted(view))


__all__ = ["CBSJFWorkPred", "PredictedOutput", "SJFPred", "TrainingSplitError", "check_held_out",
           "load_predictor"]
