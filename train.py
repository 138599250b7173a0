"""Train a learned scheduler against goodput; evaluate it on held-out trace windows.

Docs: docs/learned.md. stable-baselines3 PPO on ``cbgym/Scheduling-v0`` (one score per slot)
or sb3-contrib MaskablePPO on ``cbgym/SchedulingMasked-v0`` (micro-steps), written to read top
to bottom like cleanrl's ``ppo.py``:

    python train.py                                  # the documented default run (~3 min)
    python train.py --task conv-study-overload --imitate cb-sjf-work-shed:28   # a task
    python train.py --total-timesteps 256 --output-dir /tmp/smoke --eval-freq 0
    python train.py --resume-from runs/default/checkpoints/model_100000_steps.zip
    tensorboard --logdir runs

Training episodes are windows drawn from the first ``train_fraction`` of the trace's requests;
every evaluation replays fixed windows from the rest (a later time range, never trained on)
through ``cbgym.simulate`` with the ``learned`` policy next to FCFS and CB-SJF-Work on the very
same windows (common random numbers; the baselines are scored once). Evaluation is always on
pure goodput, whatever shaping the training reward uses.

Outputs in ``output_dir``: ``model.zip`` (full, resumable), ``policy.zip`` (compact, no
optimizer state: what ``learned:PATH`` and the shipped checkpoints use), ``config.json``,
``evaluation.json``, ``evaluations.json`` (the periodic evaluations), ``checkpoints/`` and
TensorBoard logs in ``tb/``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import json
import os
import platform
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import cbgym
from cbgym import SLO, EngineConfig, Trace
from cbgym.agents.learned import META_KEY, LearnedPolicy
from cbgym.metrics import SLOSpec, slo_to_dict


@dataclass
class Args:
    # --- experiment
    output_dir: str = "runs/default"
    """where the model, its configuration, evaluations, checkpoints and logs go"""
    seed: int = 1
    """seed of the environments' episode draws and of the network initialisation"""
    torch_threads: int = 0
    """torch threads for the updates (0: one per CPU; collection and updates take turns with
    the env's threads)"""
    progress_bar: bool = True
    """show a tqdm progress bar"""
    resume_from: str = ""
    """a model.zip or checkpoint to continue training from (same algorithm)"""

    # --- environment
    task: str = ""
    """a benchmark task (cbgym.tasks, e.g. conv-study-overload): it fixes the trace, engine,
    training loads, SLO, window size, split, shed rule and cap score (training on its
    train windows; the periodic and final evaluations on its validation windows at its test
    load, never its test windows): --trace --engine --load --ttft-slo --tpot-slo
    --episode-requests --train-fraction --eval-loads --eval-windows --shed-rule
    --admission-cap are then refused; score the result with `cbgym evaluate`"""
    env_id: str = "cbgym/Scheduling-v0"
    """cbgym/Scheduling-v0 (PPO, slot scores) or cbgym/SchedulingMasked-v0 (MaskablePPO)"""
    trace: str = "azure-conv-2023"
    """trace name or path (falls back to synthetic-conv when the named trace is unavailable)"""
    engine: str = "cbsjf-paper"
    """engine preset (see EngineConfig): the CB-SJF-Work study's engine by default"""
    load: tuple[float, ...] = (0.8, 1.1)
    """offered load rho: one value, or lo hi to draw each training episode's load uniformly"""
    ttft_slo: float = 2.0
    """TTFT target in seconds (the study's default)"""
    tpot_slo: float = 0.1
    """TPOT target in seconds (the study's default)"""
    episode_requests: int = 512
    """requests per training episode (one trace window)"""
    train_fraction: float = 0.7
    """training windows come from the first train_fraction of the requests, evaluation from
    the rest"""
    train_from: float = 0.0
    """training windows lie at or after this fraction of the requests (below the train
    split; a task's too): only the most recent training requests, nearer the held-out ones"""
    K: int = 16
    """visible waiting slots"""
    R: int = 32
    """visible running slots"""
    window_rule: str = "oldest"
    """which waiting requests the K slots show: oldest or smallest_prompt"""
    hold_threshold: float = -0.5
    """waiting-slot scores below it hold the request back this iteration"""
    shed_threshold: float = -0.51
    """waiting-slot scores at or below it shed the request if it already missed its TTFT (the
    env's default, -0.99, is rarely explored by a Gaussian policy: see docs/learned.md)"""
    shed_rule: str = "late"
    """which requests a shed score sheds: late (waited past the TTFT target) or unreachable
    (waited + own prefill at the engine's cost past it); a task sets its own"""
    admission_cap: bool = False
    """append the running-cap score to the action (admission control; a task sets its own)"""
    ttft_miss_weight: float = 0.0
    """training-only shaping: weight of the penalty when a TTFT deadline passes unmet"""
    shed_weight: float = 0.0
    """training-only shaping: weight of the penalty per shed request"""
    latency_weight: float = 0.0
    """training-only shaping: weight of minus the request-seconds in system"""

    # --- algorithm
    total_timesteps: int = 750_000
    """environment steps to train for (all environments together)"""
    num_envs: int = 32
    """environments stepped together by the native vector env (one compiled call per step;
    see cbgym/env/vector.py), fed to SB3 through cbgym.env.sb3"""
    env_threads: int = 0
    """numba threads stepping the environments (0: one per CPU, at most num_envs)"""
    policy: str = "slot"
    """slot (one shared scorer for every slot, see cbgym/agents/slot_net.py) or mlp
    (SB3's MultiInputPolicy over the flattened observation)"""
    net_arch: tuple[int, ...] = (64, 64)
    """hidden layers of the scorer and of the critic"""
    prefix_inputs: bool = True
    """with prefix_features (a prefix-caching task), each slot's score reads its cached,
    uncached and shared-block counts (slot policy; else only the critic does)"""
    batch_summary: bool = False
    """the slot scorer's context also reads the running batch (mean and max of a shared
    embedding of each running slot): the running cap can act on the batch's members"""
    learning_rate: float = 3e-4
    """Adam learning rate"""
    n_steps: int = 64
    """steps per environment per rollout (32 x 64: 2,048-step rollouts)"""
    batch_size: int = 256
    """minibatch size"""
    n_epochs: int = 4
    """optimisation epochs per rollout (750k steps x 4 epochs: the gradient work of the earlier
    300k x 10, with 2.5x the fresh samples)"""
    gamma: float = 0.99
    """discount factor"""
    gae_lambda: float = 0.95
    """GAE lambda"""
    clip_range: float = 0.2
    """PPO clipping coefficient"""
    ent_coef: float = 0.0
    """entropy bonus coefficient"""
    vf_coef: float = 0.5
    """value loss coefficient"""
    max_grad_norm: float = 0.5
    """gradient clipping norm"""
    target_kl: float = 0.0
    """stop a rollout's updates once the approximate KL to the rollout's policy passes this
    (SB3's target_kl; 0: never): keeps fine-tuning near a clone or a prior"""
    log_std_init: float = -1.0
    """initial log standard deviation of the Gaussian scores (PPO only)"""
    cap_log_std_init: float = -2.5
    """initial log standard deviation of the running-cap score (admission_cap): exploration
    noise on the cap ratchets the batch up (one high draw admits many, and they stay), so it
    starts narrower than the slot scores'"""

    # --- residual policy learning (cbgym/agents/slot_prior.py)
    prior: str = ""
    """a heuristic the policy's scores add to (cb-sjf-work-shed[:CAP], read from the
    observation): the network learns a residual from zero, so training starts from the
    heuristic exactly"""

    # --- behaviour-cloning warm start (cbgym/agents/imitation.py)
    imitate: str = ""
    """a fast-path policy to imitate before PPO (e.g. cb-sjf-work-shed:28): its decisions on
    the training env become score targets for the network (and its returns the critic's)"""
    imitate_steps: int = 100_000
    """env steps of demonstrations"""
    imitate_epochs: int = 5
    """passes over the demonstrations"""

    # --- evaluation and checkpoints
    eval_freq: int = 250_000
    """evaluate on the held-out windows every this many steps (0: only at the end)"""
    eval_windows: int = 8
    """held-out windows per load (evenly spaced over the last 1 - train_fraction)"""
    eval_loads: tuple[float, ...] = (0.9, 1.0)
    """offered loads of the held-out evaluation"""
    eval_baselines: tuple[str, ...] = ("fcfs", "cb-sjf-work", "cb-sjf-work-shed", "oracle-work")
    """baselines scored on the same windows (once)"""
    checkpoint_freq: int = 50_000
    """save a checkpoint every this many steps (0: none)"""
    time_budget_min: float = 14.0
    """stop training after this many minutes from the start of the script, then evaluate and
    save as usual (0: no limit); keeps the default run within 15 minutes on a busy machine"""


