"""The ``learned`` policy: a trained stable-baselines3 model scheduling from DecisionPoints.

``make_policy("learned:PATH")`` (or ``learned:NAME`` for a checkpoint shipped in
``cbgym/agents/checkpoints/``, ``learned`` alone for ``default``) runs a model trained by
``train.py`` anywhere a baseline runs: ``cbgym.simulate(trace, policy="learned:default")``,
``cbgym bench --policies fcfs,learned:default``. At each decision point it builds the exact
observation the environment would have shown (the env's own compiled encoder and visible
windows, :mod:`cbgym.env.kernel_obs` and :mod:`cbgym.env.kernel_ops`), asks the model for
its deterministic action, and turns it into a :class:`~cbgym.engine.Decision` with the
env's own compiled decoder, so an episode played on the env and the same window replayed
through ``cbgym.simulate`` give identical results (tested).

Loading needs the ``train`` extra (torch, stable-baselines3, sb3-contrib); importing this
module does not.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

import numpy as np

from cbgym.engine.decision import Decision, DecisionPoint, Policy, PolicyContext
from cbgym.env.tenant_obs import FEATURES as TENANT_FEATURES
from cbgym.env.tenant_obs import KEY as TENANT_KEY
from cbgym.env.tenant_obs import tenant_obs
from cbgym.metrics import SLO, slo_arrays, slo_from_dict

# NOTE: cbgym.env imports cbgym.agents (the output statistic), so the env's encoder and
# decoder are imported where they are used, not here (a circular import otherwise).

__all__ = ["CHECKPOINT_DIR", "LearnedPolicy", "checkpoint_path", "load_model", "read_card",
           "shipped_names"]

CHECKPOINT_DIR = Path(__file__).with_name("checkpoints")
META_KEY = "cbgym"  # attribute of the SB3 model (saved in its zip) holding the env settings
# the env's own defaults: how a zip that carries no settings (e.g. an rl-zoo3 run) is decoded
DEFAULT_META: dict[str, Any] = {
    "algo": "ppo", "window_rule": "oldest", "hold_threshold": -0.5, "shed_threshold": -0.99,
    "shed_rule": "late",
    "slo": {"ttft_s": 2.0, "tpot_s": 0.1},
}


def _default_task_meta() -> dict[str, Any]:
    """The decoding settings of ``cbgym/Scheduling-v0`` (the default benchmark task)."""
    import inspect

    from cbgym.env.scheduling_env import SchedulingEnv
    from cbgym.tasks import DEFAULT_TASK, get

    t = get(DEFAULT_TASK)
    env = {k: p.default for k, p in inspect.signature(SchedulingEnv).parameters.items()}
    env.update(t.env)
    if not isinstance(t.slo, SLO):
        raise TypeError("the default task's SLO must be one SLO")
    return {"window_rule": env["window_rule"], "hold_threshold": env["hold_threshold"],
            "shed_threshold": env["shed_threshold"], "shed_rule": env["shed_rule"],
            "slo": {"ttft_s": t.slo.ttft_s, "tpot_s": t.slo.tpot_s}}


def shipped_names() -> list[str]:
    """Names of the checkpoints shipped with the package (``learned:NAME``)."""
    return sorted(p.stem for p in CHECKPOINT_DIR.glob("*.zip"))


def checkpoint_path(spec: str) -> Path:
    """The zip a ``learned:`` argument names: a shipped checkpoint name or a file path."""
    if (CHECKPOINT_DIR / f"{spec}.zip").is_file():
        return CHECKPOINT_DIR / f"{spec}.zip"
    path = Path(spec).expanduser()
    for candidate in (path, path.with_name(path.name + ".zip")):
        if candidate.is_file():
            return candidate
    raise ValueError(f"policy 'learned': no checkpoint {spec!r}: not a file, nor a shipped "
                     f"name ({', '.join(shipped_names()) or 'none shipped'})")


def load_model(path: str | Path) -> Any:
    """Load a PPO or MaskablePPO zip saved by ``train.py`` (CPU, no environment attached)."""
    try:
        from sb3_contrib import MaskablePPO
        from stable_baselines3 import PPO
        from stable_baselines3.common.save_util import load_from_zip_file
    except ImportError as exc:  # the train extra is optional
        raise ImportError("policy 'learned' needs torch and stable-baselines3: "
                          "pip install 'cbgym[train]'") from exc
    data, _, _ = load_from_zip_file(path, device="cpu", load_data=True)
    algo = (data or {}).get(META_KEY, {}).get("algo")
    if algo is None:  # a zip from elsewhere: a Discrete action space means micro-steps
        algo = "maskable_ppo" if hasattr((data or {}).get("action_space"), "n") else "ppo"
    cls = MaskablePPO if algo == "maskable_ppo" else PPO
    return cls.load(path, device="cpu")


@functools.lru_cache(maxsize=8)
def _cached_model(path: str, mtime_ns: int) -> Any:
    """One loaded model per file version: a benchmark builds the policy once per cell, and
    acting never changes the model, so the policies of one process can share it."""
    return load_model(path)


def _single_threaded_torch() -> None:
    """One intra-op thread: these nets are tiny, and on a busy 2-core machine torch's default
    pool made one forward pass 30x slower (30 ms instead of 1 ms, measured)."""
    import torch

    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)


class LearnedPolicy(Policy):
    """A trained SB3 model acting on the env's observation of each decision point.

    Args:
        model: a shipped checkpoint name (``"default"``), a path to a zip saved by
            ``train.py``, or an already loaded SB3 model (the training evaluation uses this).

    Acts deterministically (the mean score, or the most likely micro-step). The shedding rule
    uses the SLO the model was trained with (stored in its zip), not the run's.

    One safeguard differs from the env: when nothing is running and the model would hold every
    visible request (or STOP before admitting any), the engine would only idle, and a
    deterministic policy can keep doing so until the engine gives up (``RuntimeError`` after
    its idle-tick limit). The policy then admits its best-scored request instead and counts
    it in ``idle_overrides``. Everywhere else it acts exactly as on the env.
    """

    name = "learned"
    # the env asks at every iteration with something to decide; so must the policy, or it
    # would act on different observations than the ones it was trained on
    consult = "every_iteration"

    def __init__(self, model: Any = "default") -> None:
        if isinstance(model, str | Path):
            source = str(model)
            path = checkpoint_path(source).resolve()
            model = _cached_model(str(path), path.stat().st_mtime_ns)
        else:
            source = "in-memory"
        _single_threaded_torch()
        self.model = model
        self.label = f"{self.name}:{source}"
        space = model.observation_space
        self.K = int(space["waiting_mask"].shape[0])
        self.R = int(space["running_mask"].shape[0])
        self.masked = hasattr(model.action_space, "n")
        from cbgym.env.action import ScoreLayout

        # a score vector one longer than the slots carries the running cap (admission_cap)
        cap = not self.masked and int(model.action_space.shape[0]) == self.K + self.R + 1
        self.layout = ScoreLayout(self.K, self.R, cap)
        saved = getattr(model, META_KEY, None) or {}
        # a zip without cbgym's settings (rl-zoo3, plain SB3) with the cap score was trained
        # on cbgym/Scheduling-v0, the default task: decode with that task's env settings
        self.meta = {**DEFAULT_META, **(_default_task_meta() if cap and not saved else {}),
                     **saved}
        self.slo = slo_from_dict(self.meta["slo"])

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)
        self._es: Any = None  # the env's side of the compiled step, made at the first decision
        self.idle_overrides = 0  # decisions where the engine-idling guard stepped in

    def _observe(self, dp: DecisionPoint, chosen_w: np.ndarray | None = None,
                 chosen_r: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """The env's own observation of ``dp`` (its compiled encoder and windows)."""
        from cbgym.env import kernel_ops as ko
        from cbgym.env.episode import obs_dict

        none = np.empty(0, np.int64)
        raw = ko.observe(dp.kernel_state, self._es, False,
                         none if chosen_w is None else np.ascontiguousarray(chosen_w),
                         none if chosen_r is None else np.ascontiguousarray(chosen_r))
        obs = obs_dict(raw)[0]
        space = getattr(self.model.observation_space, "spaces", {})
        if TENANT_KEY in space:  # a model trained with tenant_features
            T = space[TENANT_KEY].shape[0] // len(TENANT_FEATURES)
            obs[TENANT_KEY] = tenant_obs(dp.kernel_state, np.asarray(dp.tenant), T)
        from cbgym.env import prefix_obs as po

        if po.KEY in space:  # a model trained with prefix_features
            if dp.cached_tokens is None:
                raise ValueError(f"policy {self.label!r} was trained with prefix_features: it "
                                 "needs an engine with prefix caching on a trace with block ids")
            win = self._es.win
            obs[po.KEY] = po.prefix_obs(dp, win[ko.W_IDS:ko.W_IDS + win[ko.NW]], self.K)
        return obs

    def _windows(self, dp: DecisionPoint) -> tuple[np.ndarray, np.ndarray]:
        """Fix the visible windows at ``dp`` as the env does; (waiting ids, running ids)."""
        from cbgym.agents.work import shed_lead
        from cbgym.env import kernel_ops as ko
        from cbgym.env.observation import slot_template

        if self._es is None:  # first decision: per-request columns are now known
            cfg = dp.config
            ttft, tpot = slo_arrays(self.slo, dp.slo_class)
            self._es = ko.new_env_state(
                self.K, self.R, self.meta["window_rule"] == "smallest_prompt",
                self.meta["hold_threshold"], self.meta["shed_threshold"],
                cfg.max_num_batched_tokens, cfg.max_num_seqs, int(cfg.num_kv_blocks or 0),
                slot_template(dp.prompt_tokens, dp.tenant, dp.slo_class), dp.arrival_s,
                ttft, tpot, shed_lead(self.meta.get("shed_rule", "late"), cfg),
                self.layout.cap)
        ko.visible(dp.kernel_state, self._es)
        win = self._es.win
        w_ids = win[ko.W_IDS:ko.W_IDS + win[ko.NW]].copy()
        r_ids = win[ko.W_IDS + self.K:ko.W_IDS + self.K + win[ko.NR]].copy()
        return w_ids, r_ids

    def decide(self, dp: DecisionPoint) -> Decision:
        from cbgym.env import kernel_ops as ko

        w_ids, r_ids = self._windows(dp)
        if self.masked:
            return self._decide_masked(dp, w_ids, r_ids)
        action = self._predict(self._observe(dp))
        order, shed, victims = ko.decode_scores(dp.kernel_state, self._es,
                                                np.ascontiguousarray(action, np.float64))
        decision = Decision(order=order, shed=shed.tolist(), shed_reason="shed_by_agent",
                            victims=victims if dp.shortfall_blocks > 0 else None)
        if len(dp.running) or len(order):
            return decision
        # NOTE: the engine would idle; admit the best-scored request instead (see the class doc)
        keep = ~np.isin(w_ids, shed)
        if not keep.any():
            return decision
        self.idle_overrides += 1
        best = w_ids[keep][np.argmax(action[: len(w_ids)][keep])]
        return dataclasses.replace(decision, order=np.array([best]))

    def _decide_masked(self, dp: DecisionPoint, w_ids: np.ndarray,
                       r_ids: np.ndarray) -> Decision:
        """Micro-steps as ``SchedulingMasked-v0`` plays them, until STOP or nothing is left."""
        from cbgym.env import micro_ops as mo
        from cbgym.env.action import MicroSteps

        K, R = self.K, self.R
        ms = MicroSteps(K, R)
        ms.begin(self._es, False)
        # NOTE: STOP before any admission with nothing running would idle the engine: refused
        idle = len(dp.running) == 0 and dp.shortfall_blocks == 0 and len(w_ids) > 0
        while True:
            logits = self._forward(self._observe(dp, ms.chosen_w, ms.chosen_r))
            mask = ms.mask.copy()
            i = _masked_argmax(logits, mask)
            if i == K + R and idle and not len(ms.chosen_w):
                mask[K + R] = 0
                i = _masked_argmax(logits, mask)
                self.idle_overrides += 1
            if i == K + R or ms.choose(dp.kernel_state, self._es, i) == mo.READY:
                break
        if dp.shortfall_blocks > 0:
            # order=None: should the engine not preempt, it admits as vLLM would
            return Decision(victims=r_ids[ms.chosen_r])
        return Decision(order=w_ids[ms.chosen_w])

    def _predict(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        """The deterministic scores, as ``policy.predict(obs, deterministic=True)`` gives them
        (the Gaussian's mode, clipped to the Box as SB3 clips it)."""
        return np.clip(self._forward(obs), -1.0, 1.0)

    def _forward(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        """The network's action output for one observation: score means, or logits.

        Calls the network directly: SB3's ``predict`` spends most of its time on checks and
        conversions that matter little for one observation at a time (2x slower here).
        """
        import torch as th

        policy = self.model.policy
        with th.no_grad():
            batch = {k: th.as_tensor(v).unsqueeze(0) for k, v in obs.items()}
            features = policy.extract_features(batch)
            if isinstance(features, tuple):  # separate actor / critic extractors
                features = features[0]
            return policy.action_net(policy.mlp_extractor.forward_actor(features))[0].numpy()


def _masked_argmax(logits: np.ndarray, mask: np.ndarray) -> int:
    """The most likely allowed micro-step (MaskablePPO's deterministic action)."""
    return int(np.argmax(np.where(mask.astype(bool), logits, -np.inf)))


def read_card(name: str = "default") -> dict[str, Any]:
    """The configuration and evaluation JSON shipped next to a checkpoint (``NAME.json``)."""
    return json.loads((CHECKPOINT_DIR / f"{name}.json").read_text())
