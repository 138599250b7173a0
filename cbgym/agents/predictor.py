"""The CB-SJF-Work study's learned output-length predictor, trained once and frozen.

The study fits scikit-learn's ``HistGradientBoostingRegressor`` on ``log1p(output length)``
over content-blind features (:mod:`cbgym.agents.predictor_features`), with ``max_iter=300,
learning_rate=0.08, max_depth=8, min_samples_leaf=200, l2_regularization=1.0`` (its
``src/predictor.py``), on an earlier, disjoint part of the same trace. :func:`train` does the
same on a trace's leading ``train_fraction`` of requests, and exports the fitted trees as
plain arrays: a :class:`Predictor` is data (``.npz`` of numbers plus a JSON string, loaded
with ``allow_pickle=False``), never pickled code, and predicts without scikit-learn, in a
compiled tree walk. Training needs the optional extra: ``pip install "cbgym[predict]"``.

Training rows: the features a policy would see, so the predictor learns the inputs it will
be given. The training split is served once under FCFS on the given engine and load, and
each request's features are taken at its arrival in that run (completions before it only).
The metadata records the split (trace, rows, wall-clock range), the run, the fit's settings
and its accuracy on the rest of the trace (MAE in tokens, Spearman rank correlation,
pairwise ordering accuracy), measured the same way.
"""

from __future__ import annotations

import json
import math
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cbgym.agents.predictor_features import FEATURES, is_code_trace, run_features
from cbgym.engine.jit import kernel

HYPERPARAMETERS = {"max_iter": 300, "learning_rate": 0.08, "max_depth": 8,
                   "min_samples_leaf": 200, "l2_regularization": 1.0}  # the study's
SHIPPED = Path(__file__).resolve().parent / "predictors"
_ARRAYS = ("feature", "threshold", "missing_left", "left", "right", "leaf", "value",
           "tree_start", "fill", "train_clock")


@kernel
def _raw(X: np.ndarray, feature: np.ndarray, threshold: np.ndarray, missing_left: np.ndarray,
         left: np.ndarray, right: np.ndarray, leaf: np.ndarray, value: np.ndarray,
         tree_start: np.ndarray, baseline: float) -> np.ndarray:
    """The ensemble's raw prediction per row (a numeric split: left when x <= threshold,
    NaN as the tree learned; scikit-learn's rule)."""
    out = np.full(X.shape[0], baseline)
    for r in range(X.shape[0]):
        for t in range(len(tree_start) - 1):
            node = tree_start[t]
            while not leaf[node]:
                x = X[r, feature[node]]
                go_left = missing_left[node] if np.isnan(x) else x <= threshold[node]
                node = tree_start[t] + (left[node] if go_left else right[node])
            out[r] += value[node]
    return out


