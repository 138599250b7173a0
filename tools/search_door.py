"""Search a residual on a rule router where the native cluster vector env cannot run the task.

    python tools/search_door.py --task code-2x-overload-retries --prior ttft-shed:1
    python tools/search_door.py --task conv-4x-overload-retries --prior ttft-shed:0.08 \\
        --generations 25 --workers 2

The tasks with clients at the edge (retries, timeouts: the ``*-overload-retries`` tasks) run
only in the Python cluster (``cbgym.cluster.run.serve``), so ``tools/train_router.py
--es-generations`` (the native vector env) cannot search them. Here a router is the rule
(``--prior``, e.g. the SLO-aware door) plus a residual: a one-hidden-layer tanh network on
the env's observation of the routing point (:func:`cbgym.env.cluster_env.encode`, the
learned routers' encoder) adds its logits to ``--margin`` on the rule's route, and the
router takes the most likely route of the env's table (the rule's own route, exactly, while
it stays the most likely). The output layer starts at zero, so the search starts at the
rule itself. Separable CMA-ES (:func:`cbgym.agents.evolution.search`) moves the residual on
the goodput of whole training windows (``--windows`` a generation, drawn from the task's
train range and loads, the same for every candidate), and every 5 generations the search's
mean routes the validation windows at the test load; the best mean is kept. Test windows are
never played. Writes ``OUT/generations.csv`` (a row per generation and per validation) and
``OUT/best.npz`` (the best mean so far, with the start and the settings that rebuild the
router: kept as the search goes, so a run cut short keeps its best).

A probe, not a recipe that ships: on ``code-2x-overload-retries`` (30 generations) and
``conv-4x-overload-retries`` (10) no candidate beat the door by more than 1.8 requests a
window on its training windows, and the mean never left the door's validation score
(docs/benchmark.md).
"""

from __future__ import annotations

import argparse
import csv
import time
from multiprocessing import get_context
from multiprocessing.pool import Pool
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from cbgym.cluster.routing import Route, Router, RouterContext, RoutingPoint

if TYPE_CHECKING:
    from cbgym.agents.evolution import Searched
    from cbgym.tasks.cluster_tasks import ClusterTask

# the run's fixed inputs, set once in the parent before the workers fork
_RUN: dict[str, Any] = {}


class ResidualRouter(Router):
    """``prior`` plus a residual network's logits (module docstring)."""

    name = "residual"

    def __init__(self, prior: str, weights: list[np.ndarray], margin: float) -> None:
        from cbgym.agents.routing import make_router

        self.prior, self.weights, self.margin = make_router(prior), weights, margin
        self.label = f"residual:{prior}"

    def reset(self, ctx: RouterContext) -> None:
        from cbgym.env.cluster_env import route_table

        super().reset(ctx)
        self.prior.reset(ctx)
        self.routes = route_table(ctx.config, allow_shed=True)

    def route(self, rp: RoutingPoint) -> Route:
        from cbgym.env.cluster_env import encode, route_index

        chosen = self.prior.route(rp)
        i = route_index(self.routes, chosen, rp)
        obs = encode(rp, prefix=True)
        w1, b1, w2, b2 = self.weights
        z = w2 @ np.tanh(w1 @ np.concatenate([obs["instances"].ravel(), obs["request"]]) + b1) \
            + b2
        z[i] += self.margin
        j = int(np.argmax(z))
        return chosen if j == i else self.routes[j]


def shapes(n_instances: int, n_routes: int, hidden: int) -> list[tuple[int, ...]]:
    """The residual's parameter shapes: hidden weights and bias, output weights and bias
    (the input: every instance's columns, with the prefix ones, then the request's)."""
    from cbgym.env.cluster_vector_ops import INSTANCE_FEATURES, PREFIX_FEATURES, REQUEST_FEATURES

    d = n_instances * (len(INSTANCE_FEATURES) + len(PREFIX_FEATURES)) + len(REQUEST_FEATURES)
    return [(hidden, d), (hidden,), (n_routes, hidden), (n_routes,)]


def unflatten(x: np.ndarray, dims: list[tuple[int, ...]]) -> list[np.ndarray]:
    """The flat vector the search moves, as arrays of ``dims`` (in order)."""
    out, k = [], 0
    for s in dims:
        n = int(np.prod(s))
        out.append(np.asarray(x[k:k + n], float).reshape(s))
        k += n
    return out


def goodput(job: tuple[np.ndarray, int, float, int]) -> float:
    """Goodput of one job ``(x, start, load, seed)``: that window, scaled to that load,
    routed by the residual router with parameters ``x`` (as clients see it)."""
    from cbgym.capacity import scale_to_load
    from cbgym.cluster.run import serve
    from cbgym.tasks.evaluate import window_rows

    x, start, load, seed = job
    r, t, cfg = _RUN, _RUN["task"], _RUN["cfg"]
    trace = scale_to_load(r["trace"].window(int(start), t.episode_requests), float(load),
                          cfg.engines[0], capacity_rps=r["mu"])
    router = ResidualRouter(r["prior"], unflatten(x, r["dims"]), r["margin"])
    summary = serve(trace, cfg, router, seed=int(seed), slo=t.slo, admission=t.admission,
                    client=t.client).summary()
    return float(window_rows([summary])[0][0])  # (counted as evaluate_cluster counts it)


