"""train.py and the learned policy: a training smoke run in a subprocess (cleanrl's test), the
compact checkpoint's save/load round trip, deterministic evaluation through cbgym.simulate,
the env/fast-path equivalence of the learned policy, and the evaluation output."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("stable_baselines3")
pytest.importorskip("sb3_contrib")

import yaml  # noqa: E402
from sb3_contrib import MaskablePPO  # noqa: E402
from stable_baselines3 import PPO  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402

import cbgym  # noqa: E402
from cbgym.agents import make_policy  # noqa: E402
from cbgym.agents.learned import LearnedPolicy, load_model, shipped_names  # noqa: E402
from cbgym.agents.slot_net import MaskableSlotPolicy, SlotPolicy  # noqa: E402
from cbgym.capacity import measure_capacity  # noqa: E402
from cbgym.engine import EngineConfig  # noqa: E402
from cbgym.metrics import SLO  # noqa: E402
from cbgym.workload import load_trace  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import train  # noqa: E402

# a tiny, fast setting: the paper engine, short windows of the synthetic conversation trace
SMOKE = ["--trace", "synthetic-conv", "--total-timesteps", "256", "--num-envs", "2",
         "--n-steps", "64", "--batch-size", "64", "--n-epochs", "1", "--episode-requests", "64",
         "--eval-freq", "128", "--eval-windows", "2", "--eval-loads", "0.9",
         "--eval-baselines", "fcfs", "cb-sjf-work", "--checkpoint-freq", "128",
         "--no-progress-bar"]
PAPER = EngineConfig(preset="cbsjf-paper")
COLUMNS = ["first_token_s", "finish_s", "status"]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("train") / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, str(ROOT / "train.py"), *SMOKE, "--output-dir", str(out)],
                   check=True, cwd=ROOT, env=env, timeout=120)
    return out


def test_smoke_run_writes_model_config_and_evaluation(smoke_run: Path) -> None:
    for name in ("model.zip", "policy.zip", "config.json", "evaluation.json",
                 "evaluations.json"):
        assert (smoke_run / name).is_file(), name
    assert list((smoke_run / "checkpoints").glob("model_*_steps.zip"))
    assert list((smoke_run / "tb").rglob("events.out.tfevents.*"))
    config = json.loads((smoke_run / "config.json").read_text())
    assert config["args"]["total_timesteps"] == 256
    assert config["heldout_requests"][0] == config["train_requests"][1]
    assert config["meta"]["algo"] == "ppo"
    # the compact export drops the Adam moments: well under the full model's size
    assert (smoke_run / "policy.zip").stat().st_size < 0.5 * (smoke_run / "model.zip").stat(
    ).st_size


def test_evaluation_json_keys(smoke_run: Path) -> None:
    ev = json.loads((smoke_run / "evaluation.json").read_text())
    assert {"windows", "loads", "episode_requests", "slo", "summary", "per_window",
            "training"} <= set(ev)
    per = ev["summary"]["0.9"]
    assert {"learned", "fcfs", "cb-sjf-work", "margin_vs_fcfs", "margin_vs_cb-sjf-work"} <= set(
        per)
    assert {"goodput_mean", "goodput_std", "slo_attainment_mean",
            "slo_attainment_std"} <= set(per["learned"])
    assert {"mean", "std", "wins", "ties", "losses"} <= set(per["margin_vs_fcfs"])
    row = ev["per_window"]["learned"][0]
    assert {"load", "start", "goodput", "slo_attainment", "goodput_rps", "num_shed"} <= set(row)
    assert len(ev["per_window"]["fcfs"]) == len(ev["windows"]) * len(ev["loads"])
    # every held-out window lies after the training range
    config = json.loads((smoke_run / "config.json").read_text())
    assert min(ev["windows"]) >= config["heldout_requests"][0]
    assert ev["training"]["env_steps_per_second"] > 0
    history = json.loads((smoke_run / "evaluations.json").read_text())
    assert [h["timesteps"] for h in history][-1] == 256


def test_resume_continues_the_step_count(smoke_run: Path, tmp_path: Path) -> None:
    args = train.parse_args([*SMOKE, "--total-timesteps", "128", "--eval-freq", "0",
                             "--checkpoint-freq", "0", "--resume-from",
                             str(smoke_run / "model.zip"), "--output-dir", str(tmp_path)])
    trace = load_trace("synthetic-conv")
    mu = measure_capacity(trace, PAPER)
    vec = make_vec_env(args.env_id, 1, env_kwargs=train.env_kwargs(args, trace, PAPER, mu))
    model = train.build_model(args, vec, tmp_path)
    assert model.num_timesteps == 256
    model.learn(128, reset_num_timesteps=False)
    assert model.num_timesteps >= 384


def test_export_round_trip_and_deterministic_simulation(smoke_run: Path) -> None:
    full, compact = load_model(smoke_run / "model.zip"), load_model(smoke_run / "policy.zip")
    obs = full.observation_space.sample()
    a, _ = full.predict(obs, deterministic=True)
    b, _ = compact.predict(obs, deterministic=True)
    np.testing.assert_array_equal(a, b)
    window = load_trace("synthetic-conv").window(15_000, 96)
    runs = [cbgym.simulate(window, f"learned:{smoke_run / 'policy.zip'}", engine=PAPER,
                           load=1.0).requests for _ in range(2)]
    for col in COLUMNS:
        np.testing.assert_array_equal(runs[0][col].to_numpy(), runs[1][col].to_numpy())


def _play_env(model: Any, env: gym.Env, start: int) -> None:
    obs, info = env.reset(seed=0, options={"start": start})
    masked = env.unwrapped.masked
    while True:
        kw = {"action_masks": info["action_mask"]} if masked else {}
        action, _ = model.predict(obs, deterministic=True, **kw)
        obs, _, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            return


@pytest.mark.parametrize("masked", [False, True], ids=["box", "masked"])
def test_learned_policy_replays_the_env_exactly(masked: bool) -> None:
    """The fast path (``cbgym.simulate``) rebuilds the env's observations and decisions."""
    trace = load_trace("synthetic-conv")
    env_id = "cbgym/SchedulingMasked-v0" if masked else "cbgym/Scheduling-v0"
    # small slots so that the windows overflow and the visible-window rule matters
    env = gym.make(env_id, trace=trace, engine=PAPER, load=1.1, episode_requests=96, K=4, R=8,
                   window_rule="smallest_prompt", slo=cbgym.SLO(2.0, 0.1), shed_rule="late")
    algo, policy = (MaskablePPO, MaskableSlotPolicy) if masked else (PPO, SlotPolicy)
    model = algo(policy, env, seed=3, device="cpu")
    # an untrained scorer is nearly constant: give its output layers weight to rank with,
    # and a bias that admits (a policy that holds everything would idle the engine for long)
    scorer = model.policy.mlp_extractor
    for layer in scorer.output_layers():
        layer.weight.data.normal_(0.0, 0.05)
        layer.bias.data.fill_(0.5)
    if scorer.stop_head is not None:
        scorer.stop_head.bias.data.fill_(-5.0)
    model.cbgym = {"algo": "maskable_ppo" if masked else "ppo",
                   "window_rule": "smallest_prompt", "hold_threshold": -0.5,
                   "shed_threshold": -0.99, "slo": {"ttft_s": 2.0, "tpot_s": 0.1}}
    _play_env(model, env, start=200)
    got = env.unwrapped.episode_result().requests
    fast = cbgym.simulate(env.unwrapped.episode_trace, LearnedPolicy(model), engine=PAPER).requests
    for col in COLUMNS:
        np.testing.assert_array_equal(got[col].to_numpy(), fast[col].to_numpy(), err_msg=col)


