"""Native vector envs: ``gymnasium.make_vec("cbgym/Scheduling-v0", num_envs=N)``.

One :func:`~cbgym.env.vector_ops.step_batch` call steps all N envs on numba's threads and
writes into preallocated buffers (CartPoleVectorEnv's batched arrays, EnvPool's one call);
finished envs start their next episode inside that call. Env i of ``reset(seed=s)`` is
seeded with s + i and its trajectory is bit for bit that of ``SchedulingEnv`` reset with
s + i, whatever N and the thread count (``tests/test_vector_env.py``).

| Argument        | Default     | Description                                              |
|-----------------|-------------|----------------------------------------------------------|
| num_envs        | 1           | N                                                        |
| autoreset_mode  | NEXT_STEP   | or SAME_STEP (``final_obs``/``final_info``), DISABLED     |
| num_threads     | min(N, cpus)| numba threads stepping the envs                          |
| observation     | "dict"      | the single env's Dict, batched; or "flat": one (N, D) Box |
| copy            | True        | hand out copies of the buffers (False: views, overwritten)|
| **kwargs        |             | every :class:`~cbgym.env.SchedulingEnv` argument          |

``observation="flat"`` orders the keys as ``gymnasium.spaces.flatten`` does (sorted:
global, running, running_mask, waiting, waiting_mask), as
:class:`~cbgym.env.wrappers.FlattenSchedulingObservation`. Infos are Gymnasium's dict of
arrays with ``_key`` masks: ``reward_components`` (goodput, ttft_miss, shed, latency),
``num_finished``, ``num_good``, ``num_shed``, ``engine_iterations``, ``sim_time_s``,
``sim_time_elapsed``, ``waiting_time_in_system_s`` (N, K) and ``truncated_reason`` where an
env hit the idle-hold limit. The time series of episodes is not kept.

Prefix caching (``EngineConfig(enable_prefix_caching=True)`` on a trace with block ids) runs
compiled: each env's engine names its blocks, its episode's hashes a slice of the whole
trace's. Not compiled in: the observations ``tenant_features``, ``arrival_features`` and
``prefix_features`` (:func:`native_lacks`) are refused here; ``gym.make_vec`` builds a
:class:`~cbgym.env.sync_vector.SyncTaskVectorEnv` of single envs for them.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numba
import numpy as np
from gymnasium import spaces
from gymnasium.error import ResetNeeded
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from cbgym.engine import gaps
from cbgym.engine import layout as L
from cbgym.engine import prefix_cache as pc
from cbgym.engine.config import EngineConfig
from cbgym.engine.engine import compile_params, host_swap_tokens
from cbgym.engine.jit import bind
from cbgym.engine.trace_setup import caches_prefixes, trace_block_hashes
from cbgym.env import kernel_ops as ko
from cbgym.env import micro_ops as mo
from cbgym.env import vector_ops as vo
from cbgym.env.action import InvalidActionError
from cbgym.env.observation import slot_template
from cbgym.env.scheduling_env import (
    SchedulingEnv,
    SchedulingMaskedEnv,
)
from cbgym.env.vector_common import (
    REC_ROWS,
    env_seeds,
    native_lacks,
    native_only,
    reset_options,
    use_threads,
)
from cbgym.env.vector_infos import batch_infos, final_observations
from cbgym.env.vector_windows import WindowDraws
from cbgym.metrics import slo_arrays
from cbgym.workload.trace import Trace

__all__ = ["SchedulingMaskedVectorEnv", "SchedulingVectorEnv", "env_seeds", "native_lacks",
           "use_threads"]


class SchedulingVectorEnv(VectorEnv):
    """N ``cbgym/Scheduling-v0`` envs stepped by one compiled call; see the module docstring."""

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": []}

    def __init__(self, num_envs: int = 1, autoreset_mode: AutoresetMode | str =
                 AutoresetMode.NEXT_STEP, num_threads: int | None = None,
                 observation: str = "dict", copy: bool = True,
                 max_episode_steps: int | None = None, **kwargs: Any) -> None:
        if not isinstance(num_envs, int | np.integer) or isinstance(num_envs, bool) \
                or num_envs < 1:
            raise ValueError(f"num_envs={num_envs!r}: expected an int >= 1")
        if observation not in ("dict", "flat"):
            raise ValueError(f"observation={observation!r}: expected 'dict' or 'flat'")
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self.metadata = {**self.metadata, "autoreset_mode": self.autoreset_mode}
        if num_threads is None:
            num_threads = min(int(num_envs), numba.config.NUMBA_NUM_THREADS)
        if not isinstance(num_threads, int) or not 1 <= num_threads \
                <= numba.config.NUMBA_NUM_THREADS:
            raise ValueError(f"num_threads={num_threads!r}: expected an int in [1, "
                             f"{numba.config.NUMBA_NUM_THREADS}] (numba's thread count)")
        if kwargs.get("render_mode") is not None:
            raise ValueError("the native vector env does not render; build single envs "
                             "(gym.make_vec(..., vectorization_mode='sync')) to record video")
        if max_episode_steps is not None:
            kwargs.setdefault("max_steps", max_episode_steps)
        self.proto = proto = self._single_env(kwargs)
        native_only(proto)
        self.num_envs, self.num_threads, self.copy = int(num_envs), num_threads, copy
        self.observation_mode = observation
        self._setup_spaces(proto)
        self._setup_state(proto)
        self._autoreset = np.zeros(self.num_envs, np.bool_)
        self._no_reset = np.zeros(self.num_envs, np.bool_)
        self._all = np.ones(self.num_envs, np.bool_)
        self._started = False
        self._bind()

    def _bind(self) -> None:
        """The batch kernels, bound to this vector's array types (see jit.bind)."""
        self._state_args = (self.S, self.params, self.E, self.V, self.base, self.windows,
                            self.acts, self.out)
        self._tail_args = (self.weights, self.max_steps, np.int64(self.n), self.host_free,
                           self.scratch)
        self._step_batch = bind(vo.step_batch, *self._state_args, self.final, self._no_reset,
                                True, *self._tail_args)
        self._reset_batch = bind(vo.reset_batch, *self._state_args, self._all,
                                 np.int64(self.n), self.host_free, self.scratch)

    def _single_env(self, kwargs: dict[str, Any]) -> SchedulingEnv:
        """The argument checks, spaces and trace of one env (never stepped)."""
        return SchedulingEnv(**kwargs)

    # ------------------------------------------------------------------ setup
    def _setup_spaces(self, proto: SchedulingEnv) -> None:
        self.single_action_space = proto.action_space
        self.action_space = batch_space(proto.action_space, self.num_envs)
        dict_space = proto.observation_space
        if self.observation_mode == "flat":
            self.single_observation_space = spaces.flatten_space(dict_space)
        else:
            self.single_observation_space = dict_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)

    def _setup_state(self, proto: SchedulingEnv) -> None:
        cfg, N = proto.config, self.num_envs
        assert cfg.num_kv_blocks is not None and cfg.block_size is not None
        base_trace = proto.base_trace
        self.n = n = min(proto.episode_requests, len(base_trace))
        consult = "every_iteration" if proto.skip_trivial else "always"
        prefix = caches_prefixes(base_trace, cfg)
        self.params = compile_params(cfg, consult, False, False, prefix=prefix)
        self.host_free = np.int64(host_swap_tokens(cfg))
        ttft, tpot = slo_arrays(proto.slo, base_trace.slo_class)
        mu = proto._capacity_of(base_trace) if proto.load is not None else np.nan
        self.base = vo.frozen_base(vo.Base(
            base_trace.arrival_s, base_trace.prompt_tokens, base_trace.output_tokens, ttft, tpot,
            slot_template(base_trace.prompt_tokens, base_trace.tenant, base_trace.slo_class),
            np.array([mu]), *self._hashes(base_trace, cfg, prefix)))
        pool = (pc.empty_pool(cfg.num_kv_blocks, int(np.max(
            self.base.hash_off[n:] - self.base.hash_off[:-n]))) if prefix else pc.no_pool())
        self.S = L.State(
            np.zeros((N, L.NUM_REQ_ROWS, n), np.int64), np.zeros((N, L.NUM_TIME_ROWS, n)),
            np.zeros((N, L.NUM_ID_ROWS, n), np.int64),
            np.zeros((N, L.NUM_SI), np.int64), np.zeros((N, L.ITL)),  # (no ITL histogram)
            np.zeros((N, REC_ROWS, len(L.REC_COLUMNS))), np.zeros((N, 1, 3), np.int64),
            np.zeros((N, 1, 2), np.int64), np.zeros((N, cfg.block_size), np.int64),
            np.zeros((N, gaps.window_slots(base_trace.output_tokens, n))),
            *(np.zeros((N, *a.shape), np.int64) for a in pool))
        settings = ko.env_settings(proto.K, proto.R, proto.window_rule == "smallest_prompt",
                                   proto.hold_threshold, proto.shed_threshold,
                                   cfg.max_num_batched_tokens, cfg.max_num_seqs,
                                   cfg.num_kv_blocks, proto.shed_lead, proto.admission_cap)
        self.E = ko.alloc_env_state(settings, n, (N,))
        self.V = np.zeros((N, vo.NUM_V), np.int64)
        self.slices = vo.obs_slices(proto.K, proto.R)
        self.draws = WindowDraws(proto, self.base, n, N)
        self.windows = self.draws.windows  # what the kernel reads
        K, R = proto.K, proto.R
        self.acts = vo.Acts(np.zeros((N, proto.layout.size)), np.zeros(N, np.int64),
                            np.zeros((N, mo.micro_size(K, R)), np.int64),
                            np.zeros((N, K + R + 1), np.int8),
                            np.array([proto.masked, proto.invalid_action == "stop"], np.int64))
        self.out, self.final = self._new_out(), self._new_out()
        self.scratch = np.zeros((N, n))
        self.weights = np.array([proto.weights.ttft_miss, proto.weights.shed,
                                 proto.weights.latency], np.float64)
        self.max_steps = np.int64(-1 if proto.max_steps is None else proto.max_steps)

    @staticmethod
    def _hashes(trace: Trace, cfg: EngineConfig, prefix: bool) -> tuple[np.ndarray, np.ndarray]:
        """Base.hashes and Base.hash_off: the whole trace's block hashes, each episode's
        window a slice (equal where the window's own would be equal: the same hits)."""
        if not prefix:
            return np.zeros(1, np.int64), np.zeros(1, np.int64)
        return (trace_block_hashes(trace, cfg),
                pc.table_offsets(trace.prompt_tokens, trace.output_tokens, cfg.block_size))

    def _new_out(self) -> vo.Out:
        N, K = self.num_envs, self.proto.K
        D = self.slices["waiting_mask"].stop
        return vo.Out(np.zeros((N, D), np.float32), np.zeros((N, K)),
                      np.zeros((vo.NUM_I, N), np.int64), np.zeros((vo.NUM_F, N)))

    # ------------------------------------------------------------------ the Gymnasium API
    def reset(self, *, seed: int | list[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Start episodes: all envs, or those in ``options["reset_mask"]``.

        Args:
            seed: env i gets ``seed + i`` (an int), or ``seed[i]`` (a list); None keeps the
                envs' generators going (each env's next window was drawn one episode ahead).
            options: ``reset_mask`` (bool, N); ``start`` (int, or one per env) and ``load``
                (float or None, or one per env) fix the window as the single env's options do
                (the generators still advance as if drawn, so with these options env i no
                longer matches a single env draw for draw).
        """
        mask, fixed = reset_options(options, self.num_envs, self._started)
        seeds = env_seeds(seed, self.num_envs)
        windows = self.draws.fixed(fixed, mask)
        # everything checked: now apply
        reseeded = [i for i in np.flatnonzero(mask) if seeds[i] is not None or not self._started]
        for i in reseeded:
            self.draws.reseed(i, seeds[i])
        if isinstance(seed, int | np.integer) and not isinstance(seed, bool):
            self._np_random, self._np_random_seed = seeding.np_random(int(seed))
        self.draws.draw(np.array(reseeded, np.int64))  # the others drew theirs ahead
        self.draws.apply(windows)
        self.draws.check(mask)
        self._threads()
        self._reset_batch(*self._state_args, mask, np.int64(self.n), self.host_free,
                          self.scratch)
        self.draws.refill(self.V)
        self._autoreset[mask] = False
        self._started = True
        return self._observation(), self._infos(self.out, mask.copy())

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray,
                                          dict[str, Any]]:
        if not self._started:
            raise ResetNeeded("call reset() before step()")
        self._actions(actions)
        if self.autoreset_mode == AutoresetMode.DISABLED:
            ended = np.flatnonzero(self.V[:, vo.ENDED])
            if len(ended):
                raise ResetNeeded(f"envs {ended.tolist()} ended: reset them with "
                                  "reset(options={'reset_mask': mask}) (autoreset DISABLED)")
        same = self.autoreset_mode == AutoresetMode.SAME_STEP
        reset = self._autoreset if self.autoreset_mode == AutoresetMode.NEXT_STEP \
            else self._no_reset
        self.draws.check(reset)
        self._threads()
        started = self._step_batch(*self._state_args, self.final, reset, same, *self._tail_args)
        if started < 0:
            a = self.acts.scores
            i, j = divmod(-1 - started, a.shape[1])
            raise InvalidActionError(f"actions[{i}, {j}] is {a[i, j]}; scores must be finite "
                                     "and in [-1, 1] (clip the policy's output)")
        if started:
            self.draws.refill(self.V)
        ii, ff = self.out.info_i, self.out.info_f
        terminated, truncated = ii[vo.I_TERMINATED] != 0, ii[vo.I_TRUNCATED] != 0
        reward = ff[vo.F_REWARD].copy()
        ended = terminated | truncated
        infos = self._infos(self.out, self._all.copy())
        if same and ended.any():
            infos["final_obs"] = final_observations(
                self.final.obs, ended, None if self.observation_mode == "flat" else self.slices)
            infos["_final_obs"] = ended.copy()
            infos["final_info"] = self._infos(self.final, ended.copy(), final=True)
            infos["_final_info"] = ended.copy()
        self._autoreset = ended
        return self._observation(), reward, terminated, truncated, infos

    def _threads(self) -> None:
        use_threads(self.num_threads)

    def _actions(self, actions: Any) -> None:
        """Copy the actions into the kernel's buffer: (N, layout size) scores (their ranges are
        checked by the kernel)."""
        size = self.proto.layout.size
        if type(actions) is np.ndarray and actions.shape == (self.num_envs, size) \
                and actions.dtype.kind == "f":  # the usual case: one cast into the buffer
            self.acts.scores[:] = actions
            return
        try:
            a = np.asarray(actions, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise InvalidActionError(f"actions must be a float array of shape "
                                     f"({self.num_envs}, {size}): {exc}") from exc
        if a.shape != (self.num_envs, size):
            raise InvalidActionError(f"actions have shape {a.shape}; expected "
                                     f"({self.num_envs}, {size}) (one score vector per env)")
        self.acts.scores[:] = a

    def action_masks(self) -> np.ndarray:
        """The allowed picks of every env (masked variant): int8, (N, K + R + 1)."""
        raise AttributeError("action_masks() belongs to cbgym/SchedulingMasked-v0")

    # ------------------------------------------------------------------ outputs
    def _observation(self, out: vo.Out | None = None, copy: bool | None = None) -> Any:
        """The batch's observation: one copy of the flat buffer, and Dict keys as views."""
        flat = (self.out if out is None else out).obs
        if self.copy if copy is None else copy:
            flat = flat.copy()
        if self.observation_mode == "flat":
            return flat
        return {key: flat[:, sl] for key, sl in self.slices.items()}

    def _infos(self, out: vo.Out, mask: np.ndarray, final: bool = False) -> dict[str, Any]:
        return batch_infos(out, mask, self.acts.mask if self.proto.masked else None,
                           self.proto.STOP, final)

    # ------------------------------------------------------------------ misc
    _BOUND = ("_step_batch", "_reset_batch", "_state_args", "_tail_args")

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in self._BOUND}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.base = vo.frozen_base(self.base)  # (unpickled arrays are writable)
        self._bind()

    def close_extras(self, **kwargs: Any) -> None:
        pass

    def __repr__(self) -> str:
        return (f"SchedulingVectorEnv(num_envs={self.num_envs}, "
                f"autoreset_mode={self.autoreset_mode.name}, threads={self.num_threads})")


