"""RLlib's PPO (new API stack) trains on a single-instance and a cluster task through the
native vector envs (``gym_env_vectorize_mode="vector_entry_point"``), two env runners on a
local Ray (``tools/rllib_ppo.py``)."""

from __future__ import annotations

import pytest

from tests.conftest import load_script

pytest.importorskip("ray.rllib")
pytest.importorskip("torch")


@pytest.fixture(scope="module")
def rllib_ppo():  # type: ignore[no-untyped-def]
    import ray

    mod = load_script("tools/rllib_ppo.py")
    mod.init_ray(num_cpus=3)
    yield mod
    ray.shutdown()


@pytest.mark.parametrize("env_id", ["cbgym/Scheduling-v0", "cbgym/Cluster-v0"])
def test_ppo_trains_a_few_iterations(rllib_ppo, env_id: str) -> None:  # type: ignore[no-untyped-def]
    rows = rllib_ppo.train(env_id, 2, env_runners=2, envs_per_runner=2, batch=256,
                           minibatch=64, epochs=1)
    assert [r["iteration"] for r in rows] == [1, 2]
    assert rows[-1]["env_steps"] >= 2 * 256

