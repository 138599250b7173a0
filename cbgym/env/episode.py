"""One episode of :class:`~cbgym.env.SchedulingEnv`: the engine, the env's kernel state, and
the compiled per-step kernels bound to them (:mod:`cbgym.env.kernel_ops`).

The pending decision point is exposed as ``w_ids`` / ``r_ids`` (visible waiting and running
ids, in slot order), ``shortfall`` (KV blocks missing; 0 = none), ``drained`` and ``stuck``
(the agent held every waiting request back, with nothing running, for the engine's idle-tick
limit: the env truncates the episode).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from cbgym.engine import layout as L
from cbgym.engine.engine import Engine, EngineStuckError
from cbgym.engine.jit import bind
from cbgym.env import kernel_ops as ko
from cbgym.env import micro_ops as mo
from cbgym.env.action import check_scores
from cbgym.env.observation import slot_template
from cbgym.env.reward import StepOutcome
from cbgym.workload.trace import Trace

if TYPE_CHECKING:
    from cbgym.env.scheduling_env import SchedulingEnv

_EMPTY = np.empty(0, np.int64)
Obs = tuple[dict[str, np.ndarray], np.ndarray]


def obs_dict(arrays: tuple[np.ndarray, ...]) -> Obs:
    """The kernel's (global, waiting, waiting_mask, running, running_mask, waited) as the
    observation dict and the waited seconds."""
    g, w, wm, r, rm, waited = arrays
    return {"global": g, "waiting": w, "waiting_mask": wm, "running": r,
            "running_mask": rm}, waited


class Episode:
    """The engine of one episode and the env's side of its compiled step."""

    def __init__(self, env: SchedulingEnv, window: Trace, consult: str, ttft: np.ndarray,
                 tpot: np.ndarray) -> None:
        cfg = env.config
        self.weights = env.weights
        self.size = env.layout.size  # scores per action
        # (an env's reward needs no p99 gap: the engine keeps only each request's worst)
        self.engine = eng = Engine(window, cfg, consult=consult, itl_p99=False,
                                           closed_loop=False)  # (sessions: open loop)
        assert cfg.num_kv_blocks is not None
        self.es = ko.new_env_state(
            env.K, env.R, env.window_rule == "smallest_prompt", env.hold_threshold,
            env.shed_threshold, cfg.max_num_batched_tokens, cfg.max_num_seqs,
            cfg.num_kv_blocks, slot_template(window.prompt_tokens, window.tenant,
                                             window.slo_class),
            window.arrival_s, ttft, tpot, env.shed_lead, env.admission_cap)
        self.stuck = False
        self._obs: Obs | None = None
        self._bind()
        if not eng.drained:
            eng.run(eng._advance)
        if not eng.drained:
            ko.visible(eng.state, self.es)
        self.shed_at_start = int(ko.account_sheds(eng.state, self.es))

    def _bind(self) -> None:
        """The per-step kernels, bound to this episode's state types (see jit.bind)."""
        s, p, es = self.engine.state, self.engine.params, self.es
        self._step_scores = bind(ko.step_scores, s, p, es, np.zeros(len(es.win)))
        self._step_decision = bind(ko.step_decision, s, p, es, _EMPTY, True, _EMPTY, _EMPTY,
                                   True)
        self._finish = bind(ko.finish_step, s, es, True)
        self._observe = bind(ko.observe, s, es, True, _EMPTY, _EMPTY)
        self._run_point = None  # the masked variant's, bound on first use

    _BOUND = ("_step_scores", "_step_decision", "_finish", "_observe", "_run_point")

    def __getstate__(self) -> dict:
        return {name: v for name, v in self.__dict__.items() if name not in self._BOUND}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._bind()

    # ------------------------------------------------------------------ the pending point
    @property
    def drained(self) -> bool:
        return self.engine.drained

    @property
    def done(self) -> bool:
        return self.engine.drained or self.stuck

    @property
    def w_ids(self) -> np.ndarray:
        """Visible waiting ids (a view: valid until the next step)."""
        if self.done:
            return _EMPTY
        win = self.es.win
        return win[ko.W_IDS:ko.W_IDS + win[ko.NW]]

    @property
    def r_ids(self) -> np.ndarray:
        if self.done:
            return _EMPTY
        win, K = self.es.win, int(self.es.cfg_i[ko.K_SLOTS])
        return win[ko.W_IDS + K:ko.W_IDS + K + win[ko.NR]]

    @property
    def shortfall(self) -> int:
        return 0 if self.done else int(self.es.win[ko.SHORT])

    # ------------------------------------------------------------------ stepping
    def run_scores(self, action: object) -> StepOutcome:
        """Validate, decode and run a score vector in one kernel call."""
        size = self.size
        a = None  # float vectors of the right shape go straight in; the kernel checks ranges
        if isinstance(action, np.ndarray) and action.dtype.kind == "f":
            a = np.ascontiguousarray(action, dtype=np.float64)  # the bound kernel's type
        if a is None or a.shape != (size,):
            a = np.ascontiguousarray(check_scores(action, size))  # or raises
        eng = self.engine
        code, obs, outcome = self._step_scores(eng.state, eng.params, self.es, a)
        if code == ko.INVALID_ACTION:
            check_scores(a, size)  # raises, naming the offending score
        return self._settle(code, obs, outcome)

    def run(self, order: np.ndarray | None, victims: np.ndarray | None) -> StepOutcome:
        """Run the pending iteration under an admission order and victims (None: defaults)."""
        eng = self.engine
        code, obs, outcome = self._step_decision(
            eng.state, eng.params, self.es, _EMPTY if order is None else order,
            order is not None, _EMPTY, _EMPTY if victims is None else victims,
            victims is not None)
        return self._settle(code, obs, outcome)

    def run_point(self, m: np.ndarray) -> StepOutcome:
        """Run the pending iteration under the micro-steps chosen in ``m`` (micro_ops)."""
        eng = self.engine
        if self._run_point is None:
            self._run_point = bind(mo.run_point, eng.state, eng.params, self.es, m)
        return self._settle(*self._run_point(eng.state, eng.params, self.es, m))

    def _settle(self, code: int, obs: tuple, outcome: np.ndarray) -> StepOutcome:
        eng = self.engine
        if code == L.AT_DECISION or code == L.DRAINED:
            eng.settle(code)
        else:  # the buffers filled mid-way, or the agent held everyone back for too long
            try:
                eng.settle(code)
            except EngineStuckError:
                self.stuck = True
            obs, outcome = self._finish(eng.state, self.es, eng.drained)
        self._obs = obs_dict(obs)
        good, finished, shed, misses, latency, elapsed = outcome.tolist()
        comp = {"goodput": good, "ttft_miss": 0.0 - misses, "shed": 0.0 - shed,
                "latency": 0.0 - latency}
        return StepOutcome(self.weights.combine(comp), comp, int(finished), int(good),
                           int(shed), elapsed)

    def observe(self, chosen_w: np.ndarray | None, chosen_r: np.ndarray | None) -> Obs:
        """The observation and the exact waiting times of the visible waiting slots."""
        none_chosen = (chosen_w is None or not len(chosen_w)) and (
            chosen_r is None or not len(chosen_r))
        if self._obs is not None and none_chosen:
            obs, self._obs = self._obs, None
            return obs
        return obs_dict(self._observe(
            self.engine.state, self.es, self.done,
            _EMPTY if chosen_w is None else np.ascontiguousarray(chosen_w),
            _EMPTY if chosen_r is None else np.ascontiguousarray(chosen_r)))
