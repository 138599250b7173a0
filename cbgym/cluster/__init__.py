"""Clusters of the one engine: pools of unified, prefill and decode instances, the KV link,
and the routing door (see :mod:`cbgym.cluster.cluster` for the loop)."""

from cbgym.cluster.cluster import Cluster
from cbgym.cluster.config import ClusterConfig, LinkConfig, Pool
from cbgym.cluster.edge import AdmissionConfig, ClientModel
from cbgym.cluster.results import ClusterResult
from cbgym.cluster.routing import (
    InvalidRouteError,
    Loads,
    Route,
    Router,
    RouterContext,
    RoutingPoint,
)

__all__ = ["AdmissionConfig", "ClientModel", "Cluster", "ClusterConfig", "ClusterResult",
           "InvalidRouteError", "LinkConfig", "Loads", "Pool", "Route", "Router",
           "RouterContext", "RoutingPoint"]
