"""``cbgym.simulate``'s argument forms: trace/engine/policy resolution and validation."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import cbgym
from cbgym.agents import FCFS, CBSJFWork, NoisyOracle
from cbgym.engine import EngineConfig, Policy
from cbgym.simulate import resolve_engine, resolve_policy, resolve_trace
from cbgym.workload import TraceNotFoundError, load_trace

N = 20


@pytest.fixture(scope="module")
def tiny() -> cbgym.Trace:
    return cbgym.Trace.from_arrays(np.arange(N) * 0.1, [100] * N, [10] * N, name="tiny")


@pytest.fixture
def azure_csv(tmp_path: Path) -> Path:
    """A five-request trace file in the Azure 2023 format."""
    rows = [f"2023-11-16 18:15:{10 + i:02d}.5000000,{100 + 10 * i},{5 + i}" for i in range(5)]
    path = tmp_path / "tiny_azure.csv"
    path.write_text("\n".join(["TIMESTAMP,ContextTokens,GeneratedTokens", *rows]) + "\n")
    return path


# ------------------------------------------------------------------ accepted forms
def test_trace_object_default_engine_and_policy(tiny: cbgym.Trace) -> None:
    res = cbgym.simulate(tiny)
    assert len(res.requests) == N
    assert res.meta["trace"] == "tiny"
    assert res.meta["engine"] == cbgym.simulate(tiny, engine=EngineConfig()).meta["engine"]


def test_trace_by_name() -> None:
    assert resolve_trace("synthetic-code") is load_trace("synthetic-code")
    res = cbgym.simulate("synthetic-code")
    assert res.meta["trace"] == "synthetic-code"
    assert len(res.requests) == len(load_trace("synthetic-code"))


@pytest.mark.parametrize("as_path", [str, Path], ids=["str", "PathLike"])
def test_trace_by_path(azure_csv: Path, as_path: type) -> None:
    res = cbgym.simulate(as_path(azure_csv))
    assert len(res.requests) == 5
    assert res.requests["prompt_tokens"].tolist() == [100, 110, 120, 130, 140]


@pytest.mark.parametrize("preset", ["cbsjf-paper", "llama-2-7b/a100-80gb"])
def test_engine_preset_string(tiny: cbgym.Trace, preset: str) -> None:
    assert resolve_engine(preset) == EngineConfig(preset=preset)
    by_name = cbgym.simulate(tiny, engine=preset)
    by_config = cbgym.simulate(tiny, engine=EngineConfig(preset=preset))
    assert by_name.meta["engine"] == by_config.meta["engine"]
    assert by_name.sim_seconds == by_config.sim_seconds


def test_engine_none_is_default() -> None:
    assert resolve_engine(None) == EngineConfig()


@pytest.mark.parametrize(
    ("policy", "kind"),
    [(FCFS, FCFS), (CBSJFWork, CBSJFWork), (FCFS(), FCFS), ("fcfs", FCFS),
     ("noisy-oracle:0.8", NoisyOracle)],
    ids=["class-fcfs", "class-cb-sjf-work", "instance", "spec", "spec-with-arg"],
)
def test_policy_forms(tiny: cbgym.Trace, policy: object, kind: type) -> None:
    assert isinstance(resolve_policy(policy), kind)  # type: ignore[arg-type]
    res = cbgym.simulate(tiny, policy=policy, engine="cbsjf-paper")  # type: ignore[arg-type]
    assert len(res.requests) == N


def test_policy_instance_is_used_as_is() -> None:
    pol = FCFS()
    assert resolve_policy(pol) is pol


def test_load_and_capacity(tiny: cbgym.Trace) -> None:
    res = cbgym.simulate(tiny, engine="cbsjf-paper", load=0.5, capacity_rps=10.0)
    assert res.meta["load"] == 0.5
    assert res.meta["trace"] == "tiny@rho=0.5"


def test_numpy_scalars_accepted(tiny: cbgym.Trace) -> None:
    res = cbgym.simulate(tiny, engine="cbsjf-paper", load=np.float64(0.5),
                         capacity_rps=np.float32(10.0), seed=np.int64(3))
    assert res.meta["seed"] == 3 and type(res.meta["seed"]) is int


# ------------------------------------------------------------------ rejections
@pytest.mark.parametrize("bad", [5, 1.5, b"synthetic-conv", None, ["tiny"]],
                         ids=["int", "float", "bytes", "None", "list"])
def test_trace_wrong_type(bad: object) -> None:
    with pytest.raises(TypeError, match=r"trace: expected a Trace, a trace name or a path"):
        cbgym.simulate(bad)  # type: ignore[arg-type]


def test_trace_unknown_name() -> None:
    with pytest.raises(ValueError, match=r"unknown trace name 'no-such-trace'"):
        cbgym.simulate("no-such-trace")


def test_trace_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceNotFoundError, match=r"no trace file at"):
        cbgym.simulate(tmp_path / "missing.csv")


@pytest.mark.parametrize("bad", [3, {"preset": "cbsjf-paper"}, ("llama-2-7b", "a100-80gb")],
                         ids=["int", "dict", "tuple"])
def test_engine_wrong_type(tiny: cbgym.Trace, bad: object) -> None:
    with pytest.raises(TypeError, match=r"engine: expected an EngineConfig, None or a preset"):
        cbgym.simulate(tiny, engine=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("bad", "why"),
    [("nope", r"expected 'model/gpu'"), ("gpt-9/a100-80gb", r"unknown model 'gpt-9'"),
     ("llama-2-7b/tpu-v9", r"unknown GPU 'tpu-v9'")],
)
def test_engine_unknown_preset(tiny: cbgym.Trace, bad: str, why: str) -> None:
    with pytest.raises(ValueError, match=rf"engine='{bad}': not a usable preset: .*{why}"):
        cbgym.simulate(tiny, engine=bad)


@pytest.mark.parametrize("bad", [3, None, int, object()], ids=["int", "None", "class", "object"])
def test_policy_wrong_type(tiny: cbgym.Trace, bad: object) -> None:
    with pytest.raises(TypeError, match=r"policy: expected a Policy, a Policy subclass or a spec"):
        cbgym.simulate(tiny, policy=bad)  # type: ignore[arg-type]


def test_policy_unknown_spec(tiny: cbgym.Trace) -> None:
    with pytest.raises(ValueError, match=r"policy='nope': unknown policy 'nope'; known: .*fcfs"):
        cbgym.simulate(tiny, policy="nope")


def test_policy_class_needing_arguments(tiny: cbgym.Trace) -> None:
    class Needs(Policy):
        def __init__(self, knob: float) -> None:
            self.knob = knob

    with pytest.raises(TypeError, match=r"policy=Needs: a policy class must be buildable"):
        cbgym.simulate(tiny, policy=Needs)


@pytest.mark.parametrize("name", ["load", "capacity_rps"])
@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, -math.inf],
                         ids=["zero", "negative", "nan", "inf", "-inf"])
def test_load_and_capacity_must_be_finite_positive(
    tiny: cbgym.Trace, name: str, bad: float
) -> None:
    kwargs = {"load": 0.5, "capacity_rps": 10.0, name: bad}
    with pytest.raises(ValueError, match=rf"{name}=.*: expected None or a finite number > 0"):
        cbgym.simulate(tiny, engine="cbsjf-paper", **kwargs)


def test_capacity_checked_without_load(tiny: cbgym.Trace) -> None:
    with pytest.raises(ValueError, match=r"capacity_rps=nan: expected None or a finite number"):
        cbgym.simulate(tiny, capacity_rps=math.nan)


@pytest.mark.parametrize("name", ["load", "capacity_rps"])
@pytest.mark.parametrize("bad", ["0.9", True, [0.9]], ids=["str", "bool", "list"])
def test_load_and_capacity_wrong_type(tiny: cbgym.Trace, name: str, bad: object) -> None:
    with pytest.raises(TypeError, match=rf"{name}: expected None or a number > 0, got"):
        cbgym.simulate(tiny, **{name: bad})  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [1.5, "0", None, True], ids=["float", "str", "None", "bool"])
def test_seed_must_be_int(tiny: cbgym.Trace, bad: object) -> None:
    with pytest.raises(TypeError, match=r"seed: expected an int, got"):
        cbgym.simulate(tiny, seed=bad)  # type: ignore[arg-type]
