"""The study's learned output-length predictor, SJF-Pred and cb-sjf-work:hgb (issue 16)."""

from __future__ import annotations

import numpy as np
import pytest

from cbgym import Trace, simulate
from cbgym.agents import make_policy
from cbgym.agents import predictor as P
from cbgym.agents.predicted import CBSJFWorkPred, SJFPred
from cbgym.agents.predictor_features import FEATURES, arrival_features, run_features
from cbgym.bench_inputs import window_starts
from cbgym.workload.synthetic import synthetic_trace

sklearn = pytest.importorskip("sklearn")

PAPER = "cbsjf-paper"


def clocked(n: int, seed: int = 0) -> Trace:
    """A synthetic conversation trace with a recorded wall clock, as the Azure loader gives."""
    tr = synthetic_trace("conv", n, seed=seed)
    epoch = 1.7e9 + np.asarray(tr.arrival_s) * 7.0  # a few hours of arrivals
    return Trace.from_arrays(tr.arrival_s, tr.prompt_tokens, tr.output_tokens,
                             name="synthetic-conv", extra={"epoch_s": epoch})


@pytest.fixture(scope="module")
def trained() -> tuple[Trace, P.Predictor]:
    tr = clocked(3000)
    return tr, P.train(tr, train_fraction=0.5, engine=PAPER, load=0.9)


# ---------------------------------------------------------------- content-blind features
def random_run(rng: np.random.Generator, n: int, span_s: float, service_s: float
               ) -> tuple[np.ndarray, ...]:
    """Arrivals, prompts, outputs and finish times of a made-up run (finish to 0.1 s)."""
    arrival = np.sort(rng.uniform(0, span_s, n))
    finish = np.round(arrival + rng.exponential(service_s, n), 1)
    return arrival, rng.integers(1, 4000, n), rng.integers(1, 900, n), finish


def test_features_read_only_outputs_completed_before_the_arrival() -> None:
    rng = np.random.default_rng(0)
    n = 1500
    arrival, prompt, output, finish = random_run(rng, n, 600.0, 30.0)
    finished = rng.random(n) < 0.9
    X = run_features(arrival, prompt, output, finish, finished, None, False)
    for i in rng.choice(n, 40, replace=False):
        later = ~(finished & (finish <= arrival[i]))  # not completed when i arrived
        changed = output.copy()
        changed[later] = rng.integers(1, 10_000, int(later.sum()))
        Y = run_features(arrival, prompt, changed, finish, finished, None, False)
        np.testing.assert_array_equal(X[i], Y[i])
    assert X.shape == (n, len(FEATURES))
    assert np.isnan(X[0, 7]) and np.isfinite(X[-1, 7])  # no completion before the first


def test_the_policy_is_not_privileged_and_never_receives_true_outputs(tmp_path, trained) -> None:
    tr, pred = trained
    seen = []

    class Spy(SJFPred):
        def reset(self, ctx):  # type: ignore[no-untyped-def]
            seen.append(ctx.true_output_tokens)
            super().reset(ctx)

    path = pred.save(tmp_path / "p.npz")
    simulate(tr.window(1500, 1500), Spy(str(path)), engine=PAPER, load=0.9)
    assert seen == [None] and not SJFPred.privileged and not CBSJFWorkPred.privileged


def test_features_are_the_runs_own_at_each_arrival() -> None:
    arrival = np.arange(20, dtype=float)
    prompt = np.arange(1, 21)
    done_t, done_out = np.arange(10) + 0.5, np.arange(10) * 10.0
    X = arrival_features(np.array([9, 19]), arrival, prompt, None, True, done_t, done_out)
    # request 9 arrives at 9: completions at 0.5..8.5 (9 of them); 19: all ten
    assert X[0, 7] == np.mean(done_out[:9]) and X[1, 7] == np.mean(done_out)
    assert X[1, 8] == np.percentile(done_out, 90) and X[0, 2] == 1.0
    assert X[1, 5] == 1.0 and X[1, 6] == pytest.approx(1.0)  # one arrival a second