def test_learned_policy_decodes_with_the_env_settings() -> None:
    """The fast path's decoder gets the env's settings, the shed rule's lead included."""
    trace = load_trace("synthetic-conv")
    env = gym.make("cbgym/Scheduling-v0", trace=trace, engine=PAPER, load=1.4,
                   episode_requests=64, slo=cbgym.SLO(0.5, 0.1), shed_threshold=-0.51,
                   shed_rule="unreachable")
    env.reset(seed=0)
    model = PPO(SlotPolicy, env, seed=3, device="cpu")
    model.cbgym = {"algo": "ppo", "window_rule": "oldest", "hold_threshold": -0.5,
                   "shed_threshold": -0.51, "shed_rule": "unreachable",
                   "slo": {"ttft_s": 0.5, "tpot_s": 0.1}}
    pol = LearnedPolicy(model)
    cbgym.simulate(env.unwrapped.episode_trace, pol, engine=PAPER)
    env_es = env.unwrapped._sim.es
    np.testing.assert_array_equal(pol._es.cfg_f, env_es.cfg_f)
    np.testing.assert_array_equal(pol._es.cfg_i, env_es.cfg_i)
    assert env_es.cfg_f[2:].tolist() == [0.008, 0.00028]  # the study engine's c_f, c_p


@pytest.mark.skipif("default" not in shipped_names(), reason="no shipped checkpoint yet")
def test_shipped_default_checkpoint_runs_out_of_the_box() -> None:
    pol = make_policy("learned:default")
    assert pol.consult == "every_iteration" and pol.label == "learned:default"
    res = cbgym.simulate(load_trace("synthetic-conv").window(0, 64), "learned", engine=PAPER,
                         load=0.9, slo=SLO())
    assert res.summary()["num_finished"] + res.summary()["num_shed"] == 64


