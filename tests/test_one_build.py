"""Every run reaches the same compiled build of each entry kernel.

numba compiles a kernel once per distinct argument type, and a read-only array, a writable
one and a literal are distinct types: a column that arrives read-only in one run and
writable in another (an unpickled env, a copied trace) rebuilds every kernel above it, tens
of seconds each on a 2-core machine (and in CI). These tests drive the usual paths (fresh,
unpickled, vector and single, plain cluster and cluster env) and check each entry kernel
was built once.
"""

from __future__ import annotations

import os
import pickle

import gymnasium as gym
import pytest

from cbgym import load_trace, simulate
from cbgym.cluster import loop
from cbgym.cluster.config import ClusterConfig
from cbgym.env import kernel_ops as ko
from cbgym.env import vector_ops as vo

pytestmark = pytest.mark.skipif(os.environ.get("NUMBA_DISABLE_JIT") == "1",
                                reason="nothing is compiled")

FAST = {"episode_requests": 24, "trace": "synthetic-conv"}


def builds(kernel: object) -> int:
    return len(kernel.overloads)  # type: ignore[attr-defined]


def test_the_vector_env_builds_its_kernels_once() -> None:
    venv = gym.make_vec("cbgym/Scheduling-v0", num_envs=2, **FAST).unwrapped
    venv.reset(seed=0)
    for _ in range(3):
        venv.step(venv.action_space.sample())
    twin = pickle.loads(pickle.dumps(venv))
    twin.reset(seed=1)
    twin.step(twin.action_space.sample())
    env = gym.make("cbgym/Scheduling-v0", **FAST)
    env.reset(seed=0)
    env.step(env.action_space.sample())
    pickle.loads(pickle.dumps(env.unwrapped)).step(env.action_space.sample())
    assert builds(vo.step_batch) == builds(vo.reset_batch) == builds(ko.step_scores) == 1
    # (functions they call: built with them, or not at all when they came from the cache)
    assert builds(vo.begin) <= 1 and builds(vo.step_env) <= 1


def test_a_cluster_and_the_cluster_env_share_one_build() -> None:
    tr = load_trace("synthetic-conv").window(0, 60)
    cfg = ClusterConfig.preset("2x:llama-2-7b/a100-80gb")
    simulate(tr, cluster=cfg, load=0.8)
    twin = pickle.loads(pickle.dumps(tr))  # as a worker process receives it: writable
    assert twin.arrival_s.flags.writeable
    simulate(twin, cluster=cfg, load=0.8)
    venv = gym.make_vec("cbgym/Cluster-v0", num_envs=2)
    venv.reset(seed=0)
    venv.step(venv.action_space.sample())
    assert builds(loop.run) == 1
