"""Train a slot policy by direct search on its deterministic goodput (CMA-ES), from a prior.

    python tools/train_es.py --task conv-study-overload                 # runs/es/<task>
    python tools/train_es.py --task code-vllm-bursty --generations 150 --ship

Each generation draws ``--windows`` training windows (starts in the task's train range, loads
over its train loads), samples ``--popsize`` parameter vectors of the policy's actor around
the search's mean (mirrored pairs), plays every vector on every window deterministically on
the native vector env (``cbgym.agents.evolution``) and moves the mean towards the vectors
that served the most requests within SLO. The policy is the residual slot scorer
(``--prior``, default the task's tuned ``cb-sjf-work-shed[:CAP]``): its output layers start
at zero, so the search starts at the heuristic exactly. Every ``--validate-every``
generations the mean plays the validation windows (the task's, at its test load); the best
mean on them is the one saved, so test windows stay unseen. Outputs as ``train.py``'s
(``policy.zip``, ``config.json``, ``evaluation.json`` from the fast path, TensorBoard logs in
``tb/``) plus ``generations.csv``; ``--ship`` copies the run to ``learned:<task>``.

Any other ``train.py`` flag (``--K``, ``--window-rule``, ``--seed``, ...) passes through;
its PPO settings are unused. docs/benchmark.md gives the runs and what they found.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # train.py

import train  # noqa: E402


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, train.Args]:
    """ES settings, and train.py's Args from every other flag."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog="Other flags: "
                                 "python train.py --help (the environment and policy ones "
                                 "apply; the PPO ones are unused).")
    ap.add_argument("--generations", type=int, default=100)
    ap.add_argument("--popsize", type=int, default=16,
                    help="candidates per generation (an even number: mirrored pairs)")
    ap.add_argument("--windows", type=int, default=16, help="training windows per generation")
    ap.add_argument("--sigma", type=float, default=0.03,
                    help="initial step size of the search (parameter units)")
    ap.add_argument("--validate-every", type=int, default=10)
    ap.add_argument("--select-loads", type=float, nargs="+", default=None, metavar="RHO",
                    help="the loads at which the validation windows choose among the "
                         "search's means (default: the evaluation loads, a task's test load); "
                         "more loads, more episodes of the same few validation requests")
    ap.add_argument("--max-episode-steps", type=int, default=20_000,
                    help="truncate a training episode after this many steps (a candidate "
                         "that holds every request idles the engine; it keeps what it served)")
    ap.add_argument("--loss-weight", type=float, default=0.0, metavar="LAMBDA",
                    help="fitness = mean goodput - LAMBDA x mean shortfall against the "
                         "search's start (the heuristic when the run starts at the prior) on "
                         "the same windows: a candidate pays for every window it loses, which "
                         "is what a paired comparison's interval asks of it (0: mean goodput; "
                         "generations.csv's goodput_* columns then hold this fitness)")
    ap.add_argument("--search", choices=("all", "cap"), default="all",
                    help="which parameters move: all of the actor's, or only what the running "
                         "cap's score reads (cbgym.agents.evolution.CAP_MODULES): the order "
                         "and the victims then stay the prior's")
    ap.add_argument("--time-budget-min", type=float, default=0.0,
                    help="stop after this many minutes (0: no limit)")
    ap.add_argument("--ship", action="store_true", help="ship the run as learned:<task>")
    es, rest = ap.parse_known_args(argv)
    if es.generations < 1 or es.windows < 1 or es.validate_every < 1:
        ap.error("--generations, --windows and --validate-every must be >= 1")
    if es.popsize < 2 or es.popsize % 2:
        ap.error(f"--popsize must be an even number >= 2, got {es.popsize}")
    if es.select_loads is not None and not all(x > 0 for x in es.select_loads):
        ap.error("--select-loads must be > 0")
    if not es.sigma > 0 or es.max_episode_steps < 1 or es.time_budget_min < 0 \
            or not 0 <= es.loss_weight < float("inf"):
        ap.error("--sigma must be > 0, --max-episode-steps >= 1, --time-budget-min >= 0, "
                 "--loss-weight finite and >= 0")
    if "--net-arch" not in rest:  # a small scorer: ES searches every actor parameter
        rest += ["--net-arch", "16"]
    args = train.parse_args(rest)
    if "Masked" in args.env_id or args.policy != "slot" or args.imitate:
        ap.error("the search is over the slot scorer's scores (cbgym/Scheduling-v0, "
                 "--policy slot, no --imitate)")
    if args.ttft_miss_weight or args.shed_weight or args.latency_weight:
        ap.error("the search maximises goodput: leave the reward shaping weights at 0")
    if args.task:
        from cbgym.env.vector_common import native_lacks
        from cbgym.tasks import get

        task = get(args.task)
        # (tenant_features are not asked about, nor prefix_features the scores do not read:
        # native_kwargs leaves them out)
        lack = native_lacks(arrival_features=bool(task.env.get("arrival_features")),
                            prefix_features=bool(task.env.get("prefix_features"))
                            and args.prefix_inputs)
        if lack:
            hint = (" (--no-prefix-inputs: the scores read no prefix counts, and the search "
                    "leaves prefix_features out)" if "prefix" in lack else "")
            ap.error(f"--task {args.task}: the search plays the native vector env, which has "
                     f"{lack} yet{hint}")
    if es.search == "cap" and not args.admission_cap:
        ap.error("--search cap: the env has no running-cap score (a task's env has one; "
                 "else --admission-cap)")
    if es.search == "cap" and args.resume_from:
        # the context feeds the slot heads too: only their zero output layers (a fresh
        # prior's) keep the order and the victims the prior's
        ap.error("--search cap starts from the prior: not with --resume-from")
    if not args.prior:
        args = dataclasses.replace(args, prior=default_prior(args.task))
    if es.ship and not args.task:
        ap.error("--ship names the checkpoint after the task: give --task")
    return es, args