def test_unknown_checkpoint_names_the_shipped_ones() -> None:
    with pytest.raises(ValueError, match="no checkpoint 'nope'"):
        make_policy("learned:nope")


def test_args_have_help_from_field_docstrings() -> None:
    docs = train.field_docs(train.Args)
    assert {f.name for f in dataclasses.fields(train.Args)} == set(docs)
    args = train.parse_args(["--load", "0.9", "--net-arch", "32", "32", "--no-progress-bar"])
    assert args.load == (0.9,) and args.net_arch == (32, 32) and args.progress_bar is False


def test_rl_zoo3_hyperparameters_build_and_train() -> None:
    """What ``python -m rl_zoo3.train -conf hyperparams/ppo.yml`` does with the file: its
    policy_kwargs string is evaluated, the rest goes to PPO (rl-zoo3 itself is optional)."""
    hp = yaml.safe_load((ROOT / "hyperparams" / "ppo.yml").read_text())["cbgym/Scheduling-v0"]
    n_envs = hp.pop("n_envs")
    hp.pop("n_timesteps")
    hp["policy_kwargs"] = eval(hp["policy_kwargs"])  # as rl-zoo3 does
    hp.update(n_steps=32, batch_size=32, n_epochs=1)
    vec = make_vec_env("cbgym/Scheduling-v0", n_envs=n_envs, env_kwargs={
        "trace": load_trace("synthetic-conv"), "engine": PAPER, "episode_requests": 32,
        "render_mode": None})
    PPO(env=vec, device="cpu", **hp).learn(64)


def test_maskable_ppo_trains_and_evaluates(tmp_path: Path) -> None:
    final = train.main(["--env-id", "cbgym/SchedulingMasked-v0", *SMOKE, "--total-timesteps",
                        "128", "--eval-freq", "0", "--checkpoint-freq", "0", "--eval-baselines",
                        "fcfs", "--output-dir", str(tmp_path)])
    assert set(final["summary"]["0.9"]) == {"learned", "fcfs", "margin_vs_fcfs"}
    assert isinstance(load_model(tmp_path / "policy.zip"), MaskablePPO)


def test_time_budget_stops_training_then_evaluates(tmp_path: Path) -> None:
    final = train.main([*SMOKE, "--total-timesteps", "100000", "--eval-freq", "0",
                        "--checkpoint-freq", "0", "--time-budget-min", "0.0001",
                        "--output-dir", str(tmp_path)])
    assert final["training"]["stopped_by_time_budget"] is True
    assert final["training"]["timesteps"] < 100_000
    assert (tmp_path / "evaluation.json").is_file() and (tmp_path / "policy.zip").is_file()


def test_a_task_fixes_the_run_and_evaluates_on_its_validation_windows() -> None:
    from cbgym.tasks import get

    t = get("code-vllm-bursty")
    args = train.parse_args(["--task", t.name])
    assert (args.trace, args.engine, args.load, args.ttft_slo, args.tpot_slo) == (
        t.trace, t.engine, t.train_load, t.slo.ttft_s, t.slo.tpot_s)
    assert args.eval_loads == (t.test_load,) and args.shed_rule == "unreachable"
    # the thresholds stay the policy's own (recorded in its checkpoint)
    assert train.parse_args(["--task", t.name, "--shed-threshold", "-0.7"]).shed_threshold == -0.7
    for fixed in (["--load", "3.0"], ["--admission-cap"], ["--shed-rule", "unreachable"]):
        with pytest.raises(SystemExit):
            train.parse_args(["--task", t.name, *fixed])
    assert args.admission_cap and t.references[0] in args.eval_baselines
    masked = train.parse_args(["--task", t.name, "--env-id", "cbgym/SchedulingMasked-v0"])
    assert not masked.admission_cap  # the masked variant caps by STOP
    trace = load_trace("synthetic-conv")  # any trace: the windows come from the task's split
    assert train.eval_starts(args, trace) == t.starts(len(trace), "validation")
    with pytest.raises(SystemExit):
        train.parse_args(["--task", "nope"])


