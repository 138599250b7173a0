"""The Gymnasium environment: schedule a simulated vLLM-style serving instance.

``cbgym/Scheduling-v0`` (:class:`SchedulingEnv`) and ``cbgym/SchedulingMasked-v0``
(:class:`SchedulingMaskedEnv`) share this implementation; they differ only in the action space.
Encoding lives in :mod:`cbgym.env.observation`, decoding in :mod:`cbgym.env.action`, the
reward in :mod:`cbgym.env.reward`.
"""

from __future__ import annotations

from typing import Any, Literal

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.error import ResetNeeded

from cbgym.agents.work import shed_lead
from cbgym.engine.config import EngineConfig
from cbgym.engine.decision import DecisionPoint
from cbgym.engine.engine import Engine
from cbgym.env import kernel_ops as ko
from cbgym.env import micro_ops as mo
from cbgym.env.action import (
    InvalidActionError,
    MicroSteps,
    ScoreLayout,
    check_discrete,
    check_scores,
)
from cbgym.env.arguments import check_args, check_load
from cbgym.env.draws import draw_load, draw_start
from cbgym.env.episode import Episode
from cbgym.env.observation import observation_space
from cbgym.env.optional_obs import OptionalObs
from cbgym.env.render import render_rgb, render_text
from cbgym.env.reward import COMPONENTS, RewardWeights, StepOutcome
from cbgym.metrics import SLO, SimulationResult, SLOSpec, check_slo, has_e2e, slo_arrays
from cbgym.workload.trace import Trace

__all__ = ["SchedulingEnv", "SchedulingMaskedEnv", "draw_load", "draw_start"]

WindowRule = Literal["oldest", "smallest_prompt"]
_OPTION_KEYS = frozenset({"start", "load", "trace"})
DEFAULT_TRACE = "synthetic-conv"