# ---------------------------------------------------------------- split and frozen model
def test_training_sees_only_the_leading_split(monkeypatch, trained) -> None:
    tr, _ = trained
    given = []
    real = P.features_of_run

    def spy(trace, engine, load):  # type: ignore[no-untyped-def]
        given.append(trace)
        return real(trace, engine, load)

    monkeypatch.setattr(P, "features_of_run", spy)
    pred = P.train(tr, train_fraction=0.4, engine=PAPER)
    head, rest = given
    k = int(0.4 * len(tr))
    np.testing.assert_array_equal(head.extra["epoch_s"], tr.extra["epoch_s"][:k])
    np.testing.assert_array_equal(rest.extra["epoch_s"], tr.extra["epoch_s"][k:])
    assert pred.meta["train_rows"] == [0, k] and pred.meta["held_out_rows"] == [k, len(tr)]
    assert pred.meta["train_clock_s"] == [tr.extra["epoch_s"][0], tr.extra["epoch_s"][k - 1]]
    for key in ("mae_tokens", "spearman"):
        assert np.isfinite(pred.meta["held_out_accuracy"][key])


def test_a_run_inside_the_training_split_is_refused(tmp_path, trained) -> None:
    tr, pred = trained
    path = pred.save(tmp_path / "p.npz")
    with pytest.raises(ValueError, match="training split"):
        simulate(tr.window(1000, 800), make_policy(f"sjf-pred:{path}"), engine=PAPER, load=0.9)
    res = simulate(tr.window(1500, 800), make_policy(f"cb-sjf-work:{path}"), engine=PAPER,
                   load=0.9)
    assert res.summary()["num_finished"] == 800


def test_save_and_load_give_identical_predictions(tmp_path, trained) -> None:
    tr, pred = trained
    X = run_features(tr.arrival_s, tr.prompt_tokens, tr.output_tokens,
                     tr.arrival_s + 1.0, np.ones(len(tr), bool), tr.extra["epoch_s"], False)
    back = P.Predictor.load(pred.save(tmp_path / "p.npz"))
    np.testing.assert_array_equal(back.predict(X), pred.predict(X))
    assert back.meta == pred.meta
    with np.load(tmp_path / "p.npz", allow_pickle=False) as f:  # numbers and text only
        assert all(f[k].dtype != object for k in f.files)


def test_the_exported_trees_predict_as_scikit_learn() -> None:
    from sklearn.ensemble import HistGradientBoostingRegressor

    rng = np.random.default_rng(1)
    X = rng.normal(size=(3000, len(FEATURES)))
    y = np.log1p(np.exp(X[:, 0]) * 50 + rng.exponential(20, 3000))
    X[rng.random(X.shape) < 0.05] = np.nan  # (missing values: the trees learn a side)
    model = HistGradientBoostingRegressor(**P.HYPERPARAMETERS, random_state=0).fit(X, y)
    Xt = rng.normal(size=(500, len(FEATURES)))
    Xt[rng.random(Xt.shape) < 0.05] = np.nan
    pred = P._export(model, np.full(len(FEATURES), np.nan), {})  # (no filling: sklearn's NaN)
    np.testing.assert_allclose(pred.predict(Xt), np.maximum(np.expm1(model.predict(Xt)), 0),
                               rtol=1e-12, atol=1e-9)


def test_a_bad_predictor_file_is_named(tmp_path) -> None:
    bad = tmp_path / "x.npz"
    np.savez(bad, a=np.zeros(2))
    with pytest.raises(ValueError, match="not a cbgym predictor"):
        P.Predictor.load(bad)
    with pytest.raises(ValueError, match="'hgb' .* or a predictor file; got 'nowhere.npz'"):
        make_policy("sjf-pred:nowhere.npz")
    with pytest.raises(ValueError, match="estimator must be one of bucket, global, hgb"):
        make_policy("cb-sjf-work:oracle")
    with pytest.raises(ValueError, match="no shipped predictor"):
        simulate(clocked(50), make_policy("cb-sjf-work:hgb"), engine=PAPER, load=0.9)


# ---------------------------------------------------------------- policies and the bench
def test_shipped_predictors_load_for_the_2023_traces() -> None:
    for name in ("azure-conv-2023", "azure-code-2023"):
        pred = P.Predictor.shipped(f"{name}@rho=0.9")
        assert pred.meta["trace"] == name and pred.meta["features"] == list(FEATURES)
        assert pred.meta["train_rows"][0] == 0 and "held_out_accuracy" in pred.meta