# ----------------------------------------------------------------------------- arguments
def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each dataclass field (what tyro shows as --help)."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, nxt in zip(body, body[1:], strict=False):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)):
            docs[node.target.id] = " ".join(str(nxt.value.value).split())
    return docs


def parse_args(argv: list[str] | None = None) -> Args:
    """Args from the command line: ``--total-timesteps 1000``, ``--load 0.8 1.1``, ..."""
    docs = field_docs(Args)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for f in dataclasses.fields(Args):
        flag = "--" + f.name.replace("_", "-")
        default = f.default
        kind = str(f.type)
        if kind == "bool":
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default,
                                help=docs.get(f.name))
        elif kind.startswith("tuple"):
            item = float if "float" in kind else int if "int" in kind else str
            parser.add_argument(flag, nargs="+", type=item, default=default,
                                help=docs.get(f.name))
        else:
            item = {"int": int, "float": float}.get(kind, str)
            parser.add_argument(flag, type=item, default=default, help=docs.get(f.name))
    ns = parser.parse_args(argv)
    for name in ("num_envs", "n_steps", "batch_size", "n_epochs", "episode_requests"):
        if getattr(ns, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if ns.imitate:
        from cbgym.bench import check_policy

        if "Masked" in ns.env_id:
            parser.error("--imitate: demonstrations are score vectors (cbgym/Scheduling-v0)")
        try:
            check_policy(ns.imitate)
        except ValueError as exc:
            parser.error(f"--imitate: {exc}")
    if ns.batch_summary and (ns.policy != "slot" or ns.resume_from):
        parser.error("--batch-summary: an input of the slot scorer (--policy slot), fixed "
                     "when a policy is built (not with --resume-from, which keeps its own)")
    if ns.prior:
        if "Masked" in ns.env_id or ns.policy != "slot":
            parser.error("--prior: a residual on the slot scores (cbgym/Scheduling-v0, "
                         "--policy slot)")
        if ns.imitate:
            parser.error("--prior and --imitate: the prior is the start; choose one")
        from cbgym.agents.slot_prior import PRIOR_POLICIES

        if ns.prior.partition(":")[0] not in PRIOR_POLICIES:
            parser.error(f"--prior {ns.prior!r}: expected one of {', '.join(PRIOR_POLICIES)} "
                         "(optionally :CAP)")
    if ns.shed_rule not in ("late", "unreachable"):
        parser.error(f"--shed-rule {ns.shed_rule!r}: expected late or unreachable")
    for name in ("env_threads", "torch_threads", "total_timesteps", "target_kl"):
        if getattr(ns, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0")
    args = Args(**{k: tuple(v) if isinstance(v, list) else v for k, v in vars(ns).items()})
    if args.task:
        from cbgym.tasks import TASKS

        if args.task not in TASKS:
            parser.error(f"--task {args.task!r}: expected one of {', '.join(TASKS)}")
        defaults = Args()
        for name in TASK_FIXED:  # a flag the task would silently replace is an error
            if getattr(args, name) != getattr(defaults, name):
                parser.error(f"--{name.replace('_', '-')} is fixed by --task {args.task}; "
                             "leave it out (or train without --task)")
        args = with_task(args)
    if not 0.0 <= args.train_from < args.train_fraction:  # (a task's split by now)
        parser.error(f"--train-from {args.train_from}: expected a fraction in "
                     f"[0, {args.train_fraction}) (training windows lie before the train split)")
    return args


# what --task fixes; the shed and hold thresholds stay the policy's own (recorded in its
# checkpoint: -0.51 by default, as the default run found PPO needs, where the task env's
# random actions use the env's -0.99)
TASK_FIXED = ("trace", "engine", "load", "ttft_slo", "tpot_slo", "episode_requests",
              "train_fraction", "eval_loads", "eval_windows", "shed_rule", "admission_cap")


def with_task(args: Args) -> Args:
    """``args`` with the settings its task fixes."""
    from cbgym.tasks import get

    t = get(args.task)
    load = t.train_load if isinstance(t.train_load, tuple) else (t.train_load,)
    # (a task with SLO classes keeps its map: run_slo)
    slo = {"ttft_slo": t.slo.ttft_s, "tpot_slo": t.slo.tpot_s} if isinstance(t.slo, SLO) \
        else {}
    return dataclasses.replace(args, trace=t.trace, engine=t.engine, load=tuple(load),
                               eval_windows=t.window_count("validation"), **slo,
                               episode_requests=t.episode_requests, train_fraction=t.splits[0],
                               eval_loads=(t.test_load,),
                               shed_rule=t.env.get("shed_rule", "late"),
                               # the masked variant caps its admissions by STOP
                               admission_cap=bool(t.env.get("admission_cap", False))
                               and not is_masked(args),
                               eval_baselines=tuple(dict.fromkeys(
                                   (*args.eval_baselines, *t.references))))


# ----------------------------------------------------------------------------- environment
def load_base_trace(name: str, task: str = "") -> Trace:
    """The trace to draw windows from; synthetic-conv if the named one cannot be had (never
    for a task: it would not be the task)."""
    from cbgym.workload import load_trace
    from cbgym.workload.catalog import TraceNotFoundError

    if task:
        return load_trace(name, download=False)
    try:
        return load_trace(name, download=False)
    except TraceNotFoundError as exc:
        print(f"[train] {name} unavailable ({exc.__class__.__name__}); using synthetic-conv",
              file=sys.stderr)
        return load_trace("synthetic-conv")


def engine_config(args: Args) -> EngineConfig:
    """The engine: the preset, with the task's further settings (e.g. its KV capacity)."""
    if args.task:
        from cbgym.tasks import get

        return get(args.task).engine_config()
    return EngineConfig(preset=args.engine)


def split_index(args: Args, trace: Trace) -> int:
    """First request of the held-out range."""
    return int(len(trace) * args.train_fraction)


def env_kwargs(args: Args, trace: Trace, engine: EngineConfig, mu: float) -> dict[str, Any]:
    """Keyword arguments of the training environments."""
    load = args.load[0] if len(args.load) == 1 else (args.load[0], args.load[1])
    lo, hi = int(len(trace) * args.train_from), split_index(args, trace)
    if hi - lo < args.episode_requests:
        raise ValueError(f"the training range [{lo}, {hi}) of {len(trace)} requests cannot hold "
                         f"one window of {args.episode_requests}: lower --train-from "
                         f"({args.train_from})")
    kwargs = {
        "trace": trace, "load": load, "engine": engine,
        "episode_requests": args.episode_requests,
        "window_start_range": (lo, hi),
        "slo": run_slo(args), "K": args.K, "R": args.R,
        "window_rule": args.window_rule, "hold_threshold": args.hold_threshold,
        "shed_threshold": args.shed_threshold, "shed_rule": args.shed_rule,
        "admission_cap": args.admission_cap, "ttft_miss_weight": args.ttft_miss_weight,
        "shed_weight": args.shed_weight, "latency_weight": args.latency_weight,
        "capacity_rps": mu,
    }
    if args.task:  # the task's env settings, under what the flags set (thresholds, K, R)
        from cbgym.tasks import get

        kwargs = {**get(args.task).env, **kwargs}
    return kwargs


def run_slo(args: Args) -> SLOSpec:
    """The run's SLO: its task's (one SLO, or one per SLO class), else the flags'."""
    if args.task:
        from cbgym.tasks import get

        slo = get(args.task).slo
        if not isinstance(slo, SLO):
            return slo
    return SLO(args.ttft_slo, args.tpot_slo)


def model_meta(args: Args) -> dict[str, Any]:
    """What the ``learned`` policy needs to rebuild the env's view (saved inside the zip)."""
    return {
        "algo": "maskable_ppo" if is_masked(args) else "ppo", "env_id": args.env_id,
        "window_rule": args.window_rule, "hold_threshold": args.hold_threshold,
        "shed_threshold": args.shed_threshold, "shed_rule": args.shed_rule,
        "slo": slo_to_dict(run_slo(args)), "engine": args.engine,
        "trace": args.trace, "train_fraction": args.train_fraction, "task": args.task,
    }


def is_masked(args: Args) -> bool:
    return "Masked" in args.env_id


# ----------------------------------------------------------------------------- evaluation
def eval_starts(args: Args, trace: Trace) -> list[int]:
    """Window starts evenly spaced over the held-out range (non-overlapping when it fits); a
    task's validation windows."""
    if args.task:
        from cbgym.tasks import get

        return get(args.task).starts(len(trace), "validation")
    lo, hi = split_index(args, trace), len(trace) - args.episode_requests
    if hi < lo:
        raise ValueError(f"the held-out range [{lo}, {len(trace)}) cannot hold one window of "
                         f"{args.episode_requests} requests: lower --train-fraction")
    return sorted({int(s) for s in np.linspace(lo, hi, args.eval_windows)})


def score(policy: Any, trace: Trace, starts: list[int], loads: tuple[float, ...], n: int,
          engine: EngineConfig, slo: SLO, mu: float) -> list[dict[str, Any]]:
    """One row per (load, window): goodput (requests meeting both SLOs) and friends."""
    rows = []
    for load in loads:
        for start in starts:
            res = cbgym.simulate(trace.window(start, n), policy, engine=engine, load=load,
                                 slo=slo, capacity_rps=mu)
            s = res.summary()
            rows.append({"load": load, "start": start,
                         "goodput": int(round(s["slo_attainment"] * s["num_requests"])),
                         "slo_attainment": s["slo_attainment"], "goodput_rps": s["goodput_rps"],
                         "num_shed": int(s["num_shed"])})
    return rows


def summarize(results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per load: mean and std of goodput per policy, and learned's paired margins."""
    out: dict[str, Any] = {}
    for load in sorted({r["load"] for rows in results.values() for r in rows}):
        per: dict[str, Any] = {}
        good = {p: np.array([r["goodput"] for r in rows if r["load"] == load], float)
                for p, rows in results.items()}
        att = {p: np.array([r["slo_attainment"] for r in rows if r["load"] == load])
               for p, rows in results.items()}
        for p in results:
            per[p] = {"goodput_mean": float(good[p].mean()), "goodput_std": float(good[p].std()),
                      "slo_attainment_mean": float(att[p].mean()),
                      "slo_attainment_std": float(att[p].std())}
        if "learned" in good:
            for p in results:
                if p == "learned":
                    continue
                d = good["learned"] - good[p]
                per[f"margin_vs_{p}"] = {"mean": float(d.mean()), "std": float(d.std()),
                                         "wins": int((d > 0).sum()), "ties": int((d == 0).sum()),
                                         "losses": int((d < 0).sum())}
        out[f"{load:g}"] = per
    return out


class HeldOutEval:
    """Scores a model on the held-out windows next to baselines scored once (same windows)."""

    def __init__(self, args: Args, trace: Trace, engine: EngineConfig, mu: float) -> None:
        self.args, self.trace, self.engine, self.mu = args, trace, engine, mu
        self.slo = run_slo(args)
        self.starts = eval_starts(args, trace)
        self.baselines = {p: self._score(p) for p in args.eval_baselines}

    def _score(self, policy: Any) -> list[dict[str, Any]]:
        return score(policy, self.trace, self.starts, self.args.eval_loads,
                     self.args.episode_requests, self.engine, self.slo, self.mu)

    def __call__(self, model: Any) -> dict[str, Any]:
        import torch

        threads = torch.get_num_threads()  # the learned policy acts on one thread
        try:
            results = {"learned": self._score(LearnedPolicy(model)), **self.baselines}
        finally:
            torch.set_num_threads(threads)
        return {"split": "validation" if self.args.task else "held-out",
                "windows": self.starts, "loads": list(self.args.eval_loads),
                "episode_requests": self.args.episode_requests,
                "slo": slo_to_dict(self.slo),
                "summary": summarize(results), "per_window": results}


# ----------------------------------------------------------------------------- callbacks
def make_callbacks(args: Args, evaluator: HeldOutEval, out: Path,
                   started: float) -> list[Any]:
    """Progress bar, episode statistics, held-out evaluation, checkpoints and the time budget
    (``started``: ``time.perf_counter()`` at the start of the script)."""
    from stable_baselines3.common.callbacks import BaseCallback, CheckpointCallback

    class ProgressBar(BaseCallback):
        """tqdm bar (SB3's own bar needs rich, which cbgym does not depend on)."""

        def _on_training_start(self) -> None:
            from tqdm import tqdm

            self.bar = tqdm(total=args.total_timesteps, initial=self.model.num_timesteps,
                            unit="step", dynamic_ncols=True)

        def _on_step(self) -> bool:
            self.bar.update(self.training_env.num_envs)
            return True

        def _on_training_end(self) -> None:
            self.bar.close()

    class EpisodeStats(BaseCallback):
        """charts/*: goodput and SLO attainment of finished training episodes (from info)."""

        def _on_training_start(self) -> None:
            n = self.training_env.num_envs
            self.good, self.shed, self.miss = np.zeros(n), np.zeros(n), np.zeros(n)

        def _on_step(self) -> bool:
            for i, (info, done) in enumerate(zip(self.locals["infos"], self.locals["dones"],
                                                 strict=True)):
                self.good[i] += info["num_good"]
                self.shed[i] += info["num_shed"]
                self.miss[i] -= info["reward_components"]["ttft_miss"]
                if done:
                    self.logger.record_mean("charts/episode_goodput", self.good[i])
                    self.logger.record_mean("charts/episode_slo_attainment",
                                            self.good[i] / args.episode_requests)
                    self.logger.record_mean("charts/episode_shed", self.shed[i])
                    self.logger.record_mean("charts/episode_ttft_misses", self.miss[i])
                    self.good[i] = self.shed[i] = self.miss[i] = 0.0
            return True

    class Evaluate(BaseCallback):
        """eval/*: the held-out evaluation every ``eval_freq`` steps; history to JSON."""

        def _on_training_start(self) -> None:
            self.last = self.model.num_timesteps
            self.history: list[dict[str, Any]] = []
            self.seconds = 0.0

        def _on_step(self) -> bool:
            if args.eval_freq > 0 and self.model.num_timesteps - self.last >= args.eval_freq:
                self.last = self.model.num_timesteps
                self.run()
            return True

        def run(self) -> dict[str, Any]:
            t0 = time.perf_counter()
            ev = evaluator(self.model)
            self.seconds += time.perf_counter() - t0
            for load, per in ev["summary"].items():
                for p in ("learned", *args.eval_baselines):
                    self.logger.record(f"eval/goodput_rho{load}/{p}", per[p]["goodput_mean"])
                self.logger.record(f"eval/margin_vs_fcfs_rho{load}",
                                   per.get("margin_vs_fcfs", {}).get("mean", float("nan")))
            self.history.append({"timesteps": self.model.num_timesteps,
                                 "summary": ev["summary"]})
            (out / "evaluations.json").write_text(json.dumps(self.history, indent=1))
            self.logger.dump(self.model.num_timesteps)
            return ev

    class TimeBudget(BaseCallback):
        """Ends ``learn`` once the wall-clock budget is spent (SB3 stops on False)."""

        expired = False

        def _on_step(self) -> bool:
            if args.time_budget_min > 0 and time.perf_counter() - started > (
                    60.0 * args.time_budget_min):
                self.expired = True
                return False
            return True

    callbacks: list[Any] = [EpisodeStats(), TimeBudget()]
    if args.checkpoint_freq > 0:  # before the evaluation: a checkpoint survives a failing one
        callbacks.append(CheckpointCallback(max(args.checkpoint_freq // args.num_envs, 1),
                                            str(out / "checkpoints"), name_prefix="model"))
    callbacks.append(Evaluate())
    if args.progress_bar:
        callbacks.append(ProgressBar())
    return callbacks


# ----------------------------------------------------------------------------- model
def build_model(args: Args, vec_env: Any, out: Path) -> Any:
    """A new PPO / MaskablePPO, or the one to resume."""
    from sb3_contrib import MaskablePPO
    from stable_baselines3 import PPO

    from cbgym.agents.slot_net import MaskableSlotPolicy, SlotPolicy

    algo = MaskablePPO if is_masked(args) else PPO
    if args.resume_from:
        model = algo.load(args.resume_from, env=vec_env, device="cpu",
                          tensorboard_log=str(out / "tb"))
        setattr(model, META_KEY, model_meta(args))
        return model
    policy_kwargs: dict[str, Any] = {"net_arch": list(args.net_arch)}
    if not is_masked(args):
        policy_kwargs["log_std_init"] = args.log_std_init
    if args.policy == "slot":
        policy: Any = MaskableSlotPolicy if is_masked(args) else SlotPolicy
        policy_kwargs["prefix_inputs"] = args.prefix_inputs
        if args.batch_summary:  # (absent otherwise: the zip stays loadable by older code)
            policy_kwargs["batch_summary"] = True
        if args.prior:
            from cbgym.agents.slot_prior import prior_spec, spec_dict

            policy_kwargs["prior"] = spec_dict(prior_spec(
                args.prior, engine_config(args), run_slo(args), args.hold_threshold,
                args.admission_cap))
    elif args.policy == "mlp":
        policy = "MultiInputPolicy"
    else:
        raise ValueError(f"--policy {args.policy!r}: expected slot or mlp")
    model = algo(policy, vec_env, learning_rate=args.learning_rate, n_steps=args.n_steps,
                 batch_size=args.batch_size, n_epochs=args.n_epochs, gamma=args.gamma,
                 gae_lambda=args.gae_lambda, clip_range=args.clip_range,
                 ent_coef=args.ent_coef, vf_coef=args.vf_coef,
                 max_grad_norm=args.max_grad_norm, target_kl=args.target_kl or None,
                 policy_kwargs=policy_kwargs,
                 tensorboard_log=str(out / "tb"), seed=args.seed, device="cpu", verbose=0)
    if args.admission_cap and not is_masked(args):
        import torch

        with torch.no_grad():  # the last action dimension is the running cap
            model.policy.log_std[-1] = args.cap_log_std_init
    # saved in the zip: the learned policy reads the thresholds, window rule and SLO from it
    setattr(model, META_KEY, model_meta(args))
    return model


def imitate(args: Args, model: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Behaviour cloning of ``args.imitate`` on the training env before PPO."""
    from cbgym.agents import make_policy
    from cbgym.agents.imitation import clone, demonstrate
    from cbgym.env.scheduling_env import SchedulingEnv

    t0 = time.perf_counter()
    demos = demonstrate(SchedulingEnv(**kwargs), make_policy(args.imitate), args.imitate_steps,
                        args.gamma, seed=args.seed)
    fit = clone(model.policy, demos, args.imitate_epochs, args.batch_size,
                args.learning_rate, args.seed)
    return {"policy": args.imitate, "steps": len(demos.actions), "episodes": demos.episodes,
            "demo_goodput": demos.goodput, **fit, "seconds": time.perf_counter() - t0}


def export_policy(model: Any, path: Path) -> None:
    """A compact zip for ``learned:PATH``: fresh (empty) optimizer state, deflated.

    SB3's zip stores the Adam moments (twice the weights) uncompressed; a fresh optimizer keeps
    the file loadable and resumable (the moments restart) at a third of the size.
    """
    policy = model.policy
    trained = policy.optimizer
    policy.optimizer = type(trained)(policy.parameters(), **trained.defaults)
    tmp = path.with_suffix(".tmp.zip")
    try:
        model.save(tmp)
    finally:
        policy.optimizer = trained
    with zipfile.ZipFile(tmp) as src, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            dst.writestr(item.filename, src.read(item.filename))
    tmp.unlink()


def versions() -> dict[str, str]:
    import gymnasium
    import stable_baselines3
    import torch

    return {"cbgym": cbgym.__version__, "python": platform.python_version(),
            "torch": torch.__version__, "stable_baselines3": stable_baselines3.__version__,
            "gymnasium": gymnasium.__version__, "machine": platform.machine(),
            "cpus": str(os.cpu_count())}


# ----------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> dict[str, Any]:
    started = time.perf_counter()
    args = parse_args(argv)
    import torch
    from stable_baselines3.common.vec_env import VecMonitor

    from cbgym.capacity import measure_capacity
    from cbgym.env.sb3 import make_sb3_vec_env

    cpus = os.cpu_count() or 1
    torch.set_num_threads(args.torch_threads or cpus)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)

    # TRY NOT TO MODIFY: the trace, its capacity and the train / held-out split
    trace = load_base_trace(args.trace, args.task)
    engine = engine_config(args)
    mu = measure_capacity(trace, engine)  # one mu for every window, as the study scales load
    kwargs = env_kwargs(args, trace, engine, mu)
    threads = args.env_threads or min(cpus, args.num_envs)
    vec_env = VecMonitor(make_sb3_vec_env(args.env_id, args.num_envs, seed=args.seed,
                                          num_threads=threads, **kwargs))
    evaluator = HeldOutEval(args, trace, engine, mu)
    model = build_model(args, vec_env, out)
    warm = imitate(args, model, kwargs) if args.imitate and not args.resume_from else None
    config = {"args": dataclasses.asdict(args),
              "trace_name": trace.name, "trace_requests": len(trace),
              "train_requests": list(kwargs["window_start_range"]),
              "heldout_requests": [split_index(args, trace), len(trace)],
              "capacity_rps": mu, "engine": cbgym.metrics.config_dict(engine),
              "meta": model_meta(args), "versions": versions(), "command": sys.argv,
              "imitation": warm}
    (out / "config.json").write_text(json.dumps(config, indent=1))

    # ALGO LOGIC: learn, with evaluation and checkpoints along the way
    callbacks = make_callbacks(args, evaluator, out, started)
    t0 = time.perf_counter()
    start_steps = model.num_timesteps
    model.learn(total_timesteps=args.total_timesteps, callback=callbacks,
                reset_num_timesteps=not args.resume_from, tb_log_name="run")
    wall = time.perf_counter() - t0
    eval_cb = next(c for c in callbacks if type(c).__name__ == "Evaluate")
    budget_cb = next(c for c in callbacks if type(c).__name__ == "TimeBudget")
    model.save(out / "model.zip")
    export_policy(model, out / "policy.zip")

    # final held-out evaluation of the final model (no model selection on the held-out data)
    eval_seconds = eval_cb.seconds  # the periodic evaluations inside ``wall``
    final = eval_cb.run()
    steps = model.num_timesteps - start_steps
    final["training"] = {
        "timesteps": int(model.num_timesteps), "wall_seconds": wall,
        "eval_seconds_during_training": eval_seconds,
        "env_steps_per_second": steps / max(wall - eval_seconds, 1e-9),
        "stopped_by_time_budget": budget_cb.expired,
    }
    (out / "evaluation.json").write_text(json.dumps(final, indent=1))
    print_table(final)
    print(f"end to end: {steps / wall:.0f} env steps/s (collection, updates and the periodic "
          f"evaluations; {args.num_envs} envs on {threads} threads, "
          f"{torch.get_num_threads()} torch threads)")
    vec_env.close()
    return final


def print_table(ev: dict[str, Any]) -> None:
    """The held-out goodput table (requests meeting both SLOs per window)."""
    for load, per in ev["summary"].items():
        print(f"{ev.get('split', 'held-out')} rho={load} ({len(ev['windows'])} windows of "
              f"{ev['episode_requests']} requests): goodput mean +- std")
        for p, s in per.items():
            if p.startswith("margin"):
                print(f"  {p:24s} {s['mean']:+8.1f} +- {s['std']:6.1f}  "
                      f"(wins {s['wins']}, ties {s['ties']}, losses {s['losses']})")
            else:
                print(f"  {p:24s} {s['goodput_mean']:8.1f} +- {s['goodput_std']:6.1f}  "
                      f"SLO attainment {s['slo_attainment_mean']:.3f}")
    t = ev.get("training")
    if t is None or "timesteps" not in t:  # (tools/train_es.py reports generations itself)
        return
    budget = " (stopped by the time budget)" if t["stopped_by_time_budget"] else ""
    print(f"trained {t['timesteps']} steps in {t['wall_seconds']:.0f} s{budget} "
          f"({t['env_steps_per_second']:.0f} env steps/s excluding evaluation)")


if __name__ == "__main__":
    main()
