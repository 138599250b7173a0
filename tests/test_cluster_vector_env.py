"""The native vector env of ``cbgym/Cluster-v0``: one compiled call steps N cluster envs.

1. ``gymnasium.make_vec`` builds it with no arguments, batched spaces; sync mode still works;
2. env i of ``reset(seed=s)`` is ``ClusterEnv`` reset with s + i: observations, rewards,
   flags and infos equal ``SyncVectorEnv``'s bit for bit across episodes, for 1 and 3 envs,
   1 and 2 threads, a disaggregated and a unified cluster, in the three autoreset modes;
3. the loop's stops served in Python (buffers grown from tiny capacities, full time-series
   buffers, a local policy asked at the door) change nothing;
4. bad actions raise ``InvalidActionError`` with nothing stepped; the episode's cluster reads
   as the single env's; pickling.
"""

from __future__ import annotations

import pickle
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.error import ResetNeeded
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from cbgym.cluster import state as K
from cbgym.cluster.cluster import Cluster
from cbgym.cluster.config import ClusterConfig, Pool
from cbgym.engine import EngineConfig
from cbgym.env.action import InvalidActionError
from cbgym.env.cluster_env import ClusterEnv
from cbgym.env.cluster_vector import ClusterVectorEnv

# small episodes on the embedded synthetic code workload (capacity fixed: no measurement)
DISAGG = {"cluster": "2p2d:llama-2-7b/a100-80gb", "episode_requests": 64, "load": (1.0, 2.5),
          "capacity_rps": 12.0}
UNIFIED = {"cluster": "2x:llama-2-7b/a100-80gb", "episode_requests": 64, "load": (1.0, 2.5),
           "capacity_rps": 19.0}

# prefix caching on every replica, multi-turn sessions (block ids): each instance's cache is
# probed in the kernel for the observation's cache columns
CACHED = {**UNIFIED, "cluster": ClusterConfig.preset("2x:llama-2-7b/a100-80gb")
          .with_prefix_caching(), "trace": "synthetic-sessions"}


def same(a: Any, b: Any, where: str = "") -> None:
    """Equal values, types, dtypes and shapes, through tuples, dicts and object arrays."""
    if isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b), where
        for k, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{where}[{k}]")
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (where, set(a) ^ set(b))
        for k in a:
            same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, np.ndarray) and a.dtype == object:
        assert isinstance(b, np.ndarray) and b.dtype == object and a.shape == b.shape, where
        for x, y in zip(a, b, strict=True):
            same(x, y, where)
    elif a is None:
        assert b is None, where
    else:
        a, b = np.asarray(a), np.asarray(b)
        assert (a.dtype, a.shape) == (b.dtype, b.shape), (where, a.dtype, b.dtype)
        assert np.array_equal(a, b), (where, a, b)


def pair(n: int, kw: dict, mode: AutoresetMode = AutoresetMode.NEXT_STEP,
         threads: int = 1) -> tuple[ClusterVectorEnv, SyncVectorEnv]:
    native = ClusterVectorEnv(num_envs=n, autoreset_mode=mode, num_threads=threads, **kw)
    sync = SyncVectorEnv([lambda: ClusterEnv(**kw) for _ in range(n)], autoreset_mode=mode)
    return native, sync


def play(native: ClusterVectorEnv, sync: SyncVectorEnv, seed: int, steps: int) -> int:
    """Random allowed routes (sheds included) through both; every output equal. The number
    of episodes that ended."""
    same(native.reset(seed=seed), sync.reset(seed=seed))
    rng = np.random.default_rng(seed)
    allowed = np.flatnonzero(native.action_masks()[0])
    ended = 0
    for _ in range(steps):
        a = rng.choice(allowed, native.num_envs)
        out = native.step(a)
        same(out, sync.step(a))
        ended += int(out[2].sum())
        assert not out[3].any()
    return ended


def test_make_vec_builds_the_native_env_with_no_arguments() -> None:
    venv = gym.make_vec("cbgym/Cluster-v0", num_envs=2)
    assert isinstance(venv.unwrapped, ClusterVectorEnv)
    assert venv.observation_space["instances"].shape == (2, 4, 17)
    assert venv.action_space.shape == (2,) and venv.single_action_space.n == 15
    obs, info = venv.reset(seed=0)
    assert venv.observation_space.contains(obs)
    assert info["_window_start"].all() and info["action_mask"].shape == (2, 15)
    obs, r, te, tr, info = venv.step(venv.action_space.sample())
    assert venv.observation_space.contains(obs) and r.dtype == np.float64
    assert info["num_good"].dtype == np.int64 and info["_num_good"].all()
    for name in ("code-2p2d-deflection", "conv-4x-hetero-routing"):  # every task's id
        assert gym.spec(f"cbgym/Cluster-{name}-v0").vector_entry_point is not None
    assert venv.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    sync = gym.make_vec("cbgym/Cluster-v0", num_envs=2, vectorization_mode="sync",
                        **UNIFIED)
    assert isinstance(sync, SyncVectorEnv)
    sync.reset(seed=0)
    sync.step(np.array([0, 1]))