@dataclass(frozen=True, eq=False)
class Predictor:
    """A frozen ensemble of regression trees over :data:`FEATURES` (see module).

    Node arrays hold every tree back to back, tree ``t`` at ``tree_start[t]:tree_start[t+1]``
    with child indices relative to its start. ``fill``: each feature's training median,
    used where a statistic is undefined (fewer than 8 values). ``train_clock``: the recorded
    arrivals of the training split (empty without a wall clock), so that a run on them is
    recognised under any trace name. ``meta``: the training split, the run, the fit's
    settings and accuracy.
    """

    feature: np.ndarray
    threshold: np.ndarray
    missing_left: np.ndarray
    left: np.ndarray
    right: np.ndarray
    leaf: np.ndarray
    value: np.ndarray
    tree_start: np.ndarray
    fill: np.ndarray
    train_clock: np.ndarray
    baseline: float
    meta: dict[str, Any] = field(default_factory=dict)

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Predicted output lengths (tokens, >= 0) of feature rows ``X`` (NaNs filled)."""
        X = np.asarray(X, np.float64)
        if X.ndim != 2 or X.shape[1] != len(FEATURES):
            raise ValueError(f"Predictor.predict: X of shape {X.shape}, expected "
                             f"(n, {len(FEATURES)}) columns {FEATURES}")
        X = np.where(np.isnan(X), self.fill, X)
        raw = _raw(np.ascontiguousarray(X), self.feature, self.threshold, self.missing_left,
                   self.left, self.right, self.leaf, self.value, self.tree_start,
                   self.baseline)
        return np.maximum(np.expm1(raw), 0.0)

    def save(self, path: str | Path) -> Path:
        """Write ``path`` (.npz: the arrays and the metadata as a JSON string)."""
        path = Path(path)
        arrays = {k: getattr(self, k) for k in _ARRAYS}
        np.savez_compressed(path, baseline=np.float64(self.baseline),
                            meta=np.array(json.dumps(self.meta, sort_keys=True)), **arrays)
        return path if path.suffix == ".npz" else path.with_suffix(path.suffix + ".npz")

    @classmethod
    def load(cls, path: str | Path) -> Predictor:
        """Read a predictor :meth:`save` wrote (numbers and text only: no pickle)."""
        path = Path(path)
        try:
            with np.load(path, allow_pickle=False) as f:
                missing = [k for k in (*_ARRAYS, "baseline", "meta") if k not in f.files]
                if missing:
                    raise ValueError(f"{path}: not a cbgym predictor (no {', '.join(missing)})")
                arrays = {k: f[k] for k in _ARRAYS}
                pred = cls(**arrays, baseline=float(f["baseline"]),
                           meta=json.loads(str(f["meta"])))
        except (OSError, ValueError, zipfile.BadZipFile) as exc:  # (JSONDecodeError too)
            raise ValueError(f"{path}: cannot read a predictor: {exc}") from exc
        problem = pred.problem()
        if problem:
            raise ValueError(f"{path}: not a valid predictor: {problem}")
        return pred

    def problem(self) -> str | None:
        """What makes the node arrays unsafe to walk (the compiled walk checks nothing),
        or None."""
        n, starts = len(self.value), self.tree_start
        nodes = ("feature", "threshold", "missing_left", "left", "right", "leaf")
        if any(getattr(self, k).shape != (n,) for k in nodes):
            return f"node arrays of different lengths (value has {n})"
        if len(starts) < 2 or starts[0] != 0 or starts[-1] != n or np.any(np.diff(starts) < 1):
            return "tree_start is not 0 <= ... <= the node count, increasing"
        if self.fill.shape != (len(FEATURES),):
            return f"fill has shape {self.fill.shape}, expected ({len(FEATURES)},)"
        inner = ~self.leaf
        if np.any((self.feature[inner] < 0) | (self.feature[inner] >= len(FEATURES))):
            return f"a split on a feature outside 0..{len(FEATURES) - 1}"
        size = np.repeat(np.diff(starts), np.diff(starts))
        local = np.arange(n) - np.repeat(starts[:-1], np.diff(starts))
        for child in (self.left, self.right):  # children come after their parent: no cycle
            if np.any(inner & ((child <= local) | (child >= size))):
                return "a child index outside its tree, or not after its parent"
        return None

    @classmethod
    def shipped(cls, trace_name: str) -> Predictor:
        """The predictor shipped for catalogue trace ``trace_name`` (ValueError if none)."""
        path = SHIPPED / f"{source_name(trace_name)}.npz"
        if not path.is_file():
            have = sorted(p.stem for p in SHIPPED.glob("*.npz"))
            raise ValueError(f"no shipped predictor for trace {trace_name!r} (shipped: "
                             f"{', '.join(have)}); train one with cbgym.agents.predictor."
                             "train and pass its file")
        return cls.load(path)


def source_name(trace_name: str) -> str:
    """The trace a (load-scaled: ``"NAME@rho=0.9"``) trace was drawn from."""
    return trace_name.partition("@")[0].strip()


def _export(model: Any, fill: np.ndarray, meta: dict[str, Any],
            train_clock: np.ndarray | None = None) -> Predictor:
    """The fitted regressor's trees as arrays (scikit-learn's TreePredictor nodes)."""
    train_clock = np.zeros(0) if train_clock is None else np.asarray(train_clock, np.float64)
    trees = [p[0].nodes for p in model._predictors]
    starts = np.cumsum([0] + [len(t) for t in trees]).astype(np.int64)
    nodes = np.concatenate(trees)
    if nodes["is_categorical"].any():
        raise ValueError("categorical splits are not exported (the features are numeric)")
    return Predictor(
        feature=nodes["feature_idx"].astype(np.int64),
        threshold=nodes["num_threshold"].astype(np.float64),
        missing_left=nodes["missing_go_to_left"].astype(np.bool_),
        left=nodes["left"].astype(np.int64), right=nodes["right"].astype(np.int64),
        leaf=nodes["is_leaf"].astype(np.bool_), value=nodes["value"].astype(np.float64),
        tree_start=starts, fill=fill, train_clock=train_clock,
        baseline=float(np.ravel(model._baseline_prediction)[0]), meta=meta)


def features_of_run(trace: Any, engine: Any, load: float) -> tuple[np.ndarray, np.ndarray]:
    """Feature rows and true output lengths of ``trace`` served under FCFS on ``engine`` at
    ``load``: each row as a policy sees it at the request's arrival."""
    from cbgym.simulate import simulate

    res = simulate(trace, engine=engine, load=load)
    req = res.requests
    X = run_features(req["arrival_s"].to_numpy(), trace.prompt_tokens, trace.output_tokens,
                     req["finish_s"].to_numpy(), (req["status"] == "finished").to_numpy(),
                     trace.extra.get("epoch_s"), is_code_trace(trace.name))
    return X, trace.output_tokens.astype(np.float64)


