"""The two ways :class:`~cbgym.env.SchedulingEnv` advances an episode.

* :class:`PythonBackend`: the reference. The :class:`~cbgym.engine.Engine` decides one
  iteration per step, :class:`~cbgym.env.observation.ObservationEncoder` encodes and
  :class:`~cbgym.env.reward.RewardTracker` scores it. Any engine configuration.
* :class:`CompiledBackend`: the same step in the numba kernels (:mod:`cbgym.engine.kernel`,
  :mod:`cbgym.env.kernel_ops`), about ten times faster. Linear and roofline cost models.
  The episode is identical (``tests/test_kernel.py``); ``engine`` and ``decision_point``
  present the same objects as the reference, built on demand.

Both expose the pending point as ``w_ids`` / ``r_ids`` (visible waiting and running ids, in
slot order), ``shortfall`` (KV blocks missing; 0 = none), ``drained`` and ``iteration``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from cbgym.engine import kernel as k
from cbgym.engine.compiled import CompiledEngine, supports
from cbgym.engine.decision import Decision, DecisionPoint
from cbgym.engine.engine import Engine
from cbgym.env import kernel_ops as ko
from cbgym.env.action import check_scores, decode_scores
from cbgym.env.observation import ObservationEncoder, Snapshot, slot_template
from cbgym.env.reward import RewardTracker, StepOutcome
from cbgym.workload.trace import Trace

if TYPE_CHECKING:
    from cbgym.env.scheduling_env import SchedulingEnv

_EMPTY = np.empty(0, np.int64)


class PythonBackend:
    """Engine, encoder and tracker in Python (the reference; any engine configuration)."""

    def __init__(self, env: SchedulingEnv) -> None:
        self.env = env
        cfg = env.config
        self.encoder = ObservationEncoder(env.K, env.R, cfg.max_num_batched_tokens,
                                          cfg.max_num_seqs)
        self.tracker = RewardTracker(env.weights)
        self.engine: Engine | None = None
        self.dp: DecisionPoint | None = None
        self.w_ids = self.r_ids = _EMPTY

    def start(self, window: Trace, consult: str, ttft: np.ndarray, tpot: np.ndarray) -> None:
        self.engine = eng = Engine(window, self.env.config, consult=consult)
        req = eng.req
        self.tracker.start(req, ttft, tpot)
        self.encoder.start_episode(req.arrival_s, req.prompt, req.tenant, req.slo_class)
        self._advance()

    @property
    def drained(self) -> bool:
        return self.dp is None

    @property
    def shortfall(self) -> int:
        return 0 if self.dp is None else self.dp.shortfall_blocks

    @property
    def iteration(self) -> int:
        assert self.engine is not None
        return self.engine.iteration

    @property
    def now(self) -> float:
        assert self.engine is not None
        return float(self.engine.now)

    @property
    def decision_point(self) -> DecisionPoint | None:
        return self.dp

    def run_scores(self, a: object) -> StepOutcome:
        """Decode scores (see :func:`cbgym.env.action.decode_scores`) and run."""
        dp, env, w_ids = self.dp, self.env, self.w_ids
        assert dp is not None

        def late() -> np.ndarray:
            return dp.now - dp.arrival_s[w_ids] > env.ttft_target[w_ids]

        return self.run(decode_scores(a, env.layout, w_ids, self.r_ids, env.hold_threshold,
                                      env.shed_threshold, late, dp.shortfall_blocks > 0))

    def run(self, decision: Decision) -> StepOutcome:
        """Run the pending iteration under ``decision`` and advance to the next decision."""
        eng = self.engine
        assert eng is not None
        eng.decide(decision, validate=False)  # built from visible slots' own ids
        self._advance()
        return self.tracker.update(eng.now)

    def _advance(self) -> None:
        assert self.engine is not None
        dp = self.dp = self.engine.next_decision()
        if dp is None:
            self.w_ids = self.r_ids = _EMPTY
            return
        self.w_ids = self._visible_waiting(dp)
        self.r_ids = dp.running[-self.env.R:]

    def _visible_waiting(self, dp: DecisionPoint) -> np.ndarray:
        waiting, K = dp.waiting, self.env.K
        if len(waiting) <= K:
            return waiting
        if self.env.window_rule == "oldest":
            return waiting[:K]
        pick = np.argsort(dp.prompt_tokens[waiting], kind="stable")[:K]
        pick.sort()  # shown in queue order, so equal keys keep queue order downstream
        return waiting[pick]

    def victim_frees(self) -> np.ndarray:
        """Blocks each visible running request would free if preempted now (held + needed)."""
        dp = self.dp
        assert dp is not None
        held = dp.kv_blocks_held[dp.running] + dp.running_need_blocks
        return held[-self.env.R:]

    def observe(self, chosen_w: list[int] | None, chosen_r: list[int] | None
                ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The observation and the exact waiting times of the visible waiting slots."""
        dp, K = self.dp, self.env.K
        waited = np.zeros(K)
        if dp is None:
            return self.encoder.encode_empty(self._drained_snapshot()), waited
        waited[: len(self.w_ids)] = dp.now - dp.arrival_s[self.w_ids]
        return self.encoder.encode(dp, self.w_ids, self.r_ids, chosen_w, chosen_r), waited

    def _drained_snapshot(self) -> Snapshot:
        eng, cfg = self.engine, self.env.config
        assert eng is not None
        return Snapshot(
            now=eng.now, num_waiting=0, num_running=0, waiting_prompt_tokens=0,
            running_prompt_tokens=0, running_computed_tokens=0, free_blocks=eng.kv.free,
            num_blocks=eng.kv.num_blocks, total_preemptions=eng.total_preemptions,
            last_iteration_s=eng.last_iteration_s, shortfall_blocks=0,
            budget_left=cfg.max_num_batched_tokens, seq_slots_left=cfg.max_num_seqs,
            num_hidden=0)