class SchedulingEnv(gym.Env[dict[str, np.ndarray], np.ndarray]):
    """Schedule an LLM serving instance (vLLM v1 semantics), one engine iteration per step.

    ## Description

    A trace-driven simulated serving engine (continuous batching, chunked prefill, paged KV
    cache, preemption by recomputation) replays a window of a request trace, rescaled to an
    offered load. Before each engine iteration in which something can be decided (requests
    are waiting, or the running batch needs more KV blocks than are free) the agent sees the
    queue and the batch and chooses which waiting requests to admit, in which order, which to
    hold back or shed, and which running requests to preempt first if memory runs out. The
    engine then runs the iteration (running requests first, then admissions in the agent's order
    until the token budget, ``max_num_seqs`` or memory stops it, exactly as vLLM's scheduler).
    Iterations with nothing to decide are simulated without asking (``skip_trivial=True``).

    ## Action Space

    ``cbgym/Scheduling-v0``: ``Box(-1, 1, (K + R,), float32)`` (``K + R + 1`` with
    ``admission_cap``).

    | Index        | Meaning                                                              |
    |--------------|----------------------------------------------------------------------|
    | 0 .. K-1     | score of waiting slot i: admitted in descending score order (ties in |
    |              | slot order) if score >= ``hold_threshold`` (-0.5), else held back;    |
    |              | score <= ``shed_threshold`` (-0.99) sheds the request if it has no   |
    |              | first token and can no longer meet its TTFT target:                  |
    |              | ``shed_rule="late"``, it has waited longer than the target;          |
    |              | ``"unreachable"``, waited + its own prefill at the engine's          |
    |              | linearised cost exceeds it (the benchmark tasks')                    |
    | K .. K+R-1   | score of running slot j: when memory runs short the lowest-scored    |
    |              | request is preempted first (ties: most recently admitted first)      |
    | K+R          | with ``admission_cap=True`` only: caps the running batch at          |
    |              | ``round(max_num_seqs ** ((score + 1) / 2))`` (1 .. max_num_seqs,     |
    |              | log-scaled): admissions stop once it is reached                      |
    | after these  | reserved: deflection scores of the disaggregated variant (appended)  |

    Scores of empty slots are ignored. Requests outside the visible window are held back.
    Actions outside [-1, 1], NaN or of the wrong shape raise :class:`InvalidActionError`
    (a ``gymnasium.error.InvalidAction`` and ``ValueError``); SB3 PPO clips its actions.

    ``cbgym/SchedulingMasked-v0``: ``Discrete(K + R + 1)`` micro-steps. Outside a memory
    shortfall, index i < K admits waiting slot i next (appending to the admission order) and
    index K + R (STOP) runs the iteration; it also runs once every visible waiting slot has been
    chosen. On a shortfall only running slots are allowed: each step names the next victim
    (index K + j), and the iteration runs once the chosen victims would free the missing
    blocks (or every visible running slot is chosen). This variant has no shed action.
    ``action_masks()`` (int8, safe before
    ``reset``: STOP only) and ``info["action_mask"]`` give the allowed indices. A masked (or
    malformed) action acts as STOP by default (``invalid_action="stop"``: the iteration runs
    with the choices made so far; on a shortfall the engine picks the remaining victims as
    vLLM does) and the step's ``info["invalid_action"]`` is True; this is what lets checkers
    that sample actions without masks (Gymnasium's and SB3's ``check_env``) run with default
    arguments. ``"noop"`` ignores the action instead, ``"raise"`` raises.

    ## Observation Space

    A ``Dict`` of 1-D float32 boxes (``gymnasium.wrappers.FlattenObservation`` or
    :class:`cbgym.env.wrappers.FlattenSchedulingObservation` flattens it, keys in sorted order:
    global, running, running_mask, waiting, waiting_mask). Scalings: *count* =
    ``log2(1 + x) / 24`` (exactly invertible by rounding below 10**6), *time* =
    ``log2(1 + t / 1 ms) / 32`` (t in seconds), *mean* = ``x / 1024`` (exact).

    ``global`` (36):

    | Num | Observation              | Min | Max | Scaling  |
    |-----|--------------------------|-----|-----|----------|
    | 0   | num_waiting              | 0   | 1   | count    |
    | 1   | num_running              | 0   | 1   | count    |
    | 2   | waiting_prompt_tokens    | 0   | 1   | count    |
    | 3   | running_prompt_tokens    | 0   | 1   | count    |
    | 4   | running_computed_tokens  | 0   | 1   | count    |
    | 5   | kv_usage                 | 0   | 1   | fraction |
    | 6   | free_blocks              | 0   | 1   | count    |
    | 7   | total_preemptions        | 0   | 1   | count    |
    | 8   | arrival_rate (req/s)     | 0   | 1   | count    |
    | 9   | sim_time                 | 0   | 1   | time     |
    | 10  | last_iteration_time      | 0   | 1   | time     |
    | 11  | shortfall_blocks         | 0   | 1   | count    |
    | 12  | token_budget             | 0   | 1   | count    |
    | 13  | budget_left              | 0   | 1   | count    |
    | 14  | seq_slots_left           | 0   | 1   | count    |
    | 15  | num_waiting_hidden       | 0   | 1   | count    |
    | 16  | shortfall_phase          | 0   | 1   | flag     |
    | 17  | num_chosen               | 0   | 1   | count    |
    | 18-25 | recent_output_mean_0..7 | 0  | 256 | mean     |
    | 26-33 | recent_output_seen_0..7 | 0  | 1   | flag     |
    | 34  | recent_output_mean_all   | 0   | 256 | mean     |
    | 35  | recent_output_seen_all   | 0   | 1   | flag     |

    ``arrival_rate`` is m / max(now - t_(a-m), 1 ms) over the last m = min(32, a) of the a
    arrivals so far. ``budget_left`` is the token budget minus what the running batch takes this
    iteration. ``recent_output_mean_b`` is the mean output length of the last 512 completions
    whose prompt falls in bucket b (edges 128, 256, ..., 8192; 0 and ``seen`` = 0 while
    empty): completed requests' lengths are observed facts, so this stays content-blind.

    ``waiting`` (K x 8, slot-major: ``reshape(K, 8)``) and ``running`` (R x 8), one row per
    slot, zeros for empty slots (``waiting_mask`` / ``running_mask`` say which are filled):

    | Num | Observation      | Min | Max | Scaling |
    |-----|------------------|-----|-----|---------|
    | 0   | prompt_tokens    | 0   | 1   | count   |
    | 1   | num_computed     | 0   | 1   | count   |
    | 2   | num_generated    | 0   | 1   | count   |
    | 3   | time_in_system   | 0   | 1   | time    |
    | 4   | num_preemptions  | 0   | 1   | count   |
    | 5   | tenant           | 0   | 1   | count   |
    | 6   | slo_class        | 0   | 1   | count   |
    | 7   | chosen           | 0   | 1   | flag    |

    Waiting slots follow ``window_rule``: ``"oldest"`` shows the first K requests in queue order
    (re-queued preempted requests first, then by arrival); ``"smallest_prompt"`` the K with the
    fewest prompt tokens, shown in queue order. Running slots show the R most recently admitted
    requests in admission order (vLLM's default victims are the most recent). Never observed:
    prompt content, true output lengths (oracles read them through
    :meth:`privileged_true_output_tokens`, never part of obs or info).

    Opt-in keys (absent by default, sorted after the others): ``waiting_tenants``
    (``tenant_features``: :mod:`cbgym.env.tenant_obs`) and ``waiting_prefix``
    (``prefix_features``: each waiting slot's cached, uncached and shared prefix tokens and
    blocks, then the prefix cache hit rate: :mod:`cbgym.env.prefix_obs`) and ``waiting_arrival``
    (``arrival_features``: each waiting slot's features at its arrival, what the learned
    output-length predictor reads: :mod:`cbgym.env.arrival_obs`).

    ## Rewards

    +1 for each request that finishes in the step meeting both its TTFT and TPOT SLO (goodput).
    Optional shaping, off by default (weights 0): ``ttft_miss_weight`` x (minus requests whose
    TTFT deadline passed unmet in the step), ``shed_weight`` x (minus requests shed), and
    ``latency_weight`` x (minus the integral of requests in system over the step, which sums to
    minus the total latency: Little's law). Each component is in ``info["reward_components"]``.

    ## Starting State

    ``reset`` picks ``episode_requests`` consecutive requests of the trace (start uniform from
    ``np_random`` within ``window_start_range``, or fixed by ``options["start"]``), rescales
    their arrivals to the offered load (``load``: a float, a (lo, hi) range drawn per episode, or
    None to keep the trace's clock) and advances to the first decision point.

    ## Episode End

    1. Termination: every request of the window has finished or been shed.
    2. Truncation: after ``max_steps`` steps (if set). ``gym.make(..., max_episode_steps=N)``
       adds Gymnasium's ``TimeLimit`` instead; neither id registers a default limit.
    3. Truncation: the agent held every waiting request back, with nothing running, for
       100,000 idle ticks in a row (``cbgym.engine.layout.MAX_IDLE_TICKS`` ticks of 10 ms of
       simulated time, each a step): the episode could never drain.
       ``info["truncated_reason"]`` is ``"idle_hold_limit"``; ``reset()`` starts afresh.

    ## Info

    ``reward_components`` (dict of floats: goodput, ttft_miss, shed, latency),
    ``engine_iterations`` and ``sim_time_elapsed`` (what the step covered), ``sim_time_s``,
    ``num_finished``, ``num_good``, ``num_shed`` (in the step; at reset, the requests shed
    before the first decision because they can never fit), ``waiting_time_in_system_s``
    (K float64, exact, 0 for empty slots) and, for the masked variant, ``action_mask`` and
    ``invalid_action``.

    ## Arguments

    | Parameter          | Default          | Description                                   |
    |--------------------|------------------|-----------------------------------------------|
    | trace              | "synthetic-conv" | Trace, or a name for ``load_trace``           |
    | load               | 0.9              | offered load rho: float, (lo, hi) or None     |
    | engine             | EngineConfig()   | the serving instance (EngineConfig)           |
    | episode_requests   | 512              | requests per episode (int)                    |
    | window_start_range | None (all)       | (lo, hi): request range the window lies in    |
    | slo                | SLO()            | TTFT / TPOT targets, or {SLO class: SLO}      |
    | K, R               | 16, 32           | waiting / running slots (int)                 |
    | window_rule        | "oldest"         | or "smallest_prompt": visible waiting slots   |
    | skip_trivial       | True             | do not stop when nothing can be decided       |
    | hold_threshold     | -0.5             | scores below it hold a request back           |
    | shed_threshold     | -0.99            | scores at or below it shed late ones (None)   |
    | shed_rule          | "late"           | or "unreachable": which requests can be shed  |
    | admission_cap      | False            | append the running-cap score to the action    |
    | ttft_miss_weight   | 0.0              | shaping weight of ``ttft_miss``               |
    | shed_weight        | 0.0              | shaping weight of ``shed``                    |
    | latency_weight     | 0.0              | shaping weight of ``latency``                 |
    | max_steps          | None             | truncate after this many steps (int)          |
    | capacity_rps       | None (measured)  | service rate mu used for load scaling         |
    | invalid_action     | "stop" (masked)  | masked variant, on a masked or malformed      |
    |                    |                  | action: "stop" (acts as STOP), "noop", "raise"|
    | render_mode        | None             | "ansi" (text) or "rgb_array" (96x192x3 uint8) |
    | tenant_features    | 0                | T > 0: observe tenants 0..T-1's fairness       |
    |                    |                  | counters (``waiting_tenants``: tenant_obs)     |
    | prefix_features    | False            | True: observe the prefix cache per waiting    |
    |                    |                  | slot (``waiting_prefix``: prefix_obs); needs  |
    |                    |                  | enable_prefix_caching, a trace's block ids    |
    | arrival_features   | False            | True: observe each waiting slot's features at |
    |                    |                  | arrival (``waiting_arrival``: arrival_obs)    |

    A step is one call of the compiled kernel (:mod:`cbgym.env.kernel_ops`: the decision, the
    engine iterations up to the next decision point, the reward and the observation). The
    first use on a machine compiles it (a line on stderr says so; cached on disk afterwards).

    The service rate mu is measured once per base trace (``measure_capacity``: its first 4,000
    requests released at t=0, served FCFS; lru-cached per process) and reused for every
    window, so ``load`` is relative to the trace-wide capacity, as in the CB-SJF-Work study.

    ## Version History

    * v0: initial version. Since the benchmark tasks, the registered ids
      ``cbgym/Scheduling-v0`` / ``SchedulingMasked-v0`` build the default task
      (``cbgym.tasks.DEFAULT_TASK``; ``gym.make`` arguments replace its settings); this class's
      defaults (the table above) are unchanged.

    Example:
        >>> import gymnasium as gym, numpy as np
        >>> import cbgym
        >>> from cbgym import EngineConfig, LinearCostModel, Trace
        >>> trace = Trace.from_arrays(np.arange(64) * 0.05, [300] * 64, [20] * 64)
        >>> cfg = EngineConfig(preset=None, cost_model=LinearCostModel(), num_kv_blocks=512)
        >>> env = gym.make("cbgym/Scheduling-v0", trace=trace, engine=cfg, episode_requests=32)
        >>> obs, info = env.reset(seed=0)
        >>> sorted(obs)
        ['global', 'running', 'running_mask', 'waiting', 'waiting_mask']
        >>> env.action_space  # K + R slot scores, then the default task's running cap
        Box(-1.0, 1.0, (49,), float32)
        >>> obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        >>> sorted(info["reward_components"])
        ['goodput', 'latency', 'shed', 'ttft_miss']
    """

    metadata = {"render_modes": ["ansi", "rgb_array"], "render_fps": 4}

    def __init__(
        self,
        trace: Trace | str | None = None,
        load: float | tuple[float, float] | None = 0.9,
        engine: EngineConfig | None = None,
        episode_requests: int = 512,
        window_start_range: tuple[int, int] | None = None,
        slo: SLOSpec | None = None,
        K: int = 16,
        R: int = 32,
        window_rule: WindowRule = "oldest",
        skip_trivial: bool = True,
        hold_threshold: float = -0.5,
        shed_threshold: float | None = -0.99,
        shed_rule: Literal["late", "unreachable"] = "late",
        admission_cap: bool = False,
        ttft_miss_weight: float = 0.0,
        shed_weight: float = 0.0,
        latency_weight: float = 0.0,
        max_steps: int | None = None,
        capacity_rps: float | None = None,
        masked: bool = False,
        invalid_action: Literal["stop", "noop", "raise"] = "stop",
        render_mode: str | None = None,
        tenant_features: int = 0,
        prefix_features: bool = False,
        arrival_features: bool = False,
    ) -> None:
        if invalid_action not in ("stop", "noop", "raise"):
            raise ValueError(f"invalid_action={invalid_action!r}: expected 'stop', 'noop' "
                             "or 'raise'")
        check_args(K, R, episode_requests, window_rule, hold_threshold, shed_threshold,
                    max_steps, render_mode, self.metadata["render_modes"])
        self._trace_arg = DEFAULT_TRACE if trace is None else trace
        self._base: Trace | None = trace if isinstance(trace, Trace) else None
        self.load = check_load(load)
        self.config = engine if engine is not None else EngineConfig()
        self.episode_requests = episode_requests
        self.window_start_range = window_start_range
        self.slo: SLOSpec = slo if slo is not None else SLO()
        check_slo(self.slo)
        if has_e2e(self.slo):  # (the compiled reward judges TTFT and TPOT)
            raise ValueError("slo: the scheduling env's reward does not judge end-to-end "
                             "deadlines (SLO.e2e_s) yet; simulate() and bench do")
        self.K, self.R = K, R
        self.window_rule = window_rule
        self.skip_trivial = skip_trivial
        self.hold_threshold = hold_threshold
        self.shed_threshold = shed_threshold
        self.shed_rule = shed_rule
        self.shed_lead = shed_lead(shed_rule, self.config)  # (s, s per prompt token)
        self.weights = RewardWeights(ttft_miss_weight, shed_weight, latency_weight)
        self.max_steps = max_steps
        self.capacity_rps = capacity_rps
        self.masked = masked
        self.invalid_action = invalid_action
        self.render_mode = render_mode
        if admission_cap and masked:
            raise ValueError("admission_cap=True: the masked variant caps its admissions by "
                             "STOP; the cap is a score of cbgym/Scheduling-v0")
        self.admission_cap = bool(admission_cap)
        self.layout = ScoreLayout(K, R, self.admission_cap)
        self.STOP = K + R
        self.action_space: spaces.Space = (
            spaces.Discrete(K + R + 1) if masked
            else spaces.Box(-1.0, 1.0, (self.layout.size,), np.float32))
        self._optional = OptionalObs(K, self.config, self._base, tenant_features,
                                     prefix_features, arrival_features)
        self.tenant_features = self._optional.tenant_features
        self.prefix_features = self._optional.prefix_features
        self.arrival_features = self._optional.arrival_features
        self.observation_space = self._optional.space(observation_space(K, R))
        self._sim: Episode | None = None
        self._started = False
        self._episode: Trace | None = None
        self._micro = MicroSteps(K, R) if masked else None
        self._capacity: tuple[Trace, float] | None = None
        self._done = True
        self._steps = 0
        self._last_iteration = 0
        self.ttft_target = np.empty(0)
        self.episode_start = 0

    # ------------------------------------------------------------------ episode
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Start an episode.

        Args:
            seed: seeds ``np_random`` (window start and load draws).
            options: ``{"start": int}`` fixes the window's first request, ``{"load": float or
                None}`` the offered load, ``{"trace": Trace}`` replaces the base trace for this
                episode. Fixing start and load gives common random numbers across agents.
        """
        super().reset(seed=seed)
        options = dict(options or {})
        unknown = set(options) - _OPTION_KEYS
        if unknown:
            raise ValueError(f"reset(options=...): unknown keys {sorted(unknown)}; "
                             f"known: {sorted(_OPTION_KEYS)}")
        base = options["trace"] if "trace" in options else self.base_trace
        if not isinstance(base, Trace):
            raise TypeError(f"options['trace'] must be a Trace, got {type(base).__name__}")
        window = self._window(base, options.get("start"))
        load = options["load"] if "load" in options else self._draw_load()
        if load is not None:
            from cbgym.capacity import scale_to_load

            window = scale_to_load(window, float(load), self.config,
                                   capacity_rps=self._capacity_of(base))
        self._start_episode(window)
        obs, info = self._observe(None)
        assert self._sim is not None
        info["num_shed"] = self._sim.shed_at_start  # requests that could never fit
        return obs, info

    def _start_episode(self, window: Trace) -> None:
        self._optional.start(window)
        self._episode = window
        # NOTE: "every_iteration" makes the engine stop at every iteration where a request
        # waits or memory runs short; it only skips (and fast-forwards) the rest.
        consult = "every_iteration" if self.skip_trivial else "always"
        ttft, tpot = slo_arrays(self.slo, window.slo_class)
        self.ttft_target = ttft
        self._sim = Episode(self, window, consult, ttft, tpot)
        self._started = True
        self._steps = 0
        self._last_iteration = 0
        self._done = False
        self._new_point()

    @property
    def base_trace(self) -> Trace:
        """The trace episodes are drawn from (resolved on first use)."""
        if self._base is None:
            from cbgym.workload import load_trace

            self._base = load_trace(str(self._trace_arg))
        return self._base

    def _window(self, base: Trace, start: int | None) -> Trace:
        n = min(self.episode_requests, len(base))
        if start is None:
            start = draw_start(self.np_random, len(base), n, self.window_start_range)
        elif not 0 <= int(start) <= len(base) - n:
            raise ValueError(f"options['start']={start}: expected 0 <= start <= "
                             f"{len(base) - n} for {n}-request windows of {len(base)} requests")
        self.episode_start = int(start)
        return base.window(int(start), n)

    def _draw_load(self) -> float | None:
        return draw_load(self.np_random, self.load)

    def _capacity_of(self, base: Trace) -> float:
        if self.capacity_rps is not None:
            return self.capacity_rps
        if self._capacity is not None and self._capacity[0] is base:
            return self._capacity[1]
        from cbgym.capacity import measure_capacity

        mu = measure_capacity(base, self.config)
        self._capacity = (base, mu)
        return mu

    # ------------------------------------------------------------------ stepping
    def step(
        self, action: np.ndarray | int
    ) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        """Apply ``action`` to the pending decision; see the class docstring."""
        if not self._started or self._done:
            raise ResetNeeded("call reset() before step() (and after an episode ended)")
        invalid = False
        sim = self._sim
        assert sim is not None
        if sim.drained:
            # every request ended before the first decision (none could ever fit): the
            # action (still checked) has nothing to act on and the episode ends here
            if self.masked:
                try:
                    check_discrete(action, self.action_masks(), lambda j: "only STOP: drained")
                except InvalidActionError:
                    if self.invalid_action == "raise":
                        raise
                    invalid = True
            else:
                check_scores(action, self.layout.size)
            outcome = None
        elif self.masked:
            try:
                outcome = self._micro_step(action)
            except InvalidActionError:
                if self.invalid_action == "raise":
                    raise
                invalid = True  # "stop": run the iteration with the choices made so far
                outcome = self._micro_step(self.STOP, checked=False) \
                    if self.invalid_action == "stop" else None
        else:
            outcome = sim.run_scores(action)
            self._new_point()
        self._steps += 1
        terminated = sim.drained
        truncated = not terminated and (sim.stuck or (
            self.max_steps is not None and self._steps >= self.max_steps))
        self._done = terminated or truncated
        reward = outcome.reward if outcome is not None else 0.0
        obs, info = self._observe(outcome)
        if sim.stuck:
            info["truncated_reason"] = "idle_hold_limit"
        if self.masked:
            info["invalid_action"] = invalid
        return obs, reward, terminated, truncated, info

    def _micro_step(self, action: object, checked: bool = True) -> StepOutcome | None:
        """One micro-step (``checked=False``: a STOP past the mask, for invalid actions)."""
        ms, sim = self._micro, self._sim
        assert ms is not None and sim is not None
        if checked:
            es = sim.es
            i = check_discrete(action, ms.mask, lambda j: ms.describe(
                j, sim.shortfall, int(es.win[ko.NW]), int(es.win[ko.NR])))
            if ms.choose(sim.engine.state, es, i) == mo.MORE:
                return None
        outcome = sim.run_point(ms.m)
        self._new_point()
        return outcome

    def _new_point(self) -> None:
        """A new decision point: fresh micro-step choices (masked variant)."""
        sim = self._sim
        if self._micro is not None and sim is not None:
            self._micro.begin(sim.es, sim.done)

    # ------------------------------------------------------------------ views
    def _observe(self, outcome: StepOutcome | None
                 ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        ms, sim = self._micro, self._sim
        assert sim is not None
        obs, waited = sim.observe(ms.chosen_w if ms else None, ms.chosen_r if ms else None)
        obs.update(self._optional.encode(sim))
        iterations = 0
        if outcome is not None:
            iteration = sim.engine.iteration
            iterations, self._last_iteration = iteration - self._last_iteration, iteration
        info: dict[str, Any] = {
            "reward_components": (dict(outcome.components) if outcome is not None
                                  else dict.fromkeys(COMPONENTS, 0.0)),
            "engine_iterations": int(iterations),
            "sim_time_elapsed": outcome.sim_time_elapsed if outcome is not None else 0.0,
            "sim_time_s": sim.engine.now,
            "num_finished": outcome.num_finished if outcome is not None else 0,
            "num_good": outcome.num_good if outcome is not None else 0,
            "num_shed": outcome.num_shed if outcome is not None else 0,
            "waiting_time_in_system_s": waited,
        }
        if self.masked:
            info["action_mask"] = self.action_masks()
            info["invalid_action"] = False
        return obs, info

    def action_masks(self) -> np.ndarray:
        """Allowed ``SchedulingMasked-v0`` actions (int8, K + R + 1); STOP only when idle.

        Safe before ``reset`` and after an episode ended (MaskablePPO may ask then).
        """
        if not self.masked:
            raise AttributeError("action_masks() belongs to cbgym/SchedulingMasked-v0")
        if self._micro is None or self._done or self._sim is None:
            mask = np.zeros(self.K + self.R + 1, dtype=np.int8)
            mask[self.STOP] = 1
            return mask
        return self._micro.mask.copy()

    # ------------------------------------------------------------------ public accessors
    @property
    def episode_trace(self) -> Trace:
        """The current episode's requests, arrivals already scaled to the load."""
        if self._episode is None:
            raise ResetNeeded("no episode yet: call reset()")
        return self._episode

    @property
    def engine(self) -> Engine:
        """The current episode's engine (for inspection; stepping it directly breaks the env)."""
        if not self._started:
            raise ResetNeeded("no episode yet: call reset()")
        assert self._sim is not None
        return self._sim.engine

    @property
    def decision_point(self) -> DecisionPoint | None:
        """The pending decision point (None once the episode drained)."""
        if self._sim is None or self._sim.done:
            return None
        return self._sim.engine.next_decision()

    @property
    def visible_waiting_ids(self) -> np.ndarray:
        """Request ids of the visible waiting slots, in slot order."""
        return self._sim.w_ids.copy() if self._sim is not None else np.empty(0, np.int64)

    @property
    def visible_running_ids(self) -> np.ndarray:
        """Request ids of the visible running slots, in slot order."""
        return self._sim.r_ids.copy() if self._sim is not None else np.empty(0, np.int64)

    def privileged_true_output_tokens(self) -> np.ndarray:
        """PRIVILEGED (oracles only): true output lengths of the visible waiting slots.

        Shape (K,), float64, NaN for empty slots. Never part of the observation or info.
        """
        out = np.full(self.K, np.nan)
        if self._episode is not None and self._sim is not None:
            w_ids = self._sim.w_ids
            out[: len(w_ids)] = self._episode.output_tokens[w_ids]
        return out

    def privileged_episode_true_output_tokens(self) -> np.ndarray:
        """PRIVILEGED (oracles only): true output lengths of every request of the episode."""
        return self.episode_trace.output_tokens.copy()

    def episode_result(self) -> SimulationResult:
        """The finished episode as a :class:`~cbgym.metrics.SimulationResult`."""
        from cbgym.simulate import collect

        return collect(self.engine, self.slo, meta={"policy": "env", "load": None,
                                                    "trace": self.episode_trace.name})

    # ------------------------------------------------------------------ rendering
    def render(self) -> str | np.ndarray | None:
        """The queue, the batch and KV usage: text for ``render_mode="ansi"``, a (96, 192, 3)
        uint8 picture for ``"rgb_array"`` (see :mod:`cbgym.env.render`), else None."""
        if self.render_mode == "rgb_array":
            return render_rgb(self)
        if self.render_mode != "ansi":
            return None
        if not self._started:
            return "SchedulingEnv: call reset()\n"
        return render_text(self)


class SchedulingMaskedEnv(SchedulingEnv):
    """``cbgym/SchedulingMasked-v0``: :class:`SchedulingEnv` with ``Discrete(K + R + 1)``
    micro-step actions and ``action_masks()`` for sb3-contrib's MaskablePPO.

    Same arguments as :class:`SchedulingEnv` (``masked`` is fixed to True); see its docstring.
    """

    def __init__(self, **kwargs: Any) -> None:
        if "masked" in kwargs:
            raise TypeError("SchedulingMaskedEnv is always masked; do not pass masked=")
        super().__init__(masked=True, **kwargs)
