"""``cbgym/Cluster-v0``: place requests on a simulated cluster, one routing decision per step.

The agent is the cluster's router: it answers each :class:`~cbgym.cluster.RoutingPoint`
through the same door the rule routers use (``Cluster.next_routing_point`` /
``Cluster.route``); every instance schedules locally with its own policy (FCFS by default).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from cbgym.cluster.cluster import Cluster
from cbgym.cluster.config import ClusterConfig
from cbgym.cluster.edge import AdmissionConfig, ClientModel, check_edge
from cbgym.cluster.routing import Route, RoutingPoint
from cbgym.cluster.run import cluster_capacity, local_policies, resolve_cluster
from cbgym.cluster.tables import loads_array
from cbgym.env.action import InvalidActionError
from cbgym.env.cluster_vector_ops import (
    INSTANCE_FEATURES,
    PREFIX_FEATURES,
    REQUEST_FEATURES,
    encode_into,
)
from cbgym.metrics import SLO, e2e_targets, slo_arrays, tbt_targets
from cbgym.workload.trace import Trace

# (INSTANCE_FEATURES and REQUEST_FEATURES, the observation's features, live beside the
# compiled encoder that reads them: cluster_vector_ops)

# chunk caps of the deflection routes (0: the decode instance's token budget), Kairos's
# candidates below the usual 2,048-token budget
DEFLECT_CAPS = (0, 1024, 512, 256, 128)


def route_table(config: ClusterConfig, allow_shed: bool = True) -> list[Route]:
    """The routes of the env's ``Discrete`` action space, in index order (class docstring)."""
    roles = config.roles
    unified = [i for i, r in enumerate(roles) if r == "unified"]
    prefill = [i for i, r in enumerate(roles) if r == "prefill"]
    decode = [i for i, r in enumerate(roles) if r == "decode"]
    routes = [Route.to(i) for i in unified]
    routes += [Route.disaggregate(p, d) for p in prefill for d in decode]
    routes += [Route.deflect(d, cap) for d in decode for cap in DEFLECT_CAPS]
    if allow_shed:
        routes.append(Route.shed("shed_by_agent"))
    return routes


def route_index(routes: list[Route], route: Route, rp: RoutingPoint) -> int:
    """The index in ``routes`` of ``route`` (for imitating a rule router): a deflection's
    chunk cap rounded down to the table's, a cap that leaves no room beside the decode
    instance's decodes as the uncapped route (Kairos caps at its budget less its decodes);
    a shed for any reason as the shed route."""
    if route in routes:
        return routes.index(route)
    if route.shed_reason is not None:
        return next(k for k, r in enumerate(routes) if r.shed_reason is not None)
    if route.prefill is None and route.decode is not None:
        budget = rp.config.engines[route.decode].max_num_batched_tokens
        room = budget - (int(rp.loads.decode_batch[route.decode]) if rp.loads else 0)
        want = budget if not route.chunk_cap or route.chunk_cap >= room else route.chunk_cap
        fits = [(r.chunk_cap or budget, k) for k, r in enumerate(routes)
                if r.prefill is None and r.decode == route.decode and r.shed_reason is None]
        below = [x for x in fits if x[0] <= want]
        return max(below)[1] if below else min(fits)[1]
    raise ValueError(f"route {route} is not in the env's route table")


def encode(rp: RoutingPoint, prefix: bool = False) -> dict[str, np.ndarray]:
    """The env's observation of a routing point (class docstring), for ``ClusterEnv`` and
    learned routers: the compiled encoder the native vector env runs in its kernel
    (:func:`cbgym.env.cluster_vector_ops.encode_into`), so there is one encoder. ``prefix``:
    with the PREFIX_FEATURES columns (zeros where the run has no cache)."""
    loads = rp.loads
    assert loads is not None, "the cluster env's router reads loads"
    N = len(rp.role)
    req = np.empty(len(REQUEST_FEATURES), np.float32)
    inst = np.empty((N, len(INSTANCE_FEATURES) + prefix * len(PREFIX_FEATURES)), np.float32)
    cached, routed = (np.zeros(N, np.int64) if x is None else np.ascontiguousarray(x, np.int64)
                      for x in (rp.cached_tokens, rp.routed_since_report))
    encode_into(loads_array(loads), float(loads.report_s),
                np.ascontiguousarray(rp.role, np.int64), int(rp.prompt_tokens),
                float(rp.ttft_target_s), float(rp.tpot_target_s), float(rp.now), cached,
                routed, req, inst)
    return {"request": req, "instances": inst}