def test_policy_specs_and_aging_variants(tmp_path, trained) -> None:
    tr, pred = trained
    path = pred.save(tmp_path / "p.npz")
    w = tr.window(1600, 600)
    for spec in (f"sjf-pred:{path}", f"cb-sjf-work:{path}", f"sjf-pred-aging:{path},0.5",
                 f"cb-sjf-work-pred-aging:{path},0.5"):
        pol = make_policy(spec)
        assert pol.consult == "on_change"
        res = simulate(w, pol, engine=PAPER, load=0.95)
        assert res.summary()["num_finished"] == len(w), spec
    assert make_policy(f"cb-sjf-work:{path}").label == f"cb-sjf-work:{path}"
    assert make_policy("cb-sjf-work").label == "cb-sjf-work"  # the bucket mean, as before


def test_the_env_agent_needs_the_arrival_features(trained) -> None:
    import gymnasium as gym

    from cbgym.agents.base import QueueView
    from cbgym.env.agents import EnvAgent

    pol = SJFPred("hgb")
    z = np.zeros(1, np.int64)
    view = QueueView(queue_pos=z, prompt_tokens=z + 5, num_computed=z, num_generated=z,
                     num_preemptions=z, waited_s=np.zeros(1), tenant=z, slo_class=z, now=0.0,
                     recent_output_by_bucket=np.zeros(8), recent_output_mean=0.0)
    with pytest.raises(ValueError, match="cbgym.simulate"):
        pol.keys(view)
    env = gym.make("cbgym/Scheduling-v0", episode_requests=24, trace="synthetic-conv")
    with pytest.raises(TypeError, match="arrival_features=True"):
        EnvAgent("sjf-pred", env)


@pytest.mark.parametrize("masked", [False, True], ids=["box", "masked"])
@pytest.mark.parametrize("name", ["sjf-pred", "cb-sjf-work", "sjf-pred-aging"])
def test_env_agent_reproduces_the_fast_path(tmp_path, trained, name: str, masked: bool) -> None:
    """From the observation's waiting_arrival, the env agent predicts what the fast path
    predicts, and schedules request for request as it does."""
    import gymnasium as gym

    import cbgym
    from cbgym import EngineConfig, LinearCostModel
    from cbgym.env.agents import EnvAgent, run_episode

    tr, pred = trained
    path = pred.save(tmp_path / "p.npz")
    spec = f"{name}:{path},0.5" if name.endswith("aging") else f"{name}:{path}"
    cfg = EngineConfig(preset=None, cost_model=LinearCostModel(), num_kv_blocks=600,
                       max_num_seqs=24)
    env = gym.make("cbgym/SchedulingMasked-v0" if masked else "cbgym/Scheduling-v0",
                   trace=tr, engine=cfg, episode_requests=150, K=150, R=24, load=1.0,
                   arrival_features=True)
    assert "waiting_arrival" in env.observation_space.spaces
    agent = EnvAgent(spec, env, seed=0)
    out = run_episode(env, agent, seed=0, options={"start": 1700})
    assert out["terminated"] == 1.0
    u = env.unwrapped
    got = u.episode_result().requests
    fast = cbgym.simulate(u.episode_trace, spec, engine=cfg, seed=0, slo=u.slo).requests
    assert u.engine.recorder.timeseries()[:, 2].max() <= u.K, "the queue must fit in K"
    for col in ("first_scheduled_s", "first_token_s", "finish_s", "preemptions", "status"):
        np.testing.assert_array_equal(got[col].to_numpy(), fast[col].to_numpy(), err_msg=col)
    fcfs = cbgym.simulate(u.episode_trace, "fcfs", engine=cfg, seed=0, slo=u.slo).requests
    assert not np.array_equal(fcfs["finish_s"].to_numpy(), got["finish_s"].to_numpy())


def test_window_range_draws_windows_after_the_split() -> None:
    assert window_starts(1000, 3, 100, (0.4, 1.0)) == [400, 650, 900]
    assert window_starts(1000, 1, 2000, (0.4, 1.0)) == [400]
    assert window_starts(1000, 2, 100) == [0, 900]
    with pytest.raises(ValueError, match="holds 0; a window needs at least 2"):
        window_starts(10, 1, 4000, (0.95, 1.0))