def accuracy(y: np.ndarray, yhat: np.ndarray, seed: int = 0) -> dict[str, float]:
    """MAE (tokens), Spearman rank correlation and pairwise ordering accuracy (the share of
    random pairs of unequal lengths the prediction orders as the truth; the study's)."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    i, j = rng.integers(0, len(y), 200_000), rng.integers(0, len(y), 200_000)
    ok = y[i] != y[j]
    pairs = ((yhat[i] < yhat[j]) == (y[i] < y[j]))[ok]
    return {"mae_tokens": float(np.mean(np.abs(yhat - y))),
            "spearman": float(pd.Series(yhat).corr(pd.Series(y), method="spearman")),
            "pairwise_accuracy": float(pairs.mean()) if pairs.size else math.nan,
            "mean_true": float(y.mean()), "mean_predicted": float(yhat.mean()),
            "requests": len(y)}


def train(trace: Any, *, train_fraction: float = 0.4, engine: Any = "cbsjf-paper",
          load: float = 0.9, seed: int = 0) -> Predictor:
    """Fit the study's predictor on ``trace``'s first ``train_fraction`` of requests (see
    module); its accuracy is measured on the rest. Needs scikit-learn (``cbgym[predict]``)."""
    try:
        from sklearn import __version__ as sklearn_version
        from sklearn.ensemble import HistGradientBoostingRegressor
    except ImportError as exc:
        raise ImportError("training a predictor needs scikit-learn: "
                          'pip install "cbgym[predict]"') from exc
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"train_fraction={train_fraction!r}: expected a fraction in (0, 1)")
    n = len(trace)
    n_train = int(n * train_fraction)
    if n_train < 1000 or n - n_train < 100:
        raise ValueError(f"trace {trace.name!r} of {n} requests: too short to train on "
                         f"{train_fraction:g} of it (needs 1000 training and 100 later rows)")
    head, rest = trace.window(0, n_train), trace.window(n_train, n - n_train)
    X, y = features_of_run(head, engine, load)
    fill = np.nan_to_num(np.nanmedian(np.where(np.isnan(X).all(0), 0.0, X), axis=0))
    # (no early stopping: above 10,000 rows scikit-learn's "auto" would hold 10% out and
    # maybe stop before max_iter)
    model = HistGradientBoostingRegressor(**HYPERPARAMETERS, early_stopping=False,
                                          random_state=seed)
    model.fit(np.where(np.isnan(X), fill, X), np.log1p(y))
    clock = trace.extra.get("epoch_s")
    meta: dict[str, Any] = {
        "features": list(FEATURES), "trace": source_name(trace.name), "train_rows": [0, n_train],
        "train_clock_s": None if clock is None else [float(clock[0]), float(clock[n_train - 1])],
        "run": {"policy": "fcfs", "engine": str(engine), "load": load},
        "hyperparameters": HYPERPARAMETERS, "early_stopping": False,
        "iterations": int(model.n_iter_), "seed": seed, "sklearn": sklearn_version,
        "target": "log1p(output_tokens)"}
    pred = _export(model, fill, meta, None if clock is None else clock[:n_train])
    Xr, yr = features_of_run(rest, engine, load)
    meta["train_accuracy"] = accuracy(y, pred.predict(X), seed)
    meta["held_out_accuracy"] = accuracy(yr, pred.predict(Xr), seed)
    meta["held_out_rows"] = [n_train, n]
    return pred


__all__ = ["HYPERPARAMETERS", "Predictor", "source_name", "accuracy", "features_of_run", "train"]