def make_vector(env_id: str, num_envs: int, **kwargs: Any) -> gym.vector.VectorEnv:
    """``gymnasium.make_vec`` with the native vector env (a shortcut for scripts)."""
    return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point",
                        **kwargs)


class SchedulingMaskedVectorEnv(SchedulingVectorEnv):
    """N ``cbgym/SchedulingMasked-v0`` envs: one ``Discrete(K + R + 1)`` pick per env and
    step, ``action_masks()`` batched (N, K + R + 1) for MaskablePPO. A masked pick acts as the
    single env's ``invalid_action`` says ("stop" by default; "raise" checks every pick
    before anything steps)."""

    def _single_env(self, kwargs: dict[str, Any]) -> SchedulingEnv:
        return SchedulingMaskedEnv(**kwargs)

    def _actions(self, actions: Any) -> None:
        try:
            a = np.asarray(actions)
        except (TypeError, ValueError) as exc:
            raise InvalidActionError(f"actions must be {self.num_envs} integer picks: {exc}"
                                     ) from exc
        if a.shape != (self.num_envs,):
            raise InvalidActionError(f"actions have shape {a.shape}; expected "
                                     f"({self.num_envs},): one pick per env")
        picks = self.acts.picks
        if a.dtype.kind in "iu" or a.dtype == np.bool_:
            picks[:] = a
        elif self.proto.invalid_action == "raise":
            raise InvalidActionError(f"actions must be integer picks in [0, {self.proto.STOP}]"
                                     f", got dtype {a.dtype}")
        else:
            picks[:] = -1  # malformed: each acts as a masked pick (STOP or no-op)
        if self.proto.invalid_action == "raise":
            inside = (picks >= 0) & (picks <= self.proto.STOP)
            allowed = inside & (self.acts.mask[np.arange(self.num_envs),
                                               np.where(inside, picks, 0)] != 0)
            if self.autoreset_mode == AutoresetMode.NEXT_STEP:
                allowed |= self._autoreset  # these envs reset: their picks are ignored
            if not allowed.all():
                i = int(np.flatnonzero(~allowed)[0])
                raise InvalidActionError(f"actions[{i}] = {int(picks[i])} is masked; allowed: "
                                         f"{np.flatnonzero(self.acts.mask[i]).tolist()}")

    def action_masks(self) -> np.ndarray:
        """The allowed picks of every env: int8, (N, K + R + 1) (STOP only before reset)."""
        if not self._started:
            mask = np.zeros_like(self.acts.mask)
            mask[:, self.proto.STOP] = 1
            return mask
        return self.acts.mask.copy()