def test_gymnasium_vector_wrappers_apply() -> None:
    """Episode statistics count each env's return: its goodput."""
    from gymnasium.wrappers.vector import RecordEpisodeStatistics

    kw = {**DISAGG, "episode_requests": 16}
    venv = RecordEpisodeStatistics(gym.make_vec("cbgym/Cluster-v0", num_envs=2, **kw))
    venv.reset(seed=0)
    returns, seen = np.zeros(2), 0
    for _ in range(17):
        _, r, te, _, info = venv.step(np.zeros(2, np.int64))
        returns += r
        if te.any():
            np.testing.assert_array_equal(info["episode"]["r"][te], returns[te])
            np.testing.assert_array_equal(info["episode"]["l"][te], 16)
            seen += int(te.sum())
    assert seen == 2


@pytest.mark.parametrize(("n", "kw", "seed"), [(1, DISAGG, 0), (3, DISAGG, 1), (3, UNIFIED, 2),
                                               (1, UNIFIED, 3), (3, CACHED, 4),
                                               (2, {**DISAGG, "prefix_features": True}, 5)])
def test_env_i_is_cluster_env_seeded_s_plus_i(n: int, kw: dict, seed: int) -> None:
    native, sync = pair(n, kw)
    assert play(native, sync, seed, 150) >= n  # across autoresets


def test_results_do_not_depend_on_threads() -> None:
    native, sync = pair(3, DISAGG, threads=2)
    assert play(native, sync, 4, 80) >= 1


@pytest.mark.parametrize("kw", [DISAGG, UNIFIED])
def test_same_step_autoreset(kw: dict) -> None:
    native, sync = pair(2, kw, AutoresetMode.SAME_STEP)
    assert play(native, sync, 5, 140) >= 2


def test_disabled_autoreset_and_reset_masks() -> None:
    native, sync = pair(2, DISAGG, AutoresetMode.DISABLED)
    same(native.reset(seed=6), sync.reset(seed=6))
    rng = np.random.default_rng(6)
    allowed = np.flatnonzero(native.action_masks()[0])
    resets = 0
    for _ in range(170):
        if native._autoreset.any():
            with pytest.raises(ResetNeeded, match="reset_mask"):
                native.step(np.zeros(2, np.int64))
            mask = native._autoreset.copy()
            same(native.reset(options={"reset_mask": mask}),
                 sync.reset(options={"reset_mask": mask.copy()}))
            resets += 1
        a = rng.choice(allowed, 2)
        same(native.step(a), sync.step(a))
    assert resets >= 2
    # fixed windows, as ClusterEnv's options: the fixed draws are skipped
    opts = {"start": 10, "load": 1.7}
    same(native.reset(seed=1, options=dict(opts)), sync.reset(seed=1, options=dict(opts)))
    a = np.zeros(2, np.int64)
    same(native.step(a), sync.step(a))