def main() -> None:
    from cbgym.tasks.cluster_tasks import CLUSTER_TASKS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", required=True, choices=list(CLUSTER_TASKS))
    ap.add_argument("--prior", required=True, help="the rule router, e.g. ttft-shed:1")
    ap.add_argument("--generations", type=int, default=30)
    ap.add_argument("--popsize", type=int, default=16, help="candidates (even)")
    ap.add_argument("--windows", type=int, default=8, help="training windows a generation")
    ap.add_argument("--sigma", type=float, default=0.15, help="the search's initial step")
    ap.add_argument("--hidden", type=int, default=16)
    ap.add_argument("--margin", type=float, default=1.0, help="the rule's route's logit bonus")
    ap.add_argument("--workers", type=int, default=1, help="processes playing windows")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("runs/search_door"))
    args = ap.parse_args()
    if args.generations < 1 or args.windows < 1 or args.hidden < 1 or args.workers < 1:
        ap.error("--generations, --windows, --hidden and --workers must be >= 1")
    if args.popsize < 2 or args.popsize % 2 or not args.sigma > 0 or not args.margin > 0:
        ap.error("--popsize must be an even number >= 2, --sigma and --margin > 0")
    task = CLUSTER_TASKS[args.task]
    cfg = task.cluster_config()
    try:
        from cbgym.agents.routing import make_router

        make_router(args.prior).reset(RouterContext(config=cfg))
    except (ValueError, TypeError) as exc:
        ap.error(f"--prior: {exc}")
    if args.out.exists() and not args.out.is_dir():
        ap.error(f"--out: {args.out} is not a directory")
    args.out.mkdir(parents=True, exist_ok=True)

    from cbgym.cluster.run import cluster_capacity
    from cbgym.cluster.sweep import reference_router
    from cbgym.env.cluster_env import route_table
    from cbgym.workload import load_trace

    trace = load_trace(task.trace)
    dims = shapes(len(cfg.roles), len(route_table(cfg, True)), args.hidden)
    _RUN.update(task=task, cfg=cfg, trace=trace, prior=args.prior, margin=args.margin,
                dims=dims, mu=cluster_capacity(trace, cfg, reference_router(cfg)))
    rng = np.random.default_rng(args.seed)
    x0 = np.concatenate([rng.normal(0, 1 / np.sqrt(dims[0][1]), dims[0]).ravel(),
                         np.zeros(sum(int(np.prod(s)) for s in dims[1:]))])
    kw = task.env_kwargs(len(trace), "train")
    _RUN["started"] = time.perf_counter()
    # (the workers fork after the parent compiled the kernels and read the trace: they
    # inherit both, and _RUN)
    with (args.out / "generations.csv").open("w", newline="") as f, \
            get_context("fork").Pool(args.workers) as pool:
        found = _search(args, task, x0, kw, rng, f, pool)
    print(f"start {found.start_validation:.1f} on validation; best mean {found.validation:.1f} "
          f"at generation {found.generation} ({time.perf_counter() - _RUN['started']:.0f} s)")


def _search(args: argparse.Namespace, task: ClusterTask, x0: np.ndarray, kw: dict[str, Any],
            rng: np.random.Generator, file: IO[str], pool: Pool) -> Searched:
    """The CMA-ES loop (module docstring), logging each generation and validation."""
    from cbgym.agents.evolution import draw_windows, search

    trace, started = _RUN["trace"], _RUN["started"]
    valid = task.starts(len(trace), "validation")
    writer = csv.writer(file)
    state = {"generation": 0}

    def log(row: list[Any]) -> None:
        writer.writerow(row)
        file.flush()  # (a run cut short keeps its rows)

    def keep(best: Searched) -> None:
        np.savez(args.out / "best.npz", x=best.x, x0=x0, generation=best.generation,
                 validation=best.validation, start_validation=best.start_validation,
                 task=args.task, prior=args.prior, margin=args.margin, hidden=args.hidden)

    log(["generation", "mean", "best", "rule", "validation", "seconds"])

    def fitness(X: np.ndarray, g: int) -> np.ndarray:
        starts, loads = draw_windows(rng, kw["window_start_range"], task.episode_requests,
                                     kw["load"], args.windows)
        seeds = rng.integers(0, 2**31 - 1, args.windows)
        windows = list(zip(starts, loads, seeds, strict=True))
        good = np.array(pool.map(goodput, [(x, *w) for x in X for w in windows]))
        rule = float(np.mean(pool.map(goodput, [(x0, *w) for w in windows])))
        good = good.reshape(len(X), -1).mean(axis=1)
        state["generation"] = g
        log([g, good.mean(), good.max(), rule, "", round(time.perf_counter() - started)])
        print(f"generation {g}: candidates {good.mean():.1f} (best {good.max():.1f}), "
              f"the rule {rule:.1f} on the same windows", flush=True)
        return good

    def validate(x: np.ndarray) -> float:
        v = float(np.mean(pool.map(goodput, [(x, s, task.test_load, 0) for s in valid])))
        log([state["generation"], "", "", "", v, round(time.perf_counter() - started)])
        print(f"validation (the search's mean, test load): {v:.1f}", flush=True)
        return v

    return search(x0, fitness, validate, generations=args.generations,
                  popsize=args.popsize, sigma=args.sigma, seed=args.seed, validate_every=5,
                  on_best=keep)


if __name__ == "__main__":
    main()
