"""Direct policy search (cbgym.agents.evolution, tools/train_es.py): a candidate's fitness is
what the shipped policy would score. Its batched scores are the policy's deterministic
actions, play() counts the goodput the fast path (learned:) gets on the same windows, and a
tiny search run writes a loadable checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")
pytest.importorskip("cma")

import cbgym  # noqa: E402
from cbgym.agents.evolution import CAP_MODULES, Population, draw_windows, play  # noqa: E402
from cbgym.agents.learned import LearnedPolicy  # noqa: E402
from cbgym.engine import EngineConfig, LinearCostModel  # noqa: E402
from cbgym.env.vector import SchedulingVectorEnv  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SLO = cbgym.SLO(0.5, 0.05)
N_REQ = 80


def _trace() -> cbgym.Trace:
    rng = np.random.default_rng(4)
    n = 400
    return cbgym.Trace.from_arrays(np.cumsum(rng.exponential(0.02, n)),
                                   rng.integers(20, 1500, n), rng.integers(2, 200, n))


def _kwargs() -> dict:
    cfg = EngineConfig(preset=None, cost_model=LinearCostModel(), num_kv_blocks=400)
    return {"trace": _trace(), "engine": cfg, "episode_requests": N_REQ, "load": (1.2, 1.8),
            "slo": SLO, "shed_rule": "unreachable", "shed_threshold": -0.51,
            "admission_cap": True, "capacity_rps": 30.0}


@pytest.fixture(scope="module")
def model():
    from stable_baselines3 import PPO

    from cbgym.agents.learned import META_KEY
    from cbgym.agents.slot_net import SlotPolicy
    from cbgym.agents.slot_prior import prior_spec, spec_dict

    kw = _kwargs()
    env = cbgym.SchedulingEnv(**kw)
    spec = prior_spec("cb-sjf-work-shed:6", env.config, SLO, env.hold_threshold, True)
    m = PPO(SlotPolicy, env, n_steps=8, batch_size=8, device="cpu", seed=0,
            policy_kwargs={"net_arch": [8], "prior": spec_dict(spec)})
    setattr(m, META_KEY, {"algo": "ppo", "window_rule": "oldest", "hold_threshold": -0.5,
                          "shed_threshold": -0.51, "shed_rule": "unreachable",
                          "slo": {"ttft_s": SLO.ttft_s, "tpot_s": SLO.tpot_s}})
    return m


def _vectors(pop: Population, P: int, scale: float = 0.3) -> np.ndarray:
    rng = np.random.default_rng(7)
    return pop.get() + scale * rng.standard_normal((P, pop.dim))


def test_batched_scores_are_each_vectors_deterministic_action(model) -> None:
    pop = Population(model.policy)
    x0 = pop.get()
    X = _vectors(pop, 3)
    venv = SchedulingVectorEnv(num_envs=6, **_kwargs())
    obs, _ = venv.reset(seed=3)
    for _ in range(20):  # observations from the middle of episodes
        obs, *_ = venv.step(venv.action_space.sample() * 0.5)
    batched = pop.scores(X, obs)
    for p in range(3):
        pop.set(X[p])
        one = {k: v[2 * p: 2 * p + 2] for k, v in obs.items()}
        action, _ = model.predict(one, deterministic=True)
        np.testing.assert_allclose(batched[2 * p: 2 * p + 2], action, atol=1e-6)
    pop.set(x0)
    np.testing.assert_array_equal(pop.get(), x0)


def test_a_cap_search_moves_the_cap_score_alone(model) -> None:
    full, cap = Population(model.policy), Population(model.policy, CAP_MODULES)
    assert cap.dim < full.dim and all(n.split(".")[0] in CAP_MODULES for n in cap.names)
    venv = SchedulingVectorEnv(num_envs=6, **_kwargs())
    obs, _ = venv.reset(seed=3)
    for _ in range(20):
        obs, *_ = venv.step(venv.action_space.sample() * 0.5)
    start = full.scores(full.get()[None], obs)  # (one vector for the 6 envs)
    moved = cap.scores(_vectors(cap, 3), obs)
    # the slot scores' output layers are zero at the prior: the order and the victims stay
    # the prior's, the cap's score (the last) moves
    np.testing.assert_array_equal(moved[:, :-1], start[:, :-1])
    assert not np.allclose(moved[:, -1], start[:, -1])
    with pytest.raises(ValueError, match="modules"):
        Population(model.policy, ("critic",))


def test_set_writes_the_actor_and_leaves_the_critic(model) -> None:
    pop = Population(model.policy)
    x0 = pop.get()
    critic = [p.detach().clone() for p in model.policy.mlp_extractor.critic.parameters()]
    pop.set(x0 + 1.0)
    try:
        np.testing.assert_allclose(pop.get(), x0 + 1.0, rtol=1e-6)
        for before, after in zip(critic, model.policy.mlp_extractor.critic.parameters(),
                                 strict=True):
            assert np.array_equal(before.numpy(), after.detach().numpy())
        # the prior's zero residual: x0's output layers are zero
        assert pop.dim == sum(p.numel() for n, p in model.policy.mlp_extractor.named_parameters()
                              if not n.startswith("critic"))
    finally:
        pop.set(x0)
    with pytest.raises(ValueError, match="parameters"):
        pop.set(np.zeros(pop.dim + 1))
    with pytest.raises(ValueError, match="finite"):
        pop.scores(np.full((1, pop.dim), np.nan), {})


def test_play_counts_what_the_learned_policy_scores_on_the_fast_path(model) -> None:
    """Fitness is the shipped policy's goodput: each (vector, window) of play() equals
    cbgym.simulate of learned: with that vector on that window, request for request."""
    pop = Population(model.policy)
    x0 = pop.get()
    # (small steps from the prior: a vector that held every request with nothing running
    # would idle the env until its step limit, where learned: admits one; play's docstring)
    X = np.vstack([x0, _vectors(pop, 2, scale=0.15)])
    kw = _kwargs()
    starts, loads = np.array([10, 150]), np.array([1.3, 1.7])
    venv = SchedulingVectorEnv(num_envs=6, **kw)
    good = play(venv, pop, X, starts, loads)
    assert good.shape == (3, 2)
    trace = kw["trace"]
    try:
        for p in range(3):
            pop.set(X[p])
            for w in range(2):
                res = cbgym.simulate(trace.window(int(starts[w]), N_REQ), LearnedPolicy(model),
                                     engine=kw["engine"], load=float(loads[w]), slo=SLO,
                                     capacity_rps=kw["capacity_rps"])
                assert good[p, w] == round(res.summary()["slo_attainment"] * N_REQ), (p, w)
    finally:
        pop.set(x0)
    # the zero residual plays the prior: the heuristic it was built from, on these windows
    fast = [cbgym.simulate(trace.window(int(s), N_REQ), "cb-sjf-work-shed:6", engine=kw["engine"],
                           load=float(ld), slo=SLO, capacity_rps=kw["capacity_rps"]).summary()
            for s, ld in zip(starts, loads, strict=True)]
    assert good[0].tolist() == [round(s["slo_attainment"] * N_REQ) for s in fast]
    assert len(set(good.ravel().tolist())) > 1  # the vectors differ in what they serve


def test_play_checks_its_env(model) -> None:
    pop = Population(model.policy)
    X = pop.get()[None]
    with pytest.raises(ValueError, match="1 x 2"):
        play(SchedulingVectorEnv(num_envs=3, **_kwargs()), pop, X, np.array([0, 1]),
             np.array([1.0, 1.0]))
    shaped = SchedulingVectorEnv(num_envs=1, shed_weight=0.5, **_kwargs())
    with pytest.raises(ValueError, match="shaped"):
        play(shaped, pop, X, np.array([0]), np.array([1.0]))


def test_draw_windows_stay_in_their_range() -> None:
    rng = np.random.default_rng(0)
    starts, loads = draw_windows(rng, (100, 400), 80, (1.2, 1.8), 500)
    assert starts.min() >= 100 and starts.max() <= 320
    assert loads.min() >= 1.2 and loads.max() <= 1.8
    _, fixed = draw_windows(rng, (0, 80), 80, 1.5, 3)
    assert fixed.tolist() == [1.5] * 3
    with pytest.raises(ValueError, match="cannot hold"):
        draw_windows(rng, (0, 79), 80, 1.5, 1)


def test_train_es_smoke_run_writes_a_loadable_policy(tmp_path: Path) -> None:
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, str(ROOT / "tools" / "train_es.py"), "--trace", "synthetic-conv",
           "--episode-requests", "64", "--eval-windows", "2", "--eval-loads", "1.2",
           "--eval-baselines", "cb-sjf-work-shed", "--prior", "cb-sjf-work-shed",
           "--generations", "2", "--popsize", "2", "--windows", "2", "--validate-every", "1",
           "--loss-weight", "0.5",  # (the start plays beside the candidates)
           "--no-progress-bar", "--output-dir", str(out)]
    subprocess.run(cmd, check=True, cwd=ROOT, env=env, timeout=300)
    for name in ("policy.zip", "config.json", "evaluation.json", "generations.csv", "best.json"):
        assert (out / name).is_file(), name
    ev = json.loads((out / "evaluation.json").read_text())
    learned = ev["summary"]["1.2"]["learned"]["goodput_mean"]
    # the fast path (learned:) scores the chosen vector as the search's vector env did
    assert learned == pytest.approx(ev["training"]["validation_vector_env"])
    assert ev["training"]["generations_run"] == 2
    res = cbgym.simulate(cbgym.load_trace("synthetic-conv").window(0, 64),
                         f"learned:{out / 'policy.zip'}", engine="cbsjf-paper", load=1.2)
    assert res.summary()["num_requests"] == 64


def test_train_es_refuses_what_it_cannot_search() -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    import train_es

    for argv in (["--popsize", "3"], ["--generations", "0"], ["--sigma", "0"],
                 ["--env-id", "cbgym/SchedulingMasked-v0"], ["--shed-weight", "1"],
                 ["--ship"], ["--task", "prefix-conv-mooncake"],  # no native prefix caching
                 ["--loss-weight", "-1"], ["--loss-weight", "nan"], ["--loss-weight", "inf"],
                 ["--search", "cap", "--task", "code-vllm-bursty", "--resume-from", "m.zip"],
                 ["--search", "cap"]):  # no cap score without a task's env or --admission-cap
        with pytest.raises(SystemExit):
            train_es.parse(argv)


def test_loss_penalised_fitness_on_hand_made_numbers() -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    import train_es

    good = np.array([[10.0, 20.0, 30.0], [12.0, 12.0, 40.0]])
    reference = np.array([11.0, 15.0, 30.0])
    # candidate 0: mean 20, short by 1 on window 0; candidate 1: mean 64/3, short by 3 on window 1
    assert train_es.loss_penalised(good, reference, 0.0) == pytest.approx([20.0, 64 / 3])
    assert train_es.loss_penalised(good, reference, 2.0) == pytest.approx(
        [20.0 - 2 / 3, 64 / 3 - 2.0])
    with pytest.raises(ValueError, match="W references"):
        train_es.loss_penalised(good, reference[:2], 1.0)


def test_train_es_asks_the_vector_env_what_it_lacks(capsys: pytest.CaptureFixture[str]) -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    import train_es

    from cbgym.env.vector import native_lacks

    assert native_lacks() is None
    assert "prefix_features" in (native_lacks(prefix_features=True) or "")
    # prefix caching runs compiled, the cache's observation does not: scores that read it
    # cannot be searched; scores that do not leave it out of the search's env
    with pytest.raises(SystemExit):
        train_es.parse(["--task", "prefix-conv-mooncake"])
    err = capsys.readouterr().err
    assert "no prefix_features" in err and "--no-prefix-inputs" in err
    _, args = train_es.parse(["--task", "prefix-conv-mooncake", "--no-prefix-inputs"])
    assert not args.prefix_inputs
    kept = train_es.native_kwargs({"prefix_features": True, "K": 16}, prefix_inputs=False)
    assert kept == {"K": 16}
    assert train_es.native_kwargs({"prefix_features": True}, prefix_inputs=True) == {
        "prefix_features": True}
    # a tenant task's fairness counters are left out of the search (native_kwargs), so the
    # task itself is searchable: its shipped policy came from this search
    _, args = train_es.parse(["--task", "tenants-noisy-neighbour"])
    assert args.task == "tenants-noisy-neighbour"


# ----------------------------------------------------------------------------- routers
ROUTER_ENV = {"cluster": "2p2d:llama-2-7b/a100-80gb", "episode_requests": 40,
              "capacity_rps": 20.0}


@pytest.fixture(scope="module")
def router():
    sb3 = pytest.importorskip("sb3_contrib")
    from cbgym.env.cluster_env import ClusterEnv

    env = ClusterEnv(**ROUTER_ENV, load=0.8)
    return sb3.MaskablePPO("MultiInputPolicy", env, n_steps=64, batch_size=32, seed=0,
                           policy_kwargs={"net_arch": [16]})


def test_a_routers_batched_route_is_its_most_likely_allowed_route(router) -> None:
    from cbgym.env.cluster_vector import ClusterVectorEnv

    pop = Population(router.policy)
    assert pop.discrete and pop.names[-1].startswith("action_net")
    X = _vectors(pop, 2, scale=0.5)
    venv = ClusterVectorEnv(num_envs=4, **ROUTER_ENV, load=0.8)
    obs, _ = venv.reset(seed=0)
    masks = venv.action_masks()
    routes = pop.actions(X, obs, masks)
    x0 = pop.get()
    try:
        for p in range(2):
            pop.set(X[p])
            for e in (2 * p, 2 * p + 1):
                a, _ = router.predict({k: v[e] for k, v in obs.items()}, deterministic=True,
                                      action_masks=masks[e])
                assert routes[e] == int(a)
    finally:
        pop.set(x0)


def test_play_counts_what_the_deterministic_router_serves(router) -> None:
    """A router's fitness on the native cluster vector env is what serve() gives the same
    deterministic router on that window, and a router whose card says so routes
    deterministically by default."""
    from cbgym.agents.learned import META_KEY
    from cbgym.agents.routing.learned import LearnedRouter
    from cbgym.capacity import scale_to_load
    from cbgym.cluster.run import serve
    from cbgym.env.cluster_env import ClusterEnv
    from cbgym.env.cluster_vector import ClusterVectorEnv

    pop = Population(router.policy)
    x0 = pop.get()
    X = np.vstack([x0, _vectors(pop, 1, scale=0.5)])
    starts, loads = np.array([0, 100]), np.array([0.8, 1.4])
    venv = ClusterVectorEnv(num_envs=4, **ROUTER_ENV, load=0.8)
    good = play(venv, pop, X, starts, loads)
    env = ClusterEnv(**ROUTER_ENV, load=0.8)
    try:
        for p in range(2):
            pop.set(X[p])
            setattr(router, META_KEY, {"act": "deterministic"})
            learned = LearnedRouter(router)
            assert learned.deterministic
            for w in range(2):
                window = scale_to_load(env.trace.window(int(starts[w]), 40), float(loads[w]),
                                       env.config.engines[0],
                                       capacity_rps=ROUTER_ENV["capacity_rps"])
                s = serve(window, env.config, learned, slo=env.slo).summary()
                assert good[p, w] == round(s["slo_attainment"] * 40), (p, w)
    finally:
        pop.set(x0)
        setattr(router, META_KEY, None)
    assert not LearnedRouter(router).deterministic  # (no card: drawn, as PPO trains)


def test_search_moves_towards_fitness_and_chooses_by_validation() -> None:
    """On a smooth problem the mean approaches the optimum; the chosen vector is the best
    validated mean, the start when nothing validated better."""
    from cbgym.agents.evolution import search

    target = np.arange(6, dtype=float) / 10

    def fitness(X: np.ndarray, g: int) -> np.ndarray:
        return -((X - target) ** 2).sum(axis=1)

    rows: list[dict] = []
    found = search(np.zeros(6), fitness, lambda x: float(fitness(x[None], 0)[0]),
                   generations=60, popsize=8, sigma=0.3, seed=0, validate_every=5,
                   on_generation=rows.append)
    assert found.validation > found.start_validation == pytest.approx(-(target ** 2).sum())
    assert np.abs(found.x - target).max() < 0.1
    assert len(rows) == 60 and found.generation % 5 == 0
    assert found.validation == max(r["validation"] for r in rows if np.isfinite(r["validation"]))
    bests: list[tuple[int, float]] = []
    again = search(np.zeros(6), fitness, lambda x: float(fitness(x[None], 0)[0]),
                   generations=60, popsize=8, sigma=0.3, seed=0, validate_every=5,
                   on_best=lambda b: bests.append((b.generation, b.validation)))
    # on_best sees the start, then each new best as it is found, the last one chosen
    assert bests[0] == (0, found.start_validation) and len(bests) > 1
    assert bests[-1] == (found.generation, found.validation) == (again.generation,
                                                                 again.validation)
    assert all(a[1] < b[1] and a[0] < b[0] for a, b in zip(bests, bests[1:], strict=False))
    never = search(np.zeros(6), fitness, lambda x: -float(np.abs(x).sum()), generations=10,
                   popsize=4, sigma=0.3, seed=0, validate_every=5,
                   on_best=lambda b: bests.append((b.generation, b.validation)))
    assert never.generation == 0 and np.array_equal(never.x, np.zeros(6))
    assert bests[-1] == (0, never.start_validation)
    with pytest.raises(ValueError, match="even"):
        search(np.zeros(2), fitness, lambda x: 0.0, generations=1, popsize=3, sigma=1.0, seed=0)
