"""``tools/train_tasks.py``: each task's PPO run as train.py reads it, the recipe from a clone
or, for a task in ``PRIOR``, from a heuristic prior with its own settings in place."""

from __future__ import annotations

import pytest

from tests.conftest import load_script

pytest.importorskip("torch")


def _parsed(task: str):  # type: ignore[no-untyped-def]
    tool = load_script("tools/train_tasks.py")
    import train

    argv, what = tool.ppo_argv(task)
    return train.parse_args([*argv, "--output-dir", "unused"]), what


def test_the_interactive_task_runs_ppo_from_its_prior_with_its_own_settings() -> None:
    args, what = _parsed("conv-study-interactive")
    assert args.prior == "cb-sjf-work-fit" and not args.imitate
    assert (args.total_timesteps, args.target_kl, args.eval_freq) == (250_000, 0.002, 50_000)
    assert (args.learning_rate, args.gamma, args.log_std_init) == (5e-5, 0.999, -2.5)
    assert "residual prior of cb-sjf-work-fit" in what


def test_the_other_tasks_run_the_recipe_from_a_clone() -> None:
    args, what = _parsed("code-vllm-bursty")
    assert args.imitate and not args.prior
    assert (args.total_timesteps, args.target_kl, args.eval_freq) == (500_000, 0.0, 0)
    assert "behaviour cloning of " + args.imitate in what