class ClusterEnv(gym.Env[dict[str, np.ndarray], int]):
    """Route requests on a cluster of simulated serving instances, one request per step.

    ## Description

    A trace window, rescaled to an offered load relative to the cluster's measured capacity,
    arrives at a cluster (unified replicas, or prefill and decode pools with KV transfers over
    max-min shared NICs: ``docs/cluster.md``). At each arrival the agent picks the request's
    route; the cluster then runs to the next arrival.

    ## Action Space

    ``Discrete(A)``, the routes of :attr:`routes`, in this order:

    | Index | Route |
    |---|---|
    | one per unified instance i | ``Route.to(i)`` |
    | one per (prefill p, decode d) pair | ``Route.disaggregate(p, d)``: prefill on p, KV to d |
    | five per decode instance d | ``Route.deflect(d, cap)``: d runs the prefill itself, at most |
    |   | ``cap`` prompt tokens an iteration, cap in :data:`DEFLECT_CAPS` (0: d's budget) |
    | last | ``Route.shed("shed_by_agent")`` (only with ``allow_shed=True``) |

    ``action_masks()`` (bool) allows every listed route (a chunk-capped deflection only onto an
instance with chunked prefill); a masked or malformed action raises
    :class:`~cbgym.env.action.InvalidActionError`.

    ## Observation Space

    A ``Dict``: ``request`` (4,): the request's prompt tokens, its TTFT and TPOT targets, the
    age of the load report; ``instances`` (N, 17): each instance's role (one-hot) and load as
    of the last report (``cbgym.cluster.routing``'s table). With prefix caching on
    (``ClusterConfig.with_prefix_caching()``), ``instances`` is (N, 20): three more columns,
    what the cache-aware routers read: the tokens of the request's prompt each instance's
    cache holds now (live, as ``RoutingPoint.cached_tokens``; zeros where the trace has no
    block ids), their share of the prompt, and the requests routed there since the load
    report (``RoutingPoint.routed_since_report``). ``prefix_features=True`` keeps the three
    columns without prefix caching (the cache's two are zero): the in-flight count the
    routers that price queues keep between reports (jsq-time, ttft-shed). Scalings as the
    single env's:
    *count* ``log2(1 + x) / 24``, *time* ``log2(1 + t / 1 ms) / 32``, *fraction* as is. All in
    [0, 1]. Content-blind: no prompt content, never a true output length.

    ## Rewards

    The number of requests that ended since the previous step and met the SLO (TTFT, TPOT,
    and the worst gap between tokens with ``tbt_s``): an episode's return is its goodput.

    ## Starting State and Episode End

    ``reset(seed=)`` draws a window of ``episode_requests`` consecutive requests starting in
    ``window_start_range`` (default: the trace's first ``train_fraction``, by request order)
    and a load from ``load`` (a number, or a ``(low, high)`` range drawn uniformly);
    ``options={"start": i, "load": rho}`` fixes them (evaluation). The episode terminates
    when every request has been placed and the cluster has drained (the last step's reward
    counts the rest).

    ## Arguments

    ``cluster`` (a ClusterConfig or preset), ``trace``, ``episode_requests``, ``load``, ``slo``,
    ``policy`` (each instance's local policy), ``train_fraction``, ``allow_shed``,
    ``window_start_range``, ``capacity_rps`` (the load's reference; default: measured once by
    saturation under the reference router), ``admission`` and ``client`` (the cluster's edge,
    :mod:`cbgym.cluster.edge`). With a client model each retry is a step of its own (a new
    arrival: its TTFT target counts from the request's first send), the shed route answers
    429 (its client may retry), and the reward counts requests good as their clients see
    them: an episode's return is the goodput of the offered requests.

    ## Version History

    * v0: first version. ``gym.make("cbgym/Cluster-v0")`` builds the default cluster task
      (``cbgym.tasks.cluster_tasks``); ``ClusterEnv()`` itself defaults to the embedded
      synthetic code workload. A Python loop between kernel calls; ``gym.make_vec`` builds
      the native vector env (:class:`~cbgym.env.cluster_vector.ClusterVectorEnv`: one
      compiled call steps every env, each bit for bit this env seeded s + i). The four
      overload tasks' ids (``cbgym/Cluster-*-overload-retries-v0``) observe 20 columns since
      ``prefix_features`` came in (2026-12-04, before any release; their shipped routers
      were retrained with it).
    """

    metadata = {"render_modes": []}

    def __init__(self, cluster: ClusterConfig | str = "2p2d:deepseek-v2-lite/a100-80gb",
                 trace: Trace | str = "synthetic-code", episode_requests: int = 256,
                 load: float | tuple[float, float] = (0.4, 1.0),
                 slo: SLO | None = None, policy: str = "fcfs", train_fraction: float = 0.6,
                 allow_shed: bool = True,
                 window_start_range: tuple[int, int] | None = None,
                 capacity_rps: float | None = None, admission: AdmissionConfig | None = None,
                 client: ClientModel | None = None, prefix_features: bool | None = None
                 ) -> None:
        from cbgym.simulate import resolve_policy, resolve_trace

        check_edge("ClusterEnv", admission, client)
        self.admission, self.client = admission, client
        self.config = resolve_cluster(cluster)
        self.trace = resolve_trace(trace)
        if isinstance(episode_requests, bool) or not isinstance(episode_requests, int) \
                or episode_requests < 2:
            raise ValueError(f"episode_requests={episode_requests!r}: expected an int >= 2")
        self.n = min(episode_requests, len(self.trace))
        lo = hi = np.nan
        if isinstance(load, int | float) and not isinstance(load, bool):
            lo = hi = float(load)
        elif not isinstance(load, str | bool):
            try:
                lo, hi = (float(x) for x in load)  # type: ignore[union-attr]
            except (TypeError, ValueError):
                pass
        if not (0 < lo <= hi < np.inf):
            raise ValueError(f"load={load!r}: expected a number > 0 or a (low, high) range")
        if capacity_rps is not None and not (isinstance(capacity_rps, int | float)
                                             and 0 < capacity_rps < np.inf):
            raise ValueError(f"capacity_rps={capacity_rps!r}: expected requests/s > 0 "
                             "(None: measured)")
        self.load_range = (float(lo), float(hi))
        if not 0 < train_fraction <= 1:
            raise ValueError(f"train_fraction={train_fraction!r}: expected a fraction in (0, 1]")
        self.train_fraction = train_fraction
        if window_start_range is None:
            window_start_range = (0, int(len(self.trace) * train_fraction))
        lo_w, hi_w = (int(x) for x in window_start_range)
        if not (0 <= lo_w and lo_w + self.n <= hi_w <= len(self.trace)):
            raise ValueError(f"window_start_range={window_start_range!r}: expected a range "
                             f"[lo, hi) inside the trace's {len(self.trace)} requests that "
                             f"holds an episode of {self.n} requests (episode_requests)")
        self.window_range = (lo_w, hi_w)
        self.slo = slo or SLO(2.0, 0.1, tbt_s=0.2)
        resolve_policy(policy)
        self.policy = policy
        self.routes = route_table(self.config, allow_shed)
        N = self.config.num_instances
        # (the observation's shape follows the configuration, not the trace: a trace
        # without block ids runs uncached and observes zero cached tokens)
        if prefix_features is not None and not isinstance(prefix_features, bool | np.bool_):
            raise ValueError(f"prefix_features={prefix_features!r}: expected True, False or "
                             "None (None: the three columns with prefix caching only)")
        self.prefix = (bool(self.config.engines[0].enable_prefix_caching)
                       if prefix_features is None else bool(prefix_features))
        F = len(INSTANCE_FEATURES) + self.prefix * len(PREFIX_FEATURES)
        self.action_space = spaces.Discrete(len(self.routes))
        self.observation_space = spaces.Dict({
            "request": spaces.Box(0.0, 1.0, (len(REQUEST_FEATURES),), np.float32),
            "instances": spaces.Box(0.0, 1.0, (N, F), np.float32),
        })
        self._mask = np.ones(len(self.routes), bool)
        for k, r in enumerate(self.routes):
            target = r.decode if r.prefill is None else r.prefill
            if r.chunk_cap and target is not None and \
                    not self.config.engines[target].chunked_prefill:
                self._mask[k] = False
        self._mu: float | None = capacity_rps
        self.cluster: Cluster | None = None
        self._rp: RoutingPoint | None = None

    # ------------------------------------------------------------------ gymnasium API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        super().reset(seed=seed)
        self.cluster, start, load = self.new_episode(self.np_random, options or {})
        window = self.cluster.trace  # (with a client model: a slot per attempt)
        ttft, tpot = slo_arrays(self.slo, window.slo_class)
        self._targets = (ttft, tpot, tbt_targets(self.slo, window.slo_class),
                         e2e_targets(self.slo, window.slo_class))
        self._good = 0
        self._rp = self.cluster.next_routing_point()
        assert self._rp is not None, "an episode has requests"
        return self._obs(self._rp), {"window_start": start, "load": load,
                                     "action_mask": self.action_masks()}

    def step(self, action: int) -> tuple[dict[str, np.ndarray], float, bool, bool,
                                         dict[str, Any]]:
        if self.cluster is None or self._rp is None:
            raise RuntimeError("ClusterEnv.step() before reset() or after the episode ended")
        if not (isinstance(action, int | np.integer) and not isinstance(action, bool)) and not (
                isinstance(action, np.ndarray) and action.shape == ()
                and np.issubdtype(action.dtype, np.integer)):
            raise InvalidActionError(f"action must be an int index, got {action!r}")
        a = int(action)
        if not (0 <= a < len(self.routes)) or not self._mask[a]:
            raise InvalidActionError(f"action {action!r} is not an allowed route (0 .. "
                                     f"{len(self.routes) - 1}, see action_masks())")
        self.cluster.route(self.routes[a])
        self._rp = self.cluster.next_routing_point()
        good = self._count_good()
        reward, self._good = float(good - self._good), good
        done = self._rp is None
        obs = self._obs(self._rp) if self._rp is not None else self._last_obs
        return obs, reward, done, False, {"num_good": good, "action_mask": self.action_masks()}

    def action_masks(self) -> np.ndarray:
        return self._mask.copy()

    # ------------------------------------------------------------------ episodes
    def capacity(self) -> float:
        """The capacity loads are relative to (requests/s): ``capacity_rps``, or measured
        once by saturation on the trace's first requests under the reference router."""
        from cbgym.cluster.sweep import reference_router

        if self._mu is None:
            self._mu = cluster_capacity(self.trace, self.config, reference_router(self.config))
        return self._mu

    def new_episode(self, rng: np.random.Generator, options: dict[str, Any]
                    ) -> tuple[Cluster, int, float]:
        """A fresh cluster for an episode and its window start and load, drawn from ``rng``
        in this order (unless ``options`` fixes them): the start, the load, the cluster's
        seed. (The native vector env starts its envs' episodes here.)"""
        from cbgym.capacity import scale_to_load

        mu = self.capacity()
        lo, hi = self.window_range
        start = int(options["start"]) if "start" in options else int(
            rng.integers(lo, max(hi - self.n, lo) + 1))
        load = float(options["load"]) if "load" in options else float(
            rng.uniform(*self.load_range))
        window = scale_to_load(self.trace.window(start, self.n), load, self.config.engines[0],
                               capacity_rps=mu)
        cluster = Cluster(window, self.config, None,
                          local_policies(self.policy, self.config.num_instances),
                          slo=self.slo, seed=int(rng.integers(2**31)), eager=False,
                          itl_p99=False,  # (its reward reads only the worst gap)
                          admission=self.admission, client=self.client)
        return cluster, start, load

    # ------------------------------------------------------------------ encoding
    def _obs(self, rp: RoutingPoint) -> dict[str, np.ndarray]:
        self._last_obs = encode(rp, self.prefix)
        return self._last_obs

    def _count_good(self) -> int:
        """Requests that have ended meeting the SLO, so far: with a client model, as their
        clients see them (an attempt its client did not abandon, its TTFT counted from the
        request's first send: ``cbgym.cluster.edge_results``)."""
        from cbgym.cluster import state as K
        from cbgym.cluster.results import merged_table
        from cbgym.engine import layout as L
        from cbgym.metrics import tpot

        c = self.cluster
        assert c is not None
        t = merged_table(c)
        ttft_t, tpot_t, tbt, e2e = self._targets
        n0 = c.num_offered
        first = t.arrival_s[np.arange(t.n) % n0] if t.n > n0 else t.arrival_s
        with np.errstate(invalid="ignore"):
            ok = ((t.status == L.FINISHED) & (t.first_token_s - first <= ttft_t)
                  & (tpot(t.first_token_s, t.finish_s, t.generated) <= tpot_t))
            if tbt is not None:
                ok &= t.itl_max_s <= tbt
            if e2e is not None:
                ok &= t.finish_s - first <= e2e
            if c.edge:
                ok &= c.C.req[K.OUTCOME] == K.O_NONE
                # (an attempt the engine finished after its client's deadline is abandoned
                # once the timeout event is handled: never count it good meanwhile)
                timeout = c.client.timeout_s if c.client is not None else None
                if timeout is not None:
                    done = t.finish_s if c.client.timeout_on == "completion" else t.first_token_s
                    ok &= done - t.arrival_s <= timeout
        return int(ok.sum())


def register_cluster_env() -> None:
    """Register ``cbgym/Cluster-v0`` (the default cluster task) and ``cbgym/Cluster-<task>-v0``
    for every cluster task (idempotent); ``gym.make_vec`` builds their native vector env."""
    from cbgym.tasks.cluster_tasks import CLUSTER_TASKS, DEFAULT_CLUSTER_TASK

    ids = [("cbgym/Cluster-v0", DEFAULT_CLUSTER_TASK)]
    ids += [(t.env_id, name) for name, t in CLUSTER_TASKS.items()]
    for env_id, name in ids:
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point="cbgym.tasks.cluster_tasks:make_cluster_env",
                         vector_entry_point="cbgym.tasks.cluster_tasks:"
                                            "make_cluster_vector_env",
                         kwargs={"task": name})