def shrink_buffers(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """From now on clusters are built with room for 2 events, 2 transfers and 4 transfer
    ids, and engines with 8 time-series rows: their loops stop for Python to grow and empty
    them. The list of the codes served, in order."""
    from cbgym.cluster import cluster as cluster_module
    from cbgym.engine import layout as L

    build, serve = cluster_module.cluster_state, Cluster.serve_stop
    served: list[int] = []

    def small(c: Cluster, *args: Any) -> K.ClusterState:
        C = build(c, *args)
        nic = C.link.cap[: len(C.link.cap) // 2].copy()
        return C._replace(heap_t=np.zeros(2), heap=np.zeros((4, 2), np.int64),
                          tid_rid=np.zeros(4, np.int64),
                          link=K.new_link(nic, float(C.link.sf[K.SETUP_S]), cap=2))

    def spy(self: Cluster, code: int) -> None:
        served.append(code)
        serve(self, code)

    monkeypatch.setattr(cluster_module, "cluster_state", small)
    monkeypatch.setattr(Cluster, "serve_stop", spy)
    monkeypatch.setattr(L, "REC_ROWS", 8)
    return served


def test_buffers_grown_in_python_change_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    kw = {**DISAGG, "episode_requests": 48}
    allowed = np.flatnonzero(ClusterEnv(**kw).action_masks())
    actions = np.random.default_rng(7).choice(allowed, (70, 2))
    sync = SyncVectorEnv([lambda: ClusterEnv(**kw) for _ in range(2)])  # usual capacities
    expected = [sync.reset(seed=7)] + [sync.step(a) for a in actions]
    served = shrink_buffers(monkeypatch)
    native = ClusterVectorEnv(num_envs=2, **kw)
    same(native.reset(seed=7), expected[0])
    first = native.episode_cluster(0).C
    assert len(first.heap_t) == 2 and first.link.i.shape[1] == 2
    room = np.zeros(3, np.int64)  # the most room seen: events, transfers, transfer ids
    for a, out in zip(actions, expected[1:], strict=True):
        same(native.step(a), out)
        for e in range(2):
            C = native.episode_cluster(e).C
            room = np.maximum(room, (len(C.heap_t), C.link.i.shape[1], len(C.tid_rid)))
    assert (room > (2, 2, 4)).all()
    assert {int(K.CL_GROW), int(K.CL_NEED_ROOM)} <= set(served)


def test_a_local_policy_asked_at_the_door() -> None:
    kw = {**UNIFIED, "episode_requests": 24, "policy": "slo-edf"}
    native, sync = pair(2, kw)
    assert play(native, sync, 8, 40) >= 1


def test_bad_actions_raise_and_step_nothing() -> None:
    plain = EngineConfig(preset="llama-2-7b/a100-80gb", chunked_prefill=False)
    cfg = ClusterConfig((Pool("prefill", 1, plain), Pool("decode", 1, plain)))
    kw = {"cluster": cfg, "episode_requests": 24, "capacity_rps": 6.0}
    native, sync = pair(2, kw)
    same(native.reset(seed=9), sync.reset(seed=9))
    masked = int(np.flatnonzero(~native.action_masks()[0])[0])  # a chunk cap, no chunking
    n = native.single_action_space.n
    for bad, match in ((np.array([0, masked]), "actions\\[1\\]"),
                       (np.array([n, 0]), "not an allowed route"),
                       (np.array([-1, 0]), "not an allowed route"),
                       (np.array([0.0, 1.0]), "integer route indices"),
                       (np.array([True, False]), "integer route indices"),
                       (np.zeros(3, np.int64), "shape")):
        with pytest.raises(InvalidActionError, match=match):
            native.step(bad)
    a = np.array([0, 1])
    same(native.step(a), sync.step(a))  # nothing was stepped
    with pytest.raises(ResetNeeded):
        ClusterVectorEnv(num_envs=1, **kw).step(np.zeros(1, np.int64))
    with pytest.raises(ValueError, match="num_envs"):
        ClusterVectorEnv(num_envs=0, **kw)


def test_the_episode_cluster_reads_as_the_single_envs() -> None:
    from cbgym.cluster.results import cluster_result

    kw = {**DISAGG, "episode_requests": 32}
    native = ClusterVectorEnv(num_envs=1, autoreset_mode=AutoresetMode.DISABLED, **kw)
    single = ClusterEnv(**kw)
    native.reset(seed=3)
    single.reset(seed=3)
    rng = np.random.default_rng(3)
    done = False
    while not done:
        a = int(rng.choice(np.flatnonzero(native.action_masks()[0])))
        _, _, te, _, _ = native.step(np.array([a]))
        _, _, done, _, _ = single.step(a)
        assert te[0] == done
    a_req = cluster_result(native.episode_cluster(0), {}).requests
    b_req = cluster_result(single.cluster, {}).requests  # type: ignore[arg-type]
    assert (a_req["status"] == "shed").any()  # random routes shed some at the door
    import pandas as pd

    pd.testing.assert_frame_equal(a_req, b_req, check_exact=True)


def test_pickled_mid_episode_it_goes_on_the_same() -> None:
    native = ClusterVectorEnv(num_envs=2, **DISAGG)
    native.reset(seed=11)
    rng = np.random.default_rng(11)
    allowed = np.flatnonzero(native.action_masks()[0])
    for a in rng.choice(allowed, (20, 2)):
        native.step(a)
    copy = pickle.loads(pickle.dumps(native))
    for a in rng.choice(allowed, (60, 2)):
        same(native.step(a), copy.step(a))


def test_maskable_ppo_trains_on_it_through_the_sb3_adapter() -> None:
    sb3 = pytest.importorskip("sb3_contrib")
    from cbgym.env.sb3 import make_sb3_vec_env

    venv = make_sb3_vec_env("cbgym/Cluster-v0", 2, seed=0, **{**DISAGG, "episode_requests": 32})
    assert isinstance(venv.venv, ClusterVectorEnv)
    model = sb3.MaskablePPO("MultiInputPolicy", venv, n_steps=32, batch_size=32, seed=0,
                            device="cpu")
    model.learn(64)
    assert venv.env_method("action_masks")[0].shape == (15,)