def default_prior(task: str) -> str:
    """The task's tuned ``cb-sjf-work-shed:CAP`` if it has one, else ``cb-sjf-work-shed``."""
    from cbgym.agents.slot_prior import PRIOR_POLICIES
    from cbgym.tasks import get

    for ref in get(task).references if task else ():
        if ref.partition(":")[0] in PRIOR_POLICIES:
            return ref
    return PRIOR_POLICIES[0]


def loss_penalised(good: np.ndarray, reference: np.ndarray, weight: float) -> np.ndarray:
    """Each candidate's mean goodput (rows of ``good``, (P, W)) minus ``weight`` x its mean
    shortfall against ``reference`` (W) on the same windows."""
    if good.ndim != 2 or np.shape(reference) != (good.shape[1],):
        raise ValueError(f"loss_penalised: expected (P, W) goodput and W references, got "
                         f"{good.shape} and {np.shape(reference)}")
    return good.mean(axis=1) - weight * np.maximum(reference[None] - good, 0.0).mean(axis=1)


def native_kwargs(kwargs: dict[str, Any], prefix_inputs: bool = False) -> dict[str, Any]:
    """The training env's arguments for the native vector env: a tenant task's fairness
    counters, and a prefix task's cache counts unless the scores read them
    (``prefix_inputs``), are left out (only a critic would read them)."""
    out = dict(kwargs)
    for key, read in (("tenant_features", False), ("prefix_features", prefix_inputs)):
        if out.get(key) and not read:
            out.pop(key)
            print(f"[train_es] {key} left out: the slot scores do not read them (no critic "
                  "here)", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    started = time.perf_counter()
    es, args = parse(argv)
    import torch

    from cbgym.agents.evolution import (
        ACTOR_MODULES,
        CAP_MODULES,
        GenerationLog,
        Population,
        Searched,
        draw_windows,
        play,
        search,
    )
    from cbgym.capacity import measure_capacity
    from cbgym.env.sb3 import make_sb3_vec_env
    from cbgym.env.vector import SchedulingVectorEnv

    torch.set_num_threads(1)  # the envs take the cores; the nets are small
    out = Path(args.output_dir if args.output_dir != train.Args.output_dir
               else f"runs/es/{args.task or 'default'}")
    out.mkdir(parents=True, exist_ok=True)
    args = dataclasses.replace(args, output_dir=str(out))

    trace = train.load_base_trace(args.trace, args.task)
    engine = train.engine_config(args)
    mu = measure_capacity(trace, engine)
    kwargs = native_kwargs(train.env_kwargs(args, trace, engine, mu), args.prefix_inputs)
    P, W = es.popsize, es.windows
    # with --loss-weight the start plays beside the candidates, on the same windows
    venv = SchedulingVectorEnv(num_envs=(P + (es.loss_weight > 0)) * W,
                               max_episode_steps=es.max_episode_steps, **kwargs)
    starts_v = train.eval_starts(args, trace)
    select = es.select_loads or args.eval_loads
    loads_v = np.repeat(np.asarray(select, float), len(starts_v))
    starts_v = np.tile(np.asarray(starts_v), len(select))
    vval = SchedulingVectorEnv(num_envs=len(starts_v),
                               **{**kwargs, "window_start_range": None})
    # (PPO's rollout settings are unused: one env, and a batch its buffer holds)
    model = train.build_model(dataclasses.replace(args, batch_size=args.n_steps),
                              make_sb3_vec_env(args.env_id, 1, seed=args.seed, **kwargs), out)
    population = Population(model.policy, CAP_MODULES if es.search == "cap" else ACTOR_MODULES)
    rng = np.random.default_rng(args.seed)
    x_start = population.get()

    def fitness(X: np.ndarray, generation: int) -> np.ndarray:
        starts, loads = draw_windows(rng, kwargs["window_start_range"], args.episode_requests,
                                     kwargs["load"], W)
        if not es.loss_weight:
            return play(venv, population, X, starts, loads).mean(axis=1)
        good = play(venv, population, np.vstack([X, x_start]), starts, loads)
        return loss_penalised(good[:-1], good[-1], es.loss_weight)

    def validate(x: np.ndarray) -> float:
        return float(play(vval, population, x[None], starts_v, loads_v).mean())

    print(f"[train_es] {args.task or args.trace}: {population.dim} parameters from the prior "
          f"{args.prior}", file=sys.stderr)
    def checkpoint(best: Searched) -> None:  # a run cut short keeps its best validated mean
        population.set(best.x)
        train.export_policy(model, out / "policy.zip")
        (out / "best.json").write_text(json.dumps(
            {"generation": best.generation, "validation_vector_env": best.validation,
             "validation_prior": best.start_validation}))

    log = GenerationLog(out, es.generations, args.progress_bar, "train_es")
    try:
        found = search(population.get(), fitness, validate, generations=es.generations,
                       popsize=P, sigma=es.sigma, seed=args.seed,
                       validate_every=es.validate_every,
                       time_budget_s=60.0 * es.time_budget_min, on_generation=log,
                       on_best=checkpoint)
    finally:
        log.close()

    population.set(found.x)
    model.save(out / "model.zip")
    train.export_policy(model, out / "policy.zip")
    evaluation = train.HeldOutEval(args, trace, engine, mu)(model)  # the fast path: learned:
    evaluation["training"] = {
        "algorithm": "CMA-ES (diagonal, mirrored), cbgym.agents.evolution", **vars(es),
        "generations_run": len(found.rows), "chosen_generation": found.generation,
        "validation_vector_env": found.validation,
        "validation_prior": found.start_validation,
        "wall_seconds": time.perf_counter() - started}
    config = {"args": dataclasses.asdict(args), "es": vars(es), "trace_name": trace.name,
              "capacity_rps": mu, "meta": train.model_meta(args), "versions": train.versions(),
              "command": sys.argv, "parameters": population.dim}
    (out / "config.json").write_text(json.dumps(config, indent=1))
    (out / "evaluation.json").write_text(json.dumps(evaluation, indent=1))
    train.print_table(evaluation)
    learned = evaluation["summary"][f"{args.eval_loads[0]:g}"]["learned"]["goodput_mean"]
    print(f"{len(found.rows)} generations in {time.perf_counter() - started:.0f} s; chosen: "
          f"generation {found.generation}, validation {found.validation:.1f} on the vector "
          f"env at the select loads {list(select)} (at {args.eval_loads[0]:g} through learned:, "
          f"the fast path: {learned:.1f}), the prior {found.start_validation:.1f}")
    if es.ship:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from ship_checkpoint import main as ship

        ship([args.task, str(out), "--description",
              f"CMA-ES on {args.task}'s train windows: the residual slot scorer from the "
              f"{args.prior} prior (tools/train_es.py)"])
    return evaluation


if __name__ == "__main__":
    main()
