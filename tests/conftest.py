"""Shared test helpers: small engines with a linear cost model, hand-made traces."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from cbgym.engine import Engine, EngineConfig, LinearCostModel
from cbgym.workload.trace import Trace

# one second per iteration: iteration k runs over [k, k+1) when the engine is busy
UNIT_COST = LinearCostModel(base_s=1.0, prefill_per_token_s=0.0, decode_per_seq_s=0.0)


def make_config(**kw: object) -> EngineConfig:
    """An engine with a given block count; without a preset, a linear cost model."""
    kw.setdefault("preset", None)
    if kw["preset"] is None:
        kw.setdefault("cost_model", LinearCostModel())
    kw.setdefault("num_kv_blocks", 1000)
    return EngineConfig(**kw)  # type: ignore[arg-type]


def make_trace(rows: list[tuple[float, int, int]], **kw: object) -> Trace:
    """A trace from (arrival_s, prompt_tokens, output_tokens) rows."""
    a, p, o = zip(*rows, strict=True)
    return Trace.from_arrays(a, p, o, rebase=False, **kw)  # type: ignore[arg-type]


def random_trace(rng: np.random.Generator, n: int, rate: float = 5.0, max_prompt: int = 2000,
                 max_output: int = 300) -> Trace:
    arrival = np.cumsum(rng.exponential(1 / rate, n))
    prompt = rng.integers(1, max_prompt, n)
    output = rng.integers(1, max_output, n)
    return Trace.from_arrays(arrival, prompt, output)


def schedule_log(engine: Engine) -> list[dict[int, int]]:
    """Drain an FCFS engine, returning {request id: tokens} per iteration."""
    from cbgym.engine.decision import Decision

    while engine.next_decision() is not None:
        engine.decide(Decision())
    log, _ = engine.recorder.batch_log()
    steps: list[dict[int, int]] = [{} for _ in range(engine.iteration)]
    for it, rid, tok in log:
        steps[it][int(rid)] = int(tok)
    return steps


@pytest.fixture
def trace_dir() -> Path | None:
    """The real-trace directory from CBGYM_TRACE_DIR, if set and present."""
    d = os.environ.get("CBGYM_TRACE_DIR")
    return Path(d) if d and Path(d).is_dir() else None


def load_script(relative: str) -> ModuleType:
    """A script of the repository that is not a package module (``tools/...``,
    ``traces/fetch.py``), imported from its file for its functions."""
    path = Path(__file__).resolve().parents[1] / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