class CompiledBackend:
    """The same episode through the numba kernels (linear and roofline cost models)."""

    def __init__(self, env: SchedulingEnv) -> None:
        self.env = env
        self.compiled: CompiledEngine | None = None
        self.es: ko.EnvState | None = None
        self._obs: tuple[dict[str, np.ndarray], np.ndarray] | None = None

    def start(self, window: Trace, consult: str, ttft: np.ndarray, tpot: np.ndarray) -> None:
        env, cfg = self.env, self.env.config
        self.compiled = ce = CompiledEngine(window, cfg, consult=consult)
        req = ce.engine.req
        self.es = ko.new_env_state(
            env.K, env.R, env.window_rule == "smallest_prompt", env.hold_threshold,
            env.shed_threshold, cfg.max_num_batched_tokens, cfg.max_num_seqs,
            slot_template(req.prompt, req.tenant, req.slo_class), req.arrival_s, ttft, tpot)
        self._obs = None
        if not ce.drained:
            ko.visible(ce.state, self.es)
        self._bind()

    def _bind(self) -> None:
        """The per-step kernels, bound to this episode's state types (see kernel.bind)."""
        ce, es = self.compiled, self.es
        assert ce is not None and es is not None
        self._step_scores = k.bind(ko.step_scores, ce.state, es, np.zeros(es.K + es.R))
        self._after_decide = k.bind(ko.after_decide, ce.state, es, False)
        none = np.empty(0, np.int64)
        self._observe = k.bind(ko.observe, ce.state, es, False, none, none)

    _BOUND = ("_step_scores", "_after_decide", "_observe")

    def __getstate__(self) -> dict:
        return {name: v for name, v in self.__dict__.items() if name not in self._BOUND}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if self.compiled is not None:
            self._bind()

    # ------------------------------------------------------------------ the pending point
    @property
    def drained(self) -> bool:
        return self.compiled is None or self.compiled.drained

    @property
    def w_ids(self) -> np.ndarray:
        """Visible waiting ids (a view: valid until the next step)."""
        es = self.es
        if es is None or self.drained:
            return _EMPTY
        return es.w_ids[: es.point[0]]

    @property
    def r_ids(self) -> np.ndarray:
        es = self.es
        if es is None or self.drained:
            return _EMPTY
        return es.r_ids[: es.point[1]]

    @property
    def shortfall(self) -> int:
        assert self.es is not None
        return 0 if self.drained else int(self.es.point[2])

    @property
    def iteration(self) -> int:
        assert self.compiled is not None
        return self.compiled.iteration

    @property
    def now(self) -> float:
        assert self.compiled is not None
        return self.compiled.now

    @property
    def engine(self) -> Engine:
        assert self.compiled is not None
        return self.compiled.sync()

    @property
    def decision_point(self) -> DecisionPoint | None:
        assert self.compiled is not None
        return self.compiled.decision_point()

    # ------------------------------------------------------------------ stepping
    def run_scores(self, action: object) -> StepOutcome:
        """Validate, decode and run a score vector in one kernel call."""
        ce, es = self.compiled, self.es
        assert ce is not None and es is not None
        a = None  # float vectors of the right shape go straight in; the kernel checks ranges
        if isinstance(action, np.ndarray) and action.dtype.kind == "f":
            a = np.ascontiguousarray(action, dtype=np.float64)  # the bound kernel's type
        if a is None or a.shape != (es.K + es.R,):
            a = np.ascontiguousarray(check_scores(action, es.K + es.R))  # or raises
        ce.make_room()
        code, obs, outcome = self._step_scores(ce.state, es, a)
        if code == ko.INVALID_ACTION:
            check_scores(a, es.K + es.R)  # raises, naming the offending score
        if code != k.AT_DECISION and code != k.DRAINED:
            obs, outcome = self._after_decide(ce.state, es, ce.settle(code) == k.DRAINED)
        else:
            ce.drained = code == k.DRAINED
        self._obs = _obs_dict(obs)
        return self._outcome(outcome)

    def run(self, decision: Decision) -> StepOutcome:
        ce, es = self.compiled, self.es
        assert ce is not None and es is not None
        ce.decide(decision)
        obs, outcome = self._after_decide(ce.state, es, ce.drained)
        self._obs = _obs_dict(obs)  # a fresh point: nothing chosen yet
        return self._outcome(outcome)

    def _outcome(self, outcome: np.ndarray) -> StepOutcome:
        good, finished, shed, misses, latency, elapsed = outcome.tolist()
        comp = {"goodput": good, "ttft_miss": 0.0 - misses, "shed": 0.0 - shed,
                "latency": 0.0 - latency}
        return StepOutcome(self.env.weights.combine(comp), comp, int(finished), int(good),
                           int(shed), elapsed)

    def victim_frees(self) -> np.ndarray:
        s = self.compiled.state  # type: ignore[union-attr]
        k.running_plan(s)
        n = int(s.si[k.N_RUN])
        held = s.held[s.running[:n]] + s.plan_need[:n]
        return held[-self.env.R:]

    def observe(self, chosen_w: list[int] | None, chosen_r: list[int] | None
                ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        if self._obs is not None and not chosen_w and not chosen_r:
            obs, self._obs = self._obs, None
            return obs
        ce = self.compiled
        assert ce is not None and self.es is not None
        return _obs_dict(self._observe(
            ce.state, self.es, ce.drained, np.array(chosen_w or (), np.int64),
            np.array(chosen_r or (), np.int64)))


def _obs_dict(arrays: tuple[np.ndarray, ...]) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The kernel's (global, waiting, waiting_mask, running, running_mask, waited) as the
    observation dict and the waited seconds."""
    g, w, wm, r, rm, waited = arrays
    return {"global": g, "waiting": w, "waiting_mask": wm, "running": r,
            "running_mask": rm}, waited


def resolve_backend(env: SchedulingEnv, backend: str) -> PythonBackend | CompiledBackend:
    """``"auto"``: compiled when the engine configuration allows it, else Python."""
    if backend not in ("auto", "compiled", "python"):
        raise ValueError(f"backend={backend!r}: expected 'auto', 'compiled' or 'python'")
    if backend == "python" or (backend == "auto" and not supports(env.config)):
        return PythonBackend(env)
    if not supports(env.config):
        raise ValueError(f"backend='compiled' does not price "
                         f"{type(env.config.cost_model).__name__}; the compiled kernel has the "
                         "linear and roofline cost models (use backend='python' or 'auto')")
    return CompiledBackend(env)


__all__ = ["CompiledBackend", "PythonBackend", "resolve_backend"]