def test_a_renamed_or_clustered_run_on_the_training_split_is_still_refused(tmp_path,
                                                                           trained) -> None:
    from cbgym.cluster.config import ClusterConfig

    tr, pred = trained
    path = pred.save(tmp_path / "p.npz")
    head = tr.window(100, 300)
    renamed = Trace.from_arrays(head.arrival_s, head.prompt_tokens, head.output_tokens,
                                name="elsewhere", extra=dict(head.extra))
    with pytest.raises(ValueError, match="training split"):
        simulate(renamed, make_policy(f"sjf-pred:{path}"), engine=PAPER, load=0.9)
    with pytest.raises(ValueError, match="training split"):
        simulate(head, cluster=ClusterConfig.preset("2x:llama-2-7b/a100-80gb"), load=0.8,
                 policy=f"sjf-pred:{path}")
    bare = Trace.from_arrays(head.arrival_s, head.prompt_tokens, head.output_tokens,
                             name=tr.name)  # the same trace without its clock
    with pytest.raises(ValueError, match="no recorded clock"):
        simulate(bare, make_policy(f"sjf-pred:{path}"), engine=PAPER, load=0.9)


def test_a_malformed_predictor_file_is_refused(tmp_path, trained) -> None:
    import dataclasses

    _, pred = trained
    bad = dataclasses.replace(pred, left=np.where(pred.leaf, pred.left, 10**6))
    with pytest.raises(ValueError, match="child index"):
        P.Predictor.load(bad.save(tmp_path / "bad.npz"))
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="cannot read a predictor"):
        P.Predictor.load(tmp_path / "junk.npz")


def test_keyword_construction_of_cb_sjf_work_still_works() -> None:
    from cbgym.agents import POLICIES, CBSJFWork

    assert CBSJFWork(prior_output_tokens=100).prior_output_tokens == 100
    assert POLICIES["cb-sjf-work-shed"](cap=5) is not None
    with pytest.raises(ValueError, match="cb-sjf-work-pred-aging"):
        make_policy("cb-sjf-work-aging:hgb,0.5")


def test_the_clis_refuse_a_training_window_in_one_line(capsys) -> None:
    from cbgym.cli import main
    from cbgym.workload import catalog

    if catalog.find_trace("azure-code-2023") is None:
        pytest.skip("needs the azure-code-2023 trace (CBGYM_TRACE_DIR)")
    for argv in (["simulate", "--trace", "azure-code-2023", "--policy", "sjf-pred",
                  "--requests", "200"],
                 ["bench", "--trace", "azure-code-2023", "--policies", "fcfs,cb-sjf-work:hgb",
                  "--loads", "0.9", "--windows", "1", "--window-requests", "200", "--quiet"]):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        assert stop.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert "training split" in err and "--start" in err, err


def test_the_arrival_key_checks_clean_and_the_native_vector_env_refuses_it() -> None:
    import warnings

    import gymnasium as gym
    from gymnasium.utils.env_checker import check_env

    env = gym.make("cbgym/Scheduling-v0", trace="synthetic-conv", episode_requests=30,
                   arrival_features=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)
    obs, _ = env.reset(seed=0)
    rows = obs["waiting_arrival"].reshape(-1, len(FEATURES))[obs["waiting_mask"] > 0.5]
    assert len(rows) and (rows[:, 0] >= 1).all()  # context tokens, raw
    from cbgym.env.vector import SchedulingVectorEnv

    with pytest.raises(NotImplementedError, match="arrival_features"):
        SchedulingVectorEnv(num_envs=2, trace="synthetic-conv", arrival_features=True)
    # make_vec steps single envs instead, as for the other settings the native env lacks
    venv = gym.make_vec("cbgym/Scheduling-v0", num_envs=2, trace="synthetic-conv",
                        episode_requests=30, arrival_features=True)
    vobs, _ = venv.reset(seed=0)
    assert vobs["waiting_arrival"].shape == (2, *obs["waiting_arrival"].shape)
    venv.step(venv.action_space.sample())
    venv.close()
    with pytest.raises(ValueError, match="arrival_features"):
        gym.make("cbgym/Scheduling-v0", trace="synthetic-conv", arrival_features="yes")


def test_the_tail_of_completions_gives_the_features_of_all_of_them() -> None:
    from cbgym.agents.predictor_features import completions

    rng = np.random.default_rng(3)
    n = 3000
    arrival, prompt, out, finish = random_run(rng, n, 500.0, 20.0)  # (many ties)
    finished = np.argsort(finish, kind="stable")[: 2500]
    finished = finished[rng.permutation(len(finished))]
    finished = finished[np.argsort(finish[finished], kind="stable")]  # ties in any order
    new = np.arange(2000, 2100)
    full = run_features(arrival, prompt, out, finish, np.isin(np.arange(n), finished), None,
                        False)
    t, o = completions(finished, finish, out, float(arrival[new].min()))
    got = arrival_features(new, arrival, prompt, None, False, t, o)
    np.testing.assert_array_equal(got, full[new])
