"""The native vector env of ``cbgym/Cluster-v0``: ``gymnasium.make_vec(id, num_envs=N)``.

One :func:`~cbgym.env.cluster_vector_ops.step_batch` call steps all N cluster envs on
numba's threads: each env applies its route, runs its own compiled cluster loop to its next
routing point, counts its good requests and encodes its observation (the one encoder
``ClusterEnv`` uses too), into preallocated buffers. Env i of ``reset(seed=s)`` is seeded
with s + i and its trajectory is bit for bit that of ``ClusterEnv`` reset with s + i, in
the three autoreset modes, whatever N and the thread count
(``tests/test_cluster_vector_env.py``).

| Argument        | Default      | Description                                              |
|-----------------|--------------|----------------------------------------------------------|
| num_envs        | 1            | N                                                        |
| autoreset_mode  | NEXT_STEP    | or SAME_STEP (``final_obs``/``final_info``), DISABLED     |
| num_threads     | min(N, cpus) | numba threads stepping the envs                          |
| copy            | True         | hand out copies of the buffers (False: views, overwritten)|
| **kwargs        |              | every :class:`~cbgym.env.cluster_env.ClusterEnv` argument |

What runs where. *Compiled, one call per step*: routing, the cluster loops, the goodput
count, the observation. *Python*: starting an episode (each env draws its window start, its
load and its cluster's seed from its own generator in ``ClusterEnv.reset``'s order and
builds a fresh ``Cluster`` with ``ClusterEnv.new_episode``: about 1 ms, once per episode),
checking actions, building infos, and the rare stops a loop cannot serve itself
(``Cluster.serve_stop``: a buffer that must grow, a door-asked local policy, a full
time-series buffer), after which that env alone is resumed by another compiled call.

Spaces: ``ClusterEnv``'s, batched: actions ``MultiDiscrete([A] * N)`` (route indices; a
masked or out-of-range one raises :class:`~cbgym.env.action.InvalidActionError` before
anything steps), observations the Dict of ``request`` (N, 4) and ``instances`` (N, I, 17)
float32 (N, I, 20 with prefix caching, each instance's cache probed in the kernel, or with
``prefix_features=True``);
``action_masks()`` (N, A). Infos are Gymnasium's dict of arrays with ``_key`` masks, as
``SyncVectorEnv`` of ``ClusterEnv`` builds them: ``num_good`` and
``action_mask`` for envs that stepped; ``window_start``, ``load`` and ``action_mask`` for
envs that started an episode.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from gymnasium.error import ResetNeeded
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from cbgym.cluster import state as K
from cbgym.cluster.cluster import Cluster
from cbgym.engine.jit import bind
from cbgym.env import cluster_vector_ops as co
from cbgym.env.action import InvalidActionError
from cbgym.env.cluster_env import ClusterEnv
from cbgym.env.vector_common import env_seeds, reset_options, use_threads
from cbgym.metrics import has_e2e, tbt_targets

__all__ = ["ClusterVectorEnv"]

# numba's type of the clusters' typed list (the first one built in this process): jit.bind
# keys a typed list by its class alone, so only lists of this type use a bound entry point
_LIST_TYPE: list[Any] = []


class ClusterVectorEnv(VectorEnv):
    """N ``cbgym/Cluster-v0`` envs stepped by one compiled call; see the module docstring.

    The clusters live in a numba typed list of per-env ``(ClusterState, State, Params)``
    tuples, the very arrays of each env's Python ``Cluster``, rather than in arrays with a
    leading env dimension: an episode starts by building a fresh ``Cluster`` (no copy into
    a batch), a buffer grows for one env alone (``Cluster._grow`` hands a new tuple, put in
    its slot), and the Python side of a stop reads the same arrays the kernel wrote.
    """

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": []}

    def __init__(self, num_envs: int = 1, autoreset_mode: AutoresetMode | str =
                 AutoresetMode.NEXT_STEP, num_threads: int | None = None, copy: bool = True,
                 max_episode_steps: int | None = None, **kwargs: Any) -> None:
        if not isinstance(num_envs, int | np.integer) or isinstance(num_envs, bool) \
                or num_envs < 1:
            raise ValueError(f"num_envs={num_envs!r}: expected an int >= 1")
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self.metadata = {**self.metadata, "autoreset_mode": self.autoreset_mode}
        cpus = numba.config.NUMBA_NUM_THREADS
        if num_threads is None:
            num_threads = min(int(num_envs), cpus)
        if isinstance(num_threads, bool) or not isinstance(num_threads, int) \
                or not 1 <= num_threads <= cpus:
            raise ValueError(f"num_threads={num_threads!r}: expected an int in [1, {cpus}] "
                             "(numba's thread count)")
        if max_episode_steps is not None:
            raise ValueError("the cluster env ends when its window drains; it has no "
                             f"step limit (max_episode_steps={max_episode_steps!r})")
        if kwargs.pop("render_mode", None) is not None:
            raise ValueError("cbgym/Cluster-v0 does not render")
        if kwargs.get("admission") is not None or kwargs.get("client") is not None:
            raise NotImplementedError(
                "ClusterVectorEnv: the native vector env has no edge yet (admission= and "
                "client=); gym.make_vec builds a SyncVectorEnv of ClusterEnv for such tasks")
        self.proto = proto = ClusterEnv(**kwargs)  # the arguments' checks, spaces, routes
        if has_e2e(proto.slo):
            raise NotImplementedError("ClusterVectorEnv: the native vector env's compiled "
                                      "reward has no end-to-end deadlines (SLO.e2e_s) yet")
        proto.capacity()  # measured once, shared by every env
        self.num_envs, self.num_threads, self.copy = int(num_envs), num_threads, copy
        E = self.num_envs
        self.single_observation_space = proto.observation_space
        self.single_action_space = proto.action_space
        self.observation_space = batch_space(proto.observation_space, E)
        self.action_space = batch_space(proto.action_space, E)
        self.routes = proto.routes
        table = np.array([(-1 if r.prefill is None else r.prefill,
                           -1 if r.shed_reason is not None else r.decode, r.chunk_cap)
                          for r in self.routes], np.int64)
        n, A = proto.n, len(self.routes)
        self.B = co.Batch(table, np.zeros(E, np.int64), np.zeros(E, np.int64),
                          np.zeros((E, co.NUM_G), np.int64), np.full((E, n), np.inf),
                          np.zeros((E, n), np.int8))
        self.B.g[:, co.STOP] = -1
        self.out = co.Out(np.zeros((E, 4), np.float32),
                          np.zeros((E, *proto.observation_space["instances"].shape),
                                   np.float32),
                          np.zeros(E), np.zeros(E, np.bool_))
        self._mask = proto.action_masks()
        self._bind_check()
        self._route_all = np.full(E, co.ROUTE)
        self._masks = np.tile(self._mask, (E, 1))
        self.clusters: list[Cluster | None] = [None] * E
        self._rngs: list[np.random.Generator | None] = [None] * E
        self._window = (np.zeros(E, np.int64), np.zeros(E))  # each episode's start, load
        self._states: Any = None  # the typed list, with the first episode
        self._step: Any = None
        self._autoreset = np.zeros(E, np.bool_)  # ended last step (NEXT_STEP: resets now)
        self._started = False
        assert A == self._mask.size

    # ------------------------------------------------------------------ the Gymnasium API
    def reset(self, *, seed: int | list[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[dict[str, np.ndarray],
                                                              dict[str, Any]]:
        """Start episodes: all envs, or those in ``options["reset_mask"]``.

        Args:
            seed: env i gets ``seed + i`` (an int), or ``seed[i]`` (a list); None keeps the
                envs' generators going.
            options: ``reset_mask`` (bool, N); ``start`` and ``load`` fix the window as
                ``ClusterEnv``'s options do (one value for every env, or one per env, None
                for drawn), and as there the fixed draws are skipped.
        """
        mask, fixed = reset_options(options, self.num_envs, self._started, need_one=True)
        E = self.num_envs
        seeds = env_seeds(seed, self.num_envs)
        per_env = [{} for _ in range(E)]  # type: list[dict[str, Any]]
        for key, value in fixed.items():
            values = list(value) if isinstance(value, list | tuple | np.ndarray) \
                else [value] * E
            if len(values) != E:
                raise ValueError(f"reset(options={{{key!r}: ...}}): one value or {E}")
            for opts, v in zip(per_env, values, strict=True):
                if v is not None:
                    opts[key] = v
        if isinstance(seed, int | np.integer) and not isinstance(seed, bool):
            self._np_random, self._np_random_seed = seeding.np_random(int(seed))
        for e in np.flatnonzero(mask):
            if seeds[e] is not None or self._rngs[e] is None:
                self._rngs[e] = seeding.np_random(seeds[e])[0]
            self._begin(e, per_env[e])
        self._run(np.where(mask, co.RESUME, co.IDLE))
        self._autoreset[mask] = False
        self._started = True
        return self._observation(), self._infos(np.zeros(E, np.bool_), mask)

    def step(self, actions: Any) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray,
                                          np.ndarray, dict[str, Any]]:
        if not self._started:
            raise ResetNeeded("call reset() before step()")
        mode = self.autoreset_mode
        if mode == AutoresetMode.DISABLED and self._autoreset.any():
            raise ResetNeeded(f"envs {np.flatnonzero(self._autoreset).tolist()} ended: reset "
                              "them with reset(options={'reset_mask': mask}) (autoreset "
                              "DISABLED)")
        resets = self._autoreset.copy() if mode == AutoresetMode.NEXT_STEP \
            else np.zeros(self.num_envs, np.bool_)
        self._check(actions, resets)
        if resets.any():  # next-step autoreset: these envs start an episode instead
            for e in np.flatnonzero(resets):
                self._begin(e, {})
            self._run(np.where(resets, co.RESUME, co.ROUTE))
        else:
            self._run(self._route_all)
        reward, terminated = self.out.reward.copy(), self.out.terminated.copy()
        truncated = np.zeros(self.num_envs, np.bool_)
        stepped = ~resets
        if mode == AutoresetMode.SAME_STEP and terminated.any():
            last = self._observation(copy=True)
            final_obs = np.full(self.num_envs, None, dtype=object)
            for e in np.flatnonzero(terminated):
                final_obs[e] = {k: v[e] for k, v in last.items()}
            final_info = self._infos(terminated, np.zeros(self.num_envs, np.bool_))
            for e in np.flatnonzero(terminated):
                self._begin(e, {})
            self._run(np.where(terminated, co.RESUME, co.IDLE))
            infos = self._infos(stepped & ~terminated, terminated)
            infos["final_obs"], infos["_final_obs"] = final_obs, terminated.copy()
            infos["final_info"], infos["_final_info"] = final_info, terminated.copy()
            self._autoreset[:] = False
        else:
            infos = self._infos(stepped, resets)
            self._autoreset = terminated.copy()
        return self._observation(), reward, terminated, truncated, infos

    def action_masks(self) -> np.ndarray:
        """The allowed routes of every env: bool, (N, A) (the same for every env and step)."""
        return self._masks.copy()

    # ------------------------------------------------------------------ episodes, the kernel
    def _begin(self, e: int, options: dict[str, Any]) -> None:
        """Env e's next episode: a fresh cluster, drawn as ClusterEnv.reset draws it; the
        next compiled call (RESUME) runs it to its first routing point."""
        rng = self._rngs[e]
        assert rng is not None
        cluster, start, load = self.proto.new_episode(rng, options)
        self.clusters[e] = cluster
        tbt = tbt_targets(self.proto.slo, cluster.trace.slo_class)
        self.B.tbt[e] = np.inf if tbt is None else tbt
        self.B.g[e] = (0, 0, 0, -1, tbt is not None)
        self.B.shed[e] = 0
        self._window[0][e], self._window[1][e] = start, load
        self._place(e, cluster)

    def _place(self, e: int, cluster: Cluster) -> None:
        """Put env e's arrays in the kernel's list (built with the first cluster)."""
        C, S, P = (_writeable(x) for x in (cluster.C, cluster.S, cluster.P))
        if self._states is None:
            self._states = co.new_states(C, S, P, np.int64(self.num_envs))
            self._bind()
        co.put(self._states, np.int64(e), C, S, P)

    def _bind_check(self) -> None:
        self._first_bad = bind(co.first_bad, self.B.actions, np.zeros(self.num_envs, np.bool_),
                               self._mask)

    def _bind(self) -> None:
        """The batch kernel's entry point for this list (see _LIST_TYPE: a list of another
        item type is dispatched by numba on every call instead)."""
        kind = numba.typeof(self._states) if not isinstance(self._states, list) else None
        if not _LIST_TYPE:
            _LIST_TYPE.append(kind)
        args = (self._states, self.B, self.out)
        self._step = bind(co.step_batch, *args) if kind == _LIST_TYPE[0] else co.step_batch

    def _run(self, act: np.ndarray) -> None:
        """One compiled call for every env with ``act``; then, while some env stopped for
        Python, serve those stops and resume those envs alone."""
        self.B.act[:] = act
        use_threads(self.num_threads)
        stops = self._step(self._states, self.B, self.out)
        while stops:
            self.B.act[:] = co.IDLE
            for e in np.flatnonzero(self.B.g[:, co.STOP] >= 0):
                code = int(self.B.g[e, co.STOP])
                self.B.g[e, co.STOP] = -1
                cluster = self.clusters[e]
                assert cluster is not None
                cluster.serve_stop(code)
                if code == K.CL_GROW:  # new, larger arrays: into env e's slot
                    self._place(e, cluster)
                self.B.act[e] = co.RESUME
            stops = self._step(self._states, self.B, self.out)

    def _check(self, actions: Any, skip: np.ndarray) -> None:
        """The actions into the kernel's buffer, as route indices, or an error before
        anything changed; an env about to start an episode ignores its own."""
        E = self.num_envs
        a = np.asarray(actions)
        if a.shape != (E,) or a.dtype.kind not in "iu":
            raise InvalidActionError(f"actions must be {E} integer route indices (shape "
                                     f"({E},)), got {a.dtype} {a.shape}")
        buf = self.B.actions
        buf[:] = a  # (a uint64 past int64 wraps to a negative index, refused below)
        bad = self._first_bad(buf, skip, self._mask)
        if bad >= 0:
            raise InvalidActionError(f"actions[{bad}] = {a[bad]!r} is not an allowed route (0 "
                                     f".. {len(self.routes) - 1}, see action_masks()); nothing "
                                     "was stepped")

    # ------------------------------------------------------------------ outputs
    def _observation(self, copy: bool | None = None) -> dict[str, np.ndarray]:
        request, instances = self.out.request, self.out.instances
        if self.copy if copy is None else copy:
            request, instances = request.copy(), instances.copy()
        return {"request": request, "instances": instances}

    def _infos(self, stepped: np.ndarray, started: np.ndarray) -> dict[str, Any]:
        """Gymnasium's dict of arrays for envs that stepped and envs that started an episode
        (a key only where some env has it; zeros where an env has not)."""
        infos: dict[str, Any] = {}
        some_start = started.any()
        if stepped.any():
            good = self.B.g[:, co.GOOD].copy()
            if some_start:
                good[~stepped] = 0
            infos["num_good"], infos["_num_good"] = good, stepped.copy()
        if some_start:
            infos["window_start"] = np.where(started, self._window[0], 0)
            infos["_window_start"] = started.copy()
            infos["load"] = np.where(started, self._window[1], 0.0)
            infos["_load"] = started.copy()
        has = stepped | started  # (never empty: a step steps or starts every env)
        masks = self._masks.copy()
        masks[~has] = False
        infos["action_mask"], infos["_action_mask"] = masks, has
        return infos

    def episode_cluster(self, i: int) -> Cluster:
        """Env i's cluster in its current episode (read it, e.g. with
        ``cbgym.cluster.results.cluster_result``; never step it), its door sheds named."""
        cluster = self.clusters[i]
        if cluster is None:
            raise ResetNeeded("call reset() first")
        reason = next((r.shed_reason for r in self.routes if r.shed_reason), None)
        cluster.router_shed = dict.fromkeys(np.flatnonzero(self.B.shed[i]).tolist(), reason)
        return cluster

    # ------------------------------------------------------------------ misc
    _BOUND = ("_states", "_step", "_first_bad")  # compiled things, rebuilt on unpickling

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in self._BOUND}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._states = self._step = None
        self._bind_check()
        for e, cluster in enumerate(self.clusters):
            if cluster is not None:
                self._place(e, cluster)

    def close_extras(self, **kwargs: Any) -> None:
        pass

    def __repr__(self) -> str:
        return (f"ClusterVectorEnv(num_envs={self.num_envs}, "
                f"autoreset_mode={self.autoreset_mode.name}, threads={self.num_threads})")


def _writeable(t: Any) -> Any:
    """The named tuple ``t`` with its read-only arrays (the trace's columns, which the
    loop only reads) copied: a typed list holds one numba type, and whether a column comes
    read-only depends on where it came from (an unpickled one does not)."""
    return type(t)(*(_writeable(x) if isinstance(x, tuple) else
                     x if x.flags.writeable else x.copy() for x in t))
