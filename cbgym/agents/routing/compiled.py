"""Routers whose rule is compiled (:mod:`cbgym.cluster.route_ops`): the cluster loop applies
it in the kernel, and :meth:`CompiledRule.route` applies the same function at the door (the
cluster env's baselines, a router called by hand), so each rule exists once."""

from __future__ import annotations

import numpy as np

from cbgym.cluster.config import ClusterConfig
from cbgym.cluster.route_ops import route_rule
from cbgym.cluster.routing import (
    LOAD_FIELDS,
    ROLE_CODES,
    InvalidRouteError,
    Route,
    Router,
    RouterContext,
    RoutingPoint,
)
from cbgym.cluster.state import ROUTED
from cbgym.cluster.tables import loads_array, rule_settings, static_tables


class CompiledRule(Router):
    """A router that is one of :mod:`cbgym.cluster.route_ops`'s rules (``code``), with its
    parameters (:meth:`kernel_params`). A subclass that overrides :meth:`route` is asked at
    the door instead."""

    code: int
    needs_decode_pool = False  # the disaggregation rules place every request on one

    def kernel_params(self) -> dict[int, float]:
        """``ClusterState.cf`` entries the rule reads (``cbgym.cluster.state`` names)."""
        return {}

    def kernel_rule(self) -> tuple[int, dict[int, float]]:
        return self.code, self.kernel_params()

    def reset(self, ctx: RouterContext) -> None:
        super().reset(ctx)
        self.count = 0
        self._tables(ctx.config)

    def _tables(self, config: ClusterConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        cached = getattr(self, "_cached", None)
        if cached is not None and cached[0] is config:
            return cached[1]
        if self.needs_decode_pool and "decode" not in config.roles:
            raise ValueError(f"router {self.name!r} needs a decode pool, got roles "
                             f"{sorted(set(config.roles))}")
        inst, coefs = static_tables(config)
        tables = (inst, coefs, rule_settings(config, self.kernel_params()))
        self._cached = (config, tables)
        return tables

    def route(self, rp: RoutingPoint) -> Route:
        inst, coefs, cf = self._tables(rp.config)
        if rp.routed_since_report is not None and rp.routed_since_report.any():
            inst = inst.copy()  # (the dynamic row the kernel's rules read from the cluster)
            inst[ROUTED] = rp.routed_since_report
        self.count = getattr(self, "count", 0) + 1
        loads = (loads_array(rp.loads) if rp.loads is not None
                 else np.zeros((len(LOAD_FIELDS), rp.num_instances)))
        out = np.zeros(3, np.int64)
        if not route_rule(self.code, cf, inst, coefs, loads, np.int64(rp.prompt_tokens),
                          cached_of(rp), float(rp.ttft_target_s), float(rp.tpot_target_s),
                          np.int64(self.count), out):
            raise InvalidRouteError(f"router {self.name!r}: no pool its rule needs on roles "
                                    f"{sorted(set(rp.config.roles))}")
        p, d, cap = (int(x) for x in out)
        if p >= 0:
            return Route.disaggregate(p, d)
        return Route.to(d) if rp.role[d] == ROLE_CODES["unified"] else Route.deflect(d, cap)


def cached_of(rp: RoutingPoint) -> np.ndarray:
    """Per instance, the prompt's tokens its prefix cache holds (zeros without caching)."""
    if rp.cached_tokens is None:
        return np.zeros(rp.num_instances, np.int64)
    return np.ascontiguousarray(rp.cached_tokens, np.int64)
