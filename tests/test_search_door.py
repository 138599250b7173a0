"""``tools/search_door.py``: a rule router plus a residual network, searched where the native
cluster vector env cannot run the task. Its start is the rule itself, route for route, and a
residual that outweighs the rule's margin takes over."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from cbgym import SLO, ClientModel
from cbgym.agents.routing import make_router
from cbgym.cluster.config import ClusterConfig
from cbgym.cluster.run import serve
from cbgym.env.cluster_env import route_table
from cbgym.workload.synthetic import synthetic_trace
from tests.conftest import load_script


def _tool():  # type: ignore[no-untyped-def]
    return load_script("tools/search_door.py")


def _weights(tool, cfg: ClusterConfig, seed: int = 0):  # type: ignore[no-untyped-def]
    dims = tool.shapes(len(cfg.roles), len(route_table(cfg, True)), 8)
    rng = np.random.default_rng(seed)
    return [rng.normal(0, 0.3, s) for s in dims[:2]] + [np.zeros(s) for s in dims[2:]]


@pytest.mark.parametrize("prior", ["ttft-shed:0.3", "kairos"])
def test_the_start_is_the_rule_route_for_route(prior: str) -> None:
    tool = _tool()
    cluster = "2p2d:llama-2-7b/a100-80gb" if prior == "kairos" else "2x:llama-2-7b/a100-80gb"
    cfg = ClusterConfig.preset(cluster)
    tr = synthetic_trace("conv", 200, rate=25.0, seed=3)
    client = ClientModel(max_retries=1)
    a = serve(tr, cfg, tool.ResidualRouter(prior, _weights(tool, cfg), 1.0), slo=SLO(2.0, 0.1),
              client=client, seed=1)
    b = serve(tr, cfg, make_router(prior), slo=SLO(2.0, 0.1), client=client, seed=1)
    assert a.requests.equals(b.requests)
    assert a.clients.equals(b.clients)


def test_a_residual_past_the_margin_takes_over() -> None:
    tool = _tool()
    cfg = ClusterConfig.preset("2x:llama-2-7b/a100-80gb")
    w = _weights(tool, cfg)
    w[3][-1] = 5.0  # the shed route's bias, above the rule's margin of 1
    tr = synthetic_trace("conv", 50, rate=5.0, seed=3)
    res = serve(tr, cfg, tool.ResidualRouter("ttft-shed:1000", w, 1.0), slo=SLO(2.0, 0.1),
                client=ClientModel(max_retries=0))
    assert (res.requests["reason"] == "shed_by_agent").all()


def test_the_cli_checks_its_arguments(monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    tool = _tool()
    for argv, expect in ((["--prior", "nope"], "--prior: unknown router 'nope'"),
                         (["--prior", "ttft-shed:1", "--popsize", "3"], "--popsize"),
                         (["--prior", "ttft-shed:1", "--windows", "0"], "--windows")):
        monkeypatch.setattr(sys, "argv", ["search_door.py", "--task",
                                          "code-2x-overload-retries", *argv])
        with pytest.raises(SystemExit):
            tool.main()
        assert expect in capsys.readouterr().err