def test_imitation_warm_start(tmp_path: Path) -> None:
    final = train.main([*SMOKE, "--admission-cap", "--shed-rule", "unreachable",
                        "--imitate", "cb-sjf-work-shed:8", "--imitate-steps", "3000",
                        "--imitate-epochs", "5", "--ttft-slo", "0.5",
                        "--total-timesteps", "0", "--eval-freq", "0",
                        "--checkpoint-freq", "0", "--output-dir", str(tmp_path)])
    warm = json.loads((tmp_path / "config.json").read_text())["imitation"]
    assert warm["policy"] == "cb-sjf-work-shed:8" and warm["steps"] >= 3000
    assert warm["final_actor_mse"] < 0.5 and "learned" in final["summary"]["0.9"]
    model = load_model(tmp_path / "policy.zip")
    assert model.action_space.shape == (16 + 32 + 1,)
    # the cloned policy (it sheds and caps) replays the env exactly through the fast path
    env = gym.make("cbgym/Scheduling-v0", trace=load_trace("synthetic-conv"), engine=PAPER,
                   load=1.4, episode_requests=96, slo=cbgym.SLO(0.5, 0.1),
                   shed_threshold=-0.51, shed_rule="unreachable", admission_cap=True)
    _play_env(model, env, start=300)
    got = env.unwrapped.episode_result().requests
    policy = LearnedPolicy(model)
    fast = cbgym.simulate(env.unwrapped.episode_trace, policy, engine=PAPER).requests
    assert (got["status"] == "shed").sum() > 0 and policy.idle_overrides == 0
    for col in COLUMNS:
        np.testing.assert_array_equal(got[col].to_numpy(), fast[col].to_numpy(), err_msg=col)
    for bad in (["--imitate", "nope"],
                ["--imitate", "fcfs", "--env-id", "cbgym/SchedulingMasked-v0"]):
        with pytest.raises(SystemExit):
            train.parse_args(bad)


def test_ship_checkpoint_makes_a_learned_name(smoke_run: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    import cbgym.agents.learned as learned

    sys.path.insert(0, str(ROOT / "tools"))
    ship = importlib.import_module("ship_checkpoint")
    monkeypatch.setattr(learned, "CHECKPOINT_DIR", tmp_path)
    monkeypatch.setattr(ship, "CHECKPOINT_DIR", tmp_path)
    ship.main(["smoke", str(smoke_run), "--description", "a test"])
    assert "smoke" in learned.shipped_names()
    card = learned.read_card("smoke")
    assert card["description"] == "a test" and "per_window" not in card["evaluation"]
    assert LearnedPolicy("smoke").label == "learned:smoke"
    with pytest.raises(SystemExit):
        ship.main(["bad name", str(smoke_run), "--description", "x"])
    with pytest.raises(SystemExit):
        ship.main(["other", str(tmp_path), "--description", "x"])


def test_target_kl_reaches_ppo_and_is_checked(tmp_path: Path) -> None:
    args = train.parse_args([*SMOKE, "--target-kl", "0.01", "--output-dir", str(tmp_path)])
    trace = load_trace("synthetic-conv")
    vec = make_vec_env(args.env_id, 1, env_kwargs=train.env_kwargs(
        args, trace, PAPER, measure_capacity(trace, PAPER)))
    assert train.build_model(args, vec, tmp_path).target_kl == 0.01
    off = train.parse_args([*SMOKE, "--output-dir", str(tmp_path)])
    assert train.build_model(off, vec, tmp_path).target_kl is None
    with pytest.raises(SystemExit):
        train.parse_args([*SMOKE, "--target-kl", "-1"])
